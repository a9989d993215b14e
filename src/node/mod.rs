//! Work on the Proxmox node itself, over node SSH as root: bootstrapping a container
//! through `pct` before it answers SSH, root-only edits of its config under Proxmox's
//! config lock, and GPU passthrough lines from the node's live GPU facts.

pub mod access;
pub mod bootstrap;
pub mod config_edit;
pub mod gpu;
pub mod gpu_check;
pub mod installer;
pub mod probe;
pub mod target;

use crate::transport::TransportError;

/// Why a node step failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node or the container could not be reached.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A command on the node or in the container failed.
    #[error("{what} on {target} failed (exit {status:?}): {stderr}")]
    Command {
        /// What was being done.
        what: String,
        /// Where.
        target: String,
        /// Its exit status.
        status: Option<i32>,
        /// The last lines it wrote to stderr.
        stderr: String,
    },
    /// What a container shows of its GPUs could not be read inside it (its agent ran the
    /// view and it failed there, as it would through the node).
    #[error("reading what {target} shows of its GPUs failed: {error}")]
    GpuView {
        /// The guest whose agent ran the view.
        target: String,
        /// Why.
        error: String,
    },
    /// The step ran but reading back shows it did not take effect.
    #[error("{what} on {target} did not take effect: {detail}")]
    NotVerified {
        /// What was being done.
        what: String,
        /// Where.
        target: String,
        /// What was read back.
        detail: String,
    },
    /// Someone else changed the config between our read and our write.
    #[error(
        "the config of CT {vmid} changed on the node while provision was editing it\n\
         hint: run `provision plan` again to see the change against what is there now"
    )]
    Conflict {
        /// The container.
        vmid: u64,
    },
    /// Proxmox's config lock was held past the deadline.
    #[error(
        "can't lock file '{lock}' - got timeout (another config change is running on CT {vmid})"
    )]
    LockTimeout {
        /// The container.
        vmid: u64,
        /// The lock file.
        lock: String,
    },
    /// The operation's time ran out before this command of it.
    #[error(
        "{what} on {target} was not started: its operation's limit ({limit_s}s) has passed\n\
         hint: run the apply again; it goes on from what is there now"
    )]
    OutOfTime {
        /// What was to be done.
        what: String,
        /// Where.
        target: String,
        /// The operation's limit, in seconds.
        limit_s: u64,
    },
    /// The node's config file is not what Proxmox writes.
    #[error("cannot read {path} on the node: {detail}")]
    BadConfig {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A host key read through the node differs from the one on file for the guest.
    #[error(
        "the SSH host keys of {entry} in CT {vmid} differ from those in {} (line {line}), and \
         provision did not recreate the container; refusing to trust them\n\
         hint: if the change is expected, remove the old keys with `ssh-keygen -f {} -R '{entry}'` \
         and run again",
        known_hosts.display(), known_hosts.display()
    )]
    HostKeyChanged {
        /// The container.
        vmid: u64,
        /// The guest as `known_hosts` names it.
        entry: String,
        /// The file.
        known_hosts: std::path::PathBuf,
        /// The first line holding another key.
        line: usize,
    },
    /// Writing `known_hosts` failed.
    #[error("cannot record host keys in {}: {source}", path.display())]
    KnownHosts {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The last few lines of `text`, for messages.
pub(crate) fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}
