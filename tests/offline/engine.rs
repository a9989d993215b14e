//! The engine's pure functions without a target: the diff of a target against the empty
//! world, the order of a plan's targets, and the operations `ops_of` derives from a target
//! plan (what apply runs, from the plan alone), a saved plan refused when its target no
//! longer reads as it did, and what a container's reboot adds to its guest's plan.
//! llm-two's real inventory is the input.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use provision::access::{AccessError, ApiOp, NodeOp, Op, OpOutcome, TargetReader, TargetWriter};
use provision::engine::ops::ops_of;
use provision::engine::reboot::{gate_after_reboots, reboots};
use provision::engine::reconcile::{self, ApplyOptions};
use provision::engine::schedule::Limits;
use provision::engine::{DesiredTarget, diff_target, offline_plan};
use provision::plan::{Action, Change, Plan, Target, TargetPlan};
use provision::resources::ResourceSpec;
use provision::resources::Typed;
use provision::resources::container::RestartPolicy;
use provision::resources::file::{PathFact, PathKind};
use provision::resources::managed::{Entry, ManagedProbe, RECORD_VERSION, Record};
use provision::resources::op::bare_change;
use provision::resources::service::{UnitFact, UnitProbe};
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
        // The unit of a service on a new generation is written by the switch itself.
        let write = ops
            .iter()
            .position(|o| match o {
                Op::Guest(Step::WriteFile(provision::resources::file::WriteFileStep {
                    path,
                    ..
                })) => *path == unit,
                Op::Guest(Step::SwitchGeneration(
                    provision::resources::generation::SwitchGenerationStep { units, .. },
                )) => units.iter().any(|u| u.path == unit),
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

/// A guest's world for the engine: every probe of llm-two's guest files answered "absent"
/// (the managed record too), but for `present`, found holding one byte. `ran` counts the
/// operations handed to `run` (nothing runs on a stale plan). When `serving_old`, its
/// record holds a server this inventory no longer declares ([`OLD_UNIT`], running and
/// enabled, as the seeds' earlier model was).
struct World {
    present: Option<Probe>,
    ran: Arc<AtomicUsize>,
    serving_old: bool,
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
                Probe::Path(provision::resources::file::PathProbe { .. }) => Fact::Path(None),
                Probe::Managed(ManagedProbe {}) => {
                    Fact::Managed(self.serving_old.then(|| Record {
                        version: RECORD_VERSION,
                        entries: vec![Entry::Service {
                            unit: OLD_UNIT.into(),
                        }],
                    }))
                }
                Probe::Unit(UnitProbe { name }) if self.serving_old && name == OLD_UNIT => {
                    Fact::Unit(Some(UnitFact {
                        properties: [
                            ("ActiveState", "active"),
                            ("SubState", "running"),
                            ("UnitFileState", "enabled"),
                        ]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                        process: None,
                    }))
                }
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

/// `d` planned against a [`World`] where nothing is present (but the old server, when
/// `serving_old`).
fn plan_in_world(d: &DesiredTarget, serving_old: bool) -> Plan {
    reconcile::plan(
        "inventory/llm-two.yaml",
        std::slice::from_ref(d),
        false,
        &provision::engine::removal::Undeclared::default(),
        &Limits::serial(),
        &|_| {
            Ok(Box::new(World {
                present: None,
                ran: Arc::default(),
                serving_old,
            }))
        },
    )
    .whole()
    .expect("the world answers every probe")
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
                serving_old: false,
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
    let plan = plan_in_world(&d, false);
    let stamp = plan.targets[0].read.clone().expect("a read stamp");
    assert!(plan.summary.has_changes(), "every file is to create");
    // Saved and read back, as `plan --out` and `apply FILE` do.
    let plan: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();

    // One of the files appeared since: the read stamp differs, nothing runs.
    let file = stamp
        .probes
        .iter()
        .find(|p| matches!(p, Probe::Path(provision::resources::file::PathProbe { .. })))
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

/// Inventories that declare every kind between them (but `removed`): llm-two's, a node
/// with ZFS model storage and a template, and the seeds' 397B box (uv builds its ml-env).
const INVENTORIES: &[&str] = &[
    "inventory/llm-two.yaml",
    "tests/fixtures/host/zfs-node.yaml",
    "examples/qwen3.5-397b-nvfp4.yaml",
];

/// The kinds those inventories do not declare (or not on every workstation), and why: each
/// is still a kind of the list below.
const NOT_DECLARED: &[(&str, &str)] = &[
    (
        "removed",
        "planned from a guest's record, never declared (tests/lab/remove.rs)",
    ),
    (
        "uv",
        "an ml-env's `installer: uv`, declared by the inventory tests/lab/uv.rs writes",
    ),
];

/// Every `ResourceSpec` variant, as serde spells its tag: the names its "unknown variant"
/// error lists, so the enum itself is measured, not a list kept beside it.
fn every_kind() -> Vec<String> {
    let err = serde_json::from_str::<ResourceSpec>(r#"{"kind": "no such kind"}"#).unwrap_err();
    let text = err.to_string();
    let (_, expected) = text
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("{text}"));
    let expected = expected.split(" at line").next().unwrap();
    expected
        .split(", ")
        .map(|k| k.trim_matches('`').to_string())
        .collect()
}

#[test]
fn every_kind_is_declared_or_named_and_its_operations_fit_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let all = ApplyOptions {
        install_driver: true,
        allow_replace: true,
        ..ApplyOptions::default()
    };
    let mut seen = std::collections::BTreeSet::new();
    let plans = INVENTORIES.iter().map(|i| {
        let desired = provision::cli::prepare(&root.join(i)).unwrap().desired;
        offline_plan(i, &desired)
    });
    for t in plans.flat_map(|p| p.targets) {
        for c in &t.changes {
            let kind = serde_json::to_value(&c.spec).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string();
            // The kind says where it lives, and the plan put it there.
            let fits = matches!(
                (c.spec.target_kind(), &t.target),
                (
                    provision::resources::TargetKind::Guest,
                    Target::Guest { .. }
                ) | (provision::resources::TargetKind::Node, Target::Node { .. })
                    | (
                        provision::resources::TargetKind::Container,
                        Target::Container { .. }
                    )
            );
            assert!(fits, "{kind} planned on {:?}", t.target);
            let one = TargetPlan {
                changes: vec![c.clone()],
                manages: None,
                ..t.clone()
            };
            let mut unsupported = Vec::new();
            let ops = ops_of(&one, &all, &mut unsupported);
            seen.insert(kind.clone());
            if !unsupported.is_empty() {
                // A kind may refuse (llm-two's driver has no installer declared): then it
                // runs nothing, and says so at its address.
                assert!(ops.is_empty(), "{kind}: {ops:?}");
                assert!(unsupported[0].starts_with(&c.address), "{unsupported:?}");
                continue;
            }
            for op in &ops {
                // Each operation is one its target's writer carries, and a guest step has a
                // limit (the agent's attach stops it past that).
                let carried = match (&t.target, op) {
                    (Target::Guest { .. }, Op::Guest(step))
                    | (Target::Node { .. }, Op::Guest(step)) => {
                        let _ = provision::agent::attach::limit(step);
                        true
                    }
                    (Target::Guest { .. }, Op::Node(NodeOp::PushInstaller { .. })) => true,
                    (Target::Node { .. }, Op::Api(ApiOp::Template { .. })) => true,
                    (Target::Container { .. }, Op::Api(_) | Op::Node(NodeOp::Lines { .. })) => true,
                    _ => false,
                };
                assert!(carried, "{kind} on {:?}: {}", t.target, word(op));
                assert!(!op.describe().is_empty(), "{kind}");
            }
        }
    }
    // Named kinds count whether or not an inventory declares them here (uv is llm-two's
    // installer when its wheel is in the workstation's cache).
    seen.extend(NOT_DECLARED.iter().map(|(kind, _)| kind.to_string()));
    let every: std::collections::BTreeSet<String> = every_kind().into_iter().collect();
    assert_eq!(
        seen, every,
        "a kind of ResourceSpec is neither declared by INVENTORIES nor named in NOT_DECLARED"
    );
}

/// A container in memory: every probe of it answers `fact`.
struct OneContainer(provision::resources::container::PveContainerFact);

impl TargetReader for OneContainer {
    fn describe(&self) -> String {
        "a container in memory".into()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        let answers = probes.iter().map(|p| match p {
            Probe::PveContainer { .. } => (p.clone(), Fact::PveContainer(Some(self.0.clone()))),
            other => panic!("a container's config has no probe {other:?}"),
        });
        Ok(Facts::Read(answers.collect()))
    }
}

impl TargetWriter for OneContainer {
    fn run(&self, _: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        Ok(Vec::new())
    }
}

/// llm-two's container with its GPU passthrough role dropped, found with the lines
/// provision recorded for it in its description, one of them changed by hand since, and
/// lines it never wrote (the user's `dev0`, a raw line): the plan removes exactly the
/// recorded lines still as written and names the changed one.
#[test]
fn a_removed_roles_recorded_lines_are_planned_out_and_nothing_else() {
    let mut d = llm_two()
        .into_iter()
        .find(|d| matches!(d.target, Target::Container { .. }))
        .expect("llm-two has a container");
    let Target::Container { vmid, .. } = d.target else {
        unreachable!()
    };
    d.resources
        .retain(|r| !matches!(&r.spec, ResourceSpec::PveLines(l) if l.label == "gpu-passthrough"));
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let description = provision::resources::pve_lines::with_record(
        Some("Managed by provision.\n"),
        "gpu-passthrough",
        &[
            pair("dev1", "/dev/nvidia0"),
            pair("lxc.cgroup2.devices.allow", "c 195:* rwm"),
            pair(
                "lxc.mount.entry",
                "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
            ),
        ],
    );
    let fact = provision::resources::container::PveContainerFact {
        config: vec![
            pair("description", &description),
            pair("dev0", "/dev/fuse"),
            pair("dev1", "/dev/nvidia0"),
            pair("lxc.cgroup2.devices.allow", "c 195:* rwm"),
            pair("lxc.cgroup2.devices.allow", "c 10:200 rwm"),
            pair(
                "lxc.mount.entry",
                "/dev/nvidia-uvm dev/nvidia-uvm none bind,ro,optional,create=file",
            ),
        ],
        running: true,
        ..Default::default()
    };
    let read = reconcile::plan(
        "inventory/llm-two.yaml",
        std::slice::from_ref(&d),
        false,
        &provision::engine::removal::Undeclared::default(),
        &Limits::serial(),
        &|_| Ok(Box::new(OneContainer(fact.clone()))),
    );
    let mut plan = read.whole().expect("the container answers");
    // Only the removal: the rest is the container's own spec against this made-up config.
    for t in &mut plan.targets {
        t.changes
            .retain(|c| matches!(c.spec, ResourceSpec::Removed(_)));
    }
    let removed = &plan.targets[0].changes;
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(
        removed[0].address,
        format!("container.llm-two/pve_lines:{vmid} gpu-passthrough")
    );
    insta::assert_snapshot!(
        "pve_lines_removed",
        provision::plan::render_human(&plan, false)
    );
}

const OLD_UNIT: &str = "sglang-old.service";

/// The seeds' switch: the old server holds the port (and the GPUs) the new one needs, so
/// what is no longer declared is planned ahead of everything declared, and apply stops it
/// before the new server's unit is written (and so before it can start).
#[test]
fn a_server_no_longer_declared_is_stopped_before_the_new_ones_unit_is_written() {
    let d = files_only();
    let new_unit = d
        .resources
        .iter()
        .find_map(|r| match &r.spec {
            ResourceSpec::File(f) if f.path.ends_with(".service") => Some(f.path.clone()),
            _ => None,
        })
        .expect("llm-two's guest writes a unit file");
    let plan = plan_in_world(&d, true);
    let t = &plan.targets[0];
    assert!(
        matches!(&t.changes[0].spec, ResourceSpec::Removed(_))
            && t.changes[0].action == Action::Delete,
        "the removal comes first: {:?}",
        t.changes.iter().map(|c| &c.address).collect::<Vec<_>>()
    );
    assert!(
        t.changes[0].reasons.iter().any(|r| r.contains("port")),
        "{:?}",
        t.changes[0].reasons
    );
    let mut unsupported = Vec::new();
    let ops = ops_of(t, &ApplyOptions::default(), &mut unsupported);
    assert!(unsupported.is_empty(), "{unsupported:?}");
    let at = |want: &dyn Fn(&Step) -> bool| {
        ops.iter()
            .position(|o| matches!(o, Op::Guest(s) if want(s)))
            .unwrap_or_else(|| panic!("{:?}", ops.iter().map(word).collect::<Vec<_>>()))
    };
    let stop = at(
        &|s| matches!(s, Step::Remove(r) if r.entry == Entry::Service { unit: OLD_UNIT.into() }),
    );
    let write = at(
        &|s| matches!(s, Step::WriteFile(provision::resources::file::WriteFileStep { path, .. }) if *path == new_unit),
    );
    assert!(
        stop < write,
        "{OLD_UNIT} stopped at {stop}, {new_unit} written at {write}"
    );
    // Nothing declared runs before it: only the record that names what this apply may touch.
    assert!(
        ops[..stop]
            .iter()
            .all(|o| matches!(o, Op::Guest(Step::Record(_)))),
        "{:?}",
        ops[..stop].iter().map(word).collect::<Vec<_>>()
    );
}

/// A change of `spec` on `target`, without attributes.
fn change_of(target: &Target, spec: &ResourceSpec, action: Action) -> Change {
    bare_change(&target.names().0, spec.clone(), action)
}

/// llm-two's desired state with its container's `restart` set to `restart`, and plans
/// where nothing differs but the container's root-only lines (its bind mount): its guest
/// read, all matching.
fn rebooting(restart: RestartPolicy) -> (Vec<DesiredTarget>, Vec<TargetPlan>) {
    let mut desired = llm_two();
    let mut plans = Vec::new();
    for d in &mut desired {
        for r in &mut d.resources {
            if let ResourceSpec::Container(c) = &mut r.spec {
                c.restart = restart;
            }
        }
        let mut p = TargetPlan::empty(d.target.clone());
        for r in &d.resources {
            if matches!(&r.spec, ResourceSpec::PveLines(l) if l.label == "root-only") {
                p.changes
                    .push(change_of(&d.target, &r.spec, Action::Update));
            } else {
                p.unchanged += 1;
            }
        }
        plans.push(p);
    }
    (desired, plans)
}

fn guest_of(plans: &[TargetPlan]) -> &TargetPlan {
    plans
        .iter()
        .find(|p| matches!(p.target, Target::Guest { .. }))
        .expect("llm-two has a guest")
}

/// New root-only lines on a running container with `restart: allowed`: the guest is
/// marked as coming back from the reboot, and sglang-qwen (gated, unchanged) is waited
/// for after the boot (deployed with `wait_first`: restarted only if the boot's own start
/// fails) instead of being taken on trust; with `restart: never` nothing reboots and the
/// guest's plan stays as read.
#[test]
fn a_reboot_for_new_lines_gates_the_guests_services_again() {
    let (desired, mut plans) = rebooting(RestartPolicy::Allowed);
    let before = guest_of(&plans).unchanged;
    gate_after_reboots(&desired, &mut plans);
    let g = guest_of(&plans);
    assert_eq!(g.after_reboot, Some(129));
    let services: Vec<&Change> = g.changes.iter().filter(|c| c.kind == "service").collect();
    assert_eq!(services.len(), 1, "{:#?}", g.changes);
    let c = services[0];
    assert_eq!(c.name, "sglang-qwen.service");
    assert_eq!(
        c.typed,
        Some(Typed::Service {
            restart: true,
            wait_first: true
        })
    );
    assert!(c.reasons[0].contains("CT 129 reboots"), "{:?}", c.reasons);
    assert!(
        c.reasons[1].contains("lists `qwen3.5-122b`"),
        "{:?}",
        c.reasons
    );
    assert_eq!(g.unchanged, before - 1);
    let deploys: Vec<(bool, bool)> = ops_of(g, &ApplyOptions::default(), &mut Vec::new())
        .iter()
        .filter_map(|o| match o {
            Op::Guest(Step::DeployService(d)) => Some((d.restart, d.wait_first)),
            _ => None,
        })
        .collect();
    assert_eq!(deploys, vec![(true, true)]);

    let (desired, mut plans) = rebooting(RestartPolicy::Never);
    gate_after_reboots(&desired, &mut plans);
    assert_eq!(guest_of(&plans).after_reboot, None);
    assert!(guest_of(&plans).changes.is_empty());
}

/// A service that changes anyway keeps its own change; a container started from stopped,
/// created or replaced boots its guest as planned (nothing is added); pending config
/// changes alone reboot it.
#[test]
fn only_a_running_container_reboots_and_a_changed_service_keeps_its_change() {
    let (desired, mut plans) = rebooting(RestartPolicy::Allowed);
    let spec_of = |f: fn(&ResourceSpec) -> bool| {
        desired
            .iter()
            .flat_map(|d| &d.resources)
            .find(|r| f(&r.spec))
            .unwrap()
            .spec
            .clone()
    };
    let gi = plans
        .iter()
        .position(|p| matches!(p.target, Target::Guest { .. }))
        .unwrap();
    let mut own = change_of(
        &plans[gi].target,
        &spec_of(|s| matches!(s, ResourceSpec::Service(_))),
        Action::Update,
    );
    own.typed = Some(Typed::Service {
        restart: true,
        wait_first: false,
    });
    plans[gi].changes.push(own.clone());
    gate_after_reboots(&desired, &mut plans);
    assert_eq!(plans[gi].changes, vec![own]);
    assert_eq!(plans[gi].after_reboot, Some(129));

    let ci = plans
        .iter()
        .position(|p| matches!(p.target, Target::Container { .. }))
        .unwrap();
    let container = spec_of(|s| matches!(s, ResourceSpec::Container(_)));
    let typed = |start, reboot| {
        Some(Typed::Container {
            set: Vec::new(),
            start,
            reboot,
        })
    };
    for (action, typed) in [
        (Action::Update, typed(true, false)),
        (Action::Create, None),
        (Action::Replace, None),
    ] {
        let mut p = plans[ci].clone();
        let mut c = change_of(&p.target, &container, action);
        c.typed = typed;
        p.changes.insert(0, c);
        assert!(!reboots(&p, RestartPolicy::Allowed), "{action:?}");
        assert!(reboots(&plans[ci], RestartPolicy::Allowed));
    }
    let mut p = TargetPlan::empty(plans[ci].target.clone());
    let mut c = change_of(&p.target, &container, Action::Update);
    c.typed = typed(false, true);
    p.changes.push(c);
    assert!(reboots(&p, RestartPolicy::Allowed));
}
