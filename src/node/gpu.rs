//! GPU passthrough from the node's live facts, over node SSH: the facts themselves (the
//! existing `gpu facts` probe, read under a configurable root so the lab's stand-in nodes
//! serve), which config lines passthrough owns, what of them no longer matches the node
//! (a major or a node that moved: drift), and the edit that brings a config to the wanted
//! lines.

use std::collections::BTreeSet;

use super::NodeError;
use super::config_edit::ConfigEdit;
use crate::compile::render::context::NodeGpuView;
use crate::gpu::facts::{FactSources, NodeFacts, gather_node_facts_raw};
use crate::gpu::probe::parse_sections;
use crate::resources::pve_lines::{LineOwner, PveLinesSpec, allow_major, is_allow_key, is_dev_key};
use crate::transport::Transport;

pub use crate::compile::ROOT_ENV;

/// The label of the passthrough lines (the `gpu-passthrough` role's).
pub const LABEL: &str = "gpu-passthrough";

/// What the node says about its GPUs, and every character major it has.
#[derive(Debug, Clone)]
pub struct NodeGpus {
    /// The GPU facts (driver, GPUs and minors, NVIDIA majors, device nodes).
    pub facts: NodeFacts,
    /// Every character-device major in the node's `/proc/devices`, NVIDIA's or not.
    pub char_majors: BTreeSet<u32>,
    /// The prefix of the node's `/dev` and `/proc` (empty on real nodes; the lab's
    /// `LAB_GPU_ROOT`).
    pub root: String,
}

/// Reads the node's GPU facts in one round trip over `node`.
pub fn read(node: &dyn Transport, root: &str) -> Result<NodeGpus, NodeError> {
    let sources = FactSources {
        root: root.to_string(),
    };
    let (facts, raw) = gather_node_facts_raw(node, &sources)?;
    let sections = parse_sections(&raw);
    let char_majors = sections
        .get("proc-devices")
        .map(|s| char_majors(&s.output))
        .unwrap_or_default();
    Ok(NodeGpus {
        facts,
        char_majors,
        root: root.trim_end_matches('/').to_string(),
    })
}

/// The majors of the `Character devices:` part of `/proc/devices`.
fn char_majors(text: &str) -> BTreeSet<u32> {
    text.lines()
        .skip_while(|l| !l.starts_with("Character"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

impl NodeGpus {
    /// The node path of a device as the config names it: `/dev/…` under the root.
    fn source(&self, path: &str) -> String {
        format!("{}{path}", self.root)
    }

    /// What passthrough owns in a config on this node.
    pub fn owner(&self) -> LineOwner {
        LineOwner {
            root: self.root.clone(),
            nvidia_majors: self.facts.majors.iter().map(|n| n.major).collect(),
            char_majors: self.char_majors.iter().copied().collect(),
        }
    }

    /// Whether passthrough owns this config line (see [`LineOwner::owns`]).
    pub fn owns(&self, key: &str, value: &str) -> bool {
        self.owner().owns(key, value)
    }

    /// Rendered passthrough lines with their device paths (`devN` paths,
    /// `lxc.mount.entry` sources) under the node's root: a no-op on real nodes; on a
    /// simulator, the stand-in nodes. The path inside the container stays `/dev/…`.
    pub fn at_root(&self, lines: &[(String, String)]) -> Vec<(String, String)> {
        lines
            .iter()
            .map(|(k, v)| {
                let moved = if (is_dev_key(k) || k == "lxc.mount.entry") && v.starts_with("/dev/") {
                    self.source(v)
                } else {
                    v.clone()
                };
                (k.clone(), moved)
            })
            .collect()
    }

    /// What the passthrough template sees of the node: live majors and minors.
    pub fn view(&self) -> NodeGpuView {
        crate::compile::render::passthrough::node_gpu_view(&self.facts)
    }

    /// Rendered passthrough lines pointed at this node's root (see [`Self::at_root`]).
    pub fn localize(&self, spec: &mut PveLinesSpec) {
        if spec.label == LABEL {
            spec.owner = Some(self.owner());
            spec.lines = self
                .at_root(&spec.pairs())
                .into_iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
        }
    }

    /// Lines in `found` that no longer match the node: a rule for a major NVIDIA no
    /// longer has, a device node that is gone or has other numbers now.
    pub fn drift(&self, found: &[(String, String)]) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in found {
            if let Some(path) = self.owner().nvidia_path(k, v) {
                if self.facts.node(path).is_none() {
                    out.push(format!("`{k}: {v}`: {path} does not exist on the node"));
                }
            } else if is_allow_key(k)
                && let Some(m) = allow_major(v)
                && !self.char_majors.contains(&m)
            {
                let live: Vec<String> = self
                    .facts
                    .majors
                    .iter()
                    .map(|n| format!("{} {}", n.name, n.major))
                    .collect();
                out.push(format!(
                    "`{k}: {v}`: no driver on the node has major {m} (now: {})",
                    live.join(", ")
                ));
            }
        }
        out
    }

    /// The edit from `found` (the config's current lines) to `wanted` (rendered, at the
    /// root): wanted lines added, passthrough's own lines not wanted removed.
    pub fn edit(&self, wanted: &[(String, String)], found: &[(String, String)]) -> ConfigEdit {
        ConfigEdit::toward(wanted, found, &|k, v| self.owns(k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(root: &str) -> NodeGpus {
        let raw = include_str!("../../tests/fixtures/gpu/h200x2/facts-probe.raw");
        NodeGpus {
            facts: crate::gpu::facts::node_facts_from_sections(&parse_sections(raw), ""),
            char_majors: char_majors(include_str!(
                "../../tests/fixtures/gpu/h200x2/proc-devices.txt"
            )),
            root: root.into(),
        }
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn stale_majors_and_nodes_are_drift_and_are_replaced() {
        let g = gpus("/lab/gpu");
        assert!(g.char_majors.contains(&238) && g.char_majors.contains(&7));
        assert!(!g.char_majors.contains(&509) && !g.char_majors.contains(&8));
        let found = vec![
            pair("lxc.cgroup2.devices.allow", "c 195:* rwm"),
            pair("lxc.cgroup2.devices.allow", "c 509:* rwm"),
            pair("lxc.cgroup2.devices.allow", "c 10:200 rwm"),
            pair(
                "lxc.mount.entry",
                "/lab/gpu/dev/nvidia3 dev/nvidia3 none bind,optional,create=file",
            ),
            pair("lxc.mount.entry", "/srv dev/srv none bind 0 0"),
        ];
        let drift = g.drift(&found);
        assert_eq!(drift.len(), 2, "{drift:?}");
        assert!(
            drift[0].contains("no driver on the node has major 509"),
            "{drift:?}"
        );
        assert!(drift[0].contains("nvidia-uvm 238"), "{drift:?}");
        assert!(
            drift[1].contains("/dev/nvidia3 does not exist"),
            "{drift:?}"
        );
        let wanted = g.at_root(&[
            pair("lxc.cgroup2.devices.allow", "c 195:* rwm"),
            pair("lxc.cgroup2.devices.allow", "c 238:* rwm"),
            pair(
                "lxc.mount.entry",
                "/dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
            ),
        ]);
        assert_eq!(
            wanted[2].1,
            "/lab/gpu/dev/nvidia1 dev/nvidia1 none bind,optional,create=file"
        );
        let edit = g.edit(&wanted, &found);
        assert_eq!(edit.add_lxc, wanted[1..].to_vec());
        assert_eq!(edit.remove_lxc, vec![found[1].clone(), found[3].clone()]);
        assert!(edit.set.is_empty() && edit.delete.is_empty());
    }

    #[test]
    fn dev_entries_are_set_and_unwanted_ones_deleted() {
        let g = gpus("");
        let found = vec![
            pair("dev0", "/dev/nvidia0"),
            pair("dev1", "/dev/nvidiactl"),
            pair("dev2", "/dev/fuse"),
        ];
        let wanted = vec![pair("dev0", "/dev/nvidia1")];
        let edit = g.edit(&wanted, &found);
        assert_eq!(edit.set, wanted);
        assert_eq!(edit.delete, vec!["dev1".to_string()]);
        assert!(g.drift(&found).is_empty());
    }
}
