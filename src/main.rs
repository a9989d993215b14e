//! The `provision` binary: parse the command line, run the library, map the outcome to an
//! exit code (0 success / no changes, 1 error, 2 changes pending or drift).

use std::process::ExitCode;

fn main() -> ExitCode {
    provision::cli::main()
}
