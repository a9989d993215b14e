//! `/nodes/{node}/lxc/...`: list, create, config (read, change, pending), status and power
//! actions, destroy; asynchronous calls answer a UPID and work in a task, as on Proxmox.

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::Method;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};
use crate::node::{ConfigUpdate, CreateRequest, Node, RunState};
use crate::pve::config::{CtConfig, split_list};
use crate::pve::options::{to_conf_value, to_json};
use crate::pve::perms::check_modify;

use super::App;
use super::http::Reply;
use super::router::{Ctx, subdirs};

/// Routes `rest` (the path below `/nodes/{node}`), or `None` when no handler matches.
pub fn route(app: &App, ctx: &Ctx, rest: &[&str]) -> Option<ApiResult<Reply>> {
    let m = &ctx.method;
    Some(match (m, rest) {
        (&Method::GET, ["lxc"]) => list(app),
        (&Method::POST, ["lxc"]) => create(app, ctx),
        (&Method::GET, ["lxc", _]) => Ok(subdirs(&["config", "pending", "status"])),
        (&Method::DELETE, ["lxc", _]) => destroy(app, ctx),
        (&Method::GET, ["lxc", _, "config"]) => get_config(app, ctx),
        (&Method::PUT, ["lxc", _, "config"]) => put_config(app, ctx),
        (&Method::GET, ["lxc", _, "pending"]) => pending(app, ctx),
        (&Method::GET, ["lxc", _, "status"]) => {
            Ok(subdirs(&["current", "start", "stop", "shutdown", "reboot"]))
        }
        (&Method::GET, ["lxc", _, "status", "current"]) => current(app, ctx),
        (&Method::POST, ["lxc", _, "status", action]) => power(app, ctx, action),
        _ => return None,
    })
}

fn vmid(ctx: &Ctx) -> ApiResult<u32> {
    let mut p = ctx.params.clone();
    if !p.0.contains_key("vmid")
        && let Some(v) = ctx.segs.get(3)
    {
        p.0.insert("vmid".into(), json!(v));
    }
    p.vmid()
}

/// The container's summary as `GET .../lxc` and `status/current` report it.
fn summary(node: &Node, vmid: u32, conf: &CtConfig) -> Value {
    let state = node.state(vmid);
    let mb = |k: &str, d: u64| conf.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(d) << 20;
    let cpus: f64 = conf
        .get("cores")
        .and_then(|c| c.parse().ok())
        .unwrap_or(1.0);
    let maxdisk = conf
        .get("rootfs")
        .and_then(|r| crate::pve::propstr::parse(&crate::pve::propstr::ROOTFS, r).ok())
        .and_then(|m| {
            m.get("size")
                .and_then(|s| crate::pve::propstr::parse_size(s))
        })
        .unwrap_or(0);
    let mut v = json!({
        "vmid": vmid, "type": "lxc", "name": conf.get("hostname").map_or(format!("CT{vmid}"), str::to_string),
        "status": if matches!(state, RunState::Running(_)) { "running" } else { "stopped" },
        "maxmem": mb("memory", 512), "maxswap": mb("swap", 512), "maxdisk": maxdisk, "cpus": cpus,
        "cpu": 0, "mem": 0, "swap": 0, "disk": 0, "uptime": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
    });
    if let RunState::Running(pid) = state {
        v["pid"] = json!(pid);
        v["uptime"] = json!(uptime_of(pid));
        let usage = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory/lxc.payload.{vmid}/memory.usage_in_bytes"
        ))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
        v["mem"] = json!(usage);
    }
    if let Some(l) = conf.lock() {
        v["lock"] = json!(l);
    }
    if let Some(t) = conf.get("tags") {
        v["tags"] = json!(t);
    }
    if conf.get("template") == Some("1") {
        v["template"] = json!(1);
    }
    v
}

fn uptime_of(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let start: u64 = after
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let up: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (up as u64).saturating_sub(start / hz)
}

fn list(app: &App) -> ApiResult<Reply> {
    let mut out = Vec::new();
    for vmid in app.node.list() {
        if let Ok(conf) = app.node.load(vmid) {
            out.push(summary(&app.node, vmid, &conf));
        }
    }
    Ok(Reply::data(Value::Array(out)))
}

fn current(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    let conf = app.node.load(vmid)?;
    let mut v = summary(&app.node, vmid, &conf);
    v["ha"] = json!({ "managed": 0 });
    Ok(Reply::data(v))
}

/// Parameters that steer the create call rather than land in the config.
const CREATE_ONLY: &[&str] = &[
    "node",
    "vmid",
    "ostemplate",
    "password",
    "ssh-public-keys",
    "start",
    "storage",
    "unprivileged",
    "pool",
    "force",
    "restore",
    "unique",
    "ignore-unpack-errors",
    "bwlimit",
    "ha-managed",
];

fn create(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let p = &ctx.params;
    let vmid = p.vmid()?;
    let ostemplate = p.str("ostemplate").ok_or_else(|| {
        ApiError::param("ostemplate", "property is missing and it is not optional")
    })?;
    let unprivileged = p.bool("unprivileged")?.unwrap_or(true);
    let start = p.bool("start")?.unwrap_or(false);
    if p.bool("restore")?.unwrap_or(false) {
        return Err(ApiError::die("lab: restore is not supported"));
    }
    let options: BTreeMap<String, String> =
        p.0.iter()
            .filter(|(k, _)| !CREATE_ONLY.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), to_conf_value(v)))
            .collect();
    crate::pve::options::check_types(&options)?;
    ctx.user.check(&format!("/vms/{vmid}"), &["VM.Allocate"])?;
    if !unprivileged {
        ctx.user.check("/", &["Sys.Modify"])?;
    }
    check_modify(&ctx.user, vmid, None, &options, &[], unprivileged)?;
    // vmids are unique cluster-wide (`check_vmid_unused` reads the cluster's vmlist).
    if let Some(other) = app
        .members
        .iter()
        .find(|m| m.node.lab.node != app.node.lab.node && m.node.exists(vmid))
    {
        return Err(ApiError::die(format!(
            "unable to create CT {vmid} - VM {vmid} already exists on node '{}'",
            other.node.lab.node
        )));
    }
    let req = CreateRequest {
        vmid,
        ostemplate,
        options,
        unprivileged,
        ssh_public_keys: p.str("ssh-public-keys"),
        password: p.str("password"),
        storage: p.str("storage").unwrap_or_else(|| "local".into()),
    };
    let template = app.node.create_prepare(&req)?;
    let node = app.node.clone();
    let upid = spawn(app, ctx, "vzcreate", vmid, move |log| {
        node.create_run(&req, &template, log)?;
        if start {
            node.start(req.vmid, log)?;
        }
        Ok(())
    });
    Ok(Reply::data(json!(upid)))
}

fn spawn<F>(app: &App, ctx: &Ctx, kind: &str, vmid: u32, work: F) -> String
where
    F: FnOnce(&(dyn Fn(&str) + Sync)) -> ApiResult<()> + Send + 'static,
{
    Arc::clone(&app.tasks).spawn(
        kind,
        &vmid.to_string(),
        &ctx.user.authid(),
        ctx.task_fault.clone(),
        Some(app.node.lab.lock_path(vmid)),
        work,
    )
}

fn destroy(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    ctx.user.check(&format!("/vms/{vmid}"), &["VM.Allocate"])?;
    app.node.destroy_check(vmid)?;
    let node = app.node.clone();
    let upid = spawn(app, ctx, "vzdestroy", vmid, move |log| {
        node.destroy(vmid, log)
    });
    Ok(Reply::data(json!(upid)))
}

fn power(app: &App, ctx: &Ctx, action: &str) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    let priv_ =
        if action == "start" || action == "stop" || action == "shutdown" || action == "reboot" {
            "VM.PowerMgmt"
        } else {
            return Err(ApiError::new(
                501,
                format!("Method 'POST /{}' not implemented", ctx.segs.join("/")),
            ));
        };
    ctx.user.check(&format!("/vms/{vmid}"), &[priv_])?;
    app.node.load(vmid)?;
    let running = app.node.is_running(vmid);
    let timeout = ctx.params.int("timeout")?.unwrap_or(60).max(0) as u64;
    let force = ctx.params.bool("forceStop")?.unwrap_or(false);
    let node = app.node.clone();
    let upid = match action {
        "start" => {
            if running {
                return Err(ApiError::die(format!("CT {vmid} already running")));
            }
            spawn(app, ctx, "vzstart", vmid, move |log| node.start(vmid, log))
        }
        "stop" | "shutdown" if !running => {
            return Err(ApiError::die(format!("CT {vmid} not running")));
        }
        "stop" => spawn(app, ctx, "vzstop", vmid, move |log| node.stop(vmid, log)),
        "shutdown" => spawn(app, ctx, "vzshutdown", vmid, move |log| {
            node.shutdown(vmid, timeout, force, log)
        }),
        _ => {
            // Proxmox's reboot says "VM", not "CT", here.
            if !running {
                return Err(ApiError::die(format!("VM {vmid} not running")));
            }
            spawn(app, ctx, "vzreboot", vmid, move |log| {
                node.reboot(vmid, timeout, log)
            })
        }
    };
    Ok(Reply::data(json!(upid)))
}

/// Config as JSON: typed values, `description`, `lxc` pairs and `digest`.
fn config_json(
    props: &BTreeMap<String, String>,
    conf: &CtConfig,
    lxc: &[(String, String)],
) -> Value {
    let mut obj = Map::new();
    for (k, v) in props {
        obj.insert(k.clone(), to_json(k, v));
    }
    if !lxc.is_empty() {
        obj.insert(
            "lxc".into(),
            json!(
                lxc.iter()
                    .map(|(k, v)| vec![k.clone(), v.clone()])
                    .collect::<Vec<_>>()
            ),
        );
    }
    obj.insert("digest".into(), json!(conf.digest));
    Value::Object(obj)
}

fn get_config(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    ctx.user.check(&format!("/vms/{vmid}"), &["VM.Audit"])?;
    let conf = app.node.load(vmid)?;
    if let Some(snap) = ctx.params.str("snapshot") {
        let s = conf
            .snapshots
            .get(&snap)
            .ok_or_else(|| ApiError::die(format!("snapshot '{snap}' does not exist")))?;
        return Ok(Reply::data(config_json(&s.props, &conf, &s.lxc)));
    }
    let mut props = conf.main.props.clone();
    if !ctx.params.bool("current")?.unwrap_or(false) {
        for (k, v) in &conf.pending.props {
            if k != "delete" {
                props.insert(k.clone(), v.clone());
            }
        }
        for k in conf.pending_delete() {
            props.remove(&k);
        }
    }
    Ok(Reply::data(config_json(&props, &conf, &conf.main.lxc)))
}

fn put_config(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    let p = &ctx.params;
    let mut set = BTreeMap::new();
    for (k, v) in &p.0 {
        if !["node", "vmid", "delete", "revert", "digest"].contains(&k.as_str()) {
            set.insert(k.clone(), to_conf_value(v));
        }
    }
    let delete = split_list(&p.str("delete").unwrap_or_default());
    let revert = split_list(&p.str("revert").unwrap_or_default());
    for k in &delete {
        if set.contains_key(k) {
            return Err(ApiError::param(
                "delete",
                format!("you can't use '-{k}' and -delete {k}' at the same time"),
            ));
        }
    }
    crate::pve::options::check_types(&set)?;
    let conf = app.node.load(vmid)?;
    let unprivileged = conf.get("unprivileged") == Some("1");
    // As `PUT .../config`: the delete list, the revert list, then the new values.
    crate::pve::perms::Modify {
        vmid,
        oldconf: Some(&conf.main.props),
        unprivileged,
        version: crate::pve::Version::Pve9,
    }
    .check_update(&ctx.user, &ctx.user, &set, &delete, &revert)?;
    let upd = ConfigUpdate {
        set,
        delete,
        revert,
        digest: p.str("digest"),
    };
    app.node.update_config(vmid, &upd, &|_| {})?;
    Ok(Reply::data(Value::Null))
}

fn pending(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let vmid = vmid(ctx)?;
    ctx.user.check(&format!("/vms/{vmid}"), &["VM.Audit"])?;
    let conf = app.node.load(vmid)?;
    let deletes = conf.pending_delete();
    let mut keys: Vec<&String> = conf
        .main
        .props
        .keys()
        .chain(conf.pending.props.keys())
        .collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        if k == "delete" {
            continue;
        }
        let mut item = json!({ "key": k });
        if let Some(v) = conf.main.props.get(k) {
            item["value"] = json!(v);
        }
        if let Some(v) = conf.pending.props.get(k) {
            item["pending"] = json!(v);
        }
        if deletes.contains(k) {
            item["delete"] = json!(1);
        }
        out.push(item);
    }
    Ok(Reply::data(Value::Array(out)))
}
