//! What provision manages on a guest, and removing what is no longer declared.
//!
//! Apply keeps one record per guest ([`RECORD_FILE`] in the agent's folder): the files it wrote (with the sha256
//! it wrote), the services it deployed and the model folders it declared. `plan` reads it
//! and turns each entry the inventory no longer declares into a [`Removal`], a resource
//! like any other whose diff is a `-` change: a service is stopped and disabled, a file
//! provision wrote is removed (kept, and named, when it changed since), and a model folder
//! is only named with its size unless `--prune-models` asks for it to be deleted: data is
//! never deleted by omission. Packages, venvs, checkouts and folders are not recorded:
//! they are left in place when no longer declared.

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step, StepError};
use super::{Delta, Resource, ResourceSpec, StepsError};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// The record's file in the agent's state folder (`/var/lib/provision/managed.json` on a
/// guest), owned by provision.
pub const RECORD_FILE: &str = "managed.json";

fn record_path() -> std::path::PathBuf {
    crate::machine::state_dir().join(RECORD_FILE)
}

/// The record's format version, bumped on any change another version would read differently.
pub const RECORD_VERSION: u32 = 1;

/// What provision manages on one guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// Each thing, once, in the order apply made them.
    pub entries: Vec<Entry>,
}

/// One thing provision manages, with what it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    /// A file, with the sha256 of the content provision wrote.
    File {
        /// Absolute path.
        path: String,
        /// sha256 of what was written.
        sha256: String,
    },
    /// A systemd service provision deployed (its unit file is a `file` entry of its own).
    Service {
        /// The unit.
        unit: String,
    },
    /// A model folder.
    Model {
        /// The folder.
        path: String,
        /// The repository it holds.
        repo: String,
    },
    /// A container provision created (its marker names its vmid) that no declared
    /// container is: found in the node's listing, never in a guest's record.
    Container {
        /// Its vmid.
        vmid: u64,
        /// The node's name in Proxmox.
        node: String,
        /// Its hostname.
        hostname: String,
        /// When provision created it (from the marker).
        created: String,
        /// The inventory file that created it (from the marker).
        owner: String,
    },
    /// Config lines a role no longer declared had provision write into a container's
    /// config, as the container's description records them
    /// ([`super::pve_lines::RECORD_PREFIX`]): never in a guest's record.
    PveLines {
        /// The container.
        vmid: u64,
        /// The role's label for them.
        label: String,
        /// `key: value`, as written.
        lines: Vec<String>,
    },
}

impl Entry {
    /// The entry of a declared resource, for the kinds provision removes or names.
    pub fn of(spec: &ResourceSpec) -> Option<Entry> {
        Some(match spec {
            ResourceSpec::File(f) => Entry::File {
                path: f.path.clone(),
                sha256: f.sha256(),
            },
            ResourceSpec::Service(s) => Entry::Service {
                unit: s.unit.clone(),
            },
            ResourceSpec::Model(m) => Entry::Model {
                path: m.path.clone(),
                repo: m.repo.clone(),
            },
            ResourceSpec::Removed(r) => r.entry.clone(),
            _ => return None,
        })
    }

    /// `kind:name`, as the declared resource's address.
    pub fn address(&self) -> String {
        format!("{}:{}", self.kind(), self.name())
    }

    fn kind(&self) -> &'static str {
        match self {
            Entry::File { .. } => "file",
            Entry::Service { .. } => "service",
            Entry::Model { .. } => "model",
            Entry::Container { .. } => "container",
            Entry::PveLines { .. } => "pve_lines",
        }
    }

    fn name(&self) -> String {
        match self {
            Entry::File { path, .. } | Entry::Model { path, .. } => path.clone(),
            Entry::Service { unit } => unit.clone(),
            Entry::Container { vmid, .. } => vmid.to_string(),
            Entry::PveLines { vmid, label, .. } => format!("{vmid} {label}"),
        }
    }

    /// Removal order: what holds a port or GPUs first, then files, then data.
    fn order(&self) -> u8 {
        match self {
            Entry::Service { .. } | Entry::PveLines { .. } => 0,
            Entry::File { .. } => 1,
            Entry::Model { .. } => 2,
            Entry::Container { .. } => 3,
        }
    }
}

/// The record of `specs` (what a target declares), each entry once.
pub fn record_of<'a>(specs: impl IntoIterator<Item = &'a ResourceSpec>) -> Record {
    let mut entries: Vec<Entry> = Vec::new();
    for e in specs.into_iter().filter_map(Entry::of) {
        if !entries.contains(&e) {
            entries.push(e);
        }
    }
    Record {
        version: RECORD_VERSION,
        entries,
    }
}

/// The removals of what `record` holds and `declared` (addresses `kind:name`) no longer
/// does, services first, then files, then models.
pub fn removals(record: &Record, declared: &[String], prune_models: bool) -> Vec<Removal> {
    let mut out: Vec<Removal> = record
        .entries
        .iter()
        .filter(|e| !declared.contains(&e.address()))
        .map(|e| Removal {
            entry: e.clone(),
            prune: prune_models,
            absent: false,
        })
        .collect();
    out.sort_by_key(|r| r.entry.order());
    out
}

/// Something provision made that is no longer declared: a `-` change while it is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removal {
    /// What the record says provision made.
    pub entry: Entry,
    /// Delete a model folder (`--prune-models`), destroy a container (`--allow-destroy`);
    /// without it a model is only named, and a stopped container too.
    #[serde(default)]
    pub prune: bool,
    /// Declared `state: absent` (a model): deleted because the inventory says so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
}

impl Removal {
    /// Whether the entry stays in the record after apply: a model folder kept on purpose.
    pub fn kept(&self, facts: &Facts) -> bool {
        matches!(self.entry, Entry::Model { .. })
            && !self.prune
            && matches!(self.size(facts), Ok(Some(_)))
    }

    /// The bytes deleting this model folder frees, when it is there (`None` for the other
    /// kinds).
    pub fn model_bytes(&self, facts: &Facts) -> Result<Option<u64>, NotRead> {
        match self.entry {
            Entry::Model { .. } => self.size(facts),
            _ => Ok(None),
        }
    }

    fn size(&self, facts: &Facts) -> Result<Option<u64>, NotRead> {
        facts.folder_size(&self.probes()[0]).map(|s| s.copied())
    }

    fn file_state(&self, facts: &Facts) -> Result<FileState, NotRead> {
        let Entry::File { sha256, .. } = &self.entry else {
            return Ok(FileState::Gone);
        };
        Ok(match facts.path(&self.probes()[0])? {
            None => FileState::Gone,
            Some(f) if f.sha256.as_deref() == Some(sha256.as_str()) => FileState::AsWritten,
            Some(_) => FileState::Changed,
        })
    }
}

/// A recorded file as found.
enum FileState {
    Gone,
    AsWritten,
    Changed,
}

/// The `--prune-models` hint for a kept model folder of `bytes`.
pub fn kept_note(path: &str, bytes: u64) -> String {
    format!(
        "model {path} is no longer declared: kept; `--prune-models` deletes {}",
        crate::hub::error::size(bytes)
    )
}

impl Resource for Removal {
    /// A container no longer declared is destroyed through its node's API; so are lines
    /// in its config a role no longer declared had provision write. The rest is the guest's.
    fn target(&self) -> crate::resources::TargetKind {
        match self.entry {
            Entry::Container { .. } | Entry::PveLines { .. } => crate::resources::TargetKind::Container,
            _ => crate::resources::TargetKind::Guest,
        }
    }

    fn kind(&self) -> &'static str {
        self.entry.kind()
    }

    fn name(&self) -> String {
        self.entry.name()
    }

    fn probes(&self) -> Vec<Probe> {
        let mut probes = vec![match &self.entry {
            Entry::File { path, .. } => {
                Probe::Path(crate::resources::file::PathProbe { path: path.clone() })
            }
            Entry::Service { unit } => {
                Probe::Unit(crate::resources::service::UnitProbe { name: unit.clone() })
            }
            Entry::Model { path, .. } => Probe::FolderSize(FolderSizeProbe { path: path.clone() }),
            Entry::Container { vmid, .. } | Entry::PveLines { vmid, .. } => {
                Probe::PveContainer(crate::resources::container::PveContainerProbe { vmid: *vmid })
            }
        }];
        // Which filesystem a folder's deletion frees space on, and whether anything holds
        // it open so that deleting it frees nothing yet (the plan's fit check).
        if let Entry::Model { path, .. } = &self.entry {
            probes.push(Probe::FreeSpace(crate::resources::model::FreeSpaceProbe {
                path: path.clone(),
            }));
            probes.push(Probe::Holders(crate::resources::holders::HoldersProbe {
                path: path.clone(),
            }));
        }
        probes
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let gone = match self.absent {
            true => Delta::new(Action::Delete),
            false => Delta::new(Action::Delete).reason("no longer declared"),
        };
        Ok(match &self.entry {
            Entry::File { sha256, .. } => match self.file_state(facts)? {
                FileState::AsWritten => Some(
                    gone.attr(Attribute::change("sha256", Some(sha256.clone()), None))
                        .reason("provision wrote it (its content is unchanged since): removed"),
                ),
                FileState::Gone | FileState::Changed => None,
            },
            Entry::Service { unit } => {
                let Some(u) = facts.unit(&self.probes()[0])? else {
                    return Ok(None);
                };
                let prop = |k: &str| u.properties.get(k).cloned().unwrap_or_default();
                let active = !matches!(prop("ActiveState").as_str(), "inactive" | "failed" | "");
                let enabled = prop("UnitFileState") == "enabled";
                (active || enabled).then(|| {
                    gone.attr(Attribute::change(
                        "state",
                        Some(format!("{} ({})", prop("ActiveState"), prop("SubState"))),
                        Some("stopped".into()),
                    ))
                    .attr(Attribute::change(
                        "enabled",
                        Some(prop("UnitFileState")),
                        Some("disabled".into()),
                    ))
                    .reason(format!(
                        "{unit} is stopped and disabled before anything declared starts (it may hold a port or GPUs)"
                    ))
                })
            }
            Entry::Model { repo, .. } => match (self.size(facts)?, self.prune) {
                (Some(bytes), true) => Some(
                    gone.attr(Attribute::change(
                        "size",
                        Some(crate::hub::error::size(bytes)),
                        None,
                    ))
                    .reason(match self.absent {
                        true => format!("{repo}: deleted (`state: absent`)"),
                        false => format!("{repo}: deleted (--prune-models)"),
                    }),
                ),
                _ => None,
            },
            Entry::Container { .. } => super::undeclared::diff(self, facts)?,
            Entry::PveLines { .. } => super::pve_lines::removal_diff(self, facts)?,
        })
    }

    fn warnings(&self, facts: &Facts) -> Vec<String> {
        match &self.entry {
            Entry::Model { path, .. } if !self.prune => match self.size(facts) {
                Ok(Some(bytes)) => vec![kept_note(path, bytes)],
                _ => Vec::new(),
            },
            Entry::Container { .. } => super::undeclared::warnings(self, facts),
            Entry::PveLines { .. } => super::pve_lines::removal_warnings(self, facts),
            Entry::File { path, .. } => match self.file_state(facts) {
                Ok(FileState::Changed) => vec![format!(
                    "file {path} is no longer declared but changed since provision wrote it: kept"
                )],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    fn ops(&self, change: &Change, allowed: &Allowed) -> Result<Vec<Op>, StepsError> {
        if let Entry::Container { vmid, .. } = &self.entry {
            // Stopped, then destroyed through the node's API (host bind mounts kept);
            // apply refuses the plan without `--allow-destroy`.
            return Ok(vec![Op::Api(crate::resources::op::ApiOp::Destroy {
                address: change.address.clone(),
                vmid: *vmid,
            })]);
        }
        if let Entry::PveLines { .. } = &self.entry {
            return super::pve_lines::removal_ops(self, change, allowed);
        }
        guest(vec![Step::Remove(self.clone())])
    }
}

// The agent side.

/// Reads the record; `None` when provision has not written one yet.
pub fn read() -> Result<Option<Record>, HostError> {
    let path = record_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HostError::io("read", &path)(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| HostError::Unexpected {
            what: path.display().to_string(),
            detail: format!("not a record provision wrote ({e}); move it away to start anew"),
        })
}

/// Writes the record atomically (read back by [`crate::machine::write_file_atomic`]).
pub fn write(record: &Record) -> Result<(), StepError> {
    let text = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
    crate::machine::write_file_atomic(&record_path(), text.as_bytes(), "root", "root", 0o600)?;
    Ok(())
}

/// Bytes of the files under `path` (not following links); `None` when nothing is there.
pub fn folder_size(path: &Path) -> Result<Option<u64>, HostError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(HostError::io("stat", path)(e)),
        Ok(m) if !m.is_dir() => return Ok(Some(m.len())),
        Ok(_) => {}
    }
    let mut total = 0;
    let entries = std::fs::read_dir(path).map_err(HostError::io("read", path))?;
    for entry in entries {
        let entry = entry.map_err(HostError::io("read", path))?;
        total += folder_size(&entry.path())?.unwrap_or(0);
    }
    Ok(Some(total))
}

/// Carries out a removal on the target.
pub fn remove(r: &Removal) -> Result<(), StepError> {
    match &r.entry {
        Entry::Service { unit } => {
            // `disable --now` stops it and removes its links, so a reboot does not bring
            // it back; a failed unit is forgotten so nothing reports it later.
            crate::machine::output(
                "systemctl",
                &["disable".into(), "--now".into(), unit.clone()],
                &[],
            )?;
            let _ =
                crate::machine::output("systemctl", &["reset-failed".into(), unit.clone()], &[]);
        }
        Entry::File { path, sha256 } => {
            let p = Path::new(path);
            match super::file::path_fact(p)? {
                None => return Ok(()),
                Some(f) if f.sha256.as_deref() != Some(sha256.as_str()) => {
                    return Err(format!(
                        "{path} changed since the plan was made: kept (remove it by hand if it is to go)"
                    )
                    .into());
                }
                Some(_) => {}
            }
            std::fs::remove_file(p).map_err(HostError::io("remove", p))?;
            if let Some(dir) = p.parent() {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(HostError::io("sync", dir))?;
            }
            // A unit file gone: systemd forgets the unit, and its last known good copy goes
            // with it (a later service of the same name must not be "rolled back" onto a
            // unit provision no longer manages). A service only stopped keeps both.
            if path.starts_with("/etc/systemd/") {
                crate::machine::output("systemctl", &["daemon-reload".into()], &[])?;
                if let Some(unit) = p.file_name().and_then(|n| n.to_str()) {
                    let lkg = super::service::deploy::last_known_good(unit);
                    match std::fs::remove_file(&lkg) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(HostError::io("remove", Path::new(&lkg))(e).into());
                        }
                        _ => {}
                    }
                }
            }
        }
        Entry::Model { path, .. } => {
            if !r.prune {
                return Err(
                    format!("{path}: a model folder is deleted only with --prune-models").into(),
                );
            }
            let p = Path::new(path);
            if !p.is_absolute() || p.parent().is_none_or(|d| d == Path::new("/")) {
                return Err(format!("{path}: refusing to delete a top-level folder").into());
            }
            match std::fs::remove_dir_all(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(HostError::io("remove", p)(e).into());
                }
                _ => {}
            }
        }
        Entry::Container { vmid, .. } => {
            return Err(format!("CT {vmid} is destroyed through its node's API").into());
        }
        Entry::PveLines { vmid, .. } => {
            return Err(format!("CT {vmid}'s config lines are removed over its node's SSH").into());
        }
    }
    Ok(())
}

/// Probe: the guest's record of what provision manages on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ManagedProbe {}

impl crate::resources::wire::AgentProbe for ManagedProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Managed(read()?))
    }
}

/// Probe: the bytes of the files under a folder (a model no longer declared).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FolderSizeProbe {
    /// The folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for FolderSizeProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::FolderSize(folder_size(
            std::path::Path::new(&self.path),
        )?))
    }
}

impl crate::resources::wire::AgentStep for Record {
    fn describe(&self) -> String {
        format!(
            "record {} managed thing(s) in the agent's {}",
            self.entries.len(),
            RECORD_FILE
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        write(self)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(5))
    }
}

impl crate::resources::wire::AgentStep for Removal {
    fn describe(&self) -> String {
        match &self.entry {
            Entry::Service { unit } => format!("stop and disable {unit}"),
            Entry::File { path, .. } => format!("remove {path}"),
            Entry::Model { path, .. } => format!("delete model folder {path}"),
            Entry::Container { vmid, .. } => format!("destroy CT {vmid}"),
            Entry::PveLines { vmid, label, .. } => {
                format!("remove CT {vmid}'s {label} lines")
            }
        }
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        remove(self)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(entries: Vec<Entry>) -> Record {
        Record {
            version: RECORD_VERSION,
            entries,
        }
    }

    #[test]
    fn removals_free_ports_before_files_and_keep_what_is_declared() {
        let r = record(vec![
            Entry::Model {
                path: "/m/a".into(),
                repo: "o/a".into(),
            },
            Entry::File {
                path: "/etc/systemd/system/sglang-a.service".into(),
                sha256: "x".into(),
            },
            Entry::Service {
                unit: "sglang-a.service".into(),
            },
            Entry::Service {
                unit: "sglang-b.service".into(),
            },
        ]);
        let gone = removals(&r, &["service:sglang-b.service".into()], false);
        let names: Vec<String> = gone.iter().map(|g| g.entry.address()).collect();
        assert_eq!(
            names,
            [
                "service:sglang-a.service",
                "file:/etc/systemd/system/sglang-a.service",
                "model:/m/a"
            ]
        );
    }

    #[test]
    fn a_model_is_named_and_deleted_only_with_the_flag() {
        let entry = Entry::Model {
            path: "/m/a".into(),
            repo: "o/a".into(),
        };
        let keep = Removal {
            entry: entry.clone(),
            prune: false,
            absent: false,
        };
        let facts = Facts::Read(
            [(
                keep.probes()[0].clone(),
                super::super::wire::Fact::FolderSize(Some(3 << 30)),
            )]
            .into(),
        );
        assert_eq!(keep.diff(&facts).unwrap(), None);
        assert!(keep.kept(&facts));
        assert_eq!(
            keep.warnings(&facts),
            ["model /m/a is no longer declared: kept; `--prune-models` deletes 3.0 GiB"]
        );
        let prune = Removal {
            entry,
            prune: true,
            absent: false,
        };
        let d = prune.diff(&facts).unwrap().unwrap();
        assert_eq!(d.action, Action::Delete);
        assert!(!prune.kept(&facts));
    }
}
