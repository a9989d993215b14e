//! The named formats of `PVE::JSONSchema` that the lab's endpoints use (`pve-vmid`,
//! `pve-node`, `dns-name`, `pve-ipv4-config`, ...). Formats not listed are accepted.

use std::net::{Ipv4Addr, Ipv6Addr};

fn re(p: &str, s: &str) -> bool {
    regex::Regex::new(p).is_ok_and(|r| r.is_match(s))
}

fn cidr4(s: &str) -> bool {
    s.split_once('/').is_some_and(|(a, l)| {
        a.parse::<Ipv4Addr>().is_ok() && l.parse::<u8>().is_ok_and(|l| l <= 32)
    })
}

fn cidr6(s: &str) -> bool {
    s.split_once('/').is_some_and(|(a, l)| {
        a.parse::<Ipv6Addr>().is_ok() && l.parse::<u8>().is_ok_and(|l| l <= 128)
    })
}

const DNS: &str = r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)$";
const CONFIGID: &str = r"^[a-z][a-z0-9_]+$";

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
    let ok = match name {
        "pve-vmid" => re(r"^[1-9][0-9]{2,8}$", s),
        "pve-node" => re(r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)$", s),
        "pve-storage-id" => re(r"^(?i:[a-z][a-z0-9\-_.]*[a-z0-9])$", s),
        "pve-configid" => re(CONFIGID, s),
        "pve-poolid" => re(r"^[A-Za-z0-9_\-]+$", s),
        "pve-realm" => re(r"^[A-Za-z][A-Za-z0-9\.\-_]+$", s),
        "pve-volume-id" => s
            .split_once(':')
            .is_some_and(|(sid, v)| !v.is_empty() && re(r"^(?i:[a-z][a-z0-9\-_.]*[a-z0-9])$", sid)),
        "dns-name" => re(DNS, s),
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<Ipv6Addr>().is_ok(),
        "mac-addr" => re(r"^(?i:[a-f0-9][02468ace](?::[a-f0-9]{2}){5})$", s),
        "pve-ipv4-config" => s == "dhcp" || s == "manual" || cidr4(s),
        "pve-ipv6-config" => ["auto", "dhcp", "manual"].contains(&s) || cidr6(s),
        "pve-tag" => re(r"^(?i:[a-z0-9_][a-z0-9_\-+.]*)$", s),
        "pve-storage-content" => [
            "images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import",
        ]
        .contains(&s),
        "pve-lxc-mp-string" => !s.contains(',') && !s.is_empty(),
        "pve-lxc-dev-string" => s.starts_with("/dev/") && !s.contains(".."),
        "disk-size" => re(r"^\d+(?:\.\d+)?[KMGT]?$", s),
        "pve-startup-order" => re(r"^(?:(?:order=\d+|up=\d+|down=\d+)(?:,|$))+$", s),
        "pve-priv" => re(r"^[A-Za-z.]+$", s),
        "pve-task-status-type" => ["ok", "error", "warning", "unknown"].contains(&s),
        "pve-ct-timezone" => s == "host" || re(r"^[A-Za-z0-9_+\-/]+$", s),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    Err(match name {
        "pve-vmid" => "value does not look like a valid VM ID".to_string(),
        "pve-node" => "value does not look like a valid node name".to_string(),
        "pve-storage-id" => format!("storage ID '{s}' contains illegal characters"),
        "pve-configid" => format!("invalid configuration ID '{s}'"),
        "pve-volume-id" => format!("unable to parse volume ID '{s}'"),
        "dns-name" => "value does not look like a valid DNS name".to_string(),
        "ipv4" => "value does not look like a valid IPv4 address".to_string(),
        "ipv6" => "value does not look like a valid IPv6 address".to_string(),
        "mac-addr" => "value does not look like a valid unicast MAC address".to_string(),
        "pve-ipv4-config" => {
            "value does not look like a valid ipv4 network configuration".to_string()
        }
        "pve-ipv6-config" => {
            "value does not look like a valid ipv6 network configuration".to_string()
        }
        "pve-tag" => format!("invalid tag '{s}'"),
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
