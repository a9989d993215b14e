//! Node facts: the loaded driver, the GPUs with their UUIDs and device nodes, and the device
//! majors that LXC passthrough needs. Read in one round trip over any transport.

use std::time::Duration;

use serde::Serialize;

use super::parse::{
    self, DeviceMajor, DeviceNode, GpuInfo, KernelModule, QUERY_GPU_FIELDS, STAT_FORMAT, SmiFailure,
};
use super::probe::{CommandBatch, Section, Sections, parse_sections};
use crate::inventory::container::GpuSelector;
use crate::transport::{Transport, TransportError, shell_quote};

/// How long reading the facts may take: nvidia-smi can need seconds to wake idle GPUs.
pub const FACTS_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the facts are read from. `root` is prepended to `/proc` and `/dev` paths, so tests
/// can point at a copy; it is empty on real machines.
#[derive(Debug, Clone, Default)]
pub struct FactSources {
    /// A prefix for `/proc/…` and `/dev/…` (no trailing slash); empty for the real ones.
    pub root: String,
}

/// One GPU of the node with the device node it is reached through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeGpu {
    /// What nvidia-smi says about it.
    #[serde(flatten)]
    pub info: GpuInfo,
    /// The minor of its `/dev/nvidiaN` node (from `/proc/driver/nvidia/gpus`); it need not
    /// equal the index.
    pub minor: Option<u32>,
}

impl NodeGpu {
    /// Its device node, `/dev/nvidia<minor>`.
    pub fn device_path(&self) -> Option<String> {
        self.minor.map(|m| format!("/dev/nvidia{m}"))
    }
}

/// Something about the node's NVIDIA setup that stops GPU passthrough, with what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub hint: String,
}

/// What the node's NVIDIA setup looks like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    /// The loaded kernel module; `None` when none is loaded.
    pub driver: Option<KernelModule>,
    /// The GPUs, in nvidia-smi order.
    pub gpus: Vec<NodeGpu>,
    /// NVIDIA character device majors from `/proc/devices`.
    pub majors: Vec<DeviceMajor>,
    /// `/dev/nvidia*` and `/dev/nvidia-caps/*` nodes.
    pub device_nodes: Vec<DeviceNode>,
    /// Why passthrough cannot work yet; empty when it can.
    pub problems: Vec<Problem>,
}

impl NodeFacts {
    /// The major of a driver in `/proc/devices` (`nvidia-uvm`, `nvidia-caps`, …).
    pub fn major(&self, name: &str) -> Option<u32> {
        self.majors.iter().find(|m| m.name == name).map(|m| m.major)
    }

    /// The GPU an inventory selector names (by nvidia-smi index or by UUID).
    pub fn gpu(&self, selector: &GpuSelector) -> Option<&NodeGpu> {
        self.gpus.iter().find(|g| match selector {
            GpuSelector::Index(i) => g.info.index == *i,
            GpuSelector::Uuid(u) => g.info.uuid.eq_ignore_ascii_case(u),
        })
    }

    /// The device node at `path`, if present.
    pub fn node(&self, path: &str) -> Option<&DeviceNode> {
        self.device_nodes.iter().find(|n| n.path == path)
    }
}

/// The probe that reads node facts.
pub fn node_probe(sources: &FactSources) -> CommandBatch {
    let root = shell_quote(&sources.root);
    let root = if sources.root.is_empty() { "" } else { &root };
    CommandBatch::new()
        .section("proc-version", &format!("cat {root}/proc/driver/nvidia/version"))
        .section(
            "query-gpu",
            &format!("nvidia-smi --query-gpu={QUERY_GPU_FIELDS} --format=csv,noheader"),
        )
        .section(
            "proc-gpus",
            &format!(
                "for f in {root}/proc/driver/nvidia/gpus/*/information; do [ -r \"$f\" ] && cat \"$f\"; done; true"
            ),
        )
        .section("proc-devices", &format!("cat {root}/proc/devices"))
        .section(
            "dev-nodes",
            &format!(
                "stat -c '{STAT_FORMAT}' {root}/dev/nvidia* {root}/dev/nvidia-caps/* 2>/dev/null; true"
            ),
        )
}

/// Reads the node's facts through `transport` in one round trip.
pub fn gather_node_facts(
    transport: &dyn Transport,
    sources: &FactSources,
) -> Result<NodeFacts, TransportError> {
    Ok(gather_node_facts_raw(transport, sources)?.0)
}

/// Like [`gather_node_facts`], also returning the probe's raw output (for captures).
pub fn gather_node_facts_raw(
    transport: &dyn Transport,
    sources: &FactSources,
) -> Result<(NodeFacts, String), TransportError> {
    let raw = node_probe(sources).run_raw(transport, FACTS_TIMEOUT)?;
    let facts = node_facts_from_sections(&parse_sections(&raw), &sources.root);
    Ok((facts, raw))
}

fn missing() -> Section {
    Section {
        output: "the probe was cut short before this command".into(),
        status: -1,
    }
}

/// Builds node facts from a probe's sections (pure: what the tests feed real outputs to).
pub fn node_facts_from_sections(sections: &Sections, root: &str) -> NodeFacts {
    let get = |name: &str| sections.get(name).cloned().unwrap_or_else(missing);
    let mut problems = Vec::new();

    let proc_version = get("proc-version");
    let driver = if proc_version.ok() {
        match parse::parse_proc_version(&proc_version.output) {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(Problem {
                    message: e.to_string(),
                    hint: "report this output; the driver may be too new or too old for provision"
                        .into(),
                });
                None
            }
        }
    } else {
        problems.push(Problem {
            message: format!(
                "no NVIDIA kernel module is loaded ({})",
                parse::excerpt(&proc_version.output)
            ),
            hint: "install the NVIDIA driver on the node and load it (`modprobe nvidia`), or reboot after installing it".into(),
        });
        None
    };

    let query = get("query-gpu");
    let mut gpus: Vec<NodeGpu> = Vec::new();
    if query.not_found() {
        problems.push(Problem {
            message: "nvidia-smi is not installed on the node".into(),
            hint: "install the NVIDIA driver's userspace tools on the node (they come with the driver)".into(),
        });
    } else if !query.ok() {
        problems.push(smi_problem(
            &parse::classify_smi_failure(&query.output),
            driver.as_ref(),
        ));
    } else {
        match parse::parse_query_gpu(&query.output) {
            Ok(list) => {
                gpus = list
                    .into_iter()
                    .map(|info| NodeGpu { info, minor: None })
                    .collect()
            }
            Err(e) => problems.push(Problem {
                message: e.to_string(),
                hint: "run the same nvidia-smi command by hand to see what it prints".into(),
            }),
        }
    }

    match parse::parse_proc_gpus(&get("proc-gpus").output) {
        Ok(proc_gpus) => {
            for gpu in &mut gpus {
                gpu.minor = proc_gpus
                    .iter()
                    .find(|p| p.uuid.eq_ignore_ascii_case(&gpu.info.uuid))
                    .map(|p| p.minor);
            }
        }
        Err(e) => problems.push(Problem {
            message: e.to_string(),
            hint: "report this output".into(),
        }),
    }

    let majors = parse::parse_proc_devices(&get("proc-devices").output).unwrap_or_else(|e| {
        problems.push(Problem {
            message: e.to_string(),
            hint: "report this output".into(),
        });
        Vec::new()
    });
    let mut device_nodes = parse::parse_dev_nodes(&get("dev-nodes").output).unwrap_or_else(|e| {
        problems.push(Problem {
            message: e.to_string(),
            hint: "report this output".into(),
        });
        Vec::new()
    });
    for node in &mut device_nodes {
        if let Some(rest) = node.path.strip_prefix(root)
            && !root.is_empty()
        {
            node.path = rest.to_string();
        }
    }

    let mut facts = NodeFacts {
        driver,
        gpus,
        majors,
        device_nodes,
        problems,
    };
    let more = passthrough_problems(&facts);
    facts.problems.extend(more);
    facts
}

/// What is missing for passthrough once the driver answers: device nodes and majors.
fn passthrough_problems(facts: &NodeFacts) -> Vec<Problem> {
    let mut out = Vec::new();
    if facts.gpus.is_empty() {
        return out;
    }
    for gpu in &facts.gpus {
        match gpu.device_path() {
            None => out.push(Problem {
                message: format!(
                    "GPU {} ({}) has no entry under /proc/driver/nvidia/gpus, so its device node is unknown",
                    gpu.info.index, gpu.info.uuid
                ),
                hint: "check that the nvidia kernel module, not vfio-pci, owns this GPU (`lspci -k`)".into(),
            }),
            Some(path) if facts.node(&path).is_none() => out.push(Problem {
                message: format!("GPU {} ({}) has no device node {path}", gpu.info.index, gpu.info.uuid),
                hint: "run `nvidia-smi` once on the node (it creates the nodes), or enable nvidia-persistenced".into(),
            }),
            Some(_) => {}
        }
    }
    for path in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        if facts.node(path).is_none() {
            out.push(Problem {
                message: format!("{path} does not exist on the node"),
                hint: "run `nvidia-modprobe -u -c=0` on the node (and at boot, e.g. from a systemd unit) so the UVM and control nodes exist before containers start".into(),
            });
        }
    }
    if facts.major("nvidia-uvm").is_none() {
        out.push(Problem {
            message: "the nvidia-uvm module is not loaded (no `nvidia-uvm` in /proc/devices)".into(),
            hint: "load it with `modprobe nvidia-uvm` and list it in /etc/modules-load.d/ so it loads at boot".into(),
        });
    }
    out
}

/// A node-side nvidia-smi failure as a problem with its remedy.
fn smi_problem(failure: &SmiFailure, driver: Option<&KernelModule>) -> Problem {
    let module = driver.map_or("unknown".to_string(), |d| d.version.clone());
    match failure {
        SmiFailure::VersionMismatch { nvml_library } => Problem {
            message: format!(
                "the node's userspace driver (NVML {}) is not its loaded kernel module's version ({module})",
                nvml_library.as_deref().unwrap_or("of another version")
            ),
            hint: "the driver was upgraded without a reboot: reboot the node so the new kernel module loads (or unload and reload the nvidia modules)".into(),
        },
        SmiFailure::NoDriver => Problem {
            message: "nvidia-smi cannot talk to the NVIDIA kernel module".into(),
            hint: "load the driver (`modprobe nvidia`); if it fails, see `dmesg` (Secure Boot, a missing DKMS build for this kernel)".into(),
        },
        SmiFailure::NoDevices => Problem {
            message: "nvidia-smi found no GPUs".into(),
            hint: "check `lspci -k`: the GPUs may be bound to vfio-pci or another driver".into(),
        },
        SmiFailure::NvmlInit { reason } => Problem {
            message: format!("nvidia-smi failed to initialize NVML: {reason}"),
            hint: "check `dmesg` for NVRM errors and that the nvidia modules are loaded".into(),
        },
        SmiFailure::Other { message } => Problem {
            message: format!("nvidia-smi failed: {message}"),
            hint: "run `nvidia-smi` by hand on the node to see the whole message".into(),
        },
    }
}
