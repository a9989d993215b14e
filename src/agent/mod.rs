//! What runs on the target. provision pushes its own binary there (content-addressed
//! under `/var/lib/provision/`) and runs `provision agent`, which reads one JSON
//! [`Request`] on stdin and answers with JSON lines on stdout: all facts of a host in one
//! round trip, all steps of an apply in one more, and large work (hashing, downloads) next
//! to the data instead of through the workstation.

pub mod client;
pub mod deploy;
pub mod preflight;
pub mod probe;
pub mod sglang_rules;
pub mod steps;

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::facts::{Fact, ModelFact, Probe};
use steps::Step;

/// Bumped whenever the request or event format changes incompatibly; the client refuses
/// an agent speaking another version (the binary's hash changes anyway).
pub const PROTOCOL_VERSION: u32 = 1;

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
    /// Run these steps in order, stopping at the first failure.
    Apply {
        /// The steps.
        steps: Vec<Step>,
    },
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
}

/// Runs the agent: one request from `input`, events to `output`.
pub fn serve(input: &mut dyn BufRead, output: &mut dyn Write) -> std::io::Result<()> {
    let mut emit = |e: &Event| -> std::io::Result<()> {
        let line = serde_json::to_string(e).map_err(std::io::Error::other)?;
        writeln!(output, "{line}")?;
        output.flush()
    };
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
                .map(|probe| match probe::answer(&probe, verify_full) {
                    Ok(fact) => Answer {
                        probe,
                        fact: Some(fact),
                        error: None,
                    },
                    Err(error) => Answer {
                        probe,
                        fact: None,
                        error: Some(error),
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
                let (detail, error) = match result {
                    Ok(detail) => (detail, None),
                    Err(e) => (None, Some(e.to_string())),
                };
                emit(&Event::StepDone {
                    index,
                    error,
                    detail,
                    millis: started.elapsed().as_millis() as u64,
                })?;
                if failed {
                    break;
                }
            }
            Ok(())
        }
    }
}

/// A model folder's verification record, summarised for the planner: metadata only
/// (size, mtime, inode per file), or every file re-hashed with `full`.
pub fn model_fact(path: &Path, full: bool) -> Result<Option<ModelFact>, String> {
    use crate::hub::{Problem, StoreState};
    let status = crate::hub::status(path, None).map_err(|e| e.to_string())?;
    if status.state == StoreState::NoRecord {
        if !path.exists() {
            return Ok(None);
        }
        // Files without a record are unverified: the pull adopts those that hash right.
        return Ok(Some(ModelFact {
            repo: String::new(),
            commit: String::new(),
            intact: false,
            changed: vec!["(no verification record)".into()],
        }));
    }
    let mut fact = ModelFact {
        repo: status.repo.clone().unwrap_or_default(),
        commit: status.commit.clone().unwrap_or_default(),
        intact: status.state == StoreState::Verified,
        changed: status
            .changed
            .iter()
            .map(|p| format!("{p} changed since it was verified"))
            .collect(),
    };
    if full && fact.intact {
        let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
        let report = crate::hub::verify(path, true, jobs, &crate::hub::NoProgress)
            .map_err(|e| e.to_string())?;
        if !report.problems.is_empty() {
            fact.intact = false;
            fact.changed = report
                .problems
                .iter()
                .map(|p| match p {
                    Problem::Incomplete => "the last pull did not finish".to_string(),
                    Problem::Missing { path } => format!("{path} is missing"),
                    Problem::SizeChanged { path, .. } => format!("{path} changed size"),
                    Problem::Mismatch { path, .. } => {
                        format!("{path} no longer matches its sha256")
                    }
                })
                .collect();
        }
    }
    Ok(Some(fact))
}
