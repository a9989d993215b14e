//! What runs on the target. provision pushes the agent it carries there (its own build,
//! `crates/agent`: no CLI, no SSH client, static; content-addressed under
//! `/var/lib/provision/`) and runs `<agent> agent`, which reads one JSON [`Request`] on
//! stdin and answers with JSON lines on stdout: all facts of a host in one
//! round trip; an apply's steps run detached from the connection ([`run`]), followed by
//! short round trips; large work (hashing, downloads) runs next to the data instead of
//! through the workstation.

pub mod attach;
pub mod cache;
pub mod client;
pub mod run;

use std::io::{BufRead, Write};
use std::path::Path;

use crate::resources::wire::{Answer, Event, PROTOCOL_VERSION, Request, answer};

/// The agent's command line as the client and the runner start it: `agent` answers one
/// request on stdin; `agent --run DIR` is the detached apply `run::start` began. Shared by
/// `provision agent` and the agent's own build.
pub fn main(run: Option<&Path>) -> anyhow::Result<()> {
    crate::machine::set_state_dir(run::state_dir());
    if let Some(dir) = run {
        run::runner(dir)?;
        return Ok(());
    }
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    serve(&mut stdin.lock(), &mut stdout.lock())?;
    Ok(())
}

/// Runs the agent: one request from `input`, events to `output`.
pub fn serve(input: &mut dyn BufRead, output: &mut dyn Write) -> std::io::Result<()> {
    let mut emit = |e: &Event| -> std::io::Result<()> {
        let line = serde_json::to_string(e).map_err(std::io::Error::other)?;
        writeln!(output, "{line}")?;
        output.flush()
    };
    // From the agent cache: hold our binary (a shared lock, nothing written) so that no
    // prune removes it while this request runs.
    let exe = std::env::current_exe().ok().filter(|p| cache::is_cached(p));
    let _hold = exe.as_deref().and_then(|p| cache::hold(p).ok());
    emit(&Event::Hello {
        protocol: PROTOCOL_VERSION,
        version: env!("CARGO_PKG_VERSION").to_string(),
    })?;
    let mut text = String::new();
    input.read_to_string(&mut text)?;
    let request: Request = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(e) => {
            return emit(&Event::BadRequest {
                error: e.to_string(),
            });
        }
    };
    match request {
        Request::Probe {
            probes,
            verify_full,
        } => {
            let answers = probes
                .into_iter()
                .map(|probe| match answer(&probe, verify_full) {
                    Ok(fact) => Answer {
                        probe,
                        fact: Some(fact),
                        error: None,
                    },
                    Err(error) => Answer {
                        probe,
                        fact: None,
                        error: Some(error.to_string()),
                    },
                })
                .collect();
            emit(&Event::Facts { answers })
        }
        Request::Start { run, steps, holder } => emit(&answer_run(run::start(&run, steps, holder))),
        Request::Follow {
            run,
            offset,
            wait_ms,
        } => emit(&answer_run(run::follow(
            &run,
            offset,
            std::time::Duration::from_millis(wait_ms.min(60_000)),
        ))),
        Request::Stop { run, now } => emit(&answer_run(run::stop(&run, now))),
    }
}

/// A run's answer, or why there is none (as a bad request: the client stops on it).
fn answer_run(r: Result<Event, run::RunError>) -> Event {
    r.unwrap_or_else(|e| Event::BadRequest {
        error: e.to_string(),
    })
}
