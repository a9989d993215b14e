//! Resources: one file per kind. Each kind is a spec (the desired state, fully rendered,
//! serializable into the plan) implementing [`Resource`]: the probes it needs read and a
//! pure `diff` against their answers.

pub mod apt;
pub mod apt_source;
pub mod config_edit;
pub mod container;
pub mod cuda;
pub mod directory;
pub mod file;
pub mod generation;
pub mod git_checkout;
pub mod gpu_seen;
pub mod gpu_userspace;
pub mod holders;
pub mod import_check;
pub mod managed;
pub mod model;
pub mod model_storage;
pub mod nvidia_host;
pub mod op;
pub mod pip_editable;
pub mod pip_packages;
pub mod pve_lines;
pub mod service;
pub mod template;
pub mod undeclared;
pub mod uv;
pub mod venv;
pub mod wire;

use serde::{Deserialize, Serialize};

use crate::plan::{Action, Attribute, Change};
use wire::{Facts, NotRead, Probe};

/// Every kind of resource, tagged by `kind` as roles and plans write it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResourceSpec {
    /// A file with content from a template or inline.
    File(file::FileSpec),
    /// A directory.
    Directory(directory::DirectorySpec),
    /// Debian packages, installed in one transaction.
    Apt(apt::AptSpec),
    /// An APT repository (deb822), keyed by a pinned signing key.
    AptSource(apt_source::AptSourceSpec),
    /// A CUDA toolkit at a home with a release.
    CudaToolkit(cuda::CudaSpec),
    /// A Python venv.
    Venv(venv::VenvSpec),
    /// Pinned packages in a venv.
    PipPackages(pip_packages::PipPackagesSpec),
    /// A git checkout at a commit.
    GitCheckout(git_checkout::GitCheckoutSpec),
    /// A source folder installed editable into a venv.
    PipEditable(pip_editable::PipEditableSpec),
    /// A Hugging Face model in a folder, verified.
    Model(model::ModelSpec),
    /// A systemd service: enabled, running, restarted when what it depends on changes,
    /// and health-gated.
    Service(Box<service::ServiceSpec>),
    /// A container's Proxmox configuration.
    Container(container::ContainerSpec),
    /// Lines in a container's Proxmox config that only root may set (device passthrough,
    /// raw `lxc.*` keys).
    PveLines(pve_lines::PveLinesSpec),
    /// The node's model storage (a ZFS dataset or a directory).
    ModelStorage(model_storage::ModelStorageSpec),
    /// A container template in the node's storage.
    Template(template::TemplateSpec),
    /// The node's NVIDIA driver side.
    NvidiaHost(nvidia_host::NvidiaHostSpec),
    /// The NVIDIA userspace driver in a GPU container, at the node's module version.
    GpuUserspace(gpu_userspace::GpuUserspaceSpec),
    /// The stack's modules imported in a venv, and a C helper compiled against Python.h.
    ImportCheck(import_check::ImportCheckSpec),
    /// Something provision made on a guest that is no longer declared (from the guest's
    /// record): a `-` change while it is there.
    Removed(managed::Removal),
    /// An ml-env's stable paths pointing at its declared generation, built beside.
    Generation(generation::GenerationSpec),
    /// uv, pushed to the target to build the ml-env.
    Uv(uv::UvSpec),
}

/// How a resource differs from what was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// What apply will do.
    pub action: Action,
    /// Attribute by attribute.
    pub attributes: Vec<Attribute>,
    /// A unified diff of content, if any.
    pub diff: Option<String>,
    /// Why, in words.
    pub reasons: Vec<String>,
    /// What the change means for the operations that carry it out, when the kind says more
    /// than its attributes show (decided by its diff, never read back from display labels).
    pub typed: Option<Typed>,
}

/// A change's meaning for its operations, decided by the kind's diff and kept in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Typed {
    /// A service: whether the change (re)starts it (only `enabled` differing does not),
    /// and whether a server that runs as declared and is not ready yet is waited for first.
    Service {
        /// The change starts or restarts it (and so its preflight runs first).
        restart: bool,
        /// It runs as declared: wait for it before any restart.
        wait_first: bool,
    },
    /// What is there conflicts with what is declared, and provision never destroys,
    /// reformats or hides data to resolve it (a file where the model storage's directory
    /// belongs): apply refuses it.
    Conflict {
        /// Why, in words.
        why: String,
    },
    /// An APT source whose signing key is to be written (its keyring does not hold the
    /// pinned key), not only its deb822 file.
    AptKey,
    /// What the node's NVIDIA side needs: the driver installed, units set up.
    NvidiaHost {
        /// The driver is not the declared one: the installer runs.
        driver: bool,
        /// `nvidia-persistenced` is to be enabled.
        persistenced: bool,
        /// The unit that makes `/dev/nvidia-uvm` at boot is to be written and enabled.
        uvm: bool,
    },
    /// A container's update through the API: the config keys written (a value, or a
    /// delete), whether it is started (it is stopped) and whether it reboots (`restart:
    /// allowed`, changes pending until a restart).
    Container {
        /// The config keys written.
        set: Vec<String>,
        /// It is stopped and is started.
        start: bool,
        /// It runs and is rebooted to apply pending changes.
        reboot: bool,
    },
    /// A container found on another node of the cluster than declared.
    Moved {
        /// The node it is on.
        on: String,
        /// The node the inventory declares.
        declared: String,
    },
}

impl Delta {
    /// A delta with `action` and nothing else yet.
    pub fn new(action: Action) -> Self {
        Delta {
            action,
            attributes: Vec::new(),
            diff: None,
            reasons: Vec::new(),
            typed: None,
        }
    }

    /// Adds an attribute.
    pub fn attr(mut self, attribute: Attribute) -> Self {
        self.attributes.push(attribute);
        self
    }

    /// Adds a reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reasons.push(reason.into());
        self
    }
}

/// One kind of resource.
pub trait Resource {
    /// The kind, as roles and plans spell it.
    fn kind(&self) -> &'static str;
    /// What it is called on its target (a path, a unit, a package set).
    fn name(&self) -> String;
    /// The reads it needs; the engine batches them per target.
    fn probes(&self) -> Vec<Probe>;
    /// Compares with the answers; `None` when it already matches.
    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead>;
    /// Things worth knowing before applying a change of it that do not stop the apply
    /// (an SGLang setting that works, but not as well as it could).
    fn warnings(&self, _facts: &Facts) -> Vec<String> {
        Vec::new()
    }
    /// The operations that carry out `change` (a change of this resource), in order,
    /// whatever carries them: guest steps, calls to the node's API, root-only node steps.
    /// An `Err` says what cannot be done (a refusal, a secret not readable); apply refuses
    /// the whole plan first.
    fn ops(&self, change: &Change, allowed: &op::Allowed) -> Result<Vec<op::Op>, StepsError>;
}

/// Why a change has no operations.
#[derive(Debug, thiserror::Error)]
pub enum StepsError {
    /// The change would destroy or hide data, or needs what provision does not do itself
    /// (or was not allowed to: `--install-driver`).
    #[error("{0}")]
    Refused(String),
    /// A secret the steps carry cannot be read on the workstation.
    #[error(transparent)]
    Secret(#[from] crate::inventory::secret::SecretError),
}

/// Where a resource lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// On the node, in the container's Proxmox config.
    Container,
    /// Inside the container.
    Guest,
    /// On the Proxmox node itself.
    Node,
}

impl ResourceSpec {
    /// The spec as its [`Resource`].
    pub fn resource(&self) -> &dyn Resource {
        match self {
            ResourceSpec::File(r) => r,
            ResourceSpec::Directory(r) => r,
            ResourceSpec::Apt(r) => r,
            ResourceSpec::AptSource(r) => r,
            ResourceSpec::CudaToolkit(r) => r,
            ResourceSpec::Venv(r) => r,
            ResourceSpec::PipPackages(r) => r,
            ResourceSpec::GitCheckout(r) => r,
            ResourceSpec::PipEditable(r) => r,
            ResourceSpec::Model(r) => r,
            ResourceSpec::Service(r) => r.as_ref(),
            ResourceSpec::Container(r) => r,
            ResourceSpec::PveLines(r) => r,
            ResourceSpec::ModelStorage(r) => r,
            ResourceSpec::Template(r) => r,
            ResourceSpec::NvidiaHost(r) => r,
            ResourceSpec::GpuUserspace(r) => r,
            ResourceSpec::ImportCheck(r) => r,
            ResourceSpec::Removed(r) => r,
            ResourceSpec::Generation(r) => r,
            ResourceSpec::Uv(r) => r,
        }
    }

    /// Which target it lives on (every kind says: a new one cannot default to the guest).
    pub fn target_kind(&self) -> TargetKind {
        match self {
            ResourceSpec::Container(_) | ResourceSpec::PveLines(_) => TargetKind::Container,
            // A container no longer declared is destroyed through its node's API.
            // So are lines in its config a role no longer declared had provision write.
            ResourceSpec::Removed(r)
                if matches!(
                    r.entry,
                    managed::Entry::Container { .. } | managed::Entry::PveLines { .. }
                ) =>
            {
                TargetKind::Container
            }
            ResourceSpec::ModelStorage(_)
            | ResourceSpec::Template(_)
            | ResourceSpec::NvidiaHost(_) => TargetKind::Node,
            ResourceSpec::File(_)
            | ResourceSpec::Directory(_)
            | ResourceSpec::Apt(_)
            | ResourceSpec::AptSource(_)
            | ResourceSpec::CudaToolkit(_)
            | ResourceSpec::Venv(_)
            | ResourceSpec::PipPackages(_)
            | ResourceSpec::GitCheckout(_)
            | ResourceSpec::PipEditable(_)
            | ResourceSpec::Model(_)
            | ResourceSpec::Service(_)
            | ResourceSpec::GpuUserspace(_)
            | ResourceSpec::ImportCheck(_)
            | ResourceSpec::Removed(_)
            | ResourceSpec::Generation(_)
            | ResourceSpec::Uv(_) => TargetKind::Guest,
        }
    }

    /// `kind:name`, unique on its target.
    pub fn address(&self) -> String {
        let r = self.resource();
        format!("{}:{}", r.kind(), r.name())
    }
}

/// A unified diff from `old` (absent when `None`) to `new`, labelled with `path`.
pub fn unified_diff(path: &str, old: Option<&str>, new: &str) -> String {
    let before = old.unwrap_or("");
    let old_label = if old.is_some() {
        path.to_string()
    } else {
        format!("{path} (absent)")
    };
    similar::TextDiff::from_lines(before, new)
        .unified_diff()
        .context_radius(3)
        .header(&old_label, path)
        .to_string()
}

/// The owner and mode attributes that differ between what was found and what is wanted.
pub fn owner_mode_changes(
    found: &file::PathFact,
    owner: &str,
    group: &str,
    mode: u32,
) -> Vec<Attribute> {
    let mut out = Vec::new();
    let (have, want) = (
        format!("{}:{}", found.owner, found.group),
        format!("{owner}:{group}"),
    );
    if have != want {
        out.push(Attribute::change("owner", Some(have), Some(want)));
    }
    if found.mode != mode {
        out.push(Attribute::change(
            "mode",
            Some(mode_text(found.mode)),
            Some(mode_text(mode)),
        ));
    }
    out
}

/// Permission bits as `0644`.
pub fn mode_text(mode: u32) -> String {
    format!("{mode:04o}")
}

/// Parses `0644` (octal, as written in roles).
pub fn parse_mode(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
}
