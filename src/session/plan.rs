//! A plan read through a session: the desired state computed once with the nodes' live GPU
//! facts, the selected targets read concurrently, then checked against the nodes before
//! anything changes (root-only lines, keyless creates, storages and host directories, a
//! token's privileges) and the GPU checks inside running containers. Only reads, whatever
//! the session: the engine's plan is handed readers alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Api, Session, SessionError, Settings, assumed, gpus, privileges, ssh};
use crate::agent::client::AgentBinary;
use crate::compile::{Library, desired_state};
use crate::diagnostic::Diagnostic;
use crate::engine::schedule::Limits;
use crate::engine::{DesiredTarget, reconcile, removal};
use crate::inventory::Loaded;
use crate::plan::Target;
use crate::printer::Printer;
use crate::timing;

/// What the command line says about reading a plan.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Only these targets (`--target`, as [`select`] reads them); all when empty.
    pub targets: Vec<String>,
    /// The agents re-hash every model file.
    pub verify_full: bool,
    /// Plan deleting model folders no longer declared.
    pub prune_models: bool,
    /// Plan destroying containers this inventory created and no longer declares.
    pub allow_destroy: bool,
    /// Plan stopping the service that holds a model folder whose deletion makes a
    /// download fit (`--allow-downtime`).
    pub allow_downtime: bool,
    /// `--migrate`: refused, not built yet.
    pub migrate: bool,
    /// How many targets are read at once.
    pub limits: Limits,
}

impl<'a, A: Api> Session<'a, A> {
    /// A session on `loaded` with `settings` and this provision's agent binary (hashed once
    /// for the whole run): a [`ReadSession`](super::ReadSession) for `plan` and `check`, a
    /// [`WriteSession`](super::WriteSession) for `apply`.
    pub fn open(
        loaded: &'a Loaded,
        settings: Settings,
        printer: &'a Printer,
    ) -> Result<Self, SessionError> {
        let binary = Arc::new(timing::time("agent binary: load", AgentBinary::current)?);
        Ok(Session::new(loaded, settings, binary, printer))
    }

    /// Reads the selected targets, concurrently as `options.limits` allows, and plans
    /// against those that could be read; the others are returned with their errors.
    /// While the nodes' GPU facts are read, which every read waits for, the reads'
    /// connections are made and the guests read early (see [`Session::prime`]); not when
    /// no facts are read, nor when one target at a time is asked for.
    pub fn plan(
        &self,
        inventory: &str,
        library: &Library,
        options: &ReadOptions,
    ) -> Result<reconcile::PartialPlan, SessionError> {
        let wanted = |t: &Target| selected(t, &options.targets);
        let facts_read = AtomicBool::new(false);
        let waits = options.limits.parallelism > 1 && self.reads_gpu_facts(&wanted);
        if options.limits.parallelism > 1 {
            self.log_in_ahead(&wanted, options.limits.parallelism);
        }
        let planned = std::thread::scope(|s| {
            if waits {
                s.spawn(|| {
                    // The guests' probes, from the inventory alone (see `early`).
                    let early =
                        desired_state(self.loaded(), library, &|_| None).unwrap_or_default();
                    self.prime(&wanted, &early, &facts_read)
                });
            }
            let planned = self.plan_all(inventory, library, options, &facts_read);
            facts_read.store(true, Ordering::Relaxed);
            planned
        });
        self.forget_failed_primes();
        planned
    }

    /// Whether a plan of the targets `wanted` selects reads a node's GPU facts first
    /// (as [`gpus::with_live_gpus`] decides).
    fn reads_gpu_facts(&self, wanted: &dyn Fn(&Target) -> bool) -> bool {
        self.loaded()
            .inventory
            .nodes
            .iter()
            .any(|(node_name, node)| {
                node.ssh.host.is_some()
                    && super::gpus::gpu_containers(node_name.as_str(), node, wanted)
                        .next()
                        .is_some()
            })
    }

    fn plan_all(
        &self,
        inventory: &str,
        library: &Library,
        options: &ReadOptions,
        facts_read: &AtomicBool,
    ) -> Result<reconcile::PartialPlan, SessionError> {
        if options.migrate {
            return Err(Diagnostic::new(
                "--migrate: moving a container between the nodes of a cluster is not built yet; nothing was read or changed",
            )
            .hint(crate::resources::container::MIGRATE_NOT_BUILT)
            .into());
        }
        let loaded = self.loaded();
        let facts = timing::time("gpus: live facts", || {
            gpus::with_live_gpus(library, self, options)
        });
        // What was not made ahead by now the reads make themselves, at once.
        facts_read.store(true, Ordering::Relaxed);
        let (desired, live) = facts?;
        let undeclared = undeclared(&desired, loaded, options);
        let desired = select(desired, &options.targets)?;
        let desired = ssh::with_login_keys(desired, loaded, self.settings());
        self.warn_insecure();
        self.reading(&desired);
        let printer = self.printer;
        // The GPU checks inside the running containers need the nodes' facts, not the
        // plan: they run over the node's SSH while the targets are read (API, guests).
        let (mut read, views) = std::thread::scope(|s| {
            let views = s.spawn(|| {
                timing::time("gpus: checks (alongside the reads)", || {
                    gpus::read_views(&desired, &live, self)
                })
            });
            let read = reconcile::plan(
                inventory,
                &desired,
                options.verify_full,
                &undeclared,
                &options.limits,
                &|d| {
                    printer.status(&format!("reading {}", d.target.heading()));
                    self.reader(d)
                        .map_err(|e| Box::new(e) as crate::engine::error::OpenError)
                },
            );
            (
                read,
                views
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            )
        });
        gpus::refuse_root_only(&read.plan, loaded, self)?;
        ssh::refuse_keyless_creates(&read.plan, loaded, self.settings())?;
        assumed::refuse_missing(&read.plan, loaded, self)?;
        privileges::refuse_missing(&read.plan, loaded, self)?;
        let checked = timing::time("gpus: checks", || {
            gpus::gpu_checks(read.plan, &desired, &live, views, self)
        })?;
        // Last: a container the GPU checks re-planned may reboot too.
        let mut targets = checked.targets;
        crate::engine::reboot::gate_after_reboots(&desired, &mut targets);
        read.plan = crate::plan::Plan::new(&checked.inventory, checked.mode, targets);
        Ok(read)
    }
}

/// The desired targets `targets` selects (all when empty), each named as `--target` spells
/// it; an unknown name is an error.
pub fn select(
    desired: Vec<DesiredTarget>,
    targets: &[String],
) -> Result<Vec<DesiredTarget>, SessionError> {
    if targets.is_empty() {
        return Ok(desired);
    }
    for wanted in targets {
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
        .filter(|d| selected(&d.target, targets))
        .collect())
}

/// Whether `targets` (all when empty) select `target`.
pub(super) fn selected(target: &Target, targets: &[String]) -> bool {
    let (full, short) = target.names();
    targets.is_empty() || targets.iter().any(|w| *w == full || *w == short)
}

/// What the plan does with what is no longer declared: containers this inventory created
/// are looked for on every node in a plan of the whole inventory (none with `--target`,
/// which reads only what it names); every vmid of the inventory counts as declared.
fn undeclared(
    desired: &[DesiredTarget],
    loaded: &Loaded,
    options: &ReadOptions,
) -> removal::Undeclared {
    let containers = |d: &DesiredTarget| match &d.target {
        Target::Container { node, vmid, .. } => Some((node.clone(), *vmid)),
        _ => None,
    };
    let declared: Vec<(String, u64)> = desired.iter().filter_map(containers).collect();
    let nodes: Vec<String> = match options.targets.is_empty() {
        true => loaded
            .inventory
            .nodes
            .keys()
            .map(|n| n.to_string())
            .collect(),
        false => Vec::new(),
    };
    removal::Undeclared {
        prune_models: options.prune_models,
        allow_destroy: options.allow_destroy,
        allow_downtime: options.allow_downtime,
        declared: declared.into_iter().map(|(_, v)| v).collect(),
        nodes,
        owner: super::owner(loaded),
    }
}
