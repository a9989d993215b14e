//! The download engine: files split into range chunks fetched by a pool of workers (several
//! files at once), written with positioned writes into `TARGET.part`, hashed while they
//! arrive, and renamed into place only when verified.
//!
//! Hashing while downloading, with parallel ranges: sha256 needs the bytes in order, while
//! ranges finish in any order. Each file has one hasher thread that walks the chunks in order:
//! it waits until chunk k is complete, reads it back from the `.part` file (it was just written,
//! so this is a page-cache copy, not a disk read) and hashes it. A fresh download is therefore
//! hashed at most one chunk behind the network and needs no second pass; a resumed one hashes
//! the part already on disk from the start, in parallel with fetching the rest.
//!
//! Resumption: `TARGET.part.json` records, per chunk, how many bytes from the chunk's start are
//! written. It is rewritten (atomically) whenever a chunk completes and whenever a quarter
//! chunk of new bytes of that file has been written, and workers write in buffers of at most
//! chunk / (2 × concurrency), so after `kill -9` at most three quarters of a chunk per file is
//! fetched again.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::Scope;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};

use super::api::{HubClient, RemoteFile, error_chain, shown};
use super::hash::{ContentHasher, READ_BUF};
use super::progress::{Event, ProgressSink};
use super::record::{RecordFile, Stamp};
use super::{HubError, space};

/// Consecutive failed attempts (no byte gained) before a chunk gives up.
const MAX_FAILURES: u32 = 6;

/// Knobs of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    pub concurrency: usize,
    pub chunk_size: u64,
}

/// What the engine did.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub placed: Vec<RecordFile>,
    pub bytes_fetched: u64,
    pub bytes_resumed: u64,
    pub refetched: Vec<String>,
}

/// The sidecar beside a `.part` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PartState {
    version: u32,
    size: u64,
    sha256: Option<String>,
    git_oid: String,
    chunk_size: u64,
    /// Bytes written from each chunk's start.
    done: Vec<u64>,
}

struct JobState {
    done: Vec<u64>,
    /// Bumped when the file restarts (checksum mismatch, or a server ignoring ranges); writes
    /// of an older generation are refused and the hasher starts over.
    generation: u64,
    /// The server ignored a range: one worker streams the whole file, the rest skip it.
    whole: bool,
    unsaved: u64,
    attempts: u32,
}

/// One file being fetched.
struct Job {
    remote: RemoteFile,
    target: PathBuf,
    part: PathBuf,
    sidecar: PathBuf,
    chunk_size: u64,
    nchunks: usize,
    resumed: u64,
    file: OnceLock<File>,
    /// Set once the part is open and the hasher runs; held while that happens, so other
    /// workers of the same file wait for it.
    activated: Mutex<bool>,
    state: Mutex<JobState>,
    changed: Condvar,
    location: Mutex<Option<Url>>,
    /// Serializes sidecar writes; true once the file is placed (no sidecar any more).
    save: Mutex<bool>,
}

impl Job {
    fn chunk(&self, k: usize) -> (u64, u64) {
        let start = k as u64 * self.chunk_size;
        (start, (start + self.chunk_size).min(self.remote.size))
    }

    fn snapshot(&self, st: &JobState) -> PartState {
        PartState {
            version: 1,
            size: self.remote.size,
            sha256: self.remote.sha256.clone(),
            git_oid: self.remote.git_oid.clone(),
            chunk_size: self.chunk_size,
            done: st.done.clone(),
        }
    }

    /// Rewrites the sidecar from the current state; taking the snapshot under `save` keeps the
    /// file's progress monotonic.
    fn save(&self) -> Result<(), HubError> {
        let placed = self.save.lock().expect("save");
        if *placed {
            return Ok(());
        }
        let snap = self.snapshot(&self.state.lock().expect("state"));
        let tmp = self.sidecar.with_extension("json.tmp");
        let text = serde_json::to_vec(&snap).expect("part state serializes");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.sidecar))
            .map_err(|source| HubError::Io {
                path: self.sidecar.clone(),
                source,
            })
    }
}

/// Everything the workers and hashers share.
struct Shared<'a> {
    client: &'a HubClient,
    commit: &'a str,
    opts: Options,
    buf_size: usize,
    progress: &'a dyn ProgressSink,
    placed_cb: &'a (dyn Fn(&RecordFile) + Sync),
    handle: tokio::runtime::Handle,
    jobs: Vec<Job>,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    abort: AtomicBool,
    fetched: AtomicU64,
    placed: Mutex<Vec<RecordFile>>,
    refetched: Mutex<Vec<String>>,
}

struct Queue {
    items: VecDeque<(usize, usize)>,
    remaining: usize,
    error: Option<HubError>,
}

impl Shared<'_> {
    fn fail(&self, e: HubError) {
        // Also called while a thread panics: a poisoned lock must not panic again.
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.error.is_none() {
            q.error = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
        self.queue_cv.notify_all();
        drop(q);
        for j in &self.jobs {
            j.changed.notify_all();
        }
    }
}

/// Loads the sidecar of an earlier run when it matches this file, else clears old parts.
fn plan_job(remote: &RemoteFile, dest: &Path, chunk_size: u64) -> Job {
    let target = dest.join(&remote.path);
    let part = with_suffix(&target, ".part");
    let sidecar = with_suffix(&target, ".part.json");
    let earlier = std::fs::read(&sidecar)
        .ok()
        .and_then(|t| serde_json::from_slice::<PartState>(&t).ok())
        .filter(|s| {
            s.version == 1
                && s.size == remote.size
                && s.sha256 == remote.sha256
                && s.git_oid == remote.git_oid
                && s.chunk_size > 0
                && s.done.len() as u64 == remote.size.div_ceil(s.chunk_size)
                && std::fs::metadata(&part).is_ok_and(|m| m.len() == remote.size)
        });
    let (chunk_size, done) = match earlier {
        Some(s) => (s.chunk_size, s.done),
        None => {
            let _ = std::fs::remove_file(&part);
            let _ = std::fs::remove_file(&sidecar);
            (
                chunk_size,
                vec![0; remote.size.div_ceil(chunk_size) as usize],
            )
        }
    };
    let mut job = Job {
        remote: remote.clone(),
        target,
        part,
        sidecar,
        chunk_size,
        nchunks: done.len(),
        resumed: 0,
        file: OnceLock::new(),
        activated: Mutex::new(false),
        state: Mutex::new(JobState {
            done,
            generation: 0,
            whole: false,
            unsaved: 0,
            attempts: 1,
        }),
        changed: Condvar::new(),
        location: Mutex::new(None),
        save: Mutex::new(false),
    };
    let mut st = job.state.lock().expect("state");
    for k in 0..job.nchunks {
        let (a, b) = job.chunk(k);
        st.done[k] = st.done[k].min(b - a);
    }
    let resumed = st.done.iter().sum();
    drop(st);
    job.resumed = resumed;
    job
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// One run of the engine: where from, where to, and who hears about it.
pub(crate) struct Run<'a> {
    pub client: &'a HubClient,
    pub commit: &'a str,
    pub dest: &'a Path,
    pub opts: Options,
    pub handle: tokio::runtime::Handle,
    pub progress: &'a dyn ProgressSink,
    pub placed_cb: &'a (dyn Fn(&RecordFile) + Sync),
    pub files_total: usize,
    pub bytes_total: u64,
}

/// Fetches `files` into the model folder. Checks free space before the first byte.
pub(crate) fn fetch_all(run: &Run, files: &[RemoteFile]) -> Result<Outcome, HubError> {
    let Run {
        client,
        commit,
        dest,
        opts,
        progress,
        placed_cb,
        ..
    } = *run;
    let handle = run.handle.clone();
    let jobs: Vec<Job> = files
        .iter()
        .map(|f| plan_job(f, dest, opts.chunk_size))
        .collect();
    let resumed: u64 = jobs.iter().map(|j| j.resumed).sum();
    let bytes_to_fetch: u64 = files.iter().map(|f| f.size).sum::<u64>() - resumed;
    progress.event(&Event::Planned {
        files: run.files_total,
        files_to_fetch: files.len(),
        bytes_total: run.bytes_total,
        bytes_to_fetch,
        bytes_resumed: resumed,
    });
    let mut need = 0u64;
    for j in &jobs {
        need += j.remote.size.saturating_sub(space::allocated(&j.part));
    }
    if need > 0 {
        space::check(dest, need)?;
    }
    let mut items = VecDeque::new();
    for (i, j) in jobs.iter().enumerate() {
        let st = j.state.lock().expect("state");
        for k in 0..j.nchunks {
            let (a, b) = j.chunk(k);
            if st.done[k] < b - a {
                items.push_back((i, k));
            }
        }
    }
    let shared = Shared {
        client,
        commit,
        opts,
        buf_size: ((opts.chunk_size / (2 * opts.concurrency as u64)) as usize)
            .clamp(16 << 10, 1 << 20),
        progress,
        placed_cb,
        handle,
        queue: Mutex::new(Queue {
            items,
            remaining: jobs.len(),
            error: None,
        }),
        jobs,
        queue_cv: Condvar::new(),
        abort: AtomicBool::new(false),
        fetched: AtomicU64::new(0),
        placed: Mutex::new(Vec::new()),
        refetched: Mutex::new(Vec::new()),
    };
    std::thread::scope(|s| {
        // Files with nothing left to fetch (empty, or complete before a kill) are only hashed.
        for i in 0..shared.jobs.len() {
            let j = &shared.jobs[i];
            let pending = (0..j.nchunks).any(|k| {
                let (a, b) = j.chunk(k);
                j.state.lock().expect("state").done[k] < b - a
            });
            if !pending && let Err(e) = activate(s, &shared, i) {
                shared.fail(e);
            }
        }
        for _ in 0..shared.opts.concurrency {
            s.spawn(|| worker(s, &shared));
        }
    });
    let q = shared.queue.into_inner().expect("queue");
    if let Some(e) = q.error {
        return Err(e);
    }
    Ok(Outcome {
        placed: shared.placed.into_inner().expect("placed"),
        bytes_fetched: shared.fetched.load(Ordering::SeqCst),
        bytes_resumed: resumed,
        refetched: shared.refetched.into_inner().expect("refetched"),
    })
}

/// Opens the part file and starts the file's hasher, once.
fn activate<'s, 'a: 's>(
    s: &'s Scope<'s, '_>,
    shared: &'s Shared<'a>,
    i: usize,
) -> Result<(), HubError> {
    let job = &shared.jobs[i];
    let mut activated = job.activated.lock().expect("activation");
    if *activated {
        return Ok(());
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HubError::Io { path, source }
    };
    if let Some(parent) = job.target.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let fresh = job.resumed == 0;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&job.part)
        .map_err(io(&job.part))?;
    if fresh {
        file.set_len(0).map_err(io(&job.part))?;
        space::reserve(&file, job.remote.size).map_err(|source| match source.raw_os_error() {
            Some(libc::ENOSPC) => HubError::NoSpace {
                dir: job.part.clone(),
                need: job.remote.size,
                free: 0,
            },
            _ => HubError::Io {
                path: job.part.clone(),
                source,
            },
        })?;
        job.save()?;
    }
    let _ = job.file.set(file);
    *activated = true;
    shared.progress.event(&Event::FileStarted {
        path: &job.remote.path,
        size: job.remote.size,
        resumed: job.resumed,
    });
    s.spawn(move || hasher(shared, i));
    Ok(())
}

/// Stops the whole run when a worker or hasher panics, so no thread waits forever on it.
struct PanicGuard<'s, 'a>(&'s Shared<'a>);

impl Drop for PanicGuard<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(HubError::Client(
                "internal error: a download thread panicked".into(),
            ));
        }
    }
}

fn worker<'s, 'a: 's>(s: &'s Scope<'s, '_>, shared: &'s Shared<'a>) {
    let _guard = PanicGuard(shared);
    loop {
        let (i, k) = {
            let mut q = shared.queue.lock().expect("queue");
            loop {
                if q.error.is_some() || q.remaining == 0 {
                    return;
                }
                if let Some(item) = q.items.pop_front() {
                    break item;
                }
                q = shared.queue_cv.wait(q).expect("queue");
            }
        };
        if shared.jobs[i].state.lock().expect("state").whole {
            continue;
        }
        if let Err(e) = activate(s, shared, i) {
            return shared.fail(e);
        }
        if let Err(e) = shared.handle.block_on(fetch_chunk(shared, i, k)) {
            return shared.fail(e);
        }
    }
}

/// Why a write was not made.
enum WriteError {
    /// The file restarted since this fetch began; the fetch is abandoned.
    Superseded,
    Fatal(HubError),
}

/// Writes bytes at `offset` for generation `generation`, and records them.
fn write_at(
    shared: &Shared,
    i: usize,
    generation: u64,
    offset: u64,
    data: &[u8],
) -> Result<(), WriteError> {
    let job = &shared.jobs[i];
    let mut st = job.state.lock().expect("state");
    if st.generation != generation || shared.abort.load(Ordering::Relaxed) {
        return Err(WriteError::Superseded);
    }
    let file = job.file.get().expect("activated");
    // Under the file's lock, so no write of an older generation can land after a restart.
    file.write_all_at(data, offset).map_err(|source| {
        WriteError::Fatal(HubError::Io {
            path: job.part.clone(),
            source,
        })
    })?;
    let end = offset + data.len() as u64;
    let mut completed = false;
    let first = (offset / job.chunk_size) as usize;
    let last = ((end - 1) / job.chunk_size) as usize;
    for k in first..=last.min(job.nchunks - 1) {
        let (a, b) = job.chunk(k);
        let upto = end.min(b) - a;
        st.done[k] = st.done[k].max(upto);
        completed |= st.done[k] == b - a;
    }
    st.unsaved += data.len() as u64;
    let save = completed || st.unsaved >= job.chunk_size / 4;
    if save {
        st.unsaved = 0;
    }
    drop(st);
    if completed {
        job.changed.notify_all();
    }
    shared
        .fetched
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    shared.progress.event(&Event::Bytes {
        path: &job.remote.path,
        bytes: data.len() as u64,
    });
    if save {
        job.save().map_err(WriteError::Fatal)?;
    }
    Ok(())
}

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
async fn fetch_chunk(shared: &Shared<'_>, i: usize, k: usize) -> Result<(), HubError> {
    let job = &shared.jobs[i];
    let resolve = shared.client.resolve_url(shared.commit, &job.remote.path);
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
                let prefix = contiguous(job, &st.done);
                (prefix, job.remote.size, prefix)
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
        let result = match shared
            .client
            .download(&start, shared.commit, &job.remote.path, range)
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
            if whole_owner {
                contiguous(job, &st.done)
            } else {
                st.done[k]
            }
        };
        failures = if after > before { 1 } else { failures + 1 };
        if failures >= MAX_FAILURES {
            return Err(e);
        }
        let reason = e.to_string();
        shared.progress.event(&Event::Retry {
            path: &job.remote.path,
            reason: &reason,
        });
        let backoff = Duration::from_millis(100u64 << failures.min(6));
        tokio::time::sleep(backoff).await;
    }
}

/// Bytes complete from the file's start.
fn contiguous(job: &Job, done: &[u64]) -> u64 {
    let mut total = 0;
    for (k, d) in done.iter().enumerate() {
        let (a, b) = job.chunk(k);
        total += d;
        if *d < b - a {
            break;
        }
    }
    total
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
            st.generation += 1;
            st.whole = true;
            st.done.iter_mut().for_each(|d| *d = 0);
            *generation = st.generation;
            *whole_owner = true;
            drop(st);
            job.changed.notify_all();
            job.save()?;
            shared.progress.event(&Event::Retry {
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

/// Writes the buffer; `Ok(false)` when the file restarted and this stream is abandoned.
fn flush(
    shared: &Shared,
    i: usize,
    generation: u64,
    pos: &mut u64,
    buf: &mut Vec<u8>,
) -> Result<bool, HubError> {
    if buf.is_empty() {
        return Ok(true);
    }
    match write_at(shared, i, generation, *pos, buf) {
        Ok(()) => {
            *pos += buf.len() as u64;
            buf.clear();
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

/// The per-file hasher: hashes chunks in order as they complete, then verifies and places
/// the file, or restarts it once after a mismatch.
fn hasher(shared: &Shared, i: usize) {
    let _guard = PanicGuard(shared);
    let job = &shared.jobs[i];
    let mut buf = vec![0u8; READ_BUF.min(job.remote.size.max(1) as usize)];
    'restart: loop {
        let generation = job.state.lock().expect("state").generation;
        let mut h = ContentHasher::new(job.remote.size, !job.remote.is_lfs());
        for k in 0..job.nchunks {
            let (a, b) = job.chunk(k);
            let mut st = job.state.lock().expect("state");
            loop {
                if shared.abort.load(Ordering::Relaxed) {
                    return;
                }
                if st.generation != generation {
                    continue 'restart;
                }
                if st.done[k] == b - a {
                    break;
                }
                st = job
                    .changed
                    .wait_timeout(st, Duration::from_millis(200))
                    .expect("state")
                    .0;
            }
            drop(st);
            let file = job.file.get().expect("activated");
            let mut off = a;
            while off < b {
                let n = (b - off).min(buf.len() as u64) as usize;
                if let Err(source) = file.read_exact_at(&mut buf[..n], off) {
                    return shared.fail(HubError::Io {
                        path: job.part.clone(),
                        source,
                    });
                }
                h.update(&buf[..n]);
                off += n as u64;
            }
        }
        if job.state.lock().expect("state").generation != generation {
            continue;
        }
        let got = h.finish();
        let (expected, actual) = match &job.remote.sha256 {
            Some(sha) => (sha.clone(), got.sha256.clone()),
            None => (
                job.remote.git_oid.clone(),
                got.git_oid.clone().unwrap_or_default(),
            ),
        };
        if expected.eq_ignore_ascii_case(&actual) {
            match place(job, &got.sha256) {
                Ok(entry) => {
                    shared.progress.event(&Event::FileDone {
                        path: &job.remote.path,
                        size: job.remote.size,
                    });
                    (shared.placed_cb)(&entry);
                    shared.placed.lock().expect("placed").push(entry);
                    let mut q = shared.queue.lock().expect("queue");
                    q.remaining -= 1;
                    shared.queue_cv.notify_all();
                }
                Err(e) => shared.fail(e),
            }
            return;
        }
        let mut st = job.state.lock().expect("state");
        if st.attempts >= 2 {
            drop(st);
            return shared.fail(HubError::Mismatch {
                path: job.remote.path.clone(),
                expected,
                actual,
            });
        }
        // A mismatch is never placed: the part is discarded and the file fetched again.
        st.attempts += 1;
        st.generation += 1;
        st.whole = false;
        st.done.iter_mut().for_each(|d| *d = 0);
        drop(st);
        let file = job.file.get().expect("activated");
        let reset = file
            .set_len(0)
            .and_then(|()| space::reserve(file, job.remote.size));
        if let Err(source) = reset {
            return shared.fail(HubError::Io {
                path: job.part.clone(),
                source,
            });
        }
        if let Err(e) = job.save() {
            return shared.fail(e);
        }
        shared
            .refetched
            .lock()
            .expect("refetched")
            .push(job.remote.path.clone());
        let reason = format!("sha256 mismatch (got {actual}), fetching again");
        shared.progress.event(&Event::Retry {
            path: &job.remote.path,
            reason: &reason,
        });
        let mut q = shared.queue.lock().expect("queue");
        for k in (0..job.nchunks).rev() {
            q.items.push_front((i, k));
        }
        shared.queue_cv.notify_all();
    }
}

/// Renames a verified part into place and drops its sidecar.
fn place(job: &Job, sha256: &str) -> Result<RecordFile, HubError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HubError::Io { path, source }
    };
    let mut placed = job.save.lock().expect("save");
    std::fs::rename(&job.part, &job.target).map_err(io(&job.target))?;
    *placed = true;
    let _ = std::fs::remove_file(&job.sidecar);
    drop(placed);
    let stamp = Stamp::of(&job.target)
        .map_err(io(&job.target))?
        .ok_or_else(|| HubError::Io {
            path: job.target.clone(),
            source: std::io::Error::other("vanished after being placed"),
        })?;
    Ok(RecordFile {
        path: job.remote.path.clone(),
        size: job.remote.size,
        sha256: sha256.to_string(),
        git_oid: (!job.remote.is_lfs()).then(|| job.remote.git_oid.clone()),
        mtime_ns: stamp.mtime_ns,
        inode: stamp.inode,
    })
}
