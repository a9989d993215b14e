//! Planning against real targets and applying plans. Reading goes through [`ReadCtx`],
//! which has no way to change a target; only [`apply`] builds a [`WriteCtx`], so `check`
//! and `plan` cannot reach a write path by construction.

use std::collections::HashMap;
use std::time::Instant;

use super::facts::Facts;
use super::{Desired, DesiredTarget, diff_target};
use crate::agent::client::{AgentClient, AgentError, StepOutcome};
use crate::agent::deploy::DeployReport;
use crate::agent::steps::Step;
use crate::diagnostic::Diagnostic;
use crate::plan::{Plan, PlanMode, Target, TargetPlan};
use crate::resources::ResourceSpec;

/// Read access to one target.
pub struct ReadCtx {
    agent: AgentClient,
    verify_full: bool,
}

impl ReadCtx {
    /// Read access through `agent`.
    pub fn new(agent: AgentClient) -> Self {
        ReadCtx {
            agent,
            verify_full: false,
        }
    }

    /// Re-hash model files instead of trusting their verification records.
    pub fn verify_full(mut self, full: bool) -> Self {
        self.verify_full = full;
        self
    }

    /// Answers all `probes` in one request.
    pub fn facts(&self, desired: &DesiredTarget) -> Result<Facts, AgentError> {
        let probes = desired.probes();
        if probes.is_empty() {
            return Ok(Facts::Read(Default::default()));
        }
        self.agent
            .probe_with(&probes, self.verify_full)
            .map(Facts::Read)
    }
}

/// Write access to one target; made only by [`apply`].
struct WriteCtx {
    agent: AgentClient,
}

/// Plans `desired` against what `read` finds on each target.
pub fn plan(
    inventory: &str,
    desired: &[DesiredTarget],
    read: &mut dyn FnMut(&Target) -> anyhow::Result<ReadCtx>,
) -> anyhow::Result<Plan> {
    let mut targets = Vec::new();
    for d in desired {
        let ctx = read(&d.target)?;
        targets.push(read_and_diff(&ctx, d)?);
    }
    Ok(Plan::new(inventory, PlanMode::Online, targets))
}

fn read_and_diff(ctx: &ReadCtx, desired: &DesiredTarget) -> anyhow::Result<TargetPlan> {
    let facts = ctx.facts(desired)?;
    Ok(diff_target(desired, &facts)?)
}

/// What one target's apply did.
#[derive(Debug, Clone)]
pub struct TargetOutcome {
    /// The target.
    pub target: Target,
    /// Each step run, in order.
    pub steps: Vec<StepOutcome>,
    /// How long the target took, steps and verification.
    pub millis: u64,
}

/// How to apply.
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions {
    /// Roll a service back to its last healthy unit when the health gate fails.
    pub rollback: bool,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions { rollback: true }
    }
}

/// Executes exactly `plan`: every change's steps on its target, in order, then reads the
/// changed resources again and fails unless they now match. Nothing runs if any change
/// is of a kind that cannot be applied yet.
pub fn apply(
    plan: &Plan,
    options: ApplyOptions,
    connect: &mut dyn FnMut(&Target) -> anyhow::Result<AgentClient>,
    on_step: &mut dyn FnMut(&Target, &StepOutcome),
) -> anyhow::Result<Vec<TargetOutcome>> {
    let mut work: Vec<(&TargetPlan, Vec<Step>)> = Vec::new();
    let mut unsupported = Vec::new();
    for t in &plan.targets {
        let mut steps = Vec::new();
        let mut preflights = preflights_of(t);
        for c in &t.changes {
            // A service's preflight runs before its unit is written, or before its deploy
            // when the unit itself does not change: a refused argv changes nothing.
            let key = match &c.spec {
                ResourceSpec::File(f) => Some(f.path.clone()),
                ResourceSpec::Service(svc) => Some(svc.unit_path.clone()),
                _ => None,
            };
            if let Some(step) = key.and_then(|k| preflights.remove(&k)) {
                steps.push(step);
            }
            match c.spec.resource().steps(c) {
                Ok(s) => steps.extend(s.into_iter().map(|mut step| {
                    if let Step::DeployService(d) = &mut step {
                        d.rollback = options.rollback;
                    }
                    step
                })),
                Err(why) => unsupported.push(format!("{}: {why}", c.address)),
            }
        }
        if !t.changes.is_empty() {
            work.push((t, steps));
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
    let mut outcomes = Vec::new();
    let mut degraded: Vec<(String, String, String, Vec<String>)> = Vec::new();
    for (t, steps) in work {
        let started = Instant::now();
        let ctx = WriteCtx {
            agent: connect(&t.target)?,
        };
        let results = ctx.agent.apply(&steps)?;
        for r in &results {
            on_step(&t.target, r);
        }
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
        // reported as degraded below, not as a failed write.
        let mut skip: Vec<String> = Vec::new();
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
        verify(&ctx, t, &skip)?;
        outcomes.push(TargetOutcome {
            target: t.target.clone(),
            steps: results,
            millis: started.elapsed().as_millis() as u64,
        });
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

/// Where the inventory declared the service a step is for, when it was built from it.
fn declared_at(step: &Step) -> Option<String> {
    match step {
        Step::Preflight(s) => s.declared.at(""),
        Step::DeployService(d) => d.service.declared.at(""),
        _ => None,
    }
}

/// The preflight steps of the services this target plan (re)starts, by unit file.
fn preflights_of(t: &TargetPlan) -> HashMap<String, Step> {
    t.changes
        .iter()
        .filter_map(|c| match &c.spec {
            ResourceSpec::Service(svc) if c.attributes.iter().any(|a| a.name != "enabled") => svc
                .preflight
                .is_some()
                .then(|| (svc.unit_path.clone(), Step::Preflight(svc.clone()))),
            _ => None,
        })
        .collect()
}

/// Reads the changed resources again: an apply that did not converge is an error.
fn verify(ctx: &WriteCtx, t: &TargetPlan, skip: &[String]) -> anyhow::Result<()> {
    let desired = DesiredTarget {
        target: t.target.clone(),
        resources: t
            .changes
            .iter()
            .filter(|c| !skip.contains(&c.spec.address()))
            .map(|c| Desired {
                spec: c.spec.clone(),
                role: c.role.clone(),
            })
            .collect(),
    };
    let facts = ctx.agent.probe(&desired.probes()).map(Facts::Read)?;
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
