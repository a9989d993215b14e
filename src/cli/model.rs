//! `provision model pull|verify`: the model store's engine, by hand.

use clap::{Args, Subcommand};

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download a model from a Hugging Face hub, verifying every file.
    Pull,
    /// Verify a model folder against its verification record.
    Verify,
}

/// Runs `provision model`.
pub fn run(args: &ModelArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    match args.command {
        ModelCommand::Pull | ModelCommand::Verify => {
            anyhow::bail!("the model store is not built yet (issue: Model store)")
        }
    }
}
