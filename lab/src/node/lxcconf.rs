//! The Proxmox config turned into LXC config at start, as `PVE::LXC::update_lxc_config` does:
//! `netN` as veth on a bridge, `mpN` as bind mounts, `devN` as device nodes with cgroup allow,
//! and raw `lxc.*` lines passed through.

use std::fmt::Write as _;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{ApiError, ApiResult};
use crate::paths::Settings;
use crate::pve::config::CtConfig;
use crate::pve::options::{MountKind, indexed};
use crate::pve::propstr;

use super::volumes;

/// True when the host's devices controller is cgroup v1 (this machine): `lxc.cgroup2.devices.*`
/// lines written for a Proxmox 8/9 node (pure cgroup v2) are then applied as `lxc.cgroup.*`.
fn devices_v1() -> bool {
    Path::new("/sys/fs/cgroup/devices/devices.allow").exists()
}

fn memory_v1() -> bool {
    Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
}

/// The cgroup key prefix for a controller on this host.
pub fn cgroup_key(controller: &str) -> &'static str {
    let v1 = match controller {
        "devices" => devices_v1(),
        "memory" => memory_v1(),
        _ => Path::new(&format!("/sys/fs/cgroup/{controller}")).is_dir(),
    };
    if v1 { "lxc.cgroup" } else { "lxc.cgroup2" }
}

/// Host path of a container's root filesystem.
pub fn rootfs_path(lab: &Settings, conf: &CtConfig) -> ApiResult<PathBuf> {
    let rootfs = conf
        .get("rootfs")
        .ok_or_else(|| ApiError::die("rootfs not defined"))?;
    let mp = propstr::parse(&propstr::ROOTFS, rootfs).map_err(ApiError::die)?;
    volumes::path_of(lab, &mp["volume"])
}

/// Renders `<lxcpath>/<vmid>/config`.
pub fn render(lab: &Settings, vmid: u32, conf: &CtConfig) -> ApiResult<String> {
    let unprivileged = conf.get("unprivileged") == Some("1");
    let hostname = conf
        .get("hostname")
        .map_or(format!("CT{vmid}"), str::to_string);
    let mut c = String::new();
    let mut line = |k: &str, v: &str| {
        let _ = writeln!(c, "{k} = {v}");
    };
    line("lxc.uts.name", &hostname);
    line("lxc.arch", "amd64");
    line("lxc.include", "/usr/share/lxc/config/common.conf");
    if unprivileged {
        line("lxc.include", "/usr/share/lxc/config/userns.conf");
        line("lxc.idmap", "u 0 100000 65536");
        line("lxc.idmap", "g 0 100000 65536");
    }
    line("lxc.apparmor.profile", "unconfined");
    // systemd powers off on SIGRTMIN+4; LXC's default SIGPWR only reaches sigpwr.target.
    line("lxc.signal.halt", "SIGRTMIN+4");
    line("lxc.tty.max", conf.get("tty").unwrap_or("2"));
    let features = conf
        .get("features")
        .map(|f| propstr::parse(&propstr::FEATURES, f).unwrap_or_default())
        .unwrap_or_default();
    if features.get("nesting").map(String::as_str) == Some("1") {
        line("lxc.include", "/usr/share/lxc/config/nesting.conf");
    }
    let rootfs = rootfs_path(lab, conf)?;
    line("lxc.rootfs.path", &format!("dir:{}", rootfs.display()));
    if unprivileged {
        line("lxc.rootfs.options", "idmap=container");
    }
    let mem: u64 = conf
        .get("memory")
        .and_then(|m| m.parse().ok())
        .unwrap_or(512);
    let mem_prefix = cgroup_key("memory");
    if mem_prefix == "lxc.cgroup" {
        line("lxc.cgroup.memory.limit_in_bytes", &(mem << 20).to_string());
    } else {
        line("lxc.cgroup2.memory.max", &(mem << 20).to_string());
    }

    let mut keys: Vec<&String> = conf.main.props.keys().collect();
    keys.sort_by_key(|k| {
        (
            k.trim_end_matches(|c: char| c.is_ascii_digit()).to_string(),
            index(k),
        )
    });
    for key in keys {
        let value = &conf.main.props[key];
        if indexed(key, "net") {
            net_lines(&mut line, lab, vmid, key, value)?;
        } else if indexed(key, "mp") {
            mount_lines(&mut line, lab, key, value, unprivileged)?;
        } else if indexed(key, "dev") {
            dev_lines(&mut line, lab, key, value)?;
        }
    }
    for (k, v) in &conf.main.lxc {
        let k = match k.strip_prefix("lxc.cgroup2.devices.") {
            Some(rest) if devices_v1() => format!("lxc.cgroup.devices.{rest}"),
            _ => k.clone(),
        };
        line(&k, v);
    }
    Ok(c)
}

fn index(key: &str) -> u32 {
    key.trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0)
}

fn net_lines(
    line: &mut impl FnMut(&str, &str),
    lab: &Settings,
    vmid: u32,
    key: &str,
    value: &str,
) -> ApiResult<()> {
    let default_bridge = lab.bridge.as_str();
    let n = index(key);
    let net =
        propstr::parse(&propstr::NET, value).map_err(|e| ApiError::die(format!("{key}: {e}")))?;
    let p = format!("lxc.net.{n}");
    line(&format!("{p}.type"), "veth");
    line(&format!("{p}.veth.pair"), &lab.veth(vmid, &n.to_string()));
    line(
        &format!("{p}.link"),
        net.get("bridge").map_or(default_bridge, String::as_str),
    );
    if net.get("link_down").map(String::as_str) != Some("1") {
        line(&format!("{p}.flags"), "up");
    }
    line(&format!("{p}.name"), &net["name"]);
    if let Some(hw) = net.get("hwaddr") {
        line(&format!("{p}.hwaddr"), hw);
    }
    if let Some(mtu) = net.get("mtu") {
        line(&format!("{p}.mtu"), mtu);
    }
    // `dhcp` and `manual` are left to the container; the lab bridge has no DHCP server.
    if let Some(ip) = net.get("ip").filter(|ip| ip.contains('/')) {
        line(&format!("{p}.ipv4.address"), ip);
        if let Some(gw) = net.get("gw") {
            line(&format!("{p}.ipv4.gateway"), gw);
        }
    }
    if let Some(ip6) = net.get("ip6").filter(|ip| ip.contains('/')) {
        line(&format!("{p}.ipv6.address"), ip6);
        if let Some(gw) = net.get("gw6") {
            line(&format!("{p}.ipv6.gateway"), gw);
        }
    }
    Ok(())
}

fn mount_lines(
    line: &mut impl FnMut(&str, &str),
    lab: &Settings,
    key: &str,
    value: &str,
    unprivileged: bool,
) -> ApiResult<()> {
    let mp =
        propstr::parse(&propstr::MP, value).map_err(|e| ApiError::die(format!("{key}: {e}")))?;
    let volume = &mp["volume"];
    let target = mp["mp"].trim_start_matches('/');
    let kind = MountKind::of(volume);
    let source = match kind {
        MountKind::Volume => volumes::path_of(lab, volume)?,
        MountKind::Bind | MountKind::Device => {
            let p = PathBuf::from(volume);
            if !p.exists() {
                return Err(ApiError::die(format!(
                    "mount point '{volume}' does not exist"
                )));
            }
            p
        }
    };
    let mut opts = vec!["rbind", "create=dir"];
    if mp.get("ro").map(String::as_str) == Some("1") {
        opts.push("ro");
    }
    // Proxmox shifts new volumes to the container's ids; host bind mounts keep host ownership
    // (root shows as nobody inside an unprivileged container), exactly as on a real node.
    if unprivileged && kind == MountKind::Volume {
        opts.push("idmap=container");
    }
    line(
        "lxc.mount.entry",
        &format!("{} {target} none {} 0 0", source.display(), opts.join(",")),
    );
    Ok(())
}

fn dev_lines(
    line: &mut impl FnMut(&str, &str),
    lab: &Settings,
    key: &str,
    value: &str,
) -> ApiResult<()> {
    let dev =
        crate::gpu::parse_dev(lab, value).map_err(|e| ApiError::die(format!("{key}: {e}")))?;
    let path = dev.get("path").ok_or_else(|| {
        ApiError::die(format!("Path is not defined for passthrough device {key}"))
    })?;
    let meta = std::fs::metadata(path).map_err(|e| ApiError::die(format!("{key}: {path}: {e}")))?;
    let kind = if meta.file_type().is_char_device() {
        'c'
    } else if meta.file_type().is_block_device() {
        'b'
    } else {
        return Err(ApiError::die(format!("{key}: '{path}' is not a device")));
    };
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let access = if dev.get("deny-write").map(String::as_str) == Some("1") {
        "rm"
    } else {
        "rwm"
    };
    line(
        &format!("{}.devices.allow", cgroup_key("devices")),
        &format!("{kind} {major}:{minor} {access}"),
    );
    let target = path.trim_start_matches('/');
    line(
        "lxc.mount.entry",
        &format!("{path} {target} none bind,optional,create=file 0 0"),
    );
    Ok(())
}
