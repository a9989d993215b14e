//! Reaching a container's guest when SSH alone cannot: a container that is not there yet
//! is planned against an empty world (it is created, bootstrapped and converged in the
//! same apply); a running one that does not answer SSH is read through its node
//! (`pct exec`) and bootstrapped there by apply before SSH takes over.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ssh::{guest_transport, node_transport};
use super::targets::TargetArgs;
use crate::access::{EmptyWorld, SeenContainers, TargetReader};
use crate::compile::render::context::guest_host;
use crate::diagnostic::Diagnostic;
use crate::inventory::node::Node;
use crate::inventory::{Container, Loaded};
use crate::node::bootstrap::{self, BootstrapSpec, GuestEntry, HostKeyTrust};
use crate::printer::Printer;
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

/// How to read guest `name` for a plan, given what the node's listing said about its
/// container (`seen`, when its container was read in this run).
pub fn plan_read(
    loaded: &Loaded,
    name: &str,
    seen: Option<&SeenContainers>,
    args: &TargetArgs,
    printer: &Printer,
) -> anyhow::Result<GuestRead> {
    let Some((node_name, node, ct)) = find(loaded, name) else {
        return Ok(GuestRead::Ssh(guest_transport(loaded, name, args)?));
    };
    let vmid = ct.vmid.value;
    let state = seen.and_then(|s| s.lock().ok().map(|s| s.get(&vmid).copied()));
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
                printer.warn(&format!(
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
        _ => match guest_transport(loaded, name, args) {
            Ok(t) => Ok(GuestRead::Ssh(t)),
            Err(e) if node.ssh.host.is_some() && state.is_some() => {
                printer.warn(&format!(
                    "guest.{name}: does not answer SSH ({}); read through node {node_name} (pct exec), apply bootstraps it first",
                    first_line(&e)
                ));
                let node_t = node_transport(loaded, node_name, args)?;
                Ok(GuestRead::Node(Arc::new(PctTransport::new(
                    node_t,
                    vmid as u32,
                ))))
            }
            Err(e) => Err(e),
        },
    }
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}").lines().next().unwrap_or("").to_string()
}

/// The SSH connection to guest `name` for apply: when provision has just created the
/// container (`created`), or SSH does not answer, the guest is bootstrapped through its
/// node first (sshd and keys where missing, host keys recorded from the node), then SSH
/// takes over, retried while the container boots.
pub fn apply_connect(
    loaded: &Loaded,
    name: &str,
    created: bool,
    args: &TargetArgs,
    printer: &Printer,
) -> anyhow::Result<Arc<dyn Transport>> {
    let Some((node_name, node, ct)) = find(loaded, name) else {
        return guest_transport(loaded, name, args);
    };
    let first = if created {
        None
    } else {
        match guest_transport(loaded, name, args) {
            Ok(t) => return Ok(t),
            Err(e) if node.ssh.host.is_none() => return Err(e),
            Err(e) => Some(e),
        }
    };
    let host = guest_host(ct).ok_or_else(|| {
        Diagnostic::new(format!(
            "container `{name}` has no address to reach it by SSH"
        ))
        .hint("set `ssh: { host: ... }` or a static `ip:` on its first interface")
    })?;
    let known_hosts = known_hosts_path(args)?;
    let vmid = ct.vmid.value;
    let started = Instant::now();
    let ctt = PctTransport::new(node_transport(loaded, node_name, args)?, vmid as u32);
    // sshd is enabled by the template's systemd; wait for it to finish booting so
    // bootstrap sees the real state (and `systemctl` answers at all).
    let _ = ctt.exec(
        "systemctl is-system-running --wait >/dev/null 2>&1; true",
        &[],
        SSH_DEADLINE,
    );
    // The inventory's keys and the ones provision logs in with: the SSH that takes over
    // below uses the latter.
    let mut authorized_keys: Vec<String> = ct.ssh_keys.iter().map(|k| k.to_string()).collect();
    for k in super::ssh::guest_login_keys(loaded, name, ct, args)? {
        authorized_keys.push(k.line);
    }
    let spec = BootstrapSpec {
        authorized_keys,
        apt_sources: Vec::new(),
    };
    let trust = if created {
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
    printer.status(&format!(
        "guest.{name}: bootstrap through node {node_name} (pct exec/push): {done}; its {} host key(s), read through the node, on file in {} ... done ({:.1}s)",
        report.host_keys.len(),
        known_hosts.display(),
        started.elapsed().as_secs_f64()
    ));
    // sshd may still be starting: retry until the deadline, then say why.
    let deadline = Instant::now() + SSH_DEADLINE;
    loop {
        match guest_transport(loaded, name, args) {
            Ok(t) => return Ok(t),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!(
                    "guest.{name} does not answer SSH {}s after its bootstrap",
                    SSH_DEADLINE.as_secs()
                )));
            }
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

/// The `known_hosts` the guest connection checks.
fn known_hosts_path(args: &TargetArgs) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.known_hosts {
        return Ok(p.clone());
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| Diagnostic::new("no --known-hosts given and HOME is unset"))?;
    Ok(PathBuf::from(home).join(".ssh/known_hosts"))
}
