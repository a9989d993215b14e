//! Planning against real targets and applying plans. [`plan`] is handed only
//! [`TargetReader`]s, which have no way to change a target; only [`apply`] is handed
//! [`TargetWriter`]s, so `check` and `plan` cannot reach a write path by construction.

use std::sync::Mutex;
use std::time::Instant;

use super::error::{EngineError, OpenError};
use super::ops::ops_of;
use super::schedule::{self, Follow, Limits, Outcome, Skipped};
use super::{Desired, DesiredTarget, diff_target, removal};
use crate::access::{Op, OpOutcome, TargetReader, TargetWriter};
use crate::diagnostic::Diagnostic;
use crate::plan::{Action, Plan, PlanMode, ReadStamp, Target, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::service::deploy::DeployReport;
use crate::resources::wire::Step;
use crate::timing;

/// Opens read access to one target (called from several threads at once).
pub type Read<'a> = dyn Fn(&DesiredTarget) -> Result<Box<dyn TargetReader>, OpenError> + Sync + 'a;
/// Opens write access to one target (called from several threads at once).
pub type Connect<'a> = dyn Fn(&TargetPlan) -> Result<Box<dyn TargetWriter>, OpenError> + Sync + 'a;

/// A plan of the targets that could be read, and why the others could not.
pub struct PartialPlan {
    /// The plan of every target read.
    pub plan: Plan,
    /// The targets not read, in inventory order, each with its error.
    pub failures: Vec<(Target, EngineError)>,
}

impl PartialPlan {
    /// The plan, or one error naming every target that could not be read.
    pub fn whole(self) -> Result<Plan, EngineError> {
        if self.failures.is_empty() {
            return Ok(self.plan);
        }
        let total = self.plan.targets.len() + self.failures.len();
        Err(many_failed("reading", self.failures, Vec::new(), total))
    }
}

/// Plans `desired` against what `read` finds on each target, reading targets concurrently
/// as `limits` allow (a container and its guest at the same time: the caller's session
/// plans the guest from the node's listing, shared with the container's read). A target that
/// cannot be read does not keep the others from being planned unless `limits.fail_fast`.
/// `verify_full`: the readers re-hash model files, recorded in the plan so a saved plan is
/// re-read the same way. `undeclared`: what is done with what the inventory no longer
/// declares (model folders, containers provision created on the listed nodes).
pub fn plan(
    inventory: &str,
    desired: &[DesiredTarget],
    verify_full: bool,
    undeclared: &removal::Undeclared,
    limits: &Limits,
    read: &Read,
) -> PartialPlan {
    let targets: Vec<&Target> = desired.iter().map(|d| &d.target).collect();
    // A job per declared target, then a scan per node for the containers this inventory
    // created and no longer declares, scheduled as reads of that node's API: with room,
    // the scans run beside the reads instead of after them.
    let mut jobs = schedule::read_jobs(&targets);
    jobs.extend(undeclared.nodes.iter().map(|node| schedule::Job {
        node: Some(node.clone()),
        ..Default::default()
    }));
    let results = schedule::run(
        &jobs,
        limits,
        Follow::Always,
        &|i| match desired.get(i) {
            Some(d) => Job::Read(Box::new(read_one(d, verify_full, undeclared, read))),
            None => Job::Scan(removal::scan(
                &undeclared.nodes[i - desired.len()],
                undeclared,
                read,
            )),
        },
        &|r| match r {
            Job::Read(r) => r.is_err(),
            Job::Scan((_, unread)) => !unread.is_empty(),
        },
    );
    let mut planned = Vec::new();
    let mut failures = Vec::new();
    let mut gone = Vec::new();
    let mut unread = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        let target = || match desired.get(i) {
            Some(d) => d.target.clone(),
            None => removal::lister(&undeclared.nodes[i - desired.len()]).target,
        };
        match r {
            Outcome::Ran(Job::Read(r)) => match *r {
                Ok(t) => planned.push(t),
                Err(e) => failures.push((target(), e)),
            },
            Outcome::Ran(Job::Scan((p, f))) => {
                gone.extend(p);
                unread.extend(f);
            }
            Outcome::Skipped(why) => failures.push((
                target(),
                EngineError::NotReached(skip_reason(why, &targets)),
            )),
        }
    }
    super::node_desired::note_rebuilds(desired, &mut planned);
    super::empty_guest::replan_replaced_guests(desired, &mut planned);
    planned.extend(gone);
    failures.extend(unread);
    PartialPlan {
        plan: Plan::new(inventory, PlanMode::Online, planned),
        failures,
    }
}

/// What one job of [`plan`] did.
enum Job {
    /// A declared target read and planned.
    Read(Box<Result<TargetPlan, EngineError>>),
    /// A node scanned for undeclared containers: their plans, and what could not be read.
    Scan(removal::Scanned),
}

/// Reads and plans one declared target.
fn read_one(
    d: &DesiredTarget,
    verify_full: bool,
    undeclared: &removal::Undeclared,
    read: &Read,
) -> Result<TargetPlan, EngineError> {
    let prune_models = undeclared.prune_models;
    let reader =
        timing::time("open target (includes login, ssh)", || read(d)).map_err(EngineError::Open)?;
    let (d, facts, probes) = timing::time(read_phase(&d.target), || {
        removal::read_target(d, reader.as_ref(), prune_models)
    })?;
    let mut target = timing::time("diff", || diff_target(&d, &facts))?;
    let ways = super::fit::Ways {
        prune_models,
        allow_downtime: undeclared.allow_downtime,
    };
    timing::time("fit (hub listing)", || {
        super::fit::check(&d, &facts, &mut target, ways, &super::fit::listed)
    })?;
    target.not_read = reader.not_read();
    stamp(&mut target, &d, &facts, probes, verify_full, prune_models)?;
    Ok(target)
}

/// The phase name of reading one target's facts.
fn read_phase(t: &Target) -> &'static str {
    match t {
        Target::Node { .. } => "read node (API, agent over SSH)",
        Target::Container { .. } => "read container (API)",
        Target::Guest { .. } => "read guest (agent: push if new, start, probes)",
    }
}

/// What one target's apply did.
#[derive(Debug, Clone)]
pub struct TargetOutcome {
    /// The target.
    pub target: Target,
    /// Each operation run, in order.
    pub steps: Vec<OpOutcome>,
    /// How long the target took, steps and verification.
    pub millis: u64,
}

/// How to apply.
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions {
    /// Roll a service back to its last healthy unit when the health gate fails.
    pub rollback: bool,
    /// The plan was saved earlier: read each target again first and refuse the whole plan
    /// if any answer differs from what the plan was made from.
    pub saved: bool,
    /// Destroy and recreate a container whose create-only settings changed.
    pub allow_replace: bool,
    /// Run a planned NVIDIA driver install (a reboot follows).
    pub install_driver: bool,
    /// Destroy a container provision created that is no longer declared.
    pub allow_destroy: bool,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            rollback: true,
            saved: false,
            allow_replace: false,
            install_driver: false,
            allow_destroy: false,
        }
    }
}

/// Executes exactly `plan`: every change's steps on its target, in order, then reads the
/// changed resources again and fails unless they now match. Nothing runs if any change
/// is of a kind that cannot be applied yet. Independent targets run concurrently as
/// `limits` allow; a target whose container failed is not touched, and one target failing
/// stops the others only with `limits.fail_fast`. Each target's step outcomes reach
/// `on_step` together, never between another target's.
pub fn apply(
    plan: &Plan,
    options: ApplyOptions,
    limits: &Limits,
    connect: &Connect,
    on_step: &(dyn Fn(&Target, &OpOutcome) + Sync),
) -> Result<Vec<TargetOutcome>, EngineError> {
    // A plan made against an empty world is refused whole, before anything else is judged.
    if plan.mode == PlanMode::Offline && plan.targets.iter().any(|t| !t.changes.is_empty()) {
        return Err(Diagnostic::new(
            "this plan was made with --offline against an empty world; nothing was changed",
        )
        .hint("make a plan that reads the targets: `provision plan --out FILE INVENTORY`")
        .into());
    }
    let mut work: Vec<(&TargetPlan, Vec<Op>)> = Vec::new();
    let mut unsupported = Vec::new();
    for t in &plan.targets {
        if let Some((moved, on, declared)) = t.changes.iter().find_map(|c| match &c.typed {
            Some(crate::resources::Typed::Moved { on, declared }) => Some((c, on, declared)),
            _ => None,
        }) {
            return Err(Diagnostic::new(format!(
                "{} runs on node `{on}` but is declared on node `{declared}`; nothing was changed",
                moved.address,
            ))
            .hint(crate::resources::container::MIGRATE_NOT_BUILT)
            .into());
        }
        if let Some(refused) = t
            .changes
            .iter()
            .find(|c| matches!(c.spec, ResourceSpec::Container(_)) && c.action == Action::Replace)
            && !options.allow_replace
        {
            return Err(Diagnostic::new(format!(
                "{} must be replaced (a create-only setting changed); nothing was changed",
                refused.address
            ))
            .hint("replacing destroys the container's own volumes (host bind mounts are kept); pass --allow-replace to go ahead")
            .into());
        }
        if let Some(c) = t
            .changes
            .iter()
            .find(|c| removal::destroys_container(&c.spec).is_some())
            && !options.allow_destroy
        {
            let mut d = Diagnostic::new(format!(
                "{} was created by provision and is no longer declared; destroying it needs --allow-destroy; nothing was changed",
                c.address
            ));
            for w in &c.warnings {
                d = d.cause(w.clone());
            }
            return Err(d.hint("pass --allow-destroy to stop and destroy it (its own volumes; bind-mounted host paths are kept), or stop it to keep it (a stopped one is only named)")
            .into());
        }
        if let Some((c, why)) = t.changes.iter().find_map(|c| match (&c.spec, &c.typed) {
            (ResourceSpec::Model(_), Some(crate::resources::Typed::Conflict { why })) => {
                Some((c, why))
            }
            _ => None,
        }) {
            return Err(Diagnostic::new(format!(
                "{}: the download {why}; nothing was changed",
                c.address
            ))
            .hint("the model it replaces keeps serving while it downloads, so both must fit; `provision plan` shows the numbers")
            .into());
        }
        if !t.changes.is_empty() {
            work.push((t, ops_of(t, &options, &mut unsupported)));
        }
    }
    if !unsupported.is_empty() {
        let mut d = Diagnostic::new("this plan cannot be applied yet; nothing was changed");
        for u in unsupported {
            d = d.cause(u);
        }
        return Err(d
            .hint("apply the parts that can be with `--target guest.<name>`")
            .into());
    }
    if options.saved {
        refuse_stale(&work, limits, connect)?;
    }
    // One target's step lines are printed together, never between another's.
    let printing = Mutex::new(());
    let targets: Vec<&Target> = work.iter().map(|(t, _)| &t.target).collect();
    let results = schedule::run(
        &schedule::jobs(&targets),
        limits,
        Follow::OnSuccess,
        &|i| {
            let (t, ops) = &work[i];
            let writer = connect(t).map_err(EngineError::Open)?;
            let report = |results: &[OpOutcome]| {
                let _held = printing.lock().unwrap_or_else(|p| p.into_inner());
                for r in results {
                    on_step(&t.target, r);
                }
            };
            if t.not_read.is_none() {
                return apply_target(t, ops, writer.as_ref(), &report);
            }
            // Not read at plan time (its container was stopped; it runs now): read it,
            // and carry out only what differs.
            let now = read_again(t, writer.as_ref())?;
            let mut unsupported = Vec::new();
            let ops = ops_of(&now, &options, &mut unsupported);
            if let Some(u) = unsupported.first() {
                return Err(Diagnostic::new(format!("{}: {u}", t.target.heading())).into());
            }
            apply_target(&now, &ops, writer.as_ref(), &report)
        },
        &|r| r.is_err(),
    );
    let mut outcomes = Vec::new();
    let mut degraded: Vec<Degraded> = Vec::new();
    let mut failures: Vec<(Target, EngineError)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for (result, (t, _)) in results.into_iter().zip(&work) {
        match result {
            Outcome::Ran(Ok((outcome, d))) => {
                outcomes.push(outcome);
                degraded.extend(d);
            }
            Outcome::Ran(Err(e)) => failures.push((t.target.clone(), e)),
            Outcome::Skipped(why) => skipped.push(format!(
                "{}: not applied ({})",
                t.target.heading(),
                skip_reason(why, &targets)
            )),
        }
    }
    if !failures.is_empty() {
        return Err(many_failed("apply", failures, skipped, work.len()));
    }
    if !degraded.is_empty() {
        let mut d = Diagnostic::new(format!(
            "{} service(s) run DEGRADED: the inventory's configuration failed its health gate and a fallback is serving",
            degraded.len()
        ));
        for (target, unit, name, notes) in &degraded {
            d = d.cause(format!("{unit} on {target} runs fallback `{name}`"));
            for n in notes {
                d = d.cause(format!("  {n}"));
            }
        }
        return Err(d
            .hint("the service answers requests; `provision check` reports the difference until the inventory's configuration works")
            .into());
    }
    Ok(outcomes)
}

/// `t` planned again from what `reader` reads now: its declared resources are the
/// changes it was planned with against the empty world.
fn read_again(t: &TargetPlan, reader: &dyn TargetReader) -> Result<TargetPlan, EngineError> {
    let desired = DesiredTarget {
        target: t.target.clone(),
        resources: t
            .changes
            .iter()
            .map(|c| Desired {
                spec: c.spec.clone(),
                role: c.role.clone(),
            })
            .collect(),
    };
    let (verify_full, prune_models) = t
        .read
        .as_ref()
        .map_or((false, false), |r| (r.verify_full, r.prune_models));
    let (desired, facts, probes) = removal::read_target(&desired, reader, prune_models)?;
    let mut now = diff_target(&desired, &facts)?;
    stamp(
        &mut now,
        &desired,
        &facts,
        probes,
        verify_full,
        prune_models,
    )?;
    Ok(now)
}

/// Records in `target`'s plan what its guest's record will hold and how it was read (the
/// digest of the answers to `probes`, which a saved plan's apply compares).
fn stamp(
    target: &mut TargetPlan,
    d: &DesiredTarget,
    facts: &crate::resources::wire::Facts,
    probes: Vec<crate::resources::wire::Probe>,
    verify_full: bool,
    prune_models: bool,
) -> Result<(), EngineError> {
    target.manages = removal::record(d, facts);
    target.read = Some(ReadStamp {
        digest: facts.digest(&probes)?,
        probes,
        verify_full,
        prune_models,
    });
    Ok(())
}

/// A service that runs a fallback: target, unit, fallback name, notes.
type Degraded = (String, String, String, Vec<String>);

/// Runs one target's operations and verifies them; `report` gets the outcomes of those
/// that ran, in order, before any error is returned.
fn apply_target(
    t: &TargetPlan,
    steps: &[Op],
    writer: &dyn TargetWriter,
    report: &dyn Fn(&[OpOutcome]),
) -> Result<(TargetOutcome, Vec<Degraded>), EngineError> {
    let started = Instant::now();
    let results = writer.run(steps)?;
    report(&results);
    if let Some((index, failed)) = results.iter().enumerate().find(|(_, r)| r.error.is_some()) {
        let mut d = Diagnostic::new(format!(
            "{} failed on {}",
            failed.description,
            t.target.heading()
        ))
        .cause(failed.error.clone().unwrap_or_default());
        // A service built from the inventory says where it was declared.
        if let Some(at) = steps.get(index).and_then(declared_at) {
            d = d.cause(format!("the service is declared at {at}"));
        }
        return Err(d
            .hints(failed.hints.iter().cloned())
            .hint("fix the cause and run apply again: steps already done are not repeated")
            .into());
    }
    if results.len() < steps.len() {
        return Err(Diagnostic::new(format!(
            "the agent on {} stopped after {} of {} steps",
            t.target.heading(),
            results.len(),
            steps.len()
        ))
        .into());
    }
    // A service that runs a fallback differs from the inventory on purpose: it is
    // reported as degraded, not as a failed write.
    let mut skip: Vec<String> = Vec::new();
    let mut degraded = Vec::new();
    for r in &results {
        let report = r
            .detail
            .as_ref()
            .and_then(|v| serde_json::from_value::<DeployReport>(v.clone()).ok());
        if let Some(DeployReport {
            degraded: Some(name),
            notes,
            unit,
            ..
        }) = report
        {
            if let Some(c) = t
                .changes
                .iter()
                .find(|c| matches!(&c.spec, ResourceSpec::Service(s) if s.unit == unit))
            {
                if let ResourceSpec::Service(s) = &c.spec {
                    skip.push(format!("file:{}", s.unit_path));
                }
                skip.push(c.spec.address());
            }
            degraded.push((t.target.heading(), unit, name, notes));
        }
    }
    // The Proxmox module reads a container back itself and fails unless it converged.
    if !matches!(t.target, Target::Container { .. }) {
        verify(writer, t, &skip)?;
    }
    Ok((
        TargetOutcome {
            target: t.target.clone(),
            steps: results,
            millis: started.elapsed().as_millis() as u64,
        },
        degraded,
    ))
}

/// Why a job was skipped, in words.
fn skip_reason(why: Skipped, targets: &[&Target]) -> String {
    match why {
        Skipped::FailFast => "--fail-fast: another target failed first".into(),
        Skipped::After(i) => format!("{} failed", targets[i].names().0),
    }
}

/// The error for a run where some targets failed: the one error itself when it is all
/// there is, else every target's error (and those not reached) in one diagnostic.
fn many_failed(
    what: &str,
    mut failures: Vec<(Target, EngineError)>,
    skipped: Vec<String>,
    total: usize,
) -> EngineError {
    if failures.len() == 1 && skipped.is_empty() && total == 1 {
        return failures.remove(0).1;
    }
    let mut d = Diagnostic::new(format!(
        "{what} failed on {} of {total} target(s)",
        failures.len()
    ));
    for (target, e) in &failures {
        d = d.cause(format!(
            "{}: {}",
            target.heading(),
            crate::diagnostic::one_line(e)
        ));
    }
    for s in skipped {
        d = d.cause(s);
    }
    d.hint("the other targets were done; fix the causes and run again: steps already done are not repeated")
        .into()
}

/// Reads every target of a saved plan again (concurrently); any answer that differs from
/// what the plan was made from refuses the whole plan before anything runs, as a stale
/// saved plan must.
fn refuse_stale(
    work: &[(&TargetPlan, Vec<Op>)],
    limits: &Limits,
    connect: &Connect,
) -> Result<(), EngineError> {
    let targets: Vec<&Target> = work.iter().map(|(t, _)| &t.target).collect();
    let reads = schedule::run(
        &schedule::jobs(&targets),
        &Limits {
            fail_fast: false,
            ..*limits
        },
        Follow::Always,
        &|i| -> Result<Option<String>, EngineError> {
            let t = work[i].0;
            let Some(stamp) = &t.read else {
                return Ok(Some(format!(
                    "{}: the plan does not record what it read",
                    t.target.heading()
                )));
            };
            // A guest planned as new on a container this plan creates or replaces: the
            // container's own read says whether that still holds; there is no guest yet.
            // One not read (a stopped container) is read when apply has started it.
            if t.not_read.is_some() {
                return Ok(None);
            }
            if super::empty_guest::starts_empty(&t.target, work.iter().map(|(p, _)| *p))
                && super::empty_guest::read_empty(stamp)
            {
                return Ok(None);
            }
            // Read before anything runs: a guest whose container the plan reboots is
            // still on the plan's connection.
            let before = t.after_reboot.map(|_| TargetPlan {
                after_reboot: None,
                ..t.clone()
            });
            let facts = connect(before.as_ref().unwrap_or(t))
                .map_err(EngineError::Open)?
                .read(&stamp.probes)?;
            if facts.digest(&stamp.probes)? != stamp.digest {
                return Ok(Some(format!(
                    "{} changed since the plan was made",
                    t.target.heading()
                )));
            }
            // The free space is not in the digest: the downloads are checked against it.
            Ok(super::fit::still_fits(t, &facts, &super::fit::listed)?
                .map(|why| format!("{}: {why}", t.target.heading())))
        },
        &|r| r.is_err(),
    );
    let mut stale = Vec::new();
    for r in reads {
        match r {
            Outcome::Ran(r) => stale.extend(r?),
            Outcome::Skipped(_) => unreachable!("reads neither fail fast nor skip"),
        }
    }
    if stale.is_empty() {
        return Ok(());
    }
    let mut d = Diagnostic::new("the saved plan is stale; nothing was changed");
    for s in stale {
        d = d.cause(s);
    }
    Err(d
        .hint("make a new plan with `provision plan --out FILE` and review it")
        .into())
}

/// Where the inventory declared the service a step is for, when it was built from it.
fn declared_at(op: &Op) -> Option<String> {
    match op {
        Op::Guest(Step::Preflight(s)) => s.declared.at(""),
        Op::Guest(Step::DeployService(d)) => d.service.declared.at(""),
        _ => None,
    }
}

/// Reads the changed resources again: an apply that did not converge is an error.
fn verify(writer: &dyn TargetWriter, t: &TargetPlan, skip: &[String]) -> Result<(), EngineError> {
    let desired = DesiredTarget {
        target: t.target.clone(),
        resources: t
            .changes
            .iter()
            .enumerate()
            // A service `--allow-downtime` stopped first is deployed again further on: its
            // later change says what it is now, not the stop.
            .filter(|(i, c)| {
                !(matches!(c.spec, crate::resources::ResourceSpec::Removed(_))
                    && t.changes[i + 1..].iter().any(|l| l.address == c.address))
            })
            .map(|(_, c)| c)
            .filter(|c| !skip.contains(&c.spec.address()))
            .map(|c| Desired {
                spec: c.spec.clone(),
                role: c.role.clone(),
            })
            .collect(),
    };
    let facts = writer.read(&desired.probes())?;
    let after = diff_target(&desired, &facts)?;
    // A service restarted because a dependency changed shows up as changed again only
    // through that dependency, which is now in place; anything left differs for real.
    if let Some(c) = after.changes.first() {
        let mut d = Diagnostic::new(format!(
            "{} still differs after apply on {}",
            c.address,
            t.target.heading()
        ));
        for a in &c.attributes {
            d = d.cause(format!(
                "{}: {} instead of {}",
                a.name,
                a.before.as_deref().unwrap_or("absent"),
                a.after.as_deref().unwrap_or("absent")
            ));
        }
        return Err(d
            .hint("the step ran without error but the target does not show its effect")
            .into());
    }
    Ok(())
}
