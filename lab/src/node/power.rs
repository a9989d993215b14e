//! start, stop, shutdown, reboot: LXC driven as Proxmox's `vzstart`/`vzstop`/... workers do,
//! with pending changes applied at start.

use std::collections::BTreeMap;
use std::process::Command;

use crate::error::{ApiError, ApiResult};

use super::{Log, Node, RunState, lxcconf, run};

impl Node {
    /// Starts a stopped container (the caller has checked it is not running).
    pub fn start(&self, vmid: u32, log: Log<'_>) -> ApiResult<()> {
        let _lock = self.lock(vmid)?;
        let mut conf = self.load(vmid)?;
        Node::check_lock(&conf)?;
        if self.is_running(vmid) {
            return Err(ApiError::die(format!("CT {vmid} already running")));
        }
        if !conf.pending.props.is_empty() {
            let mut errors = BTreeMap::new();
            self.apply_pending(vmid, &mut conf, &mut errors);
            self.write(vmid, &conf)?;
            for e in errors.values() {
                log(e);
            }
        }
        let lxc_conf = lxcconf::render(&self.lab, vmid, &conf)?;
        let dir = self.lab.lxc_path().join(vmid.to_string());
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("config"), lxc_conf)?;
        let root = lxcconf::rootfs_path(&self.lab, &conf)?;
        let hostname = conf
            .get("hostname")
            .map_or(format!("CT{vmid}"), str::to_string);
        write_hostname(&root, &hostname)?;
        forget_neighbours(&conf);
        self.clear_stale_veths(vmid, &conf)?;
        let logfile = dir.join("console.log");
        let res = run(Command::new("lxc-start")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), "-d", "-l", "WARN", "-o"])
            .arg(&logfile));
        if let Err(e) = res {
            for l in std::fs::read_to_string(&logfile)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .iter()
                .rev()
            {
                log(l);
            }
            log(&e.message);
            return Err(ApiError::die(format!(
                "startup for container '{vmid}' failed"
            )));
        }
        run(Command::new("lxc-wait")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string(), "-s", "RUNNING", "-t", "10"]))?;
        Ok(())
    }

    /// A stopped container's host-side veth goes away when its network namespace is torn
    /// down, which the kernel does asynchronously; a quick restart (or a recreated vmid) can
    /// find it still there, and lxc-start would fail with `File exists`. One on this lab's
    /// bridge (or on none) is stale and removed; one on another bridge belongs to another lab.
    fn clear_stale_veths(&self, vmid: u32, conf: &crate::pve::config::CtConfig) -> ApiResult<()> {
        for key in conf
            .main
            .props
            .keys()
            .filter(|k| crate::pve::options::indexed(k, "net"))
        {
            let name = self.lab.veth(vmid, &key[3..]);
            let path = std::path::Path::new("/sys/class/net").join(&name);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while path.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if !path.exists() {
                continue;
            }
            let master = std::fs::read_link(path.join("master")).ok();
            let master = master
                .as_ref()
                .and_then(|m| m.file_name())
                .map(|m| m.to_string_lossy().into_owned());
            let ours = conf.main.props[key]
                .contains(&format!("bridge={}", master.as_deref().unwrap_or("")))
                || master.as_deref().is_none_or(|m| m == self.lab.bridge);
            if !ours {
                return Err(ApiError::die(format!(
                    "interface {name} is in use on bridge '{}' (another lab with the same vmid?); set LAB_VETH_PREFIX for one of them",
                    master.unwrap_or_default()
                )));
            }
            let _ = Command::new("ip").args(["link", "del", &name]).output();
        }
        Ok(())
    }

    /// Stops at once (`lxc-stop --kill`).
    pub fn stop(&self, vmid: u32, _log: Log<'_>) -> ApiResult<()> {
        let _lock = self.lock(vmid)?;
        let conf = self.load(vmid)?;
        Node::check_lock(&conf)?;
        self.lxc_stop(vmid, &["--kill"])
    }

    /// Clean shutdown within `timeout` seconds; with `force`, killed after it.
    pub fn shutdown(&self, vmid: u32, timeout: u64, force: bool, log: Log<'_>) -> ApiResult<()> {
        let _lock = self.lock(vmid)?;
        let conf = self.load(vmid)?;
        Node::check_lock(&conf)?;
        self.shutdown_locked(vmid, timeout, force, log)
    }

    fn shutdown_locked(&self, vmid: u32, timeout: u64, force: bool, log: Log<'_>) -> ApiResult<()> {
        let t = timeout.to_string();
        match self.lxc_stop(vmid, &["--timeout", &t, "--nokill"]) {
            Ok(()) if !self.is_running(vmid) => Ok(()),
            _ if force => {
                log("shutdown timeout reached, forcing stop");
                self.lxc_stop(vmid, &["--kill"])
            }
            Ok(()) | Err(_) => Err(ApiError::die(format!(
                "command 'lxc-stop -n {vmid} --nokill --timeout {timeout}' failed: exit code 1"
            ))),
        }
    }

    /// Shutdown, then start again (pending changes applied on the way, as on Proxmox).
    pub fn reboot(&self, vmid: u32, timeout: u64, log: Log<'_>) -> ApiResult<()> {
        {
            let _lock = self.lock(vmid)?;
            let conf = self.load(vmid)?;
            Node::check_lock(&conf)?;
            self.shutdown_locked(vmid, timeout, true, log)?;
        }
        self.start(vmid, log)
    }

    fn lxc_stop(&self, vmid: u32, args: &[&str]) -> ApiResult<()> {
        if self.state(vmid) == RunState::Stopped {
            return Ok(());
        }
        run(Command::new("lxc-stop")
            .arg("-P")
            .arg(self.lab.lxc_path())
            .args(["-n", &vmid.to_string()])
            .args(args))
        .map(|_| ())
    }
}

/// Drops the host's ARP entries for the container's addresses: a recreated container reuses
/// an address with a new MAC, and a stale entry would stall connections for seconds.
fn forget_neighbours(conf: &crate::pve::config::CtConfig) {
    for (key, value) in &conf.main.props {
        if !crate::pve::options::indexed(key, "net") {
            continue;
        }
        let net = crate::pve::propstr::parse(&crate::pve::propstr::NET, value).unwrap_or_default();
        if let Some(ip) = net.get("ip").and_then(|ip| ip.split('/').next()) {
            let _ = Command::new("ip")
                .args(["neigh", "flush", "to", ip])
                .output();
        }
    }
}

/// `/etc/hostname` and the managed block of `/etc/hosts`, as Proxmox's setup code writes them.
fn write_hostname(root: &std::path::Path, hostname: &str) -> ApiResult<()> {
    let etc = root.join("etc");
    std::fs::write(etc.join("hostname"), format!("{hostname}\n"))?;
    let hosts = std::fs::read_to_string(etc.join("hosts")).unwrap_or_default();
    let (begin, end) = ("# --- BEGIN PVE ---", "# --- END PVE ---");
    let block = format!("{begin}\n127.0.1.1 {hostname}\n{end}\n");
    let new = match (hosts.find(begin), hosts.find(end)) {
        (Some(b), Some(e)) if e > b => format!(
            "{}{block}{}",
            &hosts[..b],
            hosts[e + end.len()..].trim_start_matches('\n')
        ),
        _ => format!("{hosts}{block}"),
    };
    std::fs::write(etc.join("hosts"), new)?;
    Ok(())
}
