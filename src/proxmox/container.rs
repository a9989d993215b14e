//! A container through its node's API: read (list, config, pending: 3 calls, plus `/version`
//! once per node) and write (create, `PUT config` guarded by `digest`, start, reboot,
//! destroy for an allowed replace). Every write is read back and compared again.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::client::{ApiReader, NodeApi};
use super::error::ProxmoxError;
use super::tasks::follow;
use crate::plan::Action;
use crate::resources::Delta;
use crate::resources::container::PveContainerFact;
use crate::resources::container::{
    ContainerSpec, RestartPolicy, marker_created, marker_description, marker_template,
};
use crate::resources::op::Deadline;

/// How often a write whose config changed underneath is re-read and re-planned.
const REPLAN_ATTEMPTS: usize = 3;

/// Why a container change failed or was refused.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// The API failed.
    #[error(transparent)]
    Api(#[from] ProxmoxError),
    /// The vmid is held by a container with another name.
    #[error(
        "CT {vmid} on node `{node}` is `{found}`, not `{wanted}`: the vmid is taken by another container\nhint: pick a free vmid for `{wanted}`, or set its hostname to `{found}` to adopt that container"
    )]
    VmidTaken {
        /// The vmid.
        vmid: u64,
        /// The node.
        node: String,
        /// Hostname found.
        found: String,
        /// Hostname wanted.
        wanted: String,
    },
    /// The change needs root@pam and the node is reached with a token.
    #[error(
        "CT {vmid} on node `{node}`: {reason}\nhint: API tokens (even root's) may not do this; give the node `ssh: {{ host: ..., identity_file: ... }}` (root) so these are written over node SSH with `pct set`, or reference root@pam's password in the node's `api:` (`password: {{ env: PVE_ROOT_PASSWORD }}`) so provision logs in with a ticket"
    )]
    RootOnly {
        /// The vmid.
        vmid: u64,
        /// The node.
        node: String,
        /// Proxmox's reason.
        reason: String,
    },
    /// A create that failed left its locked config behind.
    #[error(
        "CT {vmid} on node `{node}` is locked by a failed create (`lock: create`)\nhint: remove what is left with `pct destroy {vmid}` on the node, then apply again"
    )]
    FailedCreate {
        /// The vmid.
        vmid: u64,
        /// The node.
        node: String,
    },
    /// A replace was planned but not allowed.
    #[error(
        "CT {0} must be replaced (a create-only setting changed) and --allow-replace was not given; nothing was changed\nhint: the container's own volumes are destroyed, host bind mounts are kept; run `provision apply --allow-replace` to go ahead"
    )]
    ReplaceRefused(u64),
    /// After the write the container still differs.
    #[error("CT {vmid} still differs after apply: {what}")]
    NotConverged {
        /// The vmid.
        vmid: u64,
        /// What still differs.
        what: String,
    },
    /// The change cannot be made through the API (yet).
    #[error("CT {vmid}: {what}")]
    Unsupported {
        /// The vmid.
        vmid: u64,
        /// What.
        what: String,
    },
}

/// The node's containers (`GET /nodes/{node}/lxc`): vmid → (name, running). One call serves
/// every container of the node.
pub fn list(api: &ApiReader) -> Result<BTreeMap<u64, (String, bool)>, ProxmoxError> {
    let data = api.get(&api.node_path("/lxc"), &[])?;
    let mut out = BTreeMap::new();
    for ct in data.as_array().into_iter().flatten() {
        let vmid = match &ct["vmid"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        if let Some(vmid) = vmid {
            let name = ct["name"].as_str().unwrap_or("").to_string();
            out.insert(vmid, (name, ct["status"] == "running"));
        }
    }
    Ok(out)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => if *b { "1" } else { "0" }.to_string(),
        other => other.to_string(),
    }
}

/// Reads one container that `list` says exists: its config (digest, raw `lxc.*` lines) and
/// its pending values.
pub fn read(api: &ApiReader, vmid: u64, running: bool) -> Result<PveContainerFact, ProxmoxError> {
    read_on(api, &api.node, vmid, running)
}

/// [`read`] of a container on node `node` of `api`'s cluster (any member's API reaches
/// every node).
pub fn read_on(
    api: &ApiReader,
    node: &str,
    vmid: u64,
    running: bool,
) -> Result<PveContainerFact, ProxmoxError> {
    let mut fact = read_config(api, node, vmid, running)?;
    read_pending(api, node, vmid, &mut fact)?;
    Ok(fact)
}

/// The config half of [`read_on`]: the current values, the digest and the raw `lxc.*`
/// lines (one call), no pending values.
fn read_config(
    api: &ApiReader,
    node: &str,
    vmid: u64,
    running: bool,
) -> Result<PveContainerFact, ProxmoxError> {
    let conf = api.get(
        &format!("/nodes/{node}/lxc/{vmid}/config"),
        &[("current", "1")],
    )?;
    let mut fact = PveContainerFact {
        running,
        digest: conf["digest"].as_str().unwrap_or("").to_string(),
        ..Default::default()
    };
    if let Some(obj) = conf.as_object() {
        for (k, v) in obj {
            if k != "digest" && k != "lxc" {
                fact.config.push((k.clone(), text(v)));
            }
        }
        for pair in obj
            .get("lxc")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(k), Some(v)) = (pair[0].as_str(), pair[1].as_str()) {
                fact.config.push((k.to_string(), v.to_string()));
            }
        }
    }
    Ok(fact)
}

/// The pending half of [`read_on`]: the values set and deleted that wait for a restart.
fn read_pending(
    api: &ApiReader,
    node: &str,
    vmid: u64,
    fact: &mut PveContainerFact,
) -> Result<(), ProxmoxError> {
    let pending = api.get(&format!("/nodes/{node}/lxc/{vmid}/pending"), &[])?;
    for item in pending.as_array().into_iter().flatten() {
        let Some(key) = item["key"].as_str() else {
            continue;
        };
        if let Some(p) = item.get("pending") {
            fact.pending.insert(key.to_string(), text(p));
        }
        if item.get("delete").is_some_and(|d| text(d) != "0") {
            fact.pending_delete.push(key.to_string());
        }
    }
    Ok(())
}

/// How long a create task found running is waited for.
const CREATE_WAIT: Duration = Duration::from_secs(600);

/// The UPID of a create task for `vmid` that has not ended, if any.
fn running_create(api: &ApiReader, vmid: u64) -> Result<Option<String>, ProxmoxError> {
    let id = vmid.to_string();
    let tasks = api.get(
        &api.node_path("/tasks"),
        &[("vmid", id.as_str()), ("source", "active")],
    )?;
    Ok(tasks
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            t["type"] == "vzcreate" && t.get("endtime").is_none() && t.get("status").is_none()
        })
        .find_map(|t| t["upid"].as_str().map(str::to_string)))
}

/// Reads the container `spec` wants: `None` when its vmid is free; an error when another
/// container (by hostname) holds it, unless provision created it (then the name changes).
pub fn read_for(
    api: &ApiReader,
    spec: &ContainerSpec,
    listing: &BTreeMap<u64, (String, bool)>,
) -> Result<Option<PveContainerFact>, ContainerError> {
    let Some((name, running)) = listing.get(&spec.vmid) else {
        if !api.ticket {
            root_only(api, spec, None)?;
        }
        return Ok(None);
    };
    let mut fact = read(api, spec.vmid, *running)?;
    if fact.current("lock") == Some("create")
        && let Some(upid) = running_create(api, spec.vmid)?
    {
        // A create still running, started by an apply that was interrupted: the node
        // finishes it regardless, so its end is waited for (a failed one is reported with
        // its log) and the container read again.
        follow(api, &Value::String(upid), Deadline::after(CREATE_WAIT))?;
        let running = list(api)?.get(&spec.vmid).is_some_and(|(_, r)| *r);
        fact = read(api, spec.vmid, running)?;
    }
    if fact.current("lock") == Some("create") {
        return Err(ContainerError::FailedCreate {
            vmid: spec.vmid,
            node: api.label.clone(),
        });
    }
    let wanted = spec.get("hostname").unwrap_or_default();
    if name != wanted && marker_template(&fact).is_none() {
        return Err(ContainerError::VmidTaken {
            vmid: spec.vmid,
            node: api.label.clone(),
            found: name.clone(),
            wanted: wanted.to_string(),
        });
    }
    if !api.ticket {
        root_only(api, spec, Some(&fact))?;
    }
    Ok(Some(fact))
}

/// Refuses, before anything changes, what only root@pam may write (bind mounts, device
/// passthrough, features other than nesting), by Proxmox's own rules (`pve::perms`).
fn root_only(
    api: &ApiReader,
    spec: &ContainerSpec,
    found: Option<&PveContainerFact>,
) -> Result<(), ContainerError> {
    let delta = match found {
        None => Some(spec.create_delta()),
        Some(f) => spec.update_delta(f),
    };
    let Some(delta) = delta else {
        return Ok(());
    };
    let mut newconf = BTreeMap::new();
    let mut delete = Vec::new();
    for a in &delta.attributes {
        if let Some((k, _)) = spec.config.iter().find(|(k, _)| *k == a.name) {
            match &a.after {
                Some(v) => {
                    newconf.insert(k.clone(), v.clone());
                }
                None => delete.push(k.clone()),
            }
        }
    }
    let old: Option<BTreeMap<String, String>> = found.map(|f| f.config.iter().cloned().collect());
    let token = pve::perms::AuthUser {
        userid: "root@pam".into(),
        token: Some("provision".into()),
    };
    let unprivileged = spec.get("unprivileged") != Some("0");
    // One call of `check_ct_modify_config_perm`, with root's token's privileges (all) and
    // the node's version's rules.
    pve::perms::Modify {
        vmid: spec.vmid as u32,
        oldconf: old.as_ref(),
        unprivileged,
        version: api.rules(),
    }
    .check(&token, &pve::perms::AllPrivileges, &newconf, &delete)
    .map_err(|e| {
        // Names the steps that cannot run, not only Proxmox's first refusal.
        let steps: Vec<String> = spec
            .root_only_keys()
            .iter()
            .filter(|k| newconf.contains_key(*k))
            .map(|k| format!("{k} = {}", newconf[k]))
            .collect();
        ContainerError::RootOnly {
            vmid: spec.vmid,
            node: api.label.clone(),
            reason: if steps.is_empty() {
                e.message
            } else {
                format!(
                    "{}; root-only step(s) that cannot run with a token and no node SSH: {}",
                    e.message,
                    steps.join(", ")
                )
            },
        }
    })
}

/// What one write did, for the apply log.
pub type Done = Vec<String>;

/// What a container write is asked to do (an `ApiOp::Container`'s own fields).
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    /// What the plan says to do.
    pub planned: Action,
    /// Whether a replace may destroy the container.
    pub allow_replace: bool,
    /// Whether the container is started here (else its start follows its root-only lines).
    pub start: bool,
}

/// Carries out `planned` for `spec`: create, replace (only when `allow_replace`), or update
/// in place. Reads the container again first: a config that changed since the plan is planned
/// again, never overwritten; the end state is read back and must match. Without `start`, a
/// created or stopped container is left stopped (root-only lines are written next, then
/// [`start`] runs) and its power state is not verified. Every task it starts ends by
/// `deadline`.
pub fn apply(
    api: &NodeApi,
    spec: &ContainerSpec,
    asked: Asked,
    owner: &str,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let Asked {
        planned,
        allow_replace,
        start,
    } = asked;
    if planned == Action::Replace && !allow_replace {
        return Err(ContainerError::ReplaceRefused(spec.vmid));
    }
    for _ in 0..REPLAN_ATTEMPTS {
        let listing = list(api)?;
        let found = read_for(api, spec, &listing)?;
        let delta = match &found {
            None => Some(spec.create_delta()),
            Some(f) => spec.update_delta(f).filter(|d| start || !only_start(d)),
        };
        let Some(delta) = delta else {
            // Nothing to do through the API: already as declared, or stopped with only its
            // start left, which follows its root-only lines ([`start`]). Still one outcome:
            // an op that reports nothing reads as an apply that stopped short (a kill -9
            // between the create and the lines left such a container).
            let what = match &found {
                Some(f) if spec.update_delta(f).is_some() => format!(
                    "CT {}: nothing to change through the API; it starts after its root-only lines",
                    spec.vmid
                ),
                _ => format!("CT {}: already as declared", spec.vmid),
            };
            log(&what, Duration::ZERO);
            return Ok(());
        };
        let result = match (delta.action, &found) {
            (Action::Create, _) => create(api, spec, start, owner, deadline, log),
            (Action::Replace, Some(f)) => {
                if !allow_replace {
                    return Err(ContainerError::ReplaceRefused(spec.vmid));
                }
                destroy(api, spec.vmid, f.running, &[], deadline, log)?;
                create(api, spec, start, owner, deadline, log)
            }
            (_, Some(f)) => update(api, spec, f, &delta, start, deadline, log),
            (_, None) => create(api, spec, start, owner, deadline, log),
        };
        match result {
            Err(ContainerError::Api(ProxmoxError::Modified { .. })) => continue,
            other => other?,
        }
        return verify(api, spec, start);
    }
    Err(ContainerError::NotConverged {
        vmid: spec.vmid,
        what: "its configuration kept changing underneath (digest mismatch on every attempt)"
            .into(),
    })
}

/// The config keys an update writes, as its delta says.
fn written(d: &Delta) -> &[String] {
    match &d.typed {
        Some(crate::resources::Typed::Container { set, .. }) => set,
        _ => &[],
    }
}

/// Whether a delta only starts the container.
fn only_start(d: &Delta) -> bool {
    matches!(&d.typed, Some(crate::resources::Typed::Container { set, reboot: false, .. }) if set.is_empty())
}

/// Starts container `vmid` when it is stopped; reboots it when it runs and `reboot` (raw
/// `lxc.*` lines and new devices take effect only at a start); fails unless it runs after.
pub fn start(
    api: &NodeApi,
    vmid: u64,
    reboot: bool,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let listing = list(api)?;
    let base = api.node_path(&format!("/lxc/{vmid}"));
    let running = listing.get(&vmid).is_some_and(|(_, r)| *r);
    if !running {
        start_ct(api, &base, vmid, deadline, log)?;
    } else if reboot {
        let what = format!("reboot CT {vmid} so its new root-only lines take effect");
        power(api, &base, "reboot", &what, deadline, log)?;
    } else {
        log(
            &format!(
                "CT {vmid} keeps running: its new root-only lines take effect at its next start (`restart: never`)"
            ),
            Duration::ZERO,
        );
    }
    if !list(api)?.get(&vmid).is_some_and(|(_, r)| *r) {
        return Err(ContainerError::NotConverged {
            vmid,
            what: "it is not running after the start".into(),
        });
    }
    Ok(())
}

/// `POST {base}/status/{action}` followed to its end, logged as `what`.
/// Starts CT `vmid`. A start refused because it already runs counts as done: a start task
/// of an earlier apply (killed while it waited for that task) may have started it since
/// it was read; the state is read back after either way.
fn start_ct(
    api: &NodeApi,
    base: &str,
    vmid: u64,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ProxmoxError> {
    match power(
        api,
        base,
        "start",
        &format!("start CT {vmid}"),
        deadline,
        log,
    ) {
        Err(e) if already_running(&e, vmid) => {
            log(
                &format!(
                    "start CT {vmid}: already running (started by an earlier task since it was read)"
                ),
                Duration::ZERO,
            );
            Ok(())
        }
        other => other,
    }
}

/// Whether `e` is Proxmox refusing to start CT `vmid` because it runs (answered at once,
/// or as the start task's error).
fn already_running(e: &ProxmoxError, vmid: u64) -> bool {
    let refusal = format!("CT {vmid} already running");
    match e {
        ProxmoxError::Task { exitstatus, .. } => exitstatus.contains(&refusal),
        ProxmoxError::Api { message, .. } => message.contains(&refusal),
        _ => false,
    }
}

fn power(
    api: &NodeApi,
    base: &str,
    action: &str,
    what: &str,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ProxmoxError> {
    timed(log, what, || {
        let upid = api.call("POST", &format!("{base}/status/{action}"), &[])?;
        follow(api, &upid, deadline)
    })
}

fn timed<T>(
    log: &mut dyn FnMut(&str, Duration),
    what: &str,
    f: impl FnOnce() -> Result<T, ProxmoxError>,
) -> Result<T, ProxmoxError> {
    let started = std::time::Instant::now();
    let r = f()?;
    log(what, started.elapsed());
    Ok(r)
}

fn create(
    api: &NodeApi,
    spec: &ContainerSpec,
    start: bool,
    owner: &str,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let vmid = spec.vmid.to_string();
    let description = marker_description(
        spec.get("ostemplate").unwrap_or_default(),
        spec.vmid,
        &crate::resources::container::now(),
        owner,
    );
    let keys = spec.ssh_public_keys.join("\n");
    let mut params: Vec<(&str, &str)> = vec![("vmid", &vmid)];
    params.extend(spec.config.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    params.push(("description", &description));
    if !keys.is_empty() {
        params.push(("ssh-public-keys", &keys));
    }
    if start {
        params.push(("start", "1"));
    }
    let what = if start {
        format!("create and start CT {vmid}")
    } else {
        format!("create CT {vmid} (started after its root-only lines)")
    };
    timed(log, &what, || {
        let upid = api.call("POST", &api.node_path("/lxc"), &params)?;
        follow(api, &upid, deadline)
    })?;
    Ok(())
}

/// Stops CT `vmid` when `running`, then `DELETE /nodes/{node}/lxc/{vmid}` with `params`.
/// Proxmox removes the container's own volumes (rootfs, volume mount points, `unusedN`);
/// a bind-mounted host path is never one of them.
fn destroy(
    api: &NodeApi,
    vmid: u64,
    running: bool,
    params: &[(&str, &str)],
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let base = api.node_path(&format!("/lxc/{vmid}"));
    if running {
        power(
            api,
            &base,
            "stop",
            &format!("stop CT {vmid}"),
            deadline,
            log,
        )?;
    }
    timed(
        log,
        &format!("destroy CT {vmid} (its own volumes; host bind mounts kept)"),
        || {
            let upid = api.call("DELETE", &base, params)?;
            follow(api, &upid, deadline)
        },
    )?;
    Ok(())
}

/// The node's containers whose marker says the inventory `owner` created them at their own
/// vmid, from `listing` (each one's config read, 2 calls, but for the vmids in `except`:
/// the inventory's own, which their own reads cover).
pub fn created(
    api: &ApiReader,
    listing: &BTreeMap<u64, (String, bool)>,
    owner: &str,
    except: &[u64],
) -> Result<BTreeMap<u64, PveContainerFact>, ContainerError> {
    let mut out = BTreeMap::new();
    if owner.is_empty() {
        return Ok(out);
    }
    for (vmid, (_, running)) in listing {
        if except.contains(vmid) {
            continue;
        }
        // The config alone says whose it is; only this inventory's are read whole.
        let gone = |e: &ProxmoxError| {
            matches!(e, ProxmoxError::Api { message, .. }
                if message.contains("Configuration file") && message.contains("does not exist"))
        };
        let mut fact = match read_config(api, &api.node, *vmid, *running) {
            // Destroyed since it was listed (Proxmox: "Configuration file ... does not
            // exist"): not there, so nothing to name.
            Err(e) if gone(&e) => continue,
            other => other?,
        };
        if marker_created(&fact, *vmid, owner).is_none() {
            continue;
        }
        match read_pending(api, &api.node, *vmid, &mut fact) {
            Err(e) if gone(&e) => continue,
            other => other?,
        }
        out.insert(*vmid, fact);
    }
    Ok(out)
}

/// Destroys CT `vmid`, a container provision created that is no longer declared
/// (`--allow-destroy`): read again first, and refused unless its marker still names its
/// vmid; stopped, then destroyed with `purge=1` (its backup, replication and HA entries go
/// with it, so a later container at this vmid does not inherit them) and
/// `destroy-unreferenced-disks=0` (a disk of this vmid the config does not name may be
/// someone's data: kept). Read back: it must be gone.
pub fn destroy_undeclared(
    api: &NodeApi,
    vmid: u64,
    owner: &str,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let listing = list(api)?;
    let Some((_, running)) = listing.get(&vmid) else {
        log(&format!("CT {vmid}: already gone"), Duration::ZERO);
        return Ok(());
    };
    let fact = read(api, vmid, *running)?;
    if marker_created(&fact, vmid, owner).is_none() {
        return Err(ContainerError::Unsupported {
            vmid,
            what:
                "its description no longer carries provision's marker for this vmid: not destroyed"
                    .into(),
        });
    }
    let params = [("purge", "1"), ("destroy-unreferenced-disks", "0")];
    destroy(api, vmid, *running, &params, deadline, log)?;
    if list(api)?.contains_key(&vmid) {
        return Err(ContainerError::NotConverged {
            vmid,
            what: "it is still listed after its destroy task ended".into(),
        });
    }
    Ok(())
}

fn update(
    api: &NodeApi,
    spec: &ContainerSpec,
    found: &PveContainerFact,
    delta: &Delta,
    start: bool,
    deadline: Deadline,
    log: &mut dyn FnMut(&str, Duration),
) -> Result<(), ContainerError> {
    let vmid = spec.vmid;
    let base = api.node_path(&format!("/lxc/{vmid}"));
    if let Some(a) = delta.attributes.iter().find(|a| a.name == "rootfs") {
        return Err(ContainerError::Unsupported {
            vmid,
            what: format!(
                "the root filesystem would change from {} to {}: growing it (`resize`) is not built",
                a.before.as_deref().unwrap_or("?"),
                a.after.as_deref().unwrap_or("?")
            ),
        });
    }
    let config: Vec<&crate::plan::Attribute> = delta
        .attributes
        .iter()
        .filter(|a| written(delta).contains(&a.name))
        .collect();
    if !config.is_empty() {
        let delete: Vec<&str> = config
            .iter()
            .filter(|a| a.after.is_none())
            .map(|a| a.name.as_str())
            .collect();
        let delete = delete.join(",");
        let mut params: Vec<(&str, &str)> = config
            .iter()
            .filter_map(|a| a.after.as_deref().map(|v| (a.name.as_str(), v)))
            .collect();
        if !delete.is_empty() {
            params.push(("delete", &delete));
        }
        params.push(("digest", &found.digest));
        let names: Vec<&str> = config.iter().map(|a| a.name.as_str()).collect();
        timed(
            log,
            &format!("set {} on CT {vmid}", names.join(", ")),
            || {
                api.call("PUT", &format!("{base}/config"), &params)
                    .map(drop)
            },
        )?;
    }
    if !found.running && !start {
        return Ok(());
    }
    if !found.running {
        start_ct(api, &base, vmid, deadline, log)?;
        return Ok(());
    }
    if spec.restart == RestartPolicy::Allowed {
        let after = read(api, vmid, true)?;
        if !after.pending.is_empty() || !after.pending_delete.is_empty() {
            let what = format!("reboot CT {vmid} to apply pending changes");
            power(api, &base, "reboot", &what, deadline, log)?;
        }
    }
    Ok(())
}

/// Reads the container back: anything still differing is an error.
fn verify(api: &NodeApi, spec: &ContainerSpec, start: bool) -> Result<(), ContainerError> {
    let listing = list(api)?;
    let Some(found) = read_for(api, spec, &listing)? else {
        return Err(ContainerError::NotConverged {
            vmid: spec.vmid,
            what: "it does not exist".into(),
        });
    };
    match spec
        .update_delta(&found)
        .filter(|d| start || !only_start(d))
    {
        None => Ok(()),
        Some(d) => Err(ContainerError::NotConverged {
            vmid: spec.vmid,
            what: d
                .attributes
                .iter()
                .map(|a| {
                    format!(
                        "{}: {} instead of {}",
                        a.name,
                        a.before.as_deref().unwrap_or("absent"),
                        a.after.as_deref().unwrap_or("absent")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        }),
    }
}
