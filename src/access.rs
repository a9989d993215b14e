//! How a target is read and changed. Reading and writing are different types: `plan` and
//! `check` hold only a [`TargetReader`], which has no method that changes anything; only
//! `apply` is handed a [`TargetWriter`], which runs [`Op`]s.

use crate::resources::wire::{Facts, Probe, Step};

/// One operation of an apply, by what carries it out.
///
/// The Proxmox side adds its own variants here (an API call such as creating a container
/// or `PUT .../config` with its digest; a root-only step on the node such as `pct set`);
/// each writer runs the variants it carries.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A step run by the agent inside a guest (or on a host it was pushed to).
    Guest(Step),
}

impl Op {
    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Op::Guest(step) => step.describe(),
        }
    }
}

/// How one operation of an apply went.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutcome {
    /// What it did.
    pub description: String,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// What to do about the failure.
    pub hints: Vec<String>,
    /// What it reported (a service's health verdict).
    pub detail: Option<serde_json::Value>,
    /// How long it took.
    pub millis: u64,
}

/// Read access to one target: answers probes, nothing else.
pub trait TargetReader {
    /// The target, for messages.
    fn describe(&self) -> String;
    /// Answers every probe in as few round trips as the transport allows; a probe without
    /// an answer is an error, never "absent".
    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError>;
}

/// Write access to one target: reads (to verify) and runs operations.
pub trait TargetWriter: TargetReader {
    /// Runs `ops` in order, stopping at the first failure; the outcomes of those that ran.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError>;
}

/// Why a target could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Talking to the agent failed.
    #[error(transparent)]
    Agent(#[from] crate::agent::client::AgentError),
}
