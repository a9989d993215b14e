//! What resources read: [`Probe`]s (read-only questions, batched per target) and the
//! [`Fact`]s that answer them. A probe that was not answered is an error, never "absent":
//! a timeout or a 401 must not plan a create.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// A read-only question about a target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "probe", rename_all = "snake_case")]
pub enum Probe {
    /// A path: type, owner, mode, and for files size, sha256 and (small text) content.
    Path {
        /// Absolute path.
        path: String,
    },
    /// Installed versions of Debian packages.
    Packages {
        /// Package names.
        names: Vec<String>,
    },
    /// A Python venv: its Python release and installed distributions.
    Venv {
        /// The venv's folder.
        path: String,
    },
    /// A git checkout: HEAD commit, origin URL, local changes.
    Git {
        /// The checkout's folder.
        path: String,
    },
    /// A CUDA toolkit: its release from `version.json` and `nvcc --version`.
    Cuda {
        /// The toolkit's home.
        home: String,
    },
    /// A systemd unit's state.
    Unit {
        /// Unit name.
        name: String,
    },
    /// Whether a server answers its readiness URL and lists its model there.
    Readiness {
        /// URL that must list the model (`http://127.0.0.1:30000/v1/models`).
        url: String,
        /// The model name it must list.
        served_model_name: String,
    },
    /// A model folder's verification record.
    Model {
        /// The model's folder.
        path: String,
    },
    /// A container's Proxmox configuration (through the node's API).
    PveContainer {
        /// vmid.
        vmid: u64,
    },
}

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

/// A venv as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VenvFact {
    /// `MAJOR.MINOR` of its Python.
    pub python: String,
    /// Installed distributions: normalised name to version.
    pub packages: BTreeMap<String, String>,
    /// Editable installs: normalised name to the source folder.
    pub editable: BTreeMap<String, String>,
}

/// A git checkout as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitFact {
    /// HEAD's commit.
    pub head: String,
    /// `origin`'s URL.
    pub origin: Option<String>,
    /// Whether tracked files differ from HEAD.
    pub dirty: bool,
}

/// A CUDA toolkit as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaFact {
    /// Release from `nvcc --version` (`13.0`), if nvcc runs.
    pub nvcc_release: Option<String>,
    /// Version from `version.json` (`13.0.88`), if present.
    pub version_json: Option<String>,
}

/// A systemd unit's state (a subset of `systemctl show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFact {
    /// Properties by name.
    pub properties: BTreeMap<String, String>,
    /// Its main process as it runs, when there is one.
    #[serde(default)]
    pub process: Option<crate::health::process::ProcessFact>,
}

/// A model folder's verification record, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFact {
    /// Repository recorded.
    pub repo: String,
    /// Commit recorded.
    pub commit: String,
    /// Whether every recorded file still matches its size, mtime and inode.
    pub intact: bool,
    /// Files that no longer match.
    pub changed: Vec<String>,
}

/// A container as its node reports it: current and pending configuration, power state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PveContainerFact {
    /// The current configuration's `key: value` lines, raw `lxc.*` lines last in file order
    /// (they may repeat).
    pub config: Vec<(String, String)>,
    /// Values waiting in `[pve:pending]` for a restart.
    pub pending: BTreeMap<String, String>,
    /// Options waiting to be deleted at the next restart.
    pub pending_delete: Vec<String>,
    /// The config's digest, for guarded writes.
    pub digest: String,
    /// Whether it runs.
    pub running: bool,
}

impl PveContainerFact {
    /// The current value of an option.
    pub fn current(&self, key: &str) -> Option<&str> {
        self.config
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Reads a config file as Proxmox keeps it (`lxc/<vmid>.conf`).
    pub fn from_config(conf: &pve::config::CtConfig, running: bool) -> Self {
        let mut config: Vec<(String, String)> = conf
            .main
            .props
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        config.extend(conf.main.lxc.iter().cloned());
        let mut pending = conf.pending.props.clone();
        pending.remove("delete");
        PveContainerFact {
            config,
            pending,
            pending_delete: conf.pending_delete(),
            digest: conf.digest.clone(),
            running,
        }
    }
}

/// An answer to a [`Probe`]; `None` inside means "looked, and it is not there".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fact", content = "value", rename_all = "snake_case")]
pub enum Fact {
    /// Answer to [`Probe::Path`].
    Path(Option<PathFact>),
    /// Answer to [`Probe::Packages`]: each name to its installed version, if installed.
    Packages(BTreeMap<String, Option<String>>),
    /// Answer to [`Probe::Venv`].
    Venv(Option<VenvFact>),
    /// Answer to [`Probe::Git`].
    Git(Option<GitFact>),
    /// Answer to [`Probe::Cuda`].
    Cuda(Option<CudaFact>),
    /// Answer to [`Probe::Unit`] (`None`: the unit is not known to systemd).
    Unit(Option<UnitFact>),
    /// Answer to [`Probe::Model`].
    Model(Option<ModelFact>),
    /// Answer to [`Probe::Readiness`] (always `Some` when read).
    Readiness(Option<crate::health::process::ReadinessFact>),
    /// Answer to [`Probe::PveContainer`].
    PveContainer(Option<PveContainerFact>),
}

/// A probe that has no answer: the read failed or was never made.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no answer was read for {0:?}")]
pub struct NotRead(pub Probe);

/// The answers for one target.
#[derive(Debug, Clone)]
pub enum Facts {
    /// The empty world of `plan --offline`: every probe is answered "not there".
    Empty,
    /// Answers read from the target.
    Read(HashMap<Probe, Fact>),
}

macro_rules! accessor {
    ($(#[$doc:meta])* $fn:ident, $variant:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $fn(&self, probe: &Probe) -> Result<Option<&$ty>, NotRead> {
            match self {
                Facts::Empty => Ok(None),
                Facts::Read(map) => match map.get(probe) {
                    Some(Fact::$variant(v)) => Ok(v.as_ref()),
                    _ => Err(NotRead(probe.clone())),
                },
            }
        }
    };
}

impl Facts {
    accessor!(
        /// What is at a path.
        path, Path, PathFact
    );
    accessor!(
        /// A venv.
        venv, Venv, VenvFact
    );
    accessor!(
        /// A git checkout.
        git, Git, GitFact
    );
    accessor!(
        /// A CUDA toolkit.
        cuda, Cuda, CudaFact
    );
    accessor!(
        /// A systemd unit.
        unit, Unit, UnitFact
    );
    accessor!(
        /// A model's record.
        model, Model, ModelFact
    );
    accessor!(
        /// A server's answer at its readiness URL.
        readiness, Readiness, crate::health::process::ReadinessFact
    );
    accessor!(
        /// A container's Proxmox config.
        pve_container, PveContainer, PveContainerFact
    );

    /// Installed versions of packages (empty world: none installed).
    pub fn packages(&self, probe: &Probe) -> Result<BTreeMap<String, Option<String>>, NotRead> {
        match self {
            Facts::Empty => Ok(BTreeMap::new()),
            Facts::Read(map) => match map.get(probe) {
                Some(Fact::Packages(v)) => Ok(v.clone()),
                _ => Err(NotRead(probe.clone())),
            },
        }
    }
}
