//! Root-only config changes on the node: a token, even root's, gets 403 for bind mounts,
//! `devN`, hookscripts and most features, and raw `lxc.*` lines cannot be written through
//! the API at all. These run over node SSH as root: `pct set` for options `pct` takes, and
//! for raw lines an edit of `lxc/<vmid>.conf` as Proxmox makes one: under the config lock
//! (flock on `pve-config-<vmid>.lock`), to a temporary file renamed over the config, only
//! if the file is still the one that was read (its SHA-1, Proxmox's `digest`), keeping the
//! `[pve:pending]` and snapshot sections as they are, then read back and verified.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};

use super::{NodeError, tail};
use crate::transport::{Transport, shell_quote};

/// Proxmox's lock directory for container configs.
pub const PVE_LOCK_DIR: &str = "/run/lock/lxc";
/// How long Proxmox waits for a config lock before `got timeout`.
const LOCK_WAIT_SECS: u32 = 10;
const TIMEOUT: Duration = Duration::from_secs(60);
/// Exit statuses of the write script that mean something to us.
const EXIT_LOCK_TIMEOUT: i32 = 75;
const EXIT_CONFLICT: i32 = 76;
const EXIT_LOCKED: i32 = 77;

/// Where one container's config and its lock are on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFile {
    /// The container.
    pub vmid: u64,
    /// `<config_root>/nodes/<node>/lxc/<vmid>.conf`.
    pub path: String,
    /// `<lock_dir>/pve-config-<vmid>.lock`.
    pub lock: String,
}

impl ConfigFile {
    /// The config of `vmid` on node `pve_node`, under `config_root` (`/etc/pve`), locked
    /// in `lock_dir` ([`PVE_LOCK_DIR`] on Proxmox).
    pub fn new(config_root: &str, pve_node: &str, lock_dir: &str, vmid: u64) -> Self {
        let root = config_root.trim_end_matches('/');
        ConfigFile {
            vmid,
            path: format!("{root}/nodes/{pve_node}/lxc/{vmid}.conf"),
            lock: format!("{}/pve-config-{vmid}.lock", lock_dir.trim_end_matches('/')),
        }
    }
}

/// The config as read: its text and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConfig {
    /// The whole file.
    pub text: String,
    /// SHA-1 hex of the file, as Proxmox's `digest`.
    pub digest: String,
}

impl RawConfig {
    /// Wraps `text`, computing its digest.
    pub fn new(text: String) -> Self {
        let digest = hex::encode(Sha1::digest(text.as_bytes()));
        RawConfig { text, digest }
    }

    /// The answer to [`Probe::PveContainer`](crate::engine::facts::Probe::PveContainer)
    /// read from the file: the current section's lines.
    pub fn fact(&self) -> crate::engine::facts::Fact {
        crate::engine::facts::Fact::PveContainer(Some(self.main().pairs()))
    }

    /// The current (main) section: the lines before the first `[section]`.
    pub fn main(&self) -> MainSection {
        MainSection::parse(split_main(&self.text).0)
    }
}

/// The current section of a config: description, options, raw `lxc.*` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MainSection {
    /// `#` lines on top (the description), verbatim.
    pub comments: Vec<String>,
    /// `key: value` options in file order.
    pub options: Vec<(String, String)>,
    /// Raw `lxc.*` lines in file order.
    pub lxc: Vec<(String, String)>,
}

impl MainSection {
    fn parse(text: &str) -> Self {
        let mut out = MainSection::default();
        for line in text.lines() {
            if line.starts_with('#') {
                out.comments.push(line.to_string());
            } else if let Some((k, v)) = line.split_once(':') {
                let pair = (k.trim().to_string(), v.trim().to_string());
                if pair.0.starts_with("lxc.") {
                    out.lxc.push(pair);
                } else {
                    out.options.push(pair);
                }
            }
        }
        out
    }

    /// An option's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every `key: value` pair, options then raw lines (what the resources diff against).
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.options.iter().chain(&self.lxc).cloned().collect()
    }

    /// As Proxmox writes it: description, options sorted by key, raw lines in order.
    fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.comments {
            out.push_str(c);
            out.push('\n');
        }
        let mut options = self.options.clone();
        options.sort_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in options.iter().chain(&self.lxc) {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out
    }
}

/// The main section's text and the rest (`[pve:pending]`, snapshots), split at the first
/// section header.
fn split_main(text: &str) -> (&str, &str) {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('[') {
            return text.split_at(offset);
        }
        offset += line.len();
    }
    (text, "")
}

/// A change of the current section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigEdit {
    /// Options to set (replacing a present value).
    pub set: Vec<(String, String)>,
    /// Options to remove.
    pub delete: Vec<String>,
    /// Raw `lxc.*` lines to add where absent, in order.
    pub add_lxc: Vec<(String, String)>,
    /// Raw `lxc.*` lines to remove.
    pub remove_lxc: Vec<(String, String)>,
}

impl ConfigEdit {
    /// The edit from `found` (a config's current lines) to `wanted`: wanted lines added
    /// (options set), and lines `owns` claims but `wanted` lacks removed (options deleted).
    /// Lines nobody claims are the user's and stay.
    pub fn toward(
        wanted: &[(String, String)],
        found: &[(String, String)],
        owns: &dyn Fn(&str, &str) -> bool,
    ) -> ConfigEdit {
        let mut edit = ConfigEdit::default();
        for (k, v) in wanted {
            if found.iter().any(|(fk, fv)| fk == k && fv == v) {
                continue;
            }
            if k.starts_with("lxc.") {
                edit.add_lxc.push((k.clone(), v.clone()));
            } else {
                edit.set.push((k.clone(), v.clone()));
            }
        }
        for (k, v) in found {
            if wanted.iter().any(|(wk, wv)| wk == k && wv == v) || !owns(k, v) {
                continue;
            }
            if k.starts_with("lxc.") {
                edit.remove_lxc.push((k.clone(), v.clone()));
            } else if !wanted.iter().any(|(wk, _)| wk == k) {
                edit.delete.push(k.clone());
            }
        }
        edit
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.delete.is_empty()
            && self.add_lxc.is_empty()
            && self.remove_lxc.is_empty()
    }

    /// `text` with the edit made to its current section; the rest byte for byte.
    pub fn apply_to(&self, text: &str) -> String {
        let (main, rest) = split_main(text);
        let mut m = MainSection::parse(main);
        m.options
            .retain(|(k, _)| !self.delete.contains(k) && !self.set.iter().any(|(s, _)| s == k));
        m.options.extend(self.set.iter().cloned());
        m.lxc.retain(|l| !self.remove_lxc.contains(l));
        for l in &self.add_lxc {
            if !m.lxc.contains(l) {
                m.lxc.push(l.clone());
            }
        }
        let mut out = m.render();
        if !rest.is_empty() {
            // Proxmox separates sections with one blank line.
            if !out.is_empty() && !out.ends_with("\n\n") {
                out.push('\n');
            }
            out.push_str(rest);
        }
        out
    }

    /// Whether `main` shows the edit made.
    pub fn verify(&self, main: &MainSection) -> Result<(), String> {
        let mut wrong = Vec::new();
        for (k, v) in &self.set {
            if main.get(k) != Some(v.as_str()) {
                wrong.push(format!("{k} is {:?}, not {v:?}", main.get(k)));
            }
        }
        for k in &self.delete {
            if main.get(k).is_some() {
                wrong.push(format!("{k} is still set"));
            }
        }
        for l in &self.add_lxc {
            if !main.lxc.contains(l) {
                wrong.push(format!("`{}: {}` is missing", l.0, l.1));
            }
        }
        for l in &self.remove_lxc {
            if main.lxc.contains(l) && !self.add_lxc.contains(l) {
                wrong.push(format!("`{}: {}` is still there", l.0, l.1));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }
}

/// Reads the config over node SSH (one round trip).
pub fn read(node: &dyn Transport, file: &ConfigFile) -> Result<RawConfig, NodeError> {
    let out = node.exec(&format!("cat {}", shell_quote(&file.path)), &[], TIMEOUT)?;
    if !out.success() {
        return Err(NodeError::BadConfig {
            path: file.path.clone(),
            detail: tail(&out.stderr_text()),
        });
    }
    Ok(RawConfig::new(out.stdout_text()))
}

/// Makes `edit` to the config read as `read`, under the config lock, atomically, in one
/// round trip; refuses when the file changed since (re-plan), or when the container is
/// locked (`lock:` set: a backup, a create). Returns the config read back after the write.
pub fn write(
    node: &dyn Transport,
    file: &ConfigFile,
    read: &RawConfig,
    edit: &ConfigEdit,
) -> Result<RawConfig, NodeError> {
    if let Some(lock) = read.main().get("lock") {
        return Err(NodeError::Command {
            what: format!("editing {}", file.path),
            target: node.describe(),
            status: None,
            stderr: format!("CT is locked ({lock})"),
        });
    }
    let new = edit.apply_to(&read.text);
    let script = format!(
        "set -e; conf={conf}; lock={lock}; mkdir -p \"$(dirname \"$lock\")\"; \
         exec 9>>\"$lock\"; flock -w {LOCK_WAIT_SECS} 9 || exit {EXIT_LOCK_TIMEOUT}; \
         sum=$(sha1sum < \"$conf\" | cut -d' ' -f1); \
         [ \"$sum\" = {digest} ] || exit {EXIT_CONFLICT}; \
         if sed -n '/^\\[/q;p' \"$conf\" | grep -q '^lock:'; then exit {EXIT_LOCKED}; fi; \
         t=\"$conf.tmp.$$\"; cat > \"$t\"; mv -f \"$t\" \"$conf\"; cat \"$conf\"",
        conf = shell_quote(&file.path),
        lock = shell_quote(&file.lock),
        digest = read.digest,
    );
    let out = node.exec(&script, new.as_bytes(), TIMEOUT)?;
    match out.status {
        Some(0) => {}
        Some(EXIT_LOCK_TIMEOUT) => {
            return Err(NodeError::LockTimeout {
                vmid: file.vmid,
                lock: file.lock.clone(),
            });
        }
        Some(EXIT_CONFLICT) | Some(EXIT_LOCKED) => {
            return Err(NodeError::Conflict { vmid: file.vmid });
        }
        status => {
            return Err(NodeError::Command {
                what: format!("writing {}", file.path),
                target: node.describe(),
                status,
                stderr: tail(&out.stderr_text()),
            });
        }
    }
    let back = RawConfig::new(out.stdout_text());
    edit.verify(&back.main())
        .map_err(|detail| NodeError::NotVerified {
            what: format!("the edit of {}", file.path),
            target: node.describe(),
            detail,
        })?;
    Ok(back)
}

/// Sets options with `pct set` (Proxmox's own checks, hotplug and pending rules), guarded
/// by `digest`; then reads the config back and verifies the options are set, in the
/// current section or pending until the next start.
pub fn pct_set(
    node: &dyn Transport,
    file: &ConfigFile,
    digest: &str,
    set: &[(String, String)],
    delete: &[String],
) -> Result<RawConfig, NodeError> {
    let mut cmd = format!("pct set {} --digest {digest}", file.vmid);
    for (k, v) in set {
        cmd.push_str(&format!(" --{} {}", shell_quote(k), shell_quote(v)));
    }
    if !delete.is_empty() {
        cmd.push_str(&format!(" --delete {}", shell_quote(&delete.join(","))));
    }
    cmd.push_str(&format!(" && cat {}", shell_quote(&file.path)));
    let out = node.exec(&cmd, &[], TIMEOUT)?;
    if !out.success() {
        let stderr = out.stderr_text();
        if stderr.contains("detected modified configuration") {
            return Err(NodeError::Conflict { vmid: file.vmid });
        }
        if stderr.contains("got timeout") {
            return Err(NodeError::LockTimeout {
                vmid: file.vmid,
                lock: file.lock.clone(),
            });
        }
        return Err(NodeError::Command {
            what: format!("pct set {}", file.vmid),
            target: node.describe(),
            status: out.status,
            stderr: tail(&stderr),
        });
    }
    let back = RawConfig::new(out.stdout_text());
    let pending = pending_section(&back.text);
    let main = back.main();
    let mut wrong = Vec::new();
    for (k, v) in set {
        let now = main.get(k).or_else(|| pending.get(k));
        if now != Some(v.as_str()) {
            wrong.push(format!("{k} is {now:?}, not {v:?}"));
        }
    }
    for k in delete {
        let pending_delete = pending
            .get("delete")
            .is_some_and(|d| d.split(',').any(|x| x.trim() == k));
        if main.get(k).is_some() && !pending_delete {
            wrong.push(format!("{k} is still set"));
        }
    }
    if !wrong.is_empty() {
        return Err(NodeError::NotVerified {
            what: format!("pct set {}", file.vmid),
            target: node.describe(),
            detail: wrong.join("; "),
        });
    }
    Ok(back)
}

/// Carries out `edit` on the node as a root-only step: options through `pct set` (so
/// Proxmox's own rules apply: hotplug, pending), raw lines through the locked file edit,
/// each guarded by the digest of what was just read and verified by reading back.
pub fn apply(
    node: &dyn Transport,
    file: &ConfigFile,
    edit: &ConfigEdit,
) -> Result<RawConfig, NodeError> {
    let mut now = read(node, file)?;
    if !edit.set.is_empty() || !edit.delete.is_empty() {
        now = pct_set(node, file, &now.digest, &edit.set, &edit.delete)?;
    }
    let lines = ConfigEdit {
        add_lxc: edit.add_lxc.clone(),
        remove_lxc: edit.remove_lxc.clone(),
        ..Default::default()
    };
    if !lines.is_empty() {
        now = write(node, file, &now, &lines)?;
    }
    Ok(now)
}

/// Brings the config's current lines to `wanted` (see [`ConfigEdit::toward`]) as a node
/// step; nothing is written when they already match. Returns the config as it is after.
pub fn converge(
    node: &dyn Transport,
    file: &ConfigFile,
    wanted: &[(String, String)],
    owns: &dyn Fn(&str, &str) -> bool,
) -> Result<RawConfig, NodeError> {
    let now = read(node, file)?;
    let edit = ConfigEdit::toward(wanted, &now.main().pairs(), owns);
    if edit.is_empty() {
        return Ok(now);
    }
    apply(node, file, &edit)
}

/// The `[pve:pending]` section's options.
pub fn pending_section(text: &str) -> MainSection {
    let mut inside = false;
    let mut body = String::new();
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line.trim() == "[pve:pending]";
            continue;
        }
        if inside {
            body.push_str(line);
            body.push('\n');
        }
    }
    MainSection::parse(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "#my%20ct\narch: amd64\nhostname: a\nmemory: 512\nlxc.apparmor.profile: unconfined\n\n[pve:pending]\nmemory: 1024\n\n[snap1]\narch: amd64\nhostname: a\n";

    #[test]
    fn edit_touches_only_the_current_section() {
        let edit = ConfigEdit {
            set: vec![("dev0".into(), "/dev/nvidia0".into())],
            delete: vec!["memory".into()],
            add_lxc: vec![("lxc.cgroup2.devices.allow".into(), "c 195:* rwm".into())],
            remove_lxc: vec![("lxc.apparmor.profile".into(), "unconfined".into())],
        };
        let out = edit.apply_to(CONF);
        assert_eq!(
            out,
            "#my%20ct\narch: amd64\ndev0: /dev/nvidia0\nhostname: a\nlxc.cgroup2.devices.allow: c 195:* rwm\n\n[pve:pending]\nmemory: 1024\n\n[snap1]\narch: amd64\nhostname: a\n"
        );
        assert!(edit.verify(&RawConfig::new(out).main()).is_ok());
        assert!(edit.verify(&RawConfig::new(CONF.into()).main()).is_err());
    }

    #[test]
    fn a_file_without_sections_and_pending_reading() {
        let edit = ConfigEdit {
            add_lxc: vec![(
                "lxc.mount.entry".into(),
                "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file".into(),
            )],
            ..Default::default()
        };
        assert_eq!(
            edit.apply_to("arch: amd64\n"),
            "arch: amd64\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        );
        assert_eq!(pending_section(CONF).get("memory"), Some("1024"));
        assert_eq!(
            RawConfig::new(CONF.into()).main().get("memory"),
            Some("512")
        );
    }
}
