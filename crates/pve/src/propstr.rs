//! Property strings (`name=eth0,bridge=vmbr0,ip=...`), parsed and printed as
//! `PVE::JSONSchema::parse_property_string` / `print_property_string` do: the default key
//! bare and first, then the required keys, then the rest, each group sorted.

use std::collections::BTreeMap;

use crate::error::Invalid;

/// The shape of one property-string option.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// Key whose value may be given without `key=`.
    pub default_key: Option<&'static str>,
    /// Keys that must be present.
    pub required: &'static [&'static str],
    /// All keys the format knows.
    pub keys: &'static [&'static str],
}

/// `netN`.
pub const NET: Format = Format {
    default_key: None,
    required: &["name"],
    keys: &[
        "bridge",
        "firewall",
        "gw",
        "gw6",
        "host-managed",
        "hwaddr",
        "ip",
        "ip6",
        "link_down",
        "mtu",
        "name",
        "rate",
        "tag",
        "trunks",
        "type",
    ],
};

/// `mpN`.
pub const MP: Format = Format {
    default_key: Some("volume"),
    required: &["mp", "volume"],
    keys: &[
        "acl",
        "backup",
        "keepattrs",
        "mountoptions",
        "mp",
        "quota",
        "replicate",
        "ro",
        "shared",
        "size",
        "volume",
    ],
};

/// `rootfs`.
pub const ROOTFS: Format = Format {
    default_key: Some("volume"),
    required: &["volume"],
    keys: &[
        "acl",
        "mountoptions",
        "quota",
        "replicate",
        "ro",
        "shared",
        "size",
        "volume",
    ],
};

/// `devN`.
pub const DEV: Format = Format {
    default_key: Some("path"),
    required: &[],
    keys: &["deny-write", "gid", "mode", "path", "uid"],
};

/// `features`.
pub const FEATURES: Format = Format {
    default_key: None,
    required: &[],
    keys: &[
        "force_rw_sys",
        "fuse",
        "keyctl",
        "mknod",
        "mount",
        "nesting",
    ],
};

/// The format of a config option that holds a property string, if it does.
pub fn format_of(key: &str) -> Option<Format> {
    let indexed = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if indexed("net") {
        Some(NET)
    } else if indexed("mp") {
        Some(MP)
    } else if indexed("dev") {
        Some(DEV)
    } else if key == "rootfs" {
        Some(ROOTFS)
    } else if key == "features" {
        Some(FEATURES)
    } else {
        None
    }
}

/// Parses a property string; errors read as Proxmox's (`invalid format - ...`).
pub fn parse(fmt: &Format, s: &str) -> Result<BTreeMap<String, String>, Invalid> {
    let mut res = BTreeMap::new();
    // Blank parts are skipped, as Proxmox's `next if $part =~ /^\s*$/`.
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = match part.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => match fmt.default_key {
                Some(d) => (d.to_string(), part.to_string()),
                None => {
                    return Err(Invalid(
                        "value without key, but schema does not define a default key\n".to_string(),
                    ));
                }
            },
        };
        if !fmt.keys.contains(&k.as_str()) {
            return Err(Invalid(format!(
                "invalid format - format error\n{k}: property is not defined in schema and the schema does not allow additional properties\n"
            )));
        }
        if res.insert(k.clone(), v).is_some() {
            return Err(Invalid(format!(
                "duplicate key in comma-separated list property: {k}\n"
            )));
        }
    }
    for r in fmt.required {
        if !res.contains_key(*r) {
            return Err(Invalid(format!(
                "invalid format - format error\n{r}: property is missing and it is not optional\n"
            )));
        }
    }
    Ok(res)
}

/// Prints a property string in Proxmox's key order.
pub fn print(fmt: &Format, data: &BTreeMap<String, String>) -> String {
    let mut parts = Vec::new();
    let mut done = Vec::new();
    // The default key goes bare only where it reads back as itself: a value with `=` would
    // read as another key, a blank one as nothing (Proxmox prints both bare and cannot
    // read them back).
    if let Some(d) = fmt.default_key
        && let Some(v) = data.get(d)
        && !v.trim().is_empty()
        && !v.contains('=')
    {
        parts.push(v.clone());
        done.push(d);
    }
    let mut required: Vec<&str> = fmt
        .required
        .iter()
        .copied()
        .filter(|k| !done.contains(k))
        .collect();
    required.sort_unstable();
    for k in required {
        if let Some(v) = data.get(k) {
            parts.push(format!("{k}={v}"));
            done.push(k);
        }
    }
    for (k, v) in data {
        if !done.contains(&k.as_str()) {
            parts.push(format!("{k}={v}"));
        }
    }
    parts.join(",")
}

/// Parses a disk size (`8G`, `512M`, plain numbers are GiB for `STORAGE:SIZE`) into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, unit) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, "G"),
    };
    let n: f64 = num.parse().ok()?;
    let mult: u64 = match unit {
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        "T" | "t" => 1 << 40,
        _ => return None,
    };
    Some((n * mult as f64) as u64)
}

/// Formats bytes as Proxmox's `format_size` does (largest unit that divides evenly).
pub fn format_size(bytes: u64) -> String {
    for (unit, mult) in [
        ("T", 1u64 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ] {
        if bytes >= mult && bytes.is_multiple_of(mult) {
            return format!("{}{unit}", bytes / mult);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_prints_name_first_then_sorted() {
        let m = parse(&NET, "bridge=vmbr0,name=eth0,ip=10.0.0.2/24,type=veth").unwrap();
        assert_eq!(
            print(&NET, &m),
            "name=eth0,bridge=vmbr0,ip=10.0.0.2/24,type=veth"
        );
    }

    #[test]
    fn mount_point_default_key_and_required_mp() {
        let m = parse(&MP, "/srv/shared,mp=/shared,ro=1").unwrap();
        assert_eq!(m["volume"], "/srv/shared");
        assert_eq!(print(&MP, &m), "/srv/shared,mp=/shared,ro=1");
        assert!(
            parse(&MP, "/srv/shared")
                .unwrap_err()
                .0
                .contains("mp: property is missing")
        );
        assert!(parse(&NET, "name=eth0,colour=red").is_err());
    }

    #[test]
    fn default_key_is_bare_only_where_it_reads_back() {
        // Found by fuzzing (fuzz/fuzz_targets/pve_config.rs): printed bare, `a=b` read back
        // as key `a`, and a blank or empty volume vanished.
        for value in ["volume=a=b,mp=/x", "volume=,mp=/x", "volume= ,mp=/x"] {
            let m = parse(&MP, value).unwrap();
            let printed = print(&MP, &m);
            assert!(printed.contains("volume="), "{printed}");
            assert_eq!(parse(&MP, &printed).unwrap(), m);
        }
        let m = parse(&DEV, "path=/dev/a=b").unwrap();
        assert_eq!(parse(&DEV, &print(&DEV, &m)).unwrap(), m);
    }

    #[test]
    fn blank_parts_are_skipped() {
        // Found by fuzzing: " " was a volume, and its canonical form (trimmed) was none.
        assert!(parse(&ROOTFS, " ").is_err());
        let m = parse(&NET, "name=eth0, ,bridge=vmbr0,").unwrap();
        assert_eq!(print(&NET, &m), "name=eth0,bridge=vmbr0");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Some(8 << 30));
        assert_eq!(format_size(8 << 30), "8G");
        assert_eq!(format_size(512 << 20), "512M");
    }
}
