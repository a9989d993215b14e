//! Storage `local` (type dir): `vztmpl` templates and container volumes. A volume
//! `local:129/vm-129-disk-0.raw` is a directory here rather than a raw image, so that creating
//! a container is a copy, not a mkfs and a loop mount.

use std::path::PathBuf;

use crate::error::{ApiError, ApiResult};
use crate::paths::Settings;
use crate::pve::propstr::format_size;

/// The only storage.
pub const STORAGE: &str = "local";

/// Splits a volume id into storage and volume name, checking the storage exists.
pub fn parse_volid(volid: &str) -> ApiResult<(&str, &str)> {
    let Some((sid, name)) = volid.split_once(':') else {
        return Err(ApiError::die(format!(
            "unable to parse volume ID '{volid}'"
        )));
    };
    if sid != STORAGE {
        return Err(ApiError::die(format!("storage '{sid}' does not exist")));
    }
    Ok((sid, name))
}

/// Host path of a volume (a template file or a container volume directory).
pub fn path_of(lab: &Settings, volid: &str) -> ApiResult<PathBuf> {
    let (_, name) = parse_volid(volid)?;
    if let Some(file) = name.strip_prefix("vztmpl/") {
        if file.contains('/') || file.starts_with('.') {
            return Err(ApiError::die(format!(
                "unable to parse volume ID '{volid}'"
            )));
        }
        return Ok(lab.template_dir().join(file));
    }
    let Some((owner, file)) = name.split_once('/') else {
        return Err(ApiError::die(format!(
            "unable to parse volume ID '{volid}'"
        )));
    };
    let owner: u32 = owner
        .parse()
        .map_err(|_| ApiError::die(format!("unable to parse volume ID '{volid}'")))?;
    if file.contains('/') || !file.starts_with(&format!("vm-{owner}-disk-")) {
        return Err(ApiError::die(format!(
            "unable to parse volume ID '{volid}'"
        )));
    }
    Ok(lab.images_dir(owner).join(file))
}

/// The vmid owning a container volume (`local:129/...` is owned by 129).
pub fn owner_of(volid: &str) -> Option<u32> {
    let (_, name) = volid.split_once(':')?;
    name.split_once('/')?.0.parse().ok()
}

/// Allocates a new volume directory for `vmid`; returns its volid and the `size=` text.
pub fn alloc(lab: &Settings, vmid: u32, size_gib: f64) -> ApiResult<(String, String)> {
    let dir = lab.images_dir(vmid);
    std::fs::create_dir_all(&dir)?;
    let n = (0..)
        .find(|n| !dir.join(format!("vm-{vmid}-disk-{n}.raw")).exists())
        .expect("some disk number is free");
    let name = format!("vm-{vmid}-disk-{n}.raw");
    std::fs::create_dir(dir.join(&name))?;
    let size = format_size((size_gib * (1u64 << 30) as f64) as u64);
    Ok((format!("{STORAGE}:{vmid}/{name}"), size))
}

/// Templates in the storage, as `(volid, size in bytes, mtime)`.
pub fn templates(lab: &Settings) -> Vec<(String, u64, u64)> {
    let mut res: Vec<(String, u64, u64)> = std::fs::read_dir(lab.template_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let meta = e.metadata().ok()?;
            let is_tmpl = [".tar.gz", ".tar.xz", ".tar.zst", ".tgz"]
                .iter()
                .any(|s| name.ends_with(s));
            if !meta.is_file() || !is_tmpl {
                return None;
            }
            let mtime = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs();
            Some((format!("{STORAGE}:vztmpl/{name}"), meta.len(), mtime))
        })
        .collect();
    res.sort();
    res
}
