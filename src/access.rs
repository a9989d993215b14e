//! How a target is read and changed. Reading and writing are different types: `plan` and
//! `check` hold only a [`TargetReader`], which has no method that changes anything; only
//! `apply` is handed a [`TargetWriter`], which runs [`Op`]s.

use std::collections::HashMap;
use std::sync::Arc;

use crate::proxmox::container::ContainerError;
use crate::proxmox::{ApiReader, NodeApi};
use crate::resources::container::ContainerSpec;
use crate::resources::op::Deadline;
use crate::resources::wire::{Fact, Facts, Probe};

/// The operations of an apply live with the kinds that declare them
/// (`resources/op.rs`); they are re-exported here, where they are run.
pub use crate::resources::op::{ApiOp, NodeOp, Op};

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
    /// Why what [`TargetReader::read`] answers is not the target's real state (a stopped
    /// container's guest cannot be reached), when it is not: such a target's plan is only
    /// known once apply has started its container.
    fn not_read(&self) -> Option<String> {
        None
    }
}

/// Write access to one target: reads (to verify) and runs operations.
pub trait TargetWriter: TargetReader {
    /// Runs `ops` in order, stopping at the first failure; the outcomes of those that ran.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError>;
}

/// Why a target could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Talking to the agent failed: an `agent::client::AgentError` (boxed, so that this
    /// layer does not import the agent that implements it; `agent/` converts with `From`).
    #[error(transparent)]
    Agent(Box<dyn std::error::Error + Send + Sync>),
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
    /// A root-only step over node SSH failed.
    #[error("{address} over node SSH failed")]
    Node {
        /// The change's plan address.
        address: String,
        /// Why: a `node::NodeError` (boxed as an error, so that this layer does not import
        /// the node that implements it).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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
/// values are compared per declared key). Built on an [`ApiReader`] (`plan`, `check`) it is
/// only a [`TargetReader`]: GET is all it can send; on a [`NodeApi`] (`apply`) it also writes.
pub struct ApiTarget<A = NodeApi> {
    api: Arc<A>,
    specs: Vec<ContainerSpec>,
    listed: Option<Arc<Listing>>,
    cluster: Cluster,
    owner: String,
}

/// Whether a container target's node is in a cluster, and where the cluster's containers
/// are when that was read before.
enum Cluster {
    /// In no cluster: a container is looked for on its node only.
    Alone,
    /// A member: a container is looked for on every node (one `/cluster/resources`).
    Member,
    /// A member whose cluster's placements were read earlier in the same session.
    Placed(Arc<Placements>),
}

/// Where the cluster says each of its containers is, by vmid (one `/cluster/resources`).
pub type Placements = std::collections::BTreeMap<u64, crate::proxmox::cluster::Placement>;

/// A node's containers as one listing showed them: vmid → (name, running).
pub type Listing = std::collections::BTreeMap<u64, (String, bool)>;

impl<A: AsRef<ApiReader>> ApiTarget<A> {
    /// Access to containers of the node behind `api`, declared as `specs`.
    pub fn new(api: Arc<A>, specs: Vec<ContainerSpec>) -> Self {
        ApiTarget {
            api,
            specs,
            listed: None,
            cluster: Cluster::Alone,
            owner: String::new(),
        }
    }

    /// The inventory file it acts for: written into the marker of a container it creates,
    /// and the only inventory whose undeclared containers it names or destroys.
    pub fn owned_by(mut self, owner: String) -> Self {
        self.owner = owner;
        self
    }

    /// Reads the node's containers from `listing`, made earlier in the same session,
    /// instead of listing them again (the guests of the same plan are planned from it, so
    /// the guest of a container that is not there yet is planned without a connection).
    pub fn listed(mut self, listing: Arc<Listing>) -> Self {
        self.listed = Some(listing);
        self
    }

    /// The node is a member of a cluster: a container is looked for on every node (one
    /// `/cluster/resources` call), and one found on another node than declared is read
    /// there and marked misplaced.
    pub fn in_cluster(mut self, cluster: bool) -> Self {
        self.cluster = if cluster {
            Cluster::Member
        } else {
            Cluster::Alone
        };
        self
    }

    /// A member of a cluster whose placements were read earlier in the same session:
    /// one `/cluster/resources` for every container target of the cluster, not one each.
    pub fn placed_by(mut self, placements: Arc<Placements>) -> Self {
        self.cluster = Cluster::Placed(placements);
        self
    }
}

impl<A: AsRef<ApiReader>> TargetReader for ApiTarget<A> {
    fn describe(&self) -> String {
        "the node's API".into()
    }

    /// In as few API calls as the node needs: its version and list, then each container's
    /// config and pending values.
    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        use crate::proxmox::container;
        let api: &ApiReader = (*self.api).as_ref();
        if probes.is_empty() {
            return Ok(Facts::Read(HashMap::new()));
        }
        let boxed = |e: ContainerError| AccessError::Container(Box::new(e));
        api.version().map_err(|e| boxed(ContainerError::from(e)))?;
        let listing = match &self.listed {
            Some(listing) => listing.clone(),
            None => Arc::new(container::list(api).map_err(|e| boxed(ContainerError::from(e)))?),
        };
        // Only a container's own read looks for it on the other nodes (the scan for
        // undeclared containers reads its node's listing alone).
        let placed = match &self.cluster {
            _ if !probes.iter().any(|p| matches!(p, Probe::PveContainer(_))) => None,
            Cluster::Placed(placed) => Some(placed.clone()),
            Cluster::Member => Some(Arc::new(
                crate::proxmox::cluster::containers(api)
                    .map_err(|e| boxed(ContainerError::from(e)))?,
            )),
            Cluster::Alone => None,
        };
        let mut out = HashMap::new();
        for p in probes {
            if let Probe::PveCreated(crate::resources::container::PveCreatedProbe { except }) = p {
                let created =
                    container::created(api, &listing, &self.owner, except).map_err(boxed)?;
                out.insert(p.clone(), Fact::PveCreated(Some(created)));
                continue;
            }
            let Probe::PveContainer(crate::resources::container::PveContainerProbe { vmid }) = p
            else {
                return Err(AccessError::Unsupported {
                    target: self.describe(),
                    what: format!("{p:?}"),
                });
            };
            if let Some(at) = placed.as_ref().and_then(|p| p.get(vmid))
                && at.node != api.node
            {
                let mut fact = container::read_on(api, &at.node, *vmid, at.running)
                    .map_err(|e| boxed(ContainerError::from(e)))?;
                fact.misplaced = Some((at.node.clone(), api.node.clone()));
                out.insert(p.clone(), Fact::PveContainer(Some(fact)));
                continue;
            }
            let fact = match self.specs.iter().find(|c| c.vmid == *vmid) {
                Some(spec) => container::read_for(api, spec, &listing).map_err(boxed)?,
                None => match listing.get(vmid) {
                    Some((_, running)) => Some(
                        container::read(api, *vmid, *running)
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

impl TargetWriter for ApiTarget<NodeApi> {
    /// Each API action is reported as an outcome; the container module reads back and
    /// fails unless it converged.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let mut results = Vec::new();
        for op in ops {
            let mut log = |what: &str, took: std::time::Duration| {
                results.push(OpOutcome {
                    description: what.to_string(),
                    error: None,
                    hints: Vec::new(),
                    detail: None,
                    millis: took.as_millis() as u64,
                });
            };
            // An operation this writer does not carry is refused below, before it starts.
            let deadline = Deadline::after(op.limit().duration());
            let (address, done) = match op {
                Op::Api(ApiOp::Container {
                    address,
                    spec,
                    action,
                    allow_replace,
                    start,
                }) => (
                    address.clone(),
                    crate::proxmox::container::apply(
                        &self.api,
                        spec,
                        crate::proxmox::container::Asked {
                            planned: *action,
                            allow_replace: *allow_replace,
                            start: *start,
                        },
                        &self.owner,
                        deadline,
                        &mut log,
                    ),
                ),
                Op::Api(ApiOp::Destroy { address, vmid }) => (
                    address.clone(),
                    crate::proxmox::container::destroy_undeclared(
                        &self.api,
                        *vmid,
                        &self.owner,
                        deadline,
                        &mut log,
                    ),
                ),
                Op::Api(ApiOp::Start { vmid, reboot }) => (
                    format!("CT {vmid}"),
                    crate::proxmox::container::start(&self.api, *vmid, *reboot, deadline, &mut log),
                ),
                _ => {
                    return Err(AccessError::Unsupported {
                        target: self.describe(),
                        what: op.describe(),
                    });
                }
            };
            done.map_err(|source| AccessError::Apply {
                address,
                source: Box::new(source),
            })?;
        }
        Ok(results)
    }
}

/// The empty world: every probe answered as absent. The guest of a container that is not
/// there yet is planned against it (everything to create), as `--offline` plans; so is the
/// guest of a stopped container, which cannot be reached (`not_read` says why).
pub struct EmptyWorld {
    /// Why the target was not read, when it exists but cannot be reached.
    pub not_read: Option<String>,
}

impl TargetReader for EmptyWorld {
    fn describe(&self) -> String {
        match &self.not_read {
            Some(why) => format!("a guest not read ({why})"),
            None => "a guest that does not exist yet".into(),
        }
    }

    fn read(&self, _: &[Probe]) -> Result<Facts, AccessError> {
        Ok(Facts::Empty)
    }

    fn not_read(&self) -> Option<String> {
        self.not_read.clone()
    }
}
