//! The CUDA toolkit at its home with the declared release (installed by a package; this
//! resource checks what `nvcc --version` and `version.json` say).

use crate::resources::op::{Allowed, Op};
use std::fs;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe};
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
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "cuda_toolkit"
    }

    fn name(&self) -> String {
        self.home.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Cuda(CudaProbe {
            home: self.home.clone(),
        })]
    }

    /// The declared release is what the toolkit's compiler reports, and what its
    /// `version.json` records where the toolkit ships one (CUDA 11.1 and later do): a
    /// `version.json` of another release means a half-replaced toolkit, which is drift too.
    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.cuda(&self.probes()[0])?;
        let release = found.and_then(|f| f.nvcc_release.clone());
        let recorded = found.and_then(|f| f.version_json.clone());
        let recorded_release = recorded
            .as_deref()
            .map(|v| v.split('.').take(2).collect::<Vec<_>>().join("."));
        let nvcc_ok = release.as_deref() == Some(self.version.as_str());
        let json_ok = recorded_release
            .as_deref()
            .is_none_or(|r| r == self.version.as_str());
        if nvcc_ok && json_ok {
            return Ok(None);
        }
        let action = if found.is_none() {
            Action::Create
        } else {
            Action::Update
        };
        let mut d = Delta::new(action);
        if !nvcc_ok {
            d = d.attr(Attribute::change(
                "release",
                release,
                Some(self.version.clone()),
            ));
        }
        if !json_ok {
            d = d.attr(Attribute::change(
                "version.json",
                recorded,
                Some(format!("{}.*", self.version)),
            ));
        }
        Ok(Some(
            d.attr(Attribute::new("package", self.package.clone())),
        ))
    }

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
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

/// Probe: a CUDA toolkit: its release from `version.json` and `nvcc --version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CudaProbe {
    /// The toolkit's home.
    pub home: String,
}

impl crate::resources::wire::AgentProbe for CudaProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Cuda(read(
            std::path::Path::new(&self.home),
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::resources::wire::Fact;

    #[test]
    fn nvcc_release_line() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_nvcc_release(text).as_deref(), Some("13.0"));
    }

    fn diff(nvcc: Option<&str>, json: Option<&str>) -> Option<Delta> {
        let spec = CudaSpec {
            home: "/usr/local/cuda-13.0".into(),
            version: "13.0".into(),
            package: "cuda-toolkit-13-0".into(),
        };
        let facts = Facts::Read(HashMap::from([(
            spec.probes()[0].clone(),
            Fact::Cuda(Some(CudaFact {
                nvcc_release: nvcc.map(str::to_string),
                version_json: json.map(str::to_string),
            })),
        )]));
        spec.diff(&facts).unwrap()
    }

    #[test]
    fn nvcc_and_version_json_must_both_say_the_release() {
        assert_eq!(diff(Some("13.0"), Some("13.0.88")), None);
        assert_eq!(
            diff(Some("13.0"), None),
            None,
            "older toolkits have no version.json"
        );
        let d = diff(Some("13.0"), Some("12.8.93")).unwrap();
        assert_eq!(d.attributes[0].name, "version.json");
        assert_eq!(d.attributes[0].before.as_deref(), Some("12.8.93"));
        let d = diff(Some("12.8"), Some("13.0.88")).unwrap();
        assert_eq!(d.attributes[0].name, "release");
        assert_eq!(d.attributes.len(), 2, "release and package");
        // 13.0 must not be satisfied by 13.01 or 130.
        assert!(diff(Some("13.0"), Some("13.01.1")).is_some());
    }
}
