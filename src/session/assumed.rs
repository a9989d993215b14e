//! What a plan assumes of a node, checked against the node before anything changes: the
//! storage a container's root filesystem goes to exists there and holds container volumes
//! (`local-zfs` exists only on ZFS-root installs), and each bind mount's host directory is
//! there (a missing one makes the container's start fail), unless the node's own model
//! storage makes it earlier in the same apply. Read with the node's API
//! (`GET /nodes/{node}/storage`) and its SSH (`test -d`, one round trip per node).

use super::{Api, Session, SessionError};
use crate::diagnostic::Diagnostic;
use crate::inventory::Loaded;
use crate::node::NodeError;
use crate::plan::{Action, Plan, Target};
use crate::resources::ResourceSpec;

/// Refuses the plan, naming each value, when a container it creates or changes assumes a
/// storage or a host directory its node does not have.
pub(super) fn refuse_missing<A: Api>(
    plan: &Plan,
    loaded: &Loaded,
    conns: &Session<'_, A>,
) -> Result<(), SessionError> {
    let printer = conns.printer;
    let mut missing: Vec<(crate::inventory::Pos, String, String)> = Vec::new();
    for t in &plan.targets {
        let Target::Container { node, name, .. } = &t.target else {
            continue;
        };
        let Some(inv) = loaded.inventory.nodes.get(node.as_str()) else {
            continue;
        };
        let Some(ct) = inv.containers.get(name.as_str()) else {
            continue;
        };
        let creates = t.changes.iter().any(|c| {
            matches!(c.spec, ResourceSpec::Container(_))
                && matches!(c.action, Action::Create | Action::Replace)
        });
        let touches = t.changes.iter().any(|c| {
            matches!(
                c.spec,
                ResourceSpec::Container(_) | ResourceSpec::PveLines(_)
            )
        });
        if creates {
            let api = conns.api_reader(node)?;
            let data = api.get(&api.node_path("/storage"), &[])?;
            let storages: Vec<(String, String)> = data
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| {
                    Some((
                        s["storage"].as_str()?.to_string(),
                        s["content"].as_str().unwrap_or("").to_string(),
                    ))
                })
                .collect();
            let want = ct.rootfs.storage.as_str();
            let for_ct: Vec<&str> = storages
                .iter()
                .filter(|(_, c)| c.split(',').any(|c| c == "rootdir"))
                .map(|(s, _)| s.as_str())
                .collect();
            match storages.iter().find(|(s, _)| s == want) {
                None => missing.push((
                    ct.rootfs.storage.pos,
                    format!("storage `{want}` does not exist on node `{node}`"),
                    format!(
                        "storages there that hold containers: {} (`local-zfs` exists only on ZFS-root installs, `local-lvm` on LVM ones)",
                        for_ct.join(", ")
                    ),
                )),
                Some((_, content)) if !content.split(',').any(|c| c == "rootdir") => missing.push((
                    ct.rootfs.storage.pos,
                    format!("storage `{want}` on node `{node}` does not hold container volumes (content: {content})"),
                    format!("storages there that do: {}", for_ct.join(", ")),
                )),
                Some(_) => {}
            }
        }
        if !touches || ct.mounts.is_empty() {
            continue;
        }
        // The node's model storage is made (a directory, or a dataset mounted) by the
        // node's own steps, which run before the container's.
        let made = inv.model_storage.as_ref().map(|m| m.path.to_string());
        let paths: Vec<&crate::inventory::container::Mount> = ct
            .mounts
            .iter()
            .filter(|m| made.as_deref() != Some(m.host.as_str()))
            .collect();
        if paths.is_empty() {
            continue;
        }
        if inv.ssh.host.is_none() {
            printer.warn(&format!(
                "container.{name}: the bind mounts' host directories were not checked (node `{node}` has no `ssh:`)"
            ));
            continue;
        }
        let dirs: Vec<&str> = paths.iter().map(|m| m.host.as_str()).collect();
        // A node whose SSH is not needed for this plan (root@pam's password writes bind
        // mounts through the API) and does not answer is said so, not made fatal.
        let probe = match conns.node_probe(node) {
            Ok(probe) => probe,
            Err(e) => {
                printer.warn(&format!(
                    "container.{name}: the bind mounts' host directories were not checked (node `{node}`'s SSH: {})",
                    crate::diagnostic::one_line(&e)
                ));
                continue;
            }
        };
        let absent = match probe.missing_dirs(&dirs) {
            Ok(absent) => absent,
            Err(NodeError::Transport(e)) => {
                printer.warn(&format!(
                    "container.{name}: the bind mounts' host directories were not checked (node `{node}`'s SSH: {})",
                    crate::diagnostic::one_line(&e)
                ));
                continue;
            }
            Err(e) => {
                return Err(Diagnostic::new(format!(
                    "cannot check the bind mounts' host directories on node `{node}`"
                ))
                .cause(e.to_string())
                .into());
            }
        };
        for m in paths {
            if absent.iter().any(|a| a == m.host.as_str()) {
                missing.push((
                    m.host.pos,
                    format!("host directory {} does not exist on node `{node}`", m.host.value),
                    "make it on the node (or declare it as the node's `model_storage`, which provision makes), else the container's start fails".into(),
                ));
            }
        }
    }
    let Some((pos, message, hint)) = missing.first().cloned() else {
        return Ok(());
    };
    let mut d = loaded.diag(pos, message).hint(hint);
    for (_, m, h) in &missing[1..] {
        d = d.cause(format!("also: {m} ({h})"));
    }
    Err(d
        .hint("nothing was changed: the plan is checked against the node first")
        .into())
}
