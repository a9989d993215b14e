//! Readiness after a (re)start, told apart from its three failures. The seeds lost time to
//! each: a crash loop that `systemctl is-active` called active, a hang at NCCL init that
//! looked like a slow load, and a slow load that looked like a hang. [`Gate`] turns a
//! series of [`Observation`]s into a [`Verdict`]; [`watch`] gathers them on the target.
//! Progress is judged from the journal AND from what the unit's processes do
//! ([`activity`]): a tqdm bar never reaches the journal until loading ends.

pub mod activity;
pub mod http;
pub mod process;
pub mod watch;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The health gate's settings for one service: what must answer, and how long to wait.
/// Part of the service's one description (`resources::service::ServiceSpec`), read by the
/// plan (`check` asks the URL), the deploy and [`watch::watch`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    /// URL that must list `served_model_name` (`http://127.0.0.1:30000/v1/models`); its
    /// port is the one the gate watches open ([`Readiness::port`]).
    pub url: String,
    /// The model name the URL must list.
    pub served_model_name: String,
    /// Give up after this many milliseconds.
    pub deadline_ms: u64,
    /// A hang: nothing moved for this many milliseconds while the port is closed.
    pub stall_timeout_ms: u64,
    /// How often to look, in milliseconds.
    pub poll_interval_ms: u64,
}

impl Readiness {
    /// The port the server listens on, on the target: the URL's (its scheme's default when
    /// it names none), so the port exists once; `None` for a URL that does not parse.
    pub fn port(&self) -> Option<u16> {
        url::Url::parse(&self.url).ok()?.port_or_known_default()
    }
}

/// What one poll saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observation {
    /// Time since the (re)start.
    pub elapsed: Duration,
    /// systemd's `ActiveState`.
    pub active_state: String,
    /// systemd's `SubState`.
    pub sub_state: String,
    /// systemd's `NRestarts`.
    pub restarts: u32,
    /// The main process, when there is one.
    pub main_pid: Option<u32>,
    /// `ExecMainStatus` (the last exit status).
    pub exit_status: Option<i32>,
    /// Journal lines of the unit that are new since the previous poll.
    pub new_lines: Vec<String>,
    /// What the unit's processes have done so far (cumulative counters).
    pub activity: activity::Activity,
    /// Whether the server's port accepts connections.
    pub port_open: bool,
    /// Whether the readiness URL lists the served model.
    pub model_listed: bool,
    /// Whether `/health` answered 200.
    pub healthy: bool,
}

/// What the gate concluded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum Verdict {
    /// Serving: the model is listed and `/health` is 200.
    Ready {
        /// Time from (re)start to ready.
        after_ms: u64,
    },
    /// The process keeps dying (or died for good).
    CrashLoop {
        /// What systemd showed (`activating (auto-restart)`, `failed (failed)`).
        state: String,
        /// Restarts seen since the gate began.
        restarts: u32,
        /// The last exit status.
        exit_status: Option<i32>,
        /// The end of the journal: the traceback, usually.
        evidence: Vec<String>,
    },
    /// Alive, port closed, and nothing moved for the stall timeout: no journal line, no
    /// output written, nothing read, no CPU time, no GPU memory growth.
    Hang {
        /// The last log line, where it is stuck.
        stalled_at: String,
        /// How long everything had been still.
        silent_ms: u64,
    },
    /// Not ready when the deadline passed, and nothing moved for the stall timeout since
    /// (a load that keeps moving is waited for past the deadline).
    Timeout {
        /// The last log line.
        last_line: String,
    },
}

impl Verdict {
    /// One line for people.
    pub fn summary(&self) -> String {
        match self {
            Verdict::Ready { after_ms } => format!("ready after {:.1}s", *after_ms as f64 / 1000.0),
            Verdict::CrashLoop {
                state,
                restarts,
                exit_status,
                ..
            } => format!(
                "crash loop: {state}, {restarts} restart(s), last exit status {}",
                exit_status.map_or("unknown".to_string(), |s| s.to_string())
            ),
            Verdict::Hang {
                stalled_at,
                silent_ms,
            } => format!(
                "hang: stalled at: {stalled_at} (no log line, output, reads, CPU or GPU memory growth for {}s, port closed)",
                silent_ms / 1000
            ),
            Verdict::Timeout { last_line } => {
                format!("not ready by the deadline and no progress since; last line: {last_line}")
            }
        }
    }
}

/// Limits the gate works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Give up after this long, unless the load is still making progress: a cold first
    /// start (hundreds of GB read, Triton autotuning, CUDA graph capture) may pass any
    /// guess while healthy, and calling a stopped load is the stall timeout's job.
    pub deadline: Duration,
    /// This long without progress of any kind, with the process alive and the port
    /// closed, is a hang.
    pub stall_timeout: Duration,
}

/// Classifies observations as they come.
#[derive(Debug, Clone)]
pub struct Gate {
    limits: Limits,
    initial_restarts: Option<u32>,
    last_line: String,
    last_progress: Duration,
    tail: Vec<String>,
    previous: Option<(Duration, activity::Activity)>,
    moved: activity::Moved,
}

/// Journal lines kept as evidence.
const TAIL: usize = 40;

impl Gate {
    /// A gate with `limits`, starting now.
    pub fn new(limits: Limits) -> Self {
        Gate {
            limits,
            initial_restarts: None,
            last_line: String::new(),
            last_progress: Duration::ZERO,
            tail: Vec::new(),
            previous: None,
            moved: activity::Moved::default(),
        }
    }

    /// What the processes did since the previous observation.
    pub fn moved(&self) -> activity::Moved {
        self.moved
    }

    /// The latest log line seen (progress for people while loading).
    pub fn last_line(&self) -> &str {
        &self.last_line
    }

    /// Feeds one observation; `Some` once the outcome is known.
    pub fn observe(&mut self, o: &Observation) -> Option<Verdict> {
        let initial = *self.initial_restarts.get_or_insert(o.restarts);
        if let Some(line) = o.new_lines.iter().rev().find(|l| !l.trim().is_empty()) {
            self.last_line = line.trim().to_string();
            self.last_progress = o.elapsed;
        }
        self.moved = match self.previous {
            Some((at, before)) => o
                .activity
                .moved_since(&before, o.elapsed.saturating_sub(at).as_millis() as u64),
            None => activity::Moved::default(),
        };
        if self.moved.any() {
            self.last_progress = o.elapsed;
        }
        self.previous = Some((o.elapsed, o.activity));
        self.tail.extend(o.new_lines.iter().cloned());
        if self.tail.len() > TAIL {
            self.tail.drain(..self.tail.len() - TAIL);
        }
        // The old process answers until it has stopped (`restart --no-block` returns at
        // once): only the unit's new, active run can be ready. Unknown reads as active.
        let stopping = matches!(
            o.active_state.as_str(),
            "deactivating" | "inactive" | "failed"
        );
        if o.model_listed && o.healthy && !stopping {
            return Some(Verdict::Ready {
                after_ms: o.elapsed.as_millis() as u64,
            });
        }
        let restarted = o.restarts > initial;
        let auto_restart = o.active_state == "activating" && o.sub_state == "auto-restart";
        let dead = o.active_state == "failed"
            || (o.active_state == "inactive" && o.elapsed > Duration::ZERO);
        if restarted || auto_restart || dead {
            return Some(Verdict::CrashLoop {
                state: format!("{} ({})", o.active_state, o.sub_state),
                restarts: o.restarts.saturating_sub(initial),
                exit_status: o.exit_status,
                evidence: self.tail.clone(),
            });
        }
        let silent = o.elapsed.saturating_sub(self.last_progress);
        if o.main_pid.is_some() && !o.port_open && silent >= self.limits.stall_timeout {
            return Some(Verdict::Hang {
                stalled_at: if self.last_line.is_empty() {
                    "(no log output at all)".to_string()
                } else {
                    self.last_line.clone()
                },
                silent_ms: silent.as_millis() as u64,
            });
        }
        // Past the deadline, a load that moved within the stall timeout is waited for.
        if o.elapsed >= self.limits.deadline && silent >= self.limits.stall_timeout {
            return Some(Verdict::Timeout {
                last_line: self.last_line.clone(),
            });
        }
        None
    }

    /// Whether the deadline has passed (and the gate is waiting because the load moves).
    pub fn overdue(&self, elapsed: Duration) -> bool {
        elapsed >= self.limits.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            deadline: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(5),
        }
    }

    fn running(secs: u64, lines: &[&str]) -> Observation {
        Observation {
            elapsed: Duration::from_secs(secs),
            active_state: "active".into(),
            sub_state: "running".into(),
            main_pid: Some(42),
            new_lines: lines.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn crash_loop_that_is_active_calls_active() {
        let mut g = Gate::new(limits());
        assert_eq!(
            g.observe(&running(0, &["Traceback (most recent call last):"])),
            None
        );
        let o = Observation {
            elapsed: Duration::from_secs(2),
            active_state: "activating".into(),
            sub_state: "auto-restart".into(),
            restarts: 1,
            exit_status: Some(1),
            new_lines: vec![
                "ValueError: Speculative decoding for Qwen3_5MoeForCausalLM is not compatible"
                    .into(),
            ],
            ..Default::default()
        };
        match g.observe(&o) {
            Some(Verdict::CrashLoop {
                restarts,
                exit_status,
                evidence,
                ..
            }) => {
                assert_eq!((restarts, exit_status), (1, Some(1)));
                assert!(evidence.last().unwrap().contains("ValueError"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hang_is_called_after_the_stall_timeout_not_the_deadline() {
        let mut g = Gate::new(limits());
        assert_eq!(
            g.observe(&running(1, &["Init torch distributed begin."])),
            None
        );
        assert_eq!(g.observe(&running(4, &[])), None);
        match g.observe(&running(6, &[])) {
            Some(Verdict::Hang {
                stalled_at,
                silent_ms,
            }) => {
                assert_eq!(stalled_at, "Init torch distributed begin.");
                assert_eq!(silent_ms, 5000);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_slow_load_that_keeps_talking_is_waited_for() {
        let mut g = Gate::new(limits());
        for s in 0..30 {
            let line = format!(
                "Loading safetensors checkpoint shards: {}% Completed",
                s * 3
            );
            assert_eq!(g.observe(&running(s * 2, &[&line])), None, "at {s}");
        }
        let mut ready = running(61, &["The server is fired up and ready to roll!"]);
        ready.port_open = true;
        ready.model_listed = true;
        ready.healthy = true;
        assert_eq!(g.observe(&ready), Some(Verdict::Ready { after_ms: 61_000 }));
    }

    /// A load that writes only carriage-return updates (tqdm): no journal line for far
    /// longer than the stall timeout, but output keeps being written.
    #[test]
    fn a_tqdm_load_without_journal_lines_is_waited_for() {
        let mut g = Gate::new(limits());
        assert_eq!(
            g.observe(&running(
                0,
                &["Using model weights format ['*.safetensors']"]
            )),
            None
        );
        for s in 1..=30 {
            let mut o = running(s, &[]);
            o.activity.processes = 1;
            o.activity.written = 1000 + s * 90;
            assert_eq!(g.observe(&o), None, "at {s}s");
            assert_eq!(g.moved().describe(), "output");
        }
        // Reads alone (an mmap-ed checkpoint faulting in) count as well.
        for s in 31..=45 {
            let mut o = running(s, &[]);
            o.activity.written = 1000 + 30 * 90;
            o.activity.read = s * 1_000_000;
            assert_eq!(g.observe(&o), None, "at {s}s");
        }
        // Then everything stops: a hang after the stall timeout.
        let mut still = running(46, &[]);
        still.activity.written = 1000 + 30 * 90;
        still.activity.read = 45 * 1_000_000;
        assert_eq!(g.observe(&still), None);
        still.elapsed = Duration::from_secs(50);
        match g.observe(&still) {
            Some(Verdict::Hang { silent_ms, .. }) => assert_eq!(silent_ms, 5000),
            other => panic!("{other:?}"),
        }
    }

    /// GPU memory filling up is progress; a silent process with flat counters is not.
    #[test]
    fn gpu_memory_growth_is_progress_and_flat_counters_are_not() {
        let mut g = Gate::new(limits());
        for s in 0..20 {
            let mut o = running(s, &[]);
            o.activity.gpu_mib = Some(1000 + s * 4000);
            assert_eq!(g.observe(&o), None, "at {s}s");
        }
        let mut g = Gate::new(limits());
        let mut verdict = None;
        for s in 0..20 {
            let mut o = running(
                s,
                if s == 0 {
                    &["Init torch distributed begin."]
                } else {
                    &[]
                },
            );
            o.activity = activity::Activity {
                processes: 1,
                written: 500,
                read: 9000,
                cpu_ms: 1200,
                gpu_mib: Some(1024),
            };
            if let Some(v) = g.observe(&o) {
                verdict = Some((s, v));
                break;
            }
        }
        match verdict {
            Some((5, Verdict::Hang { stalled_at, .. })) => {
                assert_eq!(stalled_at, "Init torch distributed begin.")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn open_port_while_warming_up_is_not_a_hang() {
        let mut g = Gate::new(limits());
        let mut o = running(10, &["Uvicorn running on http://0.0.0.0:30000"]);
        o.port_open = true;
        assert_eq!(g.observe(&o), None);
        let mut o = running(20, &[]);
        o.port_open = true;
        assert_eq!(g.observe(&o), None);
    }

    #[test]
    fn deadline_ends_a_server_that_stopped_moving() {
        // The port is open (warming up, /health not 200), so silence is not a hang; past
        // the deadline with nothing moving for the stall timeout, it is a timeout.
        let mut g = Gate::new(limits());
        let mut o = running(50, &["Load weight begin."]);
        o.port_open = true;
        assert_eq!(g.observe(&o), None);
        let mut o = running(60, &[]);
        o.port_open = true;
        assert_eq!(
            g.observe(&o),
            Some(Verdict::Timeout {
                last_line: "Load weight begin.".into()
            })
        );
    }

    #[test]
    fn a_load_that_keeps_moving_is_waited_for_past_the_deadline() {
        let mut g = Gate::new(limits());
        // A log line every 4 s (under the 5 s stall timeout) up to twice the deadline.
        for s in (0..=120).step_by(4) {
            let o = running(s, &["Loading safetensors checkpoint shards"]);
            assert_eq!(g.observe(&o), None, "at {s}s");
        }
        assert!(g.overdue(Duration::from_secs(120)));
        let o = Observation {
            port_open: true,
            model_listed: true,
            healthy: true,
            ..running(122, &[])
        };
        assert_eq!(g.observe(&o), Some(Verdict::Ready { after_ms: 122_000 }));
        // Once it stops moving past the deadline, it ends there (a hang with the port
        // closed, within the stall timeout).
        let mut g = Gate::new(limits());
        assert_eq!(g.observe(&running(61, &["Capturing CUDA graphs"])), None);
        assert!(matches!(
            g.observe(&running(66, &[])),
            Some(Verdict::Hang { .. })
        ));
    }
}
