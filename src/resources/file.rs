//! A file with content, owner, group and mode. Written atomically and read back (apply).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Delta, Resource, mode_text, owner_mode_changes, unified_diff};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, PathKind, Probe};
use crate::plan::{Action, Attribute, Change};

/// A file's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Absolute path.
    pub path: String,
    /// The whole content.
    pub content: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Permission bits.
    pub mode: u32,
}

impl FileSpec {
    /// sha256 of the content, hex.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.content.as_bytes()))
    }
}

impl Resource for FileSpec {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Path {
            path: self.path.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.path(&self.probes()[0])?;
        let owner = format!("{}:{}", self.owner, self.group);
        let Some(found) = found else {
            let mut d = Delta::new(Action::Create)
                .attr(Attribute::new("owner", owner))
                .attr(Attribute::new("mode", mode_text(self.mode)))
                .attr(Attribute::new("sha256", self.sha256()));
            d.diff = Some(unified_diff(&self.path, None, &self.content));
            return Ok(Some(d));
        };
        if found.kind != PathKind::File {
            let mut d = Delta::new(Action::Replace)
                .reason(format!("{} is a {:?}, not a file", self.path, found.kind).to_lowercase());
            d.diff = Some(unified_diff(&self.path, None, &self.content));
            return Ok(Some(d));
        }
        let mut d = Delta::new(Action::Update);
        d.attributes = owner_mode_changes(found, &self.owner, &self.group, self.mode);
        let want = self.sha256();
        if found.sha256.as_deref() != Some(want.as_str()) {
            d = d.attr(Attribute::change(
                "sha256",
                found.sha256.clone(),
                Some(want),
            ));
            d.diff = Some(match &found.content {
                Some(old) => unified_diff(&self.path, Some(old), &self.content),
                None => format!(
                    "(the file on the target is binary or large; {} bytes there)",
                    found.size
                ),
            });
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        Ok(vec![Step::WriteFile {
            path: self.path.clone(),
            content: self.content.clone(),
            owner: self.owner.clone(),
            group: self.group.clone(),
            mode: self.mode,
        }])
    }
}
