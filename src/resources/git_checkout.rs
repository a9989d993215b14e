//! A git checkout at a pinned commit.

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

/// A checkout's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitCheckoutSpec {
    /// Repository URL.
    pub repo: String,
    /// The commit (40 hex).
    pub revision: String,
    /// The checkout's folder.
    pub path: String,
}

impl Resource for GitCheckoutSpec {
    fn kind(&self) -> &'static str {
        "git_checkout"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Git {
            path: self.path.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let Some(found) = facts.git(&self.probes()[0])? else {
            return Ok(Some(
                Delta::new(Action::Create)
                    .attr(Attribute::new("repo", self.repo.clone()))
                    .attr(Attribute::new("commit", self.revision.clone())),
            ));
        };
        let mut d = Delta::new(Action::Update);
        if found.head != self.revision {
            d = d.attr(Attribute::change(
                "commit",
                Some(found.head.clone()),
                Some(self.revision.clone()),
            ));
        }
        // A checkout whose origin points elsewhere fetches from elsewhere: the step resets it.
        if found.origin.as_deref() != Some(self.repo.as_str()) {
            d = d.attr(Attribute::change(
                "origin",
                found.origin.clone(),
                Some(self.repo.clone()),
            ));
        }
        if found.dirty {
            d = d.reason("the checkout has local changes; they will be discarded");
            if d.attributes.is_empty() {
                d = d.attr(Attribute::change(
                    "local changes",
                    Some("present".into()),
                    Some("none".into()),
                ));
            }
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        Ok(vec![Step::GitCheckout {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            path: self.path.clone(),
        }])
    }
}
