//! `provision plan`: what would change to make reality match the inventory.

use std::path::PathBuf;

use clap::Args;

use super::{ExitStatus, prepare};
use crate::engine::offline_plan;
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
}

/// Runs `provision plan`.
pub fn run(args: &PlanArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    if !args.offline {
        anyhow::bail!(crate::diagnostic::Diagnostic::new(
            "planning against the real nodes is not built yet: reading Proxmox and the guests comes with the guest reconciler and Proxmox issues"
        )
        .hint(format!(
            "`provision plan --offline {}` plans against an empty world and works anywhere",
            args.inventory.display()
        )));
    }
    let plan = offline_plan(&args.inventory.display().to_string(), &prepared.desired);
    print_plan(&plan, args.json, printer)?;
    Ok(if args.detailed_exitcode && plan.summary.has_changes() {
        ExitStatus::Changes
    } else {
        ExitStatus::Success
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
