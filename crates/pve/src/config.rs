//! `lxc/<vmid>.conf` in Proxmox's format (after `PVE::LXC::Config::parse_pct_config` and
//! `write_pct_config`): `key: value` lines sorted by key, the description as `#` comments on
//! top, raw `lxc.*` lines kept in order, then `[pve:pending]` and `[snapshot]` sections.

use std::collections::BTreeMap;

use sha1::{Digest, Sha1};

use crate::version::Version;
use crate::{lxc_keys, options, propstr};

/// One section of a config: the main one, the pending one or a snapshot. The description
/// (`#` lines on top of the section) is the option `description`, as in Proxmox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    /// `key: value` options (including `lock`, `parent`, `delete` in pending).
    pub props: BTreeMap<String, String>,
    /// Raw `lxc.*` lines, in file order.
    pub lxc: Vec<(String, String)>,
}

/// A parsed container config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtConfig {
    /// The current configuration.
    pub main: Section,
    /// `[pve:pending]`: changes not yet applied.
    pub pending: Section,
    /// `[name]` snapshot sections.
    pub snapshots: BTreeMap<String, Section>,
    /// SHA-1 of the raw file, as Proxmox's `digest`.
    pub digest: String,
}

/// SHA-1 hex of a raw config, as Proxmox computes `digest`.
pub fn digest(raw: &str) -> String {
    hex::encode(Sha1::digest(raw.as_bytes()))
}

/// Decodes `%XX` escapes in description lines (`PVE::Tools::decode_text`).
fn decode_text(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Escapes control characters, `:`, `%` and non-ASCII (`PVE::Tools::encode_text`, which
/// escapes `%` since libpve-common-perl 8.2.2, on PVE 8 and 9 alike).
fn encode_text(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if (0x20..=0x24).contains(&b) || (0x26..=0x39).contains(&b) || (0x3b..=0x7e).contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `[a-z][a-z0-9_\-]+`, any case: a snapshot section's name.
fn is_section_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && s.len() > 1
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Where parsing currently writes.
enum Target {
    Main,
    Pending,
    Snapshot(String),
}

/// One thing `parse_pct_config` says about a line: a line it drops (`error`), or a value it
/// cannot type or a deprecation (kept, with a warning).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Note {
    /// The text after `vm <vmid> - `.
    text: String,
    /// Whether the line is dropped.
    error: bool,
}

/// Perl's `\s` on bytes: ASCII blanks only (a no-break space is no space to Proxmox).
pub(crate) fn is_perl_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// Trims Perl's `\s` from both ends.
pub(crate) fn perl_trim(s: &str) -> &str {
    s.trim_matches(is_perl_space)
}

/// `^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$`: a raw LXC key and its value.
fn lxc_line(line: &str) -> Option<(&str, &str)> {
    let key_end = line
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c)))
        .unwrap_or(line.len());
    let key = &line[..key_end];
    if key.len() <= 4 || !key.starts_with("lxc.") {
        return None;
    }
    let rest = &line[key_end..];
    let value = match rest.strip_prefix(':') {
        Some(v) => v,
        None => rest.trim_start_matches(is_perl_space).strip_prefix('=')?,
    };
    Some((key, perl_trim(value)))
}

/// `is_valid_lxc_conf_key`: `Ok(note)` to keep the line (with a deprecation to say), or
/// `Err(Some(why))` / `Err(None)` to drop it.
fn lxc_key_validity(key: &str, version: Version) -> Result<Option<String>, Option<String>> {
    if key.starts_with("lxc.limit.") {
        return Ok(Some(format!(
            "{key}: lxc.limit.* was renamed to lxc.prlimit.*"
        )));
    }
    if let Some(new) = lxc_keys::DEPRECATED
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, n)| n)
    {
        return Ok(Some(format!(
            "{key} is deprecated and was renamed to {new}"
        )));
    }
    if lxc_keys::VALID.contains(&key)
        || (version >= Version::Pve9 && lxc_keys::VALID_9.contains(&key))
    {
        return Ok(None);
    }
    if let Some((_, why)) = lxc_keys::REFUSED.iter().find(|(k, _)| *k == key) {
        return Err(Some(why.to_string()));
    }
    if key.starts_with("lxc.cgroup.") {
        return match version {
            Version::Pve8 => Ok(None),
            _ => Ok(Some(format!(
                "{key} is deprecated, this will be a hard error in the future!"
            ))),
        };
    }
    if ["lxc.cgroup2.", "lxc.prlimit.", "lxc.net."]
        .iter()
        .any(|p| key.starts_with(p))
    {
        return Ok(None);
    }
    Err(None)
}

/// `snapstate:\s*(prepare|delete)\s*$`, anywhere in the line (Proxmox's regex is not
/// anchored at the start).
fn snapstate(line: &str) -> Option<&'static str> {
    line.match_indices("snapstate:")
        .find_map(|(i, m)| match perl_trim(&line[i + m.len()..]) {
            "prepare" => Some("prepare"),
            "delete" => Some("delete"),
            _ => None,
        })
}

/// `^([a-z][a-z_]*\d*):\s*(.+?)\s*$`: an option line.
fn option_line(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(':')?;
    let b = key.as_bytes();
    let letters = b
        .iter()
        .take_while(|c| c.is_ascii_lowercase() || **c == b'_')
        .count();
    let ok =
        !b.is_empty() && b[0].is_ascii_lowercase() && b[letters..].iter().all(u8::is_ascii_digit);
    let value = perl_trim(value);
    (ok && !value.is_empty()).then_some((key, value))
}

impl CtConfig {
    /// Parses a config for a rewrite: the first line Proxmox would drop (`unable to parse
    /// config`, a refused `lxc.*` key, `delete:` outside pending) is an error, so a file that
    /// is rewritten loses nothing; a value Proxmox cannot type is kept as written, as Proxmox
    /// keeps it.
    pub fn parse(raw: &str) -> Result<CtConfig, crate::error::Invalid> {
        let (conf, notes) = Self::read_notes(raw, Version::Pve9);
        match notes.into_iter().find(|n| n.error) {
            Some(n) => Err(crate::error::Invalid(n.text)),
            None => Ok(conf),
        }
    }

    /// Reads a config as a node of `version` does (`parse_pct_config` not strict): a line
    /// it cannot read is dropped, a value it cannot type kept as written, each with a
    /// warning worded as Proxmox's (`vm <vmid> - ...`).
    pub fn read(raw: &str, vmid: u32, version: Version) -> (CtConfig, Vec<String>) {
        let (conf, notes) = Self::read_notes(raw, version);
        let warnings = notes
            .into_iter()
            .map(|n| format!("vm {vmid} - {}", n.text))
            .collect();
        (conf, warnings)
    }

    fn read_notes(raw: &str, version: Version) -> (CtConfig, Vec<Note>) {
        let mut conf = CtConfig {
            digest: digest(raw),
            ..Default::default()
        };
        let mut notes = Vec::new();
        let mut note = |text: String, error: bool| notes.push(Note { text, error });
        let mut target = Target::Main;
        let mut descr = String::new();
        for line in raw.split('\n') {
            if perl_trim(line).is_empty() {
                continue;
            }
            let trimmed = line.trim_end_matches(is_perl_space);
            if trimmed.eq_ignore_ascii_case("[pve:pending]") {
                conf.section(&target)
                    .set_description(std::mem::take(&mut descr));
                target = Target::Pending;
                conf.pending = Section::default();
                continue;
            }
            if let Some(name) = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']'))
                && is_section_name(name)
            {
                conf.section(&target)
                    .set_description(std::mem::take(&mut descr));
                conf.snapshots.insert(name.to_string(), Section::default());
                target = Target::Snapshot(name.to_string());
                continue;
            }
            if let Some(text) = line.strip_prefix('#') {
                descr.push_str(&decode_text(text));
                descr.push('\n');
                continue;
            }
            let in_pending = matches!(target, Target::Pending);
            let sect = conf.section(&target);
            if let Some((key, value)) = lxc_line(line) {
                match lxc_key_validity(key, version) {
                    Ok(deprecated) => {
                        if let Some(d) = deprecated {
                            note(d, false);
                        }
                        if key == "lxc.environment.runtime" && version >= Version::Pve9 {
                            let env = sect.props.entry("env".into()).or_default();
                            if !env.is_empty() {
                                env.push('\0');
                            }
                            env.push_str(value);
                        } else {
                            sect.lxc.push((key.to_string(), value.to_string()));
                        }
                    }
                    Err(Some(why)) => note(format!("{key}: {why}"), true),
                    Err(None) => note(format!("unable to parse config: {line}"), true),
                }
                continue;
            }
            if let Some(value) = line.strip_prefix("description:").map(perl_trim)
                && !value.is_empty()
            {
                descr.push_str(&decode_text(value));
                continue;
            }
            if let Some(state) = snapstate(line) {
                sect.props.insert("snapstate".into(), state.into());
                continue;
            }
            if let Some(value) = line.strip_prefix("delete:").map(perl_trim)
                && !value.is_empty()
            {
                if in_pending {
                    sect.props.insert("delete".into(), value.to_string());
                } else {
                    note(
                        "property 'delete' is only allowed in [pve:pending]".into(),
                        true,
                    );
                }
                continue;
            }
            let Some((key, value)) = option_line(line) else {
                note(format!("unable to parse config: {line}"), true);
                continue;
            };
            let value = match options::check_type(key, value, version) {
                Ok(typed) => typed,
                Err(e) => {
                    // Kept as written, so nothing is lost by a rewrite: not an error here.
                    note(
                        format!("unable to parse value of '{key}' - {}", e.0.trim_end()),
                        false,
                    );
                    value.to_string()
                }
            };
            sect.props.insert(key.to_string(), value);
        }
        conf.section(&target).set_description(descr);
        // `delete $res->{snapstate}`: only a snapshot keeps one.
        conf.main.props.remove("snapstate");
        (conf, notes)
    }

    fn section(&mut self, t: &Target) -> &mut Section {
        match t {
            Target::Main => &mut self.main,
            Target::Pending => &mut self.pending,
            Target::Snapshot(n) => self.snapshots.get_mut(n).expect("snapshot section exists"),
        }
    }

    /// Writes the config as PVE 9 does.
    pub fn to_raw(&self) -> String {
        self.write(Version::Pve9)
    }

    /// Writes the config as `write_pct_config` of `version` does: an `unusedN` whose
    /// volume a mount point still uses is left out.
    pub fn write(&self, version: Version) -> String {
        let used = self.used_volumes(version);
        let mut main = self.main.clone();
        main.props
            .retain(|k, v| !(k.starts_with("unused") && used.contains(v)));
        main.props.remove("snapstate");
        let mut raw = write_section(&main, version);
        if !self.pending.props.is_empty() || !self.pending.lxc.is_empty() {
            raw.push_str("\n[pve:pending]\n");
            raw.push_str(&write_section(&self.pending, version));
        }
        for (name, snap) in &self.snapshots {
            raw.push_str(&format!("\n[{name}]\n"));
            raw.push_str(&write_section(snap, version));
        }
        raw
    }

    /// The storage volumes the main section's `rootfs` and `mpN` name (`get_vm_volumes`).
    fn used_volumes(&self, version: Version) -> Vec<String> {
        self.main
            .props
            .iter()
            .filter(|(k, _)| options::is_mount_key(k))
            .filter_map(|(k, v)| {
                let fmt = propstr::format_of(k)?;
                let vol = propstr::parse_for(&fmt, v, version)
                    .ok()?
                    .remove("volume")?;
                (options::MountKind::of(&vol) == options::MountKind::Volume).then_some(vol)
            })
            .collect()
    }

    /// Current value of an option.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.main.props.get(key).map(String::as_str)
    }

    /// The `lock` option, if set.
    pub fn lock(&self) -> Option<&str> {
        self.get("lock")
    }

    /// Option names queued for deletion in `[pve:pending]`.
    pub fn pending_delete(&self) -> Vec<String> {
        split_list(
            self.pending
                .props
                .get("delete")
                .map(String::as_str)
                .unwrap_or(""),
        )
        .into_iter()
        .map(|k| k.trim_start_matches('!').to_string())
        .collect()
    }

    /// Replaces the pending delete list (removing the key when empty).
    pub fn set_pending_delete(&mut self, keys: &[String]) {
        if keys.is_empty() {
            self.pending.props.remove("delete");
        } else {
            self.pending.props.insert("delete".into(), keys.join(","));
        }
    }
}

impl Section {
    /// Perl's `$conf->{description} = $descr if $descr`: neither empty nor `0`.
    fn set_description(&mut self, text: String) {
        if !text.is_empty() && text != "0" {
            self.props.insert("description".into(), text);
        }
    }
}

fn write_section(s: &Section, version: Version) -> String {
    let mut raw = String::new();
    // Perl's `split(/\n/, $descr)`: a `\r` stays in its line (encoded), trailing empty
    // lines go.
    // `$conf->{description} || ''`: only `0` itself is false (`0\n` is written).
    if let Some(d) = s
        .props
        .get("description")
        .filter(|d| *d != "0")
        .map(|d| d.trim_end_matches('\n'))
        && !d.is_empty()
    {
        for line in d.split('\n') {
            raw.push('#');
            raw.push_str(&encode_text(line));
            raw.push('\n');
        }
    }
    let env_is_lines = version >= Version::Pve9;
    for (k, v) in &s.props {
        if k == "description" || (k == "env" && env_is_lines) {
            continue;
        }
        raw.push_str(&format!("{k}: {v}\n"));
    }
    if env_is_lines && let Some(env) = s.props.get("env") {
        for var in env.split('\0').filter(|v| !v.is_empty()) {
            raw.push_str(&format!("lxc.environment.runtime: {var}\n"));
        }
    }
    for (k, v) in &s.lxc {
        if env_is_lines && k == "lxc.environment.runtime" {
            continue;
        }
        raw.push_str(&format!("{k}: {v}\n"));
    }
    raw
}

/// Splits a list on `,`, `;`, spaces and NULs (`PVE::Tools::split_list`).
pub fn split_list(s: &str) -> Vec<String> {
    s.split(|c: char| c == ',' || c == ';' || c == '\0' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "#GPU server%3A llm\n#second line\narch: amd64\nhostname: llm\n\
memory: 2048\nnet0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=10.77.0.5/24,type=veth\n\
lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n\
\n[pve:pending]\ndelete: swap\nmemory: 4096\n\n[before-upgrade]\narch: amd64\nsnaptime: 1700000000\n";

    #[test]
    fn round_trips_a_proxmox_config() {
        let conf = CtConfig::parse(SAMPLE).unwrap();
        assert_eq!(
            conf.get("description"),
            Some("GPU server: llm\nsecond line\n")
        );
        assert_eq!(conf.get("memory"), Some("2048"));
        assert_eq!(conf.main.lxc.len(), 2);
        assert_eq!(
            conf.main.lxc[0],
            ("lxc.cgroup2.devices.allow".into(), "c 195:* rwm".into())
        );
        assert_eq!(
            conf.pending.props.get("memory").map(String::as_str),
            Some("4096")
        );
        assert_eq!(conf.pending_delete(), vec!["swap".to_string()]);
        assert!(conf.snapshots.contains_key("before-upgrade"));
        assert_eq!(conf.to_raw(), SAMPLE);
        assert_eq!(conf.digest, digest(SAMPLE));
    }

    #[test]
    fn description_keeps_carriage_returns() {
        // Seen while fixing the round trip the fuzz target checks: `lines()` dropped the `\r`
        // of `#a%0D`, so a written config read back with another description.
        let conf = CtConfig::parse("#a%0D\n#\n#b\narch: amd64\n").unwrap();
        assert_eq!(conf.get("description"), Some("a\r\n\nb\n"));
        let raw = conf.to_raw();
        assert_eq!(raw, "#a%0D\n#\n#b\narch: amd64\n");
        assert_eq!(CtConfig::parse(&raw).unwrap().main, conf.main);
        // As Proxmox: trailing empty description lines are not written.
        let blank = CtConfig::parse("#\n#\narch: amd64\n").unwrap();
        assert_eq!(blank.to_raw(), "arch: amd64\n");
    }

    #[test]
    fn percent_is_escaped_in_descriptions_as_proxmox_does_since_2024() {
        // libpve-common-perl 8.2.2 escapes `%` as `%25` (PVE 8 and 9, pinned by the oracle's
        // `description-*` cases): a description holding `%0A` reads back as written.
        let conf = CtConfig::parse("description: 50%250A\n").unwrap();
        assert_eq!(conf.get("description"), Some("50%0A"));
        let raw = conf.to_raw();
        assert_eq!(raw, "#50%250A\n");
        assert_eq!(
            CtConfig::parse(&raw).unwrap().get("description"),
            Some("50%0A\n")
        );
    }

    #[test]
    fn a_bad_line_is_dropped_with_a_warning_and_values_are_typed() {
        let (conf, warnings) = CtConfig::read(
            "onboot: true\nmemory: 02048\nthis is no config\n",
            129,
            Version::Pve9,
        );
        assert_eq!(conf.get("onboot"), Some("1"));
        assert_eq!(conf.get("memory"), Some("2048"));
        assert_eq!(
            warnings,
            ["vm 129 - unable to parse config: this is no config"]
        );
        assert!(CtConfig::parse("this is no config\n").is_err());
    }

    #[test]
    fn rejects_garbage() {
        assert!(CtConfig::parse("this is not a config\n").is_err());
        assert!(CtConfig::parse("Memory: 5\n").is_err());
    }
}
