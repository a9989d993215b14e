//! `provision plan`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {}

/// Runs `provision plan`.
pub fn run(_args: &PlanArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
