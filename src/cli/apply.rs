//! `provision apply`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {}

/// Runs `provision apply`.
pub fn run(_args: &ApplyArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
