//! The node itself as a target (`node.NAME`): Proxmox's own state (templates in storage)
//! through the node's API, everything else (the model storage, the NVIDIA side) by the
//! agent over the node's SSH. Reads and writes are split as for every target: `plan` and
//! `check` get a [`NodeReader`], only `apply` a [`NodeWriter`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::access::{AccessError, ApiOp, Op, OpOutcome, TargetReader, TargetWriter};
use crate::proxmox::container::ContainerError;
use crate::proxmox::{ApiReader, NodeApi};
use crate::resources::op::Deadline;
use crate::resources::wire::{Fact, Facts, Probe};

/// Read access to a node: GET on its API ([`ApiReader`]) and the agent's probes.
pub struct NodeReader<R: TargetReader> {
    api: Arc<ApiReader>,
    agent: Option<R>,
}

impl<R: TargetReader> NodeReader<R> {
    /// Reads through `api` and `agent` (the agent over the node's SSH; none when only
    /// the API is needed).
    pub fn new(api: Arc<ApiReader>, agent: Option<R>) -> Self {
        NodeReader { api, agent }
    }
}

/// Write access to a node (apply only).
pub struct NodeWriter<W: TargetWriter> {
    read: NodeReader<W>,
    api: Arc<NodeApi>,
}

impl<W: TargetWriter> NodeWriter<W> {
    /// Reads and writes through `api` and `agent` (none when only the API is needed).
    pub fn new(api: Arc<NodeApi>, agent: Option<W>) -> Self {
        NodeWriter {
            read: NodeReader::new(api.reader(), agent),
            api,
        }
    }
}

fn api_error(e: crate::proxmox::ProxmoxError) -> AccessError {
    AccessError::Container(Box::new(ContainerError::from(e)))
}

impl<R: TargetReader> NodeReader<R> {
    fn without_ssh(&self, what: &str) -> AccessError {
        AccessError::Unsupported {
            target: format!("node {} without its SSH", self.api.label),
            what: what.to_string(),
        }
    }
}

impl<R: TargetReader> TargetReader for NodeReader<R> {
    fn describe(&self) -> String {
        format!("node {} (API and SSH)", self.api.label)
    }

    /// The API's probes in one storage listing per storage, the rest in one agent round
    /// trip; an agent is started only when there is something for it.
    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        let (api, agent): (Vec<&Probe>, Vec<&Probe>) = probes.iter().partition(|p| {
            matches!(
                p,
                Probe::PveTemplate(crate::resources::template::PveTemplateProbe { .. })
            )
        });
        let mut out: HashMap<Probe, Fact> = HashMap::new();
        let mut listings = HashMap::new();
        for p in api {
            let Probe::PveTemplate(crate::resources::template::PveTemplateProbe { volume }) = p
            else {
                continue;
            };
            let storage = volume.split_once(':').map_or("local", |(s, _)| s);
            if !listings.contains_key(storage) {
                let list =
                    crate::proxmox::storage::templates(&self.api, storage).map_err(api_error)?;
                listings.insert(storage.to_string(), list);
            }
            let fact = listings[storage].get(volume).cloned();
            out.insert(p.clone(), Fact::PveTemplate(fact));
        }
        if !agent.is_empty() {
            let wanted: Vec<Probe> = agent.into_iter().cloned().collect();
            let Some(reader) = &self.agent else {
                return Err(self.without_ssh(&format!("{wanted:?}")));
            };
            match reader.read(&wanted)? {
                Facts::Read(map) => out.extend(map),
                Facts::Empty => {}
            }
        }
        Ok(Facts::Read(out))
    }
}

impl<W: TargetWriter> TargetReader for NodeWriter<W> {
    fn describe(&self) -> String {
        self.read.describe()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        self.read.read(probes)
    }
}

impl<W: TargetWriter> TargetWriter for NodeWriter<W> {
    /// API operations one by one; runs of agent steps in one request each, in plan order.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let mut results = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            if let Op::Api(op @ ApiOp::Template { address, spec }) = &ops[i] {
                let started = Instant::now();
                let deadline = Deadline::after(op.limit());
                crate::proxmox::storage::download(&self.api, spec, deadline).map_err(|e| {
                    AccessError::Apply {
                        address: address.clone(),
                        source: Box::new(ContainerError::from(e)),
                    }
                })?;
                results.push(OpOutcome {
                    description: ops[i].describe(),
                    error: None,
                    hints: Vec::new(),
                    detail: None,
                    millis: started.elapsed().as_millis() as u64,
                });
                i += 1;
                continue;
            }
            let end = ops[i..]
                .iter()
                .position(|o| matches!(o, Op::Api(_)))
                .map_or(ops.len(), |n| i + n);
            let Some(agent) = &self.read.agent else {
                return Err(self.read.without_ssh(&ops[i].describe()));
            };
            let done = agent.run(&ops[i..end])?;
            let failed = done.iter().any(|r| r.error.is_some()) || done.len() < end - i;
            results.extend(done);
            if failed {
                break;
            }
            i = end;
        }
        Ok(results)
    }
}
