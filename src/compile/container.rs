//! A container's kinds from the inventory: its Proxmox config and its keyed APT sources.

use std::path::Path;

use crate::inventory::Sp;
use crate::inventory::apt::AptRepository;
use crate::inventory::container::Container;
use crate::inventory::secret::resolve_local;
use crate::inventory::text::Text;
use crate::openpgp;
use crate::resources::apt_source::{AptKeySpec, AptSourceSpec};
use crate::resources::container::ContainerSpec;

/// The Proxmox configuration an inventory container declares.
pub fn container_spec(pve_node: &str, hostname: &str, ct: &Container) -> ContainerSpec {
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
        restart: ct.restart.value,
        bootstrap: false,
        node_keys: Vec::new(),
        login_keys: Vec::new(),
    }
}

/// The source `name` as the inventory declares `repo`; a key file is made absolute
/// against the inventory's folder (it is read at apply time).
pub fn apt_source_spec(name: &str, repo: &AptRepository, base_dir: &Path) -> AptSourceSpec {
    let texts = |v: &[Sp<Text>]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    AptSourceSpec {
        name: name.to_string(),
        uris: vec![repo.uri.to_string()],
        suites: texts(&repo.suites),
        components: texts(&repo.components),
        key: repo.key.as_ref().map(|k| AptKeySpec {
            url: k.url.as_ref().map(|u| u.to_string()),
            file: k
                .file
                .as_ref()
                .map(|f| resolve_local(f, base_dir).display().to_string()),
            fingerprint: openpgp::normalize(k.fingerprint.as_str()),
        }),
        trusted: repo.trusted.value,
    }
}
