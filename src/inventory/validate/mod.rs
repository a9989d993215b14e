//! The rules between values, all in one place. Every problem is reported (not just the
//! first), each with `file:line:col`, the offending value and a hint. One file per part of
//! the inventory: `node`, `container` (its network, mounts, GPUs and roles),
//! `software` (packages, APT sources, the ml-env, models) and `service`.

mod container;
mod node;
mod proxmox;
mod service;
mod software;

use std::collections::HashMap;

use super::load::Loaded;
use super::spanned::{Pos, Sp};
use super::text::Name;
use crate::diagnostic::{Diagnostic, Diagnostics};

/// The smallest and largest container IDs Proxmox accepts.
pub const VMID_RANGE: std::ops::RangeInclusive<u64> = 100..=999_999_999;

/// Checks everything that parsing alone cannot. `known_roles` are the role names found
/// in the role folders and built in.
pub fn validate(loaded: &Loaded, known_roles: &[String]) -> Result<(), Diagnostics> {
    let mut v = Validator {
        loaded,
        errors: Vec::new(),
    };
    if loaded.inventory.nodes.is_empty() {
        v.err(
            loaded.top_level_pos("nodes"),
            "the inventory declares no nodes",
            "add a node under `nodes:`; see inventory/llm-two.yaml",
        );
    }
    for (node_name, node) in &loaded.inventory.nodes {
        v.node(node_name, node);
        let mut vmids: HashMap<u64, &Name> = HashMap::new();
        for (ct_name, ct) in &node.containers {
            if let Some(first) = vmids.insert(ct.vmid.value, ct_name) {
                v.err(
                    ct.vmid.pos,
                    format!("vmid {} is used twice on node `{node_name}`", ct.vmid.value),
                    format!("container `{first}` already has it; give `{ct_name}` another vmid"),
                );
            }
            v.container(ct_name, ct, known_roles);
        }
    }
    // vmids are unique in a Proxmox cluster: the nodes naming one cluster share them.
    let mut in_cluster: HashMap<(&str, u64), (&Name, &Name)> = HashMap::new();
    for (node_name, node) in &loaded.inventory.nodes {
        let Some(cluster) = &node.cluster else {
            continue;
        };
        for (ct_name, ct) in &node.containers {
            let key = (cluster.value.as_str(), ct.vmid.value);
            if let Some((other_node, other_ct)) = in_cluster.insert(key, (node_name, ct_name))
                && other_node != node_name
            {
                v.err(
                    ct.vmid.pos,
                    format!(
                        "vmid {} is also container `{other_ct}`'s on node `{other_node}`, in the same cluster `{}`",
                        ct.vmid.value,
                        cluster.value.as_str()
                    ),
                    format!("vmids are unique in a Proxmox cluster; give `{ct_name}` another vmid"),
                );
            }
        }
    }
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(Diagnostics(v.errors))
    }
}

struct Validator<'a> {
    loaded: &'a Loaded,
    errors: Vec<Diagnostic>,
}

impl Validator<'_> {
    fn err(&mut self, pos: Pos, message: impl Into<String>, hint: impl Into<String>) {
        let d = self.loaded.diag(pos, message).hint(hint);
        self.errors.push(d);
    }
}

/// The first of `positions` written in the file: a rule between two values may break by a
/// default on one side, and the error must still point at the value the user wrote (found
/// by fuzzing: `stall_timeout: 0m` against the default `poll_interval`).
fn written(positions: &[Pos]) -> Pos {
    positions
        .iter()
        .copied()
        .find(Pos::is_known)
        .unwrap_or_default()
}

/// The unit a service runs as: its `unit:` or `<service>.service`, always with the suffix.
pub fn unit_name(service: &Name, unit: Option<&Sp<Name>>) -> String {
    let base = unit.map_or(service.as_str(), |u| u.as_str());
    if base.ends_with(".service") {
        base.to_string()
    } else {
        format!("{base}.service")
    }
}
