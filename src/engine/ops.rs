//! The operations that carry out a target plan: API and node operations for a container,
//! guest steps for the rest, a service's preflight before its unit is written (and before
//! the weights of the model it reads). Derived from
//! the plan alone, so a saved plan runs exactly what it shows.

use std::collections::HashMap;

use super::reconcile::ApplyOptions;
use crate::access::{ApiOp, NodeOp, Op};
use crate::plan::{Change, Target, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::managed::Entry;
use crate::resources::wire::Step;

/// The operations that carry out `t`'s changes, in order: API and node operations for the
/// container, guest steps (a service's preflight before its unit). A change that cannot be
/// applied yet is added to `unsupported`.
pub fn ops_of(t: &TargetPlan, options: &ApplyOptions, unsupported: &mut Vec<String>) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut steps = Vec::new();
    let mut preflights = preflights_of(t);
    // Fail early: a model a pending preflight reads is pulled in two passes, all but the
    // weights first; the weights wait, by unit file, until that preflight has passed, so a
    // refused argv or a broken stack stops the apply before hours of download.
    let mut weights: HashMap<String, Step> = HashMap::new();
    let lines: Vec<&Change> = t
        .changes
        .iter()
        .filter(|c| matches!(c.spec, ResourceSpec::PveLines(_)))
        .collect();
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
        if let Some(vmid) = super::removal::destroys_container(&c.spec) {
            // Through the node's API: stopped, then destroyed (host bind mounts kept).
            ops.push(Op::Api(ApiOp::Destroy {
                address: c.address.clone(),
                vmid,
            }));
            continue;
        }
        if let ResourceSpec::Container(spec) = &c.spec {
            // Applied through the node's API, not by guest steps; started only after
            // root-only lines, when there are any.
            ops.push(Op::Api(ApiOp::Container {
                address: c.address.clone(),
                spec: spec.clone(),
                action: c.action,
                allow_replace: options.allow_replace,
                start: lines.is_empty(),
            }));
            continue;
        }
        if let (ResourceSpec::PveLines(spec), Target::Container { .. }) = (&c.spec, &t.target) {
            // Root-only: over the node's SSH as root.
            ops.push(Op::Node(NodeOp::Lines {
                address: c.address.clone(),
                spec: spec.clone(),
            }));
            continue;
        }
        if let ResourceSpec::Template(spec) = &c.spec {
            // Fetched by the node through its API, before any container needs it.
            ops.push(Op::Api(ApiOp::Template {
                address: c.address.clone(),
                spec: spec.clone(),
            }));
            continue;
        }
        match c.spec.resource().steps(c) {
            Ok(s)
                if !options.install_driver
                    && s.iter().any(|s| matches!(s, Step::InstallDriver { .. })) =>
            {
                unsupported.push(format!(
                    "{}: installing the NVIDIA driver needs a reboot of the node; it runs only with `apply --install-driver`",
                    c.address
                ));
            }
            Ok(s) => {
                for mut step in s {
                    // The node fetches the `.run` and pushes it in before the guest runs it.
                    if let Step::InstallUserspace { url, sha256, .. } = &step {
                        ops.push(Op::Node(NodeOp::PushInstaller {
                            address: c.address.clone(),
                            url: url.clone(),
                            sha256: sha256.clone(),
                        }));
                    }
                    if let Step::DeployService(d) = &mut step {
                        d.rollback = options.rollback;
                    }
                    if let Step::ModelPull(m) = &step
                        && let Some(unit) = reader_of(&preflights, &m.dest)
                    {
                        steps.push(Step::ModelPull(Box::new(m.small_files())));
                        weights.insert(unit, step);
                        continue;
                    }
                    steps.push(step);
                }
            }
            Err(why) => unsupported.push(format!("{}: {why}", c.address)),
        }
    }
    if let (false, Target::Container { vmid, .. }) = (lines.is_empty(), &t.target) {
        // Root-only lines take effect at a start: create (stopped) -> lines -> start.
        ops.push(Op::Api(ApiOp::Start {
            vmid: *vmid,
            reboot: true,
        }));
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
    use crate::plan::Action;
    use crate::resources::file::FileSpec;
    use crate::resources::managed::{Record, Removal, record_of};

    fn change(spec: ResourceSpec, action: Action) -> Change {
        let r = spec.resource();
        Change {
            address: format!("guest.t/{}", spec.address()),
            kind: r.kind().into(),
            name: r.name(),
            action,
            role: None,
            attributes: Vec::new(),
            diff: None,
            reasons: Vec::new(),
            warnings: Vec::new(),
            typed: None,
            spec,
        }
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
            target: Target::Guest {
                name: "t".into(),
                address: "root@h:22".into(),
            },
            changes: vec![
                change(ResourceSpec::Removed(gone.clone()), Action::Delete),
                change(file.clone(), Action::Create),
            ],
            unchanged: 0,
            read: None,
            warnings: Vec::new(),
            not_read: None,
            manages: Some(kept.clone()),
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
        assert!(matches!(steps[2], Step::WriteFile { .. }), "{steps:?}");
        assert_eq!(steps[3], &Step::Record(kept));
    }
}
