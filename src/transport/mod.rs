//! How commands reach a target. Resources never care which transport carries them: the
//! local machine ([`local::LocalTransport`]), SSH to a node or guest, or `pct exec` through
//! the node before the guest has SSH.

pub mod local;
pub mod quote;

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
