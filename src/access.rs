//! How a target is read and changed. Reading and writing are different types: `plan` and
//! `check` hold only a [`TargetReader`], which has no method that changes anything; only
//! `apply` is handed a [`TargetWriter`], which runs [`Op`]s.

use std::collections::HashMap;
use std::sync::Arc;

use crate::plan::Action;
use crate::proxmox::NodeApi;
use crate::proxmox::container::ContainerError;
use crate::resources::container::ContainerSpec;
use crate::resources::wire::{Fact, Facts, Probe, Step};

/// One operation of an apply, by what carries it out.
///
/// Root-only steps on the node (`pct set`, a locked config edit) will be a `Node` variant;
/// each writer runs the variants it carries and refuses the others.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A step run by the agent inside a guest (or on a host it was pushed to).
    Guest(Step),
    /// A call to a node's Proxmox API.
    Api(ApiOp),
}

/// An operation through a node's Proxmox API.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiOp {
    /// Create, change or replace a container's configuration (and start it as declared).
    Container {
        /// The change's plan address, for messages.
        address: String,
        /// The desired configuration.
        spec: ContainerSpec,
        /// What the plan says to do.
        action: Action,
        /// Whether a replace may destroy the container.
        allow_replace: bool,
    },
    /// Have the node download a container template (checksum verified by the node).
    Template {
        /// The change's plan address, for messages.
        address: String,
        /// The template.
        spec: crate::resources::template::TemplateSpec,
    },
}

impl Op {
    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Op::Guest(step) => step.describe(),
            Op::Api(ApiOp::Container { address, .. }) => format!("apply {address}"),
            Op::Api(ApiOp::Template { spec, .. }) => {
                format!(
                    "download {} ({} checked)",
                    spec.volume, spec.checksum_algorithm
                )
            }
        }
    }
}

/// How one operation of an apply went.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutcome {
    /// What it did.
    pub description: String,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// What to do about the failure.
    pub hints: Vec<String>,
    /// What it reported (a service's health verdict).
    pub detail: Option<serde_json::Value>,
    /// How long it took.
    pub millis: u64,
}

/// Read access to one target: answers probes, nothing else.
pub trait TargetReader {
    /// The target, for messages.
    fn describe(&self) -> String;
    /// Answers every probe in as few round trips as the transport allows; a probe without
    /// an answer is an error, never "absent".
    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError>;
}

/// Write access to one target: reads (to verify) and runs operations.
pub trait TargetWriter: TargetReader {
    /// Runs `ops` in order, stopping at the first failure; the outcomes of those that ran.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError>;
}

/// Why a target could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Talking to the agent failed.
    #[error(transparent)]
    Agent(#[from] crate::agent::client::AgentError),
    /// Talking to a node's API failed.
    #[error(transparent)]
    Container(#[from] Box<ContainerError>),
    /// A container change through the API failed.
    #[error("applying {address} failed")]
    Apply {
        /// The change's plan address.
        address: String,
        /// Why.
        #[source]
        source: Box<ContainerError>,
    },
    /// A probe or operation this access cannot carry.
    #[error("{target} cannot carry {what}")]
    Unsupported {
        /// The target.
        target: String,
        /// The probe or operation, described.
        what: String,
    },
}

/// A container's configuration through its node's API: reads its probes, runs
/// [`Op::Api`]. The desired specs are known up front: reading one needs its spec (pending
/// values are compared per declared key).
pub struct ApiTarget {
    api: Arc<NodeApi>,
    specs: Vec<ContainerSpec>,
}

impl ApiTarget {
    /// Access to containers of the node behind `api`, declared as `specs`.
    pub fn new(api: Arc<NodeApi>, specs: Vec<ContainerSpec>) -> Self {
        ApiTarget { api, specs }
    }
}

impl TargetReader for ApiTarget {
    fn describe(&self) -> String {
        "the node's API".into()
    }

    /// In as few API calls as the node needs: its version and list, then each container's
    /// config and pending values.
    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        use crate::proxmox::container;
        if probes.is_empty() {
            return Ok(Facts::Read(HashMap::new()));
        }
        let boxed = |e: ContainerError| AccessError::Container(Box::new(e));
        self.api
            .version()
            .map_err(|e| boxed(ContainerError::from(e)))?;
        let listing = container::list(&self.api).map_err(|e| boxed(ContainerError::from(e)))?;
        let mut out = HashMap::new();
        for p in probes {
            let Probe::PveContainer { vmid } = p else {
                return Err(AccessError::Unsupported {
                    target: self.describe(),
                    what: format!("{p:?}"),
                });
            };
            let fact = match self.specs.iter().find(|c| c.vmid == *vmid) {
                Some(spec) => container::read_for(&self.api, spec, &listing).map_err(boxed)?,
                None => match listing.get(vmid) {
                    Some((_, running)) => Some(
                        container::read(&self.api, *vmid, *running)
                            .map_err(|e| boxed(ContainerError::from(e)))?,
                    ),
                    None => None,
                },
            };
            out.insert(p.clone(), Fact::PveContainer(fact));
        }
        Ok(Facts::Read(out))
    }
}

impl TargetWriter for ApiTarget {
    /// Each API action is reported as an outcome; the container module reads back and
    /// fails unless it converged.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let mut results = Vec::new();
        for op in ops {
            let Op::Api(ApiOp::Container {
                address,
                spec,
                action,
                allow_replace,
            }) = op
            else {
                return Err(AccessError::Unsupported {
                    target: self.describe(),
                    what: op.describe(),
                });
            };
            let mut log = |what: &str, took: std::time::Duration| {
                results.push(OpOutcome {
                    description: what.to_string(),
                    error: None,
                    hints: Vec::new(),
                    detail: None,
                    millis: took.as_millis() as u64,
                });
            };
            crate::proxmox::container::apply(&self.api, spec, *action, *allow_replace, &mut log)
                .map_err(|source| AccessError::Apply {
                    address: address.clone(),
                    source: Box::new(source),
                })?;
        }
        Ok(results)
    }
}
