//! The SSH connections of one destination in a session: the first is made when the session
//! first needs it (a failure is the caller's error, as a direct connect's would be), and
//! is reused by every later command, the plan's reads and the apply's writes alike. A
//! command that finds every connection busy (another target's long step on the same node)
//! opens one more, so targets never wait on each other's commands; all are kept to the end
//! of the session. [`Pool::logins`] counts them (`-v` says it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::transport::ssh::{SshOptions, SshTransport};
use crate::transport::{ExecOutput, Transport, TransportError};

/// The connections to one SSH destination.
pub struct Pool {
    opts: SshOptions,
    idle: Mutex<Vec<SshTransport>>,
    logins: AtomicUsize,
    describe: String,
}

impl Pool {
    /// Connects once with `opts`.
    pub fn open(opts: SshOptions) -> Result<Pool, TransportError> {
        let first = SshTransport::connect(&opts)?;
        Ok(Pool {
            describe: first.describe(),
            opts,
            idle: Mutex::new(vec![first]),
            logins: AtomicUsize::new(1),
        })
    }

    /// How many SSH logins this pool made (a lost connection replaced by its transport
    /// counts too).
    pub fn logins(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let replaced: usize = idle
            .iter()
            .map(|t| t.connections_opened().saturating_sub(1))
            .sum();
        self.logins.load(Ordering::Relaxed) + replaced
    }

    /// Takes in a connection to the same destination made outside the pool (beside its
    /// first, while that one was busy): later commands use it too, and it counts as a login.
    pub fn adopt(&self, t: SshTransport) {
        self.logins.fetch_add(1, Ordering::Relaxed);
        self.give_back(t);
    }

    /// A transport that runs each command on one of this pool's connections.
    pub fn transport(this: &Arc<Pool>) -> Arc<dyn Transport> {
        Arc::new(Pooled(this.clone()))
    }

    fn take(&self) -> Result<SshTransport, TransportError> {
        if let Some(t) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(t);
        }
        let t = SshTransport::connect(&self.opts)?;
        self.logins.fetch_add(1, Ordering::Relaxed);
        Ok(t)
    }

    fn give_back(&self, t: SshTransport) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(t);
    }
}

/// One of a pool's handles: what readers and writers hold.
struct Pooled(Arc<Pool>);

impl Transport for Pooled {
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        let t = self.0.take()?;
        let out = t.exec(command, stdin, timeout);
        self.0.give_back(t);
        out
    }

    fn describe(&self) -> String {
        self.0.describe.clone()
    }
}
