//! A systemd service: enabled, running, restarted only when something it depends on
//! changed, and health-gated after every (re)start.

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub mod deploy;
pub mod preflight;
pub mod sglang_rules;
pub mod systemd;

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, Typed};
use crate::health::Readiness;
use crate::health::process::value_digest;
use crate::inventory::Pos;
use crate::plan::{Action, Attribute, Change};
use deploy::{Deploy, loaded_argv, loaded_differences_of};
use preflight::Preflight;
use sglang_rules::{Finding, release, release_rules};
use systemd::{assignments, split_shown};

/// A service, the one description of it: built once in Rust from the inventory (or written
/// by a role), shown in the plan, diffed against what runs, carried by the deploy step, and
/// read by the preflight and the health gate. Its unit file is a separate `file` resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Unit name, e.g. `sglang-qwen.service`.
    pub unit: String,
    /// The unit's file.
    pub unit_path: String,
    /// The argv its `ExecStart=` runs, to compare with what systemd loaded; empty when a
    /// role leaves the proof to the unit file (`FragmentPath`, no pending reload).
    #[serde(default)]
    pub exec_start: Vec<String>,
    /// `NAME=value` assignments of its `Environment=` lines, likewise.
    #[serde(default)]
    pub environment: Vec<String>,
    /// The user it runs as.
    #[serde(default = "root")]
    pub user: String,
    /// Its working directory.
    #[serde(default = "slash")]
    pub working_directory: String,
    /// Start at boot.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Addresses (`kind:name`) of resources on the same target whose change means a restart.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The health gate after a (re)start, if any.
    #[serde(default)]
    pub readiness: Option<Readiness>,
    /// The SGLang preflight before the unit is written or the service restarted, if any.
    #[serde(default)]
    pub preflight: Option<Preflight>,
    /// Degraded variants of the unit, tried in order when the health gate fails.
    #[serde(default)]
    pub fallbacks: Vec<Fallback>,
    /// Where the inventory declared it (services built from the inventory only; a role
    /// cannot set it). Kept in a saved plan, so that applying it names the inventory's line.
    #[serde(default, skip_serializing_if = "Declared::is_unknown")]
    pub declared: Declared,
}

fn yes() -> bool {
    true
}

fn root() -> String {
    "root".into()
}

fn slash() -> String {
    "/".into()
}

/// A degraded variant of a service (inventory `fallback:`): its unit file in full, and
/// what that file makes systemd run. Everything else is the service's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// What it is, e.g. `without MTP`.
    pub name: String,
    /// The whole unit file.
    pub content: String,
    /// Its argv, to prove it loaded.
    pub exec_start: Vec<String>,
    /// Its environment, likewise.
    pub environment: Vec<String>,
}

/// Where in the inventory a service was declared, kept with the typed value so that what
/// is found after rendering (a release rule at plan time, a refused apply, also of a saved
/// plan) points at the line to change. Never compared: two services are equal whatever
/// their positions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The inventory file; empty for a service a role wrote itself.
    pub file: PathBuf,
    /// The service's own position (its `served_model_name`).
    pub service: Pos,
    /// Positions of the settings behind argv flags (`--mamba-scheduler-strategy`) and
    /// environment variables (`SGLANG_ENABLE_SPEC_V2`), by flag or name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, Pos>,
}

impl PartialEq for Declared {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Declared {
    /// Whether the service was built from the inventory (not written by a role).
    pub fn from_inventory(&self) -> bool {
        !self.file.as_os_str().is_empty()
    }

    /// Whether there is no position to keep (a role's own service).
    fn is_unknown(&self) -> bool {
        !self.from_inventory()
    }

    /// `file:line:col` of `setting`, else of the service; `None` for a role's own service.
    pub fn at(&self, setting: &str) -> Option<String> {
        if !self.from_inventory() {
            return None;
        }
        let pos = self.settings.get(setting).copied().unwrap_or(self.service);
        Some(format!("{}:{pos}", self.file.display()))
    }
}

impl ServiceSpec {
    /// What its health gate waits for after a start, in words; `None` without readiness.
    pub fn gate(&self) -> Option<String> {
        let r = self.readiness.as_ref()?;
        Some(format!(
            "after starting: wait until {} lists `{}` (deadline {}s, longer while it makes progress; a hang is called after {}s without progress: no log line, output, reads, CPU or GPU memory growth)",
            r.url,
            r.served_model_name,
            r.deadline_ms / 1000,
            r.stall_timeout_ms / 1000
        ))
    }

    /// The same service running fallback `fb`'s unit instead.
    pub fn with_fallback(&self, fb: &Fallback) -> ServiceSpec {
        ServiceSpec {
            exec_start: fb.exec_start.clone(),
            environment: fb.environment.clone(),
            fallbacks: Vec::new(),
            ..self.clone()
        }
    }

    /// A preflight finding for people, with where the inventory set what it is about.
    pub fn located(&self, finding: &Finding) -> String {
        match self.declared.at(&finding.about) {
            Some(at) => format!("{} (set at {at})", finding.message),
            None => finding.message.clone(),
        }
    }

    fn readiness_probe(&self) -> Option<Probe> {
        self.readiness.as_ref().map(|r| {
            Probe::Readiness(ReadinessProbe {
                url: r.url.clone(),
                served_model_name: r.served_model_name.clone(),
            })
        })
    }

    /// The probes the preflight's release rules need: the venv (SGLang's version) and the
    /// model's `config.json` (its architecture).
    fn rule_probes(&self) -> Option<(Probe, Probe)> {
        self.preflight.as_ref().map(|p| {
            (
                Probe::Venv(crate::resources::venv::VenvProbe {
                    path: p.venv.clone(),
                }),
                Probe::Path(crate::resources::file::PathProbe {
                    path: format!("{}/config.json", p.model_path.trim_end_matches('/')),
                }),
            )
        })
    }

    /// What the running main process shows that the loaded unit does not: drift between
    /// what runs and what systemd (and so the inventory) says.
    fn stale_process(&self, unit: &UnitFact) -> Vec<String> {
        let Some(p) = &unit.process else {
            return Vec::new();
        };
        let prop = |k: &str| unit.properties.get(k).cloned().unwrap_or_default();
        let mut why = Vec::new();
        if let Some(loaded) = loaded_argv(&prop("ExecStart")) {
            // systemd shows the words joined by blanks with `$$` still escaped; the
            // process got them with `$$` made `$`.
            let loaded = loaded.replace("$$", "$");
            let running = p.argv.join(" ");
            if loaded != running {
                why.push(format!(
                    "the running process (PID {}) was started as `{running}`, not as the unit's `{loaded}`",
                    p.pid
                ));
            }
        }
        for (name, value) in assignments(&split_shown(&prop("Environment"))) {
            match p.environment.get(&name) {
                Some(d) if *d == value_digest(&value) => {}
                Some(_) => why.push(format!(
                    "the running process (PID {}) has {name} set to another value than the unit's",
                    p.pid
                )),
                None => why.push(format!(
                    "the running process (PID {}) lacks {name}={value}",
                    p.pid
                )),
            }
        }
        if p.started_before_unit_change {
            why.push(format!(
                "the running process (PID {}) started before {} last changed",
                p.pid,
                prop("FragmentPath")
            ));
        }
        why
    }
}

impl Resource for ServiceSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "service"
    }

    fn name(&self) -> String {
        self.unit.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        let mut probes = vec![Probe::Unit(UnitProbe {
            name: self.unit.clone(),
        })];
        probes.extend(self.readiness_probe());
        if let Some((venv, config)) = self.rule_probes() {
            probes.extend([venv, config]);
        }
        probes
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.unit(&self.probes()[0])?;
        let prop = |k: &str| found.and_then(|u| u.properties.get(k).cloned());
        let mut d = Delta::new(if found.is_some() {
            Action::Update
        } else {
            Action::Create
        });
        // What the change means for apply, kept as the attributes are added (not read back
        // from their labels): only `enabled` differing needs no restart; a server that runs
        // as declared and is only not ready yet is waited for first.
        let (mut restart, mut only_not_ready) = (false, true);
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
        let running = state.as_deref() == Some("active (running)");
        if !running {
            (restart, only_not_ready) = (true, false);
            d = d.attr(Attribute::change(
                "state",
                state,
                Some("active (running)".into()),
            ));
        }
        if let Some(u) = found {
            for why in loaded_differences_of(self, &u.properties) {
                d = d.reason(why);
            }
            if !d.reasons.is_empty() {
                (restart, only_not_ready) = (true, false);
                d = d.attr(Attribute::change(
                    "loaded unit",
                    Some("differs from the inventory".into()),
                    Some("reloaded and restarted".into()),
                ));
            }
            let stale = self.stale_process(u);
            if !stale.is_empty() {
                (restart, only_not_ready) = (true, false);
                for why in stale {
                    d = d.reason(why);
                }
                d = d.attr(Attribute::change(
                    "running process",
                    Some("not what the unit says".into()),
                    Some("restarted".into()),
                ));
            }
            // A crash loop looks `active (running)` between crashes (`systemctl
            // is-active` says active); systemd's restart count does not.
            let restarts: u32 = prop("NRestarts").and_then(|n| n.parse().ok()).unwrap_or(0);
            if restarts > 0 {
                (restart, only_not_ready) = (true, false);
                d = d
                    .reason(format!(
                        "{} crashed: systemd restarted it {restarts} time(s) since it was started (result `{}`, last exit status {})",
                        self.unit,
                        prop("Result").unwrap_or_default(),
                        prop("ExecMainStatus").unwrap_or_default()
                    ))
                    .attr(Attribute::change(
                        "restarts",
                        Some(restarts.to_string()),
                        Some("0".into()),
                    ));
            }
        }
        if running
            && let (Some(r), Some(probe)) = (&self.readiness, self.readiness_probe())
            && let Some(answer) = facts.readiness(&probe)?
            && !answer.listed
        {
            let first = d.attributes.is_empty();
            restart = true;
            d = d.attr(Attribute::change(
                "readiness",
                Some(format!("not ready ({})", answer.describe())),
                Some(format!("{} lists `{}`", r.url, r.served_model_name)),
            ));
            if first {
                d = d.reason(format!(
                    "{} runs as declared: apply waits for it first (a load in progress is not thrown away) and restarts it only if it hangs, crashes or misses its deadline",
                    self.unit
                ));
            }
        }
        if let Some(gate) = self.gate()
            && !d.attributes.is_empty()
        {
            d = d.reason(gate);
        }
        if d.attributes.is_empty() {
            return Ok(None);
        }
        d.typed = Some(Typed::Service {
            restart,
            wait_first: restart && only_not_ready,
        });
        Ok(Some(d))
    }

    fn warnings(&self, facts: &Facts) -> Vec<String> {
        let (Some(_), Some((venv, config))) = (&self.preflight, self.rule_probes()) else {
            return Vec::new();
        };
        let version = facts
            .venv(&venv)
            .ok()
            .flatten()
            .and_then(|v| v.packages.get("sglang"))
            .and_then(|v| release(v));
        let arch = facts
            .path(&config)
            .ok()
            .flatten()
            .and_then(|p| p.content.as_deref())
            .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
            .and_then(|v| v["architectures"][0].as_str().map(str::to_string));
        let (errors, warnings) = release_rules(self, version, arch.as_deref());
        errors
            .iter()
            .map(|e| format!("the preflight will refuse this: {}", self.located(e)))
            .chain(warnings.iter().map(|w| self.located(w)))
            .collect()
    }

    fn ops(&self, change: &Change, allowed: &Allowed) -> Result<Vec<Op>, StepsError> {
        let (restart, wait_first) = restart_of(change);
        guest([Step::DeployService(Box::new(Deploy {
            service: self.clone(),
            restart,
            wait_first,
            rollback: allowed.rollback,
        }))])
    }
}

/// Whether a service's change (re)starts it, and whether it is waited for first, as its
/// diff decided (a dependency's change restarts it). A change that says nothing (a plan
/// whose service change was not made by a diff) restarts it, preflight first.
pub fn restart_of(change: &Change) -> (bool, bool) {
    match &change.typed {
        Some(Typed::Service {
            restart,
            wait_first,
        }) => (*restart, *wait_first),
        _ => (true, false),
    }
}

/// A systemd unit's state (a subset of `systemctl show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFact {
    /// Properties by name.
    pub properties: BTreeMap<String, String>,
    /// Its main process as it runs, when there is one.
    #[serde(default)]
    pub process: Option<crate::health::process::ProcessFact>,
}

/// Properties that change while a unit runs, without anyone changing it.
const VOLATILE_UNIT_PROPERTIES: &[&str] =
    &["NRestarts", "ExecMainPID", "MainPID", "ExecMainStatus"];

impl UnitFact {
    /// The fact without [`VOLATILE_UNIT_PROPERTIES`], for comparing two reads.
    pub fn stable(&self) -> UnitFact {
        let mut properties = self.properties.clone();
        properties.retain(|k, _| !VOLATILE_UNIT_PROPERTIES.contains(&k.as_str()));
        let process = self.process.clone().map(|mut p| {
            p.pid = 0;
            p
        });
        UnitFact {
            properties,
            process,
        }
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
    "DropInPaths",
    "ExecMainStartTimestampMonotonic",
];

/// A unit's state from `systemctl show`; `None` when systemd does not know it.
pub fn read_unit(name: &str) -> Result<Option<UnitFact>, crate::machine::HostError> {
    let properties = crate::machine::systemctl_show(name, UNIT_PROPERTIES)?;
    if properties.get("LoadState").map(String::as_str) == Some("not-found") {
        return Ok(None);
    }
    let process = crate::health::process::main_process(&properties);
    Ok(Some(UnitFact {
        properties,
        process,
    }))
}

/// Probe: a systemd unit's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct UnitProbe {
    /// Unit name.
    pub name: String,
}

impl crate::resources::wire::AgentProbe for UnitProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Unit(read_unit(&self.name)?))
    }
}

/// Probe: whether a server answers its readiness URL and lists its model there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ReadinessProbe {
    /// URL that must list the model (`http://127.0.0.1:30000/v1/models`).
    pub url: String,
    /// The model name it must list.
    pub served_model_name: String,
}

impl crate::resources::wire::AgentProbe for ReadinessProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Readiness(Some(
            crate::health::process::readiness(&self.url, &self.served_model_name),
        )))
    }
}

impl crate::resources::wire::AgentStep for ServiceSpec {
    fn describe(&self) -> String {
        format!("preflight {}", self.unit)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        Ok(serde_json::to_value(preflight::preflight(self)?).ok())
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(30))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::health::process::ProcessFact;
    use crate::resources::wire::Fact;

    fn spec(exec_start: &[&str]) -> ServiceSpec {
        ServiceSpec {
            unit: "my.service".into(),
            unit_path: "/etc/systemd/system/my.service".into(),
            exec_start: exec_start.iter().map(|s| s.to_string()).collect(),
            environment: vec!["A=two words".into()],
            user: root(),
            working_directory: slash(),
            enabled: true,
            depends_on: Vec::new(),
            readiness: None,
            preflight: None,
            fallbacks: Vec::new(),
            declared: Declared::default(),
        }
    }

    /// What `systemctl show` and `/proc` say about a healthy unit running `/bin/server --x "two words"`.
    fn healthy() -> UnitFact {
        let props: BTreeMap<String, String> = [
            ("LoadState", "loaded"),
            ("ActiveState", "active"),
            ("SubState", "running"),
            ("UnitFileState", "enabled"),
            ("FragmentPath", "/etc/systemd/system/my.service"),
            ("NeedDaemonReload", "no"),
            ("NRestarts", "0"),
            (
                "ExecStart",
                "{ path=/bin/server ; argv[]=/bin/server --x two words ; ignore_errors=no }",
            ),
            ("Environment", "\"A=two words\""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        UnitFact {
            properties: props,
            process: Some(ProcessFact {
                pid: 42,
                argv: vec!["/bin/server".into(), "--x".into(), "two words".into()],
                environment: [("A".to_string(), value_digest("two words"))].into(),
                started_before_unit_change: false,
            }),
        }
    }

    fn facts(s: &ServiceSpec, unit: UnitFact) -> Facts {
        let mut map = HashMap::new();
        map.insert(s.probes()[0].clone(), Fact::Unit(Some(unit)));
        Facts::Read(map)
    }

    #[test]
    fn a_saved_service_keeps_where_it_was_declared() {
        let mut s = spec(&["/bin/server"]);
        // A role's own service has no position, and its JSON says nothing of one.
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("declared"), "{text}");
        s.declared = Declared {
            file: "inv.yaml".into(),
            service: Pos {
                line: 7,
                column: 32,
            },
            settings: [(
                "--tp-size".to_string(),
                Pos {
                    line: 8,
                    column: 17,
                },
            )]
            .into(),
        };
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains(
                r#""declared":{"file":"inv.yaml","service":"7:32","settings":{"--tp-size":"8:17"}}"#
            ),
            "{text}"
        );
        let back: ServiceSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.declared.at("--tp-size").as_deref(),
            Some("inv.yaml:8:17")
        );
        assert_eq!(back.declared.at("").as_deref(), Some("inv.yaml:7:32"));
        let bad = text.replace("7:32", "7");
        let e = serde_json::from_str::<ServiceSpec>(&bad).unwrap_err();
        assert!(e.to_string().contains("`7` is not a position"), "{e}");
    }

    #[test]
    fn a_custom_role_need_not_repeat_exec_start() {
        let s = spec(&[]);
        assert_eq!(s.diff(&facts(&s, healthy())).unwrap(), None);
        let s = spec(&["/bin/server", "--x", "two words"]);
        assert_eq!(s.diff(&facts(&s, healthy())).unwrap(), None);
        let s = spec(&["/bin/server", "--y"]);
        let d = s.diff(&facts(&s, healthy())).unwrap().unwrap();
        assert!(d.reasons[0].contains("loaded ExecStart"), "{d:?}");
    }

    #[test]
    fn what_runs_is_compared_with_what_is_loaded() {
        let s = spec(&[]);
        let mut stale = healthy();
        stale
            .properties
            .insert("Environment".into(), "\"A=two words\" B=1".into());
        let d = s.diff(&facts(&s, stale)).unwrap().unwrap();
        assert!(
            d.reasons
                .iter()
                .any(|r| r == "the running process (PID 42) lacks B=1"),
            "{d:?}"
        );
        let mut old = healthy();
        old.process.as_mut().unwrap().started_before_unit_change = true;
        let d = s.diff(&facts(&s, old)).unwrap().unwrap();
        assert!(d.reasons[0].contains("started before"), "{d:?}");
        let mut other = healthy();
        other.process.as_mut().unwrap().argv = vec!["/bin/server".into()];
        assert!(s.diff(&facts(&s, other)).unwrap().is_some());
    }

    #[test]
    fn a_crash_loop_between_two_crashes_is_drift() {
        let s = spec(&[]);
        let mut looping = healthy();
        looping.properties.insert("NRestarts".into(), "1".into());
        looping
            .properties
            .insert("Result".into(), "exit-code".into());
        let d = s.diff(&facts(&s, looping)).unwrap().unwrap();
        assert!(
            d.reasons[0].starts_with("my.service crashed: systemd restarted it 1 time(s)"),
            "{d:?}"
        );
    }
}
