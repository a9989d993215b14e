//! Fetching one chunk: the request (through the hub's redirects), retries from where a
//! failed attempt stopped, and streaming the answer into the part file.

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::StatusCode;

use super::{Shared, WriteError, write_at};
use crate::hub::HubError;
use crate::hub::api::{HubClient, error_chain, shown};
use crate::hub::progress::PullEvent;

/// Consecutive failed attempts (no byte gained) before a chunk gives up.
const MAX_FAILURES: u32 = 6;

/// Errors worth another attempt: the network, 5xx, 408, 429, a short body.
fn retryable(e: &HubError) -> bool {
    match e {
        HubError::Network { .. } | HubError::Truncated { .. } => true,
        HubError::Http { status, .. } => *status >= 500 || *status == 408 || *status == 429,
        _ => false,
    }
}

/// Fetches what is missing of chunk `k`, retrying transient failures from where it stopped.
/// If the server answers a range with the whole file, this fetch becomes the file's only
/// one and streams all of it.
pub(super) async fn fetch_chunk(
    shared: &Shared<'_>,
    client: &HubClient,
    i: usize,
    k: usize,
) -> Result<(), HubError> {
    let job = &shared.jobs[i];
    let commit = shared.run.commit;
    let resolve = client.resolve_url(commit, &job.remote.path);
    let mut failures = 0u32;
    let mut generation = job.state.lock().expect("state").generation;
    let mut whole_owner = false;
    loop {
        if shared.abort.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (from, end, before) = {
            let st = job.state.lock().expect("state");
            if st.generation != generation {
                // Restarted by someone else (a mismatch, or another fetch went whole).
                return Ok(());
            }
            if whole_owner {
                (st.prefix, job.remote.size, st.prefix)
            } else {
                let (a, b) = job.chunk(k);
                (a + st.done[k], b, st.done[k])
            }
        };
        if from == end {
            return Ok(());
        }
        let range = (job.nchunks > 1 || from > 0).then_some((from, end - 1));
        let cached = job.location.lock().expect("location").clone();
        let start = cached.clone().unwrap_or_else(|| resolve.clone());
        let result = match client
            .download(&start, commit, &job.remote.path, range)
            .await
        {
            Ok((resp, url)) => {
                if url != resolve {
                    *job.location.lock().expect("location") = Some(url);
                }
                let target = Target {
                    i,
                    from,
                    end,
                    ranged: range.is_some(),
                };
                stream(shared, target, &mut generation, &mut whole_owner, resp).await
            }
            Err(e) => Err(e),
        };
        let e = match result {
            Ok(()) => continue,
            Err(e) => e,
        };
        if shared.abort.load(Ordering::Relaxed) {
            return Ok(());
        }
        // A learned CDN location may expire: start again from the hub.
        let from_cache = cached.is_some()
            && matches!(e, HubError::Http { status, .. } if (400..500).contains(&status));
        if !retryable(&e) && !from_cache {
            return Err(e);
        }
        *job.location.lock().expect("location") = None;
        let after = {
            let st = job.state.lock().expect("state");
            if whole_owner { st.prefix } else { st.done[k] }
        };
        failures = if after > before { 1 } else { failures + 1 };
        if failures >= MAX_FAILURES {
            return Err(e);
        }
        let reason = e.to_string();
        shared.event(&PullEvent::Retry {
            path: &job.remote.path,
            reason: &reason,
        });
        let backoff = Duration::from_millis(100u64 << failures.min(6));
        tokio::time::sleep(backoff).await;
    }
}

/// The bytes a request asked for.
struct Target {
    i: usize,
    from: u64,
    end: u64,
    ranged: bool,
}

/// Streams one response into the part file. Returns `Ok` when the range is written, or when
/// the file restarted under this fetch.
async fn stream(
    shared: &Shared<'_>,
    t: Target,
    generation: &mut u64,
    whole_owner: &mut bool,
    mut resp: reqwest::Response,
) -> Result<(), HubError> {
    let i = t.i;
    let job = &shared.jobs[i];
    let url = shown(resp.url());
    let (mut offset, mut end) = (t.from, t.end);
    match resp.status() {
        StatusCode::PARTIAL_CONTENT => {
            let ok = content_range(&resp)
                .is_some_and(|(a, total)| a == t.from && total == job.remote.size);
            if !ok {
                return Err(HubError::BadResponse {
                    url,
                    reason: format!("206 without a Content-Range starting at {}", t.from),
                });
            }
        }
        StatusCode::OK if t.ranged => {
            // The server ignored the range: the file restarts cleanly from this answer.
            let mut st = job.state.lock().expect("state");
            if st.generation != *generation {
                return Ok(());
            }
            job.restart(&mut st);
            *generation = st.generation;
            *whole_owner = true;
            drop(st);
            // Its other chunks are covered by this stream.
            shared.queue.lock().expect("queue").pending[i].clear();
            job.changed.notify_all();
            job.save()?;
            shared.event(&PullEvent::Retry {
                path: &job.remote.path,
                reason: "the server ignored a range request; fetching the whole file",
            });
            offset = 0;
            end = job.remote.size;
        }
        StatusCode::OK => {}
        s => {
            return Err(HubError::Http {
                status: s.as_u16(),
                url,
                message: String::new(),
            });
        }
    }
    let generation = *generation;
    let mut buf: Vec<u8> = Vec::with_capacity(shared.buf_size);
    let mut pos = offset;
    loop {
        let next = resp.chunk().await.map_err(|e| HubError::Network {
            url: url.clone(),
            reason: error_chain(&e),
        });
        let mut data = match next {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) => {
                flush(shared, i, generation, &mut pos, &mut buf)?;
                return Err(e);
            }
        };
        let room = (end - pos) as usize - buf.len();
        if data.len() > room {
            data.truncate(room);
        }
        if buf.is_empty() && data.len() >= shared.buf_size / 2 {
            // Large pieces go straight to the file: one copy less.
            if !put(shared, i, generation, &mut pos, &data)? {
                return Ok(());
            }
            continue;
        }
        let mut rest = &data[..];
        while !rest.is_empty() {
            let n = (shared.buf_size - buf.len()).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if buf.len() == shared.buf_size && !flush(shared, i, generation, &mut pos, &mut buf)? {
                return Ok(());
            }
        }
        if pos + buf.len() as u64 == end {
            break;
        }
    }
    if !flush(shared, i, generation, &mut pos, &mut buf)? {
        return Ok(());
    }
    if pos < end {
        return Err(HubError::Truncated {
            url,
            got: pos - offset,
            expected: end - offset,
        });
    }
    Ok(())
}

/// Writes the buffer and empties it; `Ok(false)` when the file restarted and this stream
/// is abandoned.
fn flush(
    shared: &Shared,
    i: usize,
    generation: u64,
    pos: &mut u64,
    buf: &mut Vec<u8>,
) -> Result<bool, HubError> {
    let written = put(shared, i, generation, pos, buf)?;
    buf.clear();
    Ok(written)
}

/// Writes bytes at `pos` and moves `pos` past them; `Ok(false)` when the file restarted.
fn put(
    shared: &Shared,
    i: usize,
    generation: u64,
    pos: &mut u64,
    data: &[u8],
) -> Result<bool, HubError> {
    if data.is_empty() {
        return Ok(true);
    }
    match write_at(shared, i, generation, *pos, data) {
        Ok(()) => {
            *pos += data.len() as u64;
            Ok(true)
        }
        Err(WriteError::Superseded) => Ok(false),
        Err(WriteError::Fatal(e)) => Err(e),
    }
}

/// `Content-Range: bytes a-b/total` → (a, total).
fn content_range(resp: &reqwest::Response) -> Option<(u64, u64)> {
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (a, _) = range.split_once('-')?;
    Some((a.parse().ok()?, total.parse().ok()?))
}
