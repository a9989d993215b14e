//! A source folder installed editable (`pip install -e`) into a venv, e.g. SGLang from its
//! checkout.

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::inventory::software::normalize_package_name;
use crate::plan::{Action, Attribute, Change};

/// An editable install's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipEditableSpec {
    /// The venv's folder.
    pub venv: String,
    /// The distribution's name (`sglang`).
    pub package: String,
    /// The folder `pip install -e` takes.
    pub source: String,
    /// Extras, e.g. `all`.
    #[serde(default)]
    pub extras: Vec<String>,
    /// `--index-url` for its dependencies.
    #[serde(default)]
    pub index_url: Option<String>,
    /// `--extra-index-url`s.
    #[serde(default)]
    pub extra_index_urls: Vec<String>,
    /// `--no-index --find-links` folder on the target.
    #[serde(default)]
    pub wheelhouse: Option<String>,
}

impl Resource for PipEditableSpec {
    fn kind(&self) -> &'static str {
        "pip_editable"
    }

    fn name(&self) -> String {
        self.source.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv {
            path: self.venv.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let name = normalize_package_name(&self.package);
        let found = facts
            .venv(&self.probes()[0])?
            .and_then(|v| v.editable.get(&name).cloned());
        if found.as_deref() == Some(self.source.as_str()) {
            return Ok(None);
        }
        let action = if found.is_some() {
            Action::Update
        } else {
            Action::Create
        };
        let mut d = Delta::new(action).attr(Attribute::change(
            &format!("{} (editable)", self.package),
            found,
            Some(self.source.clone()),
        ));
        if !self.extras.is_empty() {
            d = d.attr(Attribute::new("extras", self.extras.join(",")));
        }
        Ok(Some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, StepsError> {
        let source = if self.extras.is_empty() {
            self.source.clone()
        } else {
            format!("{}[{}]", self.source, self.extras.join(","))
        };
        Ok(vec![Step::PipInstall {
            venv: self.venv.clone(),
            requirements: vec![source],
            editable: true,
            index_url: self.index_url.clone(),
            extra_index_urls: self.extra_index_urls.clone(),
            wheelhouse: self.wheelhouse.clone(),
        }])
    }
}
