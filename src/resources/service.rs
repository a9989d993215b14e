//! A systemd service: enabled, running, restarted only when something it depends on
//! changed, and health-gated after every (re)start.

use std::collections::BTreeMap;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource};
use crate::agent::deploy::{Deploy, FallbackUnit, loaded_differences_of};
use crate::agent::preflight::PreflightSpec;
use crate::health::watch::WatchSpec;
use crate::plan::{Action, Attribute, Change};

/// A service's desired state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Unit name, e.g. `sglang-qwen.service`.
    pub unit: String,
    /// The unit's file.
    pub unit_path: String,
    /// The argv its `ExecStart=` runs, to compare with what systemd loaded.
    #[serde(default)]
    pub exec_start: Vec<String>,
    /// `NAME=value` assignments of its `Environment=` lines, likewise.
    #[serde(default)]
    pub environment: Vec<String>,
    /// Start at boot.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Addresses (`kind:name`) of resources on the same target whose change means a restart.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The health gate after a (re)start, if any.
    #[serde(default)]
    pub readiness: Option<ReadinessSpec>,
    /// Checks run on the target before the unit is written or the service restarted.
    #[serde(default)]
    pub preflight: Option<PreflightSpec>,
    /// Degraded variants of the unit, tried in order when the health gate fails.
    #[serde(default)]
    pub fallbacks: Vec<FallbackUnit>,
}

fn yes() -> bool {
    true
}

/// How to tell the service is ready after a (re)start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadinessSpec {
    /// URL that must list `served_model_name`.
    pub url: String,
    /// The model name `/v1/models` must list.
    pub served_model_name: String,
    /// Port the server listens on.
    pub port: u16,
    /// Give up after this many milliseconds.
    pub deadline_ms: u64,
    /// A hang: no new log line for this many milliseconds while the port is closed.
    pub stall_timeout_ms: u64,
    /// How often to look, in milliseconds.
    pub poll_interval_ms: u64,
}

impl Resource for ServiceSpec {
    fn kind(&self) -> &'static str {
        "service"
    }

    fn name(&self) -> String {
        self.unit.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Unit {
            name: self.unit.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.unit(&self.probes()[0])?;
        let prop = |k: &str| found.and_then(|u| u.properties.get(k).cloned());
        let mut d = Delta::new(if found.is_some() {
            Action::Update
        } else {
            Action::Create
        });
        let enabled = prop("UnitFileState");
        let want_enabled = if self.enabled { "enabled" } else { "disabled" };
        if enabled.as_deref() != Some(want_enabled) {
            d = d.attr(Attribute::change(
                "enabled",
                enabled,
                Some(want_enabled.into()),
            ));
        }
        let state = match (prop("ActiveState"), prop("SubState")) {
            (Some(a), Some(s)) => Some(format!("{a} ({s})")),
            _ => None,
        };
        if state.as_deref() != Some("active (running)") {
            d = d.attr(Attribute::change(
                "state",
                state,
                Some("active (running)".into()),
            ));
        }
        if let Some(u) = found {
            let loaded = Deploy {
                unit: self.unit.clone(),
                unit_path: self.unit_path.clone(),
                exec_start: self.exec_start.clone(),
                environment: self.environment.clone(),
                enable: false,
                restart: false,
                watch: None,
                rollback: false,
                fallbacks: Vec::new(),
            };
            for why in loaded_differences_of(&loaded, &u.properties) {
                d = d.reason(why);
            }
            if !d.reasons.is_empty() {
                d = d.attr(Attribute::change(
                    "loaded unit",
                    Some("differs from the inventory".into()),
                    Some("reloaded and restarted".into()),
                ));
            }
        }
        if let Some(r) = &self.readiness
            && !d.attributes.is_empty()
        {
            d = d.reason(format!(
                "after starting: wait until {} lists `{}` (deadline {}s, a hang is called after {}s without log progress)",
                r.url,
                r.served_model_name,
                r.deadline_ms / 1000,
                r.stall_timeout_ms / 1000
            ));
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, change: &Change) -> Result<Vec<Step>, String> {
        // Only `enabled` differing needs no restart; anything else does (a start when
        // stopped, a restart when a dependency or the loaded unit changed).
        let restart = change.attributes.iter().any(|a| a.name != "enabled");
        let watch = self.readiness.as_ref().map(|r| WatchSpec {
            unit: self.unit.clone(),
            port: r.port,
            url: r.url.clone(),
            served_model_name: r.served_model_name.clone(),
            deadline_ms: r.deadline_ms,
            stall_timeout_ms: r.stall_timeout_ms,
            poll_interval_ms: r.poll_interval_ms,
        });
        Ok(vec![Step::DeployService(Deploy {
            unit: self.unit.clone(),
            unit_path: self.unit_path.clone(),
            exec_start: self.exec_start.clone(),
            environment: self.environment.clone(),
            enable: self.enabled,
            restart,
            watch,
            rollback: true,
            fallbacks: self.fallbacks.clone(),
        })])
    }
}

/// A systemd unit's state (a subset of `systemctl show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFact {
    /// Properties by name.
    pub properties: BTreeMap<String, String>,
}

/// Properties that change while a unit runs, without anyone changing it.
const VOLATILE_UNIT_PROPERTIES: &[&str] =
    &["NRestarts", "ExecMainPID", "MainPID", "ExecMainStatus"];

impl UnitFact {
    /// The fact without [`VOLATILE_UNIT_PROPERTIES`], for comparing two reads.
    pub fn stable(&self) -> UnitFact {
        let mut properties = self.properties.clone();
        properties.retain(|k, _| !VOLATILE_UNIT_PROPERTIES.contains(&k.as_str()));
        UnitFact { properties }
    }
}

/// The unit properties the service resource and the health gate read.
pub const UNIT_PROPERTIES: &[&str] = &[
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainPID",
    "MainPID",
    "NeedDaemonReload",
    "FragmentPath",
    "ExecStart",
    "Environment",
    "Result",
];

/// A unit's state from `systemctl show`; `None` when systemd does not know it.
pub fn read_unit(name: &str) -> Result<Option<UnitFact>, String> {
    let out = Command::new("systemctl")
        .arg("show")
        .arg(format!("--property={}", UNIT_PROPERTIES.join(",")))
        .arg("--")
        .arg(name)
        .output()
        .map_err(|e| format!("cannot run systemctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "systemctl show {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let properties: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if properties.get("LoadState").map(String::as_str) == Some("not-found") {
        return Ok(None);
    }
    Ok(Some(UnitFact { properties }))
}
