//! `provision-agent`: what provision pushes to its targets (see `provision::agent`). Started
//! by the client as `<agent> agent` and by itself as `<agent> agent --run DIR`; `--version`
//! says which protocol it speaks. Not meant to be typed by people.

use std::path::PathBuf;
use std::process::ExitCode;

use provision::resources::wire::PROTOCOL_VERSION;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let strs: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    let run = match strs.as_slice() {
        [Some("agent")] => None,
        [Some("agent"), Some("--run"), _] => Some(PathBuf::from(&args[2])),
        [Some("--version")] => {
            println!(
                "provision-agent {} (protocol {PROTOCOL_VERSION})",
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!(
                "error: provision-agent is started by provision on its targets\n\
                 hint: it takes `agent`, `agent --run DIR` or `--version`"
            );
            return ExitCode::from(1);
        }
    };
    match provision::agent::main(run.as_deref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
