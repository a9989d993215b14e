//! Progress goes through one small trait, so the agent can stream it as JSON lines and the
//! CLI can draw bars; the engine never prints.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Something that happened during a pull or a verification.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent<'a> {
    /// The revision resolved to a commit.
    Resolved {
        /// The repo.
        repo: &'a str,
        /// The commit.
        commit: &'a str,
    },
    /// What the pull will do, before the first byte.
    Planned {
        /// Files selected by include/exclude.
        files: usize,
        /// Of those, files to download (entirely or the rest of a part).
        files_to_fetch: usize,
        /// Size of all selected files.
        bytes_total: u64,
        /// Bytes still to download.
        bytes_to_fetch: u64,
        /// Bytes already in `.part` files from an earlier run.
        bytes_resumed: u64,
    },
    /// Existing files are being hashed (no record for them, or `--verify-full`).
    Checking {
        /// Files.
        files: usize,
        /// Their total size.
        bytes: u64,
    },
    /// A file's download began.
    FileStarted {
        /// Path inside the repo.
        path: &'a str,
        /// Its size.
        size: u64,
        /// Bytes already present from an earlier run.
        resumed: u64,
    },
    /// New bytes of a file were written.
    Bytes {
        /// Path inside the repo.
        path: &'a str,
        /// How many.
        bytes: u64,
    },
    /// A file was verified and moved into place.
    FileDone {
        /// Path inside the repo.
        path: &'a str,
        /// Its size.
        size: u64,
    },
    /// A file is fetched again (a checksum mismatch) or a request is retried.
    Retry {
        /// Path inside the repo.
        path: &'a str,
        /// Why.
        reason: &'a str,
    },
    /// A file was hashed during verification.
    Hashed {
        /// Path inside the repo.
        path: &'a str,
        /// Its size.
        bytes: u64,
    },
}

/// Receives progress events; called from several threads.
pub trait ProgressSink: Send + Sync {
    /// One event.
    fn event(&self, event: &PullEvent<'_>);
}

/// Ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn event(&self, _: &PullEvent<'_>) {}
}

/// Writes events as JSON lines (for the agent), folding `bytes` events into at most one
/// line per file every `interval`.
pub struct JsonLines<W: Write + Send> {
    out: Mutex<(W, HashMap<String, u64>, Instant)>,
    interval: Duration,
}

impl<W: Write + Send> JsonLines<W> {
    /// A sink writing to `out`.
    pub fn new(out: W, interval: Duration) -> Self {
        JsonLines {
            out: Mutex::new((out, HashMap::new(), Instant::now())),
            interval,
        }
    }
}

impl<W: Write + Send> ProgressSink for JsonLines<W> {
    fn event(&self, event: &PullEvent<'_>) {
        let mut guard = self.out.lock().expect("progress");
        let (out, pending, last) = &mut *guard;
        if let PullEvent::Bytes { path, bytes } = event {
            *pending.entry(path.to_string()).or_default() += bytes;
            if last.elapsed() < self.interval {
                return;
            }
        }
        // Pending byte counts go out before any other event, so totals add up in order.
        let mut paths: Vec<_> = pending.drain().collect();
        paths.sort();
        for (path, bytes) in paths {
            let line = serde_json::to_string(&PullEvent::Bytes { path: &path, bytes });
            let _ = writeln!(out, "{}", line.expect("json"));
        }
        *last = Instant::now();
        if !matches!(event, PullEvent::Bytes { .. }) {
            let _ = writeln!(out, "{}", serde_json::to_string(event).expect("json"));
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_fold_bytes_and_keep_totals() {
        let sink = JsonLines::new(Vec::new(), Duration::from_secs(3600));
        for _ in 0..10 {
            sink.event(&PullEvent::Bytes {
                path: "a",
                bytes: 5,
            });
        }
        sink.event(&PullEvent::FileDone {
            path: "a",
            size: 50,
        });
        let out = String::from_utf8(sink.out.into_inner().unwrap().0).unwrap();
        assert_eq!(
            out,
            "{\"event\":\"bytes\",\"path\":\"a\",\"bytes\":50}\n{\"event\":\"file_done\",\"path\":\"a\",\"size\":50}\n"
        );
    }
}
