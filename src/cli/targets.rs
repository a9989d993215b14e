//! What the commands that reach real targets share: choosing targets (`--target`) and
//! connecting to them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use clap::builder::TypedValueParser;

use std::collections::BTreeSet;

use super::guest;
use crate::access::{ApiTarget, SeenContainers, TargetReader, TargetWriter};
use crate::agent::attach::Observer;
use crate::agent::client::{AgentBinary, AgentReader, AgentWriter};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::engine::schedule::{self, Limits};
use crate::inventory::Loaded;
use crate::node::host::{NodeReader, NodeWriter};
use crate::node::target::{self as node_target, ContainerTarget, NodeSteps};
use crate::plan::Action;
use crate::plan::{Target, TargetPlan};
use crate::printer::Printer;
use crate::proxmox::{ApiSettings, NodeApi};
use crate::resources::ResourceSpec;
use crate::resources::container::ContainerSpec;
use crate::resources::container::RestartPolicy;

/// Flags for commands that read or change targets.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Only these targets: `node.NAME` (the node itself: model storage, templates, NVIDIA),
    /// `guest.NAME` (inside the container), `container.NAME` (its Proxmox config), or a
    /// container's NAME for both. Repeatable.
    #[arg(long = "target", value_name = "TARGET")]
    pub targets: Vec<String>,
    /// The SSH known_hosts file (default ~/.ssh/known_hosts).
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Add unknown SSH host keys to known_hosts (a changed key is still refused).
    #[arg(long)]
    pub accept_new_host_keys: bool,
    /// Re-hash every model file on the targets instead of trusting the verification
    /// records' size, mtime and inode (slow for large models; the routine check is
    /// metadata only).
    #[arg(long)]
    pub verify_full: bool,
    /// Trust any TLS certificate of the nodes' APIs instead of the inventory's `tls:`
    /// (warned about on every run).
    #[arg(long)]
    pub insecure: bool,
    /// How many targets are read or changed at once (containers on different nodes,
    /// guests of different containers); 1 works through them one by one.
    #[arg(long, value_name = "N", default_value_t = schedule::DEFAULT_PARALLELISM,
          value_parser = clap::value_parser!(u16).range(1..=256).map(usize::from))]
    pub parallelism: usize,
    /// How many containers of one Proxmox node are read or changed at once (the node
    /// serializes config locks and storage tasks anyway).
    #[arg(long, value_name = "N", default_value_t = schedule::DEFAULT_PER_NODE,
          value_parser = clap::value_parser!(u16).range(1..=64).map(usize::from))]
    pub per_node: usize,
    /// Stop starting targets after the first one fails (those running finish); without
    /// it every target is tried and the summary covers all.
    #[arg(long)]
    pub fail_fast: bool,
    /// Plan moving a container found on another node of its cluster than declared back to
    /// its declared node. Not built yet: refused with a message saying so.
    #[arg(long)]
    pub migrate: bool,
}

impl TargetArgs {
    /// The concurrency these flags ask for.
    pub fn limits(&self) -> Limits {
        Limits {
            parallelism: self.parallelism,
            per_node: self.per_node,
            fail_fast: self.fail_fast,
        }
    }
}

/// The desired targets `--target` selects (all without it); an unknown name is an error.
pub fn select(
    desired: Vec<DesiredTarget>,
    args: &TargetArgs,
) -> anyhow::Result<Vec<DesiredTarget>> {
    if args.targets.is_empty() {
        return Ok(desired);
    }
    for wanted in &args.targets {
        let known = desired.iter().any(|d| {
            let (full, short) = d.target.names();
            *wanted == full || *wanted == short
        });
        if !known {
            let names: Vec<String> = desired.iter().map(|d| d.target.names().0).collect();
            return Err(
                Diagnostic::new(format!("no target `{wanted}` in the inventory"))
                    .hint(format!("targets: {}", names.join(", ")))
                    .into(),
            );
        }
    }
    Ok(desired
        .into_iter()
        .filter(|d| {
            let (full, short) = d.target.names();
            args.targets.iter().any(|w| *w == full || *w == short)
        })
        .collect())
}

/// One node's API connection, once made.
type NodeSlot = Arc<Mutex<Option<Arc<NodeApi>>>>;

/// Connections made during one command: one API connection per node, shared by its
/// containers (so `/version` is read once per node). Shared by the threads that work on
/// several targets at once.
pub struct Connections<'a> {
    loaded: &'a Loaded,
    args: &'a TargetArgs,
    binary: Arc<AgentBinary>,
    printer: &'a Printer,
    nodes: Mutex<HashMap<String, NodeSlot>>,
    /// Each node's containers as its last listing showed them.
    seen: Mutex<HashMap<String, SeenContainers>>,
    /// Containers this apply creates or replaces: their guests are bootstrapped and
    /// their new host keys trusted.
    fresh: Mutex<BTreeSet<u64>>,
}

impl<'a> Connections<'a> {
    /// No connection yet.
    pub fn new(
        loaded: &'a Loaded,
        args: &'a TargetArgs,
        binary: Arc<AgentBinary>,
        printer: &'a Printer,
    ) -> Self {
        Connections {
            loaded,
            args,
            binary,
            printer,
            nodes: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
            fresh: Mutex::new(BTreeSet::new()),
        }
    }

    /// Whether the last listing of `node` showed container `vmid` running.
    pub fn running(&self, node: &str, vmid: u64) -> bool {
        self.seen(node)
            .lock()
            .ok()
            .and_then(|s| s.get(&vmid).copied())
            .unwrap_or(false)
    }

    fn seen(&self, node: &str) -> SeenContainers {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.entry(node.to_string()).or_default().clone()
    }

    /// Read access for `plan` and `check`: the agent for a guest (through the node when
    /// it does not answer SSH yet; the empty world when its container is not there), the
    /// node's API for a container's config.
    pub fn reader(&self, d: &DesiredTarget) -> anyhow::Result<Box<dyn TargetReader>> {
        match &d.target {
            Target::Container { node, .. } => Ok(Box::new(
                ApiTarget::new(
                    self.node(node)?,
                    container_specs(d.resources.iter().map(|r| &r.spec)),
                )
                .recording(self.seen(node))
                .in_cluster(self.in_cluster(node)),
            )),
            Target::Guest { name, .. } => {
                // Only a listing actually read says the container is not there.
                let seen = guest::find(self.loaded, name).and_then(|(n, _, _)| {
                    let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.get(n).cloned()
                });
                let transport = match guest::plan_read(
                    self.loaded,
                    name,
                    seen.as_ref(),
                    self.args,
                    self.printer,
                )? {
                    guest::GuestRead::Empty(r) => return Ok(r),
                    guest::GuestRead::Ssh(t) | guest::GuestRead::Node(t) => t,
                };
                Ok(Box::new(
                    AgentReader::new(transport, self.binary.clone())
                        .verify_full(self.args.verify_full),
                ))
            }
            Target::Node { node, .. } => {
                let api = self.node(node)?;
                let agent = if needs_node_ssh(d.resources.iter().map(|r| &r.spec)) {
                    let ssh = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                    Some(AgentReader::new(ssh, self.binary.clone()))
                } else {
                    None
                };
                Ok(Box::new(NodeReader::new(api, agent)))
            }
        }
    }

    /// Write access for `apply` only. A container's root-only lines go over its node's
    /// SSH; a guest whose container this apply created, or that does not answer SSH, is
    /// bootstrapped through its node first.
    /// An agent's events go to `observe` as they come.
    pub fn writer(
        &self,
        t: &TargetPlan,
        observe: Option<Observer>,
    ) -> anyhow::Result<Box<dyn TargetWriter>> {
        match &t.target {
            Target::Container { node, name, vmid } => {
                let api = ApiTarget::new(
                    self.node(node)?,
                    container_specs(t.changes.iter().map(|c| &c.spec)),
                )
                .in_cluster(self.in_cluster(node));
                if t.changes.iter().any(|c| {
                    matches!(c.spec, ResourceSpec::Container(_))
                        && matches!(c.action, Action::Create | Action::Replace)
                }) {
                    self.fresh
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(*vmid);
                }
                let inv = guest::find(self.loaded, name);
                let restart =
                    inv.is_some_and(|(_, _, ct)| ct.restart.value == RestartPolicy::Allowed);
                let steps = if t
                    .changes
                    .iter()
                    .any(|c| matches!(c.spec, ResourceSpec::PveLines(_)))
                {
                    let (_, n, _) = inv.ok_or_else(|| {
                        Diagnostic::new(format!("no container `{name}` in the inventory"))
                    })?;
                    let session = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                    let gpus = t.changes.iter().any(|c| matches!(&c.spec, ResourceSpec::PveLines(l) if l.label == crate::node::gpu::LABEL));
                    let gpus = if gpus {
                        let root = std::env::var(crate::node::gpu::ROOT_ENV).unwrap_or_default();
                        Some(crate::node::gpu::read(session.as_ref(), &root)?)
                    } else {
                        None
                    };
                    Some(NodeSteps {
                        node: session,
                        gpus,
                        config_root: n.config_root.to_string(),
                        lock_dir: node_target::lock_dir(),
                        pve_node: n.api.node.to_string(),
                    })
                } else {
                    None
                };
                Ok(Box::new(ContainerTarget::new(api, steps, restart)))
            }
            Target::Guest { name, .. } => {
                let fresh = guest::find(self.loaded, name).is_some_and(|(_, _, ct)| {
                    self.fresh
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(&ct.vmid.value)
                });
                let transport =
                    guest::apply_connect(self.loaded, name, fresh, self.args, self.printer)?;
                let writer = AgentWriter::new(transport, self.binary.clone())
                    .verify_full(self.args.verify_full);
                let writer = match &observe {
                    Some(o) => writer.observe(o.clone()),
                    None => writer,
                };
                let ops = t.changes.iter().any(
                    |c| matches!(&c.spec, ResourceSpec::GpuUserspace(u) if u.installer.is_some()),
                );
                let Some((node, _, ct)) = guest::find(self.loaded, name).filter(|_| ops) else {
                    return Ok(Box::new(writer));
                };
                // The node fetches the userspace `.run` and pushes it in (its own agent).
                let session = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                let agent = AgentWriter::new(session.clone(), self.binary.clone());
                let agent = match observe {
                    Some(o) => agent.observe(o),
                    None => agent,
                };
                let side = crate::node::installer::NodeSide {
                    agent: Box::new(agent),
                    node: session,
                    vmid: ct.vmid.value as u32,
                };
                Ok(Box::new(crate::node::installer::GuestWithNode::new(
                    Box::new(writer),
                    Some(side),
                )))
            }
            Target::Node { node, .. } => {
                let api = self.node(node)?;
                let agent = if needs_node_ssh(t.changes.iter().map(|c| &c.spec)) {
                    let ssh = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                    let writer = AgentWriter::new(ssh, self.binary.clone());
                    Some(match observe {
                        Some(o) => writer.observe(o),
                        None => writer,
                    })
                } else {
                    None
                };
                Ok(Box::new(NodeWriter::new(api, agent)))
            }
        }
    }

    /// Whether the inventory puts node `node` in a cluster.
    fn in_cluster(&self, node: &str) -> bool {
        self.loaded
            .inventory
            .nodes
            .iter()
            .any(|(n, inv)| n.as_str() == node && inv.cluster.is_some())
    }

    /// The API connection to the node named `node` in the inventory.
    pub fn node(&self, node: &str) -> anyhow::Result<Arc<NodeApi>> {
        let slot = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            nodes.entry(node.to_string()).or_default().clone()
        };
        // The node's own slot is held while connecting, so two targets of one node share
        // one login while other nodes connect at the same time.
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(api) = slot.as_ref() {
            return Ok(api.clone());
        }
        let inv = self
            .loaded
            .inventory
            .nodes
            .iter()
            .find(|(n, _)| n.as_str() == node)
            .map(|(_, n)| n)
            .ok_or_else(|| Diagnostic::new(format!("no node `{node}` in the inventory")))?;
        let settings =
            ApiSettings::from_inventory(node, &inv.api, &self.loaded.base_dir, self.args.insecure)?;
        let api = Arc::new(NodeApi::connect(&settings)?);
        *slot = Some(api.clone());
        Ok(api)
    }

    /// Warns, on every run that reads targets, when certificates are not verified.
    pub fn warn_insecure(&self) {
        if self.args.insecure {
            self.printer.warn(
                "--insecure: the nodes' TLS certificates are NOT verified; anyone on the path can read the API credentials and change the node",
            );
        }
    }

    /// Says how many API calls each node took (`-v`).
    pub fn report_calls(&self) {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        for (node, slot) in nodes.iter() {
            if let Some(api) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                self.printer
                    .verbose(&format!("node {node}: {} API call(s)", api.calls()));
            }
        }
    }
}

/// Whether a node target's resources need the agent over the node's SSH (templates go
/// through the API alone).
fn needs_node_ssh<'s>(mut specs: impl Iterator<Item = &'s ResourceSpec>) -> bool {
    specs.any(|s| !matches!(s, ResourceSpec::Template(_)))
}

/// The container specs among `specs`.
fn container_specs<'s>(specs: impl Iterator<Item = &'s ResourceSpec>) -> Vec<ContainerSpec> {
    specs
        .filter_map(|s| match s {
            ResourceSpec::Container(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}
