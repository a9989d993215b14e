//! From desired state to plan: the desired resources per target (built by [`crate::compile`]),
//! the reads they need batched per target, and the diff that makes the [`Plan`].

pub mod empty_guest;
pub mod error;
pub mod fit;
pub mod node_desired;
pub mod ops;
pub mod reboot;
pub mod reconcile;
pub mod removal;
pub mod schedule;

pub use crate::compile::{Desired, DesiredTarget};
use crate::plan::{Action, Attribute, Change, Plan, PlanMode, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::wire::{Facts, NotRead};

/// Compares each target's desired resources with the facts read for it. Services whose
/// dependencies change are restarted (and health-gated) even if they are running.
pub fn diff_target(desired: &DesiredTarget, facts: &Facts) -> Result<TargetPlan, NotRead> {
    let mut changes: Vec<Change> = Vec::new();
    let mut unchanged = 0;
    let mut warnings = Vec::new();
    for d in &desired.resources {
        let r = d.spec.resource();
        let delta = r.diff(facts)?;
        if delta.is_none() {
            warnings.extend(r.warnings(facts));
        }
        let delta = match (&d.spec, delta) {
            (ResourceSpec::Service(svc), None) => {
                let changed: Vec<&String> = svc
                    .depends_on
                    .iter()
                    .filter(|dep| changes.iter().any(|c| c.spec.address() == **dep))
                    .collect();
                (!changed.is_empty()).then(|| {
                    let mut delta =
                        crate::resources::Delta::new(Action::Update).attr(Attribute::change(
                            "state",
                            Some("running".into()),
                            Some("restarted".into()),
                        ));
                    for dep in changed {
                        delta = delta.reason(format!("restart: {dep} changes"));
                    }
                    delta.typed = Some(crate::resources::Typed::Service {
                        restart: true,
                        wait_first: false,
                    });
                    delta
                })
            }
            (_, delta) => delta,
        };
        match delta {
            // What is no longer declared and already gone (or kept) is not "checked".
            None if matches!(d.spec, ResourceSpec::Removed(_)) => {}
            None => unchanged += 1,
            Some(delta) => changes.push(Change {
                address: desired.address(&d.spec),
                kind: r.kind().to_string(),
                name: r.name(),
                action: delta.action,
                role: d.role.clone(),
                attributes: delta.attributes,
                diff: delta.diff,
                reasons: delta.reasons,
                warnings: r.warnings(facts),
                typed: delta.typed.clone(),
                spec: d.spec.clone(),
            }),
        }
    }
    Ok(TargetPlan {
        changes,
        unchanged,
        warnings,
        ..TargetPlan::empty(desired.target.clone())
    })
}

/// The plan against the empty world of `--offline`: nothing is read.
pub fn offline_plan(inventory: &str, desired: &[DesiredTarget]) -> Plan {
    let targets = desired
        .iter()
        .map(|d| diff_target(d, &Facts::Empty).expect("the empty world answers every probe"))
        .collect();
    Plan::new(inventory, PlanMode::Offline, targets)
}
