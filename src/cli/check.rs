//! `provision check`: a read-only drift check for CI (exit 0 clean, 2 drift, 1 error).

use std::path::PathBuf;

use clap::Args;

use super::{ExitStatus, prepare};
use crate::diagnostic::Diagnostic;
use crate::printer::Printer;

/// Arguments of `provision check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Print the drift as a JSON plan.
    #[arg(long)]
    pub json: bool,
}

/// Runs `provision check`.
pub fn run(args: &CheckArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    // Validate first, so a bad inventory fails the same way here as everywhere.
    prepare(&args.inventory)?;
    Err(Diagnostic::new(
        "the drift check cannot read the targets yet: reading guests over SSH and containers through the Proxmox API are not built",
    )
    .hint("until then, `provision plan --offline` shows what the inventory declares")
    .into())
}
