//! `DELETE /nodes/{node}/lxc/{vmid}`: volumes of this container removed, bind-mounted host
//! data never touched, then the config.

use crate::error::{ApiError, ApiResult};
use crate::pve::options::{MountKind, is_mount_key};
use crate::pve::propstr;

use super::{Log, Node, has_mounts_below};

impl Node {
    /// Checks made before the task starts.
    pub fn destroy_check(&self, vmid: u32) -> ApiResult<()> {
        let conf = self.load(vmid)?;
        Node::check_lock(&conf)?;
        if conf.get("protection") == Some("1") {
            return Err(ApiError::die(format!(
                "can't remove CT {vmid} - protection mode enabled"
            )));
        }
        if self.is_running(vmid) {
            return Err(ApiError::die(format!(
                "unable to destroy CT {vmid} - container is running"
            )));
        }
        Ok(())
    }

    /// Removes the container.
    pub fn destroy(&self, vmid: u32, log: Log<'_>) -> ApiResult<()> {
        let _lock = self.lock(vmid)?;
        self.destroy_check(vmid)?;
        let conf = self.load(vmid)?;
        for (key, value) in &conf.main.props {
            if !is_mount_key(key) && !key.starts_with("unused") {
                continue;
            }
            let volume = match propstr::format_of(key) {
                Some(fmt) => propstr::parse(&fmt, value)
                    .ok()
                    .and_then(|m| m.get("volume").cloned()),
                None => Some(value.clone()),
            };
            let Some(volume) = volume else { continue };
            if MountKind::of(&volume) == MountKind::Volume {
                log(&format!("removing volume {volume}"));
                self.delete_volume(vmid, &volume)?;
            }
        }
        let images = self.lab.images_dir(vmid);
        if images.exists() {
            if has_mounts_below(&images) {
                return Err(ApiError::die(format!(
                    "unable to destroy CT {vmid} - volumes still mounted"
                )));
            }
            std::fs::remove_dir_all(&images)?;
        }
        let lxc_dir = self.lab.lxc_path().join(vmid.to_string());
        if lxc_dir.exists() && !has_mounts_below(&lxc_dir) {
            std::fs::remove_dir_all(&lxc_dir)?;
        }
        std::fs::remove_file(self.lab.conf_path(vmid))?;
        log(&format!("destroyed CT {vmid}"));
        Ok(())
    }
}
