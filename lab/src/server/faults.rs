//! Failures on request, as a real node fails: the next N calls matching a method and a path
//! regex get a lock timeout, a 596 `Broken pipe`, a task ending in `TASK ERROR: ...`, a slow
//! task, a dropped connection, or any status and message.
//!
//! Set with `POST /api2/json/lab/faults` (root only), `pve-lab fault ...`, or `LAB_FAULTS`
//! (a JSON list of rules) when the server starts.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

use super::tasks::TaskFault;

/// What kind of failure.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// 500 `can't lock file '/run/lock/lxc/pve-config-<vmid>.lock' - got timeout`.
    LockTimeout,
    /// 596 `Broken pipe`.
    BrokenPipe,
    /// The call succeeds but its task ends in `TASK ERROR: <message>`.
    TaskError,
    /// The task holds the config lock for `delay_ms` before working.
    SlowTask,
    /// The connection is closed without an answer.
    Drop,
    /// `status` with `message`.
    Error,
    /// The call is answered as usual, `delay_ms` late (a node busy answering; a test
    /// that must act while a call is in flight).
    Slow,
}

/// One rule.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// HTTP method to match; any when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// Regex matched against the path below `/api2/json`.
    pub path: String,
    /// `key=value` that the request's parameters must contain (e.g. `vmid=129` on a create).
    #[serde(default)]
    pub param: Option<String>,
    /// How many matching calls fail.
    #[serde(default = "one")]
    pub count: u32,
    /// The failure.
    pub kind: FaultKind,
    /// Message for `task-error` and `error`.
    #[serde(default)]
    pub message: Option<String>,
    /// Status for `error`.
    #[serde(default)]
    pub status: Option<u16>,
    /// Delay for `slow-task`, and before answering for the others.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// For `slow-task`: whether the task holds the config lock while slow (default), or is
    /// slow to start (the config's `lock` set, the flock free).
    #[serde(default = "yes")]
    pub hold_lock: bool,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// What a matched rule does to one call.
#[derive(Debug)]
pub enum Fault {
    /// Answer with this error.
    Respond(ApiError),
    /// Close the connection.
    Drop,
    /// Let the call run, with this fault in its task.
    Task(TaskFault),
    /// Let the call run as usual (after the rule's delay).
    Pass,
}

/// The active rules.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Mutex<Vec<(FaultRule, regex::Regex)>>,
}

impl Faults {
    /// Rules from `LAB_FAULTS`, if set.
    pub fn from_env() -> Result<Faults> {
        let f = Faults::default();
        if let Ok(raw) = std::env::var("LAB_FAULTS") {
            let rules: Vec<FaultRule> = serde_json::from_str(&raw).context("parsing LAB_FAULTS")?;
            for r in rules {
                f.add(r).map_err(|e| anyhow::anyhow!(e.message))?;
            }
        }
        Ok(f)
    }

    /// Adds a rule.
    pub fn add(&self, rule: FaultRule) -> Result<(), ApiError> {
        let re = regex::Regex::new(&rule.path)
            .map_err(|e| ApiError::param("path", format!("invalid regex: {e}")))?;
        if rule.kind == FaultKind::Error && rule.status.is_none() {
            return Err(ApiError::param("status", "kind 'error' needs a status"));
        }
        self.rules.lock().expect("faults lock").push((rule, re));
        Ok(())
    }

    /// The rules still active, with their remaining counts.
    pub fn list(&self) -> Vec<FaultRule> {
        self.rules
            .lock()
            .expect("faults lock")
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules.lock().expect("faults lock").clear();
    }

    /// Consumes one use of the first rule matching this call.
    pub fn take(
        &self,
        method: &str,
        path: &str,
        params: &serde_json::Map<String, serde_json::Value>,
        lock_dir: &std::path::Path,
    ) -> Option<(Fault, Duration)> {
        let has_param = |p: &str| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            params
                .get(k)
                .is_some_and(|x| crate::pve::options::to_conf_value(x) == v)
        };
        let mut rules = self.rules.lock().expect("faults lock");
        let i = rules.iter().position(|(r, re)| {
            r.count > 0
                && r.method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(method))
                && re.is_match(path)
                && r.param.as_deref().is_none_or(has_param)
        })?;
        let rule = {
            let (r, _) = &mut rules[i];
            r.count -= 1;
            r.clone()
        };
        if rule.count == 0 {
            rules.remove(i);
        }
        let delay = Duration::from_millis(rule.delay_ms.unwrap_or(0));
        let fault = match rule.kind {
            FaultKind::LockTimeout => {
                let vmid = regex::Regex::new(r"/lxc/(\d+)")
                    .expect("static regex")
                    .captures(path)
                    .map_or("0".to_string(), |c| c[1].to_string());
                let lock = lock_dir.join(format!("pve-config-{vmid}.lock"));
                Fault::Respond(ApiError::die(format!(
                    "can't lock file '{}' - got timeout",
                    lock.display()
                )))
            }
            FaultKind::BrokenPipe => Fault::Respond(ApiError::new(596, "Broken pipe")),
            FaultKind::Error => Fault::Respond(ApiError::new(
                rule.status.unwrap_or(500),
                rule.message.unwrap_or_else(|| "injected failure".into()),
            )),
            FaultKind::Drop => Fault::Drop,
            FaultKind::Slow => Fault::Pass,
            FaultKind::TaskError => {
                Fault::Task(TaskFault::Error(rule.message.unwrap_or_else(|| {
                    "command 'lxc-start' failed: exit code 1".into()
                })))
            }
            FaultKind::SlowTask => {
                return Some((
                    Fault::Task(TaskFault::Slow(delay, rule.hold_lock)),
                    Duration::ZERO,
                ));
            }
        };
        Some((fault, delay))
    }
}
