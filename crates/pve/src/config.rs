//! `lxc/<vmid>.conf` in Proxmox's format (after `PVE::LXC::Config::parse_pct_config` and
//! `write_pct_config`): `key: value` lines sorted by key, the description as `#` comments on
//! top, raw `lxc.*` lines kept in order, then `[pve:pending]` and `[snapshot]` sections.

use std::collections::BTreeMap;

use sha1::{Digest, Sha1};

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

/// Escapes control characters, `:` and non-ASCII (`PVE::Tools::encode_text`).
fn encode_text(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if (0x20..=0x39).contains(&b) || (0x3b..=0x7e).contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

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

impl CtConfig {
    /// Parses a config file; lines it cannot read are reported as errors.
    pub fn parse(raw: &str) -> Result<CtConfig, crate::error::Invalid> {
        let mut conf = CtConfig {
            digest: digest(raw),
            ..Default::default()
        };
        let mut target = Target::Main;
        let mut descr = String::new();
        for line in raw.lines() {
            if line.trim().is_empty() {
                continue;
            }
            let trimmed = line.trim_end();
            if trimmed.eq_ignore_ascii_case("[pve:pending]") {
                conf.section(&target)
                    .set_description(std::mem::take(&mut descr));
                target = Target::Pending;
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
            let sect = conf.section(&target);
            if line.starts_with("lxc.") {
                let (key, value) = match (line.find(':'), line.find('=')) {
                    (Some(c), Some(e)) if e < c => (&line[..e], &line[e + 1..]),
                    (Some(c), _) => (&line[..c], &line[c + 1..]),
                    (None, Some(e)) => (&line[..e], &line[e + 1..]),
                    (None, None) => {
                        return Err(crate::error::Invalid(format!(
                            "unable to parse config: {line}"
                        )));
                    }
                };
                sect.lxc
                    .push((key.trim().to_string(), value.trim().to_string()));
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                return Err(crate::error::Invalid(format!(
                    "unable to parse config: {line}"
                )));
            };
            let key = key.trim();
            let value = value.trim();
            if key.is_empty()
                || !key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                || !key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                || value.is_empty()
            {
                return Err(crate::error::Invalid(format!(
                    "unable to parse config: {line}"
                )));
            }
            if key == "description" {
                descr.push_str(&decode_text(value));
                continue;
            }
            sect.props.insert(key.to_string(), value.to_string());
        }
        conf.section(&target).set_description(descr);
        Ok(conf)
    }

    fn section(&mut self, t: &Target) -> &mut Section {
        match t {
            Target::Main => &mut self.main,
            Target::Pending => &mut self.pending,
            Target::Snapshot(n) => self.snapshots.get_mut(n).expect("snapshot section exists"),
        }
    }

    /// Writes the config as Proxmox does.
    pub fn to_raw(&self) -> String {
        let mut raw = write_section(&self.main);
        if !self.pending.props.is_empty() || !self.pending.lxc.is_empty() {
            raw.push_str("\n[pve:pending]\n");
            raw.push_str(&write_section(&self.pending));
        }
        for (name, snap) in &self.snapshots {
            raw.push_str(&format!("\n[{name}]\n"));
            raw.push_str(&write_section(snap));
        }
        raw
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
    fn set_description(&mut self, text: String) {
        if !text.is_empty() {
            self.props.insert("description".into(), text);
        }
    }
}

fn write_section(s: &Section) -> String {
    let mut raw = String::new();
    // Perl's `split(/\n/, $descr)`: a `\r` stays in its line (encoded), trailing empty
    // lines go.
    if let Some(d) = s.props.get("description").map(|d| d.trim_end_matches('\n'))
        && !d.is_empty()
    {
        for line in d.split('\n') {
            raw.push('#');
            raw.push_str(&encode_text(line));
            raw.push('\n');
        }
    }
    for (k, v) in s.props.iter().filter(|(k, _)| *k != "description") {
        raw.push_str(&format!("{k}: {v}\n"));
    }
    for (k, v) in &s.lxc {
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
    fn percent_escapes_in_descriptions_read_back_decoded_as_in_proxmox() {
        // Found by fuzzing, and Proxmox's own behaviour (`encode_text` leaves `%` alone):
        // a description holding `%0A` is written as is and reads back as a newline.
        let conf = CtConfig::parse("description: 50%250A\n").unwrap();
        assert_eq!(conf.get("description"), Some("50%0A"));
        let raw = conf.to_raw();
        assert_eq!(raw, "#50%0A\n");
        assert_eq!(
            CtConfig::parse(&raw).unwrap().get("description"),
            Some("50\n\n")
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(CtConfig::parse("this is not a config\n").is_err());
        assert!(CtConfig::parse("Memory: 5\n").is_err());
    }
}
