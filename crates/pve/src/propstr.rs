//! Property strings (`name=eth0,bridge=vmbr0,ip=...`), parsed and printed as
//! `PVE::JSONSchema::parse_property_string` / `print_property_string` do: the default key
//! bare and first, then the required keys, then the rest, each group sorted.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::Invalid;
use crate::formats::{self, Check};
use crate::version::Version;

/// What a key's value must be (`type`, `format`, `pattern`, `enum`, `minimum`/`maximum`).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// `boolean`: read as `1`/`0` from any spelling `parse_boolean` knows.
    Bool,
    /// `integer` within the bounds.
    Int(Option<i64>, Option<i64>),
    /// `number`.
    Number,
    /// `number` within the bounds.
    NumberIn(Option<i64>, Option<i64>),
    /// `string` without checks.
    Text,
    /// `string` with an `enum`.
    Enum(&'static [&'static str]),
    /// `string` with a `pattern` (anchored).
    Pattern(fn(&str) -> bool),
    /// `string` with a named `format`.
    Format(fn(&str) -> Check),
}

/// One key of a property-string format.
#[derive(Debug, Clone, Copy)]
pub struct Prop {
    /// The key.
    pub name: &'static str,
    /// Its type and checks.
    pub kind: Kind,
    /// Only known from PVE 9 on.
    pub since9: bool,
}

const fn p(name: &'static str, kind: Kind) -> Prop {
    Prop {
        name,
        kind,
        since9: false,
    }
}

const fn p9(name: &'static str, kind: Kind) -> Prop {
    Prop {
        name,
        kind,
        since9: true,
    }
}

/// The shape of one property-string option.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// Key whose value may be given without `key=`.
    pub default_key: Option<&'static str>,
    /// Keys that must be present.
    pub required: &'static [&'static str],
    /// All keys the format knows (PVE 9's; `since9` marks those PVE 8 lacks).
    pub props: &'static [Prop],
}

impl Format {
    /// The key's schema, when `version` knows it.
    pub fn prop(&self, key: &str, version: Version) -> Option<&'static Prop> {
        self.props
            .iter()
            .find(|p| p.name == key && (version >= Version::Pve9 || !p.since9))
    }
}

fn word_chars(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || "-_.".contains(c))
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn trunks(s: &str) -> bool {
    s.split(';').all(digits)
}

fn mount_options(s: &str) -> bool {
    s.split(';').all(|o| {
        [
            "discard", "lazytime", "noatime", "nodev", "noexec", "nosuid",
        ]
        .contains(&o)
    })
}

fn idmap(s: &str) -> bool {
    s == "passthrough"
        || s.split(';').all(|e| {
            let f: Vec<&str> = e.split(':').collect();
            f.len() == 4
                && (f[0] == "u" || f[0] == "g")
                && digits(f[1])
                && digits(f[2])
                && digits(f[3])
                && !f[3].starts_with('0')
        })
}

fn dev_mode(s: &str) -> bool {
    s.len() == 4 && s.starts_with('0') && s.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

fn fs_list(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_; ".contains(c))
}

/// `netN`.
pub const NET: Format = Format {
    default_key: None,
    required: &["name"],
    props: &[
        p("bridge", Kind::Pattern(word_chars)),
        p("firewall", Kind::Bool),
        p("gw", Kind::Format(formats::ipv4)),
        p("gw6", Kind::Format(formats::ipv6)),
        p9("host-managed", Kind::Bool),
        p("hwaddr", Kind::Format(formats::mac_addr)),
        p("ip", Kind::Format(formats::ipv4_config)),
        p("ip6", Kind::Format(formats::ipv6_config)),
        p("link_down", Kind::Bool),
        p("mtu", Kind::Int(Some(64), Some(65535))),
        p("name", Kind::Pattern(word_chars)),
        p("rate", Kind::Number),
        p("tag", Kind::Int(Some(1), Some(4094))),
        p("trunks", Kind::Pattern(trunks)),
        p("type", Kind::Enum(&["veth"])),
    ],
};

/// `mpN`.
pub const MP: Format = Format {
    default_key: Some("volume"),
    required: &["mp", "volume"],
    props: &[
        p("acl", Kind::Bool),
        p("backup", Kind::Bool),
        p9("idmap", Kind::Pattern(idmap)),
        p9("keepattrs", Kind::Bool),
        p("mountoptions", Kind::Pattern(mount_options)),
        p("mp", Kind::Format(formats::mp_string)),
        p("quota", Kind::Bool),
        p("replicate", Kind::Bool),
        p("ro", Kind::Bool),
        p("shared", Kind::Bool),
        p("size", Kind::Format(formats::disk_size)),
        p("volume", Kind::Format(formats::mp_string)),
    ],
};

/// `rootfs`.
pub const ROOTFS: Format = Format {
    default_key: Some("volume"),
    required: &["volume"],
    props: &[
        p("acl", Kind::Bool),
        p9("idmap", Kind::Pattern(idmap)),
        p("mountoptions", Kind::Pattern(mount_options)),
        p("quota", Kind::Bool),
        p("replicate", Kind::Bool),
        p("ro", Kind::Bool),
        p("shared", Kind::Bool),
        p("size", Kind::Format(formats::disk_size)),
        p("volume", Kind::Format(formats::mp_string)),
    ],
};

/// `devN`.
pub const DEV: Format = Format {
    default_key: Some("path"),
    required: &[],
    props: &[
        p("deny-write", Kind::Bool),
        p("gid", Kind::Int(Some(0), None)),
        p("mode", Kind::Pattern(dev_mode)),
        p("path", Kind::Format(formats::dev_string)),
        p("uid", Kind::Int(Some(0), None)),
    ],
};

/// `features`.
pub const FEATURES: Format = Format {
    default_key: None,
    required: &[],
    props: &[
        p("force_rw_sys", Kind::Bool),
        p("fuse", Kind::Bool),
        p("keyctl", Kind::Bool),
        p("mknod", Kind::Bool),
        p("mount", Kind::Pattern(fs_list)),
        p("nesting", Kind::Bool),
    ],
};

/// `unusedN`.
pub const UNUSED: Format = Format {
    default_key: Some("volume"),
    required: &["volume"],
    props: &[p("volume", Kind::Format(formats::volume_id))],
};

/// The format of a config option that holds a property string, if it does.
pub fn format_of(key: &str) -> Option<Format> {
    let indexed = |prefix: &str, max: usize| {
        key.strip_prefix(prefix).is_some_and(|n| {
            digits(n)
                && (n == "0" || !n.starts_with('0'))
                && n.parse::<usize>().is_ok_and(|i| i < max)
        })
    };
    if indexed("net", 32) {
        Some(NET)
    } else if indexed("mp", 256) {
        Some(MP)
    } else if indexed("dev", 256) {
        Some(DEV)
    } else if indexed("unused", 256) {
        Some(UNUSED)
    } else if key == "rootfs" {
        Some(ROOTFS)
    } else if key == "features" {
        Some(FEATURES)
    } else {
        None
    }
}

/// A property string Proxmox refuses: a message (`duplicate key ...`, `format error`) and,
/// for `format error`, one message per key, all in Proxmox's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropError {
    /// The message (`format error` when `errors` says more).
    pub message: String,
    /// Per key, what is wrong.
    pub errors: BTreeMap<String, String>,
}

impl PropError {
    fn die(message: impl Into<String>) -> PropError {
        PropError {
            message: message.into(),
            errors: BTreeMap::new(),
        }
    }
}

impl fmt::Display for PropError {
    /// As Proxmox stringifies its exception: the message, then `key: error` lines.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.message)?;
        for (k, v) in &self.errors {
            writeln!(f, "{k}: {v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PropError {}

impl From<PropError> for String {
    fn from(e: PropError) -> String {
        e.to_string()
    }
}

impl From<PropError> for Invalid {
    fn from(e: PropError) -> Invalid {
        Invalid(e.to_string())
    }
}

/// `parse_boolean`: `1`/`0` from any spelling Proxmox accepts.
pub fn parse_boolean(v: &str) -> Option<&'static str> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Some("1"),
        "0" | "off" | "no" | "false" => Some("0"),
        _ => None,
    }
}

/// `is_integer`.
fn is_integer(v: &str) -> bool {
    digits(v.strip_prefix(['+', '-']).unwrap_or(v))
}

/// `is_number`: an integer, a decimal or an exponent form.
pub fn is_number(v: &str) -> bool {
    let v = v.strip_prefix(['+', '-']).unwrap_or(v);
    let (mant, exp) = match v.find(['e', 'E']) {
        Some(i) => (&v[..i], Some(&v[i + 1..])),
        None => (v, None),
    };
    let mant_ok = match mant.split_once('.') {
        Some((a, b)) => (digits(a) && (b.is_empty() || digits(b))) || (a.is_empty() && digits(b)),
        None => digits(mant),
    };
    mant_ok && exp.is_none_or(is_integer)
}

/// `check_prop` for one present value: the type, then the format or pattern, the range,
/// the enumeration; the first failure is Proxmox's message.
pub fn check_value(kind: Kind, v: &str) -> Result<(), String> {
    match kind {
        Kind::Bool if v != "1" && v != "0" => {
            Err(format!("type check ('boolean') failed - got '{v}'"))
        }
        Kind::Int(..) if !is_integer(v) => {
            Err(format!("type check ('integer') failed - got '{v}'"))
        }
        Kind::Number | Kind::NumberIn(..) if !is_number(v) => {
            Err(format!("type check ('number') failed - got '{v}'"))
        }
        Kind::Int(min, max) | Kind::NumberIn(min, max) => {
            let n: f64 = v.parse().unwrap_or(0.0);
            if let Some(max) = max
                && n > max as f64
            {
                return Err(format!("value must have a maximum value of {max}"));
            }
            if let Some(min) = min
                && n < min as f64
            {
                return Err(format!("value must have a minimum value of {min}"));
            }
            Ok(())
        }
        Kind::Format(check) => check(v).map_err(|e| format!("invalid format - {e}\n")),
        Kind::Pattern(ok) if !ok(v) => Err("value does not match the regex pattern".into()),
        Kind::Enum(values) if !values.contains(&v) => Err(format!(
            "value '{v}' does not have a value in the enumeration '{}'",
            values.join(", ")
        )),
        _ => Ok(()),
    }
}

/// Parses a property string as PVE 9 does; see [`parse_for`].
pub fn parse(fmt: &Format, s: &str) -> Result<BTreeMap<String, String>, PropError> {
    parse_for(fmt, s, Version::Pve9)
}

/// Parses a property string as `version`'s `parse_property_string` does: booleans read as
/// `1`/`0`, every value checked, errors in Proxmox's words.
pub fn parse_for(
    fmt: &Format,
    s: &str,
    version: Version,
) -> Result<BTreeMap<String, String>, PropError> {
    let mut res: BTreeMap<String, String> = BTreeMap::new();
    let mut bare_seen = false;
    // Blank parts are skipped, as Proxmox's `next if $part =~ /^\s*$/`.
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('=') {
            // `^([^=]+)=(.+)$`
            Some((k, v)) if !k.is_empty() && !v.is_empty() => {
                if res.contains_key(k) {
                    return Err(PropError::die(format!(
                        "duplicate key in comma-separated list property: {k}"
                    )));
                }
                // An unknown key is kept for `check_object` to refuse (Perl autovivifies
                // its schema, so `invalid key ...` is never said).
                let v = match fmt.prop(k, version).map(|p| p.kind) {
                    Some(Kind::Bool) => parse_boolean(v).unwrap_or(v),
                    _ => v,
                };
                res.insert(k.to_string(), v.to_string());
            }
            Some(_) => {
                return Err(PropError::die(
                    "missing key in comma-separated list property",
                ));
            }
            None => {
                let Some(d) = fmt.default_key else {
                    return Err(PropError::die(
                        "value without key, but schema does not define a default key",
                    ));
                };
                // Perl's `if (!$res->{$default_key})`: a value of `0` or none is not there.
                let taken = res.get(d).is_some_and(|v| !v.is_empty() && v != "0");
                if bare_seen || taken {
                    return Err(PropError::die(format!(
                        "duplicate key in comma-separated list property: {d}"
                    )));
                }
                bare_seen = true;
                res.insert(d.to_string(), part.to_string());
            }
        }
    }
    let mut errors = BTreeMap::new();
    for r in fmt.required {
        if !res.contains_key(*r) {
            errors.insert(
                r.to_string(),
                "property is missing and it is not optional".to_string(),
            );
        }
    }
    for (k, v) in &res {
        let checked = match fmt.prop(k, version) {
            Some(prop) => check_value(prop.kind, v),
            None => Err(
                "property is not defined in schema and the schema does not allow additional properties"
                    .to_string(),
            ),
        };
        if let Err(e) = checked {
            errors.insert(k.clone(), e);
        }
    }
    if errors.is_empty() {
        Ok(res)
    } else {
        Err(PropError {
            message: "format error".into(),
            errors,
        })
    }
}

/// Prints a property string in Proxmox's key order, sizes as `format_size` writes them
/// (`size=8192M` as `size=8G`).
pub fn print(fmt: &Format, data: &BTreeMap<String, String>) -> String {
    let sized;
    let data = match data.get("size").and_then(|s| parse_size(s)) {
        Some(bytes) => {
            let mut d = data.clone();
            d.insert("size".into(), format_size(bytes));
            sized = d;
            &sized
        }
        None => data,
    };
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

pub use crate::formats::{format_size, parse_size};

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
                .to_string()
                .contains("mp: property is missing")
        );
        assert!(parse(&NET, "name=eth0,colour=red").is_err());
    }

    #[test]
    fn default_key_is_bare_only_where_it_reads_back() {
        // Found by fuzzing (fuzz/fuzz_targets/pve_config.rs): printed bare, `a=b` read back
        // as key `a`, and a blank or empty volume vanished.
        for value in ["volume=a=b,mp=/x", "volume= ,mp=/x"] {
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
    fn values_are_typed_and_checked_as_proxmox_does() {
        let m = parse(&MP, "/tank/shared,mp=/shared,ro=yes,size=8192M").unwrap();
        assert_eq!(print(&MP, &m), "/tank/shared,mp=/shared,ro=1,size=8G");
        let err = |fmt: &Format, v: &str| parse(fmt, v).unwrap_err().to_string();
        assert_eq!(
            err(&MP, "volume=,mp=/x"),
            "missing key in comma-separated list property\n"
        );
        assert!(err(&NET, "name=eth0,ip=garbage").contains("valid ipv4 network configuration"));
        assert!(err(&NET, "name=eth0,tag=5000").contains("maximum value of 4094"));
        assert!(err(&DEV, "/etc/passwd").contains("is not a valid device path"));
        assert!(err(&MP, "/x,mp=/x/../y").contains("illegal character sequences"));
        assert!(err(&ROOTFS, "local:8,size=8g").contains("valid disk size"));
        // PVE 9's keys are unknown to PVE 8.
        let idmap = "/tank/shared,mp=/shared,idmap=u:0:1000:1";
        assert!(parse_for(&MP, idmap, Version::Pve9).is_ok());
        assert!(parse_for(&MP, idmap, Version::Pve8).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(format_size(8 << 30), "8G");
        assert_eq!(format_size(512 << 20), "512M");
    }
}
