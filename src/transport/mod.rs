//! How commands reach a target. Resources never care which transport carries them: the
//! local machine ([`local::LocalTransport`]), SSH to a node or guest, or `pct exec` through
//! the node before the guest has SSH.

pub mod local;
pub mod pct;
pub mod quote;
#[cfg(feature = "cli")]
pub mod ssh;
/// Without the SSH client (the agent's build): only the known-hosts file, which the
/// transport's errors and the node's bootstrap name.
#[cfg(not(feature = "cli"))]
pub mod ssh {
    pub mod known_hosts;
}

use std::path::PathBuf;
use std::time::Duration;

pub use quote::{shell_join, shell_quote};

/// What a command left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status; `None` when killed by a signal.
    pub status: Option<i32>,
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// Whether the command exited 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Why a command could not be run (not: why it failed; that is its exit status).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The connection or process could not be started.
    #[error("cannot reach {target}: {reason}")]
    Unreachable {
        /// The target as described by the transport.
        target: String,
        /// What went wrong.
        reason: String,
    },
    /// The command ran past its deadline and was killed.
    #[error("`{command}` on {target} did not finish within {timeout:?}")]
    Timeout {
        /// The target as described by the transport.
        target: String,
        /// The command, abbreviated.
        command: String,
        /// The deadline it had.
        timeout: Duration,
    },
    /// Reading or writing the command's streams failed.
    #[error("i/o with {target}: {source}")]
    Io {
        /// The target as described by the transport.
        target: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The host presented a key that `known_hosts` does not hold, under the strict policy.
    #[error(
        "the host key of {target} is not known: {key_type} {fingerprint}\n\
         hint: check the fingerprint with the host's owner (on the host: `ssh-keygen -lf` on its \
         /etc/ssh/ssh_host_*_key.pub), then run again with --accept-new-host-keys to add it to {}",
        known_hosts.display()
    )]
    UnknownHostKey {
        /// `host:port`.
        target: String,
        /// The presented key's type, e.g. `ssh-ed25519`.
        key_type: String,
        /// `SHA256:...`, as OpenSSH prints it.
        fingerprint: String,
        /// The file that was searched.
        known_hosts: PathBuf,
    },
    /// The host presented a key other than the one `known_hosts` holds: always refused.
    #[error(
        "the host key of {} has changed: it presents {} {}, but {}:{} holds a different {} \
         key; refusing to connect (someone may be intercepting the connection)\n\
         hint: if the host was reinstalled and the change is expected, remove the old key with \
         `ssh-keygen -f {} -R '{}'` and run again with --accept-new-host-keys",
        .0.target, .0.key_type, .0.fingerprint, .0.known_hosts.display(), .0.line,
        .0.known_type, .0.known_hosts.display(), .0.entry
    )]
    ChangedHostKey(Box<ssh::known_hosts::KeyChange>),
    /// The host presented a key marked `@revoked`.
    #[error(
        "the host key of {target} ({fingerprint}) is revoked at {}:{line}; refusing to connect",
        known_hosts.display()
    )]
    RevokedHostKey {
        /// `host:port`.
        target: String,
        /// The presented key's fingerprint.
        fingerprint: String,
        /// The file with the `@revoked` line.
        known_hosts: PathBuf,
        /// Its 1-based line.
        line: usize,
    },
    /// No key was accepted for the login.
    #[error(
        "cannot log in to {target}: no key was accepted (tried: {})\n\
         hint: add the public key to ~/.ssh/authorized_keys on the host, or name the private key \
         (identity_file, IdentityFile in ~/.ssh/config) or load it into ssh-agent",
        tried.join("; ")
    )]
    AuthFailed {
        /// `user@host:port`.
        target: String,
        /// Each key source tried and why it failed.
        tried: Vec<String>,
    },
    /// The SSH options or the ssh config file are unusable.
    #[error("ssh settings for {target}: {reason}")]
    Config {
        /// The host as given.
        target: String,
        /// What is wrong.
        reason: String,
    },
}

/// Runs shell command lines on one target.
pub trait Transport: Send + Sync {
    /// Runs `command` (a POSIX shell command line, built with [`shell_quote`]) with `stdin`
    /// fed to it, killing it after `timeout`.
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError>;

    /// A short description for messages, e.g. `root@10.77.0.10:22` or `local`.
    fn describe(&self) -> String;
}
