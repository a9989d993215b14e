//! A hang guard for a call that must return by itself (a deadline, a kill, a handshake
//! timeout at work): the call runs on a thread of its own and the test waits for its answer
//! up to a generous limit, then fails naming what hung. It waits for an event; it never
//! asserts how long a call took (benchmarks measure time).

use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

/// The answer of `call`, or a failure naming `what` when none came within `limit`. A panic
/// in `call` is the test's panic.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(call());
    });
    match rx.recv_timeout(limit) {
        Ok(answer) => answer,
        Err(RecvTimeoutError::Timeout) => panic!("{what} hung: no answer within {limit:?}"),
        Err(RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
    }
}
