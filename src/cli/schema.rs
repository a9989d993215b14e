//! `provision schema`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {}

/// Runs `provision schema`.
pub fn run(_args: &SchemaArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
