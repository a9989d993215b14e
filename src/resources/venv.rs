//! A Python virtual environment at a path with a Python release.

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

/// A venv's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VenvSpec {
    /// The venv's folder.
    pub path: String,
    /// Python release, `MAJOR.MINOR`.
    pub python: String,
}

impl Resource for VenvSpec {
    fn kind(&self) -> &'static str {
        "venv"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv {
            path: self.path.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        match facts.venv(&self.probes()[0])? {
            None => Ok(Some(
                Delta::new(Action::Create).attr(Attribute::new("python", self.python.clone())),
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

    fn steps(&self, change: &Change) -> Result<Vec<Step>, String> {
        Ok(vec![Step::CreateVenv {
            path: self.path.clone(),
            python: self.python.clone(),
            replace: change.action == Action::Replace,
        }])
    }
}
