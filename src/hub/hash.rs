//! Content hashes: sha256 for every file (LFS files are checked by it), git's blob sha1 for
//! files kept in git (the tree lists only that for them). sha2 picks the CPU's SHA
//! instructions at run time, which is what keeps pace with `openssl dgst`.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// Bytes read per call when hashing a file: large enough that syscalls cost nothing.
pub(crate) const READ_BUF: usize = 4 << 20;

/// Hashes of one content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashes {
    /// sha256, hex.
    pub sha256: String,
    /// git blob sha1, hex, when asked for.
    pub git_oid: Option<String>,
}

/// sha256 and, optionally, git's blob sha1 of a content of known size, fed in order.
pub(crate) struct ContentHasher {
    sha256: Sha256,
    git: Option<Sha1>,
}

impl ContentHasher {
    /// A hasher for `size` bytes; `git` adds the blob sha1.
    pub fn new(size: u64, git: bool) -> Self {
        let git = git.then(|| {
            let mut h = Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            h
        });
        ContentHasher {
            sha256: Sha256::new(),
            git,
        }
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.sha256.update(data);
        if let Some(g) = &mut self.git {
            g.update(data);
        }
    }

    /// The hashes.
    pub fn finish(self) -> Hashes {
        Hashes {
            sha256: hex::encode(self.sha256.finalize()),
            git_oid: self.git.map(|g| hex::encode(g.finalize())),
        }
    }
}

/// Hashes a whole file.
pub fn hash_file(path: &Path, git: bool) -> std::io::Result<Hashes> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    advise_sequential(&f);
    let mut h = ContentHasher::new(size, git);
    let mut buf = vec![0u8; READ_BUF];
    let mut seen = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        seen += n as u64;
    }
    if seen != size {
        return Err(std::io::Error::other(format!(
            "{} changed size while being hashed",
            path.display()
        )));
    }
    Ok(h.finish())
}

/// Tells the kernel the file is read front to back, so it reads ahead generously.
pub(crate) fn advise_sequential(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the call's duration; the advice has no memory effects.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    }
}

/// Hashes many files on `jobs` threads, largest first so the threads finish together; one
/// file is hashed by one thread (sha256 is sequential). Results are in input order.
pub fn hash_many(
    files: &[(std::path::PathBuf, bool)],
    jobs: usize,
    on_done: &(dyn Fn(usize) + Sync),
) -> Vec<std::io::Result<Hashes>> {
    let mut order: Vec<usize> = (0..files.len()).collect();
    let sizes: Vec<u64> = files
        .iter()
        .map(|(p, _)| std::fs::metadata(p).map_or(0, |m| m.len()))
        .collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<std::io::Result<Hashes>>>> =
        Mutex::new((0..files.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, files.len().max(1)) {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = order.get(k) else { break };
                    let (path, git) = &files[i];
                    let r = hash_file(path, *git);
                    results.lock().expect("results")[i] = Some(r);
                    on_done(i);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|r| r.expect("every file hashed"))
        .collect()
}

/// The number of cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        let h = hash_file(&p, true).unwrap();
        assert_eq!(
            h.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(
            h.git_oid.as_deref(),
            Some("ce013625030ba8dba906f756967f9e9ca394464a")
        );
    }
}
