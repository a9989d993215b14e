//! The command line.

use std::process::ExitCode;

/// Runs the CLI.
pub fn main() -> ExitCode {
    ExitCode::SUCCESS
}
