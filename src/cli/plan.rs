//! `provision plan`: what would change to make reality match the inventory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::ssh::node_transport;
use super::targets::{TargetArgs, connect, select};
use super::{ExitStatus, Prepared, prepare};
use crate::agent::client::AgentBinary;
use crate::diagnostic::Diagnostics;
use crate::engine::desired::desired_state;
use crate::engine::offline_plan;
use crate::engine::online::{self, ReadCtx};
use crate::inventory::container::GpuSelector;
use crate::node::gpu::{self as node_gpu, NodeGpus};
use crate::plan::{Plan, Target, render_human};
use crate::printer::Printer;
use crate::resources::ResourceSpec;

/// Arguments of `provision plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Plan against an empty world (everything to create), with no network at all.
    #[arg(long)]
    pub offline: bool,
    /// Print the plan as JSON (see docs/plan-format.md).
    #[arg(long)]
    pub json: bool,
    /// Exit 2 when there are changes (0 when none, 1 on error).
    #[arg(long)]
    pub detailed_exitcode: bool,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// Runs `provision plan`.
pub fn run(args: &PlanArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    let plan = if args.offline {
        let desired = select(prepared.desired, &args.targets)?;
        offline_plan(&args.inventory.display().to_string(), &desired)
    } else {
        read_plan(
            &args.inventory.display().to_string(),
            prepared,
            &args.targets,
            printer,
        )?
    };
    print_plan(&plan, args.json, printer)?;
    Ok(if args.detailed_exitcode && plan.summary.has_changes() {
        ExitStatus::Changes
    } else {
        ExitStatus::Success
    })
}

/// Reads the selected targets and plans against them. Only reads: no write path exists
/// from here.
pub fn read_plan(
    inventory: &str,
    prepared: Prepared,
    targets: &TargetArgs,
    printer: &Printer,
) -> anyhow::Result<Plan> {
    let prepared = with_live_gpus(prepared, targets, printer)?;
    let desired = select(prepared.desired, targets)?;
    let binary = Arc::new(AgentBinary::current()?);
    let loaded = &prepared.loaded;
    online::plan(inventory, &desired, &mut |target| {
        printer.status(&format!("reading {}", target.heading()));
        Ok(ReadCtx::new(connect(loaded, target, targets, &binary)?)
            .verify_full(targets.verify_full))
    })
}

/// The desired state with the passthrough lines of every selected GPU container rendered
/// from its node's live GPU facts (read over node SSH, one round trip per node) instead of
/// the offline assumption; a GPU the node does not have is an error at its line.
fn with_live_gpus(
    prepared: Prepared,
    targets: &TargetArgs,
    printer: &Printer,
) -> anyhow::Result<Prepared> {
    let loaded = &prepared.loaded;
    let root = std::env::var(node_gpu::ROOT_ENV).unwrap_or_default();
    let selected = |ct: &str| {
        targets.targets.is_empty()
            || targets
                .targets
                .iter()
                .any(|w| w == ct || *w == format!("container.{ct}"))
    };
    let mut read: HashMap<String, NodeGpus> = HashMap::new();
    for (node_name, node) in &loaded.inventory.nodes {
        let with_gpus: Vec<_> = node
            .containers
            .iter()
            .filter_map(|(name, ct)| Some((name, ct.gpus.as_ref()?)))
            .filter(|(name, _)| selected(name.as_str()))
            .collect();
        if with_gpus.is_empty() {
            continue;
        }
        printer.status(&format!("reading the GPUs of node {node_name}"));
        let transport = node_transport(loaded, node_name.as_str(), targets)?;
        let gpus = node_gpu::read(transport.as_ref(), &root)?;
        for (name, g) in with_gpus {
            let selectors: Vec<GpuSelector> = g.devices.iter().map(|d| d.value.clone()).collect();
            if let Some(why) = gpus.missing(&selectors) {
                let pos = g.devices.first().map(|d| d.pos).unwrap_or_default();
                return Err(Diagnostics(vec![
                    loaded.diag(pos, format!("container `{name}`: {why}")).hint(
                        "select GPUs by the index or UUID `provision gpu facts` prints on the node",
                    ),
                ])
                .into());
            }
        }
        read.insert(node_name.to_string(), gpus);
    }
    if read.is_empty() {
        return Ok(prepared);
    }
    let mut desired = desired_state(loaded, &prepared.library, &|n| {
        read.get(n).map(NodeGpus::view)
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
    Ok(Prepared {
        desired,
        ..prepared
    })
}

/// Prints a plan for people, or as JSON.
pub fn print_plan(plan: &Plan, json: bool, printer: &Printer) -> anyhow::Result<()> {
    if json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(plan)?));
    } else {
        printer.result(&render_human(plan, printer.color_out()));
    }
    Ok(())
}
