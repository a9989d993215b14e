//! `provision check`: a read-only drift check for CI (exit 0 clean, 2 drift, 1 error).

use std::path::PathBuf;

use clap::Args;

use super::plan::{print_read, read};
use super::targets::TargetArgs;
use super::{ExitStatus, from_engine, from_session, load_valid};
use crate::printer::Printer;
use crate::session::ReadSession;
use crate::timing;

/// Arguments of `provision check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Print the drift as a JSON plan.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// Runs `provision check`: reads every selected target and reports drift. It holds a
/// read session, which has no writer.
pub fn run(args: &CheckArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let start = std::time::Instant::now();
    let (loaded, library) =
        timing::time("inventory: load, render", || load_valid(&args.inventory))?;
    let session =
        ReadSession::open(&loaded, args.targets.settings(), printer).map_err(from_session)?;
    let read = read(&session, &args.inventory, &library, &args.targets)?;
    session.report_calls();
    // The drift of every target read is shown even when others could not be read; then
    // the exit code says error (1) over drift (2).
    timing::time("print", || print_read(&read, args.json, printer))?;
    printer.verbose(&timing::render(&timing::take(), start));
    let plan = read.whole().map_err(from_engine)?;
    Ok(if plan.summary.has_changes() {
        ExitStatus::Changes
    } else {
        ExitStatus::Success
    })
}
