//! `provision plan`: what would change to make reality match the inventory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::targets::{TargetArgs, select};
use super::{ExitStatus, from_engine, from_session, load_valid, prepare};
use crate::compile::Library;
use crate::engine::offline_plan;
use crate::engine::reconcile;
use crate::plan::{Plan, render_human};
use crate::printer::Printer;
use crate::session::{Api, ReadSession, Session};
use crate::timing;

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
    let start = std::time::Instant::now();
    let inventory = args.inventory.display().to_string();
    let read = if args.offline {
        let prepared = timing::time("inventory: load, render", || prepare(&args.inventory))?;
        let desired = select(prepared.desired, &args.targets)?;
        reconcile::PartialPlan {
            plan: offline_plan(&inventory, &desired),
            failures: Vec::new(),
        }
    } else {
        let (loaded, library) =
            timing::time("inventory: load, render", || load_valid(&args.inventory))?;
        let session =
            ReadSession::open(&loaded, args.targets.settings(), printer).map_err(from_session)?;
        let read = read(&session, &args.inventory, &library, &args.targets)?;
        session.report_calls();
        read
    };
    // The targets that were read are shown even when others could not be; a plan that
    // misses some is an error and is not saved.
    timing::time("print", || print_read(&read, args.json, printer))?;
    printer.verbose(&timing::render(&timing::take(), start));
    let plan = read.whole().map_err(from_engine)?;
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

/// Reads the plan of the targets `args` selects through `session` (`Session::plan`).
pub fn read<A: Api>(
    session: &Session<'_, A>,
    inventory: &Path,
    library: &Library,
    args: &TargetArgs,
) -> anyhow::Result<reconcile::PartialPlan> {
    session
        .plan(
            &inventory.display().to_string(),
            library,
            &args.read_options(),
        )
        .map_err(from_session)
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

/// Prints the plan of the targets read; when some could not be, "no changes" is not
/// claimed for them (the error that follows names them).
pub fn print_read(
    read: &reconcile::PartialPlan,
    json: bool,
    printer: &Printer,
) -> anyhow::Result<()> {
    if read.failures.is_empty() || json || read.plan.summary.has_changes() {
        return print_plan(&read.plan, json, printer);
    }
    printer.result(&format!(
        "No changes in the {} target(s) read; {} could not be read (below).\n",
        read.plan.targets.len(),
        read.failures.len()
    ));
    Ok(())
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
