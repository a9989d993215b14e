//! The values templates and roles see for one container: the inventory's declarations plus
//! what follows from them (the venv's `bin`, device paths, and each service as built in
//! [`super::service`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::service::BuiltService;
use crate::inventory::container::{Container, GpuMethod, GpuSelector, Gpus, IpConfig};
use crate::inventory::node::Node;
use crate::inventory::secret::{SecretRef, resolve_local};
use crate::inventory::text::Name;

/// What the node says about its GPUs, when it has been read (not in an offline plan).
#[derive(Debug, Clone, Default)]
pub struct NodeGpuView {
    /// Major number of `nvidia` (the GPU and control nodes) from `/proc/devices`; 195 on
    /// every driver so far, but read like the others rather than trusted.
    pub nvidia_major: Option<u32>,
    /// Major number of `nvidia-uvm` from `/proc/devices` (dynamic, unlike nvidia's 195).
    pub nvidia_uvm_major: Option<u32>,
    /// Device minor (`/dev/nvidiaN`) by GPU UUID.
    pub minor_by_uuid: BTreeMap<String, u32>,
    /// Device minor by `nvidia-smi` index.
    pub minor_by_index: BTreeMap<u32, u32>,
    /// The `/dev/nvidia*` nodes that exist on the node; empty when not read. The shared
    /// nodes (`nvidiactl`, `nvidia-uvm`, …) are passed only where they exist: Proxmox
    /// refuses to start a container whose `devN` names a missing node.
    pub device_nodes: Vec<String>,
    /// The loaded kernel module's version (`/proc/driver/nvidia/version`), which the
    /// containers' userspace must equal.
    pub driver: Option<String>,
}

/// The major the NVIDIA driver registers its GPU and control nodes under; offline plans
/// assume it (and say so), read plans take the node's `/proc/devices`.
pub const NVIDIA_MAJOR: u32 = 195;

/// Placeholder for a value only the node can tell.
fn unknown(what: &str) -> String {
    format!("<{what}: read from the node>")
}

/// The address to reach a container by SSH: `ssh.host`, else its first static address.
pub fn guest_host(ct: &Container) -> Option<String> {
    if let Some(h) = &ct.ssh.host {
        return Some(h.to_string());
    }
    ct.network.first().and_then(|n| match n.ip.value {
        IpConfig::Static(addr, _) => Some(addr.to_string()),
        IpConfig::Dhcp => None,
    })
}

/// The APT source the `cuda` role declares: the inventory's `cuda.repository`, else
/// NVIDIA's for the distribution the template's name says (`None` when it says none
/// NVIDIA knows; validation refuses that).
fn cuda_repository(c: &crate::inventory::software::Cuda, ct: &Container, base_dir: &Path) -> Value {
    use crate::inventory::apt::nvidia_distribution;
    use crate::resources::apt_source::AptSourceSpec;
    let spec = match &c.repository {
        Some(r) => Some(crate::compile::container::apt_source_spec(
            "cuda", r, base_dir,
        )),
        None => nvidia_distribution(ct.template.as_str()).map(AptSourceSpec::nvidia_cuda),
    };
    serde_json::to_value(spec).unwrap_or(Value::Null)
}

/// The template/role context for container `ct_name` on node `node_name`.
pub fn container_context(
    node_name: &Name,
    node: &Node,
    ct_name: &Name,
    ct: &Container,
    gpu_view: Option<&NodeGpuView>,
    base_dir: &Path,
    services: &[BuiltService],
) -> Value {
    let cuda = ct.cuda.as_ref().map(|c| {
        let home = c.home();
        json!({
            "version": c.version.to_string(),
            "home": home.to_string(),
            "bin": home.join("bin").to_string(),
            "lib64": home.join("lib64").to_string(),
            "package": c.package(),
            "repository": cuda_repository(c, ct, base_dir),
        })
    });
    let ml_env = ct.ml_env.as_ref().map(|env| {
        let index = env.index.as_ref();
        // The venv and the checkout are built at their generation's folders; `bin` and
        // `interpreter` are the stable paths a unit runs from.
        let generation = crate::generations::paths(env);
        let uv = (env.installer() == crate::inventory::software::Installer::Uv)
            .then(crate::resources::uv::UvSpec::pinned);
        json!({
            "uv_path": uv.as_ref().map(|u| u.path.clone()),
            "uv": uv,
            "path": generation.venv,
            "stable_path": env.path.to_string(),
            "links": generation.links,
            "bin": env.bin().to_string(),
            "python": env.python.to_string(),
            "interpreter": env.bin().join("python3").to_string(),
            "packages": env.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "index_url": index.and_then(|i| i.url.as_ref()).map(|u| u.to_string()),
            "extra_index_urls": index.map(|i| i.extra_urls.iter().map(|u| u.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
            "wheelhouse": index.and_then(|i| i.wheelhouse.as_ref()).map(|w| w.to_string()),
            "find_links": index.map(|i| i.find_links.iter().map(|u| u.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
            "imports": env.imports.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            // The C helper is compiled where the stack's compiler is installed.
            "compile": env.runtime_packages.as_ref().is_none_or(|p| !p.is_empty()),
            "runtime_packages": match &env.runtime_packages {
                Some(p) => p.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                None => vec!["build-essential".into(), format!("python{}-dev", env.python), "libnuma1".into()],
            },
            "sglang": env.sglang.as_ref().map(|s| json!({
                "repo": s.repo.to_string(),
                "revision": s.revision.to_string(),
                "path": generation.checkout,
                "stable_path": s.path.to_string(),
                "source": format!("{}/{}", generation.checkout.as_deref().unwrap_or_default(), s.subdirectory),
                "extras": s.extras.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            })),
        })
    });
    // A model declared `state: absent` is not the roles' to download (engine/desired.rs
    // plans its deletion).
    let models: Vec<Value> = ct
        .models
        .iter()
        .filter(|(_, m)| !m.absent())
        .map(|(name, m)| {
            let parent = m
                .path
                .as_str()
                .rsplit_once('/')
                .map(|(p, _)| if p.is_empty() { "/" } else { p })
                .unwrap_or("/");
            json!({
                "name": name.to_string(),
                "repo": m.repo.to_string(),
                "revision": m.revision.to_string(),
                "include": m.include.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                "exclude": m.exclude.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                "path": m.path.to_string(),
                "parent": parent,
                "endpoint": m.endpoint.as_ref().map_or(crate::hub::DEFAULT_ENDPOINT.to_string(), |e| e.to_string()),
                // File references are made absolute here: the token is read at apply time.
                "token": m.token.as_ref().map(|t| match &t.value {
                    SecretRef::File(p) => json!({"file": resolve_local(p, base_dir).display().to_string()}),
                    other => json!(other),
                }),
            })
        })
        .collect();
    json!({
        "node": {
            "name": node_name.to_string(),
            "pve_node": node.api.node.to_string(),
            "config_root": node.config_root.to_string(),
        },
        "container": {
            "name": ct_name.to_string(),
            "vmid": ct.vmid.value,
            "hostname": ct.hostname.as_ref().map_or(ct_name.to_string(), |h| h.to_string()),
            "address": guest_host(ct),
            "unprivileged": ct.unprivileged.value,
        },
        "cuda": cuda,
        "ml_env": ml_env,
        "gpus": ct.gpus.as_ref().map(|g| {
            let devices: Vec<GpuSelector> = g.devices.iter().map(|d| d.value.clone()).collect();
            let mut v = gpus_context(&devices, g.method.value, gpu_view);
            v["userspace"] = userspace_context(g, node, gpu_view);
            v
        }),
        "models": models,
        "services": services.iter().map(|s| &s.view).collect::<Vec<_>>(),
    })
}

/// The `gpus.userspace` value: the version the container's NVIDIA userspace must be (the
/// node's loaded module when read; offline, the node's `nvidia.driver` pin, else a
/// placeholder) and where it comes from. `null` when the container declares none.
fn userspace_context(g: &Gpus, node: &Node, view: Option<&NodeGpuView>) -> Value {
    let Some(u) = &g.userspace else {
        return Value::Null;
    };
    let version = view
        .and_then(|v| v.driver.clone())
        .or_else(|| node.nvidia.as_ref().map(|n| n.driver.to_string()))
        .unwrap_or_else(|| unknown("the node's NVIDIA kernel module version"));
    json!({
        "version": version,
        "installer": u.installer.as_ref().map(|i| json!({
            "url": i.url.to_string(),
            "sha256": i.sha256.to_string().to_ascii_lowercase(),
            "version": i.version(),
        })),
        "packages": u.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
    })
}

/// The `gpus` value templates see: the selected GPUs' device nodes and the majors, from the
/// node's facts when `view` has them (the lines `lxc-gpu-passthrough.conf.hbs` renders).
pub fn gpus_context(
    devices: &[GpuSelector],
    method: GpuMethod,
    view: Option<&NodeGpuView>,
) -> Value {
    let mut nodes: Vec<String> = devices
        .iter()
        .map(|d| {
            let minor = match d {
                // Offline, an index is taken as its device minor, which holds on nodes
                // where nvidia-smi's PCI order matches the driver's; the node's facts
                // replace it when read.
                GpuSelector::Index(i) => Some(
                    view.and_then(|v| v.minor_by_index.get(i).copied())
                        .unwrap_or(*i),
                ),
                GpuSelector::Uuid(u) => view.and_then(|v| v.minor_by_uuid.get(u).copied()),
            };
            match minor {
                Some(m) => format!("/dev/nvidia{m}"),
                None => format!("/dev/nvidia{}", unknown(&format!("minor of {d}"))),
            }
        })
        .collect();
    for extra in [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ] {
        let present = view
            .is_none_or(|v| v.device_nodes.is_empty() || v.device_nodes.iter().any(|n| n == extra));
        if present {
            nodes.push(extra.to_string());
        }
    }
    let nvidia = view.and_then(|v| v.nvidia_major).unwrap_or(NVIDIA_MAJOR);
    let uvm = view
        .and_then(|v| v.nvidia_uvm_major)
        .map_or_else(|| unknown("nvidia-uvm major"), |m| m.to_string());
    json!({
        "method": match method { GpuMethod::Dev => "dev", GpuMethod::Lxc => "lxc" },
        "count": devices.len(),
        "selected": devices.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "device_nodes": nodes,
        "majors": { "nvidia": nvidia, "nvidia_uvm": uvm },
    })
}
