//! A Proxmox cluster through any member's API: `/cluster/resources` lists every guest of
//! every node (vmids are unique cluster-wide), so a container's node is where the cluster
//! says it is, whatever the inventory declares.

use std::collections::BTreeMap;

use serde_json::Value;

use super::client::ApiReader;
use super::error::ProxmoxError;

/// Where the cluster says a container is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node it is on (Proxmox's name).
    pub node: String,
    /// Its name (hostname), when the cluster reports one.
    pub name: String,
    /// Whether it runs.
    pub running: bool,
}

/// Every container of the cluster `api` belongs to, by vmid (`GET /cluster/resources`,
/// type `vm`: one call for all nodes).
pub fn containers(api: &ApiReader) -> Result<BTreeMap<u64, Placement>, ProxmoxError> {
    let data = api.get("/cluster/resources", &[("type", "vm")])?;
    let mut out = BTreeMap::new();
    for r in data.as_array().into_iter().flatten() {
        if r["type"] != "lxc" {
            continue;
        }
        let vmid = match &r["vmid"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        let (Some(vmid), Some(node)) = (vmid, r["node"].as_str()) else {
            continue;
        };
        out.insert(
            vmid,
            Placement {
                node: node.to_string(),
                name: r["name"].as_str().unwrap_or("").to_string(),
                running: r["status"] == "running",
            },
        );
    }
    Ok(out)
}
