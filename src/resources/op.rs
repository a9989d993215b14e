//! The operations a kind turns its change into, whatever carries them: a guest step run by
//! the agent, a call to a node's Proxmox API, a root-only step over the node's SSH. A kind
//! declares them in [`super::Resource::ops`]; the engine orders them across kinds
//! (`engine/ops.rs`) and a target's writer runs the ones it carries (`access.rs`).

use crate::plan::Action;

use super::StepsError;
use super::container::ContainerSpec;
use super::pve_lines::PveLinesSpec;
use super::wire::Step;

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

/// A change of `spec` on `target` with its action and nothing else, for the kinds' and the
/// engine's unit tests.
#[cfg(test)]
pub(crate) fn bare_change(
    target: &str,
    spec: super::ResourceSpec,
    action: Action,
) -> crate::plan::Change {
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
