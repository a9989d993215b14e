//! A Python virtual environment at a path with a Python release.

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::inventory::software::normalize_package_name;
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// A venv's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VenvSpec {
    /// The venv's folder.
    pub path: String,
    /// Python release, `MAJOR.MINOR`.
    pub python: String,
    /// uv's path on the target when uv makes the venv (it then has no pip); else
    /// `python -m venv`. Left out of plans when unset, so they keep their shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uv: Option<String>,
}

impl Resource for VenvSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "venv"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv(VenvProbe {
            path: self.path.clone(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        match facts.venv(&self.probes()[0])? {
            None => Ok(Some(
                Delta::new(Action::Create).attr(Attribute::new("python", self.python.clone())),
            )),
            // uv makes a venv without pip; one interrupted before its interpreter is linked
            // is made again.
            Some(v) if self.uv.is_some() && !v.interpreter => Ok(Some(
                Delta::new(Action::Replace)
                    .attr(Attribute::change(
                        "bin/python",
                        Some("missing".to_string()),
                        Some("present".to_string()),
                    ))
                    .reason("an interrupted creation left the venv without its Python; it is made again"),
            )),
            // `python -m venv` writes pyvenv.cfg before it installs pip: one interrupted
            // (a kill, a reboot) leaves a venv no later step can use (and one uv made has
            // no pip at all). Made again.
            Some(v) if self.uv.is_none() && !v.complete => Ok(Some(
                Delta::new(Action::Replace)
                    .attr(Attribute::change(
                        "bin/pip",
                        Some("missing".to_string()),
                        Some("present".to_string()),
                    ))
                    .reason(if v.interpreter && v.uv {
                        "uv made this venv (it has no pip) and the installer is now pip (`ml_env.installer` unset and uv's wheel not in this workstation's cache?); it is made again by pip"
                    } else {
                        "an interrupted creation left the venv without pip; it is made again"
                    }),
            )),
            Some(v) if v.python == self.python => Ok(None),
            Some(v) => Ok(Some(
                Delta::new(Action::Replace)
                    .attr(Attribute::change(
                        "python",
                        Some(v.python.clone()),
                        Some(self.python.clone()),
                    ))
                    .reason("a venv cannot change its Python in place; it is made again and its packages reinstalled"),
            )),
        }
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::CreateVenv(CreateVenvStep {
            path: self.path.clone(),
            python: self.python.clone(),
            replace: change.action == Action::Replace,
            uv: self.uv.clone(),
        })])
    }
}

/// A venv as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VenvFact {
    /// `MAJOR.MINOR` of its Python.
    pub python: String,
    /// Installed distributions: normalised name to version.
    pub packages: BTreeMap<String, String>,
    /// Editable installs: normalised name to the source folder.
    pub editable: BTreeMap<String, String>,
    /// Whether its Python and pip are there (not so after an interrupted creation).
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    /// Whether its Python is there (all a venv made by uv, which has no pip, needs).
    #[serde(default = "complete_by_default")]
    pub interpreter: bool,
    /// Whether uv made it (its `pyvenv.cfg` names uv's version).
    #[serde(default)]
    pub uv: bool,
}

fn complete_by_default() -> bool {
    true
}

/// A venv: Python release from `pyvenv.cfg`, distributions from `*.dist-info`.
pub fn read(path: &Path) -> Result<Option<VenvFact>, HostError> {
    let cfg_path = path.join("pyvenv.cfg");
    let cfg = match fs::read_to_string(&cfg_path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HostError::io("read", &cfg_path)(e)),
    };
    let version = cfg
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| matches!(k.trim(), "version" | "version_info"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let python = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let made_by_uv = cfg
        .lines()
        .filter_map(|l| l.split_once('='))
        .any(|(k, _)| k.trim() == "uv");
    let mut packages = BTreeMap::new();
    let mut editable = BTreeMap::new();
    let lib = path.join("lib");
    let pythons = fs::read_dir(&lib).map_err(HostError::io("read", &lib))?;
    for py in pythons.flatten() {
        let site = py.path().join("site-packages");
        let Ok(entries) = fs::read_dir(&site) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().is_none_or(|e| e != "dist-info") {
                continue;
            }
            let Ok(meta) = fs::read_to_string(p.join("METADATA")) else {
                continue;
            };
            let field = |name: &str| {
                meta.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            let (Some(name), Some(ver)) = (field("Name:"), field("Version:")) else {
                continue;
            };
            let key = normalize_package_name(&name);
            if let Ok(direct) = fs::read_to_string(p.join("direct_url.json"))
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&direct)
                && v["dir_info"]["editable"] == serde_json::Value::Bool(true)
                && let Some(url) = v["url"].as_str()
            {
                // pip writes a file URL, percent-encoded: the folder is its decoded path.
                let folder = url::Url::parse(url)
                    .ok()
                    .and_then(|u| u.to_file_path().ok())
                    .map_or_else(|| url.to_string(), |p| p.display().to_string());
                editable.insert(key.clone(), folder);
            }
            packages.insert(key, ver);
        }
    }
    let interpreter = path.join("bin/python").exists();
    let complete = interpreter && path.join("bin/pip").exists();
    Ok(Some(VenvFact {
        python,
        packages,
        editable,
        complete,
        interpreter,
        uv: made_by_uv,
    }))
}

/// Makes a venv, removing a wrong one first when `replace`; with uv's path, by uv.
pub fn create(path: &str, python: &str, replace: bool, uv: Option<&str>) -> Result<(), HostError> {
    if replace && Path::new(path).exists() {
        fs::remove_dir_all(path).map_err(HostError::io("remove the old venv", Path::new(path)))?;
    }
    if let Some(uv) = uv {
        return crate::machine::run(uv, &super::uv::venv_args(path, python), &[]);
    }
    crate::machine::run(
        &format!("python{python}"),
        &["-m".into(), "venv".into(), path.to_string()],
        &[],
    )
}

/// Probe: a Python venv: its Python release and installed distributions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct VenvProbe {
    /// The venv's folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for VenvProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Venv(read(
            std::path::Path::new(&self.path),
        )?))
    }
}

/// Step: make a venv (removing a wrong one first when `replace`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CreateVenvStep {
    /// The venv's folder.
    pub path: String,
    /// `MAJOR.MINOR`.
    pub python: String,
    /// Remove what is there first.
    pub replace: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// uv's path on the target, when uv makes it (else `python -m venv`).
    pub uv: Option<String>,
}

impl crate::resources::wire::AgentStep for CreateVenvStep {
    fn describe(&self) -> String {
        match self.uv {
            Some(_) => format!("uv venv --python python{} {}", self.python, self.path),
            None => format!("python{} -m venv {}", self.python, self.path),
        }
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        create(&self.path, &self.python, self.replace, self.uv.as_deref())?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_venv_without_pip_is_incomplete_and_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("venv");
        fs::create_dir_all(v.join("lib/python3.11/site-packages")).unwrap();
        fs::create_dir_all(v.join("bin")).unwrap();
        fs::write(v.join("pyvenv.cfg"), "home = /usr/bin\nversion = 3.11.2\n").unwrap();
        fs::write(v.join("bin/python"), "").unwrap();
        let fact = read(&v).unwrap().unwrap();
        assert!(!fact.complete);
        let spec = VenvSpec {
            path: v.display().to_string(),
            python: "3.11".into(),
            uv: None,
        };
        let facts = Facts::Read(std::collections::HashMap::from([(
            spec.probes()[0].clone(),
            super::super::wire::Fact::Venv(Some(fact)),
        )]));
        let delta = spec.diff(&facts).unwrap().expect("a change");
        assert_eq!(delta.action, Action::Replace);
        fs::write(v.join("bin/pip"), "").unwrap();
        assert!(read(&v).unwrap().unwrap().complete);
    }

    #[test]
    fn a_venv_uv_made_is_whole_without_pip_and_pip_makes_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("venv");
        fs::create_dir_all(v.join("lib/python3.11/site-packages")).unwrap();
        fs::create_dir_all(v.join("bin")).unwrap();
        fs::write(
            v.join("pyvenv.cfg"),
            "home = /usr/bin\nimplementation = CPython\nuv = 0.13.9\nversion_info = 3.11.2\n",
        )
        .unwrap();
        fs::write(v.join("bin/python"), "").unwrap();
        let fact = read(&v).unwrap().unwrap();
        assert!(fact.uv && fact.interpreter && !fact.complete);
        assert_eq!(fact.python, "3.11");
        let mut spec = VenvSpec {
            path: v.display().to_string(),
            python: "3.11".into(),
            uv: Some("/var/lib/provision/tools/uv".into()),
        };
        let facts = Facts::Read(std::collections::HashMap::from([(
            spec.probes()[0].clone(),
            super::super::wire::Fact::Venv(Some(fact)),
        )]));
        assert_eq!(spec.diff(&facts).unwrap(), None);
        spec.uv = None;
        let d = spec.diff(&facts).unwrap().expect("pip needs pip");
        assert_eq!(d.action, Action::Replace);
        assert!(
            d.reasons[0].contains("uv made this venv"),
            "{:?}",
            d.reasons
        );
        fs::remove_file(v.join("bin/python")).unwrap();
        spec.uv = Some("/var/lib/provision/tools/uv".into());
        let facts = Facts::Read(std::collections::HashMap::from([(
            spec.probes()[0].clone(),
            super::super::wire::Fact::Venv(read(&v).unwrap()),
        )]));
        assert_eq!(spec.diff(&facts).unwrap().unwrap().action, Action::Replace);
    }

    #[test]
    fn venv_from_dist_info() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path();
        fs::write(v.join("pyvenv.cfg"), "home = /usr/bin\nversion = 3.11.2\n").unwrap();
        let site = v.join("lib/python3.11/site-packages");
        for (name, ver, editable) in [
            ("Torch", "2.9.1", None),
            ("sglang", "0.5.10", Some("/root/sglang-main/python")),
        ] {
            let d = site.join(format!("{name}-{ver}.dist-info"));
            fs::create_dir_all(&d).unwrap();
            fs::write(
                d.join("METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n\nbody"),
            )
            .unwrap();
            if let Some(src) = editable {
                fs::write(
                    d.join("direct_url.json"),
                    format!("{{\"url\": \"file://{src}\", \"dir_info\": {{\"editable\": true}}}}"),
                )
                .unwrap();
            }
        }
        let fact = read(v).unwrap().unwrap();
        assert_eq!(fact.python, "3.11");
        assert_eq!(fact.packages["torch"], "2.9.1");
        assert_eq!(fact.editable["sglang"], "/root/sglang-main/python");
        assert_eq!(read(&v.join("absent")).unwrap(), None);
    }
}
