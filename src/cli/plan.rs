//! `provision plan`: what would change to make reality match the inventory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::targets::{Connections, TargetArgs, select};
use super::{ExitStatus, Prepared, prepare};
use crate::agent::client::AgentBinary;
use crate::engine::offline_plan;
use crate::engine::online;
use crate::plan::{Plan, render_human};
use crate::printer::Printer;

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
    /// Also save the plan to FILE, for `provision apply FILE` to execute exactly.
    #[arg(long, value_name = "FILE", conflicts_with = "offline")]
    pub out: Option<PathBuf>,
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
    if let Some(out) = &args.out {
        save_plan(&plan, out)?;
        printer.status(&format!(
            "Saved the plan to {0}; `provision apply {0}` executes exactly it.",
            out.display()
        ));
    }
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
    let prepared = super::node::with_live_gpus(prepared, targets, printer)?;
    let desired = select(prepared.desired, targets)?;
    let binary = Arc::new(AgentBinary::current()?);
    let mut conns = Connections::new(&prepared.loaded, targets, binary, printer);
    conns.warn_insecure();
    let plan = online::plan(inventory, &desired, targets.verify_full, &mut |d| {
        printer.status(&format!("reading {}", d.target.heading()));
        conns.reader(d)
    })?;
    conns.report_calls();
    Ok(plan)
}

/// Writes `plan` to `path` atomically (a temp file beside it, then a rename).
fn save_plan(plan: &Plan, path: &Path) -> anyhow::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut text = serde_json::to_string_pretty(plan)?;
    text.push('\n');
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot save the plan as {}", path.display()))
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
