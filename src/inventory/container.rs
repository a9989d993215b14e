//! An LXC container on a node, and everything that runs inside it.

use std::borrow::Cow;
use std::fmt;
use std::net::Ipv4Addr;

use indexmap::IndexMap;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use super::apt::AptSource;
use super::node::SshTarget;
use super::service::Service;
use super::software::{Cuda, HfModel, MlEnv};
use super::spanned::Sp;
use super::text::ValueError;
use super::text::{AbsPath, Name, Text};
use super::units::Size;

/// One LXC container (a Proxmox `CT`) and the software it runs.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Container {
    /// The container's ID on the node (100 to 999999999).
    pub vmid: Sp<u64>,
    /// Host name inside the container; defaults to the container's name.
    pub hostname: Option<Sp<Name>>,
    /// The OS template, as a Proxmox volume ID: `local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst`.
    pub template: Sp<Text>,
    /// CPU cores.
    pub cores: Sp<u32>,
    /// Memory, e.g. `256G`.
    pub memory: Sp<Size>,
    /// Swap, e.g. `0` or `8G`.
    #[serde(default)]
    pub swap: Sp<Size>,
    /// The root filesystem.
    pub rootfs: Rootfs,
    /// Run with a user namespace (Proxmox's default for new containers).
    #[serde(default = "default_true")]
    pub unprivileged: Sp<bool>,
    /// Container features.
    #[serde(default)]
    pub features: Features,
    /// Network interfaces.
    #[serde(default)]
    pub network: Vec<Nic>,
    /// DNS servers.
    #[serde(default)]
    pub nameservers: Vec<Sp<Text>>,
    /// SSH public keys put into root's `authorized_keys` at creation.
    #[serde(default)]
    pub ssh_keys: Vec<Sp<Text>>,
    /// Start when the node boots.
    #[serde(default)]
    pub onboot: Sp<bool>,
    /// Whether apply may restart the running container to apply changes Proxmox keeps
    /// pending until a restart (a new mount point, `unprivileged` aside): `allowed` or
    /// `never` (they stay pending and the plan says so).
    #[serde(default)]
    pub restart: Sp<RestartPolicy>,
    /// Proxmox tags.
    #[serde(default)]
    pub tags: Vec<Sp<Name>>,
    /// Host directories bind-mounted into the container (Proxmox `mpN`).
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Host GPUs passed through to the container.
    pub gpus: Option<Gpus>,
    /// SSH into the container once it runs; the host defaults to the first network address.
    #[serde(default)]
    pub ssh: SshTarget,
    /// Roles that apply, in order (built-in: gpu-passthrough, cuda, ml-env, model-store, sglang).
    #[serde(default)]
    pub roles: Vec<Sp<Name>>,
    /// APT repositories, configured before any package is installed (a local mirror on
    /// air-gapped hosts, NVIDIA's CUDA repository).
    #[serde(default)]
    pub apt_sources: Vec<AptSource>,
    /// Debian packages to have installed (beyond what roles add): `name` or `name=version`.
    #[serde(default)]
    pub packages: Vec<Sp<Text>>,
    /// The CUDA toolkit.
    pub cuda: Option<Cuda>,
    /// The Python environment the models are served from.
    pub ml_env: Option<MlEnv>,
    /// Models to keep on the container's storage, by a name services refer to.
    #[serde(default)]
    pub models: IndexMap<Name, HfModel>,
    /// Services, by name (the unit is `<name>.service` unless set).
    #[serde(default)]
    pub services: IndexMap<Name, Service>,
}

/// May apply restart a running container?
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    /// Restart (reboot through the API) when a change waits for it.
    Allowed,
    /// Never restart; changes that need it stay pending.
    #[default]
    Never,
}

fn default_true() -> Sp<bool> {
    Sp::new(true)
}

/// The container's root filesystem.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rootfs {
    /// Proxmox storage holding it, e.g. `local-zfs`.
    pub storage: Sp<Name>,
    /// Size, e.g. `200G` (whole GiB).
    pub size: Sp<Size>,
}

/// Container features (Proxmox `features`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Features {
    /// Allow nested containers and systemd's sandboxing (needed by recent systemd in
    /// unprivileged containers).
    #[serde(default)]
    pub nesting: Sp<bool>,
    /// Allow the keyctl() system call.
    #[serde(default)]
    pub keyctl: Sp<bool>,
    /// Allow FUSE mounts.
    #[serde(default)]
    pub fuse: Sp<bool>,
}

impl Features {
    /// As Proxmox writes them: `fuse=1,keyctl=1,nesting=1`, or `None` when all are off.
    pub fn pve_string(&self) -> Option<String> {
        let mut parts = Vec::new();
        for (name, on) in [
            ("fuse", &self.fuse),
            ("keyctl", &self.keyctl),
            ("nesting", &self.nesting),
        ] {
            if on.value {
                parts.push(format!("{name}=1"));
            }
        }
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

/// A network interface.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// Interface name inside the container.
    #[serde(default = "default_nic_name")]
    pub name: Sp<Name>,
    /// Host bridge, e.g. `vmbr0`.
    pub bridge: Sp<Name>,
    /// `ADDRESS/PREFIX` or `dhcp`.
    pub ip: Sp<IpConfig>,
    /// Default gateway.
    pub gateway: Option<Sp<Ipv4>>,
    /// VLAN tag.
    pub vlan: Option<Sp<u16>>,
    /// Proxmox firewall on this interface.
    #[serde(default)]
    pub firewall: Sp<bool>,
}

fn default_nic_name() -> Sp<Name> {
    Sp::new(Name::parse("eth0").expect("valid default"))
}

/// An interface's IPv4 configuration.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde_with::DeserializeFromStr, serde_with::SerializeDisplay,
)]
pub enum IpConfig {
    /// Address and prefix length.
    Static(Ipv4Addr, u8),
    /// From DHCP.
    Dhcp,
}

impl fmt::Display for IpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpConfig::Static(addr, prefix) => write!(f, "{addr}/{prefix}"),
            IpConfig::Dhcp => f.write_str("dhcp"),
        }
    }
}

impl IpConfig {
    fn parse(s: &str) -> Result<Self, ValueError> {
        if s == "dhcp" {
            return Ok(IpConfig::Dhcp);
        }
        let bad = |message: String| {
            ValueError::new(message).hint("write ADDRESS/PREFIX, e.g. `192.0.2.10/24`, or `dhcp`")
        };
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| bad(format!("`{s}` has no prefix length")))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| bad(format!("`{addr}` is not an IPv4 address")))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| bad(format!("`{prefix}` is not a prefix length (0 to 32)")))?;
        Ok(IpConfig::Static(addr, prefix))
    }
}

impl std::str::FromStr for IpConfig {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        IpConfig::parse(s)
    }
}

impl JsonSchema for IpConfig {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("IpConfig")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "description": "ADDRESS/PREFIX (e.g. 10.1.230.174/24) or dhcp.", "pattern": "^(dhcp|[0-9.]+/[0-9]+)$"})
    }
}

/// An IPv4 address.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde_with::DeserializeFromStr, serde_with::SerializeDisplay,
)]
pub struct Ipv4(pub Ipv4Addr);

impl fmt::Display for Ipv4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Ipv4 {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        s.parse()
            .map(Ipv4)
            .map_err(|_| ValueError::new(format!("`{s}` is not an IPv4 address")))
    }
}

impl JsonSchema for Ipv4 {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Ipv4")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "ipv4"})
    }
}

/// A host directory bind-mounted into the container.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// The directory on the node (a dataset's mountpoint, e.g. `/tank/shared`).
    pub host: Sp<AbsPath>,
    /// Where it appears in the container, e.g. `/shared`.
    pub path: Sp<AbsPath>,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: Sp<bool>,
    /// Include in Proxmox backups (off: model stores are large and re-downloadable).
    #[serde(default)]
    pub backup: Sp<bool>,
}

/// GPUs passed through from the node.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gpus {
    /// Which GPUs of the node: an index as `nvidia-smi` numbers them, or a UUID (`GPU-…`).
    pub devices: Vec<Sp<GpuSelector>>,
    /// How the device nodes reach the container.
    #[serde(default)]
    pub method: Sp<GpuMethod>,
    /// The NVIDIA userspace driver inside the container (`libcuda.so.1`,
    /// `libnvidia-ml.so.1`, `nvidia-smi`), installed at exactly the node's kernel module
    /// version. Passthrough brings device nodes only; without it nothing in the container
    /// can use them.
    pub userspace: Option<GpuUserspace>,
}

/// Where the container's NVIDIA userspace comes from: NVIDIA's `.run` installer, run with
/// `--no-kernel-module --silent`, or distribution packages pinned to the node's version.
/// Exactly one of the two.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuUserspace {
    /// NVIDIA's installer for exactly the node's module version, e.g.
    /// `https://us.download.nvidia.com/XFree86/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run`;
    /// its file name carries the version it installs.
    pub installer: Option<UserspaceInstaller>,
    /// Debian packages pinned to exactly the node's version, e.g.
    /// `libnvidia-compute-580=580.95.05-0ubuntu1` and `nvidia-utils-580=580.95.05-0ubuntu1`.
    #[serde(default)]
    pub packages: Vec<Sp<Text>>,
}

/// NVIDIA's `.run` file and its checksum.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UserspaceInstaller {
    /// Where the node downloads it from (http or https) before pushing it into the container.
    pub url: Sp<Text>,
    /// Its sha256, hex; checked before it runs.
    pub sha256: Sp<Text>,
}

impl UserspaceInstaller {
    /// The version its file name says it installs (`NVIDIA-Linux-x86_64-<version>.run`).
    pub fn version(&self) -> Option<String> {
        let file = self.url.as_str().rsplit('/').next()?;
        let v = file.strip_suffix(".run")?.rsplit('-').next()?;
        (v.split('.').count() >= 2
            && v.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())))
        .then(|| v.to_string())
    }
}

/// How GPU device nodes are passed through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuMethod {
    /// Proxmox `devN:` entries (Proxmox VE 8.1 and later), which handle cgroup rules and
    /// device majors themselves.
    #[default]
    Dev,
    /// Raw `lxc.cgroup2.devices.allow` and `lxc.mount.entry` lines (any version; needs the
    /// node's device majors).
    Lxc,
}

/// One GPU: by index or by UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuSelector {
    /// The index `nvidia-smi` gives it on the node.
    Index(u32),
    /// Its UUID, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    Uuid(String),
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelector::Index(i) => write!(f, "{i}"),
            GpuSelector::Uuid(u) => f.write_str(u),
        }
    }
}

impl GpuSelector {
    /// Parses `0` (an index) or `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (a UUID), as
    /// written on command lines.
    pub fn parse(s: &str) -> Result<GpuSelector, ValueError> {
        let s = s.trim();
        match s.parse::<u32>() {
            Ok(i) => Ok(GpuSelector::Index(i)),
            Err(_) => parse_gpu_uuid(s),
        }
    }
}

fn parse_gpu_uuid(s: &str) -> Result<GpuSelector, ValueError> {
    let hex = s.strip_prefix("GPU-").unwrap_or("");
    let groups: Vec<&str> = hex.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        Ok(GpuSelector::Uuid(s.to_string()))
    } else {
        Err(ValueError::new(format!("`{s}` is neither a GPU index nor a GPU UUID")).hint("use the index or the UUID that `nvidia-smi -L` prints, e.g. `0` or `GPU-5a3c2b1e-...`"))
    }
}

impl<'de> Deserialize<'de> for GpuSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GpuSelector;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a GPU index or UUID")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GpuSelector, E> {
                u32::try_from(v)
                    .ok()
                    .filter(|v| *v < 1024)
                    .map(GpuSelector::Index)
                    .ok_or_else(|| E::custom(format!("GPU index {v} is out of range")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GpuSelector, E> {
                if v < 0 {
                    Err(E::custom(format!("GPU index {v} is negative")))
                } else {
                    self.visit_u64(v as u64)
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<GpuSelector, E> {
                parse_gpu_uuid(s).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for GpuSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GpuSelector::Index(i) => s.serialize_u32(*i),
            GpuSelector::Uuid(u) => s.serialize_str(u),
        }
    }
}

impl JsonSchema for GpuSelector {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("GpuSelector")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A GPU index as nvidia-smi numbers it, or a GPU UUID.",
            "oneOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"}
            ]
        })
    }
}
