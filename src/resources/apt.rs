//! Debian packages, present (optionally at a version), installed in one transaction.

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

/// Packages to have installed: `name` or `name=version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptSpec {
    /// Package names, optionally `=version`, sorted and unique.
    pub packages: Vec<String>,
}

impl AptSpec {
    fn split(entry: &str) -> (&str, Option<&str>) {
        match entry.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (entry, None),
        }
    }
}

impl Resource for AptSpec {
    fn kind(&self) -> &'static str {
        "apt"
    }

    fn name(&self) -> String {
        "packages".to_string()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Packages {
            names: self
                .packages
                .iter()
                .map(|p| Self::split(p).0.to_string())
                .collect(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let installed = facts.packages(&self.probes()[0])?;
        let mut d = Delta::new(Action::Update);
        let mut any_installed = false;
        for entry in &self.packages {
            let (name, want) = Self::split(entry);
            let have = installed.get(name).cloned().flatten();
            any_installed |= have.is_some();
            let ok = match (&have, want) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(h), Some(w)) => h == w,
            };
            if !ok {
                let after = want.map_or("installed".to_string(), str::to_string);
                d = d.attr(Attribute::change(name, have, Some(after)));
            }
        }
        if d.attributes.is_empty() {
            return Ok(None);
        }
        if !any_installed {
            d.action = Action::Create;
        }
        Ok(Some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        // One transaction for all of them; apt leaves the ones already right alone.
        Ok(vec![Step::AptInstall {
            packages: self.packages.clone(),
        }])
    }
}
