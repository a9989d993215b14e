//! Proxmox's named string formats (`PVE::JSONSchema::register_format`), each a check that
//! answers in Proxmox's own words: IP addresses and networks, MAC addresses, DNS names,
//! volume ids, mount point and device paths, disk sizes, tags, time zones.
//!
//! Pinned by the oracle's answers in `tests/fixtures/oracle/`.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A failed format check: Proxmox's message, without the trailing newline.
pub type Check = Result<(), String>;

fn fail(msg: impl Into<String>) -> Check {
    Err(msg.into())
}

/// `ipv4`: dotted quad, no leading zeros (`$IPV4RE`).
pub fn is_ipv4(s: &str) -> bool {
    s.parse::<Ipv4Addr>().is_ok()
}

/// `ipv6`: any RFC 4291 text form, embedded IPv4 included, no zone (`$IPV6RE`).
pub fn is_ipv6(s: &str) -> bool {
    s.parse::<Ipv6Addr>().is_ok() && !s.contains('%')
}

/// `CIDRv4` with Proxmox's prefix range 8..=32.
fn is_cidrv4(s: &str) -> bool {
    s.split_once('/').is_some_and(|(a, p)| {
        is_ipv4(a)
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| n > 7 && n <= 32)
    })
}

/// `CIDRv6` with Proxmox's prefix range 8..=128.
fn is_cidrv6(s: &str) -> bool {
    s.split_once('/').is_some_and(|(a, p)| {
        is_ipv6(a)
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| n > 7 && n <= 128)
    })
}

/// `ipv4`.
pub fn ipv4(s: &str) -> Check {
    if is_ipv4(s) {
        Ok(())
    } else {
        fail("value does not look like a valid IPv4 address")
    }
}

/// `ipv6`.
pub fn ipv6(s: &str) -> Check {
    if is_ipv6(s) {
        Ok(())
    } else {
        fail("value does not look like a valid IPv6 address")
    }
}

/// `pve-ipv4-config`: `dhcp`, `manual` or an IPv4 CIDR.
pub fn ipv4_config(s: &str) -> Check {
    if s == "dhcp" || s == "manual" || is_cidrv4(s) {
        Ok(())
    } else {
        fail("value does not look like a valid ipv4 network configuration")
    }
}

/// `pve-ipv6-config`: `auto`, `dhcp`, `manual` or an IPv6 CIDR.
pub fn ipv6_config(s: &str) -> Check {
    if ["auto", "dhcp", "manual"].contains(&s) || is_cidrv6(s) {
        Ok(())
    } else {
        fail("value does not look like a valid ipv6 network configuration")
    }
}

/// `mac-addr`: a unicast MAC address (the I/G bit clear).
pub fn mac_addr(s: &str) -> Check {
    let parts: Vec<&str> = s.split(':').collect();
    let hex2 = |p: &str| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit());
    let unicast = s
        .as_bytes()
        .get(1)
        .is_some_and(|b| b"02468aceACE".contains(b));
    if parts.len() == 6 && parts.iter().all(|p| hex2(p)) && unicast {
        Ok(())
    } else {
        fail("value does not look like a valid unicast MAC address")
    }
}

fn is_dns_label(l: &str) -> bool {
    let b = l.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// `dns-name`.
pub fn dns_name(s: &str) -> Check {
    if s.split('.').all(is_dns_label) {
        Ok(())
    } else {
        fail("value does not look like a valid DNS name")
    }
}

/// `pve-iface`: a network interface name.
fn is_iface(s: &str) -> bool {
    let (name, suffix) = match s.find([':', '.']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let b = name.as_bytes();
    (2..=21).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
        && suffix.is_none_or(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
}

/// `lxc-ip-with-ll-iface`: an IP address, or a link-local IPv6 address with `%iface`.
pub fn ip_with_ll_iface(s: &str) -> Check {
    if let Some((addr, iface)) = s.split_once('%')
        && addr.starts_with("fe80:")
        && is_ipv6(addr)
        && is_iface(iface)
    {
        return Ok(());
    }
    if is_ipv4(s) || is_ipv6(s) {
        Ok(())
    } else {
        fail("value does not look like a valid IP address")
    }
}

/// `pve-volume-id`: `STORAGE:NAME`.
pub fn volume_id(s: &str) -> Check {
    let ok = s
        .split_once(':')
        .is_some_and(|(sid, name)| is_storage_id(sid) && !name.is_empty());
    if ok {
        Ok(())
    } else {
        fail(format!("unable to parse volume ID '{s}'"))
    }
}

/// A storage id (`[a-z][a-z0-9\-\_\.]*[a-z0-9]`, any case).
pub fn is_storage_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// `pve-lxc-mp-string`: no `/./`, `/../`, trailing `/.` or `/..`, leading `../`.
pub fn mp_string(s: &str) -> Check {
    let bad = s.contains("/./")
        || s.contains("/../")
        || s.ends_with("/.")
        || s.ends_with("/..")
        || s.starts_with("../");
    if bad {
        fail(format!("{s} contains illegal character sequences"))
    } else {
        Ok(())
    }
}

/// `pve-lxc-dev-string`: below `/dev/`, without `.` or `..` components.
pub fn dev_string(s: &str) -> Check {
    let dots = s.contains("/./") || s.contains("/../") || s.ends_with("/.") || s.ends_with("/..");
    if dots || !s.starts_with("/dev/") {
        fail(format!("{s} is not a valid device path"))
    } else {
        Ok(())
    }
}

/// `disk-size`.
pub fn disk_size(s: &str) -> Check {
    if parse_size(s).is_some() {
        Ok(())
    } else {
        fail(format!("value does not look like a valid disk size: {s}"))
    }
}

/// `PVE::JSONSchema::parse_size`: a number with an optional unit `K`/`M`/`G`/`T` (or
/// `KiB`...), in bytes; a bare number is bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let unit_at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(unit_at);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || (num.contains('.') && frac.is_empty()) {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mult: u64 = match unit {
        "" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    Some((n * mult as f64) as u64)
}

/// `PVE::JSONSchema::format_size`: the largest unit that divides evenly (`0` is `0T`).
pub fn format_size(bytes: u64) -> String {
    let kb = bytes / 1024;
    if kb * 1024 != bytes {
        return bytes.to_string();
    }
    let mb = kb / 1024;
    if mb * 1024 != kb {
        return format!("{kb}K");
    }
    let gb = mb / 1024;
    if gb * 1024 != mb {
        return format!("{mb}M");
    }
    let tb = gb / 1024;
    if tb * 1024 != gb {
        return format!("{gb}G");
    }
    format!("{tb}T")
}

/// `pve-tag`.
pub fn tag(s: &str) -> Check {
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_-+.".contains(c));
    if ok {
        Ok(())
    } else {
        fail("invalid characters in tag")
    }
}

/// `pve-configid`: a snapshot or parent name.
pub fn configid(s: &str) -> Check {
    let b = s.as_bytes();
    let ok = b.len() >= 2
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-');
    if ok {
        Ok(())
    } else {
        fail(format!("invalid configuration ID '{s}'"))
    }
}

/// `pve-startup-order`: `[order=]N,up=N,down=N`.
pub fn startup_order(s: &str) -> Check {
    let ok = s.split(',').filter(|p| !p.trim().is_empty()).all(|p| {
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        let p = p.strip_prefix("order=").unwrap_or(p);
        digits(p)
            || p.strip_prefix("up=").is_some_and(digits)
            || p.strip_prefix("down=").is_some_and(digits)
    });
    if ok {
        Ok(())
    } else {
        fail("unable to parse startup options")
    }
}

/// `pve-ct-timezone`: `host`, `UTC` or a zone of the system's `zone.tab`, as Proxmox reads
/// it on the node.
pub fn ct_timezone(s: &str) -> Check {
    if s == "host" || s == "UTC" {
        return Ok(());
    }
    let tab = std::fs::read_to_string("/usr/share/zoneinfo/zone.tab").unwrap_or_default();
    let found = tab
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| l.split('\t').nth(2) == Some(s));
    if found {
        Ok(())
    } else {
        fail(format!("invalid time zone '{s}'"))
    }
}

/// A `-list` format: each element of `split_list` checked.
pub fn list(s: &str, each: fn(&str) -> Check) -> Check {
    crate::config::split_list(s)
        .iter()
        .try_for_each(|v| each(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bytes_unless_a_unit_says_otherwise() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("8g"), None);
        assert_eq!(parse_size("8 G"), None);
        assert_eq!(format_size(8192 << 20), "8G");
        assert_eq!(format_size(1000), "1000");
    }
}
