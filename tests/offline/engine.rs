//! The engine's pure functions without a target: the diff of a target against the empty
//! world, the order of a plan's targets, and the operations `ops_of` derives from a target
//! plan (what apply runs, from the plan alone), and a saved plan refused when its target no
//! longer reads as it did. llm-two's real inventory is the input.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use provision::access::{AccessError, ApiOp, NodeOp, Op, OpOutcome, TargetReader, TargetWriter};
use provision::engine::ops::ops_of;
use provision::engine::reconcile::{self, ApplyOptions};
use provision::engine::schedule::Limits;
use provision::engine::{DesiredTarget, diff_target, offline_plan};
use provision::plan::{Action, Plan, Target, TargetPlan};
use provision::resources::ResourceSpec;
use provision::resources::file::{PathFact, PathKind};
use provision::resources::wire::{Fact, Facts, Probe, Step};

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
        let write = ops
            .iter()
            .position(|o| matches!(o, Op::Guest(Step::WriteFile { path, .. }) if *path == unit))
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

/// A guest's world for the engine: every probe of llm-two's guest files answered "absent"
/// (the managed record too), but for `present`, found holding one byte. `ran` counts the
/// operations handed to `run` (nothing runs on a stale plan).
struct World {
    present: Option<Probe>,
    ran: Arc<AtomicUsize>,
}

impl TargetReader for World {
    fn describe(&self) -> String {
        "a guest in memory".into()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        let answers = probes.iter().map(|p| {
            let fact = match p {
                _ if Some(p) == self.present.as_ref() => Fact::Path(Some(PathFact {
                    kind: PathKind::File,
                    mode: 0o644,
                    owner: "root".into(),
                    group: "root".into(),
                    size: 1,
                    sha256: Some(
                        "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb".into(),
                    ),
                    content: Some("a".into()),
                })),
                Probe::Path { .. } => Fact::Path(None),
                Probe::Managed {} => Fact::Managed(None),
                other => panic!("a file-only guest has no probe {other:?}"),
            };
            (p.clone(), fact)
        });
        Ok(Facts::Read(answers.collect()))
    }
}

impl TargetWriter for World {
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        self.ran.fetch_add(ops.len(), Ordering::SeqCst);
        Ok(Vec::new())
    }
}

/// llm-two's first guest with only its files: probes the [`World`] can answer.
fn files_only() -> DesiredTarget {
    let mut d = llm_two()
        .into_iter()
        .find(|d| matches!(d.target, Target::Guest { .. }))
        .expect("llm-two has a guest");
    d.resources
        .retain(|r| matches!(r.spec, ResourceSpec::File(_)));
    assert!(!d.resources.is_empty(), "llm-two's guest writes files");
    d
}

/// Applies `plan` as a saved plan against a world where `present` now holds something;
/// the error and how many operations ran.
fn apply_saved(plan: &Plan, present: Option<Probe>) -> (String, usize) {
    let ran = Arc::new(AtomicUsize::new(0));
    let err = reconcile::apply(
        plan,
        ApplyOptions {
            saved: true,
            ..ApplyOptions::default()
        },
        &Limits::serial(),
        &|_| {
            Ok(Box::new(World {
                present: present.clone(),
                ran: ran.clone(),
            }))
        },
        &|_, _| {},
    )
    .err()
    .map(|e| provision::diagnostic::one_line(&e))
    .unwrap_or_default();
    (err, ran.load(Ordering::SeqCst))
}

#[test]
fn a_saved_plan_whose_read_stamp_no_longer_matches_is_refused_before_anything_runs() {
    let d = files_only();
    let read = reconcile::plan(
        "inventory/llm-two.yaml",
        std::slice::from_ref(&d),
        false,
        false,
        &Limits::serial(),
        &|_| {
            Ok(Box::new(World {
                present: None,
                ran: Arc::default(),
            }))
        },
    );
    let plan = read.whole().expect("the world answers every probe");
    let stamp = plan.targets[0].read.clone().expect("a read stamp");
    assert!(plan.summary.has_changes(), "every file is to create");
    // Saved and read back, as `plan --out` and `apply FILE` do.
    let plan: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();

    // One of the files appeared since: the read stamp differs, nothing runs.
    let file = stamp
        .probes
        .iter()
        .find(|p| matches!(p, Probe::Path { .. }))
        .cloned();
    let (err, ran) = apply_saved(&plan, file);
    assert!(
        err.contains("the saved plan is stale; nothing was changed"),
        "{err}"
    );
    assert!(err.contains("changed since the plan was made"), "{err}");
    assert_eq!(ran, 0, "an operation ran on a stale plan");

    // The same world as at plan time: not stale, the plan's operations are handed over.
    let (err, ran) = apply_saved(&plan, None);
    assert!(!err.contains("stale"), "{err}");
    assert!(ran > 0, "the plan's operations ran: {err}");
}
