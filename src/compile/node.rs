//! The node itself as a target: its model storage, its container templates and its NVIDIA
//! side, from `nodes.<name>` (planned before the node's containers, which need them).

use super::{Desired, DesiredTarget};
use crate::inventory::Node;
use crate::plan::Target;
use crate::resources::ResourceSpec;
use crate::resources::model_storage::{ModelStorageSpec, ZfsSpec};
use crate::resources::nvidia_host::NvidiaHostSpec;
use crate::resources::template::TemplateSpec;

/// The environment variable naming the prefix of the node's `/dev` and `/proc`, for a node
/// simulator whose GPUs are stand-ins (the lab's `LAB_GPU_ROOT`); unset on real nodes.
pub const ROOT_ENV: &str = "PROVISION_NODE_ROOT";

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
