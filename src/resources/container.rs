//! A container's Proxmox configuration, as the node's API reads and writes it.

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::inventory::Container;
use crate::plan::{Action, Attribute, Change};

/// Keys Proxmox only takes when a container is created.
const CREATE_ONLY: &[&str] = &["ostemplate", "unprivileged", "ssh-public-keys"];

/// A container's desired Proxmox configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// vmid.
    pub vmid: u64,
    /// The node's name in Proxmox.
    pub pve_node: String,
    /// Config keys and values, as the API takes them on create.
    pub config: Vec<(String, String)>,
    /// Public keys for root's `authorized_keys`, set at creation.
    pub ssh_public_keys: Vec<String>,
}

impl ContainerSpec {
    /// The Proxmox configuration an inventory container declares.
    pub fn from_inventory(pve_node: &str, hostname: &str, ct: &Container) -> Self {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        let mut config: Vec<(String, String)> = vec![
            ("ostemplate".into(), ct.template.to_string()),
            ("hostname".into(), hostname.to_string()),
            ("cores".into(), ct.cores.value.to_string()),
            ("memory".into(), ct.memory.mib().to_string()),
            ("swap".into(), ct.swap.mib().to_string()),
            (
                "rootfs".into(),
                format!("{}:{}", ct.rootfs.storage.value, ct.rootfs.size.gib_text()),
            ),
            ("unprivileged".into(), flag(ct.unprivileged.value)),
        ];
        if let Some(f) = ct.features.pve_string() {
            config.push(("features".into(), f));
        }
        for (i, nic) in ct.network.iter().enumerate() {
            let mut parts = vec![
                format!("name={}", nic.name.value),
                format!("bridge={}", nic.bridge.value),
                format!("ip={}", nic.ip.value),
            ];
            if let Some(gw) = &nic.gateway {
                parts.push(format!("gw={}", gw.value));
            }
            if let Some(tag) = &nic.vlan {
                parts.push(format!("tag={}", tag.value));
            }
            parts.push(format!("firewall={}", flag(nic.firewall.value)));
            config.push((format!("net{i}"), parts.join(",")));
        }
        if !ct.nameservers.is_empty() {
            let servers: Vec<String> = ct.nameservers.iter().map(|n| n.to_string()).collect();
            config.push(("nameserver".into(), servers.join(" ")));
        }
        config.push(("onboot".into(), flag(ct.onboot.value)));
        if !ct.tags.is_empty() {
            // Proxmox stores tags lower-cased, sorted and unique, joined by `;`.
            let mut tags: Vec<String> = ct.tags.iter().map(|t| t.as_str().to_lowercase()).collect();
            tags.sort();
            tags.dedup();
            config.push(("tags".into(), tags.join(";")));
        }
        for (i, m) in ct.mounts.iter().enumerate() {
            let mut v = format!("{},mp={}", m.host.value, m.path.value);
            if m.read_only.value {
                v.push_str(",ro=1");
            }
            v.push_str(&format!(",backup={}", flag(m.backup.value)));
            config.push((format!("mp{i}"), v));
        }
        ContainerSpec {
            vmid: ct.vmid.value,
            pve_node: pve_node.to_string(),
            config,
            ssh_public_keys: ct.ssh_keys.iter().map(|k| k.to_string()).collect(),
        }
    }
}

/// Compares a wanted config value with the one Proxmox reports. Proxmox adds `hwaddr`
/// and `type` to network devices and expands `STORAGE:SIZE` into a volume with `size=`.
fn same_value(key: &str, want: &str, have: &str) -> bool {
    if key.starts_with("net") {
        let strip = |s: &str| {
            let mut parts: Vec<&str> = s
                .split(',')
                .filter(|p| !p.starts_with("hwaddr=") && !p.starts_with("type="))
                .collect();
            parts.sort_unstable();
            parts.join(",")
        };
        return strip(want) == strip(have);
    }
    if key == "rootfs" {
        let want_size = want.split_once(':').map(|(_, s)| format!("size={s}G"));
        return want_size.is_some_and(|s| have.split(',').any(|p| p == s));
    }
    want == have
}

impl Resource for ContainerSpec {
    fn kind(&self) -> &'static str {
        "container"
    }

    fn name(&self) -> String {
        self.vmid.to_string()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::PveContainer { vmid: self.vmid }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let Some(found) = facts.pve_container(&self.probes()[0])? else {
            let mut d = Delta::new(Action::Create);
            for (k, v) in &self.config {
                d = d.attr(Attribute::new(k, v.clone()));
            }
            if !self.ssh_public_keys.is_empty() {
                let summary: Vec<String> = self
                    .ssh_public_keys
                    .iter()
                    .map(|k| key_summary(k))
                    .collect();
                d = d.attr(Attribute::new("ssh-public-keys", summary.join(", ")));
            }
            return Ok(Some(d));
        };
        let mut d = Delta::new(Action::Update);
        for (k, want) in &self.config {
            if CREATE_ONLY.contains(&k.as_str()) {
                continue;
            }
            let have = found.iter().find(|(fk, _)| fk == k).map(|(_, v)| v.clone());
            if !have.as_deref().is_some_and(|h| same_value(k, want, h)) {
                d = d.attr(Attribute::change(k, have, Some(want.clone())));
            }
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, StepsError> {
        Err(StepsError::NotBuilt(
            "creating and changing containers through the Proxmox API is not built yet",
        ))
    }
}

/// `ssh-ed25519 …Zk3a user@host`: the type, the key's tail and the comment.
fn key_summary(key: &str) -> String {
    let mut parts = key.split_whitespace();
    let kind = parts.next().unwrap_or("");
    let body = parts.next().unwrap_or("");
    let tail: String = body
        .chars()
        .rev()
        .take(8)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let comment: Vec<&str> = parts.collect();
    format!("{kind} …{tail} {}", comment.join(" "))
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::same_value;

    #[test]
    fn proxmox_additions_are_not_drift() {
        assert!(same_value(
            "net0",
            "name=eth0,bridge=vmbr0,ip=10.0.0.2/24",
            "bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.0.0.2/24,name=eth0,type=veth"
        ));
        assert!(same_value(
            "rootfs",
            "local-zfs:200",
            "local-zfs:subvol-129-disk-0,size=200G"
        ));
        assert!(!same_value(
            "rootfs",
            "local-zfs:200",
            "local-zfs:subvol-129-disk-0,size=100G"
        ));
    }
}
