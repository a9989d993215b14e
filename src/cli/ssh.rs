//! SSH connections to guests, from the inventory and the command line.

use std::sync::Arc;

use super::targets::TargetArgs;
use crate::diagnostic::Diagnostic;
use crate::inventory::Loaded;
use crate::inventory::node::SshTarget;
use crate::inventory::secret::resolve_local;
use crate::render::context::guest_host;
use crate::transport::Transport;
use crate::transport::ssh::{HostKeyPolicy, SshOptions, SshTransport};

/// An SSH transport to the inside of container `name`: one session for the whole run.
pub fn guest_transport(
    loaded: &Loaded,
    name: &str,
    args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    let ct = loaded
        .inventory
        .nodes
        .values()
        .find_map(|n| n.containers.get(name))
        .ok_or_else(|| Diagnostic::new(format!("no container `{name}` in the inventory")))?;
    let host = guest_host(ct).ok_or_else(|| {
        Diagnostic::new(format!(
            "container `{name}` has no address to reach it by SSH"
        ))
        .hint("set `ssh: { host: ... }` or a static `ip:` on its first interface")
    })?;
    connect_to(host, &ct.ssh, loaded, args)
}

/// One SSH session to `host` with the inventory's settings `ssh` and the command line's
/// host key policy.
fn connect_to(
    host: String,
    ssh: &SshTarget,
    loaded: &Loaded,
    args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    let mut opts = SshOptions::new(host);
    opts.port = Some(ssh.port.value);
    opts.user = Some(ssh.user.to_string());
    opts.identity_file = ssh
        .identity_file
        .as_ref()
        .map(|p| resolve_local(p, &loaded.base_dir));
    opts.proxy_jump = ssh.proxy_jump.as_ref().map(|j| j.to_string());
    opts.known_hosts = args.known_hosts.clone();
    opts.host_key_policy = if args.accept_new_host_keys {
        HostKeyPolicy::AcceptNew
    } else {
        HostKeyPolicy::Strict
    };
    Ok(Arc::new(SshTransport::connect(&opts)?))
}

/// An SSH transport to node `name` as the inventory says to reach it (root, for `pct`
/// and the root-only edits): one session for the whole run, host key checked as for
/// guests.
pub fn node_transport(
    loaded: &Loaded,
    name: &str,
    args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    let node = loaded
        .inventory
        .nodes
        .get(name)
        .ok_or_else(|| Diagnostic::new(format!("no node `{name}` in the inventory")))?;
    let host = node.ssh.host.as_ref().ok_or_else(|| {
        Diagnostic::new(format!("node `{name}` has no SSH host"))
            .hint("set `ssh: { host: ... }` on the node: GPU facts and root-only edits go over it")
    })?;
    connect_to(host.to_string(), &node.ssh, loaded, args)
}
