//! What an API token may do, read from the node before anything changes. A
//! privilege-separated token (Proxmox's default for a new one) holds only the ACLs granted
//! to the token itself, not its user's: creating a privileged container with it is a 403
//! (`Sys.Modify` on `/`), as is anything its ACLs leave out. `plan` asks the node
//! (`GET /access/permissions?path=P`, one call per path, only for a container it changes)
//! and names each privilege the plan needs that the token lacks, with the rule from
//! pve-container's `create_vm` and `check_ct_modify_config_perm`.

use std::collections::BTreeMap;

use super::{Api, Session, SessionError};
use crate::inventory::Loaded;
use crate::plan::{Action, Plan, Target};
use crate::resources::ResourceSpec;

/// One privilege a change needs: path, privilege (any of several), why.
type Need = (String, Vec<&'static str>, String);

/// Refuses the plan when a node reached with an API token lacks a privilege one of its
/// container changes needs.
pub(super) fn refuse_missing<A: Api>(
    plan: &Plan,
    loaded: &Loaded,
    conns: &Session<'_, A>,
) -> Result<(), SessionError> {
    let mut lacking: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in &plan.targets {
        let Target::Container { node, vmid, .. } = &t.target else {
            continue;
        };
        let Some(inv) = loaded.inventory.nodes.get(node.as_str()) else {
            continue;
        };
        if inv.api.token.is_none() || inv.api.password.is_some() {
            continue;
        }
        let needs: Vec<Need> = t
            .changes
            .iter()
            .filter_map(|c| match &c.spec {
                ResourceSpec::Container(spec) => Some(needs(*vmid, c.action, spec, c)),
                _ => None,
            })
            .flatten()
            .collect();
        if needs.is_empty() {
            continue;
        }
        let api = conns.api_reader(node)?;
        let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (path, privs, why) in needs {
            if !held.contains_key(&path) {
                let data = api.get("/access/permissions", &[("path", &path)])?;
                let privs = data[&path]
                    .as_object()
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                held.insert(path.clone(), privs);
            }
            if !privs.iter().any(|p| held[&path].iter().any(|h| h == p)) {
                let line = format!("{} on {path} ({why})", privs.join(" or "));
                let list = lacking.entry(node.clone()).or_default();
                if !list.contains(&line) {
                    list.push(line);
                }
            }
        }
    }
    let Some((node, missing)) = lacking.into_iter().next() else {
        return Ok(());
    };
    let token = loaded.inventory.nodes[node.as_str()]
        .api
        .token
        .as_ref()
        .expect("only token nodes are checked");
    let mut d = loaded.diag(
        token.pos,
        format!(
            "the API token of node `{node}` lacks {} privilege(s) this plan needs: Proxmox would answer 403",
            missing.len()
        ),
    );
    for m in &missing {
        d = d.cause(m.clone());
    }
    Err(d
        .hint("a privilege-separated token (Proxmox's default) holds only the ACLs granted to the token itself: grant these to it (`pveum acl modify PATH --tokens 'USER@REALM!TOKEN' --roles ROLE`), make it with `--privsep 0` to give it its user's privileges, or log in as root@pam (`password: { env: PVE_ROOT_PASSWORD }`)")
        .hint("nothing was changed: the token's privileges were read from the node (GET /access/permissions)")
        .into())
}

/// What one container change needs: `create_vm`'s checks for a create, the options'
/// privileges for an update, `VM.PowerMgmt` to start. Options written as node steps (over
/// node SSH as root) need nothing of the token.
fn needs(
    vmid: u64,
    action: Action,
    spec: &crate::resources::container::ContainerSpec,
    change: &crate::plan::Change,
) -> Vec<Need> {
    let vm = format!("/vms/{vmid}");
    let mut out: Vec<Need> = Vec::new();
    let option = |k: &str| -> Need {
        (
            vm.clone(),
            vec![pve::perms::config_privilege(k)],
            format!("`{k}`"),
        )
    };
    match action {
        Action::Create | Action::Replace => {
            out.push((
                vm.clone(),
                vec!["VM.Allocate"],
                "create the container".into(),
            ));
            if spec.get("unprivileged") == Some("0") {
                out.push((
                    "/".into(),
                    vec!["Sys.Modify"],
                    "create a privileged container: `unprivileged: false`".into(),
                ));
            }
            if let Some(storage) = spec.get("rootfs").and_then(|r| r.split(':').next()) {
                out.push((
                    format!("/storage/{storage}"),
                    vec!["Datastore.AllocateSpace"],
                    "its root filesystem".into(),
                ));
            }
            if let Some(storage) = spec.get("ostemplate").and_then(|r| r.split(':').next()) {
                out.push((
                    format!("/storage/{storage}"),
                    vec!["Datastore.AllocateSpace", "Datastore.Audit"],
                    "read its template".into(),
                ));
            }
            for (k, _) in &spec.config {
                if !["ostemplate", "unprivileged"].contains(&k.as_str()) {
                    out.push(option(k));
                }
            }
            out.push((vm.clone(), vec!["VM.PowerMgmt"], "start it".into()));
        }
        Action::Update => {
            let Some(crate::resources::Typed::Container { set, start, .. }) = &change.typed else {
                return out;
            };
            for k in set {
                if spec.config.iter().any(|(key, _)| key == k) {
                    out.push(option(k));
                }
            }
            if *start {
                out.push((vm.clone(), vec!["VM.PowerMgmt"], "start it".into()));
            }
        }
        _ => {}
    }
    out
}
