//! A Hugging Face model in a folder, downloaded on the target and verified.

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

/// A model's desired state. The token is a reference (`env HF_TOKEN`), never a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `org/name`.
    pub repo: String,
    /// Branch, tag or commit as declared.
    pub revision: String,
    /// Include globs.
    #[serde(default)]
    pub include: Vec<String>,
    /// Exclude globs.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The model's folder.
    pub path: String,
    /// The hub's URL.
    pub endpoint: String,
    /// Where the token comes from, if the repository is gated.
    #[serde(default)]
    pub token: Option<String>,
}

impl Resource for ModelSpec {
    fn kind(&self) -> &'static str {
        "model"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Model {
            path: self.path.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let Some(found) = facts.model(&self.probes()[0])? else {
            let mut d = Delta::new(Action::Create)
                .attr(Attribute::new(
                    "repo",
                    format!("{}@{}", self.repo, self.revision),
                ))
                .attr(Attribute::new("from", self.endpoint.clone()));
            if !self.include.is_empty() {
                d = d.attr(Attribute::new("include", self.include.join(" ")));
            }
            if !self.exclude.is_empty() {
                d = d.attr(Attribute::new("exclude", self.exclude.join(" ")));
            }
            if let Some(token) = &self.token {
                d = d.attr(Attribute::new("token", format!("from {token}")));
            }
            return Ok(Some(d.reason(
                "downloaded on the target, every file verified by sha256",
            )));
        };
        let mut d = Delta::new(Action::Update);
        if found.repo != self.repo {
            d = d.attr(Attribute::change(
                "repo",
                Some(found.repo.clone()),
                Some(self.repo.clone()),
            ));
        }
        if !found.intact {
            d = d.attr(Attribute::change(
                "files",
                Some(format!("{} changed since verified", found.changed.len())),
                Some("verified".into()),
            ));
            for f in found.changed.iter().take(5) {
                d = d.reason(format!("{f} changed since it was verified"));
            }
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        Err("downloading models on the target is not built yet (model store issue)".into())
    }
}
