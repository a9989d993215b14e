//! `provision gpu`: GPU facts and checks on this machine.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision gpu`.
#[derive(Debug, Args)]
pub struct GpuArgs {}

/// Runs `provision gpu`.
pub fn run(_args: &GpuArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    anyhow::bail!("GPU facts are not built yet (issue: GPU and CUDA facts)")
}
