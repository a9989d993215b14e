//! Commands over SSH (libssh2 through the `ssh2` crate): one session per host for the whole
//! run, one channel per command; host keys checked against `known_hosts`; key file and
//! agent authentication; `~/.ssh/config` honoured; ProxyJump through a jump host; connect
//! and command timeouts; keepalive.

mod config;
mod exec;
mod jump;
pub mod known_hosts;
pub mod login_keys;
mod session;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ssh2::Session;

use self::config::{Hop, default_identity_files, expand_tilde, home};
use self::exec::Abandoned;
use self::jump::Tunnel;
use self::known_hosts::KnownHosts;
use self::session::{Keys, Socket};
use super::local::abbreviate;
use super::{ExecOutput, Transport, TransportError, shell_quote};

/// What to do with a host key `known_hosts` does not hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostKeyPolicy {
    /// Unknown and changed keys are refused (the default).
    #[default]
    Strict,
    /// Unknown keys are added to `known_hosts`; changed keys are still refused
    /// (OpenSSH's `StrictHostKeyChecking=accept-new`).
    AcceptNew,
}

/// How to reach one host. Options left `None` come from the ssh config file, then from
/// OpenSSH's defaults.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// Host name, address or ssh config alias.
    pub host: String,
    /// TCP port; else `Port` from the ssh config, else 22.
    pub port: Option<u16>,
    /// Login user; else `User` from the ssh config, else the local user.
    pub user: Option<String>,
    /// The only private key to try; else the agent's keys, then the config's
    /// `IdentityFile`s (or `~/.ssh/id_ed25519`, `id_ecdsa`, `id_rsa` when it names none).
    pub identity_file: Option<PathBuf>,
    /// The ssh-agent socket; else `SSH_AUTH_SOCK`.
    pub agent_socket: Option<PathBuf>,
    /// Jump hosts, `[user@]host[:port]`, comma-separated (`none` for none); else
    /// `ProxyJump` from the ssh config.
    pub proxy_jump: Option<String>,
    /// The `known_hosts` file; else `~/.ssh/known_hosts`.
    pub known_hosts: Option<PathBuf>,
    /// What to do with unknown host keys.
    pub host_key_policy: HostKeyPolicy,
    /// The ssh config file; else `~/.ssh/config` when it exists.
    pub ssh_config: Option<PathBuf>,
    /// Bound on the TCP connect, the handshake, each authentication step and opening a
    /// channel.
    pub connect_timeout: Duration,
    /// Keepalive interval (zero disables keepalives).
    pub keepalive_interval: Duration,
}

impl SshOptions {
    /// Options for `host` with every other setting at its default.
    pub fn new(host: impl Into<String>) -> Self {
        SshOptions {
            host: host.into(),
            port: None,
            user: None,
            identity_file: None,
            agent_socket: None,
            proxy_jump: None,
            known_hosts: None,
            host_key_policy: HostKeyPolicy::Strict,
            ssh_config: None,
            connect_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
        }
    }
}

/// Seconds the remote `timeout` waits after TERM before it sends KILL.
const KILL_AFTER: u64 = 5;
/// How long past the command timeout we wait for the remote side before giving up on it.
const LOCAL_GRACE: Duration = Duration::from_secs(KILL_AFTER + 5);

/// The connection; dropped in field order after `Drop` says goodbye.
struct Conn {
    session: Session,
    /// A second handle on the session's socket, for waiting on it.
    socket: Socket,
    /// Pumps of the jump hosts; joined after the session's socket has closed.
    _tunnels: Vec<Tunnel>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.session.set_blocking(true);
        self.session.set_timeout(1000);
        let _ = self.session.disconnect(None, "done", None);
    }
}

/// A keepalive thread, stopped and joined on drop.
struct Keepalive {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Keepalive {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs commands on one host over one SSH session.
pub struct SshTransport {
    /// First, so the keepalive thread is stopped before the connection is dropped.
    _keepalive: Option<Keepalive>,
    conn: Arc<Mutex<Conn>>,
    opts: SshOptions,
    target: String,
    channels: AtomicUsize,
    connections: AtomicUsize,
}

impl std::fmt::Debug for SshTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshTransport")
            .field("target", &self.target)
            .field("channels", &self.channels_opened())
            .field("connections", &self.connections_opened())
            .finish()
    }
}

impl SshTransport {
    /// Connects (through the jump hosts, if any), checks host keys and logs in.
    pub fn connect(opts: &SshOptions) -> Result<Self, TransportError> {
        let (conn, target) = crate::timing::time("ssh: connect, handshake, login", || open(opts))?;
        let conn = Arc::new(Mutex::new(conn));
        let keepalive = (!opts.keepalive_interval.is_zero())
            .then(|| start_keepalive(&conn, opts.keepalive_interval));
        Ok(SshTransport {
            _keepalive: keepalive,
            conn,
            opts: opts.clone(),
            target,
            channels: AtomicUsize::new(0),
            connections: AtomicUsize::new(1),
        })
    }

    /// How many channels (one per command) have been opened.
    pub fn channels_opened(&self) -> usize {
        self.channels.load(Ordering::Relaxed)
    }

    /// How many SSH connections have been made: 1, plus one for each time a lost
    /// connection was replaced.
    pub fn connections_opened(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        // A panic in another exec leaves the session usable or visibly broken; either way
        // the next libssh2 call reports it.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unreachable(&self, what: &str, e: ssh2::Error) -> TransportError {
        TransportError::Unreachable {
            target: self.target.clone(),
            reason: format!("{what}: {}", e.message()),
        }
    }

    /// Opens a channel for one command. When that fails (the connection was lost while
    /// idle: a reboot, a NAT timeout), connects again once; nothing has run yet, so
    /// trying again is safe.
    fn channel(&self, conn: &mut Conn) -> Result<ssh2::Channel, TransportError> {
        let open_channel = |session: &Session| {
            session.set_blocking(true);
            session.set_timeout(millis(self.opts.connect_timeout));
            // A 16 MiB receive window instead of libssh2's 2 MiB lets big outputs stream
            // without stalling on window adjustments (75 against 50 MiB/s on loopback).
            session.channel_open("session", 16 << 20, 32_768, None)
        };
        let channel = match open_channel(&conn.session) {
            Ok(channel) => channel,
            Err(_) => {
                let (fresh, _) = open(&self.opts)?;
                *conn = fresh;
                self.connections.fetch_add(1, Ordering::Relaxed);
                open_channel(&conn.session)
                    .map_err(|e| self.unreachable("cannot open a channel", e))?
            }
        };
        self.channels.fetch_add(1, Ordering::Relaxed);
        Ok(channel)
    }
}

/// The `known_hosts` file `opts` check host keys against.
fn known_hosts_path(opts: &SshOptions) -> Result<PathBuf, TransportError> {
    match &opts.known_hosts {
        Some(p) => Ok(expand_tilde(p)),
        None => home()
            .map(|h| h.join(".ssh/known_hosts"))
            .ok_or_else(|| TransportError::Config {
                target: opts.host.clone(),
                reason: "no known_hosts file given and HOME is unset".into(),
            }),
    }
}

/// Whether `known_hosts` already holds a key for every server on the way to `opts`'s
/// target (its jump hosts, then itself): a login as `opts` say then adds nothing to the
/// file, whatever their host key policy (a key it holds either matches or is refused).
pub fn hosts_known(opts: &SshOptions) -> bool {
    let (Ok(route), Ok(path)) = (config::resolve(opts), known_hosts_path(opts)) else {
        return false;
    };
    let Ok(known) = KnownHosts::load(&path) else {
        return false;
    };
    route
        .jumps
        .iter()
        .chain(std::iter::once(&route.target))
        .all(|hop| !known.known_types(&hop.host, hop.port).is_empty())
}

/// Makes one connection as `opts` say: through the jump hosts, host keys checked, logged
/// in. Returns it and the target's description.
fn open(opts: &SshOptions) -> Result<(Conn, String), TransportError> {
    let route = config::resolve(opts)?;
    let known_path = known_hosts_path(opts)?;
    let mut known = KnownHosts::load(&known_path).map_err(|e| TransportError::Config {
        target: opts.host.clone(),
        reason: format!("cannot read {}: {e}", known_path.display()),
    })?;
    let agent = opts.agent_socket.clone().or_else(|| {
        std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    });
    let files_for = |hop: &Hop| -> Vec<PathBuf> {
        if hop.identity_files.is_empty() {
            default_identity_files()
        } else {
            hop.identity_files.clone()
        }
    };
    let timeout = opts.connect_timeout;
    let first = route.jumps.first().unwrap_or(&route.target);
    let mut socket = Socket::connect(first, timeout)?;
    let mut tunnels = Vec::new();
    for (i, hop) in route.jumps.iter().enumerate() {
        // A jump host is logged into like any host; the target's key file comes last,
        // since the same key often opens both.
        let mut files = files_for(hop);
        files.extend(opts.identity_file.iter().map(|f| expand_tilde(f)));
        let keys = Keys {
            explicit: None,
            agent: agent.clone(),
            files,
        };
        let waiter = socket.try_clone().map_err(|e| TransportError::Io {
            target: hop.address(),
            source: e,
        })?;
        let jump = session::establish(
            socket,
            hop,
            &mut known,
            opts.host_key_policy,
            &keys,
            timeout,
        )?;
        let next = route.jumps.get(i + 1).unwrap_or(&route.target);
        let (next_socket, tunnel) =
            jump::open(jump, waiter, hop, next, keepalive_or_default(opts))?;
        tunnels.push(tunnel);
        socket = next_socket;
    }
    let target = &route.target;
    let keys = Keys {
        explicit: opts.identity_file.as_deref().map(expand_tilde),
        agent,
        files: files_for(target),
    };
    let waiter = socket.try_clone().map_err(|e| TransportError::Io {
        target: target.address(),
        source: e,
    })?;
    let session = session::establish(
        socket,
        target,
        &mut known,
        opts.host_key_policy,
        &keys,
        timeout,
    )?;
    if !opts.keepalive_interval.is_zero() {
        let secs = opts.keepalive_interval.as_secs().clamp(1, u32::MAX as u64) as u32;
        session.set_keepalive(true, secs);
    }
    let conn = Conn {
        session,
        socket: waiter,
        _tunnels: tunnels,
    };
    Ok((conn, target.describe()))
}

impl Transport for SshTransport {
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        let mut conn = self.lock();
        let mut channel = self.channel(&mut conn)?;
        let session = &conn.session;
        // Taken before the request: the remote `timeout` may start counting before `exec`
        // returns here, and its 124 must still be seen as past the deadline.
        let started = Instant::now();
        channel
            .exec(&remote_command(command, timeout))
            .map_err(|e| self.unreachable("cannot start the command", e))?;
        let deadline = started.checked_add(timeout.saturating_add(LOCAL_GRACE));
        session.set_blocking(false);
        let pumped = exec::pump(session, &conn.socket, &mut channel, stdin, deadline);
        session.set_blocking(true);
        let timed_out = || TransportError::Timeout {
            target: self.target.clone(),
            command: abbreviate(command),
            timeout,
        };
        // Gives up on a channel without waiting long for the server to agree.
        let abandon = |mut channel: ssh2::Channel| {
            session.set_timeout(1000);
            let _ = channel.close();
            drop(channel);
            session.set_timeout(millis(self.opts.connect_timeout));
        };
        let finished = match pumped {
            Ok(f) => f,
            Err(Abandoned::Deadline) => {
                // The remote `timeout` should have ended it long ago; do not wait on it.
                abandon(channel);
                return Err(timed_out());
            }
            Err(Abandoned::Io(source)) => {
                abandon(channel);
                return Err(TransportError::Io {
                    target: self.target.clone(),
                    source,
                });
            }
        };
        // Output has ended but the process may run on (it closed its stdout and stderr):
        // wait for its exit up to the command's own deadline, as the remote `timeout` does.
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        session.set_timeout(millis(left));
        if let Err(e) = channel.wait_close() {
            abandon(channel);
            return Err(if e.code() == ssh2::ErrorCode::Session(-9) {
                timed_out()
            } else {
                self.unreachable("the command's channel failed", e)
            });
        }
        session.set_timeout(millis(self.opts.connect_timeout));
        let signal = channel.exit_signal().ok().and_then(|s| s.exit_signal);
        let status = match signal {
            Some(_) => None,
            None => Some(
                channel
                    .exit_status()
                    .map_err(|e| self.unreachable("no exit status", e))?,
            ),
        };
        // `timeout` exits 124 after TERM; after KILL (sent to its whole process group,
        // itself included) it dies of the signal or exits 137. A command that exits 124 on
        // its own before its deadline is not a timeout.
        let killed = matches!(status, Some(124 | 137)) || signal.as_deref() == Some("KILL");
        if killed && started.elapsed() >= timeout {
            return Err(timed_out());
        }
        Ok(ExecOutput {
            status,
            stdout: finished.stdout,
            stderr: finished.stderr,
        })
    }

    fn describe(&self) -> String {
        self.target.clone()
    }
}

/// The command line sent to the server: `command` under coreutils' `timeout`, so the
/// remote process (its whole process group) does not outlive the deadline even when the
/// connection is lost.
fn remote_command(command: &str, timeout: Duration) -> String {
    // `timeout 0` would mean no limit; ten years is as good as none.
    let t = timeout.clamp(Duration::from_millis(1), Duration::from_secs(315_360_000));
    format!(
        "timeout --kill-after={KILL_AFTER} {}.{:03} sh -c {}",
        t.as_secs(),
        t.subsec_millis(),
        shell_quote(command)
    )
}

fn millis(d: Duration) -> u32 {
    d.as_millis().clamp(1, u32::MAX as u128) as u32
}

fn keepalive_or_default(opts: &SshOptions) -> Duration {
    if opts.keepalive_interval.is_zero() {
        Duration::from_secs(30)
    } else {
        opts.keepalive_interval
    }
}

/// Sends keepalives between commands (during a command, the exec loop sends them).
fn start_keepalive(conn: &Arc<Mutex<Conn>>, interval: Duration) -> Keepalive {
    let (stop, stopped) = mpsc::channel::<()>();
    let conn = Arc::clone(conn);
    let thread = thread::Builder::new()
        .name("ssh-keepalive".into())
        .spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                let _ = conn.session.keepalive_send();
            }
        })
        .ok();
    Keepalive {
        stop: Some(stop),
        thread,
    }
}

/// Whether a libssh2 error only means "try again" (non-blocking mode).
fn would_block(e: &ssh2::Error) -> bool {
    e.code() == ssh2::ErrorCode::Session(-37)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_command_quotes_and_bounds() {
        assert_eq!(
            remote_command("echo 'a b'; exit 3", Duration::from_millis(1500)),
            "timeout --kill-after=5 1.500 sh -c 'echo '\\''a b'\\''; exit 3'"
        );
        assert!(remote_command("true", Duration::ZERO).contains(" 0.001 "));
        assert!(remote_command("true", Duration::MAX).contains(" 315360000.000 "));
    }
}
