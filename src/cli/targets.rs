//! What the commands that reach real targets share: choosing targets (`--target`) and
//! connecting to them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::access::{ApiTarget, TargetReader, TargetWriter};
use crate::agent::client::{AgentBinary, AgentReader, AgentWriter};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::inventory::Loaded;
use crate::node::host::{NodeReader, NodeWriter};
use crate::plan::{Target, TargetPlan};
use crate::printer::Printer;
use crate::proxmox::{ApiSettings, NodeApi};
use crate::resources::ResourceSpec;
use crate::resources::container::ContainerSpec;
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
    /// Trust any TLS certificate of the nodes' APIs instead of the inventory's `tls:`
    /// (warned about on every run).
    #[arg(long)]
    pub insecure: bool,
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

/// Connections made during one command: one API connection per node, shared by its
/// containers (so `/version` is read once per node).
pub struct Connections<'a> {
    loaded: &'a Loaded,
    args: &'a TargetArgs,
    binary: Arc<AgentBinary>,
    printer: &'a Printer,
    nodes: HashMap<String, Arc<NodeApi>>,
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
            nodes: HashMap::new(),
        }
    }

    /// Read access for `plan` and `check`: the agent for a guest, the node's API for a
    /// container's config.
    pub fn reader(&mut self, d: &DesiredTarget) -> anyhow::Result<Box<dyn TargetReader>> {
        match &d.target {
            Target::Container { node, .. } => Ok(Box::new(ApiTarget::new(
                self.node(node)?,
                container_specs(d.resources.iter().map(|r| &r.spec)),
            ))),
            Target::Node { node, .. } => {
                let api = self.node(node)?;
                let ssh = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                Ok(Box::new(NodeReader::new(
                    api,
                    AgentReader::new(ssh, self.binary.clone()),
                )))
            }
            target => connect_reader(self.loaded, target, self.args, &self.binary),
        }
    }

    /// Write access for `apply` only.
    pub fn writer(&mut self, t: &TargetPlan) -> anyhow::Result<Box<dyn TargetWriter>> {
        match &t.target {
            Target::Container { node, .. } => Ok(Box::new(ApiTarget::new(
                self.node(node)?,
                container_specs(t.changes.iter().map(|c| &c.spec)),
            ))),
            Target::Node { node, .. } => {
                let api = self.node(node)?;
                let ssh = crate::cli::ssh::node_transport(self.loaded, node, self.args)?;
                Ok(Box::new(NodeWriter::new(
                    api,
                    AgentWriter::new(ssh, self.binary.clone()),
                )))
            }
            target => connect_writer(self.loaded, target, self.args, &self.binary),
        }
    }

    /// The API connection to the node named `node` in the inventory.
    pub fn node(&mut self, node: &str) -> anyhow::Result<Arc<NodeApi>> {
        if let Some(api) = self.nodes.get(node) {
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
        self.nodes.insert(node.to_string(), api.clone());
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
        for (node, api) in &self.nodes {
            self.printer
                .verbose(&format!("node {node}: {} API call(s)", api.calls()));
        }
    }
}

/// Read access to a target's agent (for `plan` and `check`).
pub fn connect_reader(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
    binary: &Arc<AgentBinary>,
) -> anyhow::Result<Box<dyn TargetReader>> {
    let transport = transport(loaded, target, args)?;
    Ok(Box::new(
        AgentReader::new(transport, binary.clone()).verify_full(args.verify_full),
    ))
}

/// Write access to a target (for `apply` only).
pub fn connect_writer(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
    binary: &Arc<AgentBinary>,
) -> anyhow::Result<Box<dyn TargetWriter>> {
    let transport = transport(loaded, target, args)?;
    Ok(Box::new(
        AgentWriter::new(transport, binary.clone()).verify_full(args.verify_full),
    ))
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

/// The transport to a target's agent.
fn transport(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    match target {
        Target::Guest { name, .. } => crate::cli::ssh::guest_transport(loaded, name, args),
        Target::Container { name, .. } => Err(Diagnostic::new(format!(
            "container `{name}`'s Proxmox config is read through its node's API, not an agent"
        ))
        .into()),
        Target::Node { node, .. } => Err(Diagnostic::new(format!(
            "node `{node}` is read through its API and its SSH together, not one agent"
        ))
        .into()),
    }
}
