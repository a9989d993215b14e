//! `provision apply`: plan, show, confirm, then execute exactly that plan.

use std::path::PathBuf;

use clap::Args;

use super::{ExitStatus, prepare};
use crate::diagnostic::Diagnostic;
use crate::printer::Printer;

/// Arguments of `provision apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    /// Print the plan and the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `provision apply`.
pub fn run(args: &ApplyArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    prepare(&args.inventory)?;
    Err(Diagnostic::new(
        "apply cannot change targets yet: the guest reconciler and the Proxmox client are not built",
    )
    .hint("`provision plan --offline` shows what apply will do")
    .into())
}
