//! The engine's pure functions without a target: the diff of a target against the empty
//! world, the order of a plan's targets, and the operations `ops_of` derives from a target
//! plan (what apply runs, from the plan alone). llm-two's real inventory is the input.

use std::path::Path;

use provision::access::{ApiOp, NodeOp, Op};
use provision::engine::ops::ops_of;
use provision::engine::reconcile::ApplyOptions;
use provision::engine::{DesiredTarget, diff_target, offline_plan};
use provision::plan::{Action, Plan, Target, TargetPlan};
use provision::resources::ResourceSpec;
use provision::resources::wire::{Facts, Step};

fn llm_two() -> Vec<DesiredTarget> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    provision::cli::prepare(&root.join("inventory/llm-two.yaml"))
        .unwrap()
        .desired
}

fn plan() -> Plan {
    offline_plan("inventory/llm-two.yaml", &llm_two())
}

fn target(plan: &Plan, kind: fn(&Target) -> bool) -> &TargetPlan {
    plan.targets
        .iter()
        .find(|t| kind(&t.target))
        .expect("llm-two has such a target")
}

/// What an operation is, in a word, for comparing orders.
fn word(op: &Op) -> String {
    match op {
        Op::Api(ApiOp::Container { action, start, .. }) => {
            format!("container {action:?} start={start}")
        }
        Op::Api(ApiOp::Start { reboot, .. }) => format!("start reboot={reboot}"),
        Op::Api(ApiOp::Template { .. }) => "template".into(),
        Op::Node(NodeOp::Lines { .. }) => "lines".into(),
        Op::Guest(step) => format!("guest {}", step.describe()),
        _ => format!("{op:?}"),
    }
}

#[test]
fn the_empty_world_is_everything_to_create_and_the_diff_is_deterministic() {
    for d in llm_two() {
        let t = diff_target(&d, &Facts::Empty).unwrap();
        assert_eq!(
            t.changes.len() + t.unchanged,
            d.resources.len(),
            "{:?}",
            d.target
        );
        // A node is never empty: its driver is found "not loaded" (an update), not absent.
        if !matches!(d.target, Target::Node { .. }) {
            assert_eq!(t.unchanged, 0, "{:?}", d.target);
            assert!(
                t.changes.iter().all(|c| c.action == Action::Create),
                "{:?}",
                d.target
            );
        }
        assert_eq!(t, diff_target(&d, &Facts::Empty).unwrap());
    }
}

#[test]
fn a_container_is_planned_before_its_guest() {
    let plan = plan();
    for (i, t) in plan.targets.iter().enumerate() {
        let Target::Guest { name, .. } = &t.target else {
            continue;
        };
        let container = plan
            .targets
            .iter()
            .position(|c| matches!(&c.target, Target::Container { name: n, .. } if n == name))
            .expect("a guest's container is a target");
        assert!(
            container < i,
            "{name}: container at {container}, guest at {i}"
        );
    }
}

#[test]
fn a_new_gpu_container_is_created_stopped_then_gets_its_lines_then_starts() {
    let plan = plan();
    let t = target(&plan, |t| matches!(t, Target::Container { .. }));
    assert!(
        t.changes
            .iter()
            .any(|c| matches!(c.spec, ResourceSpec::PveLines(_))),
        "llm-two passes GPUs through"
    );
    let mut unsupported = Vec::new();
    let ops = ops_of(t, &ApplyOptions::default(), &mut unsupported);
    assert!(unsupported.is_empty(), "{unsupported:?}");
    let words: Vec<String> = ops.iter().map(word).collect();
    let lines = t
        .changes
        .iter()
        .filter(|c| matches!(c.spec, ResourceSpec::PveLines(_)))
        .count();
    let mut want = vec!["container Create start=false".to_string()];
    want.extend(std::iter::repeat_n("lines".to_string(), lines));
    want.push("start reboot=true".into());
    assert_eq!(words, want);
}

#[test]
fn a_services_preflight_runs_before_its_unit_is_written() {
    let plan = plan();
    let t = target(&plan, |t| matches!(t, Target::Guest { .. }));
    let mut unsupported = Vec::new();
    let ops = ops_of(t, &ApplyOptions::default(), &mut unsupported);
    let units: Vec<String> = t
        .changes
        .iter()
        .filter_map(|c| match &c.spec {
            ResourceSpec::Service(s) if s.preflight.is_some() => Some(s.unit_path.clone()),
            _ => None,
        })
        .collect();
    assert!(!units.is_empty(), "llm-two's services have a preflight");
    for unit in units {
        let preflight = ops
            .iter()
            .position(|o| matches!(o, Op::Guest(Step::Preflight(s)) if s.unit_path == unit))
            .unwrap_or_else(|| panic!("no preflight for {unit}"));
        // The unit of a service on a new generation is written by the switch itself.
        let write = ops
            .iter()
            .position(|o| match o {
                Op::Guest(Step::WriteFile { path, .. }) => *path == unit,
                Op::Guest(Step::SwitchGeneration { units, .. }) => {
                    units.iter().any(|u| u.path == unit)
                }
                _ => false,
            })
            .unwrap_or_else(|| panic!("no write of {unit}"));
        assert!(
            preflight < write,
            "{unit}: preflight at {preflight}, write at {write}"
        );
    }
    // Every deploy carries the apply's rollback choice.
    let no_rollback = ApplyOptions {
        rollback: false,
        ..ApplyOptions::default()
    };
    let ops = ops_of(t, &no_rollback, &mut unsupported);
    let deploys: Vec<bool> = ops
        .iter()
        .filter_map(|o| match o {
            Op::Guest(Step::DeployService(d)) => Some(d.rollback),
            _ => None,
        })
        .collect();
    assert!(
        !deploys.is_empty() && deploys.iter().all(|r| !r),
        "{deploys:?}"
    );
}
