//! The operations a kind turns its change into, whatever carries them: a guest step run by
//! the agent, a call to a node's Proxmox API, a root-only step over the node's SSH. A kind
//! declares them in [`super::Resource::ops`]; the engine orders them across kinds
//! (`engine/ops.rs`) and a target's writer runs the ones it carries (`access.rs`).

use std::time::{Duration, Instant};

use crate::plan::Action;

use super::StepsError;
use super::container::ContainerSpec;
use super::pve_lines::PveLinesSpec;
use super::wire::{AgentStep, Limit, Step, minutes};

/// What an apply was allowed to do, as the kinds' operations need it (from
/// `engine::reconcile::ApplyOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// Roll a service back to its last healthy unit when the health gate fails.
    pub rollback: bool,
    /// Destroy and recreate a container whose create-only settings changed.
    pub replace: bool,
    /// Run a planned NVIDIA driver install (a reboot of the node follows).
    pub install_driver: bool,
}

/// Guest steps as operations: what most kinds return.
pub fn guest(steps: impl IntoIterator<Item = Step>) -> Result<Vec<Op>, StepsError> {
    Ok(steps.into_iter().map(Op::Guest).collect())
}

/// One operation of an apply, by what carries it out.
///
/// Each writer runs the variants it carries and refuses the others.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A step run by the agent inside a guest (or on a host it was pushed to).
    Guest(Step),
    /// A call to a node's Proxmox API.
    Api(ApiOp),
    /// A root-only step on a node, over its SSH as root.
    Node(NodeOp),
}

/// A root-only step on a Proxmox node, run over the node's SSH as root.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeOp {
    /// Brings a container's root-only config lines (`devN`, raw `lxc.*`) to the wanted
    /// ones: `pct set` for options, the locked atomic edit of `lxc/<vmid>.conf` for raw
    /// lines, verified by reading the file back.
    Lines {
        /// The change's plan address, for messages.
        address: String,
        /// The wanted lines and which found lines they own.
        spec: PveLinesSpec,
    },
    /// Has the node fetch NVIDIA's `.run` into its cache (sha256 checked before it is
    /// kept) and push it into the guest's container, where the guest step installs it.
    PushInstaller {
        /// The change's plan address, for messages.
        address: String,
        /// Where the node downloads it from.
        url: String,
        /// Its sha256.
        sha256: String,
    },
}

/// An operation through a node's Proxmox API.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiOp {
    /// Create, change or replace a container's configuration (and start it as declared).
    Container {
        /// The change's plan address, for messages.
        address: String,
        /// The desired configuration.
        spec: ContainerSpec,
        /// What the plan says to do.
        action: Action,
        /// Whether a replace may destroy the container.
        allow_replace: bool,
        /// Whether the container is started here; `false` when root-only lines are written
        /// first over node SSH, and [`ApiOp::Start`] follows them.
        start: bool,
    },
    /// Starts a container after its root-only lines were written; reboots it when it
    /// was already running and `reboot` (the lines only take effect at a start).
    Start {
        /// The container.
        vmid: u64,
        /// Reboot a running container (`restart: allowed` and its lines changed).
        reboot: bool,
    },
    /// Stops and destroys a container provision created that is no longer declared
    /// (`--allow-destroy`), once its marker is read again and still names its vmid.
    Destroy {
        /// The change's plan address, for messages.
        address: String,
        /// The container.
        vmid: u64,
    },
    /// Have the node download a container template (checksum verified by the node).
    Template {
        /// The change's plan address, for messages.
        address: String,
        /// The template.
        spec: super::template::TemplateSpec,
    },
}

impl Op {
    /// How long the whole operation may take: a guest step's own limit (the client stops
    /// it past that, `agent/attach.rs`), or the deadline that an API or node operation's
    /// writer gives every task and command it runs ([`Deadline`]).
    pub fn limit(&self) -> Limit {
        match self {
            Op::Guest(step) => step.limit(),
            Op::Api(op) => Limit::Total(op.limit()),
            Op::Node(op) => op.limit(),
        }
    }

    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Op::Guest(step) => step.describe(),
            Op::Api(ApiOp::Container { address, .. }) => format!("apply {address}"),
            Op::Api(ApiOp::Template { spec, .. }) => {
                format!(
                    "download {} ({} checked)",
                    spec.volume, spec.checksum_algorithm
                )
            }
            Op::Api(ApiOp::Start { vmid, .. }) => format!("start CT {vmid}"),
            Op::Api(ApiOp::Destroy { vmid, .. }) => {
                format!("stop and destroy CT {vmid} (host bind mounts kept)")
            }
            Op::Node(NodeOp::Lines { address, .. }) => {
                format!("apply {address} over node SSH (pct set / locked config edit)")
            }
            Op::Node(NodeOp::PushInstaller { url, .. }) => {
                format!(
                    "fetch {url} on the node (sha256 checked) and pct push it into the container"
                )
            }
        }
    }
}

impl ApiOp {
    /// How long the operation may take, every Proxmox task it starts and follows included.
    pub fn limit(&self) -> Duration {
        match self {
            // A replace runs up to four tasks: stop, destroy, create (the template's unpack,
            // the slow one) and start.
            ApiOp::Container { .. } => minutes(30),
            // One task: a start, or a reboot (stop and start inside it).
            ApiOp::Start { .. } => minutes(10),
            // Two: stop, then destroy.
            ApiOp::Destroy { .. } => minutes(20),
            // The node's download of the template, its checksum checked.
            ApiOp::Template { .. } => minutes(30),
        }
    }
}

impl NodeOp {
    /// How long the operation may take.
    pub fn limit(&self) -> Limit {
        match self {
            // Reads, `pct set` and the locked edit, each a node command that takes
            // milliseconds, a config lock waited for (10 s at most per edit) and up to three
            // attempts when the config changes underneath.
            NodeOp::Lines { .. } => Limit::Total(minutes(3)),
            // The node's fetch is the agent's step, limited as that step; the push into the
            // container that follows is a local copy on the node.
            NodeOp::PushInstaller { url, sha256, .. } => super::gpu_userspace::FetchInstallerStep {
                url: url.clone(),
                sha256: sha256.clone(),
            }
            .limit(),
        }
    }
}

/// When an API or node operation's time is up: each task it follows and each command it
/// runs may take what is left of its [`ApiOp::limit`] or [`NodeOp::limit`], no more.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    /// `limit` from now.
    pub fn after(limit: Duration) -> Self {
        Deadline {
            at: Instant::now() + limit,
            limit,
        }
    }

    /// The operation's whole limit.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// What is left of it (zero once it passed).
    pub fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }
}

/// A change of `spec` on `target` (as [`crate::plan::Target::names`] spells it) with its
/// action and nothing else: what a change made outside a diff starts from.
pub fn bare_change(target: &str, spec: super::ResourceSpec, action: Action) -> crate::plan::Change {
    let r = spec.resource();
    crate::plan::Change {
        address: format!("{target}/{}", spec.address()),
        kind: r.kind().into(),
        name: r.name(),
        action,
        role: None,
        attributes: Vec::new(),
        diff: None,
        reasons: Vec::new(),
        warnings: Vec::new(),
        typed: None,
        spec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_says_what_is_left_and_when_it_passed() {
        let spent = Deadline::after(Duration::ZERO);
        assert!(spent.passed());
        assert_eq!(spent.left(), Duration::ZERO);
        let minute = Deadline::after(minutes(1));
        assert!(!minute.passed());
        assert!(minute.left() <= minutes(1) && minute.left() > Duration::from_secs(50));
        assert_eq!(minute.limit(), minutes(1));
    }

    #[test]
    fn node_and_api_operations_carry_limits_that_fit_their_tasks() {
        let start = ApiOp::Start {
            vmid: 100,
            reboot: true,
        };
        let destroy = ApiOp::Destroy {
            address: "container.x".into(),
            vmid: 100,
        };
        // A destroy stops first: two tasks, each as long as a start may take.
        assert!(destroy.limit() >= 2 * start.limit());
        assert_eq!(Op::Api(start.clone()).limit(), Limit::Total(start.limit()));
        let push = NodeOp::PushInstaller {
            address: "gpu_userspace.x".into(),
            url: "https://example.invalid/NVIDIA.run".into(),
            sha256: "0".repeat(64),
        };
        // The node's push fetches NVIDIA's `.run` (about 400 MB for 580): room for it at
        // 1 MB/s, and a bound.
        let Limit::Total(push) = Op::Node(push).limit() else {
            panic!("the installer's push has no total bound");
        };
        assert!(push >= std::time::Duration::from_secs(400), "{push:?}");
        assert!(push <= std::time::Duration::from_secs(3600), "{push:?}");
    }
}
