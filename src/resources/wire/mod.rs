//! The vocabulary that travels between the workstation and the agent: [`Probe`]s (read-only
//! questions, batched per target), the [`Fact`]s that answer them, the [`Step`]s an apply
//! runs, and the [`Request`]/[`Event`] envelope (`envelope.rs`). This is the one list of
//! kinds' wire types; each variant's payload, and the agent-side code that answers or runs
//! it, lives in its kind's file. A probe that was not answered is an error, never "absent":
//! a timeout or a 401 must not plan a create.

mod envelope;

pub use envelope::{Answer, Event, Holder, PROTOCOL_VERSION, Request};

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::apt;
use super::apt_source;
use super::container::PveContainerFact;
use super::cuda::{self, CudaFact};
use super::directory;
use super::file::{self, PathFact};
use super::git_checkout::{self, GitFact};
use super::gpu_userspace::{self, UserspaceFact};
use super::model::{self, ModelFact, ModelPull};
use super::model_storage::{self, StorageFact};
use super::nvidia_host::{self, NvidiaHostFact};
use super::pip_packages::{self, PipIndex};
use super::service::{self, UnitFact};
use super::template::TemplateFact;
use super::venv::{self, VenvFact};

/// A read-only question about a target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "probe", rename_all = "snake_case")]
pub enum Probe {
    /// A path: type, owner, mode, and for files size, sha256 and (small text) content.
    Path {
        /// Absolute path.
        path: String,
    },
    /// A path's type, owner, mode and size, without reading it (a content-addressed tool).
    Stat {
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
    /// The node's containers whose marker says provision created them at their vmid
    /// (through the node's API): those no container of the inventory is are named.
    PveCreated {},
    /// A container template in the node's storage (through the node's API).
    PveTemplate {
        /// `STORAGE:vztmpl/FILE`.
        volume: String,
    },
    /// The node's model storage: what is at the path, and ZFS's view of the dataset.
    ModelStorage {
        /// The directory or mountpoint.
        path: String,
        /// The dataset, when ZFS.
        dataset: Option<String>,
        /// The properties to read.
        properties: Vec<String>,
    },
    /// The NVIDIA userspace driver in a container: the versions its libraries resolve to.
    GpuUserspace {},
    /// The node's NVIDIA side under its root.
    NvidiaHost {
        /// The node's root prefix (empty on real nodes).
        root: String,
    },
    /// The fingerprints of the keys in an APT keyring.
    AptKey {
        /// The keyring file.
        path: String,
    },
    /// The guest's record of what provision manages on it.
    Managed {},
    /// The bytes of the files under a folder (a model no longer declared).
    FolderSize {
        /// The folder.
        path: String,
    },
    /// What an ml-env's stable paths are (symlinks to a generation, real folders) and the
    /// generations record's word on them.
    Generation {
        /// The stable paths.
        stables: Vec<String>,
    },
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
    /// Answer to [`Probe::PveCreated`]: vmid to its config (always `Some` when read).
    PveCreated(Option<BTreeMap<u64, PveContainerFact>>),
    /// Answer to [`Probe::PveTemplate`].
    PveTemplate(Option<TemplateFact>),
    /// Answer to [`Probe::ModelStorage`].
    ModelStorage(Option<StorageFact>),
    /// Answer to [`Probe::NvidiaHost`].
    NvidiaHost(Option<NvidiaHostFact>),
    /// Answer to [`Probe::GpuUserspace`] (always `Some` when read).
    GpuUserspace(Option<UserspaceFact>),
    /// Answer to [`Probe::AptKey`] (empty: a file holding no readable key).
    AptKey(Option<Vec<String>>),
    /// Answer to [`Probe::Managed`] (`None`: no record written yet).
    Managed(Option<super::managed::Record>),
    /// Answer to [`Probe::FolderSize`].
    FolderSize(Option<u64>),
    /// Answer to [`Probe::Generation`] (always `Some` when read).
    Generation(Option<super::generation::GenerationFact>),
}

/// A probe that has no answer: the read failed or was never made.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no answer was read for {0:?}")]
pub struct NotRead(pub Probe);

impl Facts {
    /// sha256 of the answers to `probes`, in that order, leaving out what changes without
    /// anyone changing the target (a running unit's PIDs and restart counter). Two reads
    /// with the same digest would plan the same changes.
    pub fn digest(&self, probes: &[Probe]) -> Result<String, NotRead> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for probe in probes {
            let fact = match self {
                Facts::Empty => None,
                Facts::Read(map) => Some(map.get(probe).ok_or_else(|| NotRead(probe.clone()))?),
            };
            let fact = fact.map(|f| match f {
                Fact::Unit(Some(u)) => Fact::Unit(Some(u.stable())),
                other => other.clone(),
            });
            let line = serde_json::to_string(&(probe, fact)).unwrap_or_default();
            hasher.update(line.as_bytes());
            hasher.update(b"\n");
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

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
    accessor!(
        /// The node's containers provision created.
        pve_created, PveCreated, BTreeMap<u64, PveContainerFact>
    );
    accessor!(
        /// A template in the node's storage.
        pve_template, PveTemplate, TemplateFact
    );
    accessor!(
        /// The node's model storage.
        model_storage, ModelStorage, StorageFact
    );
    accessor!(
        /// The node's NVIDIA side.
        nvidia_host, NvidiaHost, NvidiaHostFact
    );
    accessor!(
        /// A container's NVIDIA userspace.
        gpu_userspace, GpuUserspace, UserspaceFact
    );
    accessor!(
        /// An APT keyring's key fingerprints.
        apt_key, AptKey, Vec<String>
    );
    accessor!(
        /// The guest's record of what provision manages.
        managed, Managed, super::managed::Record
    );
    accessor!(
        /// The bytes under a folder.
        folder_size, FolderSize, u64
    );
    accessor!(
        /// An ml-env's stable paths and their generation.
        generation, Generation, super::generation::GenerationFact
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

/// Answers one probe. Errors reading what exists are reported in the fact's absence only
/// when the thing is truly absent; anything else is an `Err`.
pub fn answer(probe: &Probe, verify_full: bool) -> Result<Fact, AnswerError> {
    Ok(match probe {
        Probe::Path { path } => Fact::Path(file::path_fact(Path::new(path))?),
        Probe::Stat { path } => Fact::Path(file::stat_fact(Path::new(path))?),
        Probe::Packages { names } => Fact::Packages(apt::packages(names)?),
        Probe::Venv { path } => Fact::Venv(venv::read(Path::new(path))?),
        Probe::Git { path } => Fact::Git(git_checkout::read(Path::new(path))?),
        Probe::Cuda { home } => Fact::Cuda(cuda::read(Path::new(home))),
        Probe::Unit { name } => Fact::Unit(service::read_unit(name)?),
        Probe::Readiness {
            url,
            served_model_name,
        } => Fact::Readiness(Some(crate::health::process::readiness(
            url,
            served_model_name,
        ))),
        Probe::Model { path } => Fact::Model(model::read(Path::new(path), verify_full)?),
        Probe::ModelStorage {
            path,
            dataset,
            properties,
        } => Fact::ModelStorage(model_storage::read(
            Path::new(path),
            dataset.as_deref(),
            properties,
        )?),
        Probe::NvidiaHost { root } => Fact::NvidiaHost(nvidia_host::read(root)?),
        Probe::GpuUserspace {} => Fact::GpuUserspace(gpu_userspace::read()),
        Probe::AptKey { path } => Fact::AptKey(apt_source::read_keyring(Path::new(path))?),
        Probe::Managed {} => Fact::Managed(super::managed::read()?),
        Probe::FolderSize { path } => {
            Fact::FolderSize(super::managed::folder_size(Path::new(path))?)
        }
        Probe::Generation { stables } => Fact::Generation(Some(super::generation::read(stables)?)),
        Probe::PveContainer { .. } | Probe::PveTemplate { .. } | Probe::PveCreated {} => {
            return Err(AnswerError::NotAnAgentProbe);
        }
    })
}

/// Why the agent could not answer a probe.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// Reading the machine failed.
    #[error(transparent)]
    Host(#[from] crate::machine::HostError),
    /// Reading a model folder failed.
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
    /// A probe only a node's API answers.
    #[error(
        "Proxmox's own state (a container's config, the templates in storage) is read through the node's API, not the agent"
    )]
    NotAnAgentProbe,
}

/// Why a step failed on the target, and what to do about it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct StepError {
    /// What went wrong.
    pub message: String,
    /// What to do about it.
    pub hints: Vec<String>,
}

impl From<String> for StepError {
    fn from(message: String) -> Self {
        StepError {
            message,
            hints: Vec::new(),
        }
    }
}

impl From<crate::machine::HostError> for StepError {
    fn from(e: crate::machine::HostError) -> Self {
        e.to_string().into()
    }
}

impl From<crate::resources::service::deploy::DeployError> for StepError {
    fn from(e: crate::resources::service::deploy::DeployError) -> Self {
        e.to_string().into()
    }
}

impl From<crate::resources::service::preflight::PreflightError> for StepError {
    fn from(e: crate::resources::service::preflight::PreflightError) -> Self {
        e.to_string().into()
    }
}

/// One change to make on the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Write a file atomically and verify it by reading it back.
    WriteFile {
        /// Absolute path.
        path: String,
        /// Content.
        content: String,
        /// Owner name.
        owner: String,
        /// Group name.
        group: String,
        /// Permission bits.
        mode: u32,
    },
    /// Make a directory (and its parents) with owner and mode.
    Mkdir {
        /// Absolute path.
        path: String,
        /// Owner name.
        owner: String,
        /// Group name.
        group: String,
        /// Permission bits.
        mode: u32,
    },
    /// Write an APT repository's signing key, refused unless it has the pinned fingerprint.
    AptKey {
        /// The source's name, for messages.
        source: String,
        /// The keyring file.
        path: String,
        /// Where the target fetches the key.
        url: Option<String>,
        /// Or the key itself (base64), read on the workstation.
        key: Option<String>,
        /// The pinned fingerprint.
        fingerprint: String,
    },
    /// Install Debian packages in one non-interactive transaction.
    AptInstall {
        /// `name` or `name=version`.
        packages: Vec<String>,
    },
    /// Make a venv (removing a wrong one first when `replace`).
    CreateVenv {
        /// The venv's folder.
        path: String,
        /// `MAJOR.MINOR`.
        python: String,
        /// Remove what is there first.
        replace: bool,
        /// uv's path on the target, when uv makes it (else `python -m venv`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uv: Option<String>,
    },
    /// `pip install` into a venv.
    PipInstall {
        /// The venv's folder.
        venv: String,
        /// Requirements (`name==version`) or, with `editable`, the one source folder.
        requirements: Vec<String>,
        /// Install the (single) requirement as an editable source folder.
        editable: bool,
        /// Where pip looks for packages.
        #[serde(flatten)]
        index: PipIndex,
        /// uv's path on the target, when uv installs (else the venv's pip).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uv: Option<String>,
    },
    /// Put a binary pushed from the workstation in place (uv), checked by sha256.
    InstallTool(Box<super::uv::Tool>),
    /// Download a model next to its storage, every file verified.
    ModelPull(Box<ModelPull>),
    /// Check a service's new argv before anything of it is written or restarted.
    Preflight(Box<super::service::ServiceSpec>),
    /// Deploy a service: load, prove loaded, enable, (re)start, health gate, keep or roll
    /// back.
    DeployService(Box<crate::resources::service::deploy::Deploy>),
    /// Bring the node's ZFS dataset for the model storage into place (import, create,
    /// set properties, mount), never destroying or hiding data.
    Zfs(model_storage::ZfsStep),
    /// Write (when `content`) and enable a systemd unit under the node's root; start it on
    /// a real node.
    NodeUnit {
        /// The node's root prefix (empty on real nodes).
        root: String,
        /// The unit.
        unit: String,
        /// Its file's content, when provision owns the file.
        content: Option<String>,
    },
    /// Run the NVIDIA driver installer (only with `apply --install-driver`).
    InstallDriver {
        /// The node's root prefix (empty on real nodes).
        root: String,
        /// The `.run` file.
        path: String,
        /// Its sha256.
        sha256: String,
        /// The version it installs.
        version: String,
    },
    /// Import the stack's modules in a venv (and compile a C helper); record it.
    ImportCheck(super::import_check::ImportCheckSpec),
    /// On the node: have NVIDIA's `.run` in the node's cache with its sha256 (downloaded
    /// unless a verified copy is there), to be pushed into a container.
    FetchInstaller {
        /// Where it is downloaded from.
        url: String,
        /// Its sha256.
        sha256: String,
    },
    /// In the container: check the `.run` the node pushed against its sha256 again and run
    /// it without the kernel module.
    InstallUserspace {
        /// Where the node downloaded it from (names the pushed file).
        url: String,
        /// Its sha256.
        sha256: String,
        /// The version it must leave installed.
        version: String,
    },
    /// Check out a commit of a repository (cloning first if needed), discarding local
    /// changes.
    GitCheckout {
        /// Repository URL.
        repo: String,
        /// Commit.
        revision: String,
        /// The checkout's folder.
        path: String,
    },
    /// Write the guest's record of what provision manages, atomically.
    Record(super::managed::Record),
    /// Remove something provision made that is no longer declared.
    Remove(super::managed::Removal),
    /// Point an ml-env's stable paths at a built generation (one rename each), adopting a
    /// real folder found there; record it and prune old generations.
    SwitchGeneration {
        /// Stable path -> the generation's folder.
        links: BTreeMap<String, String>,
        /// The unit files of the services on it, written as part of the switch (pinned to
        /// the generation's folders while the links move), not before it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        units: Vec<crate::generations::UnitFile>,
    },
    /// `provision rollback`: the services of an ml-env back on the previous generation
    /// that passed its gate, gated again.
    RollbackGeneration {
        /// The services, as the inventory declares them (their health gates).
        services: Vec<super::service::ServiceSpec>,
    },
}

impl Step {
    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Step::WriteFile { path, .. } => format!("write {path}"),
            Step::Mkdir { path, .. } => format!("mkdir {path}"),
            Step::AptInstall { packages } => format!("apt-get install {}", packages.join(" ")),
            Step::AptKey {
                path, fingerprint, ..
            } => format!("write key {fingerprint} to {path}"),
            Step::CreateVenv {
                path, python, uv, ..
            } => match uv {
                Some(_) => format!("uv venv --python python{python} {path}"),
                None => format!("python{python} -m venv {path}"),
            },
            Step::PipInstall {
                venv,
                requirements,
                editable,
                uv,
                ..
            } => format!(
                "{}pip install{} {} into {venv}",
                if uv.is_some() { "uv " } else { "" },
                if *editable { " -e" } else { "" },
                requirements.join(" ")
            ),
            Step::GitCheckout { path, revision, .. } => {
                format!("git checkout {revision} in {path}")
            }
            Step::InstallTool(t) => format!("push {} (sha256 {})", t.path, t.sha256),
            Step::Preflight(s) => format!("preflight {}", s.unit),
            Step::ModelPull(m) if m.before_weights => format!(
                "download {}@{}'s small files (all but the weights) into {}, for the preflight",
                m.repo, m.revision, m.dest
            ),
            Step::ModelPull(m) => format!("download {}@{} into {}", m.repo, m.revision, m.dest),
            Step::Zfs(z) => format!("zfs dataset {} at {}", z.spec.dataset, z.path),
            Step::NodeUnit { unit, .. } => format!("enable {unit} on the node"),
            Step::InstallDriver { version, path, .. } => {
                format!("install NVIDIA driver {version} ({path})")
            }
            Step::ImportCheck(c) => format!(
                "import {} in {}{}",
                c.modules.join(", "),
                c.venv,
                if c.compile {
                    " and compile a C helper against Python.h"
                } else {
                    ""
                }
            ),
            Step::FetchInstaller { url, .. } => {
                format!("fetch {url} into the node's cache (sha256 checked)")
            }
            Step::Record(r) => format!(
                "record {} managed thing(s) in the agent's {}",
                r.entries.len(),
                super::managed::RECORD_FILE
            ),
            Step::Remove(r) => match &r.entry {
                super::managed::Entry::Service { unit } => format!("stop and disable {unit}"),
                super::managed::Entry::File { path, .. } => format!("remove {path}"),
                super::managed::Entry::Model { path, .. } => format!("delete model folder {path}"),
                super::managed::Entry::Container { vmid, .. } => format!("destroy CT {vmid}"),
                super::managed::Entry::PveLines { vmid, label, .. } => {
                    format!("remove CT {vmid}'s {label} lines")
                }
            },
            Step::SwitchGeneration { links, .. } => format!(
                "switch {} to generation {}",
                links.keys().cloned().collect::<Vec<_>>().join(", "),
                links
                    .values()
                    .map(|d| crate::generations::short(d))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Step::RollbackGeneration { services } => format!(
                "roll {} back to the previous generation and wait until ready",
                services
                    .iter()
                    .map(|s| s.unit.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::InstallUserspace { version, url, .. } => format!(
                "install NVIDIA userspace {version} without the kernel module ({} pushed by the node)",
                gpu_userspace::file_name(url)
            ),
            Step::DeployService(d) => format!(
                "deploy {}{}",
                d.service.unit,
                match (d.restart, d.wait_first, d.service.readiness.is_some()) {
                    (true, true, true) =>
                        " and wait until it is ready (restarted only if it does not get there)",
                    (true, false, true) => " and wait until it is ready",
                    _ => "",
                }
            ),
        }
    }

    /// Runs the step; some steps report details (a service's verdict).
    pub fn run(&self) -> Result<Option<serde_json::Value>, StepError> {
        let done = match self {
            Step::DeployService(d) => {
                return Ok(
                    serde_json::to_value(crate::resources::service::deploy::deploy(d)?).ok(),
                );
            }
            Step::RollbackGeneration { services } => {
                return Ok(
                    serde_json::to_value(crate::resources::service::deploy::rollback(services)?)
                        .ok(),
                );
            }
            Step::Preflight(s) => {
                return Ok(
                    serde_json::to_value(crate::resources::service::preflight::preflight(s)?).ok(),
                );
            }
            Step::ModelPull(m) => return m.run().map(|r| serde_json::to_value(r).ok()),
            Step::ImportCheck(c) => return super::import_check::run(c).map(|()| None),
            Step::Record(r) => return super::managed::write(r).map(|()| None),
            Step::Remove(r) => return super::managed::remove(r).map(|()| None),
            Step::WriteFile {
                path,
                content,
                owner,
                group,
                mode,
            } => crate::machine::write_file_atomic(
                Path::new(path),
                content.as_bytes(),
                owner,
                group,
                *mode,
            ),
            Step::Mkdir {
                path,
                owner,
                group,
                mode,
            } => directory::mkdir(Path::new(path), owner, group, *mode),
            Step::AptInstall { packages } => apt::install(packages),
            Step::AptKey {
                source,
                path,
                url,
                key,
                fingerprint,
            } => apt_source::install_key(source, path, url.as_deref(), key.as_deref(), fingerprint),
            Step::Zfs(z) => z.run(),
            Step::NodeUnit {
                root,
                unit,
                content,
            } => nvidia_host::setup_unit(root, unit, content.as_deref()),
            Step::InstallDriver {
                root,
                path,
                sha256,
                version,
            } => nvidia_host::install_driver(root, path, sha256, version),
            Step::InstallUserspace {
                url,
                sha256,
                version,
            } => gpu_userspace::install(url, sha256, version),
            Step::FetchInstaller { url, sha256 } => gpu_userspace::fetch(url, sha256).map(|_| ()),
            Step::CreateVenv {
                path,
                python,
                replace,
                uv,
            } => venv::create(path, python, *replace, uv.as_deref()),
            Step::PipInstall {
                venv,
                requirements,
                editable,
                index,
                uv,
            } => pip_packages::install(venv, requirements, *editable, index, uv.as_deref()),
            Step::InstallTool(t) => t.install(),
            Step::GitCheckout {
                repo,
                revision,
                path,
            } => git_checkout::checkout(repo, revision, path),
            Step::SwitchGeneration { links, units } => super::generation::switch(links, units),
        };
        done.map(|()| None).map_err(StepError::from)
    }
}
