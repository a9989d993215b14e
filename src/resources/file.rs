//! A file with content, owner, group and mode. Written atomically and read back (apply).

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, mode_text, owner_mode_changes, unified_diff};
use crate::machine::HostError;
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
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Path(PathProbe {
            path: self.path.clone(),
        })]
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

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::WriteFile(WriteFileStep {
            path: self.path.clone(),
            content: self.content.clone(),
            owner: self.owner.clone(),
            group: self.group.clone(),
            mode: self.mode,
        })])
    }
}

// The agent side: what is at a path.

/// Files up to this size are hashed; larger ones (not config files) are only stat'ed.
const HASH_LIMIT: u64 = 256 * 1024 * 1024;

/// Files up to this size are sent back whole when they are text, for diffs.
const CONTENT_LIMIT: u64 = 256 * 1024;

/// The kind of thing at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (socket, device ...).
    Other,
}

/// What is at a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathFact {
    /// Its kind.
    pub kind: PathKind,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// Owner name (or uid when unnamed).
    pub owner: String,
    /// Group name (or gid when unnamed).
    pub group: String,
    /// Size in bytes (files).
    pub size: u64,
    /// sha256 of the content (files).
    pub sha256: Option<String>,
    /// The content when it is small UTF-8 text, for diffs.
    pub content: Option<String>,
}

/// What is at `path` (not following a final symlink).
pub fn path_fact(path: &Path) -> Result<Option<PathFact>, HostError> {
    read_path(path, true)
}

/// What is at `path`, its content not read (no sha256, no text).
pub fn stat_fact(path: &Path) -> Result<Option<PathFact>, HostError> {
    read_path(path, false)
}

fn read_path(path: &Path, hash: bool) -> Result<Option<PathFact>, HostError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HostError::io("stat", path)(e)),
    };
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        PathKind::File
    } else if ft.is_dir() {
        PathKind::Dir
    } else if ft.is_symlink() {
        PathKind::Symlink
    } else {
        PathKind::Other
    };
    let (users, groups) = crate::machine::id_names();
    let name =
        |map: &BTreeMap<u32, String>, id: u32| map.get(&id).cloned().unwrap_or(id.to_string());
    let mut fact = PathFact {
        kind,
        mode: meta.permissions().mode() & 0o7777,
        owner: name(&users, meta.uid()),
        group: name(&groups, meta.gid()),
        size: meta.len(),
        sha256: None,
        content: None,
    };
    if hash && kind == PathKind::File && meta.len() <= HASH_LIMIT {
        let mut file = fs::File::open(path).map_err(HostError::io("read", path))?;
        let mut hasher = Sha256::new();
        let mut small = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf).map_err(HostError::io("read", path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            if meta.len() <= CONTENT_LIMIT {
                small.extend_from_slice(&buf[..n]);
            }
        }
        fact.sha256 = Some(hex::encode(hasher.finalize()));
        if meta.len() <= CONTENT_LIMIT {
            fact.content = String::from_utf8(small).ok();
        }
    }
    Ok(Some(fact))
}

/// Probe: a path's type, owner, mode, and for files size, sha256 and (small text) content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PathProbe {
    /// Absolute path.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for PathProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Path(path_fact(
            std::path::Path::new(&self.path),
        )?))
    }
}

/// Probe: a path's type, owner, mode and size, without reading it (a content-addressed tool).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct StatProbe {
    /// Absolute path.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for StatProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Path(stat_fact(
            std::path::Path::new(&self.path),
        )?))
    }
}

/// Step: write a file atomically and verify it by reading it back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WriteFileStep {
    /// Absolute path.
    pub path: String,
    /// Content.
    pub content: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Permission bits.
    pub mode: u32,
}

impl crate::resources::wire::AgentStep for WriteFileStep {
    fn describe(&self) -> String {
        format!("write {}", self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        crate::machine::write_file_atomic(
            std::path::Path::new(&self.path),
            self.content.as_bytes(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_fact_of_a_file_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.conf");
        fs::write(&f, "hello\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let fact = path_fact(&f).unwrap().unwrap();
        assert_eq!(fact.kind, PathKind::File);
        assert_eq!(fact.mode, 0o640);
        assert_eq!(fact.content.as_deref(), Some("hello\n"));
        assert_eq!(
            fact.sha256.as_deref(),
            Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
        );
        assert_eq!(path_fact(&dir.path().join("nope")).unwrap(), None);
    }
}
