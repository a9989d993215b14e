//! The model store: Hugging Face downloads verified by checksum, resumable, fast, and never
//! fetched twice. The agent calls [`pull`], [`verify`] and [`status`] next to the storage;
//! `provision model` exposes the same engine locally. Design notes: `docs/model-store.md`.

mod api;
mod download;
pub mod error;
pub mod hash;
mod part;
pub mod progress;
pub mod record;
pub mod space;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Serialize;

pub use api::{RemoteFile, install_crypto_provider};
pub(crate) use api::{client_error, error_chain};
pub use error::HubError;
pub use progress::{JsonLines, NoProgress, ProgressSink, PullEvent};
pub use record::{RECORD_FILE, Record, RecordFile};
pub use verify::{Problem, StoreState, StoreStatus, VerifyReport, inspect, status, verify};

use crate::inventory::secret::Secret;

/// The public hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Default connections in flight, all files together.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// Default range size for large files.
pub const DEFAULT_CHUNK_SIZE: u64 = 64 << 20;

/// What to download, from where, to where.
#[derive(Debug, Clone)]
pub struct PullRequest {
    /// The hub's base URL (a mirror, a fake hub in tests).
    pub endpoint: String,
    /// `org/name`.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
    /// Only files matching one of these globs (all when empty). `*` matches `/` too, as in
    /// `huggingface_hub`'s `allow_patterns`.
    pub include: Vec<String>,
    /// Leave out files matching these globs.
    pub exclude: Vec<String>,
    /// The model folder.
    pub dest: PathBuf,
    /// A token for gated or private repos.
    pub token: Option<Secret>,
    /// Connections in flight, all files together.
    pub concurrency: usize,
    /// Range size: files larger than this are fetched in parallel ranges of this size.
    pub chunk_size: u64,
    /// Re-hash files already in place instead of trusting the record's metadata.
    pub verify_full: bool,
    /// A first pass of a larger pull (the small files a preflight reads, before the
    /// weights): the record stays unfinished, so the folder is never taken for the whole
    /// model, and a selection of no file is no error.
    pub first_pass: bool,
}

impl PullRequest {
    /// A request with default endpoint, concurrency and chunk size.
    pub fn new(repo: &str, revision: &str, dest: &Path) -> Self {
        PullRequest {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            repo: repo.to_string(),
            revision: revision.to_string(),
            include: Vec::new(),
            exclude: Vec::new(),
            dest: dest.to_path_buf(),
            token: None,
            concurrency: DEFAULT_CONCURRENCY,
            chunk_size: DEFAULT_CHUNK_SIZE,
            verify_full: false,
            first_pass: false,
        }
    }
}

/// What a pull did. Every file listed in the record was verified by its checksum.
#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    /// `org/name`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The model folder.
    pub dest: PathBuf,
    /// Files selected.
    pub files: usize,
    /// Files downloaded (entirely or the rest of a part).
    pub files_fetched: usize,
    /// Files already verified by the record (metadata only).
    pub files_kept: usize,
    /// Files already present without a record entry, hashed and found right.
    pub files_adopted: usize,
    /// Files fetched a second time after a checksum mismatch.
    pub files_refetched: Vec<String>,
    /// Size of all selected files.
    pub bytes_total: u64,
    /// Bytes downloaded in this run.
    pub bytes_fetched: u64,
    /// Bytes taken over from `.part` files of an earlier run.
    pub bytes_resumed: u64,
    /// Wall time.
    pub duration_s: f64,
    /// Every selected file is in place and matches its checksum.
    pub verified: bool,
}

/// Include/exclude globs.
struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Filter {
    fn new(include: &[String], exclude: &[String]) -> Result<Self, HubError> {
        let build = |globs: &[String]| -> Result<Option<GlobSet>, HubError> {
            if globs.is_empty() {
                return Ok(None);
            }
            let mut b = GlobSetBuilder::new();
            for g in globs {
                // `huggingface_hub` treats `dir/` as `dir/*`.
                let pattern = if g.ends_with('/') {
                    format!("{g}*")
                } else {
                    g.clone()
                };
                let glob = Glob::new(&pattern).map_err(|e| HubError::BadGlob {
                    glob: g.clone(),
                    reason: e.kind().to_string(),
                })?;
                b.add(glob);
            }
            b.build().map(Some).map_err(|e| HubError::BadGlob {
                glob: globs.join(" "),
                reason: e.to_string(),
            })
        };
        Ok(Filter {
            include: build(include)?,
            exclude: build(exclude)?,
        })
    }

    fn selects(&self, path: &str) -> bool {
        self.include.as_ref().is_none_or(|s| s.is_match(path))
            && !self.exclude.as_ref().is_some_and(|s| s.is_match(path))
    }
}

/// A repo path that stays inside the model folder.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|seg| !matches!(seg, "" | "." | "..") && !seg.contains('\0'))
        && path != RECORD_FILE
        && !path.ends_with(".part")
        && !path.ends_with(".part.json")
}

/// The bytes `req.repo` at `req.revision` holds in the files `req.include`/`req.exclude`
/// select, from the hub's listing alone (the tree at the revision as named: no file is
/// fetched, the token only sent to the hub's origin). What `plan` checks against the free
/// space on the target before a download. Builds its own runtime, as [`pull`] does.
pub fn listed_bytes(req: &PullRequest) -> Result<u64, HubError> {
    let filter = Filter::new(&req.include, &req.exclude)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HubError::Client(e.to_string()))?;
    let client = api::HubClient::new(&req.endpoint, &req.repo, req.token.clone())?;
    let tree = runtime.block_on(client.tree(&req.revision))?;
    Ok(tree
        .iter()
        .filter(|f| filter.selects(&f.path))
        .map(|f| f.size)
        .sum())
}

/// Downloads `req.repo` at `req.revision` into `req.dest`, verifying every file. Builds its
/// own async runtime: call it from a plain thread, not from inside a tokio runtime.
pub fn pull(req: &PullRequest, progress: &dyn ProgressSink) -> Result<PullReport, HubError> {
    let started = Instant::now();
    if req.concurrency == 0 || req.concurrency > 256 {
        return Err(HubError::BadOption(
            "concurrency must be between 1 and 256".into(),
        ));
    }
    if req.chunk_size < 64 << 10 {
        return Err(HubError::BadOption(
            "chunk size must be at least 64 KiB".into(),
        ));
    }
    let filter = Filter::new(&req.include, &req.exclude)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(hash::cores().clamp(1, 4))
        .enable_all()
        .build()
        .map_err(|e| HubError::Client(e.to_string()))?;
    let client = api::HubClient::new(&req.endpoint, &req.repo, req.token.clone())?;
    let commit = runtime.block_on(client.revision(&req.revision))?;
    progress.event(&PullEvent::Resolved {
        repo: &req.repo,
        commit: &commit,
    });
    let tree = runtime.block_on(client.tree(&commit))?;
    let files: Vec<RemoteFile> = tree
        .into_iter()
        .filter(|f| filter.selects(&f.path))
        .collect();
    if files.is_empty() && req.first_pass {
        return Ok(PullReport {
            repo: req.repo.clone(),
            revision: req.revision.clone(),
            commit,
            dest: req.dest.clone(),
            files: 0,
            files_fetched: 0,
            files_kept: 0,
            files_adopted: 0,
            files_refetched: Vec::new(),
            bytes_total: 0,
            bytes_fetched: 0,
            bytes_resumed: 0,
            duration_s: started.elapsed().as_secs_f64(),
            verified: true,
        });
    }
    if files.is_empty() {
        return Err(HubError::NothingSelected {
            repo: req.repo.clone(),
            commit,
        });
    }
    if let Some(bad) = files.iter().find(|f| !safe_path(&f.path)) {
        return Err(HubError::UnsafePath(bad.path.clone()));
    }
    std::fs::create_dir_all(&req.dest).map_err(|source| HubError::Io {
        path: req.dest.clone(),
        source,
    })?;
    // One pull at a time per folder (flock on the folder itself, so no file is added to
    // it): a second one, say an apply re-run while the first still runs on the target after
    // its SSH connection was cut, waits for it and then finds its files verified, instead
    // of both writing the same parts and the record.
    let _one_at_a_time = std::fs::File::open(&req.dest)
        .and_then(|dir| dir.lock().map(|()| dir))
        .map_err(|source| HubError::Io {
            path: req.dest.clone(),
            source,
        })?;
    // An unreadable record only costs a re-hash of what is there.
    let old = record::read(&req.dest).ok().flatten();
    let sorted = verify::sort_existing(&req.dest, &files, old.as_ref(), req.verify_full)?;
    let mut entries = sorted.kept.clone();
    let files_kept = entries.len();
    let check_bytes: u64 = sorted.to_check.iter().map(|f| f.size).sum();
    if !sorted.to_check.is_empty() {
        progress.event(&PullEvent::Checking {
            files: sorted.to_check.len(),
            bytes: check_bytes,
        });
    }
    let (adopted, mut to_fetch) = verify::check_existing(&req.dest, &sorted.to_check, progress)?;
    let files_adopted = adopted.len();
    entries.extend(adopted);
    if let (true, Some(old)) = (req.first_pass, &old) {
        // The weights this pass leaves out keep their entries, so the pass after it trusts
        // them by their metadata instead of hashing them again.
        entries.extend(
            old.files
                .iter()
                .filter(|e| !files.iter().any(|f| f.path == e.path))
                .cloned(),
        );
    }
    to_fetch.extend(sorted.to_fetch);
    to_fetch.sort_by(|a, b| a.path.cmp(&b.path));
    let bytes_total: u64 = files.iter().map(|f| f.size).sum();
    let base = Record {
        version: record::RECORD_VERSION,
        endpoint: req.endpoint.clone(),
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: commit.clone(),
        include: req.include.clone(),
        exclude: req.exclude.clone(),
        complete: false,
        updated_unix: 0,
        files: entries,
    };
    let mut outcome = download::Outcome::default();
    if to_fetch.is_empty() {
        progress.event(&PullEvent::Planned {
            files: files.len(),
            files_to_fetch: 0,
            bytes_total,
            bytes_to_fetch: 0,
            bytes_resumed: 0,
        });
    } else {
        record::write(&req.dest, &base)?;
        let live = Mutex::new((base.clone(), Instant::now()));
        // Placed files enter the record as they land (at most once a second), so a run
        // killed later does not re-hash them.
        let placed_cb = |entry: &RecordFile| {
            let mut guard = live.lock().expect("record");
            guard.0.files.push(entry.clone());
            if guard.1.elapsed() >= Duration::from_secs(1) {
                let _ = record::write(&req.dest, &guard.0);
                guard.1 = Instant::now();
            }
        };
        let run = download::Run {
            client: &client,
            commit: &commit,
            dest: &req.dest,
            opts: download::Options {
                concurrency: req.concurrency,
                chunk_size: req.chunk_size,
            },
            progress,
            placed_cb: &placed_cb,
            files_total: files.len(),
            bytes_total,
        };
        outcome = download::fetch_all(&run, &to_fetch)?;
    }
    let mut final_record = base;
    final_record.files.extend(outcome.placed.iter().cloned());
    final_record.complete = !req.first_pass;
    record::write(&req.dest, &final_record)?;
    Ok(PullReport {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit,
        dest: req.dest.clone(),
        files: files.len(),
        files_fetched: to_fetch.len(),
        files_kept,
        files_adopted,
        files_refetched: outcome.refetched,
        bytes_total,
        bytes_fetched: outcome.bytes_fetched,
        bytes_resumed: outcome.bytes_resumed,
        duration_s: started.elapsed().as_secs_f64(),
        verified: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_matches_like_huggingface_hub() {
        let f = Filter::new(
            &["*.json".into(), "original/".into()],
            &["tokenizer*".into()],
        )
        .unwrap();
        assert!(f.selects("config.json"));
        // fnmatch's `*` crosses `/`.
        assert!(f.selects("sub/x.json"));
        assert!(f.selects("original/params.bin"));
        assert!(!f.selects("tokenizer_config.json"));
        assert!(!f.selects("model.safetensors"));
    }

    #[test]
    fn unsafe_paths_are_refused() {
        assert!(safe_path("a/b.bin"));
        assert!(!safe_path("../etc/passwd"));
        assert!(!safe_path("/etc/passwd"));
        assert!(!safe_path("a/./b"));
        assert!(!safe_path(RECORD_FILE));
    }
}
