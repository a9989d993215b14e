//! The node's model storage (what containers bind-mount as `/shared`): a ZFS dataset or a
//! plain directory. Made when absent; existing data is never destroyed, reformatted or
//! hidden: an exported pool is imported, never created; a dataset is never created over a
//! folder that holds data; anything else in the way is a conflict with the evidence.

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::file::PathKind;
use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, Typed};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// The attribute that carries a conflict: apply refuses a change that has one.
const CONFLICT: &str = "conflict";

/// The desired storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStorageSpec {
    /// The directory, or the dataset's mountpoint.
    pub path: String,
    /// The dataset, when ZFS.
    pub zfs: Option<ZfsSpec>,
}

/// A ZFS dataset for the storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZfsSpec {
    /// The pool (the dataset's first component).
    pub pool: String,
    /// `POOL/NAME`.
    pub dataset: String,
    /// Properties in the inventory's order.
    pub properties: Vec<(String, String)>,
}

/// What the node has at the storage's path and in ZFS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorageFact {
    /// What is at the path.
    pub kind: Option<PathKind>,
    /// How many entries a directory at the path holds.
    pub entries: u64,
    /// A few of their names (evidence for a conflict).
    pub sample: Vec<String>,
    /// ZFS's view, when a dataset is wanted.
    pub zfs: Option<ZfsFact>,
}

/// ZFS on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZfsFact {
    /// Whether `zfs` and `zpool` run.
    pub tools: bool,
    /// Pools imported now (`zpool list`).
    pub imported: Vec<String>,
    /// Pools `zpool import` finds exported on the node's disks.
    pub importable: Vec<String>,
    /// The dataset, when it exists.
    pub dataset: Option<DatasetFact>,
}

/// An existing dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetFact {
    /// Its `mountpoint` property.
    pub mountpoint: String,
    /// Whether it is mounted.
    pub mounted: bool,
    /// The wanted properties' values as ZFS reports them.
    pub properties: BTreeMap<String, String>,
}

/// The step that brings a dataset into place, checking again on the node before each
/// command (the plan's commands, in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZfsStep {
    /// The wanted dataset.
    pub spec: ZfsSpec,
    /// Its mountpoint.
    pub path: String,
}

impl ModelStorageSpec {
    fn probe(&self) -> Probe {
        Probe::ModelStorage(ModelStorageProbe {
            path: self.path.clone(),
            dataset: self.zfs.as_ref().map(|z| z.dataset.clone()),
            properties: self
                .zfs
                .iter()
                .flat_map(|z| z.properties.iter().map(|(k, _)| k.clone()))
                .collect(),
        })
    }
}

/// Why the storage cannot be brought into place without destroying or hiding data, with
/// the evidence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Conflict(pub String);

impl From<Conflict> for HostError {
    fn from(c: Conflict) -> Self {
        HostError::Unexpected {
            what: "the model storage".into(),
            detail: c.0,
        }
    }
}

/// What apply will run for `spec` given `fact`, or the conflict that stops it.
pub fn zfs_commands(
    spec: &ZfsSpec,
    path: &str,
    fact: Option<&StorageFact>,
) -> Result<Vec<String>, Conflict> {
    let create = || {
        let mut cmd = String::from("zfs create -p");
        for (k, v) in &spec.properties {
            cmd.push_str(&format!(" -o {k}={v}"));
        }
        cmd.push_str(&format!(" -o mountpoint={path} {}", spec.dataset));
        cmd
    };
    let Some(fact) = fact else {
        // The empty world: an imported pool without the dataset.
        return Ok(vec![create()]);
    };
    let zfs = fact
        .zfs
        .as_ref()
        .ok_or_else(|| Conflict("ZFS was not read".into()))?;
    if !zfs.tools {
        return Err(Conflict(format!(
            "`zfs`/`zpool` do not run on the node, so dataset {} cannot be there",
            spec.dataset
        )));
    }
    let mut out = Vec::new();
    match &zfs.dataset {
        Some(ds) => {
            if ds.mountpoint != path {
                return Err(Conflict(format!(
                    "dataset {} exists with mountpoint={} (zfs get mountpoint), not {path}",
                    spec.dataset, ds.mountpoint
                )));
            }
            for (k, v) in &spec.properties {
                if ds.properties.get(k) != Some(v) {
                    out.push(format!("zfs set {k}={v} {}", spec.dataset));
                }
            }
            if !ds.mounted {
                out.push(format!("zfs mount {}", spec.dataset));
            }
        }
        None if zfs.imported.contains(&spec.pool) => {
            if fact.entries > 0 {
                return Err(Conflict(format!(
                    "{path} already holds {} entr{} ({}) and is not dataset {}: a dataset mounted there would hide them",
                    fact.entries,
                    if fact.entries == 1 { "y" } else { "ies" },
                    fact.sample.join(", "),
                    spec.dataset
                )));
            }
            out.push(create());
        }
        None if zfs.importable.contains(&spec.pool) => {
            out.push(format!("zpool import {}", spec.pool));
            out.push(format!(
                "{} (only if {} is absent after the import)",
                create(),
                spec.dataset
            ));
        }
        None => {
            return Err(Conflict(format!(
                "pool {} is neither imported (zpool list: {}) nor importable (zpool import: {}); provision never creates a pool over disks",
                spec.pool,
                list_or_none(&zfs.imported),
                list_or_none(&zfs.importable)
            )));
        }
    }
    Ok(out)
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl Resource for ModelStorageSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Node
    }

    fn kind(&self) -> &'static str {
        "model_storage"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![self.probe()]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let probe = self.probe();
        let fact = facts.model_storage(&probe)?;
        let conflict = |why: String| {
            let mut d = Delta::new(Action::Update)
                .attr(Attribute::change(CONFLICT, None, Some(why.clone())))
                .reason("existing data is never destroyed, reformatted or hidden");
            d.typed = Some(Typed::Conflict { why });
            d
        };
        let Some(zfs) = &self.zfs else {
            return Ok(match fact.and_then(|f| f.kind.as_ref()) {
                None => Some(
                    Delta::new(Action::Create)
                        .attr(Attribute::change("type", None, Some("directory".into())))
                        .reason(format!("mkdir -p {}", self.path)),
                ),
                Some(PathKind::Dir) => None,
                Some(other) => Some(conflict(format!(
                    "{} is a {other:?}, not a directory",
                    self.path
                ))),
            });
        };
        Ok(match zfs_commands(zfs, &self.path, fact) {
            Err(why) => Some(conflict(why.0)),
            Ok(cmds) if cmds.is_empty() => None,
            Ok(cmds) => {
                let exists = fact
                    .and_then(|f| f.zfs.as_ref())
                    .is_some_and(|z| z.dataset.is_some());
                let mut d = Delta::new(if exists {
                    Action::Update
                } else {
                    Action::Create
                })
                .attr(Attribute::change(
                    "dataset",
                    exists.then(|| zfs.dataset.clone()),
                    Some(zfs.dataset.clone()),
                ));
                for c in cmds {
                    d = d.reason(c);
                }
                Some(d)
            }
        })
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        if let Some(Typed::Conflict { why }) = &change.typed {
            return Err(StepsError::Refused(why.clone()));
        }
        guest(vec![match &self.zfs {
            None => Step::Mkdir(crate::resources::directory::MkdirStep {
                path: self.path.clone(),
                owner: "root".into(),
                group: "root".into(),
                mode: 0o755,
            }),
            Some(z) => Step::Zfs(ZfsStep {
                spec: z.clone(),
                path: self.path.clone(),
            }),
        }])
    }
}

/// Reads the storage on the node (agent side).
pub fn read(
    path: &Path,
    dataset: Option<&str>,
    properties: &[String],
) -> Result<Option<StorageFact>, HostError> {
    let kind = super::file::path_fact(path)?.map(|f| f.kind);
    let mut names = Vec::new();
    if kind == Some(PathKind::Dir) {
        for e in std::fs::read_dir(path).map_err(HostError::io("list", path))? {
            let e = e.map_err(HostError::io("list", path))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    let entries = names.len() as u64;
    names.truncate(5);
    let zfs = match dataset {
        None => None,
        Some(ds) => Some(read_zfs(ds, properties)?),
    };
    Ok(Some(StorageFact {
        kind,
        entries,
        sample: names,
        zfs,
    }))
}

/// stdout of a command; `None` when it is not installed or exits non-zero.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn read_zfs(dataset: &str, properties: &[String]) -> Result<ZfsFact, HostError> {
    let Some(list) = output("zpool", &["list", "-H", "-o", "name"]) else {
        return Ok(ZfsFact {
            tools: false,
            imported: Vec::new(),
            importable: Vec::new(),
            dataset: None,
        });
    };
    let imported: Vec<String> = list.lines().map(|l| l.trim().to_string()).collect();
    // `zpool import` without a pool name only lists; it exits 1 when there is none.
    let importable = output("zpool", &["import"])
        .map(|t| parse_zpool_import(&t))
        .unwrap_or_default();
    let mut props = vec!["mountpoint".to_string(), "mounted".to_string()];
    props.extend(properties.iter().cloned());
    let ds = output(
        "zfs",
        &[
            "get",
            "-H",
            "-o",
            "property,value",
            &props.join(","),
            dataset,
        ],
    )
    .map(|t| parse_zfs_get(&t));
    Ok(ZfsFact {
        tools: true,
        imported,
        importable,
        dataset: ds,
    })
}

/// The pool names `zpool import` lists (`   pool: tank`).
pub fn parse_zpool_import(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("pool:"))
        .map(|p| p.trim().to_string())
        .collect()
}

/// A dataset from `zfs get -H -o property,value mountpoint,mounted,...`.
pub fn parse_zfs_get(text: &str) -> DatasetFact {
    let mut properties: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    DatasetFact {
        mountpoint: properties.remove("mountpoint").unwrap_or_default(),
        mounted: properties.remove("mounted").is_some_and(|v| v == "yes"),
        properties,
    }
}

impl ZfsStep {
    /// Runs on the node: reads again, refuses a conflict, then runs the commands one by
    /// one and reads back.
    pub fn run(&self) -> Result<(), HostError> {
        let names: Vec<String> = self
            .spec
            .properties
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        let fact = read(Path::new(&self.path), Some(&self.spec.dataset), &names)?;
        let cmds = zfs_commands(&self.spec, &self.path, fact.as_ref())?;
        for c in cmds {
            let c = c.split(" (only if").next().unwrap_or_default().to_string();
            if c.starts_with("zfs create") {
                // After an import the dataset may be there now: check again.
                let again = read(Path::new(&self.path), Some(&self.spec.dataset), &names)?;
                if again
                    .as_ref()
                    .and_then(|f| f.zfs.as_ref())
                    .is_some_and(|z| z.dataset.is_some())
                {
                    continue;
                }
            }
            let words: Vec<String> = c.split(' ').map(str::to_string).collect();
            crate::machine::run(&words[0], &words[1..], &[])?;
        }
        let after = read(Path::new(&self.path), Some(&self.spec.dataset), &names)?;
        let left = zfs_commands(&self.spec, &self.path, after.as_ref())?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(HostError::Unexpected {
                what: format!("dataset {} after apply", self.spec.dataset),
                detail: format!("still needs: {}", left.join("; ")),
            })
        }
    }
}

/// Probe: the node's model storage: what is at the path, and ZFS's view of the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelStorageProbe {
    /// The directory or mountpoint.
    pub path: String,
    /// The dataset, when ZFS.
    pub dataset: Option<String>,
    /// The properties to read.
    pub properties: Vec<String>,
}

impl crate::resources::wire::AgentProbe for ModelStorageProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::ModelStorage(read(
            std::path::Path::new(&self.path),
            self.dataset.as_deref(),
            &self.properties,
        )?))
    }
}

impl crate::resources::wire::AgentStep for ZfsStep {
    fn describe(&self) -> String {
        format!("zfs dataset {} at {}", self.spec.dataset, self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        ZfsStep::run(self)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ZfsSpec {
        ZfsSpec {
            pool: "tank".into(),
            dataset: "tank/shared".into(),
            properties: vec![
                ("recordsize".into(), "1M".into()),
                ("compression".into(), "off".into()),
            ],
        }
    }

    fn fact(imported: &[&str], importable: &str, ds: Option<&str>, entries: u64) -> StorageFact {
        StorageFact {
            kind: Some(PathKind::Dir),
            entries,
            sample: (0..entries.min(5)).map(|i| format!("f{i}")).collect(),
            zfs: Some(ZfsFact {
                tools: true,
                imported: imported.iter().map(|s| s.to_string()).collect(),
                importable: parse_zpool_import(importable),
                dataset: ds.map(parse_zfs_get),
            }),
        }
    }

    const IMPORT: &str = include_str!("../../tests/fixtures/zfs/zpool-import-tank.txt");
    const GET_OK: &str = include_str!("../../tests/fixtures/zfs/zfs-get-tank-shared.txt");
    const GET_DRIFT: &str = include_str!("../../tests/fixtures/zfs/zfs-get-tank-shared-drift.txt");

    #[test]
    fn absent_dataset_on_an_imported_pool_is_created_with_its_properties() {
        let f = fact(&["rpool", "tank"], "", None, 0);
        assert_eq!(
            zfs_commands(&spec(), "/tank/shared", Some(&f)).unwrap(),
            [
                "zfs create -p -o recordsize=1M -o compression=off -o mountpoint=/tank/shared tank/shared"
            ]
        );
    }

    #[test]
    fn an_exported_pool_is_imported_never_created() {
        let f = fact(&["rpool"], IMPORT, None, 0);
        let cmds = zfs_commands(&spec(), "/tank/shared", Some(&f)).unwrap();
        assert_eq!(cmds[0], "zpool import tank");
        assert!(cmds.iter().all(|c| !c.contains("zpool create")));
        let f = fact(&["rpool"], "", None, 0);
        let err = zfs_commands(&spec(), "/tank/shared", Some(&f)).unwrap_err();
        assert!(err.0.contains("never creates a pool"), "{err}");
    }

    #[test]
    fn a_dataset_is_never_made_over_data() {
        let f = fact(&["tank"], "", None, 3);
        let err = zfs_commands(&spec(), "/tank/shared", Some(&f)).unwrap_err();
        assert!(err.0.contains("holds 3 entries (f0, f1, f2)"), "{err}");
    }

    #[test]
    fn an_existing_dataset_is_kept_and_only_its_properties_set() {
        let f = fact(&["tank"], "", Some(GET_OK), 7);
        assert!(
            zfs_commands(&spec(), "/tank/shared", Some(&f))
                .unwrap()
                .is_empty()
        );
        let f = fact(&["tank"], "", Some(GET_DRIFT), 7);
        assert_eq!(
            zfs_commands(&spec(), "/tank/shared", Some(&f)).unwrap(),
            [
                "zfs set compression=off tank/shared",
                "zfs mount tank/shared"
            ]
        );
        let err = zfs_commands(&spec(), "/srv/models", Some(&f)).unwrap_err();
        assert!(err.0.contains("mountpoint=/tank/shared"), "{err}");
    }
}
