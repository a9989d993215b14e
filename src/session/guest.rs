//! Reaching a container's guest when SSH alone cannot, and the bootstrap ordering: a
//! container that is not there yet is planned against an empty world (it is created,
//! bootstrapped through its node and converged in the same apply); a running one that does
//! not answer SSH is read through its node (`pct exec`) and bootstrapped there by apply
//! before SSH takes over.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Api, Session, SessionError};
use crate::access::{EmptyWorld, Listing, TargetReader};
use crate::diagnostic::{Diagnostic, one_line};
use crate::inventory::node::Node;
use crate::inventory::{Container, Loaded};
use crate::node::bootstrap::{self, BootstrapSpec, GuestEntry, HostKeyTrust};
use crate::transport::Transport;
use crate::transport::pct::PctTransport;

/// How long a started container may take to boot and answer SSH after bootstrap.
const SSH_DEADLINE: Duration = Duration::from_secs(120);

/// The container named `name`, with its node's inventory name and settings.
pub fn find<'l>(loaded: &'l Loaded, name: &str) -> Option<(&'l str, &'l Node, &'l Container)> {
    loaded
        .inventory
        .nodes
        .iter()
        .find_map(|(n, node)| Some((n.as_str(), node, node.containers.get(name)?)))
}

/// How the guest of a container is read for a plan.
pub enum GuestRead {
    /// Over SSH, as usual.
    Ssh(Arc<dyn Transport>),
    /// Through the node (`pct exec`): the guest does not answer SSH yet.
    Node(Arc<dyn Transport>),
    /// Not at all: the container is not there or not running; planned as new.
    Empty(Box<dyn TargetReader>),
}

impl<A: Api> Session<'_, A> {
    /// How to read guest `name` for a plan, given what the node's listing said about its
    /// container (`listing`, when its container is read in this run).
    pub fn plan_read(
        &self,
        name: &str,
        listing: Option<&Listing>,
    ) -> Result<GuestRead, SessionError> {
        let Some((node_name, node, ct)) = find(self.loaded, name) else {
            return Ok(GuestRead::Ssh(self.guest_ssh(name)?));
        };
        let vmid = ct.vmid.value;
        let state = listing.map(|l| l.get(&vmid).map(|(_, running)| *running));
        match state {
            Some(None) | Some(Some(false)) => {
                let why = if state == Some(None) {
                    "does not exist yet"
                } else {
                    "is stopped"
                };
                let then = if node.ssh.host.is_some() {
                    ", bootstraps it through the node"
                } else {
                    ""
                };
                if state == Some(None) {
                    self.printer.warn(&format!(
                        "guest.{name}: CT {vmid} {why}; its guest is planned as new (apply creates and starts it{then}, then converges it over SSH)"
                    ));
                    return Ok(GuestRead::Empty(Box::new(EmptyWorld { not_read: None })));
                }
                // A stopped container's guest is there but cannot be reached: not planned
                // as if empty (that would list everything as missing), but known only once
                // apply has started it.
                Ok(GuestRead::Empty(Box::new(EmptyWorld {
                    not_read: Some(format!(
                        "CT {vmid} {why}: apply starts it{then}, then reads the guest and changes only what differs"
                    )),
                })))
            }
            _ => match self.guest_ssh(name) {
                Ok(t) => Ok(GuestRead::Ssh(t)),
                Err(e) if node.ssh.host.is_some() && state.is_some() => {
                    self.printer.warn(&format!(
                        "guest.{name}: does not answer SSH ({}); read through node {node_name} (pct exec), apply bootstraps it first",
                        first_line(&e)
                    ));
                    Ok(GuestRead::Node(Arc::new(PctTransport::new(
                        self.node_ssh(node_name)?,
                        vmid as u32,
                    ))))
                }
                Err(e) => Err(e),
            },
        }
    }

    /// The SSH connection to guest `name` for apply: the one its plan was read over when
    /// there is one; when provision has just created the container ([`Fresh::Created`]),
    /// or SSH does not answer, the guest is bootstrapped through its node first (sshd and
    /// keys where missing, host keys recorded from the node), then SSH takes over, retried
    /// while the container boots. A guest whose container this apply rebooted
    /// ([`Fresh::Rebooted`]) is reached again once it has booted: the plan's connection
    /// went with the reboot.
    pub fn apply_connect(
        &self,
        name: &str,
        fresh: Fresh,
    ) -> Result<Arc<dyn Transport>, SessionError> {
        let Some((node_name, node, ct)) = find(self.loaded, name) else {
            return self.guest_ssh(name);
        };
        if fresh != Fresh::No {
            // Any connection the plan made reached the container before its reboot, or
            // the one this apply replaced.
            self.guest_ssh.forget(name);
        }
        if fresh == Fresh::Rebooted {
            let started = Instant::now();
            if node.ssh.host.is_some() {
                wait_booted(&PctTransport::new(
                    self.node_ssh(node_name)?,
                    ct.vmid.value as u32,
                ));
            }
            let t = self.retry_ssh(name, "its container's reboot")?;
            self.printer.status(&format!(
                "guest.{name}: booted again after CT {}'s reboot; SSH answers ... done ({:.1}s)",
                ct.vmid.value,
                started.elapsed().as_secs_f64()
            ));
            return Ok(t);
        }
        let first = if fresh == Fresh::Created {
            None
        } else {
            match self.guest_ssh(name) {
                Ok(t) => return Ok(t),
                Err(e) if node.ssh.host.is_none() => return Err(e),
                Err(e) => Some(e),
            }
        };
        let host = super::ssh::guest_address(name, ct)?;
        let known_hosts = known_hosts_path(self.settings.known_hosts.as_ref())?;
        let vmid = ct.vmid.value;
        let started = Instant::now();
        let ctt = PctTransport::new(self.node_ssh(node_name)?, vmid as u32);
        wait_booted(&ctt);
        // The inventory's keys and the ones provision logs in with: the SSH that takes over
        // below uses the latter.
        let mut authorized_keys: Vec<String> = ct.ssh_keys.iter().map(|k| k.to_string()).collect();
        for k in super::ssh::guest_login_keys(self.loaded, name, ct, &self.settings)? {
            authorized_keys.push(k.line);
        }
        let spec = BootstrapSpec {
            authorized_keys,
            apt_sources: Vec::new(),
        };
        let trust = if fresh == Fresh::Created {
            HostKeyTrust::Recreated
        } else {
            HostKeyTrust::Existing
        };
        let report = bootstrap::hand_over(
            &ctt,
            &spec,
            GuestEntry {
                known_hosts: &known_hosts,
                host: &host,
                port: ct.ssh.port.value,
            },
            trust,
        )
        .map_err(|e| {
            let d = Diagnostic::new(format!(
                "bootstrap of guest.{name} through node {node_name} failed"
            ))
            .cause(e.to_string());
            match &first {
                Some(ssh) => d.cause(format!("SSH first: {}", first_line(ssh))),
                None => d,
            }
        })?;
        let done = if report.done.is_empty() {
            "sshd and keys already there".to_string()
        } else {
            report.done.join(", ")
        };
        self.printer.status(&format!(
            "guest.{name}: bootstrap through node {node_name} (pct exec/push): {done}; its {} host key(s), read through the node, on file in {} ... done ({:.1}s)",
            report.host_keys.len(),
            known_hosts.display(),
            started.elapsed().as_secs_f64()
        ));
        self.retry_ssh(name, "its bootstrap")
    }

    /// SSH to guest `name`, retried while its sshd may still be starting, until the
    /// deadline; then why, `after` what.
    fn retry_ssh(&self, name: &str, after: &str) -> Result<Arc<dyn Transport>, SessionError> {
        let deadline = Instant::now() + SSH_DEADLINE;
        loop {
            match self.guest_ssh(name) {
                Ok(t) => return Ok(t),
                Err(e) if Instant::now() >= deadline => {
                    return Err(SessionError::While {
                        what: format!(
                            "guest.{name} does not answer SSH {}s after {after}",
                            SSH_DEADLINE.as_secs()
                        ),
                        source: Box::new(e),
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_secs(1)),
            }
        }
    }
}

/// How new the guest apply reaches is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fresh {
    /// Its container ran through the plan: the plan's connection still reaches it.
    No,
    /// Its container was created or replaced by this apply.
    Created,
    /// Its container was rebooted by this apply.
    Rebooted,
}

/// Waits (up to the SSH deadline) until the container's systemd has finished booting, so
/// what comes next sees its services started, and `systemctl` answers at all.
fn wait_booted(ct: &PctTransport) {
    let _ = ct.exec(
        "systemctl is-system-running --wait >/dev/null 2>&1; true",
        &[],
        SSH_DEADLINE,
    );
}

fn first_line(e: &SessionError) -> String {
    one_line(e).lines().next().unwrap_or("").to_string()
}

/// The `known_hosts` the guest connection checks.
fn known_hosts_path(given: Option<&PathBuf>) -> Result<PathBuf, SessionError> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| Diagnostic::new("no --known-hosts given and HOME is unset"))?;
    Ok(PathBuf::from(home).join(".ssh/known_hosts"))
}
