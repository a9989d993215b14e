//! Proxmox's per-container config lock: an exclusive flock on
//! `/run/lock/lxc/pve-config-<vmid>.lock`, waited for up to a timeout
//! (`PVE::Tools::lock_file_full`). `pct` and the API share it.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{ApiError, ApiResult};

/// A held config lock; dropping it releases the flock.
#[derive(Debug)]
pub struct ConfigLock {
    _file: File,
}

impl ConfigLock {
    /// Waits for the lock; on timeout fails as Proxmox does.
    pub fn acquire(path: &Path, timeout: Duration) -> ApiResult<ConfigLock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                ApiError::die(format!(
                    "can't lock file '{}' - can't open file - {e}",
                    path.display()
                ))
            })?;
        let deadline = Instant::now() + timeout;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(ConfigLock { _file: file });
            }
            if Instant::now() >= deadline {
                return Err(ApiError::die(format!(
                    "can't lock file '{}' - got timeout",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
