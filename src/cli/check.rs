//! `provision check`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision check`.
#[derive(Debug, Args)]
pub struct CheckArgs {}

/// Runs `provision check`.
pub fn run(_args: &CheckArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
