//! The verification record, `DEST/.provision-verified.json`: what was verified, with the
//! metadata (size, mtime, inode) that lets a routine check skip hashing. Format in
//! `docs/model-store.md`.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::HubError;

/// The record's file name inside the model folder.
pub const RECORD_FILE: &str = ".provision-verified.json";

/// The format version written now.
pub const RECORD_VERSION: u32 = 1;

/// What a model folder holds, as last verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Format version.
    pub version: u32,
    /// The hub it came from.
    pub endpoint: String,
    /// `org/name`.
    pub repo: String,
    /// The revision asked for (branch, tag or commit).
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// Include globs of the pull (all files when empty).
    #[serde(default)]
    pub include: Vec<String>,
    /// Exclude globs of the pull.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Every selected file is listed and was verified.
    pub complete: bool,
    /// When the record was last written, seconds since the Unix epoch.
    pub updated_unix: u64,
    /// The verified files.
    pub files: Vec<RecordFile>,
}

/// One verified file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordFile {
    /// Path inside the model folder (`/`-separated, as in the repo).
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 of the content, hex.
    pub sha256: String,
    /// git blob sha1 for files kept in git (not LFS), as the hub lists them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_oid: Option<String>,
    /// Modification time when verified, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Inode number when verified.
    pub inode: u64,
}

/// The size, mtime and inode of a file: what a metadata-only check compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Inode number.
    pub inode: u64,
}

impl Stamp {
    /// Reads a file's stamp; `None` when it does not exist.
    pub fn of(path: &Path) -> std::io::Result<Option<Stamp>> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(Some(Stamp {
                size: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                inode: m.ino(),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl RecordFile {
    /// Whether the file on disk still has the stamp it had when verified.
    pub fn matches(&self, stamp: &Stamp) -> bool {
        self.size == stamp.size && self.mtime_ns == stamp.mtime_ns && self.inode == stamp.inode
    }
}

/// The record's path for a model folder.
pub fn record_path(dest: &Path) -> PathBuf {
    dest.join(RECORD_FILE)
}

/// Reads the record; `Ok(None)` when there is none.
pub fn read(dest: &Path) -> Result<Option<Record>, HubError> {
    let path = record_path(dest);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HubError::Io { path, source }),
    };
    let record: Record = serde_json::from_str(&text).map_err(|e| HubError::BadRecord {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if record.version != RECORD_VERSION {
        return Err(HubError::BadRecord {
            path,
            reason: format!("version {} is not {RECORD_VERSION}", record.version),
        });
    }
    Ok(Some(record))
}

/// Writes the record atomically (a temporary file renamed over it).
pub fn write(dest: &Path, record: &Record) -> Result<(), HubError> {
    let path = record_path(dest);
    let tmp = dest.join(format!("{RECORD_FILE}.tmp"));
    let io = |source| HubError::Io {
        path: path.clone(),
        source,
    };
    let mut record = record.clone();
    record.files.sort_by(|a, b| a.path.cmp(&b.path));
    record.updated_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let text = serde_json::to_string_pretty(&record).expect("record serializes");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.write_all(b"\n").map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io)?;
    sync_parent(&path).map_err(io)
}

/// Flushes the directory holding `path`, so a rename into it survives a crash.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}
