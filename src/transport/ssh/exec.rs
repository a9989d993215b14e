//! One command on one channel: stdin written while stdout and stderr are drained, in
//! libssh2's non-blocking mode, so neither side's flow-control window can deadlock the
//! other however much data goes each way.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use ssh2::{BlockDirections, Channel, Session};

use super::session::Socket;

/// What a finished command left.
pub(crate) struct Finished {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why the streams were abandoned.
pub(crate) enum Abandoned {
    /// The local deadline passed first.
    Deadline,
    /// The session failed.
    Io(io::Error),
}

/// libssh2 sends at most one packet (~32 KiB) per write call; larger slices are fine.
const CHUNK: usize = 32 * 1024;

/// Feeds `stdin` to `channel` and collects its output until the remote side sends EOF.
/// The session must be in non-blocking mode.
pub(crate) fn pump(
    session: &Session,
    socket: &Socket,
    channel: &mut Channel,
    stdin: &[u8],
    deadline: Option<Instant>,
) -> Result<Finished, Abandoned> {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut written = 0;
    let mut stdin_done = false;
    loop {
        let mut progress = false;
        while !stdin_done {
            if written < stdin.len() {
                let end = (written + CHUNK).min(stdin.len());
                match channel.write(&stdin[written..end]) {
                    Ok(0) => break,
                    Ok(n) => {
                        written += n;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The command closed its stdin or exited without reading it all,
                    // as `true` does; its exit status says what happened.
                    Err(_) => stdin_done = true,
                }
            } else {
                match channel.send_eof() {
                    Ok(()) => {
                        stdin_done = true;
                        progress = true;
                    }
                    Err(e) if super::would_block(&e) => break,
                    Err(_) => stdin_done = true,
                }
            }
        }
        for (id, out) in [(0, &mut stdout), (1, &mut stderr)] {
            let mut stream = channel.stream(id);
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        out.extend_from_slice(&buf[..n]);
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(Abandoned::Io(e)),
                }
            }
        }
        // EOF from the remote side, with nothing left unread on either stream.
        if channel.eof() {
            return Ok(Finished { stdout, stderr });
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Abandoned::Deadline);
        }
        if !progress {
            // Long commands (a 20-minute build) keep the connection alive from here.
            let _ = session.keepalive_send();
            wait(session, socket, deadline);
        }
    }
}

/// Waits until the socket can move the direction libssh2 is blocked on, 500 ms at most,
/// or until the deadline.
fn wait(session: &Session, socket: &Socket, deadline: Option<Instant>) {
    let mut flags = PollFlags::IN;
    if matches!(
        session.block_directions(),
        BlockDirections::Outbound | BlockDirections::Both
    ) {
        flags |= PollFlags::OUT;
    }
    let mut limit = Duration::from_millis(500);
    if let Some(d) = deadline {
        limit = limit.min(d.saturating_duration_since(Instant::now()));
    }
    let timeout = Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: limit.subsec_nanos() as i64,
    };
    let mut fds = [PollFd::new(socket, flags)];
    let _ = poll(&mut fds, Some(&timeout));
}
