//! What the plan says about a node's targets once it is diffed: a container to be created
//! while its node's model storage is already there is a rebuild, and the plan says so.

use crate::compile::DesiredTarget;
use crate::plan::Target;
use crate::resources::ResourceSpec;

/// Says plainly, on each container that is to be created while its node's model storage
/// is already there with data, that the container is (re)created and the storage reused:
/// what a rebuild after a reinstall looks like.
pub fn note_rebuilds(desired: &[DesiredTarget], plans: &mut [crate::plan::TargetPlan]) {
    use crate::plan::Action;
    // Per node: the storage path, when the storage is there already (not to be created).
    let mut kept: Vec<(String, String)> = Vec::new();
    for p in plans.iter() {
        let Target::Node { node, .. } = &p.target else {
            continue;
        };
        let Some(d) = desired.iter().find(|d| d.target == p.target) else {
            continue;
        };
        for r in &d.resources {
            if let ResourceSpec::ModelStorage(s) = &r.spec {
                let created = p.changes.iter().any(|c| {
                    c.spec == r.spec
                        && (c.action == Action::Create
                            || matches!(c.typed, Some(crate::resources::Typed::Conflict { .. })))
                });
                if !created {
                    kept.push((node.clone(), s.path.clone()));
                }
            }
        }
    }
    for p in plans.iter_mut() {
        let Target::Container { node, vmid, .. } = &p.target else {
            continue;
        };
        let Some((_, path)) = kept.iter().find(|(n, _)| n == node) else {
            continue;
        };
        for c in &mut p.changes {
            let ResourceSpec::Container(spec) = &c.spec else {
                continue;
            };
            if c.action != Action::Create {
                continue;
            }
            let mount = spec.config.iter().find_map(|(k, v)| {
                let host = v.split(',').next()?;
                (k.starts_with("mp") && (host == path || host.starts_with(&format!("{path}/"))))
                    .then(|| {
                        v.split(',')
                            .find_map(|o| o.strip_prefix("mp="))
                            .unwrap_or("")
                    })
            });
            if let Some(inside) = mount {
                c.reasons.push(format!(
                    "CT {vmid} does not exist on node {node}: it will be recreated from the inventory; the model storage {path} is already there and is reused as {inside} (its data kept, nothing reformatted)"
                ));
            }
        }
    }
}
