//! Changes to a running container (`vmconfig_hotplug_pending`): the "fastplug" options at once,
//! memory/swap/CPU through the container's cgroup, network interfaces live, new devices with
//! `lxc-device`; anything else stays in `[pve:pending]` until the next start.
//!
//! One gap against Proxmox: a new mount point is not hotplugged (Proxmox injects it into the
//! running container's mount namespace); it stays pending and is mounted at the next start.

use std::collections::BTreeMap;
use std::process::Command;

use crate::error::{ApiError, ApiResult};
use crate::pve::config::CtConfig;
use crate::pve::options::indexed;
use crate::pve::propstr;

use super::lxcconf::cgroup_key;
use super::update::{normalise_net, remove_pending_delete};
use super::{Log, Node, run};

const FASTPLUG: &[&str] = &[
    "description",
    "onboot",
    "startup",
    "protection",
    "hostname",
    "hookscript",
    "cores",
    "tags",
    "lock",
];

/// Marks an option Proxmox leaves pending while the container runs.
const SKIP: &str = "skip";

impl Node {
    pub(crate) fn hotplug_pending(
        &self,
        vmid: u32,
        pid: u32,
        conf: &mut CtConfig,
        errors: &mut BTreeMap<String, String>,
        log: Log<'_>,
    ) {
        let fast: Vec<String> = conf
            .pending
            .props
            .keys()
            .filter(|k| FASTPLUG.contains(&k.as_str()))
            .cloned()
            .collect();
        for k in fast {
            let v = conf.pending.props.remove(&k).expect("key just listed");
            conf.main.props.insert(k, v);
        }
        for opt in conf.pending_delete() {
            let res = if FASTPLUG.contains(&opt.as_str()) {
                Ok(())
            } else if opt == "swap" {
                self.set_memory(vmid, conf.get("memory"), Some("0"))
            } else if opt == "cpulimit" {
                self.cgroup_set(vmid, "cpu.cfs_quota_us", "-1")
            } else if opt == "cpuunits" {
                self.cgroup_set(vmid, "cpu.shares", "1024")
            } else if indexed(&opt, "net") {
                let n = &opt[3..];
                run(Command::new("ip").args(["link", "del", &self.lab.veth(vmid, n)])).map(|_| ())
            } else {
                Err(ApiError::die(SKIP))
            };
            match res {
                Ok(()) => {
                    conf.main.props.remove(&opt);
                    remove_pending_delete(conf, &opt);
                }
                Err(e) if e.message == SKIP => {}
                Err(e) => {
                    errors.insert(
                        opt.clone(),
                        format!("unable to hotplug {opt}: {}", e.message),
                    );
                }
            }
        }
        let pending: Vec<(String, String)> = conf
            .pending
            .props
            .iter()
            .filter(|(k, _)| *k != "delete")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut memory_done = false;
        for (opt, value) in pending {
            let res: ApiResult<String> = if opt == "cpulimit" {
                let quota = (value.parse::<f64>().unwrap_or(0.0) * 100000.0) as i64;
                self.cgroup_set(vmid, "cpu.cfs_quota_us", &quota.to_string())
                    .map(|_| value.clone())
            } else if opt == "cpuunits" {
                self.cgroup_set(vmid, "cpu.shares", &value)
                    .map(|_| value.clone())
            } else if opt == "memory" || opt == "swap" {
                if !memory_done {
                    memory_done = true;
                    let mem = conf
                        .pending
                        .props
                        .get("memory")
                        .or(conf.main.props.get("memory"));
                    let swap = conf
                        .pending
                        .props
                        .get("swap")
                        .or(conf.main.props.get("swap"));
                    let (mem, swap) = (mem.cloned(), swap.cloned());
                    self.set_memory(vmid, mem.as_deref(), swap.as_deref())
                        .map(|_| value.clone())
                } else {
                    Ok(value.clone())
                }
            } else if indexed(&opt, "net") {
                normalise_net(&value).and_then(|v| {
                    self.hotplug_net(
                        vmid,
                        pid,
                        &opt,
                        conf.main.props.get(&opt).map(String::as_str),
                        &v,
                        log,
                    )?;
                    Ok(v)
                })
            } else if indexed(&opt, "dev") && !conf.main.props.contains_key(&opt) {
                self.hotplug_dev(vmid, &value).map(|_| value.clone())
            } else {
                Err(ApiError::die(SKIP))
            };
            match res {
                Ok(v) => {
                    conf.main.props.insert(opt.clone(), v);
                    conf.pending.props.remove(&opt);
                }
                Err(e) if e.message == SKIP => {}
                Err(e) => {
                    errors.insert(
                        opt.clone(),
                        format!("unable to hotplug {opt}: {}", e.message),
                    );
                }
            }
        }
    }

    fn cgroup_set(&self, vmid: u32, key: &str, value: &str) -> ApiResult<()> {
        run(Command::new("lxc-cgroup")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), key, value]))
        .map(|_| ())
    }

    /// Reads one of the container's cgroup values (through its command socket, as
    /// `lxc-cgroup` does, so a container of the same vmid in another lab is never read).
    fn cgroup_get(&self, vmid: u32, key: &str) -> Option<u64> {
        run(Command::new("lxc-cgroup")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), key]))
        .ok()
        .and_then(|v| v.trim().parse().ok())
    }

    /// Sets memory and swap as pve-common's `PVE::CGroup::change_memory_limit` does (called by
    /// pve-container's `PVE::LXC::Config::vmconfig_hotplug_pending`): under cgroup v1 memory
    /// and memory+swap are one pair, so when the combined limit grows, memsw is raised first
    /// and then memory; when it shrinks, memory is lowered first and then memsw (memsw can
    /// never be below memory). Under cgroup v2, `memory.swap.max` then `memory.max`.
    fn set_memory(&self, vmid: u32, memory: Option<&str>, swap: Option<&str>) -> ApiResult<()> {
        let mib = |s: Option<&str>, d: u64| s.and_then(|v| v.parse::<u64>().ok()).unwrap_or(d);
        let mem = mib(memory, 512) << 20;
        let swap = mib(swap, 512) << 20;
        if cgroup_key("memory") == "lxc.cgroup" {
            let memsw = mem + swap;
            // No memsw without swap accounting: memory alone.
            let Some(old_memsw) = self.cgroup_get(vmid, "memory.memsw.limit_in_bytes") else {
                return self.cgroup_shrink(vmid, "memory.limit_in_bytes", mem);
            };
            if memsw > old_memsw {
                self.cgroup_set(vmid, "memory.memsw.limit_in_bytes", &memsw.to_string())?;
                self.cgroup_shrink(vmid, "memory.limit_in_bytes", mem)
            } else {
                self.cgroup_shrink(vmid, "memory.limit_in_bytes", mem)?;
                self.cgroup_shrink(vmid, "memory.memsw.limit_in_bytes", memsw)
            }
        } else {
            self.cgroup_set(vmid, "memory.swap.max", &swap.to_string())?;
            self.cgroup_shrink(vmid, "memory.max", mem)
        }
    }

    /// Writes a memory limit that may be below what the container uses now. The kernel
    /// reclaims down to it and answers EBUSY when it cannot: on a loaded host, that is
    /// mostly dirty page cache still under writeback (this host has no swap). Proxmox writes
    /// once and reports the error; the lab, which shares its host with other labs, syncs and
    /// tries again a few times before it reports the same error, so a write that a quiet
    /// Proxmox node would take is not refused because another lab is writing.
    fn cgroup_shrink(&self, vmid: u32, key: &str, bytes: u64) -> ApiResult<()> {
        let mut tries = 0;
        loop {
            match self.cgroup_set(vmid, key, &bytes.to_string()) {
                Ok(()) => return Ok(()),
                Err(e) if tries == 4 || self.cgroup_get(vmid, key).is_none() => return Err(e),
                Err(_) => {
                    tries += 1;
                    // SAFETY: sync(2) takes no arguments and cannot fail.
                    unsafe { libc::sync() };
                    std::thread::sleep(std::time::Duration::from_millis(100 * tries));
                }
            }
        }
    }

    fn hotplug_dev(&self, vmid: u32, value: &str) -> ApiResult<()> {
        let dev = crate::gpu::parse_dev(&self.lab, value).map_err(ApiError::die)?;
        let path = dev
            .get("path")
            .ok_or_else(|| ApiError::die("Path is not defined"))?;
        run(Command::new("lxc-device")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), "add", path]))
        .map(|_| ())
    }

    /// Replaces or adds a veth interface inside the running container (`PVE::LXC::update_net`).
    fn hotplug_net(
        &self,
        vmid: u32,
        pid: u32,
        opt: &str,
        old: Option<&str>,
        new: &str,
        log: Log<'_>,
    ) -> ApiResult<()> {
        let n = &opt[3..];
        let net = propstr::parse(&propstr::NET, new).map_err(ApiError::die)?;
        let host_if = self.lab.veth(vmid, n);
        let name = &net["name"];
        let bridge = net
            .get("bridge")
            .cloned()
            .unwrap_or_else(|| self.lab.bridge.clone());
        let ns = |args: &[&str]| -> ApiResult<String> {
            run(Command::new("nsenter")
                .args(["-t", &pid.to_string(), "-n", "--", "ip"])
                .args(args))
        };
        let old = old
            .map(|o| propstr::parse(&propstr::NET, o))
            .transpose()
            .map_err(ApiError::die)?;
        let same_link = old
            .as_ref()
            .is_some_and(|o| o.get("name") == Some(name) && o.get("hwaddr") == net.get("hwaddr"));
        if !same_link {
            if old.is_some() {
                log(&format!("replacing interface {host_if}"));
                let _ = run(Command::new("ip").args(["link", "del", &host_if]));
            }
            let peer = format!("{host_if}p");
            run(Command::new("ip").args([
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
            ]))?;
            run(Command::new("ip").args(["link", "set", &peer, "netns", &pid.to_string()]))?;
            ns(&["link", "set", &peer, "name", name])?;
            if let Some(hw) = net.get("hwaddr") {
                ns(&["link", "set", name, "address", hw])?;
            }
            ns(&["link", "set", name, "up"])?;
        }
        run(Command::new("ip").args(["link", "set", &host_if, "master", &bridge, "up"]))?;
        let old_ip = old.as_ref().and_then(|o| o.get("ip"));
        let old_gw = old.as_ref().and_then(|o| o.get("gw"));
        if !same_link || old_ip != net.get("ip") || old_gw != net.get("gw") {
            ns(&["addr", "flush", "dev", name, "scope", "global"])?;
            if let Some(ip) = net.get("ip").filter(|ip| ip.contains('/')) {
                ns(&["addr", "add", ip, "dev", name])?;
            }
            if let Some(gw) = net.get("gw") {
                ns(&["route", "replace", "default", "via", gw, "dev", name])?;
            }
        }
        Ok(())
    }
}
