//! A container's own rules: its vmid, template and sizes, network, mounts, GPUs and roles.

use std::collections::HashSet;

use super::{VMID_RANGE, Validator};
use crate::inventory::container::{Container, GpuSelector, GpuUserspace, IpConfig};
use crate::inventory::load::did_you_mean;
use crate::inventory::spanned::Pos;
use crate::inventory::text::Name;

impl Validator<'_> {
    pub(super) fn container(&mut self, name: &Name, ct: &Container, known_roles: &[String]) {
        if !VMID_RANGE.contains(&ct.vmid.value) {
            self.err(
                ct.vmid.pos,
                format!("vmid {} is out of range", ct.vmid.value),
                "Proxmox container IDs run from 100 to 999999999",
            );
        }
        let template = ct.template.as_str();
        let ok_template = template.split_once(':').is_some_and(|(storage, vol)| {
            !storage.is_empty() && vol.starts_with("vztmpl/") && vol.len() > 7
        });
        if !ok_template {
            self.err(
                ct.template.pos,
                format!("`{template}` is not a template volume ID"),
                "write STORAGE:vztmpl/FILE, e.g. `local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst`",
            );
        }
        if ct.cores.value == 0 {
            self.err(
                ct.cores.pos,
                "a container needs at least one core",
                "set `cores: 1` or more",
            );
        }
        if ct.memory.bytes() < 16 * 1024 * 1024 {
            self.err(
                ct.memory.pos,
                format!("memory {} is too small", ct.memory.value),
                "Proxmox needs at least 16M",
            );
        }
        let size = ct.rootfs.size.value;
        if size.bytes() == 0 || !size.bytes().is_multiple_of(1024 * 1024 * 1024) {
            self.err(
                ct.rootfs.size.pos,
                format!(
                    "root filesystem size {} is not a whole number of GiB",
                    ct.rootfs.size.value
                ),
                "Proxmox allocates container disks in GiB, e.g. `200G`",
            );
        }
        self.proxmox_values(ct);
        self.network(name, ct);
        self.mounts(ct);
        self.gpus(ct);
        self.roles(ct, known_roles);
        self.software(ct);
        self.services(name, ct);
    }

    pub(super) fn network(&mut self, name: &Name, ct: &Container) {
        let mut names = HashSet::new();
        for nic in &ct.network {
            if !names.insert(nic.name.as_str()) {
                self.err(
                    nic.name.pos,
                    format!("interface `{}` is declared twice", nic.name.value),
                    "give each interface its own name",
                );
            }
            if let (IpConfig::Static(addr, prefix), Some(gw)) = (nic.ip.value, &nic.gateway) {
                let mask = if prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - prefix)
                };
                if u32::from(addr) & mask != u32::from(gw.0) & mask {
                    self.err(
                        gw.pos,
                        format!("gateway {} is outside {}", gw.value, nic.ip.value),
                        "the gateway must be on the interface's subnet",
                    );
                }
            }
        }
        if ct.ssh.host.is_none() {
            let has_static = ct
                .network
                .first()
                .is_some_and(|n| matches!(n.ip.value, IpConfig::Static(..)));
            if !has_static {
                self.err(
                    ct.vmid.pos,
                    format!("container `{name}` has no address to reach it by SSH"),
                    "give its first interface a static `ip:` or set `ssh: { host: ... }`",
                );
            }
        }
    }

    pub(super) fn mounts(&mut self, ct: &Container) {
        let mut paths = HashSet::new();
        for m in &ct.mounts {
            if m.path.as_str() == "/" {
                self.err(
                    m.path.pos,
                    "a mount cannot cover the container's root",
                    "mount it below /, e.g. `/shared`",
                );
            }
            if !paths.insert(m.path.as_str()) {
                self.err(
                    m.path.pos,
                    format!("`{}` is mounted twice", m.path.value),
                    "keep one mount per container path",
                );
            }
        }
    }

    pub(super) fn gpus(&mut self, ct: &Container) {
        let Some(gpus) = &ct.gpus else { return };
        if gpus.devices.is_empty() {
            self.err(
                gpus.method.pos,
                "`gpus.devices` is empty",
                "list the GPUs by index or UUID, or remove `gpus:`",
            );
        }
        let mut seen = HashSet::new();
        for d in &gpus.devices {
            if !seen.insert(&d.value) {
                self.err(
                    d.pos,
                    format!("GPU `{}` is listed twice", d.value),
                    "list each GPU once",
                );
            }
        }
        let by_index = gpus
            .devices
            .iter()
            .any(|d| matches!(d.value, GpuSelector::Index(_)));
        let by_uuid = gpus
            .devices
            .iter()
            .any(|d| matches!(d.value, GpuSelector::Uuid(_)));
        if by_index && by_uuid {
            self.err(
                gpus.devices[0].pos,
                "GPUs are selected both by index and by UUID",
                "use one kind; UUIDs stay stable when cards are added or moved",
            );
        }
        if let Some(u) = &gpus.userspace {
            self.userspace(u, gpus.method.pos);
        }
    }

    fn userspace(&mut self, u: &GpuUserspace, pos: Pos) {
        match (&u.installer, u.packages.is_empty()) {
            (None, true) | (Some(_), false) => self.err(
                u.packages.first().map_or(pos, |p| p.pos),
                "`gpus.userspace` needs exactly one of `installer` and `packages`",
                "NVIDIA's .run (`installer: { url, sha256 }`) or the distribution's packages pinned to the node's version",
            ),
            _ => {}
        }
        if let Some(i) = &u.installer {
            let url = i.url.as_str();
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                self.err(
                    i.url.pos,
                    format!("`{url}` is not an http(s) URL"),
                    "the container downloads the installer over HTTP(S)",
                );
            } else if i.version().is_none() {
                self.err(
                    i.url.pos,
                    "the installer's file name does not say its version",
                    "NVIDIA names it NVIDIA-Linux-x86_64-<version>.run; provision compares that version with the node's kernel module",
                );
            }
            let s = i.sha256.as_str();
            if s.len() != 64 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
                self.err(
                    i.sha256.pos,
                    "the installer's sha256 is not 64 hex digits",
                    "write what `sha256sum NVIDIA-Linux-….run` prints",
                );
            }
        }
        for p in &u.packages {
            if !p.as_str().contains('=') {
                self.err(
                    p.pos,
                    format!("`{}` is not pinned to a version", p.as_str()),
                    "pin it to the node's driver version, e.g. `libnvidia-compute-580=580.95.05-0ubuntu1`: a userspace of another version gives `Driver/library version mismatch`",
                );
            }
        }
    }

    pub(super) fn roles(&mut self, ct: &Container, known_roles: &[String]) {
        let mut seen = HashSet::new();
        for role in &ct.roles {
            if !seen.insert(role.as_str()) {
                self.err(
                    role.pos,
                    format!("role `{}` is listed twice", role.value),
                    "list each role once",
                );
            }
            if !known_roles.iter().any(|r| r == role.as_str()) {
                let hint = match did_you_mean(role.as_str(), known_roles) {
                    Some(best) => format!("did you mean `{best}`?"),
                    None => format!("known roles: {}", known_roles.join(", ")),
                };
                self.err(role.pos, format!("unknown role `{}`", role.value), hint);
            }
            let needs: &[(&str, bool, &str)] = &[
                ("cuda", ct.cuda.is_some(), "cuda"),
                ("ml-env", ct.ml_env.is_some(), "ml_env"),
                ("gpu-passthrough", ct.gpus.is_some(), "gpus"),
                ("model-store", !ct.models.is_empty(), "models"),
                ("sglang", !ct.services.is_empty(), "services"),
            ];
            for (r, present, section) in needs {
                if role.as_str() == *r && !present {
                    self.err(
                        role.pos,
                        format!("role `{r}` needs a `{section}:` section"),
                        format!("add `{section}:` to this container or drop the role"),
                    );
                }
            }
        }
    }
}
