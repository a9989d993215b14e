//! What a running container sees of its GPUs, read through its node (`pct exec`, over the
//! node session that read the GPU facts): exactly the selected NVIDIA device nodes with the
//! node's major:minor, each openable as far as the devices cgroup goes, and, when the
//! container has `nvidia-smi`, a userspace driver equal to the node's kernel module.

use std::time::Duration;

use super::NodeError;
use super::gpu::NodeGpus;
use crate::resources::gpu_seen::SMI_MARK;
use crate::resources::pve_lines::{PveLinesSpec, is_dev_key};
use crate::transport::pct::PctTransport;
use crate::transport::{Transport, TransportError};

const TIMEOUT: Duration = Duration::from_secs(60);
/// How a drift line about the container's userspace driver version begins.
pub const USERSPACE_DRIFT: &str = "the container's userspace driver is";

/// One device node the container should see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Its path inside the container.
    pub path: String,
    /// The node's numbers for it.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// The device nodes `spec`'s lines pass through, with the numbers the node has for them.
pub fn expected(gpus: &NodeGpus, spec: &PveLinesSpec) -> Vec<Expected> {
    let owner = gpus.owner();
    let mut out = Vec::new();
    for (k, v) in spec.pairs() {
        let Some(node_path) = owner.nvidia_path(&k, &v) else {
            continue;
        };
        let Some(dev) = gpus.facts.node(node_path) else {
            continue;
        };
        // `devN` shows the node at its own path; a mount entry at its target.
        let inside = if is_dev_key(&k) {
            v.split(',').next().unwrap_or_default().to_string()
        } else {
            format!("/{}", v.split_whitespace().nth(1).unwrap_or_default())
        };
        out.push(Expected {
            path: inside,
            major: dev.major,
            minor: dev.minor,
        });
    }
    out
}

/// What the checks found: drift lines (empty: as declared) and what was not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuView {
    /// Each difference, in words.
    pub drift: Vec<String>,
    /// One line on what was seen and checked, for the log.
    pub summary: String,
}

/// Reads what container `vmid` sees, in one `pct exec` over `node`, and compares it with
/// `want` and the node's driver.
pub fn check(
    node: std::sync::Arc<dyn Transport>,
    vmid: u64,
    gpus: &NodeGpus,
    want: &[Expected],
) -> Result<GpuView, NodeError> {
    let paths: Vec<String> = want.iter().map(|e| e.path.clone()).collect();
    let seen = read(node, vmid, &[], &paths)?;
    Ok(seen.compare(gpus, want))
}

/// What a running container showed of its NVIDIA device nodes (those under `/dev` and
/// under each root read, and the paths named) and of its userspace driver, before it is
/// compared with anything: read while the node's facts, which say what to expect, are.
#[derive(Debug, Clone)]
pub struct Seen {
    text: String,
    roots: Vec<String>,
    paths: Vec<String>,
}

impl Seen {
    /// What the script said (see [`crate::resources::gpu_seen::script`]), read under
    /// `roots` and at `paths`: from the node's `pct exec`, or the guest's agent.
    pub fn new(text: String, roots: Vec<String>, paths: Vec<String>) -> Self {
        Seen { text, roots, paths }
    }

    /// Whether this read looked at every path `want` names.
    pub fn covers(&self, want: &[Expected]) -> bool {
        want.iter().all(|e| {
            self.paths.contains(&e.path)
                || std::iter::once("")
                    .chain(self.roots.iter().map(String::as_str))
                    .any(|root| in_globs(root, &e.path))
        })
    }

    /// Compares it with `want` and the node's driver.
    pub fn compare(&self, gpus: &NodeGpus, want: &[Expected]) -> GpuView {
        compare(&self.text, gpus, want)
    }
}

/// Whether `path` is one that `ROOT/dev/nvidia*` or `ROOT/dev/nvidia-caps/*` names.
fn in_globs(root: &str, path: &str) -> bool {
    let Some(rest) = path.strip_prefix(root) else {
        return false;
    };
    let leaf = |p: Option<&str>| p.is_some_and(|r| !r.contains('/'));
    leaf(rest.strip_prefix("/dev/nvidia-caps/")) || leaf(rest.strip_prefix("/dev/nvidia"))
}

/// Reads what container `vmid` sees (see [`Seen`]), in one `pct exec` over `node`: its
/// `/dev/nvidia*` and `/dev/nvidia-caps/*`, the same under each of `roots` (where the
/// lab's stand-in nodes are), and `paths`.
pub fn read(
    node: std::sync::Arc<dyn Transport>,
    vmid: u64,
    roots: &[String],
    paths: &[String],
) -> Result<Seen, NodeError> {
    let script = crate::resources::gpu_seen::script(roots, paths);
    let ct = PctTransport::new(node, vmid as u32);
    let out = ct.exec(&script, &[], TIMEOUT).map_err(|e| match e {
        TransportError::Timeout { .. } => NodeError::GpuView {
            target: ct.describe(),
            error: format!("{e}: {}", crate::resources::gpu_seen::HUNG_WHY),
        },
        e => e.into(),
    })?;
    if !out.success() {
        return Err(NodeError::Command {
            what: "reading the GPUs a container sees".into(),
            target: ct.describe(),
            status: out.status,
            stderr: super::tail(&out.stderr_text()),
        });
    }
    Ok(Seen::new(out.stdout_text(), roots.to_vec(), paths.to_vec()))
}

/// Compares the probe's output with what is wanted.
fn compare(text: &str, gpus: &NodeGpus, want: &[Expected]) -> GpuView {
    let (nodes, smi) = text.split_once(SMI_MARK).unwrap_or((text, "absent"));
    let mut seen = Vec::new();
    for line in nodes.lines() {
        let parts: Vec<&str> = line.split('|').collect();
        if let [path, major, minor, access] = parts[..] {
            let num = |h: &str| u32::from_str_radix(h, 16).ok();
            seen.push((path.to_string(), num(major), num(minor), access == "open"));
        }
    }
    let mut drift = Vec::new();
    for e in want {
        match seen.iter().find(|s| s.0 == e.path) {
            None => drift.push(format!("{} is not in the container", e.path)),
            Some((_, ma, mi, open)) => {
                if (*ma, *mi) != (Some(e.major), Some(e.minor)) {
                    drift.push(format!(
                        "{} is {}:{} in the container, the node's is {}:{}",
                        e.path,
                        ma.map_or("?".into(), |m| m.to_string()),
                        mi.map_or("?".into(), |m| m.to_string()),
                        e.major,
                        e.minor
                    ));
                } else if !open {
                    drift.push(format!(
                        "{} is denied by the container's devices cgroup",
                        e.path
                    ));
                }
            }
        }
    }
    // Exactly the selected GPUs: another `/dev/nvidiaN` is one too many.
    for (path, ..) in &seen {
        let gpu = path
            .strip_prefix("/dev/nvidia")
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if gpu && !want.iter().any(|e| e.path == *path) {
            drift.push(format!("{path} is in the container but not selected"));
        }
    }
    let smi = smi.trim();
    let driver = gpus.facts.driver.as_ref().map(|d| d.version.clone());
    let driver_note = if smi == "absent" {
        "driver: not checked (no nvidia-smi in the container)".to_string()
    } else {
        match &driver {
            Some(d) if smi == d => format!("driver {smi} = the node's module"),
            Some(d) => {
                drift.push(format!(
                    "{USERSPACE_DRIFT} {smi}, the node's kernel module {d}"
                ));
                format!("driver {smi} != {d}")
            }
            None => format!("driver {smi}; the node's module version is unknown"),
        }
    };
    let summary = format!(
        "sees {} of {} selected device node(s){}; {driver_note}",
        want.len() - drift_missing(&drift),
        want.len(),
        if drift.is_empty() {
            " with the node's numbers"
        } else {
            ""
        }
    );
    GpuView { drift, summary }
}

fn drift_missing(drift: &[String]) -> usize {
    drift
        .iter()
        .filter(|d| d.ends_with("is not in the container"))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::parse_sections;

    fn gpus() -> NodeGpus {
        let raw = include_str!("../../tests/fixtures/gpu/h200x2/facts-probe.raw");
        NodeGpus {
            facts: crate::gpu::facts::node_facts_from_sections(&parse_sections(raw), ""),
            char_majors: [195, 238, 241].into(),
            root: "/lab/gpu".into(),
        }
    }

    fn spec(lines: &[&str]) -> PveLinesSpec {
        PveLinesSpec {
            vmid: 129,
            label: "gpu-passthrough".into(),
            lines: lines.iter().map(|l| l.to_string()).collect(),
            owner: None,
            retire: Vec::new(),
        }
    }

    /// A read made before the facts said what to expect is used only when it looked at
    /// every path expected; the lab's stand-in nodes live under a root.
    #[test]
    fn a_read_covers_the_paths_its_globs_and_names_reach() {
        let e = |p: &str| Expected {
            path: p.into(),
            major: 195,
            minor: 0,
        };
        let seen = |roots: &[&str], paths: &[&str]| Seen {
            text: String::new(),
            roots: roots.iter().map(|r| r.to_string()).collect(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
        };
        let plain = seen(&[], &[]);
        assert!(plain.covers(&[e("/dev/nvidia0"), e("/dev/nvidiactl"), e("/dev/nvidia-uvm")]));
        assert!(plain.covers(&[e("/dev/nvidia-caps/nvidia-cap1")]));
        assert!(!plain.covers(&[e("/lab/gpu/dev/nvidiactl")]));
        assert!(!plain.covers(&[e("/dev/dri/card0")]));
        assert!(!plain.covers(&[e("/dev/nvidia-caps/sub/x")]));
        let lab = seen(&["/lab/gpu"], &[]);
        assert!(lab.covers(&[e("/lab/gpu/dev/nvidiactl"), e("/dev/nvidia1")]));
        assert!(!lab.covers(&[e("/lab/gpux/dev/nvidiactl")]));
        assert!(seen(&[], &["/dev/dri/card0"]).covers(&[e("/dev/dri/card0")]));
    }

    #[test]
    fn exactly_the_selected_nodes_with_the_nodes_numbers() {
        let g = gpus();
        let want = expected(
            &g,
            &spec(&[
                "lxc.cgroup2.devices.allow: c 195:* rwm",
                "lxc.mount.entry: /lab/gpu/dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
                "dev0: /lab/gpu/dev/nvidiactl",
            ]),
        );
        assert_eq!(
            want,
            vec![
                Expected {
                    path: "/dev/nvidia1".into(),
                    major: 195,
                    minor: 1
                },
                Expected {
                    path: "/lab/gpu/dev/nvidiactl".into(),
                    major: 195,
                    minor: 255
                },
            ]
        );
        let ok = format!(
            "/dev/nvidia1|c3|1|open\n/lab/gpu/dev/nvidiactl|c3|ff|open\n{SMI_MARK}\nabsent\n"
        );
        let v = compare(&ok, &g, &want);
        assert!(v.drift.is_empty(), "{v:?}");
        assert!(v.summary.contains("driver: not checked"), "{v:?}");
        let driver = g.facts.driver.as_ref().unwrap().version.clone();
        let bad = format!(
            "/dev/nvidia0|c3|0|open\n/dev/nvidia1|c3|2|open\n/lab/gpu/dev/nvidiactl|c3|ff|denied\n{SMI_MARK}\n1.2.3\n"
        );
        let v = compare(&bad, &g, &want);
        assert_eq!(v.drift.len(), 4, "{v:?}");
        assert!(v.drift[0].contains("195:2 in the container, the node's is 195:1"));
        assert!(v.drift[1].contains("denied by the container's devices cgroup"));
        assert!(v.drift[2].contains("/dev/nvidia0 is in the container but not selected"));
        assert!(v.drift[3].contains(&format!("is 1.2.3, the node's kernel module {driver}")));
        let missing = compare(&format!("{SMI_MARK}\n{driver}\n"), &g, &want);
        assert_eq!(missing.drift.len(), 2, "{missing:?}");
        assert!(missing.summary.contains("sees 0 of 2"), "{missing:?}");
    }
}
