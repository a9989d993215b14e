//! Deploying a service on the target: make systemd load exactly what was written (and
//! prove it), enable, (re)start, watch until a verdict, and keep or roll back. The seeds'
//! "fix applied but never loaded" cannot pass here: the loaded `ExecStart` and
//! `Environment` are compared with the inventory's after every reload.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::ServiceSpec;
use super::systemd::{assignments, split_shown};
use crate::generations::target as generations;
use crate::health::Verdict;
use crate::health::watch::{journal_cursor, unit_properties, watch};
use crate::machine::write_file_atomic;

/// Where the last unit that passed the health gate is kept, per unit.
pub const LAST_KNOWN_GOOD_DIR: &str = "/var/lib/provision/last-known-good";

/// What deploying a service does: the service as the plan has it, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deploy {
    /// The service: unit, what it must load, enable at boot, health gate, fallbacks.
    pub service: ServiceSpec,
    /// (Re)start it and watch it.
    pub restart: bool,
    /// The unit runs as declared and only its readiness differs: watch the running
    /// server first and restart it only when it hangs, crashes or misses its deadline. A
    /// load in progress (llm-two takes minutes after a boot) is not thrown away.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_first: bool,
    /// On a failed gate, go back to the last unit that passed it.
    pub rollback: bool,
}

/// The outcome for the client: the verdict, and the rollback's, if one happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployReport {
    /// The unit.
    pub unit: String,
    /// The health gate's verdict on the new unit.
    pub verdict: Option<Verdict>,
    /// The verdict on the restored last-known-good unit, after a rollback.
    pub rollback: Option<Verdict>,
    /// What was done, in words.
    pub notes: Vec<String>,
    /// The fallback now running, when the inventory's unit failed and one passed.
    #[serde(default)]
    pub degraded: Option<String>,
}

/// Why a deploy failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// systemctl could not be started.
    #[error("cannot run systemctl: {0}")]
    Spawn(#[source] std::io::Error),
    /// systemctl said no.
    #[error("systemctl {command} failed: {stderr}")]
    Systemctl {
        /// Its arguments.
        command: String,
        /// What it printed.
        stderr: String,
    },
    /// A unit file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A unit file could not be written.
    #[error(transparent)]
    Write(crate::machine::HostError),
    /// systemd loaded something else than was written; the last good unit was restored.
    #[error("systemd did not load what was written to {unit_path}:\n  {}\n  {restored}", .differences.join("\n  "))]
    NotLoaded {
        /// The unit's file.
        unit_path: String,
        /// What differs.
        differences: Vec<String>,
        /// What the restore did, in words.
        restored: String,
    },
    /// `provision rollback` found no earlier generation that passed its gate.
    #[error(
        "{unit}: no earlier generation passed the health gate, so there is nothing to roll back to"
    )]
    NothingToRollBack {
        /// The unit.
        unit: String,
    },
    /// The health gate failed (and no fallback passed); what the rollback did.
    #[error("{unit} did not become ready: {summary}{}{outcome}", journal_block(.journal))]
    Unhealthy {
        /// The unit.
        unit: String,
        /// The verdict in one line.
        summary: String,
        /// The end of the journal, for a crash loop.
        journal: Vec<String>,
        /// What the rollback did, in words (starting with a new line).
        outcome: String,
    },
}

fn journal_block(lines: &[String]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut out = "\n  journal:\n".to_string();
    for line in lines {
        out += &format!("    | {line}\n");
    }
    out
}

fn systemctl(args: &[&str]) -> Result<(), DeployError> {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(DeployError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(DeployError::Systemctl {
            command: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn write_unit(path: &str, bytes: &[u8]) -> Result<(), DeployError> {
    write_file_atomic(Path::new(path), bytes, "root", "root", 0o644).map_err(DeployError::Write)
}

/// A unit file as a switch writes it (root's, 0644, as [`write_unit`] writes).
fn unit_file(path: &str, bytes: &[u8]) -> crate::generations::UnitFile {
    crate::generations::UnitFile {
        path: path.to_string(),
        content: String::from_utf8_lossy(bytes).into_owned(),
        owner: "root".into(),
        group: "root".into(),
        mode: 0o644,
    }
}

fn read_unit(path: &str) -> Result<Vec<u8>, DeployError> {
    fs::read(path).map_err(|source| DeployError::Read {
        path: path.to_string(),
        source,
    })
}

/// The argv systemd loaded, from `systemctl show -p ExecStart`'s
/// `{ path=... ; argv[]=a b c ; ignore_errors=no ; ... }`.
pub fn loaded_argv(exec_start: &str) -> Option<String> {
    let start = exec_start.find("argv[]=")? + "argv[]=".len();
    let rest = &exec_start[start..];
    let end = rest.find(" ; ").unwrap_or(rest.len());
    Some(rest[..end].trim().to_string())
}

/// An argv as `systemctl show` prints a loaded `ExecStart`'s `argv[]=`.
pub fn shown_argv(words: &[String]) -> String {
    words
        .iter()
        .map(|w| w.replace('$', "$$"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What systemd runs for `service`, compared with what the plan says; the differences.
pub fn loaded_differences(service: &ServiceSpec) -> Vec<String> {
    let p = unit_properties(
        &service.unit,
        &[
            "LoadState",
            "FragmentPath",
            "NeedDaemonReload",
            "ExecStart",
            "Environment",
        ],
    );
    loaded_differences_of(service, &p)
}

/// [`loaded_differences`] for properties already read (`systemctl show`).
pub fn loaded_differences_of(
    d: &ServiceSpec,
    p: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    let mut diffs = Vec::new();
    if get("LoadState") != "loaded" {
        diffs.push(format!(
            "systemd has not loaded {} (LoadState={})",
            d.unit,
            get("LoadState")
        ));
        return diffs;
    }
    if get("FragmentPath") != d.unit_path {
        diffs.push(format!(
            "systemd loads {} from {}, not {}",
            d.unit,
            get("FragmentPath"),
            d.unit_path
        ));
    }
    if get("NeedDaemonReload") == "yes" {
        diffs.push("the unit file changed after systemd loaded it (daemon-reload needed)".into());
    }
    // systemd shows the loaded argv as its words joined by blanks, unquoted, with `$$`
    // still escaped (substitution happens at exec); `Environment=` it shows shell-quoted.
    // Each is compared in its own form: the words joined as systemd joins them, the
    // environment as parsed values, never as quoted text.
    if !d.exec_start.is_empty() {
        let want = shown_argv(&d.exec_start);
        match loaded_argv(&get("ExecStart")) {
            Some(have) if have == want => {}
            have => diffs.push(format!(
                "loaded ExecStart is `{}`, the inventory says `{want}`",
                have.unwrap_or_default()
            )),
        }
    }
    let loaded = assignments(&split_shown(&get("Environment")));
    for assignment in &d.environment {
        let (name, value) = assignment.split_once('=').unwrap_or((assignment, ""));
        match loaded.get(name) {
            Some(v) if v == value => {}
            Some(_) => diffs.push(format!(
                "loaded Environment sets {name} to another value than `{assignment}`"
            )),
            None => diffs.push(format!("loaded Environment lacks `{assignment}`")),
        }
    }
    diffs
}

/// Where `unit`'s last known good copy is kept.
pub fn last_known_good(unit: &str) -> String {
    format!("{LAST_KNOWN_GOOD_DIR}/{unit}")
}

/// The unit on disk passed its gate: kept as the last known good one, and the generation
/// it runs on (when there are generations) recorded as passed with it.
fn keep_as_good(unit: &str, unit_path: &str) -> Result<(), DeployError> {
    let content = read_unit(unit_path)?;
    write_unit(&last_known_good(unit), &content)?;
    generations::gated(
        unit,
        &String::from_utf8_lossy(&content),
        true,
        crate::machine::utc_now(),
    )
    .map_err(DeployError::Write)
}

/// The generation to go back to when what runs now failed: the newest that passed a gate
/// (or was adopted) other than this one, with the unit file to go with it (its own, or
/// the last known good one for an adopted generation that has none recorded).
fn previous_generation(
    unit: &str,
    unit_path: &str,
) -> Option<(crate::generations::record::Generation, Vec<u8>)> {
    let current = fs::read(unit_path).unwrap_or_default();
    let g = generations::previous_good(unit, &String::from_utf8_lossy(&current)).ok()??;
    let file = match g.units.get(unit) {
        Some(u) => u.clone().into_bytes(),
        None => fs::read(last_known_good(unit)).ok()?,
    };
    Some((g, file))
}

fn restart_and_watch(service: &ServiceSpec) -> Result<Option<Verdict>, DeployError> {
    let cursor = journal_cursor(&service.unit);
    // A unit that hit its start limit earlier refuses to start until reset.
    let _ = systemctl(&["reset-failed", &service.unit]);
    systemctl(&["restart", "--no-block", &service.unit])?;
    // The gate's last log line and its verdict reach the workstation as they happen.
    let verdict = service
        .readiness
        .as_ref()
        .map(|r| watch(&service.unit, r, cursor, &mut |l| crate::progress::line(l)));
    if let Some(v) = &verdict {
        crate::progress::report(crate::progress::Progress::Verdict {
            text: format!("{}: {}", service.unit, v.summary()),
        });
    }
    Ok(verdict)
}

/// Deploys; the error carries the diagnosis (and what the rollback did) for people.
pub fn deploy(d: &Deploy) -> Result<DeployReport, DeployError> {
    let service = &d.service;
    let mut report = DeployReport {
        unit: service.unit.clone(),
        verdict: None,
        rollback: None,
        notes: Vec::new(),
        degraded: None,
    };
    let p = unit_properties(&service.unit, &["LoadState", "NeedDaemonReload"]);
    if p.get("NeedDaemonReload").map(String::as_str) == Some("yes")
        || p.get("LoadState").map(String::as_str) != Some("loaded")
    {
        systemctl(&["daemon-reload"])?;
        report.notes.push("daemon-reload".into());
    }
    let differences = loaded_differences(service);
    if !differences.is_empty() {
        return Err(DeployError::NotLoaded {
            unit_path: service.unit_path.clone(),
            differences,
            restored: restore_last_known_good(d),
        });
    }
    if service.enabled {
        systemctl(&["enable", "--quiet", &service.unit])?;
    }
    if !d.restart {
        return Ok(report);
    }
    if d.wait_first
        && let Some(r) = &service.readiness
    {
        crate::progress::line(&format!(
            "{} runs as declared but is not ready yet: waiting for it before any restart",
            service.unit
        ));
        let verdict = watch(&service.unit, r, journal_cursor(&service.unit), &mut |l| {
            crate::progress::line(l)
        });
        if let Verdict::Ready { .. } = verdict {
            crate::progress::report(crate::progress::Progress::Verdict {
                text: format!("{}: {} (not restarted)", service.unit, verdict.summary()),
            });
            report
                .notes
                .push("the running server became ready: not restarted".into());
            report.verdict = Some(verdict);
            keep_as_good(&service.unit, &service.unit_path)?;
            return Ok(report);
        }
        report.notes.push(format!(
            "the running server did not become ready ({}): restarted",
            verdict.summary()
        ));
    }
    let verdict = restart_and_watch(service)?;
    report.verdict = verdict.clone();
    match &verdict {
        None | Some(Verdict::Ready { .. }) => {
            keep_as_good(&service.unit, &service.unit_path)?;
            Ok(report)
        }
        Some(failed) => {
            if let Some(name) = try_fallbacks(d, failed, &mut report)? {
                report.degraded = Some(name);
                return Ok(report);
            }
            Err(fail(d, failed))
        }
    }
}

/// Tries each fallback until one passes the gate; its name, or `None` when none did.
fn try_fallbacks(
    d: &Deploy,
    failed: &Verdict,
    report: &mut DeployReport,
) -> Result<Option<String>, DeployError> {
    let service = &d.service;
    for fb in &service.fallbacks {
        report.notes.push(format!(
            "{}: {}; trying fallback `{}`",
            service.unit,
            failed.summary(),
            fb.name
        ));
        let variant = service.with_fallback(fb);
        if variant.preflight.is_some()
            && let Err(e) = super::preflight::preflight(&variant)
        {
            report.notes.push(format!(
                "fallback `{}` refused by its preflight: {e}",
                fb.name
            ));
            continue;
        }
        let _ = systemctl(&["stop", &service.unit]);
        write_unit(&service.unit_path, fb.content.as_bytes())?;
        systemctl(&["daemon-reload"])?;
        let diffs = loaded_differences(&variant);
        if !diffs.is_empty() {
            report.notes.push(format!(
                "fallback `{}` did not load: {}",
                fb.name,
                diffs.join("; ")
            ));
            continue;
        }
        match restart_and_watch(&variant)? {
            Some(Verdict::Ready { after_ms }) => {
                report.rollback = Some(Verdict::Ready { after_ms });
                keep_as_good(&service.unit, &service.unit_path)?;
                return Ok(Some(fb.name.clone()));
            }
            Some(v) => report.notes.push(format!(
                "fallback `{}` failed too: {}",
                fb.name,
                v.summary()
            )),
            None => return Ok(Some(fb.name.clone())),
        }
    }
    Ok(None)
}

/// Puts the last unit that passed the health gate back on disk and into systemd, without
/// touching the running process: a deploy that fails before its restart must not leave a
/// new unit loaded under the old process. What was done, in words.
fn restore_last_known_good(d: &Deploy) -> String {
    if !d.rollback {
        return "left as it is for debugging (--no-rollback)".into();
    }
    if let Some((g, good)) = previous_generation(&d.service.unit, &d.service.unit_path) {
        // The process still runs on the previous generation: the stable paths point at it
        // again, so a restart by hand starts what ran.
        let restored = generations::restore(&g, &[unit_file(&d.service.unit_path, &good)])
            .map_err(DeployError::Write)
            .and_then(|_| systemctl(&["daemon-reload"]));
        return match restored {
            Ok(()) => format!(
                "the last unit that passed the health gate is loaded again, on its generation {} (the venv and checkout the running process uses)",
                g.number
            ),
            Err(e) => format!("restoring generation {} failed: {e}", g.number),
        };
    }
    let lkg = last_known_good(&d.service.unit);
    let Ok(good) = fs::read(&lkg) else {
        return "no earlier unit passed the health gate, so there is nothing to restore".into();
    };
    let restored =
        write_unit(&d.service.unit_path, &good).and_then(|_| systemctl(&["daemon-reload"]));
    match restored {
        Ok(()) => format!("the last unit that passed the health gate ({lkg}) is loaded again"),
        Err(e) => format!("restoring {lkg} failed: {e}"),
    }
}

/// Reports a failed gate, rolling back first when asked and possible.
fn fail(d: &Deploy, failed: &Verdict) -> DeployError {
    let service = &d.service;
    let journal = match failed {
        Verdict::CrashLoop { evidence, .. } => {
            evidence[evidence.len().saturating_sub(25)..].to_vec()
        }
        _ => Vec::new(),
    };
    let unhealthy = |outcome: String| DeployError::Unhealthy {
        unit: service.unit.clone(),
        summary: failed.summary(),
        journal: journal.clone(),
        outcome,
    };
    if !d.rollback {
        return unhealthy("\n  left as it is for debugging (--no-rollback)".into());
    }
    let current = fs::read(&service.unit_path).unwrap_or_default();
    let _ = generations::gated(
        &service.unit,
        &String::from_utf8_lossy(&current),
        false,
        crate::machine::utc_now(),
    );
    if let Some((g, good)) = previous_generation(&service.unit, &service.unit_path) {
        let why = format!("the health gate failed: {}", failed.summary());
        let (_, outcome) = whole_rollback(service, &g, &good, &why);
        return unhealthy(format!("\n  {outcome}"));
    }
    let lkg = last_known_good(&service.unit);
    let outcome = match fs::read(&lkg) {
        Ok(good) if good != current => {
            let _ = systemctl(&["stop", &service.unit]);
            let restored = write_unit(&service.unit_path, &good)
                .and_then(|_| systemctl(&["daemon-reload"]))
                .and_then(|_| restart_and_watch(service));
            match restored {
                Ok(Some(Verdict::Ready { after_ms })) => format!(
                    "\n  rolled back to the last unit that passed the health gate ({lkg}): ready again after {:.1}s",
                    after_ms as f64 / 1000.0
                ),
                Ok(Some(v)) => format!(
                    "\n  rolled back to {lkg}, but it failed too: {}",
                    v.summary()
                ),
                Ok(None) => format!("\n  rolled back to {lkg}"),
                Err(e) => format!("\n  rollback to {lkg} failed: {e}"),
            }
        }
        _ => {
            let _ = systemctl(&["stop", &service.unit]);
            "\n  no earlier unit passed the health gate, so there is nothing to roll back to; the unit was stopped".into()
        }
    };
    unhealthy(outcome)
}

/// Brings generation `g` back whole (the stable paths, so its venv and checkout, and its
/// unit), restarts the service on it and gates it again; the generation left gets `why`
/// as its note. The verdict, and what was done in words.
fn whole_rollback(
    service: &ServiceSpec,
    g: &crate::generations::record::Generation,
    unit_file: &[u8],
    why: &str,
) -> (Option<Verdict>, String) {
    let left = generations::current_links(&generations::load().unwrap_or_default());
    let _ = systemctl(&["stop", &service.unit]);
    let restored = generations::restore(g, &[self::unit_file(&service.unit_path, unit_file)])
        .map_err(DeployError::Write)
        .and_then(|_| systemctl(&["daemon-reload"]))
        .and_then(|_| restart_and_watch(service));
    let what = format!(
        "the last unit that passed the health gate, on its generation {} ({}: the venv and checkout it ran on; the model is the one that unit names)",
        g.number,
        g.links
            .values()
            .map(|d| crate::generations::short(d))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let (verdict, outcome) = match restored {
        Ok(Some(Verdict::Ready { after_ms })) => (
            Some(Verdict::Ready { after_ms }),
            format!(
                "rolled back to {what}: ready again after {:.1}s",
                after_ms as f64 / 1000.0
            ),
        ),
        Ok(Some(v)) => {
            let text = format!("rolled back to {what}, but it failed too: {}", v.summary());
            (Some(v), text)
        }
        Ok(None) => (None, format!("rolled back to {what}")),
        Err(e) => (None, format!("rollback to {what} failed: {e}")),
    };
    let passed = matches!(verdict, None | Some(Verdict::Ready { .. }));
    let _ = generations::gated(
        &service.unit,
        &String::from_utf8_lossy(unit_file),
        passed,
        crate::machine::utc_now(),
    );
    if passed {
        let _ = write_unit(&last_known_good(&service.unit), unit_file);
    }
    let _ = generations::note(&left, format!("{why}; {outcome}"));
    (verdict, outcome)
}

/// `provision rollback`: every service of an ml-env goes back to the newest generation
/// before what runs that passed its gate, and is gated again; one that fails there is
/// rolled back to what ran, as an apply's would be.
pub fn rollback(services: &[ServiceSpec]) -> Result<Vec<DeployReport>, DeployError> {
    let first = services.first().ok_or(DeployError::NothingToRollBack {
        unit: "no service".into(),
    })?;
    let (g, _) = previous_generation(&first.unit, &first.unit_path).ok_or_else(|| {
        DeployError::NothingToRollBack {
            unit: first.unit.clone(),
        }
    })?;
    let mut reports = Vec::new();
    for service in services {
        let file = match g.units.get(&service.unit) {
            Some(u) => u.clone().into_bytes(),
            None => read_unit(&last_known_good(&service.unit))?,
        };
        let (verdict, outcome) = whole_rollback(service, &g, &file, "left by `provision rollback`");
        match &verdict {
            None | Some(Verdict::Ready { .. }) => reports.push(DeployReport {
                unit: service.unit.clone(),
                verdict,
                rollback: None,
                notes: vec![outcome],
                degraded: None,
            }),
            Some(failed) => {
                let d = Deploy {
                    service: service.clone(),
                    restart: true,
                    wait_first: false,
                    rollback: true,
                };
                return Err(fail(&d, failed));
            }
        }
    }
    Ok(reports)
}

impl crate::resources::wire::AgentStep for Deploy {
    fn describe(&self) -> String {
        format!(
            "deploy {}{}",
            self.service.unit,
            match (
                self.restart,
                self.wait_first,
                self.service.readiness.is_some()
            ) {
                (true, true, true) =>
                    " and wait until it is ready (restarted only if it does not get there)",
                (true, false, true) => " and wait until it is ready",
                _ => "",
            }
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        Ok(serde_json::to_value(deploy(self)?).ok())
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        // A load that keeps making progress is waited for past its deadline (a cold first
        // start can take longer than any guess): the gate itself calls a hang.
        match &self.service.readiness {
            Some(_) => crate::resources::wire::Limit::Quiet(crate::resources::wire::minutes(10)),
            None => crate::resources::wire::Limit::Total(crate::resources::wire::minutes(15)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_from_systemctl_show() {
        let shown = "{ path=/root/ml-env/bin/python3 ; argv[]=/root/ml-env/bin/python3 -m sglang.launch_server --tp 4 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }";
        assert_eq!(
            loaded_argv(shown).as_deref(),
            Some("/root/ml-env/bin/python3 -m sglang.launch_server --tp 4")
        );
        assert_eq!(loaded_argv(""), None);
    }

    /// As systemd 252 shows a unit with these words (read in a lab container):
    /// `argv[]=/bin/sh -c sleep 1000 # $$HOME 50% "q" back\\s two words $$X`.
    #[test]
    fn argv_as_systemd_shows_it() {
        let words: Vec<String> = [
            "/bin/sh",
            "-c",
            "sleep 1000 # $HOME 50% \"q\" back\\\\s",
            "two words",
            "$X",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            shown_argv(&words),
            r#"/bin/sh -c sleep 1000 # $$HOME 50% "q" back\\s two words $$X"#
        );
    }

    /// `Environment=` as systemd 252 shows it, parsed back into the values written.
    #[test]
    fn environment_as_systemd_shows_it() {
        let shown = r#""TWO=two words" "Q=say \"hi\" and 'bye'" "D=\$HOME and \${PATH}" "P=50% done %n" "B=back\\slash\\n" PLAIN=1"#;
        let map = assignments(&split_shown(shown));
        assert_eq!(map["TWO"], "two words");
        assert_eq!(map["Q"], r#"say "hi" and 'bye'"#);
        assert_eq!(map["D"], "$HOME and ${PATH}");
        assert_eq!(map["P"], "50% done %n");
        assert_eq!(map["B"], r"back\slash\n");
        assert_eq!(map["PLAIN"], "1");
    }
}
