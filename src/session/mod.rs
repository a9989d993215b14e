//! The sessions plan and apply reach targets through, opened by the command and driven by
//! the engine (its `Read` and `Connect` callbacks). A [`ReadSession`] (`plan`, `check`,
//! `history`) hands out [`TargetReader`]s and GET-only node connections and has no
//! `writer()`; a [`WriteSession`] (`apply`, `rollback`) is opened once per apply: the plan
//! is read through it and the apply runs through the same logins (one API connection per
//! node, one SSH pool per node and per guest, one [`AgentBinary`]). Bootstrap ordering (a
//! created container's guest reached through its node, its host keys trusted) lives here,
//! in [`guest`]. The one thing a read may leave on a target is the agent binary in its
//! cache (`/var/lib/provision/bin/provision-<sha256>`; `docs/architecture.md`).

mod assumed;
pub mod generations;
mod gpus;
pub mod guest;
pub mod plan;
mod pool;
mod privileges;
pub mod ssh;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::access::{AccessError, ApiTarget, Listing, TargetReader, TargetWriter};
use crate::agent::attach::Observer;
use crate::agent::client::{AgentBinary, AgentReader, AgentWriter};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::inventory::Loaded;
use crate::node::NodeError;
use crate::node::access::{NodeReader, NodeWriter};
use crate::node::probe::NodeProbe;
use crate::node::target::{self as node_target, ContainerTarget, NodeSteps};
use crate::plan::{Action, Target, TargetPlan};
use crate::printer::Printer;
use crate::proxmox::{ApiReader, ApiSettings, NodeApi, ProxmoxError};
use crate::resources::ResourceSpec;
use crate::resources::container::{ContainerSpec, RestartPolicy};
use crate::transport::{Transport, TransportError};

pub use pool::Pool;

/// What the command line says about reaching targets.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The SSH known_hosts file (`None`: ~/.ssh/known_hosts).
    pub known_hosts: Option<PathBuf>,
    /// Add unknown SSH host keys to known_hosts (a changed key is still refused).
    pub accept_new_host_keys: bool,
    /// The agents re-hash every model file.
    pub verify_full: bool,
    /// Trust any TLS certificate of the nodes' APIs.
    pub insecure: bool,
}

/// Why a session could not open a target.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A setting or a state that a person must act on.
    #[error(transparent)]
    Refused(Box<Diagnostic>),
    /// An SSH connection failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A node's API could not be reached or logged in to.
    #[error(transparent)]
    Api(#[from] ProxmoxError),
    /// The node answered with an error (its GPUs, a bootstrap).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A read through a target failed.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// A target's answers lack a probe asked for.
    #[error(transparent)]
    NotRead(#[from] crate::resources::wire::NotRead),
    /// The inventory cannot be expanded with what the nodes answered (their GPUs).
    #[error(transparent)]
    Invalid(#[from] crate::diagnostic::Diagnostics),
    /// This provision's agent binary could not be read.
    #[error(transparent)]
    Binary(#[from] std::io::Error),
    /// What was being done when `source` failed.
    #[error("{what}")]
    While {
        /// What was being done.
        what: String,
        /// The failure.
        #[source]
        source: Box<SessionError>,
    },
}

impl From<Diagnostic> for SessionError {
    fn from(d: Diagnostic) -> Self {
        SessionError::Refused(Box::new(d))
    }
}

/// A node's API connection a session can hold: GET-only for reads, any method for apply.
pub trait Api: AsRef<ApiReader> + Send + Sync + Sized + 'static {
    /// Connects (and logs in, with a password) with `settings`.
    fn connect(settings: &ApiSettings) -> Result<Self, ProxmoxError>;
    /// Its GET-only half, shared.
    fn read_only(this: &Arc<Self>) -> Arc<ApiReader>;
}

impl Api for ApiReader {
    fn connect(settings: &ApiSettings) -> Result<Self, ProxmoxError> {
        ApiReader::connect(settings)
    }
    fn read_only(this: &Arc<Self>) -> Arc<ApiReader> {
        this.clone()
    }
}

impl Api for NodeApi {
    fn connect(settings: &ApiSettings) -> Result<Self, ProxmoxError> {
        NodeApi::connect(settings)
    }
    fn read_only(this: &Arc<Self>) -> Arc<ApiReader> {
        this.reader()
    }
}

/// One connection per name, made once by the first caller that needs it and shared by
/// the threads that work on several targets at once.
pub struct Slots<T>(Mutex<HashMap<String, Slot<T>>>);

/// One name's connection, once made; locked while it is being made.
type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots(Mutex::new(HashMap::new()))
    }
}

impl<T> Slots<T> {
    /// The connection named `name`, made with `connect` the first time.
    pub fn get(
        &self,
        name: &str,
        connect: impl FnOnce() -> Result<T, SessionError>,
    ) -> Result<Arc<T>, SessionError> {
        let slot = {
            let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
            all.entry(name.to_string()).or_default().clone()
        };
        // The name's own slot is held while connecting, so two targets of one node share
        // one login while other nodes connect at the same time.
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(made) = slot.as_ref() {
            return Ok(made.clone());
        }
        let made = Arc::new(connect()?);
        *slot = Some(made.clone());
        Ok(made)
    }

    /// The connection named `name` when it has been made.
    pub fn made(&self, name: &str) -> Option<Arc<T>> {
        let slot = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)?
            .clone();
        slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets the connection named `name` (the next `get` makes a new one).
    pub fn forget(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// Each connection made, by name, in name order.
    pub fn each(&self, mut f: impl FnMut(&str, &T)) {
        let all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<&String> = all.keys().collect();
        names.sort();
        for name in names {
            if let Some(made) = all[name].lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                f(name, made);
            }
        }
    }
}

/// Everything a command reaches targets with, on node connections of kind `A`.
pub struct Session<'a, A> {
    loaded: &'a Loaded,
    settings: Settings,
    binary: Arc<AgentBinary>,
    printer: &'a Printer,
    apis: Slots<A>,
    /// The nodes' SSH as root, by node name.
    node_ssh: Slots<Pool>,
    /// The guests' SSH, by container name.
    guest_ssh: Slots<Pool>,
    /// Each node's containers, listed once: by the first of its container's read and its
    /// guest's, which run at the same time.
    listings: Slots<Listing>,
    /// The nodes whose containers this session's plan reads: their guests are planned
    /// from the node's listing (not there, stopped, reached through the node).
    listed_nodes: Mutex<BTreeSet<String>>,
    /// Containers this apply creates or replaces: their guests are bootstrapped and
    /// their new host keys trusted.
    created: Mutex<BTreeSet<u64>>,
}

/// Read access for `plan`, `check` and `history`, and nothing else.
pub type ReadSession<'a> = Session<'a, ApiReader>;
/// `apply`'s session: its plan is read through it and its writers reuse the same logins.
pub type WriteSession<'a> = Session<'a, NodeApi>;

impl<'a, A: Api> Session<'a, A> {
    /// No connection yet.
    pub fn new(
        loaded: &'a Loaded,
        settings: Settings,
        binary: Arc<AgentBinary>,
        printer: &'a Printer,
    ) -> Self {
        Session {
            loaded,
            settings,
            binary,
            printer,
            apis: Slots::default(),
            node_ssh: Slots::default(),
            guest_ssh: Slots::default(),
            listings: Slots::default(),
            listed_nodes: Mutex::new(BTreeSet::new()),
            created: Mutex::new(BTreeSet::new()),
        }
    }

    /// The inventory this session reaches.
    pub fn loaded(&self) -> &'a Loaded {
        self.loaded
    }

    /// The settings it was opened with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Whether the listing of `node` showed container `vmid` running.
    pub fn running(&self, node: &str, vmid: u64) -> bool {
        self.listings
            .made(node)
            .and_then(|l| l.get(&vmid).map(|(_, running)| *running))
            .unwrap_or(false)
    }

    /// Says which targets the plan reads: the guest of a container read in the same plan
    /// is planned from its node's listing, which both share.
    pub fn reading(&self, desired: &[DesiredTarget]) {
        let mut nodes = self.listed_nodes.lock().unwrap_or_else(|p| p.into_inner());
        for d in desired {
            if let Target::Container { node, .. } = &d.target {
                nodes.insert(node.clone());
            }
        }
    }

    /// The containers of `node`, listed once in this session (its version read first, as
    /// every read of the node does).
    fn listing(&self, node: &str) -> Result<Arc<Listing>, SessionError> {
        self.listings.get(node, || {
            let api = self.api_reader(node)?;
            api.version()?;
            Ok(crate::proxmox::container::list(&api)?)
        })
    }

    /// A reader of `d`'s target: the agent for a guest (through the node when it does not
    /// answer SSH yet; the empty world when its container is not there), the node's API for
    /// a container's config, API and agent for the node. Read-only even in a write session.
    pub fn reader(&self, d: &DesiredTarget) -> Result<Box<dyn TargetReader>, SessionError> {
        match &d.target {
            Target::Container { node, .. } => Ok(Box::new(
                ApiTarget::new(
                    self.api(node)?,
                    container_specs(d.resources.iter().map(|r| &r.spec)),
                )
                .listed(self.listing(node)?)
                .in_cluster(self.in_cluster(node))
                .owned_by(owner(self.loaded)),
            )),
            Target::Guest { name, .. } => {
                // Only a listing actually read says the container is not there; it is
                // read when this plan reads the container's node too.
                let node = guest::find(self.loaded, name).map(|(n, _, _)| n);
                let listed = node.is_some_and(|n| {
                    self.listed_nodes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .contains(n)
                });
                let listing = match node.filter(|_| listed) {
                    Some(n) => Some(self.listing(n)?),
                    None => None,
                };
                let transport = match self.plan_read(name, listing.as_deref())? {
                    guest::GuestRead::Empty(r) => return Ok(r),
                    guest::GuestRead::Ssh(t) | guest::GuestRead::Node(t) => t,
                };
                Ok(Box::new(
                    AgentReader::new(transport, self.binary.clone())
                        .verify_full(self.settings.verify_full),
                ))
            }
            Target::Node { node, .. } => {
                let agent = self
                    .node_agent_ssh(node, d.resources.iter().map(|r| &r.spec))?
                    .map(|ssh| AgentReader::new(ssh, self.binary.clone()));
                Ok(Box::new(NodeReader::new(self.api_reader(node)?, agent)))
            }
        }
    }

    /// The API connection to the node named `node` in the inventory.
    pub fn api(&self, node: &str) -> Result<Arc<A>, SessionError> {
        self.apis.get(node, || {
            let inv = self
                .loaded
                .inventory
                .nodes
                .iter()
                .find(|(n, _)| n.as_str() == node)
                .map(|(_, n)| n)
                .ok_or_else(|| Diagnostic::new(format!("no node `{node}` in the inventory")))?;
            let settings = ApiSettings::from_inventory(
                node,
                &inv.api,
                &self.loaded.base_dir,
                self.settings.insecure,
            )?;
            Ok(A::connect(&settings)?)
        })
    }

    /// The GET-only half of the API connection to node `node`.
    pub fn api_reader(&self, node: &str) -> Result<Arc<ApiReader>, SessionError> {
        Ok(A::read_only(&self.api(node)?))
    }

    /// The SSH (as root) to node `name`: the session's pool, logged in once. Private to
    /// the session: outside it, node SSH is reached only as a [`NodeProbe`] (reads) or
    /// through a write session's writers.
    fn node_ssh(&self, name: &str) -> Result<Arc<dyn Transport>, SessionError> {
        let pool = self
            .node_ssh
            .get(name, || ssh::node_pool(self.loaded, name, &self.settings))?;
        Ok(Pool::transport(&pool))
    }

    /// The node's SSH as a plan reads it: a fixed set of read-only commands, on the
    /// session's pool for node `name`.
    pub fn node_probe(&self, name: &str) -> Result<NodeProbe, SessionError> {
        Ok(NodeProbe::new(self.node_ssh(name)?))
    }

    /// The SSH to the guest of container `name`: the session's pool, logged in once.
    /// Private to the session, as `node_ssh` is.
    fn guest_ssh(&self, name: &str) -> Result<Arc<dyn Transport>, SessionError> {
        let pool = self
            .guest_ssh
            .get(name, || ssh::guest_pool(self.loaded, name, &self.settings))?;
        Ok(Pool::transport(&pool))
    }

    /// The node's SSH when a node target's resources need the agent there (templates go
    /// through the API alone).
    fn node_agent_ssh<'s>(
        &self,
        node: &str,
        mut specs: impl Iterator<Item = &'s ResourceSpec>,
    ) -> Result<Option<Arc<dyn Transport>>, SessionError> {
        if !specs.any(|s| !matches!(s, ResourceSpec::Template(_))) {
            return Ok(None);
        }
        Ok(Some(self.node_ssh(node)?))
    }

    /// Whether the inventory puts node `node` in a cluster.
    fn in_cluster(&self, node: &str) -> bool {
        self.loaded
            .inventory
            .nodes
            .iter()
            .any(|(n, inv)| n.as_str() == node && inv.cluster.is_some())
    }

    /// Warns, on every run that reads targets, when certificates are not verified.
    pub fn warn_insecure(&self) {
        if self.settings.insecure {
            self.printer.warn(
                "--insecure: the nodes' TLS certificates are NOT verified; anyone on the path can read the API credentials and change the node",
            );
        }
    }

    /// Says how many API calls each node took and how many SSH logins each node and guest
    /// took in this session (`-v`).
    pub fn report_calls(&self) {
        self.apis.each(|node, api| {
            self.printer.verbose(&format!(
                "node {node}: {} API call(s)",
                api.as_ref().calls()
            ))
        });
        self.node_ssh.each(|node, pool| {
            self.printer
                .verbose(&format!("node {node}: {} SSH login(s)", pool.logins()))
        });
        self.guest_ssh.each(|name, pool| {
            self.printer
                .verbose(&format!("guest.{name}: {} SSH login(s)", pool.logins()))
        });
    }
}

impl<'a> WriteSession<'a> {
    /// Write access to `t`'s target, on the connections its plan was read through. A
    /// container's root-only lines go over its node's SSH; a guest whose container this
    /// apply created, or that does not answer SSH, is bootstrapped through its node first.
    /// An agent's events go to `observe` as they come.
    pub fn writer(
        &self,
        t: &TargetPlan,
        observe: Option<Observer>,
    ) -> Result<Box<dyn TargetWriter>, SessionError> {
        let observed = |w: AgentWriter| match &observe {
            Some(o) => w.observe(o.clone()),
            None => w,
        };
        match &t.target {
            Target::Container { node, name, vmid } => {
                let api = ApiTarget::new(
                    self.api(node)?,
                    container_specs(t.changes.iter().map(|c| &c.spec)),
                )
                .in_cluster(self.in_cluster(node))
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
                let steps = if t.changes.iter().any(|c| {
                    matches!(c.spec, ResourceSpec::PveLines(_))
                        || crate::engine::removal::removes_lines(&c.spec)
                }) {
                    let (_, n, _) = inv.ok_or_else(|| {
                        Diagnostic::new(format!("no container `{name}` in the inventory"))
                    })?;
                    let ssh = self.node_ssh(node)?;
                    let gpus = t
                        .changes
                        .iter()
                        .any(|c| matches!(&c.spec, ResourceSpec::PveLines(l) if l.passthrough()));
                    let gpus = if gpus {
                        let root = std::env::var(crate::node::gpu::ROOT_ENV).unwrap_or_default();
                        Some(crate::node::gpu::read(ssh.as_ref(), &root)?)
                    } else {
                        None
                    };
                    Some(NodeSteps {
                        node: ssh,
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
                let transport = self.apply_connect(name, created)?;
                let writer = observed(
                    AgentWriter::new(transport, self.binary.clone())
                        .verify_full(self.settings.verify_full),
                );
                let ops = t.changes.iter().any(
                    |c| matches!(&c.spec, ResourceSpec::GpuUserspace(u) if u.installer.is_some()),
                );
                let Some((node, _, ct)) = guest::find(self.loaded, name).filter(|_| ops) else {
                    return Ok(Box::new(writer));
                };
                // The node fetches the userspace `.run` and pushes it in (its own agent).
                let ssh = self.node_ssh(node)?;
                let side = crate::node::installer::NodeSide {
                    agent: Box::new(observed(AgentWriter::new(ssh.clone(), self.binary.clone()))),
                    node: ssh,
                    vmid: ct.vmid.value as u32,
                };
                Ok(Box::new(crate::node::installer::GuestWithNode::new(
                    Box::new(writer),
                    Some(side),
                )))
            }
            Target::Node { node, .. } => {
                let agent = self
                    .node_agent_ssh(node, t.changes.iter().map(|c| &c.spec))?
                    .map(|ssh| observed(AgentWriter::new(ssh, self.binary.clone())));
                Ok(Box::new(NodeWriter::new(self.api(node)?, agent)))
            }
        }
    }
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

/// The inventory file as containers' markers name it: its absolute path (a container
/// another inventory created on the same node is not this one's to name or destroy).
pub fn owner(loaded: &Loaded) -> String {
    std::fs::canonicalize(&loaded.path)
        .unwrap_or_else(|_| loaded.path.clone())
        .display()
        .to_string()
}
