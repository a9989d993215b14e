//! The operations that carry out a target plan, in order. Each kind turns its change into
//! its own operations (`Resource::ops`: guest steps, API calls, node steps); what is left
//! here is the order across kinds: a service's preflight before its unit is written (and
//! before the weights of the model it reads), a container started after its root-only
//! lines, the guest's record written first and last, the generation switch before the
//! first deploy. Derived from the plan alone, so a saved plan runs exactly what it shows.

use std::collections::HashMap;

use super::reconcile::ApplyOptions;
use crate::access::{ApiOp, Op};
use crate::plan::{Target, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::managed::Entry;
use crate::resources::op::Allowed;
use crate::resources::wire::Step;

/// The operations that carry out `t`'s changes, in order: API and node operations first,
/// in the order of their changes (a container's start after its root-only lines), then
/// the guest steps (a service's preflight before its unit). A change that cannot be
/// applied is added to `unsupported`.
pub fn ops_of(t: &TargetPlan, options: &ApplyOptions, unsupported: &mut Vec<String>) -> Vec<Op> {
    let allowed = Allowed {
        rollback: options.rollback,
        replace: options.allow_replace,
        install_driver: options.install_driver,
    };
    let mut ops = Vec::new();
    let mut steps = Vec::new();
    // A container's start asked for by a kind whose lines take effect only at a start.
    let mut start = None;
    let mut preflights = preflights_of(t);
    // Fail early: a model a pending preflight reads is pulled in two passes, all but the
    // weights first; the weights wait, by unit file, until that preflight has passed, so a
    // refused argv or a broken stack stops the apply before hours of download.
    let mut weights: HashMap<String, Step> = HashMap::new();
    for c in &t.changes {
        // A service's preflight runs before its unit is written, or before its deploy
        // when the unit itself does not change: a refused argv changes nothing.
        let key = match &c.spec {
            ResourceSpec::File(f) => Some(f.path.clone()),
            ResourceSpec::Service(svc) => Some(svc.unit_path.clone()),
            _ => None,
        };
        if let Some(k) = key
            && let Some(step) = preflights.remove(&k)
        {
            steps.push(step);
            steps.extend(weights.remove(&k));
        }
        let carried = match c.spec.resource().ops(c, &allowed) {
            Ok(carried) => carried,
            Err(why) => {
                unsupported.push(format!("{}: {why}", c.address));
                continue;
            }
        };
        for op in carried {
            match op {
                Op::Guest(Step::ModelPull(m)) => match reader_of(&preflights, &m.dest) {
                    Some(unit) => {
                        steps.push(Step::ModelPull(Box::new(m.small_files())));
                        weights.insert(unit, Step::ModelPull(m));
                    }
                    None => steps.push(Step::ModelPull(m)),
                },
                Op::Guest(step) => steps.push(step),
                Op::Api(ApiOp::Start { .. }) => start = Some(op),
                other => ops.push(other),
            }
        }
    }
    if let Some(start) = start {
        // Root-only lines take effect at a start: create (stopped) -> lines -> start.
        for op in &mut ops {
            if let Op::Api(ApiOp::Container { start, .. }) = op {
                *start = false;
            }
        }
        ops.push(start);
    }
    // Every pending preflight is met at its service's change, so nothing is left here; if
    // one were, its weights are still pulled, last.
    steps.extend(weights.into_values());
    if let (Some(record), Target::Guest { .. }) = (&t.manages, &t.target) {
        // The record names what this apply may make or remove before it runs (an apply
        // cut short leaves nothing unrecorded), and what is left once it is done.
        let mut first = record.clone();
        for c in &t.changes {
            if let Some(e) = Entry::of(&c.spec)
                && !first.entries.contains(&e)
            {
                first.entries.push(e);
            }
        }
        steps.insert(0, Step::Record(first));
        steps.push(Step::Record(record.clone()));
    }
    ops.extend(
        crate::resources::generation::switch_last(steps)
            .into_iter()
            .map(Op::Guest),
    );
    ops
}

/// The unit file of the pending preflight that reads the model at `dest`, if any.
fn reader_of(preflights: &HashMap<String, Step>, dest: &str) -> Option<String> {
    preflights.iter().find_map(|(unit, step)| match step {
        Step::Preflight(svc) => svc
            .preflight
            .as_ref()
            .is_some_and(|p| p.model_path == dest)
            .then(|| unit.clone()),
        _ => None,
    })
}

/// The preflight steps of the services this target plan (re)starts, by unit file.
fn preflights_of(t: &TargetPlan) -> HashMap<String, Step> {
    t.changes
        .iter()
        .filter_map(|c| match &c.spec {
            ResourceSpec::Service(svc) if crate::resources::service::restart_of(c).0 => svc
                .preflight
                .is_some()
                .then(|| (svc.unit_path.clone(), Step::Preflight(svc.clone()))),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Action, Change};
    use crate::resources::file::FileSpec;
    use crate::resources::managed::{Record, Removal, record_of};

    fn change(spec: ResourceSpec, action: Action) -> Change {
        crate::resources::op::bare_change("guest.t", spec, action)
    }

    #[test]
    fn the_record_brackets_the_steps_and_names_what_is_removed_until_done() {
        let file = ResourceSpec::File(FileSpec {
            path: "/etc/b".into(),
            content: "b\n".into(),
            owner: "root".into(),
            group: "root".into(),
            mode: 0o644,
        });
        let gone = Removal {
            entry: Entry::Service {
                unit: "a.service".into(),
            },
            prune: false,
            absent: false,
        };
        let kept: Record = record_of([&file]);
        let t = TargetPlan {
            changes: vec![
                change(ResourceSpec::Removed(gone.clone()), Action::Delete),
                change(file.clone(), Action::Create),
            ],
            manages: Some(kept.clone()),
            ..TargetPlan::empty(Target::Guest {
                name: "t".into(),
                address: "root@h:22".into(),
            })
        };
        let mut unsupported = Vec::new();
        let ops = ops_of(&t, &ApplyOptions::default(), &mut unsupported);
        assert!(unsupported.is_empty(), "{unsupported:?}");
        let steps: Vec<&Step> = ops
            .iter()
            .map(|o| match o {
                Op::Guest(s) => s,
                other => panic!("not a guest step: {other:?}"),
            })
            .collect();
        assert_eq!(steps.len(), 4, "{steps:?}");
        let Step::Record(first) = steps[0] else {
            panic!("{steps:?}")
        };
        assert_eq!(first.entries, [kept.entries[0].clone(), gone.entry.clone()]);
        assert_eq!(steps[1], &Step::Remove(gone));
        assert!(
            matches!(
                steps[2],
                Step::WriteFile(crate::resources::file::WriteFileStep { .. })
            ),
            "{steps:?}"
        );
        assert_eq!(steps[3], &Step::Record(kept));
    }

    fn node_plan(changes: Vec<Change>) -> TargetPlan {
        TargetPlan {
            changes,
            ..TargetPlan::empty(Target::Node {
                node: "n".into(),
                api: "https://n:8006".into(),
            })
        }
    }

    /// A change as its kind's diff makes it, from an empty world.
    fn diffed(spec: ResourceSpec) -> Change {
        let d = spec
            .resource()
            .diff(&crate::resources::wire::Facts::Empty)
            .unwrap()
            .expect("a change");
        let mut c = change(spec, d.action);
        c.attributes = d.attributes;
        c.typed = d.typed;
        c
    }

    fn nvidia(installer: bool) -> ResourceSpec {
        ResourceSpec::NvidiaHost(crate::resources::nvidia_host::NvidiaHostSpec {
            root: "/r".into(),
            driver: "580.82.07".into(),
            persistenced: true,
            uvm_at_boot: false,
            installer: installer.then(|| ("/root/NVIDIA.run".into(), "ab".repeat(32))),
            kernel_cmdline: Vec::new(),
        })
    }

    #[test]
    fn the_node_driver_runs_only_with_install_driver_as_its_typed_delta_says() {
        let t = node_plan(vec![diffed(nvidia(true))]);
        let mut unsupported = Vec::new();
        assert!(ops_of(&t, &ApplyOptions::default(), &mut unsupported).is_empty());
        assert_eq!(unsupported.len(), 1, "{unsupported:?}");
        assert!(
            unsupported[0].contains("runs only with `apply --install-driver`"),
            "{unsupported:?}"
        );
        let allowed = ApplyOptions {
            install_driver: true,
            ..ApplyOptions::default()
        };
        let mut unsupported = Vec::new();
        let ops = ops_of(&t, &allowed, &mut unsupported);
        assert!(unsupported.is_empty(), "{unsupported:?}");
        assert!(
            matches!(&ops[..], [Op::Guest(Step::InstallDriver(crate::resources::nvidia_host::InstallDriverStep { .. })), Op::Guest(Step::NodeUnit(crate::resources::nvidia_host::NodeUnitStep { unit, .. }))] if unit == "nvidia-persistenced.service"),
            "{ops:?}"
        );
        // The typed delta decides, not the attribute's label: a change that shows `driver`
        // but whose diff said only the persistence daemon runs installs nothing.
        let mut c = diffed(nvidia(true));
        c.typed = Some(crate::resources::Typed::NvidiaHost {
            driver: false,
            persistenced: true,
            uvm: false,
        });
        let mut unsupported = Vec::new();
        let ops = ops_of(
            &node_plan(vec![c]),
            &ApplyOptions::default(),
            &mut unsupported,
        );
        assert!(unsupported.is_empty(), "{unsupported:?}");
        assert!(
            matches!(
                &ops[..],
                [Op::Guest(Step::NodeUnit(
                    crate::resources::nvidia_host::NodeUnitStep { .. }
                ))]
            ),
            "{ops:?}"
        );
    }

    #[test]
    fn a_model_storage_conflict_is_refused_by_its_typed_delta() {
        let spec = ResourceSpec::ModelStorage(crate::resources::model_storage::ModelStorageSpec {
            path: "/srv/models".into(),
            zfs: None,
        });
        let mut c = change(spec, Action::Update);
        c.typed = Some(crate::resources::Typed::Conflict {
            why: "/srv/models is a File, not a directory".into(),
        });
        let mut unsupported = Vec::new();
        assert!(
            ops_of(
                &node_plan(vec![c.clone()]),
                &ApplyOptions::default(),
                &mut unsupported
            )
            .is_empty()
        );
        assert_eq!(
            unsupported,
            [format!(
                "{}: /srv/models is a File, not a directory",
                c.address
            )]
        );
        c.typed = None;
        let mut unsupported = Vec::new();
        let ops = ops_of(
            &node_plan(vec![c]),
            &ApplyOptions::default(),
            &mut unsupported,
        );
        assert!(
            matches!(
                &ops[..],
                [Op::Guest(Step::Mkdir(
                    crate::resources::directory::MkdirStep { .. }
                ))]
            ),
            "{ops:?}"
        );
    }

    #[test]
    fn a_template_is_an_api_operation_of_its_own_kind() {
        let spec = ResourceSpec::Template(crate::resources::template::TemplateSpec {
            volume: "local:vztmpl/debian-12.tar.zst".into(),
            url: "http://mirror/debian-12.tar.zst".into(),
            checksum: "ab".repeat(32),
            checksum_algorithm: "sha256".into(),
        });
        let mut unsupported = Vec::new();
        let ops = ops_of(
            &node_plan(vec![change(spec.clone(), Action::Create)]),
            &ApplyOptions::default(),
            &mut unsupported,
        );
        let ResourceSpec::Template(want) = spec else {
            unreachable!()
        };
        assert!(
            matches!(&ops[..], [Op::Api(ApiOp::Template { spec, .. })] if *spec == want),
            "{ops:?}"
        );
    }
}
