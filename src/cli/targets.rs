//! What the commands that reach real targets share: choosing targets (`--target`) and
//! connecting to them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use clap::builder::TypedValueParser;

use std::collections::BTreeSet;

use super::guest;
use super::session::NodeSlots;
use crate::access::{ApiTarget, TargetWriter};
use crate::agent::attach::Observer;
use crate::agent::client::{AgentBinary, AgentWriter};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::engine::schedule::{self, Limits};
use crate::inventory::Loaded;
use crate::node::access::NodeWriter;
use crate::node::target::{self as node_target, ContainerTarget, NodeSteps};
use crate::plan::Action;
use crate::plan::{Target, TargetPlan};
use crate::printer::Printer;
use crate::proxmox::NodeApi;
use crate::resources::ResourceSpec;
use crate::resources::container::ContainerSpec;
use crate::resources::container::RestartPolicy;
use crate::transport::Transport;

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
    /// Delete the model folders provision downloaded that the inventory no longer declares
    /// (without it they are only named, with their size: data is never deleted by omission).
    #[arg(long)]
    pub prune_models: bool,
    /// Stop and destroy the containers provision created that the inventory no longer
    /// declares (without it they are named; apply refuses while one runs). Bind-mounted
    /// host paths are kept; a container provision did not create is never touched.
    #[arg(long)]
    pub allow_destroy: bool,
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

/// The inventory file as containers' markers name it: its absolute path (a container
/// another inventory created on the same node is not this one's to name or destroy).
pub fn owner(loaded: &Loaded) -> String {
    std::fs::canonicalize(&loaded.path)
        .unwrap_or_else(|_| loaded.path.clone())
        .display()
        .to_string()
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

/// `apply`'s connections: one API connection per node that can write, shared by its
/// containers (so `/version` is read once per node), and the writers built on them.
/// `plan` and `check` have a [`ReadSession`](super::session::ReadSession) instead.
pub struct Connections<'a> {
    loaded: &'a Loaded,
    args: &'a TargetArgs,
    binary: Arc<AgentBinary>,
    printer: &'a Printer,
    nodes: NodeSlots<NodeApi>,
    /// Containers this apply creates or replaces: their guests are bootstrapped and
    /// their new host keys trusted.
    created: Mutex<BTreeSet<u64>>,
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
            nodes: NodeSlots::default(),
            created: Mutex::new(BTreeSet::new()),
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
                .in_cluster(in_cluster(self.loaded, node))
                .owned_by(owner(self.loaded));
                if t.changes.iter().any(|c| {
                    matches!(c.spec, ResourceSpec::Container(_))
                        && matches!(c.action, Action::Create | Action::Replace)
                }) {
                    self.created
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
                let created = guest::find(self.loaded, name).is_some_and(|(_, _, ct)| {
                    self.created
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(&ct.vmid.value)
                });
                let transport =
                    guest::apply_connect(self.loaded, name, created, self.args, self.printer)?;
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
                let ssh = node_ssh(
                    self.loaded,
                    node,
                    self.args,
                    t.changes.iter().map(|c| &c.spec),
                )?;
                let agent = ssh.map(|ssh| {
                    let writer = AgentWriter::new(ssh, self.binary.clone());
                    match observe {
                        Some(o) => writer.observe(o),
                        None => writer,
                    }
                });
                Ok(Box::new(NodeWriter::new(api, agent)))
            }
        }
    }

    /// The API connection to the node named `node` in the inventory.
    pub fn node(&self, node: &str) -> anyhow::Result<Arc<NodeApi>> {
        self.nodes
            .get(self.loaded, self.args, node, |s| Ok(NodeApi::connect(s)?))
    }
}

/// Whether the inventory puts node `node` in a cluster.
pub(super) fn in_cluster(loaded: &Loaded, node: &str) -> bool {
    loaded
        .inventory
        .nodes
        .iter()
        .any(|(n, inv)| n.as_str() == node && inv.cluster.is_some())
}

/// The node's SSH when a node target's resources need the agent there (templates go
/// through the API alone).
pub(super) fn node_ssh<'s>(
    loaded: &Loaded,
    node: &str,
    args: &TargetArgs,
    mut specs: impl Iterator<Item = &'s ResourceSpec>,
) -> anyhow::Result<Option<Arc<dyn Transport>>> {
    if !specs.any(|s| !matches!(s, ResourceSpec::Template(_))) {
        return Ok(None);
    }
    Ok(Some(crate::cli::ssh::node_transport(loaded, node, args)?))
}

/// The container specs among `specs`.
pub(super) fn container_specs<'s>(
    specs: impl Iterator<Item = &'s ResourceSpec>,
) -> Vec<ContainerSpec> {
    specs
        .filter_map(|s| match s {
            ResourceSpec::Container(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}
