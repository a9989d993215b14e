//! `GET /version`, `GET /cluster/nextid`, `GET /cluster/resources`, `GET /nodes`.

use serde_json::json;

use crate::error::{ApiError, ApiResult};

use super::App;
use super::http::Reply;
use super::router::Ctx;

/// The Proxmox VE release the lab answers as (that of the schema it is checked against).
pub const VERSION: &str = "9.1.3";

/// `GET /version`.
pub fn version() -> ApiResult<Reply> {
    Ok(Reply::data(
        json!({ "version": VERSION, "release": "9.1", "repoid": "provision-lab" }),
    ))
}

/// `GET /cluster/nextid`: the lowest free id from 100, or a check of the given one.
/// Proxmox answers it as a string, and so does the lab.
pub fn nextid(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    if let Some(v) = ctx.params.int("vmid")? {
        let used = u32::try_from(v).is_ok_and(|v| app.members.iter().any(|m| m.node.exists(v)));
        if used {
            return Err(ApiError::param("vmid", format!("VM {v} already exists")));
        }
        return Ok(Reply::data(json!(v.to_string())));
    }
    let mut used: Vec<u32> = app.members.iter().flat_map(|m| m.node.list()).collect();
    used.sort_unstable();
    let free = (100u32..)
        .find(|id| used.binary_search(id).is_err())
        .expect("some id is free");
    Ok(Reply::data(json!(free.to_string())))
}

fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
        * 1024
}

/// `GET /cluster/resources` (type `vm` or none): every node's containers, with the node
/// each is on, as a cluster lists them; and the nodes themselves for type `node` or none.
pub fn resources(app: &App, ctx: &Ctx) -> ApiResult<Reply> {
    let kind = ctx.params.str("type");
    let mut out = Vec::new();
    for m in app.members.iter() {
        let name = &m.node.lab.node;
        if kind.as_deref().is_none_or(|k| k == "node") {
            out.push(json!({
                "id": format!("node/{name}"), "type": "node", "node": name, "status": "online",
            }));
        }
        if kind.as_deref().is_none_or(|k| k == "vm") {
            // Proxmox answers this from the cluster's status, which pvestatd refreshes, not
            // with a process per container: the running ones come from one pass over the
            // LXC monitors' sockets, and only the others are asked one by one.
            let active = m.node.active();
            for vmid in m.node.list() {
                let Ok(conf) = m.node.load(vmid) else {
                    continue;
                };
                let running = active.contains(&vmid)
                    || matches!(m.node.state(vmid), crate::node::RunState::Running(_));
                let mut ct = json!({
                    "id": format!("lxc/{vmid}"), "type": "lxc", "node": name, "vmid": vmid,
                    "status": if running { "running" } else { "stopped" },
                    "template": 0,
                });
                if let Some(host) = conf.get("hostname") {
                    ct["name"] = json!(host);
                }
                if let Some(lock) = conf.get("lock") {
                    ct["lock"] = json!(lock);
                }
                out.push(ct);
            }
        }
    }
    Ok(Reply::data(serde_json::Value::Array(out)))
}

/// `GET /nodes`: every node of the cluster.
pub fn nodes(app: &App) -> ApiResult<Reply> {
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split('.').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total = meminfo("MemTotal:");
    let fp =
        std::fs::read_to_string(app.node.lab.secrets_dir().join("fingerprint")).unwrap_or_default();
    let nodes: Vec<_> = app
        .members
        .iter()
        .map(|m| {
            let name = &m.node.lab.node;
            json!({
                "node": name, "status": "online", "type": "node", "id": format!("node/{name}"),
                "level": "", "uptime": uptime, "maxcpu": cpus, "cpu": 0.0,
                "maxmem": total, "mem": total.saturating_sub(meminfo("MemAvailable:")),
                "ssl_fingerprint": fp.trim(),
            })
        })
        .collect();
    Ok(Reply::data(serde_json::Value::Array(nodes)))
}
