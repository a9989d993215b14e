//! Commands in a container through its Proxmox node: `pct exec VMID -- sh -c …` and
//! `pct push` over the node's SSH session (root, pinned host key). This reaches a fresh
//! container before it has sshd or a key, so the same agent can be pushed and run there.

use std::sync::Arc;
use std::time::Duration;

use super::{ExecOutput, Transport, TransportError, shell_quote};

/// `pct` answers its own errors with exit status 255 and one of these on stderr; a
/// command inside the container that exits 255 says none of them.
const PCT_ERRORS: &[&str] = &[
    "not running",
    "does not exist",
    "is locked",
    "exec lxc-attach failed",
    "unable to open file",
    "failed to write file",
];

/// Runs commands inside container `vmid` through the node's `pct`.
pub struct PctTransport {
    node: Arc<dyn Transport>,
    vmid: u32,
}

impl std::fmt::Debug for PctTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PctTransport")
            .field("node", &self.node.describe())
            .field("vmid", &self.vmid)
            .finish()
    }
}

impl PctTransport {
    /// Commands for container `vmid`, carried by `node` (SSH to the node as root).
    pub fn new(node: Arc<dyn Transport>, vmid: u32) -> Self {
        PctTransport { node, vmid }
    }

    /// The container's vmid.
    pub fn vmid(&self) -> u32 {
        self.vmid
    }

    /// The transport to the node itself.
    pub fn node(&self) -> &Arc<dyn Transport> {
        &self.node
    }

    /// Writes `content` to `dest` in the container with `pct push` (mode, owner root),
    /// atomically: pushed beside `dest`, then renamed over it inside the container, so a
    /// reader never sees half a file. One round trip to the node.
    pub fn push(&self, content: &[u8], dest: &str, mode: u32) -> Result<(), TransportError> {
        let vmid = self.vmid;
        let tmp = format!("{dest}.provision-push");
        let script = format!(
            "set -e; t=$(mktemp); trap 'rm -f \"$t\"' EXIT; cat > \"$t\"; \
             pct push {vmid} \"$t\" {tmp} --perms {mode:04o} --user 0 --group 0; \
             pct exec {vmid} -- mv -f {tmp} {dest}",
            tmp = shell_quote(&tmp),
            dest = shell_quote(dest),
        );
        let out = self.node.exec(&script, content, Duration::from_secs(300))?;
        if !out.success() {
            return Err(TransportError::Unreachable {
                target: self.describe(),
                reason: format!(
                    "pct push to {dest} failed (exit {:?}): {}",
                    out.status,
                    out.stderr_text().trim()
                ),
            });
        }
        Ok(())
    }

    /// Copies `src`, a file on the node, to `dest` in the container with `pct push` (mode,
    /// owner root), atomically as [`PctTransport::push`] does; `dest`'s folder is made.
    pub fn push_file(&self, src: &str, dest: &str, mode: u32) -> Result<(), TransportError> {
        let vmid = self.vmid;
        let tmp = format!("{dest}.provision-push");
        let dir = dest.rsplit_once('/').map_or("/", |(d, _)| d);
        let script = format!(
            "set -e; pct exec {vmid} -- mkdir -p {dir}; \
             pct push {vmid} {src} {tmp} --perms {mode:04o} --user 0 --group 0; \
             pct exec {vmid} -- mv -f {tmp} {dest}",
            dir = shell_quote(dir),
            src = shell_quote(src),
            tmp = shell_quote(&tmp),
            dest = shell_quote(dest),
        );
        let out = self.node.exec(&script, &[], Duration::from_secs(600))?;
        if !out.success() {
            return Err(TransportError::Unreachable {
                target: self.describe(),
                reason: format!(
                    "pct push of {src} to {dest} failed (exit {:?}): {}",
                    out.status,
                    out.stderr_text().trim()
                ),
            });
        }
        Ok(())
    }
}

impl Transport for PctTransport {
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        // `pct exec` clears the environment; a PATH keeps the usual tools findable.
        let line = format!(
            "pct exec {} -- /usr/bin/env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c {}",
            self.vmid,
            shell_quote(command)
        );
        let out = self.node.exec(&line, stdin, timeout)?;
        if out.status == Some(255) {
            let stderr = out.stderr_text();
            let first = stderr.lines().next().unwrap_or("").trim();
            if PCT_ERRORS.iter().any(|e| first.contains(e)) {
                return Err(TransportError::Unreachable {
                    target: self.describe(),
                    reason: format!("pct exec: {first}"),
                });
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("CT {} via {}", self.vmid, self.node.describe())
    }
}
