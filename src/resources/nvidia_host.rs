//! The NVIDIA side of a node: the loaded kernel module against the inventory's pin (the
//! containers' userspace must match it), `nvidia-persistenced` enabled and running, and a
//! unit that makes `/dev/nvidia-uvm*` at boot (`nvidia-modprobe -u -c0`), since a container
//! started before they exist sees no GPU. Installing the driver is planned like any change
//! but runs only with `apply --install-driver` (a reboot follows). Kernel command line
//! words are only checked: the plan warns with the exact change, nothing applies it.
//!
//! Everything is read and written under the node's root (`PROVISION_NODE_ROOT`, empty on
//! real nodes; the lab's stand-in root), never elsewhere.

use crate::resources::op::{Allowed, Op, guest};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, Typed};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// The unit that creates the UVM device nodes at boot.
pub const UVM_UNIT: &str = "nvidia-uvm-init.service";
/// The driver's persistence daemon.
pub const PERSISTENCED: &str = "nvidia-persistenced.service";

/// The UVM unit's content.
pub const UVM_UNIT_CONTENT: &str = "\
# Managed by provision: /dev/nvidia-uvm* exist from boot, before containers start.
[Unit]
Description=Create the NVIDIA UVM device nodes (nvidia-modprobe -u -c0)
After=systemd-modules-load.service
Before=pve-guests.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-modprobe -u -c0

[Install]
WantedBy=multi-user.target
";

/// The desired NVIDIA host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvidiaHostSpec {
    /// The node's root prefix (empty on real nodes).
    pub root: String,
    /// The pinned driver version.
    pub driver: String,
    /// `nvidia-persistenced` enabled and running.
    pub persistenced: bool,
    /// The UVM unit enabled and its nodes present.
    pub uvm_at_boot: bool,
    /// The installer on the node and its sha256.
    pub installer: Option<(String, String)>,
    /// Words the kernel command line must have.
    pub kernel_cmdline: Vec<String>,
}

/// What the node has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaHostFact {
    /// The loaded module's version (`/proc/driver/nvidia/version`); `None`: none loaded.
    pub module: Option<String>,
    /// `nvidia-persistenced.service` is enabled.
    pub persistenced_enabled: bool,
    /// It runs.
    pub persistenced_active: bool,
    /// The UVM unit's content, when there is one.
    pub uvm_unit: Option<String>,
    /// It is enabled.
    pub uvm_enabled: bool,
    /// `/dev/nvidia-uvm` exists.
    pub uvm_nodes: bool,
    /// `/proc/cmdline`.
    pub cmdline: Option<String>,
}

/// Whether module version `have` is the pin `want` (`580.159` pins `580.159.04` too).
pub fn module_matches(have: &str, want: &str) -> bool {
    have == want
        || have
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('.'))
}

impl NvidiaHostSpec {
    fn probe(&self) -> Probe {
        Probe::NvidiaHost(NvidiaHostProbe {
            root: self.root.clone(),
        })
    }

    /// The kernel command line words missing from `cmdline`.
    pub fn missing_cmdline(&self, cmdline: &str) -> Vec<String> {
        let have: Vec<&str> = cmdline.split_whitespace().collect();
        self.kernel_cmdline
            .iter()
            .filter(|w| !have.contains(&w.as_str()))
            .cloned()
            .collect()
    }
}

impl Resource for NvidiaHostSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Node
    }

    fn kind(&self) -> &'static str {
        "nvidia_host"
    }

    fn name(&self) -> String {
        format!("driver {}", self.driver)
    }

    fn probes(&self) -> Vec<Probe> {
        vec![self.probe()]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let empty = NvidiaHostFact {
            module: None,
            persistenced_enabled: false,
            persistenced_active: false,
            uvm_unit: None,
            uvm_enabled: false,
            uvm_nodes: false,
            cmdline: None,
        };
        let fact = facts.nvidia_host(&self.probe())?.unwrap_or(&empty);
        let mut d = Delta::new(Action::Update);
        let module_ok = fact
            .module
            .as_deref()
            .is_some_and(|m| module_matches(m, &self.driver));
        if !module_ok {
            d = d.attr(Attribute::change(
                "driver",
                Some(fact.module.clone().unwrap_or_else(|| "not loaded".into())),
                Some(self.driver.clone()),
            ));
            d = d.reason(match &self.installer {
                Some((path, _)) => format!(
                    "install NVIDIA driver {} on the node and reboot: `apply --install-driver` runs {path} (sha256 checked); the containers' userspace must be {} too",
                    self.driver, self.driver
                ),
                None => format!(
                    "install NVIDIA driver {} on the node and reboot (no `nvidia.installer` declared, so by hand); the containers' userspace must be {} too",
                    self.driver, self.driver
                ),
            });
        }
        let persistenced =
            self.persistenced && !(fact.persistenced_enabled && fact.persistenced_active);
        let mut uvm = false;
        if persistenced {
            d = d.attr(Attribute::change(
                PERSISTENCED,
                Some(state(fact.persistenced_enabled, fact.persistenced_active)),
                Some("enabled, running".into()),
            ));
        }
        if self.uvm_at_boot {
            let unit_ok = fact.uvm_unit.as_deref() == Some(UVM_UNIT_CONTENT) && fact.uvm_enabled;
            uvm = !unit_ok || !fact.uvm_nodes;
            if !unit_ok {
                d = d.attr(Attribute::change(
                    UVM_UNIT,
                    Some(match &fact.uvm_unit {
                        None => "absent".into(),
                        Some(c) if c != UVM_UNIT_CONTENT => "differs".into(),
                        Some(_) => "disabled".into(),
                    }),
                    Some("enabled (nvidia-modprobe -u -c0 at boot)".into()),
                ));
            }
            if !fact.uvm_nodes {
                d = d.attr(Attribute::change(
                    "/dev/nvidia-uvm",
                    Some("absent".into()),
                    Some("present".into()),
                ));
            }
        }
        d.typed = Some(Typed::NvidiaHost {
            driver: !module_ok,
            persistenced,
            uvm,
        });
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn warnings(&self, facts: &Facts) -> Vec<String> {
        let Ok(Some(fact)) = facts.nvidia_host(&self.probe()) else {
            return Vec::new();
        };
        let Some(cmdline) = &fact.cmdline else {
            return Vec::new();
        };
        let missing = self.missing_cmdline(cmdline);
        if missing.is_empty() {
            return Vec::new();
        }
        let words = missing.join(" ");
        vec![format!(
            "the node's kernel command line lacks `{words}` (needs a reboot; provision does not apply it): add `{words}` to GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub and run `update-grub`, or to /etc/kernel/cmdline and run `proxmox-boot-tool refresh` (systemd-boot), then reboot the node"
        )]
    }

    fn ops(&self, change: &Change, allowed: &Allowed) -> Result<Vec<Op>, StepsError> {
        let Some(Typed::NvidiaHost {
            driver,
            persistenced,
            uvm,
        }) = change.typed
        else {
            return Err(StepsError::Refused(
                "this change of the node's NVIDIA side says nothing of what to do (a plan not made by its diff)".into(),
            ));
        };
        let mut steps = Vec::new();
        if driver {
            let Some((path, sha256)) = &self.installer else {
                return Err(StepsError::Refused(format!(
                    "NVIDIA driver {} is not loaded and no `nvidia.installer` is declared: install it on the node by hand and reboot",
                    self.driver
                )));
            };
            if !allowed.install_driver {
                return Err(StepsError::Refused(
                    "installing the NVIDIA driver needs a reboot of the node; it runs only with `apply --install-driver`".into(),
                ));
            }
            steps.push(Step::InstallDriver(InstallDriverStep {
                root: self.root.clone(),
                path: path.clone(),
                sha256: sha256.clone(),
                version: self.driver.clone(),
            }));
        }
        if persistenced {
            steps.push(Step::NodeUnit(NodeUnitStep {
                root: self.root.clone(),
                unit: PERSISTENCED.into(),
                content: None,
            }));
        }
        if uvm {
            steps.push(Step::NodeUnit(NodeUnitStep {
                root: self.root.clone(),
                unit: UVM_UNIT.into(),
                content: Some(UVM_UNIT_CONTENT.into()),
            }));
        }
        guest(steps)
    }
}

fn state(enabled: bool, active: bool) -> String {
    format!(
        "{}, {}",
        if enabled { "enabled" } else { "disabled" },
        if active { "running" } else { "not running" }
    )
}

fn under(root: &str, path: &str) -> PathBuf {
    PathBuf::from(format!("{}{path}", root.trim_end_matches('/')))
}

/// Where a unit's file is under `root`, in systemd's search order.
fn unit_file(root: &str, unit: &str) -> Option<PathBuf> {
    [
        "/etc/systemd/system",
        "/usr/lib/systemd/system",
        "/lib/systemd/system",
    ]
    .iter()
    .map(|d| under(root, &format!("{d}/{unit}")))
    .find(|p| p.exists())
}

/// Whether some `*.wants/` (or `*.requires/`) under `root`'s `/etc/systemd/system` links it.
fn enabled(root: &str, unit: &str) -> bool {
    std::fs::read_dir(under(root, "/etc/systemd/system"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.ends_with(".wants") || n.ends_with(".requires")
        })
        .any(|e| e.path().join(unit).symlink_metadata().is_ok())
}

/// Whether a unit runs: systemd's word on a real node; under a stand-in root (no systemd
/// there) the pid file nvidia-persistenced writes, naming a live process.
fn active(root: &str, unit: &str) -> bool {
    if root.is_empty() {
        return std::process::Command::new("systemctl")
            .args(["is-active", "--quiet", unit])
            .status()
            .is_ok_and(|s| s.success());
    }
    let pid = std::fs::read_to_string(under(
        root,
        "/run/nvidia-persistenced/nvidia-persistenced.pid",
    ))
    .ok()
    .and_then(|t| t.trim().parse::<u32>().ok());
    unit == PERSISTENCED && pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
}

/// Reads the node's NVIDIA side under `root` (agent side).
pub fn read(root: &str) -> Result<Option<NvidiaHostFact>, HostError> {
    let version = under(root, "/proc/driver/nvidia/version");
    let module = match std::fs::read_to_string(&version) {
        Ok(t) => Some(
            crate::gpu::parse::parse_proc_version(&t)
                .map_err(|e| unexpected("/proc/driver/nvidia/version", e.to_string()))?
                .version,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(HostError::io("read", &version)(e)),
    };
    let uvm_path = under(root, &format!("/etc/systemd/system/{UVM_UNIT}"));
    Ok(Some(NvidiaHostFact {
        module,
        persistenced_enabled: enabled(root, PERSISTENCED),
        persistenced_active: active(root, PERSISTENCED),
        uvm_unit: std::fs::read_to_string(&uvm_path).ok(),
        uvm_enabled: enabled(root, UVM_UNIT),
        uvm_nodes: under(root, "/dev/nvidia-uvm").exists(),
        cmdline: std::fs::read_to_string(under(root, "/proc/cmdline")).ok(),
    }))
}

/// Writes (when `content`) and enables `unit` under `root`, then starts it on a real node
/// (a stand-in root has no systemd to start it: the step says so). Agent side.
pub fn setup_unit(root: &str, unit: &str, content: Option<&str>) -> Result<(), HostError> {
    if let Some(content) = content {
        let path = under(root, &format!("/etc/systemd/system/{unit}"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(HostError::io("create", dir))?;
        }
        crate::machine::write_file_atomic(&path, content.as_bytes(), "root", "root", 0o644)?;
    }
    let file = unit_file(root, unit).ok_or_else(|| {
        unexpected(
            unit,
            "not installed on the node (it comes with the NVIDIA driver: install the driver first)",
        )
    })?;
    let text = std::fs::read_to_string(&file).map_err(HostError::io("read", &file))?;
    let wanted_by: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("WantedBy="))
        .flat_map(str::split_whitespace)
        .collect();
    if wanted_by.is_empty() {
        return Err(unexpected(
            &file.display().to_string(),
            "has no WantedBy= to enable it by",
        ));
    }
    let target = file
        .strip_prefix(root.trim_end_matches('/'))
        .map(|p| Path::new("/").join(p))
        .unwrap_or(file.clone());
    for w in wanted_by {
        let dir = under(root, &format!("/etc/systemd/system/{w}.wants"));
        std::fs::create_dir_all(&dir).map_err(HostError::io("create", &dir))?;
        let link = dir.join(unit);
        let tmp = dir.join(format!(".{unit}.provision-tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)
            .and_then(|()| std::fs::rename(&tmp, &link))
            .map_err(HostError::io("link", &link))?;
    }
    if root.is_empty() {
        crate::machine::run("systemctl", &["daemon-reload".into()], &[])?;
        crate::machine::run("systemctl", &["start".into(), unit.into()], &[])?;
    }
    let fact = read(root)?.unwrap_or_else(|| unreachable!("read always answers"));
    let ok = if unit == UVM_UNIT {
        fact.uvm_enabled && (root.is_empty() && fact.uvm_nodes || !root.is_empty())
    } else {
        fact.persistenced_enabled && (fact.persistenced_active || !root.is_empty())
    };
    if ok {
        Ok(())
    } else {
        Err(unexpected(
            unit,
            format!("did not take effect (read back: {fact:?})"),
        ))
    }
}

/// Runs the driver installer after checking its sha256, on a real node only. Agent side.
pub fn install_driver(
    root: &str,
    path: &str,
    sha256: &str,
    version: &str,
) -> Result<(), HostError> {
    if !root.is_empty() {
        return Err(unexpected(
            "the node's root",
            format!("is a stand-in ({root}): a driver cannot be installed there"),
        ));
    }
    let have = crate::machine::sha256_file(Path::new(path))?;
    if !have.eq_ignore_ascii_case(sha256) {
        return Err(unexpected(
            path,
            format!("has sha256 {have}, not the inventory's {sha256}: refusing to run it"),
        ));
    }
    crate::machine::run(
        "sh",
        &[path.into(), "--silent".into(), "--dkms".into()],
        &[],
    )?;
    Err(unexpected(
        &format!("NVIDIA driver {version}"),
        "is installed; reboot the node, then run apply again to verify the loaded module",
    ))
}

/// A [`HostError::Unexpected`] about `what`.
pub(crate) fn unexpected(what: &str, detail: impl Into<String>) -> HostError {
    HostError::Unexpected {
        what: what.to_string(),
        detail: detail.into(),
    }
}

/// Probe: the node's NVIDIA side under its root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct NvidiaHostProbe {
    /// The node's root prefix (empty on real nodes).
    pub root: String,
}

impl crate::resources::wire::AgentProbe for NvidiaHostProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::NvidiaHost(read(&self.root)?))
    }
}

/// Step: write (when `content`) and enable a systemd unit under the node's root; start it on a real node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeUnitStep {
    /// The node's root prefix (empty on real nodes).
    pub root: String,
    /// The unit.
    pub unit: String,
    /// Its file's content, when provision owns the file.
    pub content: Option<String>,
}

impl crate::resources::wire::AgentStep for NodeUnitStep {
    fn describe(&self) -> String {
        format!("enable {} on the node", self.unit)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        setup_unit(&self.root, &self.unit, self.content.as_deref())?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(10))
    }
}

/// Step: run the NVIDIA driver installer (only with `apply --install-driver`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InstallDriverStep {
    /// The node's root prefix (empty on real nodes).
    pub root: String,
    /// The `.run` file.
    pub path: String,
    /// Its sha256.
    pub sha256: String,
    /// The version it installs.
    pub version: String,
}

impl crate::resources::wire::AgentStep for InstallDriverStep {
    fn describe(&self) -> String {
        format!("install NVIDIA driver {} ({})", self.version, self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        install_driver(&self.root, &self.path, &self.sha256, &self.version)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_matches_the_full_version() {
        assert!(module_matches("580.159.04", "580.159"));
        assert!(module_matches("580.159.04", "580.159.04"));
        assert!(!module_matches("580.1590", "580.159"));
        assert!(!module_matches("550.127.05", "580.159"));
    }
}
