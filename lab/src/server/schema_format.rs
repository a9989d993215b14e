//! The named formats of `PVE::JSONSchema` that the lab's endpoints use (`pve-vmid`,
//! `pve-node`, `dns-name`, `pve-ipv4-config`, ...). Those of container options are
//! `pve::formats` (pinned by the oracle's fixtures); formats not listed are accepted.

use crate::pve::formats::{self, Check};

/// The formats `crates/pve` checks as Proxmox does.
fn pinned(name: &str) -> Option<fn(&str) -> Check> {
    Some(match name {
        "pve-volume-id" => formats::volume_id,
        "pve-configid" => formats::configid,
        "dns-name" => formats::dns_name,
        "ipv4" => formats::ipv4,
        "ipv6" => formats::ipv6,
        "mac-addr" => formats::mac_addr,
        "pve-ipv4-config" => formats::ipv4_config,
        "pve-ipv6-config" => formats::ipv6_config,
        "pve-tag" => formats::tag,
        "pve-lxc-mp-string" => formats::mp_string,
        "pve-lxc-dev-string" => formats::dev_string,
        "disk-size" => formats::disk_size,
        "pve-startup-order" => formats::startup_order,
        "pve-ct-timezone" => formats::ct_timezone,
        "lxc-ip-with-ll-iface" => formats::ip_with_ll_iface,
        _ => return None,
    })
}

fn re(p: &str, s: &str) -> bool {
    regex::Regex::new(p).is_ok_and(|r| r.is_match(s))
}

/// Checks `s` against a named format; the error is the text after `invalid format - `.
pub fn check_named_format(name: &str, s: &str) -> Result<(), String> {
    let list = name.ends_with("-list");
    if list {
        let item = name.trim_end_matches("-list");
        for part in s
            .split(|c: char| c == ',' || c == ';' || c == '\0' || c.is_whitespace())
            .filter(|p| !p.is_empty())
        {
            check_one(item, part)?;
        }
        return Ok(());
    }
    check_one(name, s)
}

fn check_one(name: &str, s: &str) -> Result<(), String> {
    if let Some(check) = pinned(name) {
        return check(s);
    }
    let ok = match name {
        "pve-vmid" => re(r"^[1-9][0-9]{2,8}$", s),
        "pve-node" => re(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)$", s),
        "pve-storage-id" => re(r"^(?i:[a-z][a-z0-9\-_.]*[a-z0-9])$", s),
        "pve-poolid" => re(r"^[A-Za-z0-9_\-]+$", s),
        "pve-realm" => re(r"^[A-Za-z][A-Za-z0-9\.\-_]+$", s),
        "pve-storage-content" => [
            "images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import",
        ]
        .contains(&s),
        "pve-priv" => re(r"^[A-Za-z.]+$", s),
        "pve-task-status-type" => ["ok", "error", "warning", "unknown"].contains(&s),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    Err(match name {
        "pve-vmid" => "value does not look like a valid VM ID".to_string(),
        "pve-node" => "value does not look like a valid node name".to_string(),
        "pve-storage-id" => format!("storage ID '{s}' contains illegal characters"),
        _ => format!("value does not look like a valid {name}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert!(check_named_format("pve-ipv4-config", "10.77.0.5/24").is_ok());
        assert!(check_named_format("pve-ipv4-config", "10.77.0.5").is_err());
        assert!(check_named_format("pve-tag-list", "a;b,c").is_ok());
        assert!(check_named_format("pve-tag-list", "a;b!").is_err());
        assert!(check_named_format("dns-name", "llm-two").is_ok());
        assert!(check_named_format("dns-name", "bad_name").is_err());
    }
}
