//! `provision validate`.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {}

/// Runs `provision validate`.
pub fn run(_args: &ValidateArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("not built yet")
}
