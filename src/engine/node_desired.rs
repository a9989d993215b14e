//! The node itself as a target: its model storage, its container templates and its NVIDIA
//! side, from `nodes.<name>` (planned before the node's containers, which need them).

use super::{Desired, DesiredTarget};
use crate::inventory::Node;
use crate::plan::Target;
use crate::resources::ResourceSpec;
use crate::resources::model_storage::{ModelStorageSpec, ZfsSpec};
use crate::resources::nvidia_host::NvidiaHostSpec;
use crate::resources::template::TemplateSpec;

/// The node's own target, when the inventory declares anything for it. `root` prefixes the
/// node's system paths (`PROVISION_NODE_ROOT`; empty on real nodes).
pub fn node_target(name: &str, node: &Node, root: &str) -> Option<DesiredTarget> {
    let mut resources = Vec::new();
    let mut push = |spec| resources.push(Desired { spec, role: None });
    if let Some(s) = &node.model_storage {
        push(ResourceSpec::ModelStorage(ModelStorageSpec {
            path: s.path.to_string(),
            zfs: s.zfs.as_ref().map(|z| ZfsSpec {
                pool: z.pool().to_string(),
                dataset: z.dataset.to_string(),
                properties: z
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect(),
            }),
        }));
    }
    for t in &node.templates {
        push(ResourceSpec::Template(TemplateSpec {
            volume: t.volume.to_string(),
            url: t.url.to_string(),
            checksum: t.checksum.as_str().to_lowercase(),
            checksum_algorithm: t.checksum_algorithm.as_str().to_string(),
        }));
    }
    if let Some(n) = &node.nvidia {
        push(ResourceSpec::NvidiaHost(NvidiaHostSpec {
            root: root.trim_end_matches('/').to_string(),
            driver: n.driver.to_string(),
            persistenced: n.persistenced.value,
            uvm_at_boot: n.uvm_at_boot.value,
            installer: n
                .installer
                .as_ref()
                .map(|i| (i.path.to_string(), i.sha256.as_str().to_lowercase())),
            kernel_cmdline: n.kernel_cmdline.iter().map(|w| w.to_string()).collect(),
        }));
    }
    if resources.is_empty() {
        return None;
    }
    Some(DesiredTarget {
        target: Target::Node {
            node: name.to_string(),
            api: node
                .api
                .url
                .literal()
                .unwrap_or("the API URL from the environment")
                .to_string(),
        },
        resources,
    })
}

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
