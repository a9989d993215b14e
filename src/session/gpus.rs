//! What a plan reads from the Proxmox node itself before planning, over the node's SSH as
//! a [`NodeProbe`] (a fixed set of read-only commands: the session's raw node transport is
//! not reachable from here): the GPUs of nodes whose containers pass GPUs through, the GPU
//! checks inside running containers, and what root-only lines need of a node.

use std::collections::HashMap;

use super::plan::ReadOptions;
use super::{Api, Session, SessionError};
use crate::compile::render::passthrough::passthrough_lines;
use crate::compile::{Library, desired_state};
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::engine::DesiredTarget;
use crate::inventory::Loaded;
use crate::inventory::container::{Container, GpuSelector, Gpus};
use crate::inventory::node::Node;
use crate::node::gpu::{self as node_gpu, NodeGpus};
use crate::node::gpu_check;
use crate::node::probe::NodeProbe;
use crate::plan::Target;
use crate::plan::{Action, Attribute, Change, Plan};
use crate::resources::Resource;
use crate::resources::ResourceSpec;
use crate::resources::pve_lines::is_dev_key;
use crate::timing;

/// The containers of node `node_name` that declare GPUs and that `wanted` selects, as
/// `--target` spells a container (its guest's name selects the guest's resources, not the
/// container's passthrough lines): the one list by which the plan waits for a node's GPU
/// facts, reads them, and primes the containers' views of their GPUs.
pub(super) fn gpu_containers<'a>(
    node_name: &'a str,
    node: &'a Node,
    wanted: &'a dyn Fn(&Target) -> bool,
) -> impl Iterator<Item = (&'a str, &'a Container, &'a Gpus)> + 'a {
    node.containers.iter().filter_map(move |(name, ct)| {
        let gpus = ct.gpus.as_ref()?;
        wanted(&super::container_target(node_name, name.as_str(), ct)).then_some((
            name.as_str(),
            ct,
            gpus,
        ))
    })
}

/// The desired state, computed once: the passthrough lines of every selected GPU container
/// rendered from its node's live GPU facts (read over the session's node SSH, one round trip
/// per node) instead of the offline assumption; a GPU the node does not have is an error at
/// its line.
pub(super) fn with_live_gpus<A: Api>(
    library: &Library,
    session: &Session<'_, A>,
    options: &ReadOptions,
) -> Result<(Vec<DesiredTarget>, LiveNodes), SessionError> {
    let mut live = LiveNodes::new();
    let loaded = session.loaded();
    let printer = session.printer;
    let root = std::env::var(node_gpu::ROOT_ENV).unwrap_or_default();
    let wanted = |t: &Target| super::plan::selected(t, &options.targets);
    let mut read: HashMap<String, NodeGpus> = HashMap::new();
    for (node_name, node) in &loaded.inventory.nodes {
        let with_gpus: Vec<_> = gpu_containers(node_name.as_str(), node, &wanted)
            .map(|(name, _, g)| (name, g))
            .collect();
        if with_gpus.is_empty() {
            continue;
        }
        if node.ssh.host.is_none() {
            // The plan then names the lines that cannot be written (`refuse_root_only`).
            printer.warn(&format!(
                "node {node_name} has no SSH: its GPUs cannot be read; passthrough lines use the offline assumption"
            ));
            continue;
        }
        printer.status(&format!("reading the GPUs of node {node_name}"));
        let probe = session.node_probe(node_name.as_str())?;
        let gpus = probe.gpus(&root)?;
        for (name, g) in with_gpus {
            // The lines themselves come from the role below; this refuses, at the
            // inventory's line, what they cannot be made from (a GPU the node lacks, a
            // missing major, a stale node).
            let selectors: Vec<GpuSelector> = g.devices.iter().map(|d| d.value.clone()).collect();
            if let Err(e) =
                passthrough_lines(&gpus.facts, &selectors, g.method.value, &library.renderer)
            {
                let pos = g.devices.first().map(|d| d.pos).unwrap_or_default();
                return Err(Diagnostics(vec![
                    loaded
                        .diag(pos, format!("container `{name}`: {e}"))
                        .hint(e.hint()),
                ])
                .into());
            }
        }
        live.insert(node_name.to_string(), (probe, gpus.clone()));
        read.insert(node_name.to_string(), gpus);
    }
    let mut desired = timing::time("inventory: desired state", || {
        desired_state(loaded, library, &|n| read.get(n).map(NodeGpus::view))
    })?;
    for d in &mut desired {
        let Target::Container { node, .. } = &d.target else {
            continue;
        };
        let Some(gpus) = read.get(node) else {
            continue;
        };
        for r in &mut d.resources {
            if let ResourceSpec::PveLines(lines) = &mut r.spec {
                gpus.localize(lines);
            }
        }
    }
    Ok((desired, live))
}

/// The nodes whose GPU facts were read (over a read-only [`NodeProbe`]), with what they
/// read, by node name.
pub(super) type LiveNodes = HashMap<String, (NodeProbe, NodeGpus)>;

/// What running containers see of their GPUs, by vmid and lines' label: read while the
/// plan reads its targets, since a check needs the node's facts and the container's
/// lines, not the plan.
pub(super) type Views = HashMap<(u64, String), Result<gpu_check::GpuView, crate::node::NodeError>>;

/// The GPU checks of every container of `desired` with passthrough lines on a node whose
/// facts were read and that runs (from the node's listing, shared with the plan's reads),
/// one `pct exec` each: what [`gpu_checks`] then uses for the containers the plan leaves
/// with their lines as declared. A container that cannot be listed is left to it.
pub(super) fn read_views<A: Api>(
    desired: &[DesiredTarget],
    live: &LiveNodes,
    session: &Session<'_, A>,
) -> Views {
    let mut views = Views::new();
    for d in desired {
        let Target::Container { node, vmid, .. } = &d.target else {
            continue;
        };
        let Some((probe, gpus)) = live.get(node) else {
            continue;
        };
        let running = session
            .listing(node)
            .is_ok_and(|l| l.get(vmid).is_some_and(|(_, running)| *running));
        if !running {
            continue;
        }
        for r in &d.resources {
            let ResourceSpec::PveLines(spec) = &r.spec else {
                continue;
            };
            if !spec.passthrough() {
                continue;
            }
            let want = gpu_check::expected(gpus, spec);
            // Read before the facts said what to expect, when it looked everywhere.
            let view = match session.gpu_seen(node, *vmid, &gpus.root, probe) {
                Ok(seen) if seen.covers(&want) => Ok(seen.compare(gpus, &want)),
                // The view ran (in the guest's agent or through the node) past its limit:
                // the same script again, through the node, would hang the same way.
                Err(SessionError::Node(hung @ crate::node::NodeError::GpuView { .. })) => Err(hung),
                _ => probe.container_gpus(*vmid, gpus, &want),
            };
            views.insert((*vmid, spec.label.clone()), view);
        }
    }
    views
}

/// The GPU checks inside every running container whose passthrough lines are as
/// declared (one `pct exec` over the node session that read the facts; `views` holds
/// those already read alongside the plan): a container that does not see exactly its GPUs
/// (lines written while it ran, a driver reloaded under it) is drift of its passthrough
/// lines, planned as such (apply writes nothing new and restarts it when `restart:
/// allowed`).
pub(super) fn gpu_checks<A: Api>(
    plan: Plan,
    desired: &[DesiredTarget],
    live: &LiveNodes,
    mut views: Views,
    session: &Session<'_, A>,
) -> Result<Plan, SessionError> {
    let printer = session.printer;
    let mut targets = plan.targets;
    for t in &mut targets {
        let Target::Container { node, vmid, .. } = &t.target else {
            continue;
        };
        let Some((probe, gpus)) = live.get(node) else {
            continue;
        };
        if t.changes
            .iter()
            .any(|c| matches!(c.spec, ResourceSpec::PveLines(_)))
            || !session.running(node, *vmid)
        {
            continue;
        }
        let Some(d) = desired.iter().find(|d| d.target == t.target) else {
            continue;
        };
        // A container whose guest installs the userspace: a version other than the
        // node's is that resource's drift (its apply reinstalls it), not the lines'.
        let userspace_owned = desired.iter().any(|g| {
            matches!(&g.target, Target::Guest { name, .. } if Some(name.as_str()) == container_name(&t.target))
                && g.resources.iter().any(|r| matches!(r.spec, ResourceSpec::GpuUserspace(_)))
        });
        for r in &d.resources {
            // Only passthrough lines are about GPUs (a token node's `root-only` lines are not).
            let ResourceSpec::PveLines(spec) = &r.spec else {
                continue;
            };
            if !spec.passthrough() {
                continue;
            }
            let mut view = match views.remove(&(*vmid, spec.label.clone())) {
                Some(read) => read?,
                None => probe.container_gpus(*vmid, gpus, &gpu_check::expected(gpus, spec))?,
            };
            if userspace_owned {
                view.drift
                    .retain(|l| !l.starts_with(gpu_check::USERSPACE_DRIFT));
            }
            printer.status(&format!("{}: GPUs: {}", t.target.heading(), view.summary));
            if view.drift.is_empty() {
                continue;
            }
            t.unchanged = t.unchanged.saturating_sub(1);
            t.replanned = Some(format!(
                "the GPU checks inside CT {vmid} found its passthrough lines not in effect"
            ));
            t.changes.push(Change {
                address: d.address(&r.spec),
                kind: "pve_lines".into(),
                name: spec.name(),
                action: Action::Update,
                role: r.role.clone(),
                attributes: view
                    .drift
                    .iter()
                    .map(|line| Attribute::change("in the container", Some(line.clone()), Some("as declared".into())))
                    .collect(),
                diff: None,
                reasons: vec![format!(
                    "the config has the lines but the running container does not see its GPUs as declared: they take effect at a start; apply restarts CT {vmid} only with `restart: allowed`"
                )],
                warnings: Vec::new(),
                typed: None,
                spec: r.spec.clone(),
            });
        }
    }
    Ok(Plan::new(&plan.inventory, plan.mode, targets))
}

fn container_name(t: &Target) -> Option<&str> {
    match t {
        Target::Container { name, .. } => Some(name),
        _ => None,
    }
}

/// Refuses, before anything changes, a plan whose root-only lines cannot run: their node
/// has no SSH (a token, even root's, cannot write `devN` or raw `lxc.*` lines, and raw
/// lines cannot be written through the API at all), or `devN` entries on a node older
/// than Proxmox VE 8.1.
pub(super) fn refuse_root_only<A: Api>(
    plan: &Plan,
    loaded: &Loaded,
    conns: &Session<'_, A>,
) -> Result<(), SessionError> {
    let mut blocked = Vec::new();
    for t in &plan.targets {
        let Target::Container { node, .. } = &t.target else {
            continue;
        };
        let Some(inv) = loaded.inventory.nodes.get(node.as_str()) else {
            continue;
        };
        for c in &t.changes {
            let ResourceSpec::PveLines(spec) = &c.spec else {
                continue;
            };
            if inv.ssh.host.is_none() {
                let keys: Vec<String> = c.attributes.iter().map(|a| a.name.clone()).collect();
                blocked.push(format!(
                    "{}: {} root-only line(s) ({}) need node `{node}`'s SSH as root, which the inventory does not give",
                    c.address,
                    keys.len(),
                    keys.join(", ")
                ));
            } else if spec.pairs().iter().any(|(k, _)| is_dev_key(k)) {
                let version = conns.api_reader(node)?.version()?;
                if !version.has_dev_passthrough() {
                    blocked.push(format!(
                        "{}: `devN` entries need Proxmox VE 8.1 or later; node `{node}` runs {}",
                        c.address, version.version
                    ));
                }
            }
        }
    }
    if blocked.is_empty() {
        return Ok(());
    }
    let mut d = Diagnostic::new(format!(
        "{} step(s) of this plan cannot run; nothing was changed",
        blocked.len()
    ));
    for b in blocked {
        d = d.cause(b);
    }
    Err(d
        .hint("give the node `ssh: { host: ..., identity_file: ... }` (root): root-only lines are written over it; an API token or a root@pam ticket cannot write raw `lxc.*` lines")
        .hint("on a node older than 8.1, use `gpus: { method: lxc }` (classic lxc.* lines) instead of `dev`")
        .into())
}
