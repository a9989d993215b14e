//! A container target whose apply needs both the node's API and, for root-only lines, the
//! node's SSH as root: API operations go to the API, [`NodeOp`]s over node SSH.

use std::sync::Arc;
use std::time::Instant;

use super::NodeError;
use super::config_edit::{self, ConfigFile};
use super::gpu::NodeGpus;
use super::gpu_check;
use crate::access::{
    AccessError, ApiOp, ApiTarget, NodeOp, Op, OpOutcome, TargetReader, TargetWriter,
};
use crate::resources::op::Deadline;
use crate::resources::pve_lines::{self, PveLinesSpec, place_devs};
use crate::resources::wire::{Facts, Probe};
use crate::transport::Transport;

/// How often a node edit is made anew when the config changed under it.
const REPLAN_ATTEMPTS: u32 = 3;

/// The environment variable naming the node's config lock directory, for a node whose
/// locks are not where Proxmox keeps them (a lab beside the default one:
/// `$LAB_LOCK_DIR`); unset on real nodes ([`config_edit::PVE_LOCK_DIR`]).
pub const LOCK_DIR_ENV: &str = "PROVISION_NODE_LOCK_DIR";

/// The node's config lock directory: [`LOCK_DIR_ENV`] or Proxmox's.
pub fn lock_dir() -> String {
    std::env::var(LOCK_DIR_ENV)
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| config_edit::PVE_LOCK_DIR.to_string())
}

/// Where root-only steps run: the node's SSH as root and where it keeps configs.
pub struct NodeSteps {
    /// SSH to the node as root.
    pub node: Arc<dyn Transport>,
    /// The node's cluster config root (`/etc/pve`).
    pub config_root: String,
    /// The config lock directory (`/run/lock/lxc`).
    pub lock_dir: String,
    /// The node's name in Proxmox (its directory under `nodes/`).
    pub pve_node: String,
    /// The node's GPUs, for the checks inside a container after its passthrough lines
    /// took effect.
    pub gpus: Option<NodeGpus>,
}

impl NodeSteps {
    /// Runs one node step; the outcome says what was done.
    fn run(&self, op: &NodeOp) -> Result<OpOutcome, AccessError> {
        let started = Instant::now();
        let deadline = Deadline::after(op.limit().duration());
        let NodeOp::Lines { address, spec } = op else {
            return Err(AccessError::Unsupported {
                target: "a container's config".into(),
                what: Op::Node(op.clone()).describe(),
            });
        };
        let file = ConfigFile::new(&self.config_root, &self.pve_node, &self.lock_dir, spec.vmid);
        let wanted = spec.pairs();
        // The edit is made from what is read just before it; a config changed between
        // that read and the guarded write is read again and the edit made anew.
        let mut attempt = 0;
        let edit = loop {
            attempt += 1;
            let before = config_edit::read(self.node.as_ref(), &file, deadline)
                .map_err(|e| node_err(address, e))?;
            let owns = |k: &str, v: &str| spec.owns(k, v);
            let mut edit = config_edit::ConfigEdit::toward(&wanted, &before.pairs(), &owns);
            edit.description = record(&before, spec, &place_devs(&wanted, &before.pairs(), &owns))
                .map_err(|e| node_err(address, e))?;
            if edit.is_empty() {
                break edit;
            }
            match config_edit::apply(self.node.as_ref(), &file, &edit, deadline) {
                Ok(_) => break edit,
                Err(NodeError::Conflict { .. }) if attempt < REPLAN_ATTEMPTS => continue,
                Err(e) => return Err(node_err(address, e)),
            }
        };
        let mut done = Vec::new();
        let pct: Vec<String> = edit
            .set
            .iter()
            .map(|(k, _)| k.clone())
            .chain(edit.delete.iter().map(|k| format!("delete {k}")))
            .collect();
        if !pct.is_empty() {
            done.push(format!("pct set {} ({})", spec.vmid, pct.join(", ")));
        }
        let lines = edit.add_lxc.len() + edit.remove_lxc.len();
        if lines > 0 {
            done.push(format!(
                "locked edit of {}: {} line(s) added, {} removed",
                file.path,
                edit.add_lxc.len(),
                edit.remove_lxc.len()
            ));
        }
        if edit.description.is_some() {
            done.push(format!(
                "the lines of `{}` recorded in its description",
                spec.label
            ));
        }
        if done.is_empty() {
            done.push("already as wanted".into());
        }
        Ok(OpOutcome {
            description: format!("{address} over node SSH: {}, read back", done.join("; ")),
            error: None,
            hints: Vec::new(),
            detail: None,
            millis: started.elapsed().as_millis() as u64,
        })
    }
}

impl NodeSteps {
    /// After the container (re)started with its passthrough lines: the GPU checks inside
    /// it. A container that does not see its GPUs is an error, unless it kept running
    /// (`restart: never`), when the outcome says the lines wait for its next start.
    fn gpu_check(
        &self,
        spec: &PveLinesSpec,
        restarted: bool,
    ) -> Result<Option<OpOutcome>, AccessError> {
        let Some(gpus) = &self.gpus else {
            return Ok(None);
        };
        let started = Instant::now();
        let address = format!("CT {} GPUs", spec.vmid);
        let want = gpu_check::expected(gpus, spec);
        let view = gpu_check::check(self.node.clone(), spec.vmid, gpus, &want)
            .map_err(|e| node_err(&address, e))?;
        if !view.drift.is_empty() && restarted {
            return Err(node_err(
                &address,
                NodeError::NotVerified {
                    what: "GPU passthrough".into(),
                    target: format!("CT {}", spec.vmid),
                    detail: view.drift.join("; "),
                },
            ));
        }
        let description = if view.drift.is_empty() {
            format!("GPU checks in CT {}: {}", spec.vmid, view.summary)
        } else {
            format!(
                "GPU checks in CT {}: not yet as declared ({}); the lines take effect at its next start",
                spec.vmid,
                view.drift.join("; ")
            )
        };
        Ok(Some(OpOutcome {
            description,
            error: None,
            hints: Vec::new(),
            detail: None,
            millis: started.elapsed().as_millis() as u64,
        }))
    }
}

/// The description recording `placed` (the lines as written, `devN` keys where they were
/// placed) for `spec`'s label, when it is not what `before` has; `None` for a container's
/// own root-only options (the container's spec decides about those) and when the record
/// is already as it will be. Refused beyond Proxmox's limit on a description.
fn record(
    before: &config_edit::RawConfig,
    spec: &PveLinesSpec,
    placed: &[(String, String)],
) -> Result<Option<String>, NodeError> {
    if spec.label == crate::resources::container::ROOT_ONLY_LABEL {
        return Ok(None);
    }
    let now = before.conf.get("description");
    let new = pve_lines::with_record(now, &spec.label, placed);
    if new == now.unwrap_or_default() {
        return Ok(None);
    }
    if new.len() > pve_lines::MAX_DESCRIPTION {
        return Err(NodeError::BadConfig {
            path: format!("CT {}", spec.vmid),
            detail: format!(
                "the description with the record of the `{}` lines would be {} bytes, over Proxmox's limit of {}; shorten the container's description",
                spec.label,
                new.len(),
                pve_lines::MAX_DESCRIPTION
            ),
        });
    }
    Ok(Some(new))
}

fn node_err(address: &str, e: super::NodeError) -> AccessError {
    AccessError::Node {
        address: address.to_string(),
        source: Box::new(e),
    }
}

/// A container's config: read through the API, changed through the API and, for
/// root-only lines, over node SSH.
pub struct ContainerTarget {
    api: ApiTarget,
    node: Option<NodeSteps>,
    restart_allowed: bool,
}

impl ContainerTarget {
    /// `api` for reads and API operations; `node` for node steps (none: they are refused);
    /// `restart_allowed`: the inventory's `restart: allowed`, so a running container is
    /// rebooted for new root-only lines to take effect.
    pub fn new(api: ApiTarget, node: Option<NodeSteps>, restart_allowed: bool) -> Self {
        ContainerTarget {
            api,
            node,
            restart_allowed,
        }
    }
}

impl TargetReader for ContainerTarget {
    fn describe(&self) -> String {
        self.api.describe()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        self.api.read(probes)
    }
}

impl TargetWriter for ContainerTarget {
    /// In order: API operations through the API, node steps over node SSH; the first
    /// failure stops it.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let mut results = Vec::new();
        let mut lines = None;
        for op in ops {
            match op {
                Op::Node(n) => {
                    let Some(node) = &self.node else {
                        return Err(AccessError::Unsupported {
                            target: "this container (no node SSH)".into(),
                            what: op.describe(),
                        });
                    };
                    results.push(node.run(n)?);
                    // The GPU checks after the start are for passthrough lines only.
                    if let NodeOp::Lines { spec, .. } = n
                        && spec.passthrough()
                    {
                        lines = Some(spec);
                    }
                }
                Op::Api(ApiOp::Start { vmid, reboot }) => {
                    let op = Op::Api(ApiOp::Start {
                        vmid: *vmid,
                        reboot: *reboot && self.restart_allowed,
                    });
                    let start = self.api.run(std::slice::from_ref(&op))?;
                    // Started or rebooted: the lines are in effect now (else it kept
                    // running and says so).
                    let restarted = !start
                        .iter()
                        .any(|o| o.description.contains("keeps running"));
                    results.extend(start);
                    if let (Some(node), Some(spec)) = (&self.node, lines) {
                        results.extend(node.gpu_check(spec, restarted)?);
                    }
                }
                _ => results.extend(self.api.run(std::slice::from_ref(op))?),
            }
        }
        Ok(results)
    }
}
