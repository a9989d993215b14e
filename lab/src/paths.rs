//! Where the lab keeps its state, and the settings chosen at `lab up`.
//!
//! Everything lives under one directory (`LAB_DIR`, default `/var/lib/provision-lab`), except
//! the config locks, which sit where Proxmox keeps them (`/run/lock/lxc`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Default state directory.
pub const DEFAULT_DIR: &str = "/var/lib/provision-lab";
/// Where `scripts/lab-deps` caches the Debian template.
pub const DEFAULT_CACHE: &str = "/var/cache/provision-lab";

/// The lab's settings, fixed at `up` and saved as `settings.json` in the state directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Settings {
    /// State directory.
    pub dir: PathBuf,
    /// Node name (`lab`).
    pub node: String,
    /// Host bridge the containers' `net0` attaches to.
    pub bridge: String,
    /// Bridge address with prefix, e.g. `10.77.0.1/24`.
    pub bridge_cidr: String,
    /// HTTPS API port on 127.0.0.1.
    pub api_port: u16,
    /// Node sshd port on 127.0.0.1.
    pub ssh_port: u16,
    /// Static mirror port on the bridge address.
    pub mirror_port: u16,
    /// Directory of the `pve-config-<vmid>.lock` files.
    pub lock_dir: PathBuf,
    /// Template cache filled by `scripts/lab-deps`.
    pub cache_dir: PathBuf,
    /// Host data standing for `/shared`; survives `reinstall`.
    pub shared_dir: PathBuf,
    /// Directory served by the mirror.
    pub mirror_dir: PathBuf,
    /// Official API schema, when `../shared/pve-api` exists.
    pub schema: Option<PathBuf>,
    /// Prefix of host-side veth names (`veth` as on Proxmox: `veth<vmid>i<N>`); a second lab
    /// on the same host sets another (at most 4 characters) so equal vmids do not collide.
    #[serde(default = "default_veth_prefix")]
    pub veth_prefix: String,
    /// Cluster mode: the other nodes of a cluster this API also answers for (each with its
    /// own configs and real containers; vmids unique across them). Empty: one node.
    #[serde(default)]
    pub cluster_nodes: Vec<String>,
}

fn default_veth_prefix() -> String {
    "veth".into()
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn env_port(name: &str, default: u16) -> Result<u16> {
    let v = env_or(name, &default.to_string());
    v.parse()
        .with_context(|| format!("{name}={v} is not a port number"))
}

impl Settings {
    /// Settings from the environment (`LAB_DIR`, `LAB_BRIDGE`, `LAB_BRIDGE_CIDR`, ...).
    pub fn from_env() -> Result<Settings> {
        let dir = PathBuf::from(env_or("LAB_DIR", DEFAULT_DIR));
        // The default lab names things as Proxmox does; another lab on the same host gets its
        // own veth prefix and lock directory, so equal vmids in both do not collide.
        let default_lab = dir == Path::new(DEFAULT_DIR);
        let tag = format!(
            "v{:02x}",
            dir.to_string_lossy()
                .bytes()
                .fold(0u8, |h, b| h.wrapping_mul(31).wrapping_add(b))
        );
        let veth_prefix = env_or("LAB_VETH_PREFIX", if default_lab { "veth" } else { &tag });
        let lock_default = if default_lab {
            PathBuf::from("/run/lock/lxc")
        } else {
            dir.join("run/lock/lxc")
        };
        let valid =
            |p: &str| !p.is_empty() && p.len() <= 4 && p.chars().all(|c| c.is_ascii_alphanumeric());
        if !valid(&veth_prefix) {
            bail!("LAB_VETH_PREFIX={veth_prefix} must be 1 to 4 letters or digits");
        }
        let node = env_or("LAB_NODE", "lab");
        let cluster_nodes: Vec<String> = env_or("LAB_CLUSTER_NODES", "")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        for n in &cluster_nodes {
            let ok = n.len() <= 63
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !n.starts_with('-');
            if !ok || *n == node {
                bail!(
                    "LAB_CLUSTER_NODES: `{n}` is not a node name (letters, digits, `-`) other than LAB_NODE"
                );
            }
        }
        let schema = std::env::var_os("LAB_PVE_SCHEMA")
            .map(PathBuf::from)
            .filter(|p| p.exists());
        let s = Settings {
            node,
            cluster_nodes,
            bridge: env_or("LAB_BRIDGE", "vmbr0"),
            bridge_cidr: env_or("LAB_BRIDGE_CIDR", "10.77.0.1/24"),
            api_port: env_port("LAB_API_PORT", 8006)?,
            ssh_port: env_port("LAB_SSH_PORT", 2222)?,
            mirror_port: env_port("LAB_MIRROR_PORT", 8080)?,
            lock_dir: PathBuf::from(env_or("LAB_LOCK_DIR", &lock_default.to_string_lossy())),
            cache_dir: PathBuf::from(env_or("LAB_CACHE_DIR", DEFAULT_CACHE)),
            shared_dir: PathBuf::from(env_or(
                "LAB_SHARED_DIR",
                &dir.join("shared").to_string_lossy(),
            )),
            mirror_dir: PathBuf::from(env_or(
                "LAB_MIRROR_DIR",
                &dir.join("mirror").to_string_lossy(),
            )),
            schema,
            veth_prefix,
            dir,
        };
        s.bridge_net()?;
        Ok(s)
    }

    /// What `asked` (the environment's settings now) asks for differently from these (a
    /// running lab's), one `VAR: running X, asked for Y` each. Only variables that are set
    /// (`is_set`) count: an unset one asks for nothing, whatever its default.
    pub fn differences(&self, asked: &Settings, is_set: &dyn Fn(&str) -> bool) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        let pairs = [
            ("LAB_NODE", self.node.clone(), asked.node.clone()),
            (
                "LAB_CLUSTER_NODES",
                self.cluster_nodes.join(","),
                asked.cluster_nodes.join(","),
            ),
            ("LAB_BRIDGE", self.bridge.clone(), asked.bridge.clone()),
            (
                "LAB_BRIDGE_CIDR",
                self.bridge_cidr.clone(),
                asked.bridge_cidr.clone(),
            ),
            (
                "LAB_API_PORT",
                self.api_port.to_string(),
                asked.api_port.to_string(),
            ),
            (
                "LAB_SSH_PORT",
                self.ssh_port.to_string(),
                asked.ssh_port.to_string(),
            ),
            (
                "LAB_MIRROR_PORT",
                self.mirror_port.to_string(),
                asked.mirror_port.to_string(),
            ),
            ("LAB_LOCK_DIR", path(&self.lock_dir), path(&asked.lock_dir)),
            (
                "LAB_SHARED_DIR",
                path(&self.shared_dir),
                path(&asked.shared_dir),
            ),
            (
                "LAB_MIRROR_DIR",
                path(&self.mirror_dir),
                path(&asked.mirror_dir),
            ),
            (
                "LAB_VETH_PREFIX",
                self.veth_prefix.clone(),
                asked.veth_prefix.clone(),
            ),
        ];
        let shown = |v: &str| {
            if v.is_empty() {
                "(none)".to_string()
            } else {
                v.to_string()
            }
        };
        pairs
            .into_iter()
            .filter(|(var, running, want)| is_set(var) && running != want)
            .map(|(var, running, want)| {
                format!(
                    "{var}: running {}, asked for {}",
                    shown(&running),
                    shown(&want)
                )
            })
            .collect()
    }

    /// Reads the settings saved by `up` in `dir`.
    pub fn load(dir: &Path) -> Result<Settings> {
        let path = dir.join("settings.json");
        let raw = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&raw).with_context(|| format!("parsing {}", path.display()))
    }

    /// Saves the settings into the state directory.
    pub fn save(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let raw = serde_json::to_string_pretty(self)?;
        std::fs::write(self.dir.join("settings.json"), raw + "\n")?;
        Ok(())
    }

    /// The bridge address and prefix length.
    pub fn bridge_net(&self) -> Result<(Ipv4Addr, u8)> {
        let Some((ip, len)) = self.bridge_cidr.split_once('/') else {
            bail!("LAB_BRIDGE_CIDR={} is not ADDRESS/PREFIX", self.bridge_cidr);
        };
        let ip: Ipv4Addr = ip
            .parse()
            .with_context(|| format!("bad address in {}", self.bridge_cidr))?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| (8..=30).contains(l))
            .with_context(|| {
                format!(
                    "prefix of LAB_BRIDGE_CIDR={} must be 8..30",
                    self.bridge_cidr
                )
            })?;
        Ok((ip, len))
    }

    /// The bridge address (the containers' gateway and the mirror's address).
    pub fn bridge_ip(&self) -> Ipv4Addr {
        self.bridge_net()
            .map(|(ip, _)| ip)
            .unwrap_or(Ipv4Addr::new(10, 77, 0, 1))
    }

    /// Every node the API answers for, this one first: the others are these settings
    /// under another node name (configs in `nodes/<name>/lxc`; all else shared, which is
    /// sound because vmids are unique cluster-wide).
    pub fn members(&self) -> Vec<Settings> {
        let mut out = vec![self.clone()];
        for n in &self.cluster_nodes {
            out.push(Settings {
                node: n.clone(),
                cluster_nodes: Vec::new(),
                ..self.clone()
            });
        }
        out
    }

    /// Node config root, the lab's `/etc/pve`.
    pub fn pve_root(&self) -> PathBuf {
        self.dir.join("etc/pve")
    }

    /// Directory of the container configs (`nodes/<node>/lxc`).
    pub fn conf_dir(&self) -> PathBuf {
        self.pve_root().join("nodes").join(&self.node).join("lxc")
    }

    /// Config file of one container.
    pub fn conf_path(&self, vmid: u32) -> PathBuf {
        self.conf_dir().join(format!("{vmid}.conf"))
    }

    /// The config path as Proxmox names it in messages (`nodes/lab/lxc/129.conf`).
    pub fn conf_name(&self, vmid: u32) -> String {
        format!("nodes/{}/lxc/{vmid}.conf", self.node)
    }

    /// LXC's `-P` directory: one generated LXC config per container.
    pub fn lxc_path(&self) -> PathBuf {
        self.dir.join("lxc")
    }

    /// Root of storage `local` (type dir).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.join("storage/local")
    }

    /// Where `vztmpl` content lives.
    pub fn template_dir(&self) -> PathBuf {
        self.storage_dir().join("template/cache")
    }

    /// Where a container's volumes live.
    pub fn images_dir(&self, vmid: u32) -> PathBuf {
        self.storage_dir().join("images").join(vmid.to_string())
    }

    /// Unpacked templates, so creating a container is a copy rather than an unpack.
    pub fn unpacked_dir(&self) -> PathBuf {
        self.dir.join("cache/unpacked")
    }

    /// Pid files and logs.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// Keys, passwords, certificate.
    pub fn secrets_dir(&self) -> PathBuf {
        self.dir.join("secrets")
    }

    /// `pct` and the copy of `pve-lab` it runs.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }

    /// The node's private SSH login key (root).
    pub fn node_key(&self) -> PathBuf {
        self.secrets_dir().join("id_ed25519")
    }

    /// Host-side name of a container's network interface `N` (`veth<vmid>i<N>`).
    pub fn veth(&self, vmid: u32, n: &str) -> String {
        format!("{}{vmid}i{n}", self.veth_prefix)
    }

    /// The lock file Proxmox uses for a container's config.
    pub fn lock_path(&self, vmid: u32) -> PathBuf {
        self.lock_dir.join(format!("pve-config-{vmid}.lock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> Settings {
        Settings {
            dir: PathBuf::from("/var/lib/provision-lab-x"),
            node: "lab".into(),
            bridge: "vmbrx".into(),
            bridge_cidr: "10.99.0.1/24".into(),
            api_port: 8706,
            ssh_port: 2922,
            mirror_port: 8780,
            lock_dir: PathBuf::from("/var/lib/provision-lab-x/run/lock/lxc"),
            cache_dir: PathBuf::from(DEFAULT_CACHE),
            shared_dir: PathBuf::from("/var/lib/provision-lab-x/shared"),
            mirror_dir: PathBuf::from("/var/lib/provision-lab-x/mirror"),
            schema: None,
            veth_prefix: "v1a".into(),
            cluster_nodes: Vec::new(),
        }
    }

    #[test]
    fn only_what_is_asked_for_differently_counts() {
        let running = lab();
        let mut asked = lab();
        asked.cluster_nodes = vec!["lab2".into()];
        asked.api_port = 8006;
        asked.bridge = "vmbr0".into();
        // LAB_API_PORT unset: its default (8006) asks for nothing.
        let set = |v: &str| matches!(v, "LAB_CLUSTER_NODES" | "LAB_BRIDGE");
        assert_eq!(
            running.differences(&asked, &set),
            vec![
                "LAB_CLUSTER_NODES: running (none), asked for lab2".to_string(),
                "LAB_BRIDGE: running vmbrx, asked for vmbr0".to_string(),
            ]
        );
        // The lab's own exports, evaluated again, ask for what runs.
        assert!(running.differences(&lab(), &|_| true).is_empty());
    }
}
