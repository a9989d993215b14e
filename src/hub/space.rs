//! Free space: checked against the bytes still to fetch before the first byte, and reserved
//! per file (fallocate) so a disk that fills up meanwhile fails at the start of a file, not
//! in its middle.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::HubError;

/// Bytes available to this user on the filesystem holding `path` (or its nearest existing
/// ancestor, for a folder not created yet).
pub fn free_bytes(path: &Path) -> std::io::Result<(PathBuf, u64)> {
    filesystem(path).map(|(dir, free, _)| (dir, free))
}

/// [`free_bytes`] with the filesystem's id (`f_fsid`): two folders with the same id share
/// their free space.
pub fn filesystem(path: &Path) -> std::io::Result<(PathBuf, u64, u64)> {
    let mut dir = path.to_path_buf();
    while !dir.exists() {
        if !dir.pop() {
            dir = PathBuf::from(".");
            break;
        }
    }
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs writes only into the zeroed struct passed; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((
        dir,
        st.f_bavail as u64 * st.f_frsize as u64,
        st.f_fsid as u64,
    ))
}

/// Refuses when `need` bytes do not fit under `dest`.
pub fn check(dest: &Path, need: u64) -> Result<(), HubError> {
    let (dir, free) = free_bytes(dest).map_err(|source| HubError::Io {
        path: dest.to_path_buf(),
        source,
    })?;
    if need > free {
        return Err(HubError::NoSpace { dir, need, free });
    }
    Ok(())
}

/// Bytes already allocated to a file (0 when absent): a part file reserved earlier does not
/// need its space again.
pub fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Reserves `size` bytes for a file; filesystems without fallocate get a sparse length, and
/// so does tmpfs, where fallocate zeroes every page up front (memory is not a disk that
/// fills up mid-file, and the zeroing would cost as much as the download's own copies).
pub fn reserve(file: &File, size: u64) -> std::io::Result<()> {
    if size == 0 || is_tmpfs(file) {
        return file.set_len(size);
    }
    // SAFETY: the descriptor is open; fallocate touches no memory of ours.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(size),
        _ => Err(err),
    }
}

fn is_tmpfs(file: &File) -> bool {
    // SAFETY: fstatfs writes only into the zeroed struct passed; the descriptor is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type == libc::TMPFS_MAGIC
}
