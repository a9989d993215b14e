//! The download engine: files split into range chunks fetched by a pool of worker threads
//! (several files at once), written with positioned writes into `TARGET.part`, hashed while
//! they arrive (see `part.rs`), and renamed into place only when verified.
//!
//! Each worker thread has its own single-threaded runtime and connection pool, so a socket
//! is read on the thread that writes and hashes its bytes. Workers spread over files first
//! (a file gets a second stream only when every file in flight has one), which keeps most
//! files to one stream in order, hashed from memory; a single large file still gets every
//! worker on its ranges.
//!
//! Resumption: `TARGET.part.json` records, per chunk, how many bytes from the chunk's start
//! are written. It is rewritten (atomically) whenever a chunk completes and whenever a
//! quarter chunk of new bytes of that file has been written, and workers buffer at most
//! chunk / (2 × concurrency) bytes, so after `kill -9` at most three quarters of a chunk per
//! file is fetched again.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::Scope;
use std::time::Duration;

use super::api::{HubClient, RemoteFile};
use super::hash::READ_BUF;
use super::part::Job;
use super::progress::{ProgressSink, PullEvent};
use super::record::RecordFile;
use super::{HubError, space};

mod fetch;

use fetch::fetch_chunk;

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

/// One run of the engine: where from, where to, and who hears about it.
pub(crate) struct Run<'a> {
    pub client: &'a HubClient,
    pub commit: &'a str,
    pub dest: &'a Path,
    pub opts: Options,
    pub progress: &'a dyn ProgressSink,
    pub placed_cb: &'a (dyn Fn(&RecordFile) + Sync),
    pub files_total: usize,
    pub bytes_total: u64,
}

/// Everything the workers and hashers share.
struct Shared<'a> {
    run: &'a Run<'a>,
    buf_size: usize,
    jobs: Vec<Job>,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    abort: AtomicBool,
    fetched: AtomicU64,
    placed: Mutex<Vec<RecordFile>>,
    refetched: Mutex<Vec<String>>,
}

/// Chunks still to fetch, per file, and how many workers each file has.
struct Queue {
    pending: Vec<VecDeque<usize>>,
    active: Vec<usize>,
    /// Files before this one have nothing pending (a scan starts here).
    first: usize,
    /// Files not yet placed.
    remaining: usize,
    error: Option<HubError>,
}

impl Queue {
    /// The next chunk for a worker that last worked on `prev`: the file in flight with the
    /// fewest workers, preferring `prev`, then the earliest.
    fn pick(&mut self, prev: Option<usize>, window: usize) -> Option<(usize, usize)> {
        while self.first < self.pending.len() && self.pending[self.first].is_empty() {
            self.first += 1;
        }
        let end = (self.first + window).min(self.pending.len());
        let i = (self.first..end)
            .filter(|&f| !self.pending[f].is_empty())
            .min_by_key(|&f| (self.active[f], Some(f) != prev, f))?;
        let k = self.pending[i].pop_front()?;
        self.active[i] += 1;
        Some((i, k))
    }
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

    fn event(&self, e: &PullEvent<'_>) {
        self.run.progress.event(e);
    }
}

/// Fetches `files` into the model folder. Checks free space before the first byte.
pub(crate) fn fetch_all(run: &Run, files: &[RemoteFile]) -> Result<Outcome, HubError> {
    let opts = run.opts;
    let jobs: Vec<Job> = files
        .iter()
        .map(|f| Job::plan(f, run.dest, opts.chunk_size))
        .collect();
    let resumed: u64 = jobs.iter().map(|j| j.resumed).sum();
    run.progress.event(&PullEvent::Planned {
        files: run.files_total,
        files_to_fetch: files.len(),
        bytes_total: run.bytes_total,
        bytes_to_fetch: files.iter().map(|f| f.size).sum::<u64>() - resumed,
        bytes_resumed: resumed,
    });
    let need: u64 = jobs
        .iter()
        .map(|j| j.remote.size.saturating_sub(space::allocated(&j.part)))
        .sum();
    if need > 0 {
        space::check(run.dest, need)?;
    }
    let pending: Vec<VecDeque<usize>> = jobs
        .iter()
        .map(|j| {
            let st = j.state.lock().expect("state");
            (0..j.nchunks)
                .filter(|&k| {
                    let (a, b) = j.chunk(k);
                    st.done[k] < b - a
                })
                .collect()
        })
        .collect();
    let idle: Vec<usize> = (0..jobs.len()).filter(|&i| pending[i].is_empty()).collect();
    let shared = Shared {
        run,
        buf_size: ((opts.chunk_size / (2 * opts.concurrency as u64)) as usize)
            .clamp(16 << 10, 1 << 20),
        queue: Mutex::new(Queue {
            active: vec![0; jobs.len()],
            pending,
            first: 0,
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
        for &i in &idle {
            if let Err(e) = activate(s, &shared, i) {
                shared.fail(e);
            }
        }
        for _ in 0..opts.concurrency {
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
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&job.part)
        .map_err(io(&job.part))?;
    if job.resumed == 0 {
        file.set_len(0).map_err(io(&job.part))?;
        reserve(&file, job)?;
        job.save()?;
    }
    let _ = job.file.set(file);
    *activated = true;
    shared.event(&PullEvent::FileStarted {
        path: &job.remote.path,
        size: job.remote.size,
        resumed: job.resumed,
    });
    s.spawn(move || hasher(shared, i));
    Ok(())
}

/// Reserves the file's size on disk (a full disk shows here, not mid-file).
fn reserve(file: &std::fs::File, job: &Job) -> Result<(), HubError> {
    space::reserve(file, job.remote.size).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOSPC) => HubError::NoSpace {
            dir: job.part.clone(),
            need: job.remote.size,
            free: 0,
        },
        _ => HubError::Io {
            path: job.part.clone(),
            source,
        },
    })
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let (runtime, client) = match (runtime, shared.run.client.fresh()) {
        (Ok(r), Ok(c)) => (r, c),
        (Err(e), _) => return shared.fail(HubError::Client(e.to_string())),
        (_, Err(e)) => return shared.fail(e),
    };
    let window = 4 * shared.run.opts.concurrency;
    let mut prev = None;
    loop {
        let (i, k) = {
            let mut q = shared.queue.lock().expect("queue");
            loop {
                if q.error.is_some() || q.remaining == 0 {
                    return;
                }
                if let Some(item) = q.pick(prev, window) {
                    break item;
                }
                q = shared.queue_cv.wait(q).expect("queue");
            }
        };
        prev = Some(i);
        let result = activate(s, shared, i)
            .and_then(|()| runtime.block_on(fetch_chunk(shared, &client, i, k)));
        shared.queue.lock().expect("queue").active[i] -= 1;
        if let Err(e) = result {
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

/// Writes bytes at `offset` for generation `generation`, records them, and hashes them if
/// the hash has got exactly there.
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
    // Under the file's lock, so no write of an older generation lands after a restart.
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
        st.done[k] = st.done[k].max(end.min(b) - a);
        completed |= st.done[k] == b - a;
    }
    job.advance_prefix(&mut st);
    st.unsaved += data.len() as u64;
    let save = completed || st.unsaved >= job.chunk_size / 4;
    if save {
        st.unsaved = 0;
    }
    drop(st);
    job.hash_inline(generation, offset, data);
    job.changed.notify_all();
    shared
        .fetched
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    shared.event(&PullEvent::Bytes {
        path: &job.remote.path,
        bytes: data.len() as u64,
    });
    if save {
        job.save().map_err(WriteError::Fatal)?;
    }
    Ok(())
}

/// The per-file hasher: hashes what workers wrote ahead of the hash, then verifies and
/// places the file, or restarts it once after a mismatch.
fn hasher(shared: &Shared, i: usize) {
    let _guard = PanicGuard(shared);
    let job = &shared.jobs[i];
    let mut buf = vec![0u8; READ_BUF.min(job.remote.size.max(1) as usize)];
    loop {
        if shared.abort.load(Ordering::Relaxed) {
            return;
        }
        let hashed = match job.catch_up(&mut buf) {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) => return shared.fail(e),
        };
        if hashed < job.remote.size {
            let st = job.state.lock().expect("state");
            if st.prefix <= hashed && !shared.abort.load(Ordering::Relaxed) {
                let _ = job
                    .changed
                    .wait_timeout(st, Duration::from_millis(200))
                    .expect("state");
            }
            continue;
        }
        if finish(shared, i) {
            return;
        }
    }
}

/// Verifies a fully hashed file: places it (true), or restarts it for another attempt
/// (false), or fails the run (true).
fn finish(shared: &Shared, i: usize) -> bool {
    let job = &shared.jobs[i];
    let got = {
        let mut h = job.hash.lock().expect("hash");
        let fresh = super::hash::ContentHasher::new(job.remote.size, !job.remote.is_lfs());
        let hasher = std::mem::replace(&mut h.hasher, fresh);
        h.hashed = 0;
        // Whatever happens next, this generation's hash is used up.
        h.generation = u64::MAX;
        hasher.finish()
    };
    let (expected, actual) = match &job.remote.sha256 {
        Some(sha) => (sha.clone(), got.sha256.clone()),
        None => (
            job.remote.git_oid.clone(),
            got.git_oid.clone().unwrap_or_default(),
        ),
    };
    if expected.eq_ignore_ascii_case(&actual) {
        match job.place(&got.sha256) {
            Ok(entry) => {
                shared.event(&PullEvent::FileDone {
                    path: &job.remote.path,
                    size: job.remote.size,
                });
                (shared.run.placed_cb)(&entry);
                shared.placed.lock().expect("placed").push(entry);
                let mut q = shared.queue.lock().expect("queue");
                q.remaining -= 1;
                shared.queue_cv.notify_all();
            }
            Err(e) => shared.fail(e),
        }
        return true;
    }
    let mut st = job.state.lock().expect("state");
    if st.attempts >= 2 {
        drop(st);
        shared.fail(HubError::Mismatch {
            path: job.remote.path.clone(),
            expected,
            actual,
        });
        return true;
    }
    // A mismatch is never placed: the part is discarded and the file fetched again.
    st.attempts += 1;
    job.restart(&mut st);
    drop(st);
    let file = job.file.get().expect("activated");
    if let Err(e) = file
        .set_len(0)
        .map_err(|source| HubError::Io {
            path: job.part.clone(),
            source,
        })
        .and_then(|()| reserve(file, job))
        .and_then(|()| job.save())
    {
        shared.fail(e);
        return true;
    }
    shared
        .refetched
        .lock()
        .expect("refetched")
        .push(job.remote.path.clone());
    let reason = format!("sha256 mismatch (got {actual}), fetching again");
    shared.event(&PullEvent::Retry {
        path: &job.remote.path,
        reason: &reason,
    });
    let mut q = shared.queue.lock().expect("queue");
    q.pending[i] = (0..job.nchunks).collect();
    q.first = q.first.min(i);
    shared.queue_cv.notify_all();
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(chunks: &[usize]) -> Queue {
        Queue {
            pending: chunks.iter().map(|&n| (0..n).collect()).collect(),
            active: vec![0; chunks.len()],
            first: 0,
            remaining: chunks.len(),
            error: None,
        }
    }

    #[test]
    fn workers_spread_over_files_before_sharing_one() {
        let mut q = queue(&[3, 3, 1]);
        assert_eq!(q.pick(None, 8), Some((0, 0)));
        assert_eq!(q.pick(None, 8), Some((1, 0)));
        assert_eq!(q.pick(None, 8), Some((2, 0)));
        // Every file has a worker: the earliest gets a second one.
        assert_eq!(q.pick(None, 8), Some((0, 1)));
        // A worker done with its chunk keeps to its file when that is least busy.
        q.active[1] -= 1;
        assert_eq!(q.pick(Some(1), 8), Some((1, 1)));
    }

    #[test]
    fn one_file_gets_every_worker() {
        let mut q = queue(&[4]);
        for k in 0..4 {
            assert_eq!(q.pick(None, 8), Some((0, k)));
        }
        assert_eq!(q.pick(None, 8), None);
    }
}
