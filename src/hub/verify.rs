//! Checking what is on disk: the routine check compares each file's size, mtime and inode
//! with the verification record (no reads); `full` re-hashes everything, files spread over
//! all cores.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::HubError;
use super::api::RemoteFile;
use super::hash::{cores, hash_many};
use super::progress::{Event, ProgressSink};
use super::record::{self, Record, RecordFile, Stamp};

/// Selected files split by what must happen to them.
pub(crate) struct Sorted {
    pub kept: Vec<RecordFile>,
    pub to_check: Vec<RemoteFile>,
    pub to_fetch: Vec<RemoteFile>,
}

fn stamp(path: &Path) -> Result<Option<Stamp>, HubError> {
    Stamp::of(path).map_err(|source| HubError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Files the record vouches for (same checksum, same stamp) are kept unread; files present
/// with the right size are hashed; the rest are fetched.
pub(crate) fn sort_existing(
    dest: &Path,
    files: &[RemoteFile],
    old: Option<&Record>,
    full: bool,
) -> Result<Sorted, HubError> {
    let mut sorted = Sorted {
        kept: Vec::new(),
        to_check: Vec::new(),
        to_fetch: Vec::new(),
    };
    for f in files {
        let entry = old.and_then(|r| {
            r.files.iter().find(|e| {
                e.path == f.path
                    && e.size == f.size
                    && match &f.sha256 {
                        Some(sha) => e.sha256.eq_ignore_ascii_case(sha),
                        None => e.git_oid.as_deref() == Some(f.git_oid.as_str()),
                    }
            })
        });
        match stamp(&dest.join(&f.path))? {
            Some(st) if st.size == f.size => match entry {
                Some(e) if !full && e.matches(&st) => sorted.kept.push(e.clone()),
                _ => sorted.to_check.push(f.clone()),
            },
            _ => sorted.to_fetch.push(f.clone()),
        }
    }
    Ok(sorted)
}

/// Hashes files already in place: the right ones become record entries, the others are to
/// be fetched (they stay until a verified copy replaces them).
pub(crate) fn check_existing(
    dest: &Path,
    files: &[RemoteFile],
    progress: &dyn ProgressSink,
) -> Result<(Vec<RecordFile>, Vec<RemoteFile>), HubError> {
    if files.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let paths: Vec<(PathBuf, bool)> = files
        .iter()
        .map(|f| (dest.join(&f.path), !f.is_lfs()))
        .collect();
    let on_done = |i: usize| {
        progress.event(&Event::Hashed {
            path: &files[i].path,
            bytes: files[i].size,
        })
    };
    let results = hash_many(&paths, cores(), &on_done);
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for ((f, (path, _)), r) in files.iter().zip(&paths).zip(results) {
        let h = r.map_err(|source| HubError::Io {
            path: path.clone(),
            source,
        })?;
        let ok = match &f.sha256 {
            Some(sha) => h.sha256.eq_ignore_ascii_case(sha),
            None => h.git_oid.as_deref() == Some(f.git_oid.as_str()),
        };
        match stamp(path)? {
            Some(st) if ok && st.size == f.size => good.push(RecordFile {
                path: f.path.clone(),
                size: f.size,
                sha256: h.sha256,
                git_oid: (!f.is_lfs()).then(|| f.git_oid.clone()),
                mtime_ns: st.mtime_ns,
                inode: st.inode,
            }),
            _ => bad.push(f.clone()),
        }
    }
    Ok((good, bad))
}

/// Something wrong with a verified model folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    /// The last pull did not finish.
    Incomplete,
    /// A recorded file is gone.
    Missing {
        /// The file.
        path: String,
    },
    /// A recorded file has another size.
    SizeChanged {
        /// The file.
        path: String,
        /// Recorded size.
        expected: u64,
        /// Size now.
        actual: u64,
    },
    /// A recorded file's content changed.
    Mismatch {
        /// The file.
        path: String,
        /// Recorded sha256.
        expected: String,
        /// sha256 now.
        actual: String,
    },
}

/// What a verification found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// `org/name`.
    pub repo: String,
    /// The recorded commit.
    pub commit: String,
    /// Files in the record.
    pub files: usize,
    /// Their total size.
    pub bytes: u64,
    /// Everything was re-hashed.
    pub full: bool,
    /// Files hashed (all with `full`; else those whose stamp changed).
    pub hashed_files: usize,
    /// Bytes hashed.
    pub hashed_bytes: u64,
    /// What is wrong; empty when verified.
    pub problems: Vec<Problem>,
    /// Wall time.
    pub duration_s: f64,
}

impl VerifyReport {
    /// Every recorded file is present and right.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies a model folder against its record, on `jobs` threads (all cores when 0). Files
/// found wrong leave the record, so the next pull fetches them again; files whose stamp
/// changed but whose content is right get their new stamp recorded.
pub fn verify(
    dest: &Path,
    full: bool,
    jobs: usize,
    progress: &dyn ProgressSink,
) -> Result<VerifyReport, HubError> {
    let (report, updated) = examine(dest, full, jobs, progress)?;
    if let Some(rec) = updated {
        record::write(dest, &rec)?;
    }
    Ok(report)
}

/// [`verify`] that only reports: the record and the folder are left exactly as found, for
/// `check` and `plan` (a check reports; only apply records).
pub fn inspect(
    dest: &Path,
    full: bool,
    jobs: usize,
    progress: &dyn ProgressSink,
) -> Result<VerifyReport, HubError> {
    examine(dest, full, jobs, progress).map(|(report, _)| report)
}

/// The verification itself: the report, and the record as it should now read when that
/// differs from what is on disk.
fn examine(
    dest: &Path,
    full: bool,
    jobs: usize,
    progress: &dyn ProgressSink,
) -> Result<(VerifyReport, Option<Record>), HubError> {
    let started = Instant::now();
    let mut rec = record::read(dest)?.ok_or_else(|| HubError::NoRecord {
        dest: dest.to_path_buf(),
    })?;
    let mut problems = Vec::new();
    if !rec.complete {
        problems.push(Problem::Incomplete);
    }
    let mut to_hash = Vec::new();
    for (i, e) in rec.files.iter().enumerate() {
        match stamp(&dest.join(&e.path))? {
            None => problems.push(Problem::Missing {
                path: e.path.clone(),
            }),
            Some(st) if st.size != e.size => problems.push(Problem::SizeChanged {
                path: e.path.clone(),
                expected: e.size,
                actual: st.size,
            }),
            Some(st) if full || !e.matches(&st) => to_hash.push(i),
            Some(_) => {}
        }
    }
    let paths: Vec<(PathBuf, bool)> = to_hash
        .iter()
        .map(|&i| (dest.join(&rec.files[i].path), false))
        .collect();
    let on_done = |k: usize| {
        let e = &rec.files[to_hash[k]];
        progress.event(&Event::Hashed {
            path: &e.path,
            bytes: e.size,
        })
    };
    let jobs = if jobs == 0 { cores() } else { jobs };
    let results = hash_many(&paths, jobs, &on_done);
    let mut changed = false;
    let mut restamp = Vec::new();
    for ((&i, (path, _)), r) in to_hash.iter().zip(&paths).zip(results) {
        let h = r.map_err(|source| HubError::Io {
            path: path.clone(),
            source,
        })?;
        let e = &rec.files[i];
        if h.sha256.eq_ignore_ascii_case(&e.sha256) {
            if let Some(st) = stamp(path)?
                && !e.matches(&st)
            {
                restamp.push((i, st));
            }
        } else {
            problems.push(Problem::Mismatch {
                path: e.path.clone(),
                expected: e.sha256.clone(),
                actual: h.sha256,
            });
        }
    }
    for (i, st) in restamp {
        rec.files[i].mtime_ns = st.mtime_ns;
        rec.files[i].inode = st.inode;
        changed = true;
    }
    let report = VerifyReport {
        repo: rec.repo.clone(),
        commit: rec.commit.clone(),
        files: rec.files.len(),
        bytes: rec.files.iter().map(|e| e.size).sum(),
        full,
        hashed_files: to_hash.len(),
        hashed_bytes: to_hash.iter().map(|&i| rec.files[i].size).sum(),
        problems,
        duration_s: 0.0,
    };
    let bad: Vec<&str> = report
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::Missing { path }
            | Problem::SizeChanged { path, .. }
            | Problem::Mismatch { path, .. } => Some(path.as_str()),
            Problem::Incomplete => None,
        })
        .collect();
    if !bad.is_empty() {
        rec.files.retain(|e| !bad.contains(&e.path.as_str()));
        rec.complete = false;
        changed = true;
    }
    let report = VerifyReport {
        duration_s: started.elapsed().as_secs_f64(),
        ..report
    };
    Ok((report, changed.then_some(rec)))
}

/// The state of a model folder by metadata alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreState {
    /// Complete, at the expected commit, every file with its recorded stamp.
    Verified,
    /// No record: never pulled by provision (or the record was removed).
    NoRecord,
    /// A pull started and did not finish.
    Incomplete,
    /// Verified, but at another commit than expected.
    OtherCommit,
    /// Some files are missing or were touched since verification.
    Changed,
}

/// The cheap check the planner calls: reads the record and stats the files, never hashes.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStatus {
    /// The verdict.
    pub state: StoreState,
    /// The recorded repo.
    pub repo: Option<String>,
    /// The recorded commit.
    pub commit: Option<String>,
    /// Files in the record.
    pub files: usize,
    /// Their total size.
    pub bytes: u64,
    /// Files missing or touched since verification.
    pub changed: Vec<String>,
}

/// Metadata-only status of a model folder; `expected_commit` turns a record of another
/// commit into [`StoreState::OtherCommit`].
pub fn status(dest: &Path, expected_commit: Option<&str>) -> Result<StoreStatus, HubError> {
    let Some(rec) = record::read(dest)? else {
        return Ok(StoreStatus {
            state: StoreState::NoRecord,
            repo: None,
            commit: None,
            files: 0,
            bytes: 0,
            changed: Vec::new(),
        });
    };
    let mut changed = Vec::new();
    for e in &rec.files {
        let same = stamp(&dest.join(&e.path))?.is_some_and(|st| e.matches(&st));
        if !same {
            changed.push(e.path.clone());
        }
    }
    let state = if !rec.complete {
        StoreState::Incomplete
    } else if !changed.is_empty() {
        StoreState::Changed
    } else if expected_commit.is_some_and(|c| !c.eq_ignore_ascii_case(&rec.commit)) {
        StoreState::OtherCommit
    } else {
        StoreState::Verified
    };
    Ok(StoreStatus {
        state,
        files: rec.files.len(),
        bytes: rec.files.iter().map(|e| e.size).sum(),
        repo: Some(rec.repo),
        commit: Some(rec.commit),
        changed,
    })
}
