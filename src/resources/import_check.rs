//! The import check of an ml-env: once the venv, its packages and SGLang are installed, the
//! stack's modules are imported in the venv (`torch.cuda`, `sgl_kernel`,
//! `sglang.srt.server_args`) and a C helper is compiled against `Python.h` and loaded, as
//! Triton does at its first kernel launch. A kernel wheel built for another CUDA major fails
//! here with the loader's words (`libcudart.so.12: cannot open shared object file`), a
//! missing compiler or header names itself, and the apply stops before the model download
//! and the service, not an hour later at the health gate.
//!
//! What passed is recorded in the venv (`.provision-import-check`): a digest of the modules,
//! the venv's installed distributions and the runtime packages' versions. The check runs
//! again when any of them changes (a package upgraded by hand, the compiler removed).

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step, StepError};
use super::{Delta, Resource, StepsError};
use crate::plan::{Action, Attribute, Change};

/// The script run with the venv's python.
const SCRIPT: &str = include_str!("import_check.py");

/// The record of the last check that passed, inside the venv.
const MARKER: &str = ".provision-import-check";

/// The desired check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportCheckSpec {
    /// The venv.
    pub venv: String,
    /// Modules to import, in order.
    pub modules: Vec<String>,
    /// Also compile and load a C helper against `Python.h`.
    #[serde(default)]
    pub compile: bool,
    /// The Debian packages the stack needs at run time (their versions are part of what
    /// was checked).
    #[serde(default)]
    pub packages: Vec<String>,
}

impl ImportCheckSpec {
    fn marker(&self) -> String {
        format!("{}/{MARKER}", self.venv.trim_end_matches('/'))
    }

    fn venv_probe(&self) -> Probe {
        Probe::Venv(crate::resources::venv::VenvProbe {
            path: self.venv.clone(),
        })
    }

    fn packages_probe(&self) -> Probe {
        Probe::Packages(crate::resources::apt::PackagesProbe {
            names: self.packages.clone(),
        })
    }

    /// What a passed check records: the modules, the compile flag, every installed
    /// distribution and the runtime packages, hashed.
    pub fn digest(
        &self,
        venv: &super::venv::VenvFact,
        packages: &std::collections::BTreeMap<String, Option<String>>,
    ) -> String {
        use sha2::{Digest, Sha256};
        let text = serde_json::to_string(&(
            &self.modules,
            self.compile,
            &venv.python,
            &venv.packages,
            &venv.editable,
            packages,
        ))
        .unwrap_or_default();
        hex::encode(Sha256::digest(text.as_bytes()))
    }
}

impl Resource for ImportCheckSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "import_check"
    }

    fn name(&self) -> String {
        self.venv.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        let mut p = vec![
            self.venv_probe(),
            Probe::Path(crate::resources::file::PathProbe {
                path: self.marker(),
            }),
        ];
        if !self.packages.is_empty() {
            p.push(self.packages_probe());
        }
        p
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let venv = facts.venv(&self.venv_probe())?;
        let marker = facts.path(&Probe::Path(crate::resources::file::PathProbe {
            path: self.marker(),
        }))?;
        let packages = if self.packages.is_empty() {
            Default::default()
        } else {
            facts.packages(&self.packages_probe())?
        };
        let recorded = marker.and_then(|m| m.content.as_deref()).map(str::trim);
        if let Some(v) = venv
            && recorded == Some(self.digest(v, &packages).as_str())
        {
            return Ok(None);
        }
        let mut d = Delta::new(if recorded.is_none() {
            Action::Create
        } else {
            Action::Update
        })
        .attr(Attribute::new("imports", self.modules.join(", ")));
        if self.compile {
            d = d.attr(Attribute::new(
                "C helper",
                "compiled against Python.h and loaded",
            ));
        }
        if recorded.is_some() {
            d = d.reason("the venv or the runtime packages changed since the last check passed");
        }
        Ok(Some(d))
    }

    fn ops(&self, _change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::ImportCheck(self.clone())])
    }
}

/// Runs the check in the venv and records it (agent side).
pub fn run(spec: &ImportCheckSpec) -> Result<(), StepError> {
    let python = format!("{}/bin/python", spec.venv.trim_end_matches('/'));
    let modules = serde_json::to_string(&spec.modules).unwrap_or_default();
    let out = crate::machine::output(
        &python,
        &[
            "-c".into(),
            SCRIPT.into(),
            modules,
            if spec.compile { "1" } else { "0" }.into(),
        ],
        &[],
    )?;
    let result: serde_json::Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("the import check in {} printed no result", spec.venv))?;
    if result["ok"] != serde_json::Value::Bool(true) {
        let error = result["error"].as_str().unwrap_or_default();
        let (message, hint) = if result["stage"] == "import" {
            let module = result["module"].as_str().unwrap_or_default();
            (
                format!("`import {module}` fails in {}: {error}", spec.venv),
                if error.contains(".so.") {
                    "a native extension needs a library the venv does not have: a wheel built for another CUDA major (PyPI's kernels are CUDA 12 builds) needs its `+cu130` build, pinned in `ml_env.packages` from `ml_env.index.find_links`"
                } else {
                    "install what the module needs in `ml_env.packages`"
                },
            )
        } else {
            (
                format!(
                    "compiling a C helper against Python.h in {} fails: {error}",
                    spec.venv
                ),
                "Triton compiles one at its first kernel launch: the container needs a C compiler and the Python headers (`ml_env.runtime_packages`: build-essential, python3.X-dev)",
            )
        };
        return Err(StepError {
            message,
            hints: vec![hint.into()],
        });
    }
    let venv = super::venv::read(Path::new(&spec.venv))?
        .ok_or_else(|| format!("the venv {} is gone", spec.venv))?;
    let packages = if spec.packages.is_empty() {
        Default::default()
    } else {
        super::apt::packages(&spec.packages)?
    };
    let digest = spec.digest(&venv, &packages);
    crate::machine::write_file_atomic(
        Path::new(&spec.marker()),
        format!("{digest}\n").as_bytes(),
        "root",
        "root",
        0o644,
    )?;
    Ok(())
}

impl crate::resources::wire::AgentStep for ImportCheckSpec {
    fn describe(&self) -> String {
        format!(
            "import {} in {}{}",
            self.modules.join(", "),
            self.venv,
            if self.compile {
                " and compile a C helper against Python.h"
            } else {
                ""
            }
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        run(self)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(15))
    }
}
