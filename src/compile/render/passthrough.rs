//! The container config lines that pass selected GPUs through, from the node's live facts.
//!
//! The lines themselves come from one place, the `lxc-gpu-passthrough.conf.hbs` template
//! (the `gpu-passthrough` role renders the same one): this module turns [`NodeFacts`] into
//! the [`NodeGpuView`] that template's context is built from, and refuses what the template
//! would otherwise fill with a placeholder or a stale number (a GPU the node lacks, a major
//! missing from `/proc/devices`, a device node whose major no longer matches it).

use std::collections::BTreeMap;

use thiserror::Error;

use super::Renderer;
use super::context::{NodeGpuView, gpus_context};
use crate::gpu::facts::NodeFacts;
use crate::inventory::container::{GpuMethod, GpuSelector};

/// The template that writes the passthrough lines.
pub const TEMPLATE: &str = "lxc-gpu-passthrough.conf.hbs";

/// Why passthrough lines cannot be written from the node's facts.
#[derive(Debug, Error)]
pub enum PassthroughError {
    /// No GPU was selected.
    #[error("no GPU is selected")]
    NoneSelected,
    /// The node has no such GPU.
    #[error("the node has no GPU {selector} (it has {available})")]
    NoSuchGpu {
        /// The selector as written.
        selector: String,
        /// The node's GPUs, `index UUID` each, or `none`.
        available: String,
    },
    /// Two selectors name the same GPU.
    #[error("GPU {uuid} is selected twice ({first} and {second})")]
    Duplicate {
        /// The GPU.
        uuid: String,
        /// The first selector naming it.
        first: String,
        /// The second.
        second: String,
    },
    /// The GPU's device node is unknown or absent.
    #[error("GPU {selector} has no device node on the node{}", path.as_deref().map(|p| format!(" ({p} is missing)")).unwrap_or_default())]
    NoDeviceNode {
        /// The selector as written.
        selector: String,
        /// Its expected node, when its minor is known.
        path: Option<String>,
    },
    /// A driver the lines need is absent from `/proc/devices`.
    #[error("`{name}` is not in the node's /proc/devices")]
    NoMajor {
        /// The driver's name there.
        name: &'static str,
    },
    /// A device node was made under another major than its driver now has.
    #[error("{path} has major {found}, but /proc/devices gives `{driver}` major {live}")]
    StaleNode {
        /// The node.
        path: String,
        /// Its major.
        found: u32,
        /// The driver.
        driver: &'static str,
        /// The driver's major now.
        live: u32,
    },
    /// The template failed.
    #[error("{0}")]
    Render(String),
}

impl PassthroughError {
    /// What to do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            PassthroughError::NoneSelected => "name at least one GPU by index or UUID",
            PassthroughError::NoSuchGpu { .. } => {
                "select GPUs by the index or UUID that `provision gpu facts` (or `nvidia-smi -L`) prints on the node"
            }
            PassthroughError::Duplicate { .. } => "name each GPU once",
            PassthroughError::NoDeviceNode { .. } => {
                "run `nvidia-smi` once on the node (it creates the nodes), or enable nvidia-persistenced; check that the nvidia module, not vfio-pci, owns the GPU (`lspci -k`)"
            }
            PassthroughError::NoMajor { .. } => {
                "load the module (`modprobe nvidia-uvm`) and list it in /etc/modules-load.d/ so it loads at boot"
            }
            PassthroughError::StaleNode { .. } => {
                "the driver was reloaded under a new major: remove the node and recreate it (`nvidia-modprobe -u -c=0`), or reboot the node"
            }
            PassthroughError::Render(_) => "check the user template that replaces the built-in one",
        }
    }
}

/// What the template context needs from the node's facts.
pub fn node_gpu_view(facts: &NodeFacts) -> NodeGpuView {
    let mut minor_by_uuid = BTreeMap::new();
    let mut minor_by_index = BTreeMap::new();
    for g in &facts.gpus {
        if let Some(m) = g.minor {
            minor_by_uuid.insert(g.info.uuid.clone(), m);
            minor_by_index.insert(g.info.index, m);
        }
    }
    NodeGpuView {
        nvidia_major: facts.major("nvidia"),
        nvidia_uvm_major: facts.major("nvidia-uvm"),
        minor_by_uuid,
        minor_by_index,
        device_nodes: facts.device_nodes.iter().map(|n| n.path.clone()).collect(),
        driver: facts.driver.as_ref().map(|d| d.version.clone()),
    }
}

/// The config lines (Proxmox `lxc/<vmid>.conf` syntax) that pass `selected` through with
/// `method`, from the node's facts; every number in them was read on the node.
pub fn passthrough_lines(
    facts: &NodeFacts,
    selected: &[GpuSelector],
    method: GpuMethod,
    renderer: &Renderer,
) -> Result<String, PassthroughError> {
    if selected.is_empty() {
        return Err(PassthroughError::NoneSelected);
    }
    // UUIDs are matched case-insensitively but written as the node spells them.
    let mut resolved: Vec<GpuSelector> = Vec::new();
    let mut seen: BTreeMap<&str, &GpuSelector> = BTreeMap::new();
    for sel in selected {
        let gpu = facts.gpu(sel).ok_or_else(|| PassthroughError::NoSuchGpu {
            selector: sel.to_string(),
            available: available(facts),
        })?;
        if let Some(first) = seen.insert(&gpu.info.uuid, sel) {
            return Err(PassthroughError::Duplicate {
                uuid: gpu.info.uuid.clone(),
                first: first.to_string(),
                second: sel.to_string(),
            });
        }
        let path = gpu.device_path();
        if path.as_deref().and_then(|p| facts.node(p)).is_none() {
            return Err(PassthroughError::NoDeviceNode {
                selector: sel.to_string(),
                path,
            });
        }
        resolved.push(match sel {
            GpuSelector::Index(i) => GpuSelector::Index(*i),
            GpuSelector::Uuid(_) => GpuSelector::Uuid(gpu.info.uuid.clone()),
        });
    }
    let view = node_gpu_view(facts);
    let nvidia = view
        .nvidia_major
        .ok_or(PassthroughError::NoMajor { name: "nvidia" })?;
    let uvm = view
        .nvidia_uvm_major
        .ok_or(PassthroughError::NoMajor { name: "nvidia-uvm" })?;
    let gpus = gpus_context(&resolved, method, Some(&view));
    for path in gpus["device_nodes"].as_array().into_iter().flatten() {
        let Some(node) = path.as_str().and_then(|p| facts.node(p)) else {
            continue;
        };
        let (driver, live) = if node.path.starts_with("/dev/nvidia-uvm") {
            ("nvidia-uvm", uvm)
        } else {
            ("nvidia", nvidia)
        };
        if node.major != live {
            return Err(PassthroughError::StaleNode {
                path: node.path.clone(),
                found: node.major,
                driver,
                live,
            });
        }
    }
    renderer
        .render(TEMPLATE, &serde_json::json!({ "gpus": gpus }))
        .map_err(|d| PassthroughError::Render(d.to_string()))
}

fn available(facts: &NodeFacts) -> String {
    if facts.gpus.is_empty() {
        return "none".into();
    }
    facts
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.info.index, g.info.uuid))
        .collect::<Vec<_>>()
        .join(", ")
}
