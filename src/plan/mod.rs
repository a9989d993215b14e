//! The plan: a value. `plan` and `check` print it, tests snapshot it, and `apply` executes
//! exactly that value. Its JSON form is documented in `docs/plan-format.md`.

mod print;

use serde::{Deserialize, Serialize};

pub use print::render_human;

use crate::resources::ResourceSpec;
use crate::resources::wire::Probe;

/// The version of the JSON plan format; bumped on any change another version would read
/// differently. 2: services keep where the inventory declared them (`declared`). 3: a
/// target that could not be read says so (`not_read`): an older provision would apply its
/// "everything to create" changes without reading it again;
/// and a guest's plan carries the record apply leaves (`manages`) and `removed` changes.
/// 4: a target planned again after another's plan or a read of its node says so
/// (`replanned`): its changes are not only the diff of what was read for it; a service's
/// readiness has no `port` (its `url`'s is the gate's).
/// Apply acts on a change's `typed` (`container`, `conflict`, `apt_key`, `nvidia_host`)
/// where it read attribute names before; a format-3 plan lacks them.
pub const FORMAT_VERSION: u32 = 7;

/// Everything that would change, grouped by target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The inventory file, as named on the command line.
    pub inventory: String,
    /// Whether reality was read (`online`) or assumed empty (`offline`).
    pub mode: PlanMode,
    /// Per target, in the order they are applied.
    pub targets: Vec<TargetPlan>,
    /// Counts by action.
    pub summary: Summary,
}

/// What the plan was compared against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanMode {
    /// Against an empty world: nothing was read, everything is to create.
    Offline,
    /// Against what was read from the nodes and guests.
    Online,
}

/// The changes on one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetPlan {
    /// Where the changes happen.
    pub target: Target,
    /// Resources that differ, in apply order.
    pub changes: Vec<Change>,
    /// Resources that were checked and already match.
    pub unchanged: usize,
    /// What was read to make it (online plans only): applying a saved plan reads the same
    /// probes again and refuses when the answers differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<ReadStamp>,
    /// What is worth knowing about resources that match (a kernel command line that
    /// lacks a word: reported, never applied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Why the target could not be read (its container is stopped): `changes` are then
    /// everything it declares, and apply reads it again once it can and applies only what
    /// differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_read: Option<String>,
    /// A guest's record of what provision manages, as apply leaves it (online plans of
    /// guests only): what is declared, and model folders kept on purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manages: Option<crate::resources::managed::Record>,
    /// Why this target was planned again after its own read (its container is replaced,
    /// so it is planned as new; the GPU checks inside its running container found drift):
    /// shown with the plan, so apply runs nothing the plan does not show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replanned: Option<String>,
    /// A guest whose container this plan reboots (its vmid): apply reaches it again once
    /// it has booted, and its services with a health gate are waited for after the boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_reboot: Option<u64>,
}

impl TargetPlan {
    /// No change on `target`, nothing read (a writer opened for one step of its own).
    pub fn empty(target: Target) -> Self {
        TargetPlan {
            target,
            changes: Vec::new(),
            unchanged: 0,
            read: None,
            warnings: Vec::new(),
            not_read: None,
            manages: None,
            replanned: None,
            after_reboot: None,
        }
    }
}

/// The probes a target plan was made from and a digest of their answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStamp {
    /// The probes, in the order they were read.
    pub probes: Vec<Probe>,
    /// sha256 of the answers (see `Facts::digest`).
    pub digest: String,
    /// The model files were re-hashed (`--verify-full`), so applying the saved plan must
    /// re-hash them too to compare like with like.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_full: bool,
    /// Model folders no longer declared were planned for deletion (`--prune-models`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune_models: bool,
}

/// A place changes happen: a node, a container's configuration on its node, or the
/// inside of a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// A Proxmox node itself (templates, storage).
    Node {
        /// The node's inventory name.
        node: String,
        /// Its API URL.
        api: String,
    },
    /// A container's definition on its node (Proxmox config).
    Container {
        /// The node's inventory name.
        node: String,
        /// The container's inventory name.
        name: String,
        /// Its vmid.
        vmid: u64,
    },
    /// Inside a container (over SSH).
    Guest {
        /// The container's inventory name.
        name: String,
        /// `user@host:port` it is reached at.
        address: String,
    },
}

impl Target {
    /// Its name as `--target` and plan addresses spell it: `node.N`, `container.N`,
    /// `guest.N`; and the bare inventory name.
    pub fn names(&self) -> (String, String) {
        match self {
            Target::Node { node, .. } => (format!("node.{node}"), node.clone()),
            Target::Container { name, .. } => (format!("container.{name}"), name.clone()),
            Target::Guest { name, .. } => (format!("guest.{name}"), name.clone()),
        }
    }

    /// A one-line heading, e.g. `guest llm-two (root@10.1.230.174:22)`.
    pub fn heading(&self) -> String {
        match self {
            Target::Node { node, api } => format!("node {node} ({api})"),
            Target::Container { node, name, vmid } => {
                format!("container {name} (CT {vmid} on node {node})")
            }
            Target::Guest { name, address } => format!("guest {name} ({address})"),
        }
    }
}

/// One resource that differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Stable address within the plan: `<target>/<kind>:<name>`.
    pub address: String,
    /// The resource kind (`file`, `apt`, `service` ...).
    pub kind: String,
    /// What it is called on its target (a path, a unit, a package set).
    pub name: String,
    /// What will be done.
    pub action: Action,
    /// The role that contributed it, if any.
    pub role: Option<String>,
    /// Attribute by attribute, before and after.
    pub attributes: Vec<Attribute>,
    /// A unified diff of file content, when there is content.
    pub diff: Option<String>,
    /// Why the change is needed, in words (drift found, a dependency changed).
    pub reasons: Vec<String>,
    /// What is worth knowing before applying it, though it does not stop the apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the change means for the operations that carry it out (a service's restart, a
    /// container on another node), as the kind's diff decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typed: Option<crate::resources::Typed>,
    /// The desired state apply will reach, fully rendered (secrets by reference only).
    pub spec: ResourceSpec,
}

/// What apply does to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Make it (`+`).
    Create,
    /// Change it in place (`~`).
    Update,
    /// Destroy and make again (`-/+`).
    Replace,
    /// Remove it (`-`).
    Delete,
}

impl Action {
    /// The sign shown in front of the change.
    pub fn sign(self) -> &'static str {
        match self {
            Action::Create => "+",
            Action::Update => "~",
            Action::Replace => "-/+",
            Action::Delete => "-",
        }
    }
}

/// One attribute's value before and after (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    /// Its name.
    pub name: String,
    /// The value found, if any.
    pub before: Option<String>,
    /// The value wanted, if any.
    pub after: Option<String>,
}

impl Attribute {
    /// An attribute that is only wanted (on create).
    pub fn new(name: &str, after: impl Into<String>) -> Self {
        Attribute {
            name: name.to_string(),
            before: None,
            after: Some(after.into()),
        }
    }

    /// An attribute that changes from `before` to `after`.
    pub fn change(name: &str, before: Option<String>, after: Option<String>) -> Self {
        Attribute {
            name: name.to_string(),
            before,
            after,
        }
    }
}

/// Counts by action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// To create.
    pub create: usize,
    /// To update in place.
    pub update: usize,
    /// To replace.
    pub replace: usize,
    /// To delete.
    pub delete: usize,
    /// Checked and unchanged.
    pub unchanged: usize,
    /// Targets not read (their container is stopped): known once apply starts it; their
    /// resources are not counted above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_read: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Summary {
    /// Counts the changes of `targets`.
    pub fn of(targets: &[TargetPlan]) -> Self {
        let mut s = Summary::default();
        for t in targets {
            if t.not_read.is_some() {
                s.not_read += 1;
                continue;
            }
            s.unchanged += t.unchanged;
            for c in &t.changes {
                match c.action {
                    Action::Create => s.create += 1,
                    Action::Update => s.update += 1,
                    Action::Replace => s.replace += 1,
                    Action::Delete => s.delete += 1,
                }
            }
        }
        s
    }

    /// Whether anything would change.
    pub fn has_changes(&self) -> bool {
        self.create + self.update + self.replace + self.delete + self.not_read > 0
    }
}

impl Plan {
    /// A plan of `targets`, summarised.
    pub fn new(inventory: &str, mode: PlanMode, targets: Vec<TargetPlan>) -> Self {
        let summary = Summary::of(&targets);
        Plan {
            format_version: FORMAT_VERSION,
            inventory: inventory.to_string(),
            mode,
            targets,
            summary,
        }
    }
}
