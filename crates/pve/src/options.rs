//! Container options: their JSON types, tag normalisation, and what a volume string names.

use serde_json::{Value, json};

use crate::config::split_list;
use crate::error::Invalid;
use crate::formats;
use crate::propstr::{self, Kind};
use crate::version::Version;

/// A config value as the API returns it (integers and booleans as numbers).
pub fn to_json(key: &str, value: &str) -> Value {
    match schema(key, Version::Pve9) {
        Some(Schema::Plain(Kind::Int(..) | Kind::Bool)) => {
            if let Ok(n) = value.parse::<i64>() {
                return json!(n);
            }
        }
        Some(Schema::Plain(Kind::Number | Kind::NumberIn(..))) => {
            if let Ok(n) = value.parse::<f64>() {
                return json!(n);
            }
        }
        _ => {}
    }
    Value::String(value.to_string())
}

/// The options of a container config (`$confdesc` of pve-container's `LXC/Config.pm`)
/// other than the indexed ones (`netN`, `mpN`, `devN`, `unusedN`), with their checks;
/// `true` marks an option PVE 8 does not know.
const CONFDESC: &[(&str, Kind, bool)] = &[
    (
        "arch",
        Kind::Enum(&["amd64", "i386", "arm64", "armhf", "riscv32", "riscv64"]),
        false,
    ),
    ("cmode", Kind::Enum(&["shell", "console", "tty"]), false),
    ("console", Kind::Bool, false),
    ("cores", Kind::Int(Some(1), Some(8192)), false),
    ("cpulimit", Kind::NumberIn(Some(0), Some(8192)), false),
    ("cpuunits", Kind::Int(Some(0), Some(500000)), false),
    ("debug", Kind::Bool, false),
    ("description", Kind::Text, false),
    ("entrypoint", Kind::Pattern(no_control_chars), true),
    ("env", Kind::Pattern(env_list), true),
    ("features", Kind::Text, false),
    ("hookscript", Kind::Format(formats::volume_id), false),
    ("hostname", Kind::Format(formats::dns_name), false),
    (
        "lock",
        Kind::Enum(&[
            "backup",
            "create",
            "destroyed",
            "disk",
            "fstrim",
            "migrate",
            "mounted",
            "rollback",
            "snapshot",
            "snapshot-delete",
        ]),
        false,
    ),
    ("memory", Kind::Int(Some(16), None), false),
    ("nameserver", Kind::Format(ip_list), false),
    ("onboot", Kind::Bool, false),
    (
        "ostype",
        Kind::Enum(&[
            "debian",
            "devuan",
            "ubuntu",
            "centos",
            "fedora",
            "opensuse",
            "archlinux",
            "alpine",
            "gentoo",
            "nixos",
            "unmanaged",
        ]),
        false,
    ),
    ("parent", Kind::Format(formats::configid), false),
    ("protection", Kind::Bool, false),
    ("rootfs", Kind::Text, false),
    ("searchdomain", Kind::Format(dns_name_list), false),
    ("snaptime", Kind::Int(Some(0), None), false),
    ("startup", Kind::Format(formats::startup_order), false),
    ("swap", Kind::Int(Some(0), None), false),
    ("tags", Kind::Format(tag_list), false),
    ("template", Kind::Bool, false),
    ("timezone", Kind::Format(formats::ct_timezone), false),
    ("tty", Kind::Int(Some(0), Some(6)), false),
    ("unprivileged", Kind::Bool, false),
];

fn no_control_chars(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == b'\t' || !(b < 0x20 || b == 0x7f))
}

fn env_list(s: &str) -> bool {
    s.split('\0').all(|var| {
        var.split_once('=').is_some_and(|(name, value)| {
            !name.is_empty()
                && name.chars().all(|c| c.is_alphanumeric() || c == '_')
                && value
                    .bytes()
                    .all(|b| b == b'\t' || !(b < 0x20 || b == 0x7f))
        })
    })
}

fn ip_list(s: &str) -> formats::Check {
    formats::list(s, formats::ip_with_ll_iface)
}

fn dns_name_list(s: &str) -> formats::Check {
    formats::list(s, formats::dns_name)
}

fn tag_list(s: &str) -> formats::Check {
    formats::list(s, formats::tag)
}

/// What `version` checks an option's value against: a property-string format, or a kind.
#[derive(Debug, Clone, Copy)]
pub enum Schema {
    /// A property string (`netN`, `mpN`, `rootfs`, `devN`, `features`, `unusedN`).
    Hash(propstr::Format),
    /// A plain value.
    Plain(Kind),
}

/// The schema of an option `version` knows, or `None` (`unknown setting`).
pub fn schema(key: &str, version: Version) -> Option<Schema> {
    if let Some(fmt) = propstr::format_of(key) {
        return Some(Schema::Hash(fmt));
    }
    CONFDESC
        .iter()
        .find(|(k, _, since9)| *k == key && (version >= Version::Pve9 || !since9))
        .map(|(_, kind, _)| Schema::Plain(*kind))
}

/// `PVE::LXC::Config::check_type`, as reading a config types each value: booleans as
/// `1`/`0`, integers without leading zeros, formats checked (not patterns, ranges or
/// enumerations); the typed value, or Proxmox's message.
pub fn check_type(key: &str, value: &str, version: Version) -> Result<String, Invalid> {
    let schema = schema(key, version).ok_or_else(|| Invalid(format!("unknown setting '{key}'")))?;
    if value.contains(['\n', '\r']) {
        return Err(Invalid("property contains a line feed".into()));
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match schema {
        Schema::Hash(fmt) => propstr::parse_for(&fmt, value, version)
            .map(|_| value.to_string())
            .map_err(|e| Invalid(e.to_string().trim_end().to_string())),
        Schema::Plain(Kind::Bool) => propstr::parse_boolean(value)
            .map(str::to_string)
            .ok_or_else(|| Invalid(format!("type check ('boolean') failed - got '{value}'"))),
        Schema::Plain(Kind::Int(..)) if digits(value) => {
            let trimmed = value.trim_start_matches('0');
            Ok(if trimmed.is_empty() { "0" } else { trimmed }.to_string())
        }
        Schema::Plain(Kind::Int(..)) => Err(Invalid(format!(
            "type check ('integer') failed - got '{value}'"
        ))),
        Schema::Plain(Kind::Number | Kind::NumberIn(..)) => {
            let (int, frac) = value.split_once('.').unwrap_or((value, "0"));
            if digits(int) && digits(frac) {
                Ok(value.to_string())
            } else {
                Err(Invalid(format!(
                    "type check ('number') failed - got '{value}'"
                )))
            }
        }
        Schema::Plain(Kind::Format(check)) => {
            check(value).map(|_| value.to_string()).map_err(Invalid)
        }
        Schema::Plain(_) => Ok(value.to_string()),
    }
}

/// What the API's parameter check (`PVE::JSONSchema::validate`) says of one option's
/// value, in Proxmox's words, or `None` when it passes: an unknown option, a type, a
/// format, a pattern, a range, an enumeration, or a property string's keys.
pub fn verify(key: &str, value: &str, version: Version) -> Option<String> {
    match schema(key, version)? {
        Schema::Hash(fmt) => propstr::parse_for(&fmt, value, version)
            .err()
            .map(|e| format!("invalid format - {e}")),
        Schema::Plain(kind) => propstr::check_value(kind, value).err(),
    }
}

/// The type checks of API parameters: booleans must be `0`/`1` (PVE 9's rules).
pub fn check_types(
    opts: &std::collections::BTreeMap<String, String>,
) -> Result<(), crate::error::ApiError> {
    let errors: std::collections::BTreeMap<String, String> = opts
        .iter()
        .filter_map(|(k, v)| {
            let kind = match schema(k, Version::Pve9)? {
                Schema::Plain(
                    kind @ (Kind::Bool | Kind::Int(..) | Kind::Number | Kind::NumberIn(..)),
                ) => kind,
                _ => return None,
            };
            propstr::check_value(kind, v)
                .err()
                .filter(|e| e.starts_with("type check"))
                .map(|e| (k.clone(), e))
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(crate::error::ApiError::params(errors))
    }
}

/// A request value as it is written into a config (`true` becomes `1`).
pub fn to_conf_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => if *b { "1" } else { "0" }.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// Tags deduplicated, lower-cased and sorted (`PVE::GuestHelpers::get_unique_tags`).
pub fn unique_tags(tags: &str) -> String {
    let mut list: Vec<String> = split_list(tags)
        .into_iter()
        .map(|t| t.to_lowercase())
        .collect();
    list.sort();
    list.dedup();
    list.join(";")
}

/// What a mount point's volume string names (`classify_mountpoint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A storage volume (`local:129/vm-129-disk-1.raw` or `local:8`).
    Volume,
    /// A host directory bind mount.
    Bind,
    /// A host block device.
    Device,
}

impl MountKind {
    /// Classifies a volume string.
    pub fn of(volume: &str) -> MountKind {
        if volume.starts_with("/dev/") {
            MountKind::Device
        } else if volume.starts_with('/') {
            MountKind::Bind
        } else {
            MountKind::Volume
        }
    }

    /// The name Proxmox uses in messages.
    pub fn name(self) -> &'static str {
        match self {
            MountKind::Volume => "volume",
            MountKind::Bind => "bind",
            MountKind::Device => "device",
        }
    }
}

/// A new-disk request `STORAGE:SIZE_GiB`, as Proxmox's `$NEW_DISK_RE`.
pub fn new_disk(volume: &str) -> Option<(&str, f64)> {
    let (sid, size) = volume.split_once(':')?;
    let gib: f64 = size.parse().ok()?;
    let valid_sid = !sid.is_empty()
        && sid.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && sid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    valid_sid.then_some((sid, gib))
}

/// True for option names that hold a mount point (`rootfs`, `mpN`).
pub fn is_mount_key(key: &str) -> bool {
    key == "rootfs" || indexed(key, "mp")
}

/// True for `prefixN`.
pub fn indexed(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_normalised_as_proxmox_does() {
        assert_eq!(unique_tags("Web,db; web  GPU"), "db;gpu;web");
        assert_eq!(unique_tags(""), "");
    }

    #[test]
    fn volumes() {
        assert_eq!(MountKind::of("/srv/x"), MountKind::Bind);
        assert_eq!(
            MountKind::of("local:129/vm-129-disk-0.raw"),
            MountKind::Volume
        );
        assert_eq!(new_disk("local:8"), Some(("local", 8.0)));
        assert_eq!(new_disk("local:129/vm-129-disk-0.raw"), None);
    }
}
