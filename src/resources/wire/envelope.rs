//! The envelope of the agent's protocol: the client's [`Request`]s and the agent's
//! [`Event`]s, one JSON object per line.

use serde::{Deserialize, Serialize};

use super::{Fact, Probe, Step};

/// Bumped whenever the request or event format changes incompatibly; the client refuses
/// an agent speaking another version (the binary's hash changes anyway).
pub const PROTOCOL_VERSION: u32 = 2;

/// What the client asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Answer these probes.
    Probe {
        /// The probes.
        probes: Vec<Probe>,
        /// Re-hash model files instead of trusting their verification records.
        #[serde(default)]
        verify_full: bool,
    },
    /// Run these steps detached from the connection, as run `run` (see `agent/run.rs`);
    /// answered with [`Event::Started`] or [`Event::Busy`]. Sending it again with the same
    /// `run` starts nothing new.
    Start {
        /// The run's id, chosen by the client so a lost answer can be asked again.
        run: String,
        /// The steps.
        steps: Vec<Step>,
        /// Who asks, for the lock's message.
        holder: Holder,
    },
    /// The run's events from byte `offset` of its event file, waiting up to `wait_ms` for
    /// the first new one; answered with [`Event::Followed`].
    Follow {
        /// The run.
        run: String,
        /// Where the client is in the event file.
        offset: u64,
        /// How long to wait for something new.
        wait_ms: u64,
    },
    /// Ask the run to stop: after its current step, or at once (the step is killed) when
    /// `now`. Answered with [`Event::Stopping`].
    Stop {
        /// The run.
        run: String,
        /// Kill the current step instead of letting it finish.
        now: bool,
    },
}

/// Who runs an apply on a target: what the lock's message names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The workstation's host name.
    pub host: String,
    /// provision's process id there.
    pub pid: u32,
    /// The user who ran it.
    pub user: String,
    /// When it started, RFC 3339, UTC.
    pub since: String,
    /// The run's id.
    #[serde(default)]
    pub run: String,
    /// The detached agent's process id on the target.
    #[serde(default)]
    pub agent_pid: u32,
    /// Seconds since a client last followed the run (the target's clock), when known: a
    /// run nobody follows was left by a provision that is gone.
    #[serde(default)]
    pub idle_secs: Option<u64>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "provision pid {} of {}@{}, since {} (run {}, agent pid {})",
            self.pid, self.user, self.host, self.since, self.run, self.agent_pid
        )
    }
}

/// One probe's answer, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The probe.
    pub probe: Probe,
    /// The fact, when it could be read.
    pub fact: Option<Fact>,
    /// Why it could not be read.
    pub error: Option<String>,
    /// How long the agent took to answer it, in microseconds (`provision -v`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_us: Option<u64>,
}

/// What the agent says, one JSON object per line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The first line: who is answering.
    Hello {
        /// [`PROTOCOL_VERSION`].
        protocol: u32,
        /// provision's version.
        version: String,
    },
    /// Answers to a probe request.
    Facts {
        /// One per probe, in order.
        answers: Vec<Answer>,
        /// Microseconds from the agent's start to its request read and parsed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ready_us: Option<u64>,
        /// Microseconds from then to the last answer (the probes run concurrently).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probes_us: Option<u64>,
    },
    /// A step began.
    StepStarted {
        /// Its index in the request.
        index: usize,
        /// What it does.
        description: String,
    },
    /// A step ended.
    StepDone {
        /// Its index.
        index: usize,
        /// Why it failed, if it did.
        error: Option<String>,
        /// What to do about the failure, one hint per line.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hints: Vec<String>,
        /// What it reports (a service's health verdict).
        #[serde(default)]
        detail: Option<serde_json::Value>,
        /// How long it took.
        millis: u64,
    },
    /// The request could not be read.
    BadRequest {
        /// Why.
        error: String,
    },
    /// What a running step reports (bytes, a tool's last line, a verdict).
    Progress {
        /// The step's index.
        index: usize,
        /// What it says.
        #[serde(flatten)]
        progress: crate::progress::Progress,
    },
    /// A detached run started (or was already running) and holds the target's lock.
    Started {
        /// Who holds it: this run.
        holder: Holder,
    },
    /// Another apply holds the target's lock; nothing was started.
    Busy {
        /// Who holds it.
        holder: Holder,
    },
    /// A detached run ended: every step ran, one failed, or it was asked to stop.
    Finished {
        /// It stopped before running every step because it was asked to.
        stopped: bool,
    },
    /// Events of a detached run, from the event file.
    Followed {
        /// The complete lines read, in order.
        events: Vec<Event>,
        /// The offset after them, to follow from next.
        offset: u64,
        /// Whether the run's process is still alive.
        running: bool,
    },
    /// A stop request was passed on.
    Stopping {
        /// Whether the run's runner is alive after the request: for a stop after the
        /// current step, still running to be told; for a stop `now`, not ended by SIGTERM
        /// nor by the SIGKILL that follows it after a grace.
        running: bool,
    },
}
