//! A container template in the node's storage: read from the storage's content through the
//! API and, when missing, fetched by the node itself (`download-url` with the inventory's
//! checksum), before any container is created from it. A wrong checksum fails the node's
//! task and nothing is kept.

use super::op::{Allowed, ApiOp, Op};
use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe};
use super::{Delta, Resource, StepsError};
use crate::plan::{Action, Attribute, Change};

/// The desired template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateSpec {
    /// `STORAGE:vztmpl/FILE`.
    pub volume: String,
    /// Where the node fetches it from.
    pub url: String,
    /// Hex checksum.
    pub checksum: String,
    /// `sha256`, `sha512`, ...
    pub checksum_algorithm: String,
}

/// A template the storage has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateFact {
    /// Its size in bytes, as the storage lists it.
    pub size: u64,
}

impl TemplateSpec {
    /// The storage and the file name.
    pub fn storage_and_file(&self) -> (&str, &str) {
        let (storage, rest) = self
            .volume
            .split_once(':')
            .unwrap_or(("local", &self.volume));
        (storage, rest.strip_prefix("vztmpl/").unwrap_or(rest))
    }

    fn probe(&self) -> Probe {
        Probe::PveTemplate(PveTemplateProbe {
            volume: self.volume.clone(),
        })
    }
}

impl Resource for TemplateSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Node
    }

    fn kind(&self) -> &'static str {
        "template"
    }

    fn name(&self) -> String {
        self.volume.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![self.probe()]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        Ok(match facts.pve_template(&self.probe())? {
            Some(_) => None,
            None => Some(
                Delta::new(Action::Create)
                    .attr(Attribute::change("url", None, Some(self.url.clone())))
                    .attr(Attribute::change(
                        self.checksum_algorithm.as_str(),
                        None,
                        Some(self.checksum.clone()),
                    ))
                    .reason(format!(
                        "not in storage `{}`: the node downloads it (download-url, checksum verified) before containers are created",
                        self.storage_and_file().0
                    )),
            ),
        })
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        // Fetched by the node through its API, before any container needs it.
        Ok(vec![Op::Api(ApiOp::Template {
            address: change.address.clone(),
            spec: self.clone(),
        })])
    }
}

/// Probe: a container template in the node's storage (through the node's API).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PveTemplateProbe {
    /// `STORAGE:vztmpl/FILE`.
    pub volume: String,
}

impl crate::resources::wire::AgentProbe for PveTemplateProbe {}
