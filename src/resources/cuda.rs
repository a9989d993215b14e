//! The CUDA toolkit at its home with the declared release (installed by a package; this
//! resource checks what `nvcc --version` and `version.json` say).

use std::fs;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
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

    fn steps(&self, _: &Change) -> Result<Vec<Step>, StepsError> {
        // The toolkit comes from its package (an apt resource before this one); what is
        // left is to check, which the verification after apply does.
        Ok(Vec::new())
    }
}

/// A CUDA toolkit as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaFact {
    /// Release from `nvcc --version` (`13.0`), if nvcc runs.
    pub nvcc_release: Option<String>,
    /// Version from `version.json` (`13.0.88`), if present.
    pub version_json: Option<String>,
}

/// A CUDA toolkit: `version.json` and what its nvcc reports.
pub fn read(home: &Path) -> Option<CudaFact> {
    if !home.is_dir() {
        return None;
    }
    let version_json = fs::read_to_string(home.join("version.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["cuda"]["version"].as_str().map(str::to_string));
    let nvcc_release = Command::new(home.join("bin/nvcc"))
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| parse_nvcc_release(&String::from_utf8_lossy(&o.stdout)));
    Some(CudaFact {
        nvcc_release,
        version_json,
    })
}

/// `13.0` from nvcc's `Cuda compilation tools, release 13.0, V13.0.88`.
pub fn parse_nvcc_release(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.split_once("release ").map(|(_, r)| r))
        .and_then(|r| r.split(',').next())
        .map(|r| r.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvcc_release_line() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_nvcc_release(text).as_deref(), Some("13.0"));
    }
}
