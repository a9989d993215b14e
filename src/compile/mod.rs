//! The compile step: inventory → each target's desired state, typed, in one layer below the
//! engine and above the kinds. Everything that reads the inventory to build a kind's spec
//! lives here ([`desired`] for the containers and their guests, [`node`] for the node itself,
//! [`container`] for a container's Proxmox config and APT sources, [`render`] for templates,
//! roles, the container context, the services and the GPU passthrough lines), so no kind
//! (`resources/`) reads the inventory and the engine receives finished specs.

pub mod container;
pub mod desired;
pub mod node;
pub mod render;

pub use desired::{Library, desired_state};
pub use node::ROOT_ENV;

use crate::plan::Target;
use crate::resources::ResourceSpec;
use crate::resources::wire::Probe;

/// A resource wanted on a target, and the role that asked for it.
#[derive(Debug, Clone)]
pub struct Desired {
    /// The fully rendered desired state.
    pub spec: ResourceSpec,
    /// The contributing role, if any.
    pub role: Option<String>,
}

/// Everything wanted on one target.
#[derive(Debug, Clone)]
pub struct DesiredTarget {
    /// Where.
    pub target: Target,
    /// What, in apply order.
    pub resources: Vec<Desired>,
}

impl DesiredTarget {
    /// The probes of all its resources, each once, in first-use order: one batch.
    pub fn probes(&self) -> Vec<Probe> {
        let mut out: Vec<Probe> = Vec::new();
        for d in &self.resources {
            for p in d.spec.resource().probes() {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
        out
    }

    /// `<target>/<kind>:<name>` for a resource of this target.
    pub fn address(&self, spec: &ResourceSpec) -> String {
        let prefix = self.target.names().0;
        format!("{prefix}/{}", spec.address())
    }
}
