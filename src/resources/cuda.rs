//! The CUDA toolkit at its home with the declared release (installed by a package; this
//! resource checks what `nvcc --version` and `version.json` say).

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

/// A CUDA toolkit's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaSpec {
    /// The toolkit's home, e.g. `/usr/local/cuda-13.0`.
    pub home: String,
    /// Release, `MAJOR.MINOR`.
    pub version: String,
    /// The package that provides it.
    pub package: String,
}

impl Resource for CudaSpec {
    fn kind(&self) -> &'static str {
        "cuda_toolkit"
    }

    fn name(&self) -> String {
        self.home.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Cuda {
            home: self.home.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.cuda(&self.probes()[0])?;
        let release = found.and_then(|f| f.nvcc_release.clone());
        if release.as_deref() == Some(self.version.as_str()) {
            return Ok(None);
        }
        let action = if found.is_none() {
            Action::Create
        } else {
            Action::Update
        };
        Ok(Some(
            Delta::new(action)
                .attr(Attribute::change(
                    "release",
                    release,
                    Some(self.version.clone()),
                ))
                .attr(Attribute::new("package", self.package.clone())),
        ))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        // The toolkit comes from its package (an apt resource before this one); what is
        // left is to check, which the verification after apply does.
        Ok(Vec::new())
    }
}
