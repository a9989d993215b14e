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

use std::time::{Duration, Instant};

use crate::resources::wire::{Answer, Event, PROTOCOL_VERSION, Probe, Request, answer};

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
    let started = Instant::now();
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
            let ready = started.elapsed();
            let answers = answer_all(probes, verify_full);
            emit(&Event::Facts {
                answers,
                ready_us: Some(micros(ready)),
                probes_us: Some(micros(started.elapsed() - ready)),
            })
        }
        Request::Start { run, steps, holder } => emit(&answer_run(run::start(&run, steps, holder))),
        Request::Follow {
            run,
            offset,
            wait_ms,
        } => emit(&answer_run(run::follow(
            &run,
            offset,
            Duration::from_millis(wait_ms.min(60_000)),
        ))),
        Request::Stop { run, now } => emit(&answer_run(run::stop(&run, now))),
    }
}

/// Answers `probes` in their order, each on a thread of its own: they only read, and most
/// of a probe's time is waiting (a file, a `git` or `systemctl` it runs), so the answer
/// takes as long as the slowest probe instead of their sum. Each answer says its time.
fn answer_all(probes: Vec<Probe>, verify_full: bool) -> Vec<Answer> {
    let one = |probe: Probe| {
        let start = Instant::now();
        let (fact, error) = match answer(&probe, verify_full) {
            Ok(fact) => (Some(fact), None),
            Err(error) => (None, Some(error.to_string())),
        };
        Answer {
            probe,
            fact,
            error,
            took_us: Some(micros(start.elapsed())),
        }
    };
    std::thread::scope(|s| {
        let running: Vec<_> = probes
            .into_iter()
            .map(|probe| {
                let mine = probe.clone();
                std::thread::Builder::new()
                    .spawn_scoped(s, move || one(mine))
                    .map_err(|_| probe)
            })
            .collect();
        // A thread that could not start (a process limit) answers here, in turn.
        running
            .into_iter()
            .map(|r| match r {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(probe) => one(probe),
            })
            .collect()
    })
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A run's answer, or why there is none (as a bad request: the client stops on it).
fn answer_run(r: Result<Event, run::RunError>) -> Event {
    r.unwrap_or_else(|e| Event::BadRequest {
        error: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe request's answer keeps the probes' order although they run concurrently, and
    /// says the agent's own time: its start, the probes' wall and each probe's.
    #[test]
    fn probes_answer_in_order_with_their_times() {
        let dir = tempfile::tempdir().unwrap();
        let probes: Vec<Probe> = (0..6)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                if i % 2 == 0 {
                    std::fs::write(&path, format!("file {i}\n")).unwrap();
                }
                Probe::Path(crate::resources::file::PathProbe {
                    path: path.display().to_string(),
                })
            })
            .collect();
        let request = serde_json::to_string(&Request::Probe {
            probes: probes.clone(),
            verify_full: false,
        })
        .unwrap();
        let mut out = Vec::new();
        serve(&mut request.as_bytes(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let event: Event = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
        let Event::Facts {
            answers,
            ready_us,
            probes_us,
        } = event
        else {
            panic!("not facts: {text}")
        };
        assert!(ready_us.is_some() && probes_us.is_some(), "{text}");
        let asked: Vec<&Probe> = answers.iter().map(|a| &a.probe).collect();
        assert_eq!(asked, probes.iter().collect::<Vec<_>>());
        for (i, a) in answers.iter().enumerate() {
            assert!(a.took_us.is_some(), "{a:?}");
            let alone = answer(&probes[i], false).unwrap();
            assert_eq!(a.fact.as_ref(), Some(&alone), "probe {i}");
        }
    }
}
