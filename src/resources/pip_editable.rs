//! A source folder installed editable (`pip install -e`) into a venv, e.g. SGLang from its
//! checkout.

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::pip_packages::PipIndex;
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
    /// Where pip finds its dependencies.
    #[serde(flatten)]
    pub index: PipIndex,
    /// uv's path on the target when uv installs it (else the venv's pip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uv: Option<String>,
}

impl Resource for PipEditableSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "pip_editable"
    }

    fn name(&self) -> String {
        self.source.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv(crate::resources::venv::VenvProbe {
            path: self.venv.clone(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let name = normalize_package_name(&self.package);
        let found = facts
            .venv(&self.probes()[0])?
            .and_then(|v| v.editable.get(&name).cloned());
        // As paths, so `/src/` and `/src` (or `//src`) are one folder.
        if found
            .as_deref()
            .is_some_and(|f| Path::new(f) == Path::new(&self.source))
        {
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

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        let source = if self.extras.is_empty() {
            self.source.clone()
        } else {
            format!("{}[{}]", self.source, self.extras.join(","))
        };
        guest(vec![Step::PipInstall(
            crate::resources::pip_packages::PipInstallStep {
                venv: self.venv.clone(),
                requirements: vec![source],
                editable: true,
                index: self.index.clone(),
                uv: self.uv.clone(),
            },
        )])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::resources::venv::VenvFact;
    use crate::resources::wire::Fact;

    fn diff(installed_from: Option<&str>) -> Option<Delta> {
        let spec: PipEditableSpec = serde_json::from_value(serde_json::json!({
            "venv": "/opt/env",
            "package": "SGLang",
            "source": "/root/sglang main/python",
            "extras": [],
            "index_url": null,
            "extra_index_urls": [],
            "wheelhouse": null,
        }))
        .unwrap();
        let venv = VenvFact {
            python: "3.12".into(),
            packages: BTreeMap::new(),
            editable: installed_from
                .map(|f| ("sglang".to_string(), f.to_string()))
                .into_iter()
                .collect(),
            complete: true,
            interpreter: true,
            uv: false,
        };
        let facts = Facts::Read(HashMap::from([(
            spec.probes()[0].clone(),
            Fact::Venv(Some(venv)),
        )]));
        spec.diff(&facts).unwrap()
    }

    #[test]
    fn the_source_is_compared_as_a_folder() {
        assert_eq!(diff(Some("/root/sglang main/python")), None);
        assert_eq!(diff(Some("/root/sglang main/python/")), None);
        assert_eq!(diff(Some("/root//sglang main/python")), None);
        let d = diff(Some("/root/other/python")).unwrap();
        assert_eq!(d.action, Action::Update);
        assert_eq!(diff(None).unwrap().action, Action::Create);
    }
}
