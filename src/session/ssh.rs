//! SSH to guests and nodes, from the inventory and the session's settings, and the keys
//! provision logs in to a guest with.

use super::{Pool, SessionError, Settings};
use crate::compile::render::context::guest_host;
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::inventory::Container;
use crate::inventory::Loaded;
use crate::inventory::node::SshTarget;
use crate::inventory::secret::resolve_local;
use crate::plan::{Action, Plan, Target};
use crate::resources::ResourceSpec;
use crate::transport::ssh::login_keys::{LoginKey, login_keys};
use crate::transport::ssh::{HostKeyPolicy, SshOptions};

/// The SSH connections to the inside of container `name`, logged in once.
pub(super) fn guest_pool(
    loaded: &Loaded,
    name: &str,
    settings: &Settings,
) -> Result<Pool, SessionError> {
    Ok(Pool::open(guest_options(loaded, name, settings)?)?)
}

/// How container `name`'s guest is reached by SSH (see [`guest_pool`]).
pub(super) fn guest_options(
    loaded: &Loaded,
    name: &str,
    settings: &Settings,
) -> Result<SshOptions, SessionError> {
    let ct = loaded
        .inventory
        .nodes
        .values()
        .find_map(|n| n.containers.get(name))
        .ok_or_else(|| Diagnostic::new(format!("no container `{name}` in the inventory")))?;
    Ok(options(guest_address(name, ct)?, &ct.ssh, loaded, settings))
}

/// Where container `name`'s guest is reached by SSH.
pub(super) fn guest_address(name: &str, ct: &Container) -> Result<String, SessionError> {
    Ok(guest_host(ct).ok_or_else(|| {
        Diagnostic::new(format!(
            "container `{name}` has no address to reach it by SSH"
        ))
        .hint("set `ssh: { host: ... }` or a static `ip:` on its first interface")
    })?)
}

/// The SSH connections to node `name` as the inventory says to reach it (root, for `pct`
/// and the root-only edits), host key checked as for guests, logged in once.
pub(super) fn node_pool(
    loaded: &Loaded,
    name: &str,
    settings: &Settings,
) -> Result<Pool, SessionError> {
    Ok(Pool::open(node_options(loaded, name, settings)?)?)
}

/// How node `name` is reached by SSH (see [`node_pool`]).
pub(super) fn node_options(
    loaded: &Loaded,
    name: &str,
    settings: &Settings,
) -> Result<SshOptions, SessionError> {
    let node = loaded
        .inventory
        .nodes
        .get(name)
        .ok_or_else(|| Diagnostic::new(format!("no node `{name}` in the inventory")))?;
    let host = node.ssh.host.as_ref().ok_or_else(|| {
        Diagnostic::new(format!("node `{name}` has no SSH host"))
            .hint("set `ssh: { host: ... }` on the node: GPU facts and root-only edits go over it")
    })?;
    Ok(options(host.to_string(), &node.ssh, loaded, settings))
}

/// The public keys provision logs in to container `ct` with (what its create and its
/// bootstrap give root's `authorized_keys`); an error when there are none, before anything
/// is created: a container made without them cannot be reached.
pub fn guest_login_keys(
    loaded: &Loaded,
    name: &str,
    ct: &Container,
    settings: &Settings,
) -> Result<Vec<LoginKey>, SessionError> {
    let host = guest_host(ct).unwrap_or_default();
    let opts = options(host, &ct.ssh, loaded, settings);
    let keys = login_keys(&opts).map_err(|e| {
        loaded
            .diag(ct.vmid.pos, format!("container `{name}`: {e}"))
            .hint("provision sends the public half of the key it logs in with to the container it creates")
    })?;
    if keys.is_empty() {
        return Err(loaded
            .diag(
                ct.vmid.pos,
                format!("provision has no SSH key to log in to container `{name}` with, so none would reach it"),
            )
            .cause("no `ssh.identity_file`, no ssh-agent with keys (SSH_AUTH_SOCK), and no ~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub")
            .hint("set `ssh: { identity_file: KEY }` on the container (KEY.pub beside it) or load a key into ssh-agent: its public key goes into root's authorized_keys at the create and the bootstrap")
            .into());
    }
    Ok(keys)
}

/// The SSH options for `host` from the inventory's `ssh` and the session's settings.
fn options(host: String, ssh: &SshTarget, loaded: &Loaded, settings: &Settings) -> SshOptions {
    let mut opts = SshOptions::new(host);
    opts.port = Some(ssh.port.value);
    opts.user = Some(ssh.user.to_string());
    opts.identity_file = ssh
        .identity_file
        .as_ref()
        .map(|p| resolve_local(p, &loaded.base_dir));
    opts.proxy_jump = ssh.proxy_jump.as_ref().map(|j| j.to_string());
    opts.known_hosts = settings.known_hosts.clone();
    opts.host_key_policy = if settings.accept_new_host_keys {
        HostKeyPolicy::AcceptNew
    } else {
        HostKeyPolicy::Strict
    };
    opts
}

/// Gives each selected container's create the public keys provision will log in to its
/// guest with (beside the inventory's `ssh_keys`). A container without any is refused by
/// [`refuse_keyless_creates`] once the plan shows it would be created.
pub fn with_login_keys(
    mut desired: Vec<DesiredTarget>,
    loaded: &Loaded,
    settings: &Settings,
) -> Vec<DesiredTarget> {
    for d in &mut desired {
        let Target::Container { name, .. } = &d.target else {
            continue;
        };
        let Some((_, _, ct)) = super::guest::find(loaded, name) else {
            continue;
        };
        let Ok(keys) = guest_login_keys(loaded, name, ct, settings) else {
            continue;
        };
        for r in &mut d.resources {
            if let ResourceSpec::Container(spec) = &mut r.spec {
                spec.add_login_keys(
                    keys.iter()
                        .map(|k| (k.line.clone(), format!("{} from {}", k.fingerprint, k.from))),
                );
            }
        }
    }
    desired
}

/// Refuses, before anything changes, a plan that creates (or replaces) a container and
/// then logs in to its guest with no key to log in with: the guest would be unreachable.
/// A container planned without its guest (none declared, or `--target container.NAME`)
/// is not logged in to here; a later plan of its guest asks again.
pub fn refuse_keyless_creates(
    plan: &Plan,
    loaded: &Loaded,
    settings: &Settings,
) -> Result<(), SessionError> {
    for t in &plan.targets {
        let Target::Container { name, .. } = &t.target else {
            continue;
        };
        let guest_planned = plan
            .targets
            .iter()
            .any(|g| matches!(&g.target, Target::Guest { name: n, .. } if n == name));
        if !guest_planned {
            continue;
        }
        for c in &t.changes {
            if let ResourceSpec::Container(spec) = &c.spec
                && matches!(c.action, Action::Create | Action::Replace)
                && spec.login_keys.is_empty()
                && let Some((_, _, ct)) = super::guest::find(loaded, name)
            {
                guest_login_keys(loaded, name, ct, settings)?;
            }
        }
    }
    Ok(())
}
