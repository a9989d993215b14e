//! The read session of `plan` and `check`: everything they reach a target with. It hands
//! out [`TargetReader`]s and GET-only node connections ([`ApiReader`]) and nothing that
//! writes; `apply`'s [`Connections`](super::targets::Connections) is the only write path.
//! The one thing a read may leave on a target is the agent binary in its cache
//! (`/var/lib/provision/bin/provision-<sha256>`), pushed so that it can answer the probes
//! (`docs/architecture.md`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::guest;
use super::targets::{TargetArgs, container_specs, in_cluster, node_ssh};
use crate::access::{ApiTarget, SeenContainers, TargetReader};
use crate::agent::client::{AgentBinary, AgentReader};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::inventory::Loaded;
use crate::node::access::NodeReader;
use crate::plan::Target;
use crate::printer::Printer;
use crate::proxmox::{ApiReader, ApiSettings};

/// One connection per node, made once by the first target that needs it and shared by
/// the threads that work on several targets at once.
pub struct NodeSlots<T>(Mutex<HashMap<String, Slot<T>>>);

/// One node's connection, once made; locked while it is being made.
type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

impl<T> Default for NodeSlots<T> {
    fn default() -> Self {
        NodeSlots(Mutex::new(HashMap::new()))
    }
}

impl<T> NodeSlots<T> {
    /// The connection to node `node` of `loaded`, made with `connect` from its settings
    /// the first time.
    pub fn get(
        &self,
        loaded: &Loaded,
        args: &TargetArgs,
        node: &str,
        connect: impl FnOnce(&ApiSettings) -> anyhow::Result<T>,
    ) -> anyhow::Result<Arc<T>> {
        let slot = {
            let mut nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
            nodes.entry(node.to_string()).or_default().clone()
        };
        // The node's own slot is held while connecting, so two targets of one node share
        // one login while other nodes connect at the same time.
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(api) = slot.as_ref() {
            return Ok(api.clone());
        }
        let inv = loaded
            .inventory
            .nodes
            .iter()
            .find(|(n, _)| n.as_str() == node)
            .map(|(_, n)| n)
            .ok_or_else(|| Diagnostic::new(format!("no node `{node}` in the inventory")))?;
        let settings =
            ApiSettings::from_inventory(node, &inv.api, &loaded.base_dir, args.insecure)?;
        let api = Arc::new(connect(&settings)?);
        *slot = Some(api.clone());
        Ok(api)
    }

    /// Each connection made, by node name.
    pub fn each(&self, mut f: impl FnMut(&str, &T)) {
        let nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (node, slot) in nodes.iter() {
            if let Some(api) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                f(node, api);
            }
        }
    }
}

/// Read access for `plan` and `check`, and nothing else.
pub struct ReadSession<'a> {
    loaded: &'a Loaded,
    args: &'a TargetArgs,
    binary: Arc<AgentBinary>,
    printer: &'a Printer,
    nodes: NodeSlots<ApiReader>,
    /// Each node's containers as its last listing showed them.
    seen: Mutex<HashMap<String, SeenContainers>>,
}

impl<'a> ReadSession<'a> {
    /// No connection yet.
    pub fn new(
        loaded: &'a Loaded,
        args: &'a TargetArgs,
        binary: Arc<AgentBinary>,
        printer: &'a Printer,
    ) -> Self {
        ReadSession {
            loaded,
            args,
            binary,
            printer,
            nodes: NodeSlots::default(),
            seen: Mutex::new(HashMap::new()),
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

    /// The agent for a guest (through the node when it does not answer SSH yet; the empty
    /// world when its container is not there), the node's API for a container's config.
    pub fn reader(&self, d: &DesiredTarget) -> anyhow::Result<Box<dyn TargetReader>> {
        match &d.target {
            Target::Container { node, .. } => Ok(Box::new(
                ApiTarget::new(
                    self.node(node)?,
                    container_specs(d.resources.iter().map(|r| &r.spec)),
                )
                .recording(self.seen(node))
                .in_cluster(in_cluster(self.loaded, node))
                .owned_by(super::targets::owner(self.loaded)),
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
                let ssh = node_ssh(
                    self.loaded,
                    node,
                    self.args,
                    d.resources.iter().map(|r| &r.spec),
                )?;
                let agent = ssh.map(|ssh| AgentReader::new(ssh, self.binary.clone()));
                Ok(Box::new(NodeReader::new(api, agent)))
            }
        }
    }

    /// The read-only API connection to the node named `node` in the inventory.
    pub fn node(&self, node: &str) -> anyhow::Result<Arc<ApiReader>> {
        self.nodes
            .get(self.loaded, self.args, node, |s| Ok(ApiReader::connect(s)?))
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
        self.nodes.each(|node, api| {
            self.printer
                .verbose(&format!("node {node}: {} API call(s)", api.calls()))
        });
    }
}
