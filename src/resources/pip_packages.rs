//! Pinned packages in a venv, from an index or a local wheelhouse. Drift is read from what
//! is installed (the venv's distributions), never from a marker file.

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::inventory::software::normalize_package_name;
use crate::plan::{Action, Attribute, Change};

/// Pinned packages' desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipPackagesSpec {
    /// The venv's folder.
    pub venv: String,
    /// `name==version` requirements.
    pub packages: Vec<String>,
    /// `--index-url`.
    #[serde(default)]
    pub index_url: Option<String>,
    /// `--extra-index-url`s.
    #[serde(default)]
    pub extra_index_urls: Vec<String>,
    /// `--no-index --find-links` folder on the target.
    #[serde(default)]
    pub wheelhouse: Option<String>,
}

impl PipPackagesSpec {
    /// `(normalised name, version)` of each requirement.
    pub fn pins(&self) -> Vec<(String, String)> {
        self.packages
            .iter()
            .filter_map(|p| p.split_once("=="))
            .map(|(n, v)| {
                let base = n.split('[').next().unwrap_or(n);
                (normalize_package_name(base), v.to_string())
            })
            .collect()
    }
}

impl Resource for PipPackagesSpec {
    fn kind(&self) -> &'static str {
        "pip_packages"
    }

    fn name(&self) -> String {
        self.venv.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv {
            path: self.venv.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.venv(&self.probes()[0])?;
        let mut d = Delta::new(if found.is_some() {
            Action::Update
        } else {
            Action::Create
        });
        for (name, want) in self.pins() {
            let have = found.and_then(|v| v.packages.get(&name).cloned());
            if have.as_deref() != Some(want.as_str()) {
                d = d.attr(Attribute::change(&name, have, Some(want)));
            }
        }
        if let Some(src) = self.wheelhouse.as_ref().or(self.index_url.as_ref())
            && !d.attributes.is_empty()
        {
            d = d.reason(format!("installed from {src}"));
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, StepsError> {
        Ok(vec![Step::PipInstall {
            venv: self.venv.clone(),
            requirements: self.packages.clone(),
            editable: false,
            index_url: self.index_url.clone(),
            extra_index_urls: self.extra_index_urls.clone(),
            wheelhouse: self.wheelhouse.clone(),
        }])
    }
}

/// `pip install` into a venv: pinned requirements, or one source folder with `editable`.
pub fn install(
    venv: &str,
    requirements: &[String],
    editable: bool,
    index_url: Option<&str>,
    extra_index_urls: &[String],
    wheelhouse: Option<&str>,
) -> Result<(), String> {
    let mut args: Vec<String> = vec![
        "install".into(),
        "--no-input".into(),
        "--disable-pip-version-check".into(),
        "--no-warn-script-location".into(),
    ];
    match (wheelhouse, index_url) {
        (Some(w), _) => {
            args.extend(["--no-index".into(), "--find-links".into(), w.to_string()]);
        }
        (None, Some(u)) => args.extend(["--index-url".into(), u.to_string()]),
        (None, None) => {}
    }
    for u in extra_index_urls {
        args.extend(["--extra-index-url".into(), u.clone()]);
    }
    if editable {
        args.push("-e".into());
    }
    args.extend(requirements.iter().cloned());
    crate::host::run(&format!("{venv}/bin/pip"), &args, &[])
}
