//! Config changes as `PVE::LXC::Config::update_pct_config` makes them: every change goes to
//! `[pve:pending]` first, then is applied (stopped container) or hotplugged where Proxmox can
//! (running container); what cannot be hotplugged stays pending until the next start.

use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};
use crate::pve::config::CtConfig;
use crate::pve::formats as pve_formats;
use crate::pve::options::{MountKind, indexed, is_mount_key, new_disk, unique_tags};
use crate::pve::propstr;

use super::{Log, Node, RunState, volumes};

/// A config change request (`PUT .../config` or `pct set`).
#[derive(Debug, Clone, Default)]
pub struct ConfigUpdate {
    /// Options to set, as config strings.
    pub set: BTreeMap<String, String>,
    /// Options to delete.
    pub delete: Vec<String>,
    /// Pending changes to revert.
    pub revert: Vec<String>,
    /// Expected digest of the current file, if the client sent one.
    pub digest: Option<String>,
}

/// Random MAC with Proxmox's default prefix `BC:24:11` (`PVE::Tools::random_ether_addr`).
pub fn random_hwaddr() -> String {
    let mut b = [0u8; 3];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    format!("BC:24:11:{:02X}:{:02X}:{:02X}", b[0], b[1], b[2])
}

/// A `netN` value as Proxmox saves it: `type=veth` and a `hwaddr` added.
pub fn normalise_net(value: &str) -> ApiResult<String> {
    let mut net = propstr::parse(&propstr::NET, value).map_err(ApiError::die)?;
    net.insert("type".into(), "veth".into());
    net.entry("hwaddr".into()).or_insert_with(random_hwaddr);
    Ok(propstr::print(&propstr::NET, &net))
}

impl Node {
    /// Applies a config change under the config lock.
    pub fn update_config(&self, vmid: u32, upd: &ConfigUpdate, log: Log<'_>) -> ApiResult<()> {
        let _lock = self.lock(vmid)?;
        let mut conf = self.load(vmid)?;
        Node::check_lock(&conf)?;
        if let Some(d) = &upd.digest
            && *d != conf.digest
        {
            return Err(ApiError::die(
                "detected modified configuration - file changed by other user? Try again.",
            ));
        }
        let state = self.state(vmid);
        let errors = self.update_pct_config(vmid, &mut conf, state, upd, log)?;
        self.write(vmid, &conf)?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::params(errors))
        }
    }

    /// Writes changes to pending, then applies or hotplugs them; returns per-option errors.
    pub(crate) fn update_pct_config(
        &self,
        vmid: u32,
        conf: &mut CtConfig,
        state: RunState,
        upd: &ConfigUpdate,
        log: Log<'_>,
    ) -> ApiResult<BTreeMap<String, String>> {
        for opt in &upd.revert {
            conf.pending.props.remove(opt);
            remove_pending_delete(conf, opt);
        }
        for opt in &upd.delete {
            if !conf.main.props.contains_key(opt) && !conf.pending.props.contains_key(opt) {
                log(&format!(
                    "cannot delete '{opt}' - not set in current configuration!"
                ));
                continue;
            }
            if ["memory", "rootfs", "ostype"].contains(&opt.as_str()) {
                return Err(ApiError::die(format!(
                    "unable to delete required option '{opt}'"
                )));
            }
            if opt == "unprivileged" {
                return Err(ApiError::die(format!(
                    "unable to delete read-only option: '{opt}'"
                )));
            }
            let mut del = conf.pending_delete();
            if !del.contains(opt) {
                del.push(opt.clone());
                del.sort();
            }
            conf.set_pending_delete(&del);
        }
        for (opt, value) in &upd.set {
            let mut value = value.clone();
            if opt == "unprivileged" {
                return Err(ApiError::die(format!(
                    "unable to modify read-only option: '{opt}'"
                )));
            } else if opt == "tags" {
                value = unique_tags(&value);
            } else if opt == "nameserver" || opt == "searchdomain" {
                // `verify_nameserver_list` / `verify_searchdomain_list`: joined by spaces.
                let list = crate::pve::config::split_list(&value);
                if opt == "nameserver"
                    && let Some(e) = list
                        .iter()
                        .find_map(|s| pve_formats::ip_with_ll_iface(s).err())
                {
                    return Err(ApiError::die(e));
                }
                value = list.join(" ");
            } else if let Some(fmt) = propstr::format_of(opt) {
                let parsed = if indexed(opt, "dev") {
                    crate::gpu::parse_dev(&self.lab, &value)
                } else {
                    propstr::parse(&fmt, &value)
                }
                .map_err(|e| ApiError::die(format!("{opt}: {e}")))?;
                if indexed(opt, "dev") && !parsed.contains_key("path") {
                    return Err(ApiError::die(format!(
                        "Path is not defined for passthrough device {opt}"
                    )));
                }
            }
            conf.pending.props.insert(opt.clone(), value);
            remove_pending_delete(conf, opt);
        }
        cleanup_pending(conf);
        let mut errors = BTreeMap::new();
        match state {
            RunState::Running(pid) => self.hotplug_pending(vmid, pid, conf, &mut errors, log),
            RunState::Stopped => self.apply_pending(vmid, conf, &mut errors),
        }
        Ok(errors)
    }

    /// Applies all pending changes (`vmconfig_apply_pending`), for a stopped container.
    pub(crate) fn apply_pending(
        &self,
        vmid: u32,
        conf: &mut CtConfig,
        errors: &mut BTreeMap<String, String>,
    ) {
        for opt in conf.pending_delete() {
            let res = (|| -> ApiResult<()> {
                if let Some(old) = conf.main.props.get(&opt).cloned() {
                    if indexed(&opt, "mp") {
                        let mp = propstr::parse(&propstr::MP, &old).map_err(ApiError::die)?;
                        if MountKind::of(&mp["volume"]) == MountKind::Volume {
                            add_unused(conf, &mp["volume"]);
                        }
                    } else if indexed(&opt, "unused") {
                        self.delete_volume(vmid, &old)?;
                    }
                }
                Ok(())
            })();
            match res {
                Ok(()) => {
                    conf.main.props.remove(&opt);
                    remove_pending_delete(conf, &opt);
                }
                Err(e) => {
                    errors.insert(
                        opt.clone(),
                        format!("unable to apply pending change {opt} : {}", e.message),
                    );
                }
            }
        }
        cleanup_pending(conf);
        let pending: Vec<(String, String)> = conf
            .pending
            .props
            .iter()
            .filter(|(k, _)| *k != "delete")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (opt, value) in pending {
            let res = (|| -> ApiResult<String> {
                if indexed(&opt, "mp") {
                    let value = self.alloc_mount(vmid, &opt, &value)?;
                    if let Some(old) = conf.main.props.get(&opt) {
                        let old = propstr::parse(&propstr::MP, old).map_err(ApiError::die)?;
                        if MountKind::of(&old["volume"]) == MountKind::Volume {
                            add_unused(conf, &old["volume"]);
                        }
                    }
                    Ok(value)
                } else if indexed(&opt, "net") {
                    normalise_net(&value)
                } else {
                    Ok(value)
                }
            })();
            match res {
                Ok(v) => {
                    conf.main.props.insert(opt.clone(), v);
                    conf.pending.props.remove(&opt);
                }
                Err(e) => {
                    errors.insert(
                        opt.clone(),
                        format!("unable to apply pending change {opt} : {}", e.message),
                    );
                }
            }
        }
    }

    /// A mount point value with a new disk (`local:8`) allocated.
    pub(crate) fn alloc_mount(&self, vmid: u32, opt: &str, value: &str) -> ApiResult<String> {
        let fmt = propstr::format_of(opt).expect("mount keys have a format");
        let mut mp = propstr::parse(&fmt, value).map_err(ApiError::die)?;
        if let Some((sid, gib)) = new_disk(&mp["volume"]) {
            volumes::parse_volid(&format!("{sid}:x"))?;
            let (volid, size) = volumes::alloc(&self.lab, vmid, gib)?;
            mp.insert("volume".into(), volid);
            mp.insert("size".into(), size);
        } else if MountKind::of(&mp["volume"]) == MountKind::Volume {
            let path = volumes::path_of(&self.lab, &mp["volume"])?;
            if !path.exists() {
                return Err(ApiError::die(format!(
                    "volume '{}' does not exist",
                    mp["volume"]
                )));
            }
        }
        Ok(propstr::print(&fmt, &mp))
    }

    /// Removes a volume of this container (never a bind mount or another CT's volume).
    pub(crate) fn delete_volume(&self, vmid: u32, volid: &str) -> ApiResult<()> {
        if is_mount_key(volid) || MountKind::of(volid) != MountKind::Volume {
            return Ok(());
        }
        if volumes::owner_of(volid) != Some(vmid) {
            return Ok(());
        }
        let path = volumes::path_of(&self.lab, volid)?;
        if super::has_mounts_below(&path) {
            return Err(ApiError::die(format!("volume '{volid}' is still mounted")));
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ApiError::die(format!(
                "unable to delete volume '{volid}': {e}"
            ))),
        }
    }
}

/// Removes one key from the pending delete list.
pub(crate) fn remove_pending_delete(conf: &mut CtConfig, opt: &str) {
    let del: Vec<String> = conf
        .pending_delete()
        .into_iter()
        .filter(|k| k != opt)
        .collect();
    conf.set_pending_delete(&del);
}

/// Drops pending values equal to the current ones and deletes of unset keys.
fn cleanup_pending(conf: &mut CtConfig) {
    let same: Vec<String> = conf
        .pending
        .props
        .iter()
        .filter(|(k, v)| *k != "delete" && conf.main.props.get(*k) == Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    for k in same {
        conf.pending.props.remove(&k);
    }
    let del: Vec<String> = conf
        .pending_delete()
        .into_iter()
        .filter(|k| conf.main.props.contains_key(k))
        .collect();
    conf.set_pending_delete(&del);
}

/// Records a detached volume as `unusedN`.
fn add_unused(conf: &mut CtConfig, volid: &str) {
    if conf
        .main
        .props
        .iter()
        .any(|(k, v)| indexed(k, "unused") && v == volid)
    {
        return;
    }
    let n = (0..)
        .find(|n| !conf.main.props.contains_key(&format!("unused{n}")))
        .unwrap_or(0);
    conf.main
        .props
        .insert(format!("unused{n}"), volid.to_string());
}
