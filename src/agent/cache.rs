//! The agent cache on a target: `<dir>/bin/provision-<sha256 prefix>`, one binary per
//! provision version, shared by every version that reaches the target.
//!
//! Reading commands may add to it (content-addressed: a push of the same version writes the
//! same bytes under the same name, atomically) but never remove from it, so two provision
//! versions checking one host do not delete each other's agent; a read of a version already
//! there changes nothing at all, not even a timestamp. A running agent holds a shared
//! `flock` on its own binary. An apply stamps its binary's modification time as "last
//! used" (install time otherwise), and only the agent of an apply prunes: binaries neither
//! installed nor used by an apply for [`PRUNE_AFTER`] that it can lock exclusively, so a
//! binary in use is never removed. A version only ever read may be pruned after that long;
//! its next read pushes it again. Should a binary vanish between a client's test and its
//! `exec`, the client pushes it again.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A cached binary unused this long may be pruned by an apply.
pub const PRUNE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// Prefix of cached binaries' names.
const PREFIX: &str = "provision-";

/// Whether `exe` is a binary in an agent cache (and not, say, a build on a workstation).
pub fn is_cached(exe: &Path) -> bool {
    exe.parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "bin")
        && exe
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PREFIX))
}

/// The running agent's hold on its own binary: a shared lock for as long as it lives.
#[derive(Debug)]
pub struct Hold {
    _file: File,
}

/// Locks `exe` shared for as long as the hold lives; changes nothing on disk.
pub fn hold(exe: &Path) -> std::io::Result<Hold> {
    let file = File::open(exe)?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Hold { _file: file })
}

/// Records now as `exe`'s last use by an apply (its modification time).
pub fn stamp(exe: &Path) -> std::io::Result<()> {
    let now = SystemTime::now();
    File::open(exe)?.set_times(
        std::fs::FileTimes::new()
            .set_accessed(now)
            .set_modified(now),
    )
}

/// Removes the cached binaries in `bin` other than `keep` that were neither installed nor
/// stamped by an apply within `older_than` and that no agent is running from; also leftovers of pushes
/// interrupted that long ago. Returns what was removed.
pub fn prune(bin: &Path, keep: &Path, older_than: Duration) -> std::io::Result<Vec<PathBuf>> {
    let now = SystemTime::now();
    let old = |meta: &std::fs::Metadata| {
        let age = |t: std::io::Result<SystemTime>| {
            t.ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default()
        };
        age(meta.modified()) >= older_than
    };
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(bin)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if path == keep || !(name.starts_with(PREFIX) || name.starts_with(".push.")) {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // SAFETY: flock on a descriptor this loop owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        // Checked under the lock: an agent that started since stamped its use first.
        if locked && file.metadata().is_ok_and(|m| old(&m)) {
            std::fs::remove_file(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path, days: u64) {
        let t = SystemTime::now() - Duration::from_secs(days * 24 * 3600);
        let f = File::options().write(true).open(path).unwrap();
        f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
            .unwrap();
    }

    #[test]
    fn prunes_only_old_unlocked_others() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let make = |name: &str, days: u64| {
            let p = bin.join(name);
            std::fs::write(&p, name).unwrap();
            age(&p, days);
            p
        };
        let me = make("provision-aaaa", 30);
        let old = make("provision-bbbb", 30);
        let recent = make("provision-cccc", 1);
        let running = make("provision-dddd", 30);
        let other = make("notes.txt", 30);
        let push = make(".push.x1", 30);
        let held = hold(&running).unwrap();
        age(&running, 30); // an agent started long ago and still runs
        assert!(is_cached(&me));
        let removed = prune(&bin, &me, PRUNE_AFTER).unwrap();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(!old.exists() && !push.exists());
        assert!(me.exists() && recent.exists() && running.exists() && other.exists());
        drop(held);
        // A process another test thread forks in the meantime shares the descriptor (and
        // so the lock) until it execs: the lock is gone once no copy is left.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let removed = loop {
            let removed = prune(&bin, &me, PRUNE_AFTER).unwrap();
            if !removed.is_empty() || std::time::Instant::now() > until {
                break removed;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(removed, vec![running]);
    }

    #[test]
    fn a_hold_changes_nothing_and_a_stamp_renews() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("provision-eeee");
        std::fs::write(&p, "x").unwrap();
        age(&p, 30);
        let before = std::fs::metadata(&p).unwrap();
        let h = hold(&p).unwrap();
        let during = std::fs::metadata(&p).unwrap();
        assert_eq!(during.modified().unwrap(), before.modified().unwrap());
        assert_eq!(during.accessed().unwrap(), before.accessed().unwrap());
        drop(h);
        stamp(&p).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert!(meta.modified().unwrap().elapsed().unwrap() < Duration::from_secs(3600));
    }
}
