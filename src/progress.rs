//! What a step says while it works, and the one place it goes. The agent installs a sink
//! for the step it runs ([`scoped`]); code deep below (a download, the health gate, apt)
//! calls [`report`] without knowing who listens. Outside an agent nothing listens and a
//! report costs a lock and nothing else. The agent wraps each one in the wire's
//! `Event::Progress` (`resources/wire/envelope.rs`), so this type travels as part of that one event.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Something a running step reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Progress {
    /// The last line of a tool's output (apt, pip, git's phase, the service's log).
    Line {
        /// The line, trimmed.
        text: String,
    },
    /// Bytes of a download: one file's and the whole pull's.
    Bytes {
        /// The file being fetched (path inside the repo).
        file: String,
        /// Bytes of that file on disk.
        file_done: u64,
        /// Its size.
        file_size: u64,
        /// Bytes of every selected file on disk, all files together.
        done: u64,
        /// Size of every selected file together.
        total: u64,
        /// Bytes per second over the last few seconds.
        rate: u64,
        /// Seconds left for the whole pull at that rate; `None` before a rate is known.
        eta_secs: Option<u64>,
    },
    /// A file already in place was hashed and found whole (progress while nothing is
    /// downloaded).
    Checked {
        /// The file (path inside the repo).
        file: String,
    },
    /// The health gate's verdict, in words.
    Verdict {
        /// The verdict.
        text: String,
    },
}

type Sink = Box<dyn Fn(&Progress) + Send>;

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Sends `p` to the step's listener, if any.
pub fn report(p: Progress) {
    let guard = SINK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sink) = guard.as_ref() {
        sink(&p);
    }
}

/// Reports a tool's output line (skipping blank ones).
pub fn line(text: &str) {
    let text = text.trim();
    if !text.is_empty() {
        report(Progress::Line {
            text: text.chars().take(400).collect(),
        });
    }
}

/// Runs `f` with `sink` receiving every [`report`] made meanwhile (from any thread).
pub fn scoped<T>(sink: impl Fn(&Progress) + Send + 'static, f: impl FnOnce() -> T) -> T {
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(sink));
    // Cleared however `f` ends, so a later step does not report under this one's index.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            *SINK.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
    let _clear = Clear;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reports_reach_the_scoped_sink_only_while_it_is_installed() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        scoped(
            move |p| s.lock().unwrap().push(p.clone()),
            || {
                line("  Unpacking foo  ");
                line("   ");
            },
        );
        line("after");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Progress::Line {
                text: "Unpacking foo".into()
            }]
        );
    }
}
