//! `provision render`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision render`.
#[derive(Debug, Args)]
pub struct RenderArgs {}

/// Runs `provision render`.
pub fn run(_args: &RenderArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
