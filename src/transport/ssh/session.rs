//! One SSH session up to the point commands can run: handshake over a socket, the host key
//! checked against `known_hosts`, then public key authentication (agent, key files).

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ssh2::{MethodType, Session};

use super::HostKeyPolicy;
use super::config::Hop;
use super::known_hosts::{self, HostKeyStatus, KeyChange, KnownHosts};
use crate::transport::TransportError;

/// The socket under a session: TCP to the first hop, or our end of a tunnel through a jump
/// host.
#[derive(Debug)]
pub(crate) enum Socket {
    /// A direct TCP connection.
    Tcp(TcpStream),
    /// One end of a socket pair whose other end a tunnel pump serves.
    Unix(UnixStream),
}

impl Socket {
    /// Connects to `hop` over TCP, trying each address it resolves to within `timeout`.
    pub fn connect(hop: &Hop, timeout: Duration) -> Result<Socket, TransportError> {
        let unreachable = |reason: String| TransportError::Unreachable {
            target: hop.address(),
            reason,
        };
        let addrs = (hop.host.as_str(), hop.port)
            .to_socket_addrs()
            .map_err(|e| unreachable(format!("cannot resolve {}: {e}", hop.host)))?;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    // Small command packets must not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    return Ok(Socket::Tcp(stream));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(unreachable(match last {
            Some(e) => format!("cannot connect to {}: {e}", hop.address()),
            None => format!("{} resolves to no address", hop.host),
        }))
    }

    /// A second handle on the same socket, to wait on while libssh2 owns the first.
    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(s) => s.as_fd(),
            Socket::Unix(s) => s.as_fd(),
        }
    }
}

/// Where keys for authentication come from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    /// A key file named explicitly: the only one tried.
    pub explicit: Option<PathBuf>,
    /// The ssh-agent socket, when there is one.
    pub agent: Option<PathBuf>,
    /// Key files tried after the agent's keys.
    pub files: Vec<PathBuf>,
}

/// Opens an authenticated session to `hop` over `socket`, checking its host key.
pub(crate) fn establish(
    socket: Socket,
    hop: &Hop,
    known: &mut KnownHosts,
    policy: HostKeyPolicy,
    keys: &Keys,
    timeout: Duration,
) -> Result<Session, TransportError> {
    let unreachable = |reason: String| TransportError::Unreachable {
        target: hop.address(),
        reason,
    };
    let mut session = Session::new().map_err(|e| unreachable(e.to_string()))?;
    session.set_timeout(timeout.as_millis().clamp(1, u32::MAX as u128) as u32);
    prefer_known_key_types(&session, known, hop);
    session.set_tcp_stream(socket);
    session
        .handshake()
        .map_err(|e| unreachable(format!("SSH handshake failed: {}", e.message())))?;
    check_host_key(&session, hop, known, policy)?;
    authenticate(&session, hop, keys)?;
    Ok(session)
}

/// Asks the server for a key type `known_hosts` already holds for this host, so a host
/// with several keys presents one we can check (OpenSSH orders its algorithms the same way).
fn prefer_known_key_types(session: &Session, known: &KnownHosts, hop: &Hop) {
    let known_types = known.known_types(&hop.host, hop.port);
    if known_types.is_empty() {
        return;
    }
    let Ok(supported) = session.supported_algs(MethodType::HostKey) else {
        return;
    };
    let mut order: Vec<&str> = Vec::new();
    for t in &known_types {
        let algs: &[&str] = match t.as_str() {
            "ssh-rsa" => &["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"],
            other => &[other][..],
        };
        for alg in algs {
            if let Some(a) = supported.iter().find(|s| *s == alg)
                && !order.contains(a)
            {
                order.push(a);
            }
        }
    }
    for alg in &supported {
        if !order.contains(alg) {
            order.push(alg);
        }
    }
    // Best effort: if libssh2 refuses the list, its default order still works.
    let _ = session.method_pref(MethodType::HostKey, &order.join(","));
}

fn check_host_key(
    session: &Session,
    hop: &Hop,
    known: &mut KnownHosts,
    policy: HostKeyPolicy,
) -> Result<(), TransportError> {
    let (blob, _) = session
        .host_key()
        .ok_or_else(|| TransportError::Unreachable {
            target: hop.address(),
            reason: "the server sent no host key".into(),
        })?;
    let key_type = known_hosts::key_type(blob).unwrap_or("unknown").to_string();
    let fingerprint = known_hosts::fingerprint(blob);
    match known.check(&hop.host, hop.port, blob) {
        HostKeyStatus::Known => Ok(()),
        HostKeyStatus::Unknown => {
            match policy {
                HostKeyPolicy::AcceptNew => known.append(&hop.host, hop.port, blob).map_err(|e| {
                    TransportError::Unreachable {
                        target: hop.address(),
                        reason: format!(
                            "cannot add its host key to {}: {e}",
                            known.path().display()
                        ),
                    }
                }),
                HostKeyPolicy::Strict => Err(TransportError::UnknownHostKey {
                    target: hop.address(),
                    key_type,
                    fingerprint,
                    known_hosts: known.path().to_path_buf(),
                }),
            }
        }
        HostKeyStatus::Changed { line, known_type } => {
            Err(TransportError::ChangedHostKey(Box::new(KeyChange {
                target: hop.address(),
                entry: known_hosts::host_entry_name(&hop.host, hop.port),
                key_type,
                fingerprint,
                known_type,
                known_hosts: known.path().to_path_buf(),
                line,
            })))
        }
        HostKeyStatus::Revoked { line } => Err(TransportError::RevokedHostKey {
            target: hop.address(),
            fingerprint,
            known_hosts: known.path().to_path_buf(),
            line,
        }),
    }
}

/// Tries the explicit key file alone, or the agent's keys and then the key files, and
/// reports everything tried when none is accepted.
fn authenticate(session: &Session, hop: &Hop, keys: &Keys) -> Result<(), TransportError> {
    let mut tried: Vec<String> = Vec::new();
    if let Some(file) = &keys.explicit {
        if try_key_file(session, &hop.user, file, &mut tried) {
            return Ok(());
        }
    } else {
        if let Some(socket) = &keys.agent
            && try_agent(session, &hop.user, socket, &mut tried)
        {
            return Ok(());
        }
        for file in &keys.files {
            if file.exists() && try_key_file(session, &hop.user, file, &mut tried) {
                return Ok(());
            }
        }
    }
    if tried.is_empty() {
        tried.push("no ssh-agent (SSH_AUTH_SOCK is unset) and no key file found".into());
    }
    Err(TransportError::AuthFailed {
        target: hop.describe(),
        tried,
    })
}

fn try_key_file(session: &Session, user: &str, file: &Path, tried: &mut Vec<String>) -> bool {
    if let Err(e) = std::fs::File::open(file) {
        tried.push(format!("key file {}: cannot be read: {e}", file.display()));
        return false;
    }
    let public = PathBuf::from(format!("{}.pub", file.display()));
    let public = public.exists().then_some(public.as_path());
    match session.userauth_pubkey_file(user, public, file, None) {
        Ok(()) if session.authenticated() => true,
        Ok(()) => {
            tried.push(format!("key file {}: refused", file.display()));
            false
        }
        Err(e) => {
            // -18: the server does not accept this public key. -16 and -19: the private
            // key could not be loaded or could not sign, which is what a passphrase does.
            let why = match e.code() {
                ssh2::ErrorCode::Session(-18) => "refused by the server".to_string(),
                ssh2::ErrorCode::Session(-16 | -19) => format!(
                    "cannot be loaded ({}; keys with a passphrase must go through ssh-agent)",
                    e.message()
                ),
                _ => e.message().to_string(),
            };
            tried.push(format!("key file {}: {why}", file.display()));
            false
        }
    }
}

fn try_agent(session: &Session, user: &str, socket: &Path, tried: &mut Vec<String>) -> bool {
    let label = format!("ssh-agent at {}", socket.display());
    let mut agent = match session.agent() {
        Ok(agent) => agent,
        Err(e) => {
            tried.push(format!("{label}: {}", e.message()));
            return false;
        }
    };
    if let Err(e) = agent
        .set_identity_path(socket)
        .and_then(|()| agent.connect())
        .and_then(|()| agent.list_identities())
    {
        tried.push(format!("{label}: cannot be used: {}", e.message()));
        return false;
    }
    let identities = agent.identities().unwrap_or_default();
    if identities.is_empty() {
        tried.push(format!("{label}: holds no keys"));
    }
    for identity in &identities {
        if agent.userauth(user, identity).is_ok() && session.authenticated() {
            let _ = agent.disconnect();
            return true;
        }
        tried.push(format!(
            "{label}: key {} ({}): refused",
            known_hosts::fingerprint(identity.blob()),
            identity.comment()
        ));
    }
    let _ = agent.disconnect();
    false
}
