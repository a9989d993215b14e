//! What runs on the target. provision pushes its own binary there (content-addressed
//! under `/var/lib/provision/`) and runs `provision agent`, which reads one JSON
//! [`Request`] on stdin and answers with JSON lines on stdout: all facts of a host in one
//! round trip, all steps of an apply in one more, and large work (hashing, downloads) next
//! to the data instead of through the workstation.

pub mod cache;
pub mod client;

use std::io::{BufRead, Write};
use std::time::Instant;

use crate::resources::wire::{Answer, Event, PROTOCOL_VERSION, Request, answer};

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
        Request::Apply { steps } => {
            for (index, step) in steps.iter().enumerate() {
                emit(&Event::StepStarted {
                    index,
                    description: step.describe(),
                })?;
                let started = Instant::now();
                let result = step.run();
                let failed = result.is_err();
                let (detail, error, hints) = match result {
                    Ok(detail) => (detail, None, Vec::new()),
                    Err(e) => (None, Some(e.message), e.hints),
                };
                emit(&Event::StepDone {
                    index,
                    error,
                    hints,
                    detail,
                    millis: started.elapsed().as_millis() as u64,
                })?;
                if failed {
                    break;
                }
            }
            // Only an apply stamps its use and prunes the cache, and only what is long
            // unused and not running; neither ever fails the apply.
            if let Some(exe) = &exe
                && let Some(bin) = exe.parent()
            {
                let _ = cache::stamp(exe);
                let _ = cache::prune(bin, exe, cache::PRUNE_AFTER);
            }
            Ok(())
        }
    }
}
