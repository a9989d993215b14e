//! Root-only config changes on the node: a token, even root's, gets 403 for bind mounts,
//! `devN`, hookscripts and most features, and raw `lxc.*` lines cannot be written through
//! the API at all. These run over node SSH as root: `pct set` for options `pct` takes, and
//! for raw lines an edit of `lxc/<vmid>.conf` as Proxmox makes one: under the config lock
//! (flock on `pve-config-<vmid>.lock`), to a temporary file renamed over the config, only
//! if the file is still the one that was read (its SHA-1, Proxmox's `digest`), keeping the
//! `[pve:pending]` and snapshot sections as they are, then read back and verified.

use std::time::Duration;

use pve::config::CtConfig;
use serde::{Deserialize, Serialize};

use super::{NodeError, tail};
pub use crate::resources::config_edit::{ConfigEdit, NotShown};
use crate::resources::container::PveContainerFact;
use crate::resources::op::Deadline;
use crate::resources::pve_lines::same_line;
use crate::transport::{Transport, shell_quote};

/// Proxmox's lock directory for container configs.
pub const PVE_LOCK_DIR: &str = "/run/lock/lxc";
/// How long Proxmox waits for a config lock before `got timeout`.
const LOCK_WAIT_SECS: u32 = 10;
const TIMEOUT: Duration = Duration::from_secs(60);

/// How long the next command of an edit may run: the per-command bound, or what is left of
/// its operation's `deadline` when that is less; an error once the deadline passed (an
/// exec given no time would wait without a bound).
fn timeout(node: &dyn Transport, deadline: Deadline, what: &str) -> Result<Duration, NodeError> {
    if deadline.passed() {
        return Err(NodeError::OutOfTime {
            what: what.to_string(),
            target: node.describe(),
            limit_s: deadline.limit().as_secs(),
        });
    }
    Ok(deadline.left().min(TIMEOUT))
}
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

/// The config as read: its text, parsed as Proxmox parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawConfig {
    /// The whole file.
    pub text: String,
    /// Parsed; its `digest` is the SHA-1 of `text`, as Proxmox's.
    pub conf: CtConfig,
}

impl RawConfig {
    /// Parses `text`, the config at `path`.
    pub fn parse(path: &str, text: String) -> Result<Self, NodeError> {
        let conf = CtConfig::parse(&text).map_err(|detail| NodeError::BadConfig {
            path: path.to_string(),
            detail: detail.into(),
        })?;
        Ok(RawConfig { text, conf })
    }

    /// SHA-1 hex of the file, as Proxmox's `digest`.
    pub fn digest(&self) -> &str {
        &self.conf.digest
    }

    /// The container as the resources see it (what the API read gives too).
    pub fn fact(&self, running: bool) -> PveContainerFact {
        PveContainerFact::from_config(&self.conf, running)
    }

    /// The current section's `key: value` lines, raw `lxc.*` lines last.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.fact(false).config
    }
}

/// Reads the config over node SSH (one round trip).
pub fn read(
    node: &dyn Transport,
    file: &ConfigFile,
    deadline: Deadline,
) -> Result<RawConfig, NodeError> {
    let cmd = format!("cat {}", shell_quote(&file.path));
    let out = node.exec(&cmd, &[], timeout(node, deadline, &cmd)?)?;
    if !out.success() {
        return Err(NodeError::BadConfig {
            path: file.path.clone(),
            detail: tail(&out.stderr_text()),
        });
    }
    RawConfig::parse(&file.path, out.stdout_text())
}

/// Makes `edit` to the config read as `read`, under the config lock, atomically, in one
/// round trip; refuses when the file changed since (re-plan), or when the container is
/// locked (`lock:` set: a backup, a create). Returns the config read back after the write.
pub fn write(
    node: &dyn Transport,
    file: &ConfigFile,
    read: &RawConfig,
    edit: &ConfigEdit,
    deadline: Deadline,
) -> Result<RawConfig, NodeError> {
    if let Some(lock) = read.conf.lock() {
        return Err(NodeError::Command {
            what: format!("editing {}", file.path),
            target: node.describe(),
            status: None,
            stderr: format!("CT is locked ({lock})"),
        });
    }
    let new = edit.apply_to(&read.conf).to_raw();
    let script = format!(
        "set -e; conf={conf}; lock={lock}; mkdir -p \"$(dirname \"$lock\")\"; \
         exec 9>>\"$lock\"; flock -w {LOCK_WAIT_SECS} 9 || exit {EXIT_LOCK_TIMEOUT}; \
         sum=$(sha1sum < \"$conf\" | cut -d' ' -f1); \
         [ \"$sum\" = {digest} ] || exit {EXIT_CONFLICT}; \
         if sed -n '/^\\[/q;p' \"$conf\" | grep -q '^lock:'; then exit {EXIT_LOCKED}; fi; \
         t=\"$conf.tmp.$$\"; cat > \"$t\"; mv -f \"$t\" \"$conf\"; cat \"$conf\"",
        conf = shell_quote(&file.path),
        lock = shell_quote(&file.lock),
        digest = read.digest(),
    );
    let limit = timeout(node, deadline, &format!("the locked edit of {}", file.path))?;
    let out = node.exec(&script, new.as_bytes(), limit)?;
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
    let back = RawConfig::parse(&file.path, out.stdout_text())?;
    edit.verify(&back.conf)
        .map_err(|detail| NodeError::NotVerified {
            what: format!("the edit of {}", file.path),
            target: node.describe(),
            detail: detail.to_string(),
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
    deadline: Deadline,
) -> Result<RawConfig, NodeError> {
    let mut cmd = format!("pct set {} --digest {digest}", file.vmid);
    for (k, v) in set {
        cmd.push_str(&format!(" --{} {}", shell_quote(k), shell_quote(v)));
    }
    if !delete.is_empty() {
        cmd.push_str(&format!(" --delete {}", shell_quote(&delete.join(","))));
    }
    cmd.push_str(&format!(" && cat {}", shell_quote(&file.path)));
    let limit = timeout(node, deadline, &format!("pct set {}", file.vmid))?;
    let out = node.exec(&cmd, &[], limit)?;
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
    let back = RawConfig::parse(&file.path, out.stdout_text())?;
    let mut wrong = Vec::new();
    for (k, v) in set {
        // Set now, or pending until the next start (a running container's old value
        // stays current until then).
        let now = back.conf.get(k);
        let pending = back.conf.pending.props.get(k).map(String::as_str);
        let shows = |have: Option<&str>| have.is_some_and(|h| same_line(k, v, h));
        if !shows(now) && !shows(pending) {
            wrong.push(format!("{k} is {now:?} (pending {pending:?}), not {v:?}"));
        }
    }
    for k in delete {
        if back.conf.get(k).is_some() && !back.conf.pending_delete().contains(k) {
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
    deadline: Deadline,
) -> Result<RawConfig, NodeError> {
    let mut now = read(node, file, deadline)?;
    if !edit.set.is_empty() || !edit.delete.is_empty() {
        now = pct_set(node, file, now.digest(), &edit.set, &edit.delete, deadline)?;
    }
    // The description (the record of the lines written) goes with the raw lines, in the
    // last write: a kill between the two writes leaves options written and unrecorded,
    // which are never removed, and the next apply records them.
    let lines = ConfigEdit {
        add_lxc: edit.add_lxc.clone(),
        remove_lxc: edit.remove_lxc.clone(),
        description: edit.description.clone(),
        ..Default::default()
    };
    if !lines.is_empty() {
        now = write(node, file, &now, &lines, deadline)?;
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
    deadline: Deadline,
) -> Result<RawConfig, NodeError> {
    let now = read(node, file, deadline)?;
    let edit = ConfigEdit::toward(wanted, &now.pairs(), owns);
    if edit.is_empty() {
        return Ok(now);
    }
    apply(node, file, &edit, deadline)
}
