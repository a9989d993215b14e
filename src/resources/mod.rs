//! Resources: one file per kind. Each kind is a spec (the desired state, fully rendered,
//! serializable into the plan) implementing [`Resource`]: the probes it needs read and a
//! pure `diff` against their answers.

pub mod config_edit;
pub mod gpu_seen;
pub mod holders;
pub mod op;
pub mod undeclared;
pub mod wire;

use serde::{Deserialize, Serialize};

use crate::plan::{Action, Attribute, Change};
use wire::{Facts, NotRead, Probe};

/// Every kind, one line each: its module (`pub mod`), its variant of [`ResourceSpec`] (the
/// `kind` roles and plans write, in snake case) and the spec type, which implements
/// [`Resource`]. Adding a kind is its own file and one line here (and its wire types'
/// lines in `wire!`, `wire/mod.rs`); every dispatch goes through [`Resource`].
macro_rules! kinds {
    ( $( $(#[$doc:meta])* $module:ident => $variant:ident($spec:ty), )* ) => {
        $( pub mod $module; )*

        /// Every kind of resource, tagged by `kind` as roles and plans write it.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub enum ResourceSpec {
            $( $(#[$doc])* $variant($spec), )*
        }

        impl ResourceSpec {
            /// The spec as its [`Resource`].
            pub fn resource(&self) -> &dyn Resource {
                match self {
                    $( ResourceSpec::$variant(r) => r, )*
                }
            }
        }
    };
}

kinds! {
    /// A file with content from a template or inline.
    file => File(file::FileSpec),
    /// A directory.
    directory => Directory(directory::DirectorySpec),
    /// Debian packages, installed in one transaction.
    apt => Apt(apt::AptSpec),
    /// An APT repository (deb822), keyed by a pinned signing key.
    apt_source => AptSource(apt_source::AptSourceSpec),
    /// A CUDA toolkit at a home with a release.
    cuda => CudaToolkit(cuda::CudaSpec),
    /// A Python venv.
    venv => Venv(venv::VenvSpec),
    /// Pinned packages in a venv.
    pip_packages => PipPackages(pip_packages::PipPackagesSpec),
    /// A git checkout at a commit.
    git_checkout => GitCheckout(git_checkout::GitCheckoutSpec),
    /// A source folder installed editable into a venv.
    pip_editable => PipEditable(pip_editable::PipEditableSpec),
    /// A Hugging Face model in a folder, verified.
    model => Model(model::ModelSpec),
    /// A systemd service: enabled, running, restarted when what it depends on changes,
    /// and health-gated.
    service => Service(Box<service::ServiceSpec>),
    /// A container's Proxmox configuration.
    container => Container(container::ContainerSpec),
    /// Lines in a container's Proxmox config that only root may set (device passthrough,
    /// raw `lxc.*` keys).
    pve_lines => PveLines(pve_lines::PveLinesSpec),
    /// The node's model storage (a ZFS dataset or a directory).
    model_storage => ModelStorage(model_storage::ModelStorageSpec),
    /// A container template in the node's storage.
    template => Template(template::TemplateSpec),
    /// The node's NVIDIA driver side.
    nvidia_host => NvidiaHost(nvidia_host::NvidiaHostSpec),
    /// The NVIDIA userspace driver in a GPU container, at the node's module version.
    gpu_userspace => GpuUserspace(gpu_userspace::GpuUserspaceSpec),
    /// The stack's modules imported in a venv, and a C helper compiled against Python.h.
    import_check => ImportCheck(import_check::ImportCheckSpec),
    /// Something provision made on a guest that is no longer declared (from the guest's
    /// record): a `-` change while it is there.
    managed => Removed(managed::Removal),
    /// An ml-env's stable paths pointing at its declared generation, built beside.
    generation => Generation(generation::GenerationSpec),
    /// uv, pushed to the target to build the ml-env.
    uv => Uv(uv::UvSpec),
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
    /// Which target it lives on. Every kind says (no default: a new kind cannot fall to
    /// the guest by omission).
    fn target(&self) -> TargetKind;
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

/// A kind boxed in [`ResourceSpec`] (a large spec, e.g. a service's) is its spec.
impl<T: Resource + ?Sized> Resource for Box<T> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn target(&self) -> TargetKind {
        (**self).target()
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn probes(&self) -> Vec<Probe> {
        (**self).probes()
    }
    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        (**self).diff(facts)
    }
    fn warnings(&self, facts: &Facts) -> Vec<String> {
        (**self).warnings(facts)
    }
    fn ops(&self, change: &Change, allowed: &op::Allowed) -> Result<Vec<op::Op>, StepsError> {
        (**self).ops(change, allowed)
    }
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
    /// Which target it lives on (its kind's [`Resource::target`]).
    pub fn target_kind(&self) -> TargetKind {
        self.resource().target()
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
