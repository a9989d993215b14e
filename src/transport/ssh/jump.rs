//! ProxyJump: the next hop's SSH session runs over a `direct-tcpip` channel of the jump
//! host's session. libssh2 wants a file descriptor for a session's transport, so the next
//! session gets one end of a Unix socket pair and a pump thread copies bytes between the
//! other end and the channel. The jump session is used by that thread alone.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use ssh2::{BlockDirections, Channel, Session};

use super::config::Hop;
use super::session::Socket;
use crate::transport::TransportError;

/// Bytes held in each direction before the pump stops reading that side (back-pressure).
const BUFFER: usize = 256 * 1024;

/// A running pump; joined when dropped.
#[derive(Debug)]
pub(crate) struct Tunnel {
    thread: Option<JoinHandle<()>>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // The pump ends when our end of the pair closes (the next session was dropped
        // first); joining makes sure the jump session is closed before we return.
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens a `direct-tcpip` channel from `jump` (whose socket is `jump_socket`) to `next`,
/// and returns the socket the next session should use.
pub(crate) fn open(
    jump: Session,
    jump_socket: Socket,
    jump_hop: &Hop,
    next: &Hop,
    keepalive: Duration,
) -> Result<(Socket, Tunnel), TransportError> {
    let channel = jump
        .channel_direct_tcpip(&next.host, next.port, None)
        .map_err(|e| TransportError::Unreachable {
            target: next.address(),
            reason: format!(
                "the jump host {} cannot open a connection to it: {}",
                jump_hop.describe(),
                e.message()
            ),
        })?;
    let (ours, theirs) = UnixStream::pair().map_err(|e| TransportError::Io {
        target: next.address(),
        source: e,
    })?;
    theirs
        .set_nonblocking(true)
        .map_err(|e| TransportError::Io {
            target: next.address(),
            source: e,
        })?;
    jump.set_keepalive(true, keepalive.as_secs().clamp(1, u32::MAX as u64) as u32);
    jump.set_blocking(false);
    let thread = thread::Builder::new()
        .name(format!("ssh-jump-{}", jump_hop.address()))
        .spawn(move || pump(jump, jump_socket, channel, theirs))
        .map_err(|e| TransportError::Io {
            target: next.address(),
            source: e,
        })?;
    Ok((
        Socket::Unix(ours),
        Tunnel {
            thread: Some(thread),
        },
    ))
}

/// Copies bytes between `local` and `channel` until either side is done.
fn pump(session: Session, socket: Socket, mut channel: Channel, mut local: UnixStream) {
    let mut up: Vec<u8> = Vec::with_capacity(BUFFER); // local → channel
    let mut down: Vec<u8> = Vec::with_capacity(BUFFER); // channel → local
    let mut buf = vec![0u8; 64 * 1024];
    let mut local_eof = false;
    let mut remote_eof = false;
    let mut eof_sent = false;
    let mut local_eof_at: Option<Instant> = None;
    loop {
        let mut progress = false;
        if !local_eof && up.len() < BUFFER {
            match local.read(&mut buf) {
                Ok(0) => {
                    local_eof = true;
                    local_eof_at = Some(Instant::now());
                    progress = true;
                }
                Ok(n) => {
                    up.extend_from_slice(&buf[..n]);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => progress = true,
                Err(_) => local_eof = true,
            }
        }
        while !up.is_empty() {
            match channel.write(&up) {
                Ok(0) => break,
                Ok(n) => {
                    up.drain(..n);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return,
            }
        }
        if local_eof && up.is_empty() && !eof_sent {
            match channel.send_eof() {
                Ok(()) => eof_sent = true,
                Err(e) if super::would_block(&e) => {}
                Err(_) => eof_sent = true,
            }
        }
        while !remote_eof && down.len() < BUFFER {
            match channel.read(&mut buf) {
                Ok(0) => {
                    if channel.eof() {
                        remote_eof = true;
                    }
                    break;
                }
                Ok(n) => {
                    down.extend_from_slice(&buf[..n]);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    remote_eof = true;
                    break;
                }
            }
        }
        while !down.is_empty() {
            match local.write(&down) {
                Ok(n) => {
                    down.drain(..n);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // The next session is gone; nothing left to deliver.
                    down.clear();
                    local_eof = true;
                }
            }
        }
        if remote_eof && down.is_empty() {
            let _ = local.shutdown(Shutdown::Write);
            if local_eof {
                break;
            }
        }
        // The next session hung up: give its last bytes a moment to reach the channel,
        // then stop whether or not the far side answers.
        if local_eof
            && (eof_sent || local_eof_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)))
        {
            break;
        }
        if !progress {
            let _ = session.keepalive_send();
            wait(
                &session,
                &socket,
                &local,
                !local_eof && up.len() < BUFFER,
                !down.is_empty(),
            );
        }
    }
    session.set_blocking(true);
    session.set_timeout(1000);
    let _ = channel.close();
    drop(channel);
    let _ = session.disconnect(None, "tunnel closed", None);
}

/// Waits until the jump socket or the local end can make progress, or 200 ms pass.
fn wait(session: &Session, socket: &Socket, local: &UnixStream, local_in: bool, local_out: bool) {
    let mut jump_flags = PollFlags::IN;
    if session.block_directions() == BlockDirections::Outbound
        || session.block_directions() == BlockDirections::Both
    {
        jump_flags |= PollFlags::OUT;
    }
    let mut local_flags = PollFlags::empty();
    if local_in {
        local_flags |= PollFlags::IN;
    }
    if local_out {
        local_flags |= PollFlags::OUT;
    }
    let mut fds = [
        PollFd::new(socket, jump_flags),
        PollFd::new(local, local_flags),
    ];
    let timeout = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    let _ = poll(&mut fds, Some(&timeout));
}
