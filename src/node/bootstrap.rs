//! Bootstrap: a container made from a template may have no sshd and no key. Until it
//! answers SSH, reach it through the node (`pct exec`/`pct push`), install openssh-server
//! and the inventory's keys where missing, start sshd, and read its host keys, which came
//! over the pinned node connection, into `known_hosts` for the guest connection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use super::{NodeError, tail};
use crate::transport::Transport;
use crate::transport::pct::PctTransport;
use crate::transport::ssh::known_hosts::{self, HostKeyStatus, KnownHosts};

/// The package that provides sshd in Debian-family templates.
pub const SSH_PACKAGE: &str = "openssh-server";

const READ_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// What a container needs before SSH can take over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapSpec {
    /// Public keys root's `authorized_keys` must hold (OpenSSH's one-line form).
    pub authorized_keys: Vec<String>,
    /// Files (path, content) written before sshd is installed: the APT sources the
    /// install needs (an air-gapped node's mirror).
    pub apt_sources: Vec<(String, String)>,
}

/// One SSH host key of the container, as its `ssh_host_*_key.pub` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostKey {
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, ...
    pub key_type: String,
    /// The key blob, base64 as in the file.
    pub base64: String,
}

impl HostKey {
    /// The decoded key blob.
    pub fn blob(&self) -> Vec<u8> {
        STANDARD.decode(&self.base64).unwrap_or_default()
    }

    /// `SHA256:…`, as OpenSSH prints it.
    pub fn fingerprint(&self) -> String {
        known_hosts::fingerprint(&self.blob())
    }
}

/// What was found in the container, through the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapState {
    /// sshd is installed.
    pub sshd_installed: bool,
    /// The ssh service is running.
    pub sshd_active: bool,
    /// Keys of the spec that `authorized_keys` lacks.
    pub missing_keys: Vec<String>,
    /// The whole `authorized_keys` file as found.
    pub authorized_keys: String,
    /// The host keys found.
    pub host_keys: Vec<HostKey>,
}

impl BootstrapState {
    /// What bootstrap would do, in words (empty: nothing); for the plan.
    pub fn actions(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.sshd_installed {
            out.push(format!("install {SSH_PACKAGE} (through pct exec)"));
        }
        if !self.missing_keys.is_empty() {
            out.push(format!(
                "add {} key(s) to /root/.ssh/authorized_keys (through pct push)",
                self.missing_keys.len()
            ));
        }
        if !self.sshd_installed || !self.sshd_active {
            out.push("enable and start ssh.service".into());
        }
        out
    }
}

/// What bootstrap did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapReport {
    /// Each thing done, in words.
    pub done: Vec<String>,
    /// The container's host keys, read back at the end.
    pub host_keys: Vec<HostKey>,
}

/// The key type and blob of an OpenSSH public key line (`TYPE BASE64 [COMMENT]`).
fn key_id(line: &str) -> Option<(&str, &str)> {
    let mut parts = line.split_whitespace();
    let (t, b) = (parts.next()?, parts.next()?);
    // Lines with options in front (`from="…" ssh-ed25519 …`) name the type second.
    if t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-") {
        Some((t, b))
    } else {
        let c = parts.next()?;
        Some((b, c))
    }
}

const MARK: &str = "@@provision-bootstrap";

/// Enables and starts sshd once the container's systemd answers. A container bootstrapped
/// right after its start may not have its manager's socket yet: `systemctl` (as root, over
/// `/run/systemd/private`) then fails with "Failed to connect to system scope bus via local
/// transport: No such file or directory" (seen on a Debian 13 guest in the lab). The socket
/// is waited for, up to 40 s; a container without systemd then fails as before, naming it.
const START_SSH: &str = "n=0; while [ ! -S /run/systemd/private ] && [ $n -lt 200 ]; do sleep 0.2; n=$((n+1)); done; \
     ssh-keygen -A >/dev/null && systemctl enable --now ssh.service";

/// Reads what bootstrap needs to know, in one round trip through the node.
pub fn read(ct: &PctTransport, spec: &BootstrapSpec) -> Result<BootstrapState, NodeError> {
    let script = format!(
        "if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then echo sshd=yes; else echo sshd=no; fi; \
         if systemctl is-active --quiet ssh.service 2>/dev/null; then echo active=yes; else echo active=no; fi; \
         echo {MARK}-keys; cat /root/.ssh/authorized_keys 2>/dev/null; echo; \
         echo {MARK}-hostkeys; cat /etc/ssh/ssh_host_*_key.pub 2>/dev/null; true"
    );
    let out = ct.exec(&script, &[], READ_TIMEOUT)?;
    if !out.success() {
        return Err(NodeError::Command {
            what: "reading sshd, keys and host keys".into(),
            target: ct.describe(),
            status: out.status,
            stderr: tail(&out.stderr_text()),
        });
    }
    Ok(parse_state(&out.stdout_text(), spec))
}

fn parse_state(text: &str, spec: &BootstrapSpec) -> BootstrapState {
    let (head, rest) = text
        .split_once(&format!("{MARK}-keys\n"))
        .unwrap_or((text, ""));
    let (keys, host) = rest
        .split_once(&format!("{MARK}-hostkeys\n"))
        .unwrap_or((rest, ""));
    let authorized_keys = keys.strip_suffix('\n').unwrap_or(keys).to_string();
    let have: Vec<(&str, &str)> = authorized_keys.lines().filter_map(key_id).collect();
    let missing_keys = spec
        .authorized_keys
        .iter()
        .filter(|k| key_id(k).is_some_and(|id| !have.contains(&id)))
        .cloned()
        .collect();
    let host_keys = host
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            Some(HostKey {
                key_type: p.next()?.to_string(),
                base64: p.next()?.to_string(),
            })
        })
        .collect();
    BootstrapState {
        sshd_installed: head.contains("sshd=yes"),
        sshd_active: head.contains("active=yes"),
        missing_keys,
        authorized_keys,
        host_keys,
    }
}

fn run_checked(
    ct: &PctTransport,
    what: &str,
    script: &str,
    timeout: Duration,
) -> Result<(), NodeError> {
    let out = ct.exec(script, &[], timeout)?;
    if out.success() {
        Ok(())
    } else {
        Err(NodeError::Command {
            what: what.to_string(),
            target: ct.describe(),
            status: out.status,
            stderr: tail(&format!("{}\n{}", out.stdout_text(), out.stderr_text())),
        })
    }
}

/// Brings the container to the point where SSH can take over, then reads back that it
/// is there: sshd installed and running, every key authorised, host keys present.
pub fn run(ct: &PctTransport, spec: &BootstrapSpec) -> Result<BootstrapReport, NodeError> {
    let state = read(ct, spec)?;
    let mut done = Vec::new();
    if !state.sshd_installed {
        for (path, content) in &spec.apt_sources {
            ct.push(content.as_bytes(), path, 0o644)?;
        }
        run_checked(
            ct,
            &format!("installing {SSH_PACKAGE}"),
            &format!(
                "export DEBIAN_FRONTEND=noninteractive; apt-get update -q && \
                 apt-get install -y -q --no-install-recommends {SSH_PACKAGE}"
            ),
            INSTALL_TIMEOUT,
        )?;
        done.push(format!("installed {SSH_PACKAGE}"));
    }
    if !state.missing_keys.is_empty() {
        let mut content = state.authorized_keys.clone();
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        for k in &state.missing_keys {
            content.push_str(k.trim());
            content.push('\n');
        }
        run_checked(
            ct,
            "making /root/.ssh",
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh",
            READ_TIMEOUT,
        )?;
        ct.push(content.as_bytes(), "/root/.ssh/authorized_keys", 0o600)?;
        done.push(format!(
            "added {} key(s) to /root/.ssh/authorized_keys",
            state.missing_keys.len()
        ));
    }
    if !state.sshd_installed || !state.sshd_active {
        run_checked(ct, "starting ssh.service", START_SSH, READ_TIMEOUT)?;
        done.push("enabled and started ssh.service".into());
    }
    let after = read(ct, spec)?;
    let mut wrong = Vec::new();
    if !after.sshd_installed {
        wrong.push(format!("{SSH_PACKAGE} is not installed"));
    }
    if !after.sshd_active {
        wrong.push("ssh.service is not running".into());
    }
    if !after.missing_keys.is_empty() {
        wrong.push(format!("{} key(s) still missing", after.missing_keys.len()));
    }
    if after.host_keys.is_empty() {
        wrong.push("no /etc/ssh/ssh_host_*_key.pub".into());
    }
    if !wrong.is_empty() {
        return Err(NodeError::NotVerified {
            what: "bootstrap".into(),
            target: ct.describe(),
            detail: wrong.join("; "),
        });
    }
    Ok(BootstrapReport {
        done,
        host_keys: after.host_keys,
    })
}

/// Where the guest is reached by SSH once bootstrap is done.
#[derive(Debug, Clone, Copy)]
pub struct GuestEntry<'a> {
    /// The `known_hosts` file the guest connection checks.
    pub known_hosts: &'a Path,
    /// The guest's address.
    pub host: &'a str,
    /// Its SSH port.
    pub port: u16,
}

/// The whole hand-over from the node to SSH: bootstrap the container through the node,
/// then record its host keys for `guest` (see [`HostKeyTrust`]).
pub fn hand_over(
    ct: &PctTransport,
    spec: &BootstrapSpec,
    guest: GuestEntry<'_>,
    trust: HostKeyTrust,
) -> Result<BootstrapReport, NodeError> {
    let report = run(ct, spec)?;
    record_host_keys(
        guest.known_hosts,
        guest.host,
        guest.port,
        ct.vmid().into(),
        &report.host_keys,
        trust,
    )?;
    Ok(report)
}

/// Whether the container's keys may replace those on file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKeyTrust {
    /// provision has just created (or recreated) the container: its keys are new by
    /// design and replace whatever `known_hosts` held for its address.
    Recreated,
    /// The container existed before: keys are added only when none are on file, and a
    /// key other than the one on file is refused.
    Existing,
}

/// Records `keys` for the guest at `host:port` in `known_hosts` (see [`HostKeyTrust`]).
/// Returns how many entries were written.
pub fn record_host_keys(
    known_hosts: &Path,
    host: &str,
    port: u16,
    vmid: u64,
    keys: &[HostKey],
    trust: HostKeyTrust,
) -> Result<usize, NodeError> {
    let io = |source| NodeError::KnownHosts {
        path: known_hosts.to_path_buf(),
        source,
    };
    if trust == HostKeyTrust::Recreated {
        forget_host(known_hosts, host, port).map_err(io)?;
    }
    let mut known = KnownHosts::load(known_hosts).map_err(io)?;
    let mut written = 0;
    let mut unknown = Vec::new();
    for key in keys {
        let blob = key.blob();
        match known.check(host, port, &blob) {
            HostKeyStatus::Known => {}
            HostKeyStatus::Unknown => unknown.push(blob),
            HostKeyStatus::Changed { line, .. } | HostKeyStatus::Revoked { line } => {
                return Err(NodeError::HostKeyChanged {
                    vmid,
                    entry: known_hosts::host_entry_name(host, port),
                    known_hosts: known_hosts.to_path_buf(),
                    line,
                });
            }
        }
    }
    // A host with some keys on file and others not: the new types are added, as OpenSSH's
    // UpdateHostKeys does once one known key has been proven.
    for blob in unknown {
        known.append(host, port, &blob).map_err(io)?;
        written += 1;
    }
    Ok(written)
}

/// Removes the lines that name exactly `host:port` (plain or hashed), atomically.
fn forget_host(path: &Path, host: &str, port: u16) -> std::io::Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            let hosts = line.split_whitespace().next().unwrap_or("");
            // Only plain lines for this one host go: a line shared with other hosts, or
            // a `@revoked` one, is left to the strict check, which then names it.
            let only_this = !hosts.contains(',') && !hosts.starts_with('@');
            let names_it = !KnownHosts::parse(Path::new(""), line)
                .known_types(host, port)
                .is_empty();
            !(only_this && names_it)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if kept == text {
        return Ok(());
    }
    let tmp = tmp_beside(path);
    std::fs::write(&tmp, kept)?;
    std::fs::rename(&tmp, path)
}

fn tmp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".provision-{}", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_parses_keys_and_host_keys() {
        let spec = BootstrapSpec {
            authorized_keys: vec![
                "ssh-ed25519 AAAA1 me@here".into(),
                "ssh-ed25519 AAAA2 other".into(),
            ],
            apt_sources: vec![],
        };
        let text = format!(
            "sshd=no\nactive=no\n{MARK}-keys\nfrom=\"10.0.0.1\" ssh-ed25519 AAAA1 old-comment\n\n{MARK}-hostkeys\nssh-ed25519 AAAAC3Nz root@ct\n"
        );
        let s = parse_state(&text, &spec);
        assert!(!s.sshd_installed && !s.sshd_active);
        assert_eq!(s.missing_keys, vec!["ssh-ed25519 AAAA2 other".to_string()]);
        assert_eq!(s.host_keys.len(), 1);
        assert_eq!(s.host_keys[0].key_type, "ssh-ed25519");
        assert_eq!(s.actions().len(), 3);
    }
}
