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
mod early;
pub mod generations;
mod gpus;
pub mod guest;
pub mod plan;
mod pool;
mod privileges;
pub mod ssh;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::access::{AccessError, ApiTarget, Listing, Placements, TargetReader, TargetWriter};
use crate::agent::attach::Observer;
use crate::agent::client::{AgentBinary, AgentError, AgentReader, AgentWriter};
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
use crate::resources::wire::Probe;
use crate::timing;
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
pub struct Slots<T> {
    made: Mutex<HashMap<String, Slot<T>>>,
    /// Why a [`Slots::prime`] failed, by name: the next `get` of that name answers it
    /// instead of trying again (twice a connect timeout otherwise).
    failed: Mutex<HashMap<String, SessionError>>,
}

/// One name's connection, once made; locked while it is being made.
type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            made: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Slots<T> {
    /// The connection named `name`, made with `connect` the first time.
    pub fn get(
        &self,
        name: &str,
        connect: impl FnOnce() -> Result<T, SessionError>,
    ) -> Result<Arc<T>, SessionError> {
        let slot = self.slot(name);
        // The name's own slot is held while connecting, so two targets of one node share
        // one login while other nodes connect at the same time.
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(made) = slot.as_ref() {
            return Ok(made.clone());
        }
        if let Some(e) = self.failed_prime(name) {
            return Err(e);
        }
        let made = Arc::new(connect()?);
        *slot = Some(made.clone());
        Ok(made)
    }

    /// Makes the connection named `name` ahead of its first `get` (while something else
    /// is waited for); a failure is kept for that `get` to answer, once.
    pub fn prime(&self, name: &str, connect: impl FnOnce() -> Result<T, SessionError>) {
        let slot = self.slot(name);
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        match connect() {
            Ok(made) => *slot = Some(Arc::new(made)),
            Err(e) => {
                self.failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.to_string(), e);
            }
        }
    }

    fn slot(&self, name: &str) -> Slot<T> {
        let mut all = self.made.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(name.to_string()).or_default().clone()
    }

    /// Forgets the failures of primes no `get` answered (their moment has passed: the
    /// next `get` tries again).
    pub fn forget_failed_primes(&self) {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn failed_prime(&self, name: &str) -> Option<SessionError> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// The connection named `name` when it has been made.
    pub fn made(&self, name: &str) -> Option<Arc<T>> {
        let slot = self
            .made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)?
            .clone();
        slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets every connection made (the next `get` of each makes a new one).
    pub fn forget_all(&self) {
        self.made.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Forgets the connection named `name` (the next `get` makes a new one).
    pub fn forget(&self, name: &str) {
        self.made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// Each connection made, by name, in name order.
    pub fn each(&self, mut f: impl FnMut(&str, &T)) {
        let all = self.made.lock().unwrap_or_else(|p| p.into_inner());
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
    /// Where each cluster says its containers are, by cluster name: read once for all the
    /// cluster's container targets.
    placements: Slots<Placements>,
    /// Each guest read before the plan asked (see [`Self::prime`]), by container name.
    guest_early: Slots<early::EarlyRead>,
    /// What each running GPU container shows of its GPUs, by `node/vmid`: read while the
    /// nodes' facts are (see [`Self::prime`]), compared once they are.
    gpu_seen: Slots<crate::node::gpu_check::Seen>,
    /// The nodes whose containers this session's plan reads: their guests are planned
    /// from the node's listing (not there, stopped, reached through the node).
    listed_nodes: Mutex<BTreeSet<String>>,
    /// Containers this apply creates or replaces: their guests are bootstrapped and
    /// their new host keys trusted.
    created: Mutex<BTreeSet<u64>>,
    /// Guest logins started before their node's listing said whether the container runs
    /// (see [`Self::log_in_ahead`]), by container name, taken by the first login of each.
    ahead: Mutex<HashMap<String, std::thread::JoinHandle<Result<Pool, TransportError>>>>,
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
            placements: Slots::default(),
            gpu_seen: Slots::default(),
            guest_early: Slots::default(),
            listed_nodes: Mutex::new(BTreeSet::new()),
            created: Mutex::new(BTreeSet::new()),
            ahead: Mutex::new(HashMap::new()),
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
        self.listings.get(node, || self.list(node))
    }

    fn list(&self, node: &str) -> Result<Listing, SessionError> {
        let api = self.api_reader(node)?;
        api.version()?;
        Ok(crate::proxmox::container::list(&api)?)
    }

    /// Where the cluster of `node` says its containers are, read once in this session
    /// through the first member asked (any member's API reaches every node); `None` for a
    /// node in no cluster.
    fn placements(&self, node: &str) -> Result<Option<Arc<Placements>>, SessionError> {
        let Some(cluster) = self.cluster_of(node) else {
            return Ok(None);
        };
        let placed = self.placements.get(&cluster, || {
            Ok(crate::proxmox::cluster::containers(
                &*self.api_reader(node)?,
            )?)
        })?;
        Ok(Some(placed))
    }

    /// Makes, ahead of the plan's reads, the connections they will open, while the nodes'
    /// GPU facts are read, which the reads wait for; `done` once the facts are in. First
    /// each node's API login and container listing, when its containers are read. Then,
    /// at once, what each running GPU container shows of its GPUs (over a second node
    /// login), and one after the other the SSH login and an early read (see [`early`]) of
    /// each guest read whose container runs. A read that comes first makes its own; a
    /// failure is the read's to report, not tried twice.
    fn prime(&self, wanted: &dyn Fn(&Target) -> bool, early: &[DesiredTarget], done: &AtomicBool) {
        let root = std::env::var(crate::node::gpu::ROOT_ENV).unwrap_or_default();
        let root = root.trim_end_matches('/');
        std::thread::scope(|s| {
            for (node_name, node) in &self.loaded.inventory.nodes {
                let node_name = node_name.as_str();
                let listed = node
                    .containers
                    .iter()
                    .any(|(name, ct)| wanted(&container_target(node_name, name.as_str(), ct)));
                if listed && !done.load(Ordering::Relaxed) {
                    self.listings.prime(node_name, || self.list(node_name));
                }
                let listing = self.listings.made(node_name);
                let runs = |vmid: u64| {
                    listing
                        .as_deref()
                        .is_some_and(|l| l.get(&vmid).is_some_and(|(_, r)| *r))
                };
                let early_of = |name: &str| {
                    let guest = guest_target(name);
                    early
                        .iter()
                        .find(|d| d.target.names() == guest.names())
                        .filter(|_| wanted(&guest))
                };
                // What a running GPU container shows of its GPUs is read by its guest's
                // agent in the early read that reads the guest anyway (as root, as the
                // node's `pct exec` would), so neither a second node login nor `pct exec`
                // is needed; the others over a node login of their own.
                let in_guest = |name: &str, ct: &crate::inventory::container::Container| {
                    node.ssh.host.is_some()
                        && runs(ct.vmid.value)
                        && ct.gpus.is_some()
                        && ct.ssh.user.to_string() == "root"
                        && early_of(name).is_some()
                };
                let gpus: Vec<u64> = gpus::gpu_containers(node_name, node, wanted)
                    .filter(|(name, ct, _)| runs(ct.vmid.value) && !in_guest(name, ct))
                    .map(|(_, ct, _)| ct.vmid.value)
                    .collect();
                if node.ssh.host.is_some() && !gpus.is_empty() {
                    s.spawn(move || self.prime_gpu_views(node_name, &gpus, root, done));
                }
                for (name, ct) in &node.containers {
                    let name = name.as_str();
                    if done.load(Ordering::Relaxed) {
                        return;
                    }
                    if !wanted(&guest_target(name)) || (listed && !runs(ct.vmid.value)) {
                        continue;
                    }
                    let login_and_read = |view| {
                        self.guest_ssh.prime(name, || self.guest_login(name));
                        match early_of(name) {
                            Some(d) => self.read_early(name, d, view),
                            None => Ok(None),
                        }
                    };
                    if !in_guest(name, ct) {
                        let _ = login_and_read(None);
                        continue;
                    }
                    // The view's slot is held from before the login until the answer, so
                    // the checks wait for it rather than read it again with `pct exec`.
                    let vmid = ct.vmid.value;
                    self.gpu_seen.prime(&seen_key(node_name, vmid), || {
                        match login_and_read(Some(root)) {
                            Ok(Some(seen)) => Ok(seen),
                            Ok(None) => Err(Diagnostic::new(format!(
                                "CT {vmid}'s guest did not answer what it shows of its GPUs"
                            ))
                            .into()),
                            Err(failed) => Err(failed.into()),
                        }
                    });
                }
            }
        })
    }

    /// Reads guest `name` as its plan will (`d`, its desired state without the nodes'
    /// facts, asks the same probes), over the login [`Self::prime`] made, for the plan's
    /// read to take (see [`early`]). Nothing when that login failed or a read came first.
    /// With `view` (the GPU root), the same request asks what the container shows of its
    /// GPUs (see [`crate::resources::gpu_seen`]), returned for the GPU checks to compare
    /// once the facts are in; when the agent ran that view and it failed there (a hung
    /// GPU's `nvidia-smi`), that failure, which the node's `pct exec` of the same script
    /// would only repeat.
    fn read_early(
        &self,
        name: &str,
        d: &DesiredTarget,
        view: Option<&str>,
    ) -> Result<Option<crate::node::gpu_check::Seen>, NodeError> {
        let mut seen = Ok(None);
        self.guest_early.prime(name, || {
            let Some(pool) = self.guest_ssh.made(name) else {
                return Ok(early::EarlyRead::none());
            };
            let reader = AgentReader::new(Pool::transport(&pool), self.binary.clone())
                .verify_full(self.settings.verify_full);
            let probes = crate::engine::removal::first_probes(d);
            let asked_view = view.map(|root| {
                Probe::GpuSeen(crate::resources::gpu_seen::GpuSeenProbe {
                    roots: vec![root.to_string()],
                    paths: Vec::new(),
                })
            });
            let asked: Vec<Probe> = probes.iter().cloned().chain(asked_view.clone()).collect();
            let answer = timing::time("read guest early (beside the GPU facts)", || {
                reader.read(&asked)
            });
            let (Some(root), Some(probe)) = (view, &asked_view) else {
                return Ok(early::EarlyRead::of(probes, answer));
            };
            if let Err(AccessError::Agent(e)) = &answer
                && let Some(AgentError::Probe {
                    target,
                    probe: failed,
                    error,
                    ..
                }) = e.downcast_ref::<AgentError>()
                && failed.as_ref() == probe
            {
                seen = Err(NodeError::GpuView {
                    target: target.clone(),
                    error: error.clone(),
                });
                return Ok(early::EarlyRead::none());
            }
            // A view that could not be read is the node's to read, and the plan reads the
            // guest itself.
            let Some(text) = answer
                .as_ref()
                .ok()
                .and_then(|f| f.gpu_seen(probe).ok().flatten())
                .cloned()
            else {
                return Ok(early::EarlyRead::none());
            };
            seen = Ok(Some(crate::node::gpu_check::Seen::new(
                text,
                vec![root.to_string()],
                Vec::new(),
            )));
            Ok(early::EarlyRead::of(probes, answer))
        });
        seen
    }

    /// Reads what running containers `vmids` of `node` show of their GPUs, over a login of
    /// its own made beside the one the facts are read over (so both go at once), which the
    /// node's pool then takes in. When it cannot log in, the checks read as they would
    /// have, over the pool, and report what fails.
    fn prime_gpu_views(&self, node: &str, vmids: &[u64], root: &str, done: &AtomicBool) {
        let Ok(opts) = ssh::node_options(self.loaded, node, &self.settings) else {
            return;
        };
        if done.load(Ordering::Relaxed) {
            return;
        }
        let Ok(conn) = crate::transport::ssh::SshTransport::connect(&opts) else {
            return;
        };
        let conn = Arc::new(conn);
        let probe = NodeProbe::new(conn.clone());
        // Logged in: the reads are the checks' own now, whether or not the facts are in.
        for vmid in vmids {
            let (key, read) = seen_read(node, *vmid, root, &probe);
            self.gpu_seen.prime(&key, read);
        }
        drop(probe);
        if let (Ok(conn), Some(pool)) = (Arc::try_unwrap(conn), self.node_ssh.made(node)) {
            pool.adopt(conn);
        }
    }

    /// What running container `vmid` of `node` shows of its GPUs, also under `root`:
    /// read once per session (ahead of the plan by [`Self::prime`], or now).
    pub(crate) fn gpu_seen(
        &self,
        node: &str,
        vmid: u64,
        root: &str,
        probe: &NodeProbe,
    ) -> Result<Arc<crate::node::gpu_check::Seen>, SessionError> {
        let (key, read) = seen_read(node, vmid, root, probe);
        self.gpu_seen.get(&key, read)
    }

    /// Forgets what [`Self::prime`] and [`Self::log_in_ahead`] made and no read took.
    fn forget_failed_primes(&self) {
        self.listings.forget_failed_primes();
        self.guest_ssh.forget_failed_primes();
        self.gpu_seen.forget_failed_primes();
        // An early read is the plan's: a later read (apply's checks) reads the guest.
        self.guest_early.forget_all();
        // A login started ahead and not taken was to a container that does not run: it
        // is left to end on its own thread (joining could wait for a connect timeout).
        self.ahead.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// A reader of `d`'s target: the agent for a guest (through the node when it does not
    /// answer SSH yet; the empty world when its container is not there), the node's API for
    /// a container's config, API and agent for the node. Read-only even in a write session.
    pub fn reader(&self, d: &DesiredTarget) -> Result<Box<dyn TargetReader>, SessionError> {
        match &d.target {
            Target::Container { node, .. } => {
                let target = ApiTarget::new(
                    self.api(node)?,
                    container_specs(d.resources.iter().map(|r| &r.spec)),
                )
                .listed(self.listing(node)?)
                .owned_by(owner(self.loaded));
                // The scan for undeclared containers (no resources) reads no placement.
                Ok(Box::new(match d.resources.is_empty() {
                    true => target,
                    false => match self.placements(node)? {
                        Some(placed) => target.placed_by(placed),
                        None => target,
                    },
                }))
            }
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
                let (transport, ssh) = match self.plan_read(name, listing.as_deref())? {
                    guest::GuestRead::Empty(r) => return Ok(r),
                    guest::GuestRead::Ssh(t) => (t, true),
                    guest::GuestRead::Node(t) => (t, false),
                };
                let agent = Box::new(
                    AgentReader::new(transport, self.binary.clone())
                        .verify_full(self.settings.verify_full),
                );
                // Read over SSH before the plan asked, or marked as not to be.
                match ssh {
                    true => Ok(Box::new(early::Prefetched {
                        early: self
                            .guest_early
                            .get(name, || Ok(early::EarlyRead::none()))?,
                        inner: agent,
                    })),
                    false => Ok(agent),
                }
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
        let pool = self.guest_ssh.get(name, || self.guest_login(name))?;
        Ok(Pool::transport(&pool))
    }

    /// Logs in to guest `name`: the login started ahead for it when there is one (the
    /// same login, made while its node's listing was read), else a new one.
    fn guest_login(&self, name: &str) -> Result<Pool, SessionError> {
        let ahead = self
            .ahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        match ahead.map(std::thread::JoinHandle::join) {
            Some(Ok(made)) => Ok(made?),
            // Not started, or its thread panicked: log in here.
            _ => ssh::guest_pool(self.loaded, name, &self.settings),
        }
    }

    /// Starts, on threads of their own, the SSH login of each guest `wanted` whose
    /// container `wanted` too, so its node's listing (which says whether the container
    /// runs, and which a guest's read waits for) and the login take the time of one, not
    /// both. Only where `known_hosts` already holds every key on the way, so a login whose
    /// container turns out not to run (its address silent or someone else's) writes
    /// nothing; such a login is never taken, and ends with its thread. At most `max` at
    /// once, as `--parallelism` allows reads (guests behind one jump host would otherwise
    /// crowd its sshd's unauthenticated connections, `MaxStartups`); the others log in
    /// when their read comes.
    pub fn log_in_ahead(&self, wanted: &dyn Fn(&Target) -> bool, max: usize) {
        let mut started = 0;
        for (node_name, node) in &self.loaded.inventory.nodes {
            if self.listings.made(node_name.as_str()).is_some() {
                continue;
            }
            for (name, ct) in &node.containers {
                let (container, guest) = container_and_guest(node_name.as_str(), name.as_str(), ct);
                if started == max {
                    return;
                }
                if !wanted(&container)
                    || !wanted(&guest)
                    || self.guest_ssh.made(name.as_str()).is_some()
                {
                    continue;
                }
                let Ok(opts) = ssh::guest_options(self.loaded, name.as_str(), &self.settings)
                else {
                    continue;
                };
                if !crate::transport::ssh::hosts_known(&opts) {
                    continue;
                }
                started += 1;
                let login = std::thread::spawn(move || Pool::open(opts));
                self.ahead
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.to_string(), login);
            }
        }
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
        self.cluster_of(node).is_some()
    }

    /// The cluster the inventory puts node `node` in.
    fn cluster_of(&self, node: &str) -> Option<String> {
        self.loaded
            .inventory
            .nodes
            .iter()
            .find(|(n, _)| n.as_str() == node)
            .and_then(|(_, inv)| inv.cluster.as_ref())
            .map(|c| c.to_string())
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
                let fresh = if created {
                    guest::Fresh::Created
                } else if t.after_reboot.is_some() {
                    guest::Fresh::Rebooted
                } else {
                    guest::Fresh::No
                };
                let transport = self.apply_connect(name, fresh)?;
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

/// The key of container `vmid` of `node` among the GPU views, and its read (also under
/// `root`): one for the primer and the plan's checks.
fn seen_read<'p>(
    node: &str,
    vmid: u64,
    root: &'p str,
    probe: &'p NodeProbe,
) -> (
    String,
    impl FnOnce() -> Result<crate::node::gpu_check::Seen, SessionError> + 'p,
) {
    let read = move || Ok(probe.container_seen(vmid, &[root.to_string()])?);
    (seen_key(node, vmid), read)
}

/// The key of container `vmid` of `node` among the GPU views.
fn seen_key(node: &str, vmid: u64) -> String {
    format!("{node}/{vmid}")
}

/// Guest `name`'s target as `wanted` is asked about it (a target's address is not part of
/// its name).
fn guest_target(name: &str) -> Target {
    Target::Guest {
        name: name.to_string(),
        address: String::new(),
    }
}

/// Container `name` on `node`'s target as `wanted` is asked about it.
fn container_target(node: &str, name: &str, ct: &crate::inventory::container::Container) -> Target {
    Target::Container {
        node: node.to_string(),
        name: name.to_string(),
        vmid: ct.vmid.value,
    }
}

/// The container target and the guest target of container `name` on `node`: what the
/// connections made ahead of a plan ask `wanted` about.
fn container_and_guest(
    node: &str,
    name: &str,
    ct: &crate::inventory::container::Container,
) -> (Target, Target) {
    (container_target(node, name, ct), guest_target(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(what: &str) -> SessionError {
        Diagnostic::new(what.to_string()).into()
    }

    /// A connection made ahead of its first use is that use's; one that failed is
    /// reported by that use, not tried again, and only once.
    #[test]
    fn a_primed_slot_answers_its_next_get_once() {
        let slots: Slots<String> = Slots::default();
        slots.prime("a", || Ok("made ahead".into()));
        let got = slots.get("a", || panic!("connected twice")).unwrap();
        assert_eq!(*got, "made ahead");

        slots.prime("b", || Err(refused("no route to b")));
        let err = slots.get("b", || panic!("tried again")).unwrap_err();
        assert!(err.to_string().contains("no route to b"), "{err}");
        // The failure is told once: the next get tries for itself.
        let again = slots.get("b", || Ok("now".into())).unwrap();
        assert_eq!(*again, "now");

        // A failure no get asked for is forgotten after the plan.
        slots.prime("c", || Err(refused("no route to c")));
        slots.forget_failed_primes();
        assert_eq!(*slots.get("c", || Ok("fresh".into())).unwrap(), "fresh");

        // A prime does not replace what a get made first.
        let first = slots.get("d", || Ok("first".into())).unwrap();
        slots.prime("d", || panic!("primed what was made"));
        assert!(Arc::ptr_eq(
            &first,
            &slots.get("d", || unreachable!()).unwrap()
        ));
    }
}
