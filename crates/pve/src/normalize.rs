//! What Proxmox rewrites in a container option between the request and `GET .../config`,
//! undone so that a converged container shows no difference: tags lower-cased, sorted and
//! joined by `;`; `hwaddr` and `type=veth` added to `netN`; `STORAGE:SIZE` expanded into a
//! volume with `size=`; sizes in any unit; booleans as `0`/`1` or words; defaults left out or
//! written; property-string keys in any order. PVE 8 and 9 differ only in which of these they
//! write, so comparing [`canonical`] forms holds for both.

use std::collections::BTreeMap;

use crate::config::split_list;
use crate::options::{self, Schema, indexed, new_disk, unique_tags};
use crate::propstr::{self, Format, Kind};
use crate::version::Version;

/// Whether a property-string key of `fmt` holds a boolean.
fn is_bool_key(fmt: &Format, key: &str) -> bool {
    fmt.prop(key, Version::Pve9)
        .is_some_and(|p| matches!(p.kind, Kind::Bool))
}

/// Whether an option holds a boolean.
fn is_bool_option(key: &str) -> bool {
    matches!(
        options::schema(key, Version::Pve9),
        Some(Schema::Plain(Kind::Bool))
    )
}

/// A boolean in any spelling Proxmox accepts, as `0`/`1`.
fn bool_text(v: &str) -> Option<&'static str> {
    propstr::parse_boolean(v)
}

/// Defaults Proxmox assumes when a property-string key is absent, by format.
fn propstr_default(key: &str, prop: &str) -> Option<&'static str> {
    let mount = key == "rootfs" || indexed(key, "mp");
    match prop {
        "firewall" | "link_down" | "host-managed" if indexed(key, "net") => Some("0"),
        "ro" | "quota" | "shared" if mount => Some("0"),
        "keepattrs" if indexed(key, "mp") => Some("0"),
        "replicate" if mount => Some("1"),
        // mount points are not backed up unless asked; the root filesystem always is.
        "backup" if indexed(key, "mp") => Some("0"),
        "deny-write" if indexed(key, "dev") => Some("0"),
        _ if key == "features" => Some("0"),
        _ => None,
    }
}

/// Defaults of whole options, as `$confdesc` declares them (`schema-keys.pl`, the same on
/// PVE 8 and 9): an absent option means this value. `cpuunits` is left out (its default
/// depends on the node's cgroup version), so an absent one is never taken for a wanted one.
fn option_default(key: &str) -> Option<&'static str> {
    match key {
        "onboot" | "protection" | "debug" | "template" | "unprivileged" | "cpulimit" => Some("0"),
        // A container has a console unless `console: 0` says otherwise.
        "console" => Some("1"),
        "memory" | "swap" => Some("512"),
        "tty" => Some("2"),
        "cmode" => Some("tty"),
        "arch" => Some("amd64"),
        "features" | "tags" | "description" => Some(""),
        _ => None,
    }
}

fn canonical_propstr(key: &str, fmt: &Format, value: &str) -> String {
    let Ok(mut map) = propstr::parse(fmt, value) else {
        return value.trim().to_string();
    };
    let mut out = BTreeMap::new();
    for (k, v) in std::mem::take(&mut map) {
        let v = if is_bool_key(fmt, &k) {
            bool_text(&v).map_or(v, str::to_string)
        } else if k == "size" {
            propstr::parse_size(&v).map_or(v, |b| b.to_string())
        } else if k == "hwaddr" {
            v.to_ascii_uppercase()
        } else if k == "mp" && v.len() > 1 {
            v.trim_end_matches('/').to_string()
        } else {
            v
        };
        if propstr_default(key, &k) == Some(v.as_str()) {
            continue;
        }
        out.insert(k, v);
    }
    propstr::print(fmt, &out)
}

/// The canonical form of one option's value, for comparing.
pub fn canonical(key: &str, value: &str) -> String {
    let value = value.trim();
    if key == "tags" {
        return unique_tags(value);
    }
    if is_bool_option(key) {
        return bool_text(value).map_or(value.to_string(), str::to_string);
    }
    if ["memory", "swap", "cores", "cpuunits"].contains(&key) {
        return value
            .parse::<u64>()
            .map_or(value.to_string(), |n| n.to_string());
    }
    if key == "cpulimit" {
        return value
            .parse::<f64>()
            .map_or(value.to_string(), |n| n.to_string());
    }
    if key == "nameserver" || key == "searchdomain" {
        return split_list(value).join(" ");
    }
    if key == "description" {
        return value.trim_end().to_string();
    }
    match propstr::format_of(key) {
        Some(fmt) => canonical_propstr(key, &fmt, value),
        None => value.to_string(),
    }
}

/// Whether Proxmox's `have` (absent when `None`) is what `want` asked for. Keys Proxmox adds
/// on its own (`hwaddr`, `type=veth` in `netN`, the volume name and `size` of a new disk)
/// count only when `want` states them.
pub fn same(key: &str, want: &str, have: Option<&str>) -> bool {
    let Some(have) = have else {
        return option_default(key) == Some(canonical(key, want).as_str());
    };
    let Some(fmt) = propstr::format_of(key) else {
        return canonical(key, want) == canonical(key, have);
    };
    let parse = |v: &str| -> BTreeMap<String, String> {
        propstr::parse(&fmt, &canonical(key, v)).unwrap_or_default()
    };
    let w = parse(want);
    let mut h = parse(have);
    if w.is_empty() || h.is_empty() {
        return canonical(key, want) == canonical(key, have);
    }
    if indexed(key, "net") {
        for added in ["hwaddr", "type"] {
            if !w.contains_key(added) {
                h.remove(added);
            }
        }
    }
    let mut w = w;
    if key == "rootfs" || indexed(key, "mp") {
        // `STORAGE:SIZE` asks for a new disk: the answer names the volume and its size.
        if let Some(want_vol) = w.get("volume").cloned()
            && let Some((sid, gib)) = new_disk(&want_vol)
        {
            let have_vol = h.remove("volume").unwrap_or_default();
            if have_vol.split_once(':').map(|(s, _)| s) != Some(sid) {
                return false;
            }
            w.remove("volume");
            let want_bytes = (gib * (1u64 << 30) as f64) as u64;
            if h.remove("size").and_then(|s| propstr::parse_size(&s)) != Some(want_bytes) {
                return false;
            }
        }
    }
    w == h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_additions_and_order_are_not_drift() {
        assert!(same(
            "net0",
            "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,firewall=0",
            Some("name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.0.0.2/24,type=veth")
        ));
        assert!(!same(
            "net0",
            "name=eth0,bridge=vmbr0,ip=10.0.0.3/24",
            Some("name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.0.0.2/24,type=veth")
        ));
        assert!(!same(
            "net0",
            "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,firewall=1",
            Some("name=eth0,bridge=vmbr0,ip=10.0.0.2/24,type=veth")
        ));
    }

    #[test]
    fn root_filesystem_in_any_size_form() {
        assert!(same(
            "rootfs",
            "local-zfs:200",
            Some("local-zfs:subvol-129-disk-0,size=200G")
        ));
        assert!(same(
            "rootfs",
            "local:8",
            Some("local:129/vm-129-disk-0.raw,size=8192M")
        ));
        assert!(!same(
            "rootfs",
            "local-zfs:200",
            Some("local-zfs:subvol-129-disk-0,size=100G")
        ));
        assert!(!same(
            "rootfs",
            "local:8",
            Some("other:vm-1-disk-0,size=8G")
        ));
    }

    #[test]
    fn tags_booleans_numbers_and_defaults() {
        assert!(same("tags", "gpu;llm", Some("LLM; gpu,llm")));
        assert!(same("onboot", "1", Some("true")));
        assert!(same("onboot", "0", None));
        assert!(!same("onboot", "1", None));
        assert!(same("memory", "2048", Some("02048")));
        assert!(same("features", "nesting=1", Some("nesting=1,keyctl=0")));
        assert!(same(
            "mp0",
            "/srv/data,mp=/shared/,backup=0",
            Some("/srv/data,mp=/shared,ro=0")
        ));
        assert!(!same(
            "mp0",
            "/srv/data,mp=/shared,ro=1",
            Some("/srv/data,mp=/shared")
        ));
        assert!(same(
            "nameserver",
            "1.1.1.1 8.8.8.8",
            Some("1.1.1.1,8.8.8.8")
        ));
        assert!(!same("memory", "2048", None));
    }

    #[test]
    fn defaults_are_proxmox_defaults() {
        // `console` defaults to 1: a wanted `console: 0` against a config without the key
        // is a change, not converged.
        assert!(!same("console", "0", None));
        assert!(same("console", "1", None));
        assert!(same("unprivileged", "0", None));
        assert!(same("memory", "512", None));
        assert!(!same("memory", "2048", None));
        assert!(!same("cpuunits", "100", None));
        assert!(same("mp0", "/srv,mp=/x,keepattrs=0", Some("/srv,mp=/x")));
        assert!(!same("mp0", "/srv,mp=/x,keepattrs=1", Some("/srv,mp=/x")));
    }
}
