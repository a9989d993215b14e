//! The vocabulary that travels between the workstation and the agent: [`Probe`]s (read-only
//! questions, batched per target), the [`Fact`]s that answer them, the [`Step`]s an apply
//! runs, and the [`Request`]/[`Event`] envelope (`envelope.rs`). Each kind declares its wire
//! types in its own file (a struct per probe and step, [`AgentProbe`] and [`AgentStep`]:
//! how the agent answers or runs it, its description, its limit); `wire!`'s one
//! invocation below lists them, and makes the enums, their dispatch and the accessors. A
//! probe that was not answered is an error, never "absent": a timeout or a 401 must not
//! plan a create.

mod envelope;

pub use envelope::{Answer, Event, Holder, PROTOCOL_VERSION, Request};

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::container::PveContainerFact;
use super::cuda::CudaFact;
use super::file::PathFact;
use super::git_checkout::GitFact;
use super::gpu_userspace::UserspaceFact;
use super::model::ModelFact;
use super::model_storage::StorageFact;
use super::nvidia_host::NvidiaHostFact;
use super::service::UnitFact;
use super::template::TemplateFact;
use super::venv::VenvFact;
// Every kind's module (the list below names their probes, facts and steps by module): a
// new kind adds no line here.
use super::*;

/// A kind's probe: how the agent answers it. A probe the node's API answers keeps the
/// default, which refuses it on the agent.
pub trait AgentProbe {
    /// Answers the probe on the target (`verify_full`: re-hash model files).
    fn answer(&self, verify_full: bool) -> Result<Fact, AnswerError> {
        let _ = verify_full;
        Err(AnswerError::NotAnAgentProbe)
    }
}

/// A kind's step: what the agent runs, how it is shown, how long it may take.
pub trait AgentStep {
    /// A short description for progress lines.
    fn describe(&self) -> String;
    /// Runs the step; some steps report details (a service's verdict).
    fn run(&self) -> Result<Option<serde_json::Value>, StepError>;
    /// How long it may take: a default generous enough for the slowest honest case
    /// (SGLang's build, torch's wheels), or from the inventory where it says (a service's
    /// health gate). The client stops it past that (`agent/attach.rs`).
    fn limit(&self) -> Limit;
}

impl<T: AgentStep> AgentStep for Box<T> {
    fn describe(&self) -> String {
        (**self).describe()
    }

    fn run(&self) -> Result<Option<serde_json::Value>, StepError> {
        (**self).run()
    }

    fn limit(&self) -> Limit {
        (**self).limit()
    }
}

/// How long a step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// At most this long in all.
    Total(Duration),
    /// No limit in all, but at most this long without progress: a new byte, or a file
    /// already there checked. Retries and other lines are not progress.
    Stall(Duration),
    /// No limit in all, but at most this long without any progress event of the step
    /// (the health gate reports at least every [`crate::health::watch::HEARTBEAT`] and ends
    /// itself on a hang; this catches a gate that stopped reporting).
    Quiet(Duration),
}

impl Limit {
    /// The time it names, whatever it bounds.
    pub fn duration(&self) -> Duration {
        match *self {
            Limit::Total(d) | Limit::Stall(d) | Limit::Quiet(d) => d,
        }
    }
}

/// `m` minutes.
pub const fn minutes(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// Makes the wire's enums from the kinds' types: [`Probe`] (a variant per probe type, its
/// [`AgentProbe`] answering it), [`Fact`] (a variant per answer, and its accessor on
/// [`Facts`]) and [`Step`] (a variant per step type, [`AgentStep`] describing, running and
/// limiting it). The serde names are the variants' snake_case, as before the registry: the
/// agent protocol is unchanged.
macro_rules! wire {
    (
        probes { $( $(#[$pdoc:meta])* $pv:ident($pt:ty), )* }
        facts { $( $(#[$fdoc:meta])* $fv:ident($ft:ty) => $acc:ident, )* }
        steps { $( $(#[$sdoc:meta])* $sv:ident($st:ty), )* }
    ) => {
        /// A read-only question about a target.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(tag = "probe", rename_all = "snake_case")]
        pub enum Probe {
            $( $(#[$pdoc])* $pv($pt), )*
        }

        /// An answer to a [`Probe`]; `None` inside means "looked, and it is not there".
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "fact", content = "value", rename_all = "snake_case")]
        pub enum Fact {
            $( $(#[$fdoc])* $fv(Option<$ft>), )*
        }

        /// One change to make on the target.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "step", rename_all = "snake_case")]
        pub enum Step {
            $( $(#[$sdoc])* $sv($st), )*
        }

        /// Answers one probe. Errors reading what exists are reported in the fact's
        /// absence only when the thing is truly absent; anything else is an `Err`.
        pub fn answer(probe: &Probe, verify_full: bool) -> Result<Fact, AnswerError> {
            match probe {
                $( Probe::$pv(p) => AgentProbe::answer(p, verify_full), )*
            }
        }

        impl Step {
            /// A short description for progress lines.
            pub fn describe(&self) -> String {
                match self {
                    $( Step::$sv(s) => AgentStep::describe(s), )*
                }
            }

            /// Runs the step; some steps report details (a service's verdict).
            pub fn run(&self) -> Result<Option<serde_json::Value>, StepError> {
                match self {
                    $( Step::$sv(s) => AgentStep::run(s), )*
                }
            }

            /// How long the step may take (its kind's [`AgentStep::limit`]).
            pub fn limit(&self) -> Limit {
                match self {
                    $( Step::$sv(s) => AgentStep::limit(s), )*
                }
            }
        }

        impl Facts {
            $(
                #[doc = concat!("The answer to a probe answered by [`Fact::", stringify!($fv), "`].")]
                pub fn $acc(&self, probe: &Probe) -> Result<Option<&$ft>, NotRead> {
                    match self {
                        Facts::Empty => Ok(None),
                        Facts::Read(map) => match map.get(probe) {
                            Some(Fact::$fv(v)) => Ok(v.as_ref()),
                            _ => Err(NotRead(probe.clone())),
                        },
                    }
                }
            )*
        }
    };
}

wire! {
    probes {
        /// A path: type, owner, mode, and for files size, sha256 and (small text) content.
        Path(file::PathProbe),
        /// A path's type, owner, mode and size, without reading it.
        Stat(file::StatProbe),
        /// Installed versions of Debian packages.
        Packages(apt::PackagesProbe),
        /// A Python venv.
        Venv(venv::VenvProbe),
        /// A git checkout.
        Git(git_checkout::GitProbe),
        /// A CUDA toolkit.
        Cuda(cuda::CudaProbe),
        /// A systemd unit's state.
        Unit(service::UnitProbe),
        /// Whether a server answers its readiness URL and lists its model there.
        Readiness(service::ReadinessProbe),
        /// A model folder's verification record.
        Model(model::ModelProbe),
        /// A container's Proxmox configuration (through the node's API).
        PveContainer(container::PveContainerProbe),
        /// The node's containers provision created (through the node's API).
        PveCreated(container::PveCreatedProbe),
        /// A container template in the node's storage (through the node's API).
        PveTemplate(template::PveTemplateProbe),
        /// The node's model storage.
        ModelStorage(model_storage::ModelStorageProbe),
        /// The NVIDIA userspace driver in a container.
        GpuUserspace(gpu_userspace::GpuUserspaceProbe),
        /// The node's NVIDIA side under its root.
        NvidiaHost(nvidia_host::NvidiaHostProbe),
        /// The fingerprints of the keys in an APT keyring.
        AptKey(apt_source::AptKeyProbe),
        /// The guest's record of what provision manages on it.
        Managed(managed::ManagedProbe),
        /// The bytes of the files under a folder.
        FolderSize(managed::FolderSizeProbe),
        /// An ml-env's stable paths and the generations record's word on them.
        Generation(generation::GenerationProbe),
        /// The free bytes of the filesystem that holds a model folder.
        FreeSpace(model::FreeSpaceProbe),
        /// The services (or processes) holding files under a folder open or mapped.
        Holders(holders::HoldersProbe),
        /// What the container the agent runs in shows of its GPUs.
        GpuSeen(gpu_seen::GpuSeenProbe),
    }
    facts {
        /// Answer to [`Probe::Path`] and [`Probe::Stat`].
        Path(PathFact) => path,
        /// Answer to [`Probe::Packages`]: each name to its installed version (always
        /// `Some` when read).
        Packages(BTreeMap<String, Option<String>>) => packages_read,
        /// Answer to [`Probe::Venv`].
        Venv(VenvFact) => venv,
        /// Answer to [`Probe::Git`].
        Git(GitFact) => git,
        /// Answer to [`Probe::Cuda`].
        Cuda(CudaFact) => cuda,
        /// Answer to [`Probe::Unit`] (`None`: the unit is not known to systemd).
        Unit(UnitFact) => unit,
        /// Answer to [`Probe::Model`].
        Model(ModelFact) => model,
        /// Answer to [`Probe::Readiness`] (always `Some` when read).
        Readiness(crate::health::process::ReadinessFact) => readiness,
        /// Answer to [`Probe::PveContainer`].
        PveContainer(PveContainerFact) => pve_container,
        /// Answer to [`Probe::PveCreated`]: vmid to its config (always `Some` when read).
        PveCreated(BTreeMap<u64, PveContainerFact>) => pve_created,
        /// Answer to [`Probe::PveTemplate`].
        PveTemplate(TemplateFact) => pve_template,
        /// Answer to [`Probe::ModelStorage`].
        ModelStorage(StorageFact) => model_storage,
        /// Answer to [`Probe::NvidiaHost`].
        NvidiaHost(NvidiaHostFact) => nvidia_host,
        /// Answer to [`Probe::GpuUserspace`] (always `Some` when read).
        GpuUserspace(UserspaceFact) => gpu_userspace,
        /// Answer to [`Probe::AptKey`] (empty: a file holding no readable key).
        AptKey(Vec<String>) => apt_key,
        /// Answer to [`Probe::Managed`] (`None`: no record written yet).
        Managed(managed::Record) => managed,
        /// Answer to [`Probe::FolderSize`].
        FolderSize(u64) => folder_size,
        /// Answer to [`Probe::Generation`] (always `Some` when read).
        Generation(generation::GenerationFact) => generation,
        /// Answer to [`Probe::FreeSpace`] (always `Some` when read).
        FreeSpace(model::FreeSpace) => free_space,
        /// Answer to [`Probe::Holders`] (always `Some` when read).
        Holders(Vec<String>) => holders,
        /// Answer to [`Probe::GpuSeen`]: the script's lines (always `Some` when read).
        GpuSeen(String) => gpu_seen,
    }
    steps {
        /// Write a file atomically and verify it by reading it back.
        WriteFile(file::WriteFileStep),
        /// Make a directory (and its parents) with owner and mode.
        Mkdir(directory::MkdirStep),
        /// Write an APT repository's signing key, refused unless it has the pinned
        /// fingerprint.
        AptKey(apt_source::AptKeyStep),
        /// Install Debian packages in one non-interactive transaction.
        AptInstall(apt::AptInstallStep),
        /// Make a venv (removing a wrong one first when `replace`).
        CreateVenv(venv::CreateVenvStep),
        /// `pip install` into a venv.
        PipInstall(pip_packages::PipInstallStep),
        /// Put a binary pushed from the workstation in place (uv), checked by sha256.
        InstallTool(Box<uv::Tool>),
        /// Download a model next to its storage, every file verified.
        ModelPull(Box<model::ModelPull>),
        /// Check a service's new argv before anything of it is written or restarted.
        Preflight(Box<service::ServiceSpec>),
        /// Deploy a service: load, prove loaded, enable, (re)start, health gate, keep or
        /// roll back.
        DeployService(Box<service::deploy::Deploy>),
        /// Bring the node's ZFS dataset for the model storage into place (import, create,
        /// set properties, mount), never destroying or hiding data.
        Zfs(model_storage::ZfsStep),
        /// Write (when `content`) and enable a systemd unit under the node's root.
        NodeUnit(nvidia_host::NodeUnitStep),
        /// Run the NVIDIA driver installer (only with `apply --install-driver`).
        InstallDriver(nvidia_host::InstallDriverStep),
        /// Import the stack's modules in a venv (and compile a C helper); record it.
        ImportCheck(import_check::ImportCheckSpec),
        /// On the node: have NVIDIA's `.run` in the node's cache, checked.
        FetchInstaller(gpu_userspace::FetchInstallerStep),
        /// In the container: install the `.run` the node pushed, without the kernel module.
        InstallUserspace(gpu_userspace::InstallUserspaceStep),
        /// Check out a commit of a repository (cloning first if needed).
        GitCheckout(git_checkout::GitCheckoutStep),
        /// Write the guest's record of what provision manages, atomically.
        Record(managed::Record),
        /// Remove something provision made that is no longer declared.
        Remove(managed::Removal),
        /// Point an ml-env's stable paths at a built generation.
        SwitchGeneration(generation::SwitchGenerationStep),
        /// `provision rollback`: an ml-env's services back on the previous generation.
        RollbackGeneration(generation::RollbackGenerationStep),
    }
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
                // Free bytes move with every write on the filesystem (logs, another
                // download): a saved plan is not stale for that. Which filesystem holds the
                // folder still counts; the download checks the space again before its first
                // byte (`hub::space`).
                Fact::FreeSpace(Some(f)) => Fact::FreeSpace(Some(model::FreeSpace {
                    free: 0,
                    ..f.clone()
                })),
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

impl Facts {
    /// Installed versions of packages (empty world: none installed).
    pub fn packages(&self, probe: &Probe) -> Result<BTreeMap<String, Option<String>>, NotRead> {
        Ok(self.packages_read(probe)?.cloned().unwrap_or_default())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent protocol as it was before the kinds declared their wire types: each line
    /// reads back and writes out unchanged (tag first, then the fields in order).
    /// A saved plan is stale when what it read changed, not when the free bytes under a
    /// model folder moved (they do with any write there); another filesystem still counts.
    #[test]
    fn the_read_digest_ignores_free_bytes_but_not_the_filesystem() {
        let probe = Probe::FreeSpace(model::FreeSpaceProbe {
            path: "/shared/models/m".into(),
        });
        let facts = |free, fsid| {
            Facts::Read(HashMap::from([(
                probe.clone(),
                Fact::FreeSpace(Some(model::FreeSpace {
                    dir: "/shared/models".into(),
                    free,
                    fsid,
                })),
            )]))
        };
        let digest = |f: Facts| f.digest(std::slice::from_ref(&probe)).unwrap();
        assert_eq!(digest(facts(1 << 30, 7)), digest(facts(1 << 20, 7)));
        assert_ne!(digest(facts(1 << 30, 7)), digest(facts(1 << 30, 8)));
    }

    #[test]
    fn the_registry_speaks_the_wire_format_the_enums_spoke() {
        let steps = [
            r#"{"step":"write_file","path":"/a","content":"x","owner":"root","group":"root","mode":420}"#,
            r#"{"step":"create_venv","path":"/v","python":"3.12","replace":false}"#,
            r#"{"step":"pip_install","venv":"/v","requirements":["a==1"],"editable":false,"index_url":null,"extra_index_urls":[],"wheelhouse":null,"uv":"/usr/local/bin/uv"}"#,
            r#"{"step":"switch_generation","links":{"/opt/a":"/opt/g/1"}}"#,
            r#"{"step":"apt_install","packages":["git"]}"#,
        ];
        for line in steps {
            let step: Step = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&step).unwrap(), line);
        }
        let probes = [
            r#"{"probe":"path","path":"/a"}"#,
            r#"{"probe":"pve_created"}"#,
            r#"{"probe":"readiness","url":"u","served_model_name":"m"}"#,
        ];
        for line in probes {
            let probe: Probe = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&probe).unwrap(), line);
        }
        for line in [
            r#"{"fact":"packages","value":{"git":"1"}}"#,
            r#"{"fact":"path","value":null}"#,
        ] {
            let fact: Fact = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&fact).unwrap(), line);
        }
    }
}
