//! `provision agent`: what runs on a target (see `src/agent/`). Reads one JSON request on
//! stdin and answers with JSON lines on stdout; not meant to be typed by people.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Run the detached apply whose folder this is (started by the agent itself).
    #[arg(long, hide = true, value_name = "DIR")]
    pub run: Option<std::path::PathBuf>,
}

/// Runs the agent on this machine.
pub fn run(args: &AgentArgs, _printer: &Printer) -> anyhow::Result<ExitStatus> {
    crate::agent::main(args.run.as_deref())?;
    Ok(ExitStatus::Success)
}
