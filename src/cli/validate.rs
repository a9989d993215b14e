//! `provision validate`: parse and validate an inventory.

use std::path::PathBuf;

use clap::Args;

use super::{ExitStatus, prepare};
use crate::printer::Printer;

/// Arguments of `provision validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The inventory file.
    pub inventory: PathBuf,
}

/// Runs `provision validate`: exit 0 when valid; errors are printed by the caller.
pub fn run(args: &ValidateArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    let inv = &prepared.loaded.inventory;
    let containers: usize = inv.nodes.values().map(|n| n.containers.len()).sum();
    let resources: usize = prepared.desired.iter().map(|t| t.resources.len()).sum();
    printer.result(&format!(
        "{} is valid: {} node(s), {} container(s), {} resource(s)\n",
        args.inventory.display(),
        inv.nodes.len(),
        containers,
        resources
    ));
    Ok(ExitStatus::Success)
}
