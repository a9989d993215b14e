//! The client's side of a detached run (see [`super::run`]): start it, follow its events by
//! offset in short round trips, and ride out a dropped connection by asking again from the
//! same offset. Each step has its own limit ([`limit`]): a total deadline, or for a download
//! a stall deadline (no new byte for that long). A step past its limit is stopped at once;
//! `Ctrl-C` asks the run to stop after its current step, a second `Ctrl-C` leaves it running
//! on the target (it keeps the target's lock until it ends). A run left by a provision that
//! is gone ([`holder_gone`]) is waited for instead of refused, so the next apply can read
//! what it left and do the rest.

use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::client::AgentError;
use crate::access::OpOutcome;
use crate::progress::Progress;
use crate::resources::wire::{Event, Holder, Request, Step};

/// Receives every event of a target's run as it arrives (and the client's own notes, as
/// `Progress::Line`).
pub type Observer = Arc<dyn Fn(&Event) + Send + Sync>;

/// One request to the agent, answered within the given time: its events.
pub type Call<'a> = dyn Fn(&Request, Duration) -> Result<Vec<Event>, AgentError> + 'a;

pub use crate::resources::model::DOWNLOAD_STALL;
pub use crate::resources::wire::Limit;

/// A step's limit: its kind's ([`crate::resources::wire::AgentStep::limit`]).
pub fn limit(step: &Step) -> Limit {
    step.limit()
}

/// How long the client keeps trying to reach a target that dropped the connection.
const REATTACH_FOR: Duration = Duration::from_secs(15 * 60);
/// A run nobody has followed for this long was left by a provision that is gone: a
/// follower asks every few seconds, and a lost connection is retried every 2 s.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(60);
/// How long one follow round trip waits for news on the target.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
static FOLLOWING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if !FOLLOWING.load(Ordering::SeqCst) {
        // Nothing detached to look after: end as an unhandled Ctrl-C would.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// Installs the SIGINT handler once per process; it only counts while a run is followed.
fn watch_interrupts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler only touches atomics and calls _exit.
        unsafe {
            libc::signal(
                libc::SIGINT,
                on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    });
}

/// Marks "a run is followed" for as long as it lives.
struct Following;

impl Following {
    fn new() -> Self {
        watch_interrupts();
        INTERRUPTS.store(0, Ordering::SeqCst);
        FOLLOWING.store(true, Ordering::SeqCst);
        Following
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        FOLLOWING.store(false, Ordering::SeqCst);
    }
}

/// This machine's host name.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
}

/// Who this process is, for the target's lock.
pub fn holder() -> Holder {
    let host = host_name().unwrap_or_else(|| "?".into());
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| {
            // SAFETY: getuid cannot fail.
            format!("uid {}", unsafe { libc::getuid() })
        });
    Holder {
        host,
        pid: std::process::id(),
        user,
        since: super::run::utc_now(),
        run: String::new(),
        agent_pid: 0,
        idle_secs: None,
    }
}

/// A fresh run id: time, this process, a counter.
fn run_id() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}-{}-{}",
        t.as_secs(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Sends one request, trying again while the target cannot be reached, for up to
/// [`REATTACH_FOR`]; `note` hears about each loss and recovery.
fn call_again(
    call: &Call<'_>,
    request: &Request,
    timeout: Duration,
    note: &dyn Fn(String),
) -> Result<Event, AgentError> {
    let mut lost: Option<Instant> = None;
    loop {
        match call(request, timeout) {
            Ok(events) => {
                if lost.is_some() {
                    note("connection back; re-attached to the run".into());
                }
                // The greeting first, then the one answer.
                return events
                    .into_iter()
                    .nth(1)
                    .ok_or_else(|| AgentError::Protocol {
                        target: String::new(),
                        detail: "no answer after the greeting".into(),
                    });
            }
            Err(e @ (AgentError::CannotRun { .. } | AgentError::Push { .. })) => return Err(e),
            Err(e) => {
                let since = *lost.get_or_insert_with(|| {
                    note(format!(
                        "connection lost ({e}); the run goes on on the target; reconnecting"
                    ));
                    Instant::now()
                });
                if since.elapsed() > REATTACH_FOR {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }
    }
}

/// What following a run ended with.
#[derive(Debug)]
pub enum Ended {
    /// Every step ran, or one failed: the outcomes of those that ran.
    Done(Vec<OpOutcome>),
    /// Stopped by Ctrl-C after the current step: the outcomes of those that ran.
    Stopped(Vec<OpOutcome>),
    /// Left running on the target (a second Ctrl-C).
    Detached(Holder),
    /// Another apply holds the target.
    Busy(Holder),
    /// A run left by a provision that is gone held the target; it was followed to its end
    /// and nothing of these steps was started.
    Waited(Holder),
}

/// Whether the provision that started `holder`'s run is gone: it ran on this host and its
/// process is dead, or no client has followed the run for [`ABANDONED_AFTER`].
pub fn holder_gone(holder: &Holder) -> bool {
    let dead_here = host_name().is_some_and(|here| holder.host == here)
        && holder.pid != 0
        && i32::try_from(holder.pid).is_ok_and(|pid| {
            // SAFETY: signal 0 only asks whether the process exists.
            let failed = unsafe { libc::kill(pid, 0) } != 0;
            failed && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        });
    dead_here
        || holder
            .idle_secs
            .is_some_and(|s| s >= ABANDONED_AFTER.as_secs())
}

/// Follows `holder`'s run to its end, showing its events; `Busy` again on Ctrl-C.
fn wait_for_run(
    call: &Call<'_>,
    holder: Holder,
    seen: &dyn Fn(&Event),
    note: &dyn Fn(String),
) -> Result<Ended, AgentError> {
    note(format!(
        "the target is held by run {} of provision pid {} of {}@{}, which is gone; waiting for that run to end",
        holder.run, holder.pid, holder.user, holder.host
    ));
    let mut offset = 0;
    loop {
        if INTERRUPTS.load(Ordering::SeqCst) > 0 {
            return Ok(Ended::Busy(holder));
        }
        let (events, next, running) = follow_once(call, &holder.run, offset, note)?;
        offset = next;
        let quiet = events.is_empty();
        for e in events {
            seen(&e);
            if matches!(e, Event::Finished { .. }) {
                return Ok(Ended::Waited(holder));
            }
        }
        if quiet && !running {
            // Its runner ended without its last word (killed): the lock is free all the same.
            return Ok(Ended::Waited(holder));
        }
    }
}

/// Starts `steps` as a detached run and follows it to its end.
pub fn run_detached(
    call: &Call<'_>,
    steps: Vec<Step>,
    observe: &Option<Observer>,
) -> Result<Ended, AgentError> {
    let seen = |e: &Event| {
        if let Some(o) = observe {
            o(e)
        }
    };
    let current = std::sync::atomic::AtomicUsize::new(0);
    let note = |text: String| {
        seen(&Event::Progress {
            index: current.load(Ordering::Relaxed),
            progress: Progress::Line { text },
        })
    };
    let run = run_id();
    let limits: Vec<Limit> = steps.iter().map(limit).collect();
    let descriptions: Vec<String> = steps.iter().map(Step::describe).collect();
    let start = Request::Start {
        run: run.clone(),
        steps,
        holder: holder(),
    };
    let _following = Following::new();
    let holder = match call_again(call, &start, Duration::from_secs(120), &note)? {
        Event::Started { holder } => holder,
        Event::Busy { holder } if holder_gone(&holder) && !holder.run.is_empty() => {
            return wait_for_run(call, holder, &seen, &note);
        }
        Event::Busy { holder } => return Ok(Ended::Busy(holder)),
        other => return Err(unexpected(other)),
    };
    let mut offset = 0;
    let mut outcomes = Vec::new();
    let mut step_started: Option<(usize, Instant)> = None;
    let mut last_news = Instant::now();
    let mut last_done = 0;
    let mut stopping = false;
    let mut overdue: Option<(usize, String)> = None;
    loop {
        match INTERRUPTS.load(Ordering::SeqCst) {
            0 => {}
            1 if !stopping => {
                stopping = true;
                note("Ctrl-C: the run stops after its current step, which finishes (Ctrl-C again to leave it running on the target)".into());
                call_again(
                    call,
                    &Request::Stop {
                        run: run.clone(),
                        now: false,
                    },
                    Duration::from_secs(60),
                    &note,
                )?;
            }
            1 => {}
            _ => return Ok(Ended::Detached(holder)),
        }
        if let (Some((i, since)), None) = (step_started, &overdue) {
            let (late, what) = match limits[i] {
                Limit::Total(d) => (
                    since.elapsed() > d,
                    format!("did not finish within {}", human(d)),
                ),
                Limit::Stall(d) => (
                    last_news.elapsed() > d,
                    format!("made no progress for {}", human(d)),
                ),
                Limit::Quiet(d) => (
                    last_news.elapsed() > d,
                    format!("reported nothing for {}", human(d)),
                ),
            };
            if late {
                note(format!("{} {what}; stopping it", descriptions[i]));
                let answer = call_again(
                    call,
                    &Request::Stop {
                        run: run.clone(),
                        now: true,
                    },
                    Duration::from_secs(60),
                    &note,
                )?;
                if let Event::Stopping { running: true } = answer {
                    note(format!(
                        "the agent could not end run {run} (SIGTERM, then SIGKILL): it may still be running on the target"
                    ));
                }
                overdue = Some((i, what));
            }
        }
        let (events, next, running) = follow_once(call, &run, offset, &note)?;
        offset = next;
        let quiet = events.is_empty();
        for e in events {
            seen(&e);
            match e {
                Event::StepStarted { index, .. } => {
                    current.store(index, Ordering::Relaxed);
                    step_started = Some((index, Instant::now()));
                    last_news = Instant::now();
                    last_done = 0;
                }
                Event::Progress {
                    progress: Progress::Bytes { done, .. },
                    ..
                } if done > last_done => {
                    last_done = done;
                    last_news = Instant::now();
                }
                Event::Progress {
                    progress: Progress::Checked { .. },
                    ..
                } => last_news = Instant::now(),
                Event::Progress { .. }
                    if step_started.is_some_and(|(i, _)| matches!(limits[i], Limit::Quiet(_))) =>
                {
                    last_news = Instant::now()
                }
                Event::StepDone {
                    index,
                    error,
                    hints,
                    detail,
                    millis,
                } => {
                    step_started = None;
                    outcomes.push(OpOutcome {
                        description: descriptions.get(index).cloned().unwrap_or_default(),
                        error,
                        hints,
                        detail,
                        millis,
                    });
                }
                Event::Finished { stopped } => {
                    return Ok(if stopped {
                        Ended::Stopped(outcomes)
                    } else {
                        Ended::Done(outcomes)
                    });
                }
                _ => {}
            }
        }
        if quiet && !running {
            // The runner is gone without its last word: killed (a deadline, a reboot).
            if let Some((i, since)) = step_started {
                let error = match &overdue {
                    Some((_, what)) => format!(
                        "{what} and was stopped; what it wrote is whole (files are replaced atomically; a download resumes from its partial files)"
                    ),
                    None => {
                        "the agent stopped during this step (killed or the target restarted)".into()
                    }
                };
                outcomes.push(OpOutcome {
                    description: descriptions[i].clone(),
                    error: Some(error),
                    hints: vec!["run apply again: steps already done are not repeated".into()],
                    detail: None,
                    millis: since.elapsed().as_millis() as u64,
                });
            }
            return Ok(Ended::Done(outcomes));
        }
    }
}

/// One follow round trip of `run` from `offset`: its new events, the next offset and
/// whether it still runs.
fn follow_once(
    call: &Call,
    run: &str,
    offset: u64,
    note: &dyn Fn(String),
) -> Result<(Vec<Event>, u64, bool), AgentError> {
    let follow = Request::Follow {
        run: run.to_string(),
        offset,
        wait_ms: FOLLOW_WAIT.as_millis() as u64,
    };
    match call_again(call, &follow, FOLLOW_WAIT + Duration::from_secs(60), note)? {
        Event::Followed {
            events,
            offset,
            running,
        } => Ok((events, offset, running)),
        other => Err(unexpected(other)),
    }
}

fn unexpected(e: Event) -> AgentError {
    let detail = match e {
        Event::BadRequest { error } => error,
        other => format!("unexpected answer {other:?}"),
    };
    AgentError::Protocol {
        target: String::new(),
        detail,
    }
}

/// `90s`, `10m`, `2h`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_have_a_stall_limit_and_writes_a_total() {
        let write = Step::WriteFile(crate::resources::file::WriteFileStep {
            path: "/a".into(),
            content: String::new(),
            owner: "root".into(),
            group: "root".into(),
            mode: 0o644,
        });
        assert_eq!(limit(&write), Limit::Total(Duration::from_secs(300)));
        assert_eq!(human(Duration::from_secs(600)), "10m");
        assert_eq!(human(Duration::from_secs(7200)), "2h");
        assert_eq!(human(Duration::from_secs(61)), "61s");
    }

    #[test]
    fn a_holder_is_gone_when_its_process_here_is_dead_or_nobody_follows() {
        let me = holder();
        assert!(!holder_gone(&me), "this very process is alive");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(holder_gone(&Holder {
            pid: dead,
            ..me.clone()
        }));
        // Elsewhere: only the heartbeat tells.
        let far = Holder {
            host: format!("{}-elsewhere", me.host),
            pid: dead,
            ..me.clone()
        };
        assert!(!holder_gone(&far), "unknown: not gone");
        let fresh = Holder {
            idle_secs: Some(5),
            ..far.clone()
        };
        assert!(!holder_gone(&fresh));
        let stale = Holder {
            idle_secs: Some(ABANDONED_AFTER.as_secs()),
            ..far
        };
        assert!(holder_gone(&stale));
    }
}
