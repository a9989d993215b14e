//! Container options: their JSON types, tag normalisation, and what a volume string names.

use serde_json::{Value, json};

use crate::config::split_list;

const INTEGER: &[&str] = &["cores", "cpuunits", "memory", "swap", "tty"];
const BOOLEAN: &[&str] = &[
    "console",
    "debug",
    "onboot",
    "protection",
    "template",
    "unprivileged",
];
const NUMBER: &[&str] = &["cpulimit"];

/// A config value as the API returns it (integers and booleans as numbers).
pub fn to_json(key: &str, value: &str) -> Value {
    if INTEGER.contains(&key) || BOOLEAN.contains(&key) {
        if let Ok(n) = value.parse::<i64>() {
            return json!(n);
        }
    } else if NUMBER.contains(&key)
        && let Ok(n) = value.parse::<f64>()
    {
        return json!(n);
    }
    Value::String(value.to_string())
}

/// The type check Proxmox makes on an option's value (kept here so the lab checks the common
/// options even when the official schema is not available).
pub fn check_type(key: &str, value: &str) -> Result<(), crate::error::Invalid> {
    let ok = if INTEGER.contains(&key) {
        value.trim().parse::<i64>().is_ok()
    } else if BOOLEAN.contains(&key) {
        value == "0" || value == "1"
    } else if NUMBER.contains(&key) {
        value.trim().parse::<f64>().is_ok()
    } else {
        return Ok(());
    };
    let ty = if INTEGER.contains(&key) {
        "integer"
    } else if BOOLEAN.contains(&key) {
        "boolean"
    } else {
        "number"
    };
    if ok {
        Ok(())
    } else {
        Err(crate::error::Invalid(format!(
            "type check ('{ty}') failed - got '{value}'"
        )))
    }
}

/// Type checks of all options; the errors as a 400 would carry them.
pub fn check_types(
    opts: &std::collections::BTreeMap<String, String>,
) -> Result<(), crate::error::ApiError> {
    let errors: std::collections::BTreeMap<String, String> = opts
        .iter()
        .filter_map(|(k, v)| check_type(k, v).err().map(|e| (k.clone(), e.0)))
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
