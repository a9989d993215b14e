//! One file being downloaded: its `.part` file, the `.part.json` sidecar that makes it
//! resumable, and its running hash.
//!
//! Hashing while downloading with parallel ranges: sha256 needs the bytes in order, ranges
//! finish in any order. A write that lands exactly where the hash has got to is hashed on the
//! spot, from memory (a file fetched by one stream at a time, the common case when several
//! files are in flight, is never read back). Bytes written ahead of that point (another
//! range of the same file, or a part left by an earlier run) are hashed by the file's hasher
//! thread, reading them back from the `.part` once the prefix before them is complete: they
//! were just written, so that is a page-cache copy, not a disk read. Either way the hash is
//! done within moments of the last byte and a fresh download needs no second pass.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};

use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::HubError;
use super::api::RemoteFile;
use super::hash::ContentHasher;
use super::record::{RecordFile, Stamp};

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

/// Progress of a file's bytes.
pub(crate) struct JobState {
    /// Bytes written from each chunk's start.
    pub done: Vec<u64>,
    /// Bytes written contiguously from the file's start.
    pub prefix: u64,
    /// Bumped when the file restarts (checksum mismatch, or a server ignoring ranges); writes
    /// of an older generation are refused and the hash starts over.
    pub generation: u64,
    /// Bytes written since the sidecar was last saved.
    pub unsaved: u64,
    /// Downloads of this file so far (a mismatch allows one more).
    pub attempts: u32,
}

/// The running hash of a file's prefix.
pub(crate) struct HashState {
    pub generation: u64,
    pub hashed: u64,
    pub hasher: ContentHasher,
}

/// One file being fetched.
pub(crate) struct Job {
    pub remote: RemoteFile,
    pub target: PathBuf,
    pub part: PathBuf,
    sidecar: PathBuf,
    pub chunk_size: u64,
    pub nchunks: usize,
    /// Bytes found in the part from an earlier run.
    pub resumed: u64,
    pub file: OnceLock<File>,
    /// Set once the part is open and the hasher runs; held while that happens, so other
    /// workers of the same file wait for it.
    pub activated: Mutex<bool>,
    pub state: Mutex<JobState>,
    /// Signalled on every write and restart; the hasher waits on it.
    pub changed: Condvar,
    pub hash: Mutex<HashState>,
    /// Where the file was last served from (a CDN URL the hub redirected to).
    pub location: Mutex<Option<Url>>,
    /// Serializes sidecar writes; true once the file is placed (no sidecar any more).
    save: Mutex<bool>,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

impl Job {
    /// Takes over the part and sidecar of an earlier run when they match this file, else
    /// removes them.
    pub fn plan(remote: &RemoteFile, dest: &Path, chunk_size: u64) -> Job {
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
        let git = !remote.is_lfs();
        let mut job = Job {
            hash: Mutex::new(HashState {
                generation: 0,
                hashed: 0,
                hasher: ContentHasher::new(remote.size, git),
            }),
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
                prefix: 0,
                generation: 0,
                unsaved: 0,
                attempts: 1,
            }),
            changed: Condvar::new(),
            location: Mutex::new(None),
            save: Mutex::new(false),
        };
        let st = job.state.get_mut().expect("state");
        for k in 0..st.done.len() {
            let start = k as u64 * chunk_size;
            let len = (start + chunk_size).min(remote.size) - start;
            st.done[k] = st.done[k].min(len);
        }
        job.resumed = st.done.iter().sum();
        let mut st = job.state.lock().expect("state");
        job.advance_prefix(&mut st);
        drop(st);
        job
    }

    /// Chunk `k`'s byte range.
    pub fn chunk(&self, k: usize) -> (u64, u64) {
        let start = k as u64 * self.chunk_size;
        (start, (start + self.chunk_size).min(self.remote.size))
    }

    /// Moves `prefix` over chunks now complete.
    pub fn advance_prefix(&self, st: &mut JobState) {
        while st.prefix < self.remote.size {
            let k = (st.prefix / self.chunk_size) as usize;
            let (a, b) = self.chunk(k);
            let reached = a + st.done[k];
            if reached <= st.prefix {
                break;
            }
            st.prefix = reached;
            if reached < b {
                break;
            }
        }
    }

    /// Forgets every byte written: the next generation starts from nothing.
    pub fn restart(&self, st: &mut JobState) {
        st.generation += 1;
        st.done.iter_mut().for_each(|d| *d = 0);
        st.prefix = 0;
        st.unsaved = 0;
    }

    /// Rewrites the sidecar from the current state; taking the snapshot under `save` keeps
    /// the recorded progress monotonic.
    pub fn save(&self) -> Result<(), HubError> {
        let placed = self.save.lock().expect("save");
        if *placed {
            return Ok(());
        }
        let snap = {
            let st = self.state.lock().expect("state");
            PartState {
                version: 1,
                size: self.remote.size,
                sha256: self.remote.sha256.clone(),
                git_oid: self.remote.git_oid.clone(),
                chunk_size: self.chunk_size,
                done: st.done.clone(),
            }
        };
        let tmp = with_suffix(&self.sidecar, ".tmp");
        let text = serde_json::to_vec(&snap).expect("part state serializes");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.sidecar))
            .map_err(|source| HubError::Io {
                path: self.sidecar.clone(),
                source,
            })
    }

    /// Hashes bytes just written at `offset` if the hash has got exactly there.
    pub fn hash_inline(&self, generation: u64, offset: u64, data: &[u8]) {
        let mut h = self.hash.lock().expect("hash");
        if h.generation == generation && h.hashed == offset {
            h.hasher.update(data);
            h.hashed += data.len() as u64;
        }
    }

    /// Hashes what is written but not hashed yet, reading it back from the part. Returns
    /// the hashed length, or `None` when the file restarted meanwhile.
    pub fn catch_up(&self, buf: &mut [u8]) -> Result<Option<u64>, HubError> {
        let (generation, prefix) = {
            let st = self.state.lock().expect("state");
            (st.generation, st.prefix)
        };
        let mut h = self.hash.lock().expect("hash");
        if h.generation != generation {
            *h = HashState {
                generation,
                hashed: 0,
                hasher: ContentHasher::new(self.remote.size, !self.remote.is_lfs()),
            };
        }
        let file = self.file.get().expect("activated");
        while h.hashed < prefix {
            let n = (prefix - h.hashed).min(buf.len() as u64) as usize;
            let at = h.hashed;
            file.read_exact_at(&mut buf[..n], at)
                .map_err(|source| HubError::Io {
                    path: self.part.clone(),
                    source,
                })?;
            // A restart while reading would mix generations: start over.
            if self.state.lock().expect("state").generation != generation {
                return Ok(None);
            }
            h.hasher.update(&buf[..n]);
            h.hashed += n as u64;
        }
        Ok(Some(h.hashed))
    }

    /// Renames the verified part into place and drops its sidecar.
    pub fn place(&self, sha256: &str) -> Result<RecordFile, HubError> {
        let io = |source| HubError::Io {
            path: self.target.clone(),
            source,
        };
        let mut placed = self.save.lock().expect("save");
        // The bytes reach the disk before the name does, and the name before the record
        // that calls the file verified: a crash (not only a kill) can then leave a part or
        // an unrecorded file, never a recorded one that is not what was hashed.
        if let Some(file) = self.file.get() {
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&self.part, &self.target).map_err(io)?;
        super::record::sync_parent(&self.target).map_err(io)?;
        *placed = true;
        let _ = std::fs::remove_file(&self.sidecar);
        drop(placed);
        let stamp = Stamp::of(&self.target)
            .map_err(io)?
            .ok_or_else(|| io(std::io::Error::other("vanished after being placed")))?;
        Ok(RecordFile {
            path: self.remote.path.clone(),
            size: self.remote.size,
            sha256: sha256.to_string(),
            git_oid: (!self.remote.is_lfs()).then(|| self.remote.git_oid.clone()),
            mtime_ns: stamp.mtime_ns,
            inode: stamp.inode,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_moves_over_complete_chunks_only() {
        let dir = tempfile::tempdir().unwrap();
        let remote = RemoteFile {
            path: "f".into(),
            size: 250,
            sha256: Some("00".into()),
            git_oid: "11".into(),
        };
        let job = Job::plan(&remote, dir.path(), 100);
        assert_eq!(job.nchunks, 3);
        let mut st = job.state.lock().unwrap();
        st.done = vec![40, 100, 0];
        job.advance_prefix(&mut st);
        assert_eq!(st.prefix, 40);
        st.done[0] = 100;
        job.advance_prefix(&mut st);
        assert_eq!(st.prefix, 200);
        st.done[2] = 50;
        job.advance_prefix(&mut st);
        assert_eq!(st.prefix, 250);
        job.restart(&mut st);
        assert_eq!(
            (st.prefix, st.generation, st.done.clone()),
            (0, 1, vec![0, 0, 0])
        );
    }
}
