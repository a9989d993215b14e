//! Container operations on the node, shared by the API and `pct`: configs under the node
//! config root, guarded by Proxmox's per-container flock, and real LXC containers.

mod create;
mod destroy;
mod hotplug;
mod lock;
mod lxcconf;
mod power;
mod spare;
mod update;
pub mod volumes;

use std::path::Path;
use std::process::Command;

pub use create::CreateRequest;
pub use lock::ConfigLock;
pub use update::ConfigUpdate;

use crate::error::{ApiError, ApiResult};
use crate::paths::Settings;
use crate::pve::config::CtConfig;

/// Where an operation writes its progress (a task log, or `pct`'s stdout).
pub type Log<'a> = &'a (dyn Fn(&str) + Sync);

/// The node: settings plus the operations on its containers.
#[derive(Debug, Clone)]
pub struct Node {
    /// The lab's settings.
    pub lab: Settings,
}

/// Whether a container runs, and its init pid when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Running with this init pid.
    Running(u32),
    /// Not running.
    Stopped,
}

impl Node {
    /// A node over these settings.
    pub fn new(lab: Settings) -> Node {
        Node { lab }
    }

    /// Loads a container's config; a missing file is Proxmox's 500.
    pub fn load(&self, vmid: u32) -> ApiResult<CtConfig> {
        let path = self.lab.conf_path(vmid);
        let raw = match std::fs::read_to_string(&path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ApiError::die(format!(
                    "Configuration file '{}' does not exist",
                    self.lab.conf_name(vmid)
                )));
            }
            Err(e) => {
                return Err(ApiError::die(format!(
                    "unable to read {}: {e}",
                    path.display()
                )));
            }
        };
        // As a node reads it: a line Proxmox cannot read is dropped with a warning (in the
        // server's log), not fatal to the file.
        let (conf, warnings) = CtConfig::read(&raw, vmid, crate::pve::Version::Pve9);
        for w in warnings {
            eprintln!("pve-lab: {w}");
        }
        Ok(conf)
    }

    /// Writes a container's config atomically (write, then rename).
    pub fn write(&self, vmid: u32, conf: &CtConfig) -> ApiResult<()> {
        let path = self.lab.conf_path(vmid);
        let tmp = path.with_extension("conf.tmp");
        std::fs::write(&tmp, conf.to_raw())?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Whether the config file exists.
    pub fn exists(&self, vmid: u32) -> bool {
        self.lab.conf_path(vmid).exists()
    }

    /// All vmids with a config, sorted.
    pub fn list(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = std::fs::read_dir(self.lab.conf_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".conf")?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The container's LXC state, from `lxc-info`.
    pub fn state(&self, vmid: u32) -> RunState {
        let out = Command::new("lxc-info")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), "-s", "-p"])
            .output();
        let Ok(out) = out else {
            return RunState::Stopped;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        if field("State:").as_deref() != Some("RUNNING") {
            return RunState::Stopped;
        }
        match field("PID:").and_then(|p| p.parse().ok()) {
            Some(pid) => RunState::Running(pid),
            None => RunState::Stopped,
        }
    }

    /// The containers whose LXC monitor is up, in one read of `/proc/net/unix` (their
    /// abstract command sockets `@<lxcpath>/<vmid>/command`), as pve-container's
    /// `list_active_containers` finds them: no process per container. A socket also exists
    /// while a container starts or stops, so callers confirm the ones missing with
    /// [`Node::state`] rather than take absence for stopped when the socket name differs.
    pub fn active(&self) -> std::collections::HashSet<u32> {
        let prefix = format!("@{}/", self.lab.lxc_path().display());
        std::fs::read_to_string("/proc/net/unix")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(7))
            .filter_map(|path| {
                path.strip_prefix(&prefix)?
                    .strip_suffix("/command")?
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// True when the container runs.
    pub fn is_running(&self, vmid: u32) -> bool {
        matches!(self.state(vmid), RunState::Running(_))
    }

    /// Takes the container's config lock (`/run/lock/lxc/pve-config-<vmid>.lock`, 10 s).
    pub fn lock(&self, vmid: u32) -> ApiResult<ConfigLock> {
        ConfigLock::acquire(
            &self.lab.lock_path(vmid),
            std::time::Duration::from_secs(10),
        )
    }

    /// `check_lock`: 500 `CT is locked (create)` when a lock is set.
    pub fn check_lock(conf: &CtConfig) -> ApiResult<()> {
        match conf.lock() {
            Some(l) => Err(ApiError::die(format!("CT is locked ({l})"))),
            None => Ok(()),
        }
    }
}

/// Runs a command; a failure becomes Proxmox's `command '...' failed: exit code N` with stderr.
pub fn run(cmd: &mut Command) -> ApiResult<String> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .output()
        .map_err(|e| ApiError::die(format!("command '{shown}' failed: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out
            .status
            .code()
            .map_or("signal".to_string(), |c| format!("exit code {c}"));
        return Err(ApiError::die(format!(
            "command '{shown}' failed: {code}\n{}",
            stderr.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// True when something is mounted at or below `path` (guards every recursive delete).
pub fn has_mounts_below(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return true;
    };
    let prefix = path.to_string_lossy().trim_end_matches('/').to_string();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| mp == prefix || mp.starts_with(&format!("{prefix}/")))
}
