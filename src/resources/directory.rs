//! A directory with owner, group and mode.

use crate::resources::op::{Allowed, Op, guest};
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::file::PathKind;
use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, mode_text, owner_mode_changes};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// A directory's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectorySpec {
    /// Absolute path.
    pub path: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Permission bits.
    pub mode: u32,
}

impl Resource for DirectorySpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "directory"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Path(crate::resources::file::PathProbe {
            path: self.path.clone(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let owner = format!("{}:{}", self.owner, self.group);
        let Some(found) = facts.path(&self.probes()[0])? else {
            return Ok(Some(
                Delta::new(Action::Create)
                    .attr(Attribute::new("owner", owner))
                    .attr(Attribute::new("mode", mode_text(self.mode))),
            ));
        };
        if found.kind != PathKind::Dir {
            return Ok(Some(Delta::new(Action::Replace).reason(
                format!("{} is a {:?}, not a directory", self.path, found.kind).to_lowercase(),
            )));
        }
        let mut d = Delta::new(Action::Update);
        d.attributes = owner_mode_changes(found, &self.owner, &self.group, self.mode);
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::Mkdir(MkdirStep {
            path: self.path.clone(),
            owner: self.owner.clone(),
            group: self.group.clone(),
            mode: self.mode,
        })])
    }
}

/// Makes a directory (and its parents) with owner and mode.
pub fn mkdir(path: &Path, owner: &str, group: &str, mode: u32) -> Result<(), HostError> {
    fs::create_dir_all(path).map_err(HostError::io("create", path))?;
    crate::machine::set_owner_mode(path, owner, group, mode)
}

/// Step: make a directory (and its parents) with owner and mode.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MkdirStep {
    /// Absolute path.
    pub path: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Permission bits.
    pub mode: u32,
}

impl crate::resources::wire::AgentStep for MkdirStep {
    fn describe(&self) -> String {
        format!("mkdir {}", self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        mkdir(
            std::path::Path::new(&self.path),
            &self.owner,
            &self.group,
            self.mode,
        )?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(5))
    }
}
