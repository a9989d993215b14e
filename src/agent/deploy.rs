//! Deploying a service on the target: make systemd load exactly what was written (and
//! prove it), enable, (re)start, watch until a verdict, and keep or roll back. The seeds'
//! "fix applied but never loaded" cannot pass here: the loaded `ExecStart` and
//! `Environment` are compared with the inventory's after every reload.

use std::fs;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::steps::write_file_atomic;
use crate::health::Verdict;
use crate::health::watch::{WatchSpec, journal_cursor, unit_properties, watch};
use crate::render::systemd::{assignments, split_shown};

/// Where the last unit that passed the health gate is kept, per unit.
pub const LAST_KNOWN_GOOD_DIR: &str = "/var/lib/provision/last-known-good";

/// What deploying a service does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deploy {
    /// Unit name.
    pub unit: String,
    /// Its file.
    pub unit_path: String,
    /// The argv its `ExecStart=` must have once loaded.
    pub exec_start: Vec<String>,
    /// `NAME=value` assignments its `Environment=` must have once loaded.
    pub environment: Vec<String>,
    /// Enable it at boot.
    pub enable: bool,
    /// (Re)start it and watch it.
    pub restart: bool,
    /// The health gate, when the service has one.
    pub watch: Option<WatchSpec>,
    /// On a failed gate, go back to the last unit that passed it.
    pub rollback: bool,
    /// Degraded variants tried, in order, before rolling back.
    #[serde(default)]
    pub fallbacks: Vec<FallbackUnit>,
}

/// A degraded variant of a unit (inventory `fallback:`), rendered in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FallbackUnit {
    /// What it is, e.g. `without MTP`.
    pub name: String,
    /// The whole unit file.
    pub content: String,
    /// Its argv, to prove it loaded.
    pub exec_start: Vec<String>,
    /// Its environment, likewise.
    pub environment: Vec<String>,
    /// Its preflight.
    #[serde(default)]
    pub preflight: Option<super::preflight::PreflightSpec>,
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

fn systemctl(args: &[&str]) -> Result<(), String> {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run systemctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "systemctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
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

/// What systemd runs for `d.unit`, compared with what the inventory says; the differences.
pub fn loaded_differences(d: &Deploy) -> Vec<String> {
    let p = unit_properties(
        &d.unit,
        &[
            "LoadState",
            "FragmentPath",
            "NeedDaemonReload",
            "ExecStart",
            "Environment",
        ],
    );
    loaded_differences_of(d, &p)
}

/// [`loaded_differences`] for properties already read (`systemctl show`).
pub fn loaded_differences_of(
    d: &Deploy,
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

fn lkg_path(unit: &str) -> String {
    format!("{LAST_KNOWN_GOOD_DIR}/{unit}")
}

fn restart_and_watch(d: &Deploy) -> Result<Option<Verdict>, String> {
    let cursor = journal_cursor(&d.unit);
    // A unit that hit its start limit earlier refuses to start until reset.
    let _ = systemctl(&["reset-failed", &d.unit]);
    systemctl(&["restart", "--no-block", &d.unit])?;
    Ok(d.watch.as_ref().map(|w| watch(w, cursor, &mut |_| {})))
}

/// Deploys; `Err` carries the diagnosis (and what the rollback did) for people.
pub fn deploy(d: &Deploy) -> Result<DeployReport, String> {
    let mut report = DeployReport {
        unit: d.unit.clone(),
        verdict: None,
        rollback: None,
        notes: Vec::new(),
        degraded: None,
    };
    let p = unit_properties(&d.unit, &["LoadState", "NeedDaemonReload"]);
    if p.get("NeedDaemonReload").map(String::as_str) == Some("yes")
        || p.get("LoadState").map(String::as_str) != Some("loaded")
    {
        systemctl(&["daemon-reload"])?;
        report.notes.push("daemon-reload".into());
    }
    let diffs = loaded_differences(d);
    if !diffs.is_empty() {
        let restored = restore_last_known_good(d);
        return Err(format!(
            "systemd did not load what was written to {}:\n  {}\n  {restored}",
            d.unit_path,
            diffs.join("\n  ")
        ));
    }
    if d.enable {
        systemctl(&["enable", "--quiet", &d.unit])?;
    }
    if !d.restart {
        return Ok(report);
    }
    let verdict = restart_and_watch(d)?;
    report.verdict = verdict.clone();
    match &verdict {
        None | Some(Verdict::Ready { .. }) => {
            let unit =
                fs::read(&d.unit_path).map_err(|e| format!("cannot read {}: {e}", d.unit_path))?;
            write_file_atomic(Path::new(&lkg_path(&d.unit)), &unit, "root", "root", 0o644)?;
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
) -> Result<Option<String>, String> {
    for fb in &d.fallbacks {
        report.notes.push(format!(
            "{}: {}; trying fallback `{}`",
            d.unit,
            failed.summary(),
            fb.name
        ));
        if let Some(p) = &fb.preflight
            && let Err(e) = super::preflight::preflight(p)
        {
            report.notes.push(format!(
                "fallback `{}` refused by its preflight: {e}",
                fb.name
            ));
            continue;
        }
        let _ = systemctl(&["stop", &d.unit]);
        write_file_atomic(
            Path::new(&d.unit_path),
            fb.content.as_bytes(),
            "root",
            "root",
            0o644,
        )?;
        systemctl(&["daemon-reload"])?;
        let variant = Deploy {
            exec_start: fb.exec_start.clone(),
            environment: fb.environment.clone(),
            fallbacks: Vec::new(),
            ..d.clone()
        };
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
                let unit = fs::read(&d.unit_path)
                    .map_err(|e| format!("cannot read {}: {e}", d.unit_path))?;
                write_file_atomic(Path::new(&lkg_path(&d.unit)), &unit, "root", "root", 0o644)?;
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
    let lkg = lkg_path(&d.unit);
    let Ok(good) = fs::read(&lkg) else {
        return "no earlier unit passed the health gate, so there is nothing to restore".into();
    };
    let restored = write_file_atomic(Path::new(&d.unit_path), &good, "root", "root", 0o644)
        .and_then(|_| systemctl(&["daemon-reload"]));
    match restored {
        Ok(()) => format!("the last unit that passed the health gate ({lkg}) is loaded again"),
        Err(e) => format!("restoring {lkg} failed: {e}"),
    }
}

/// Reports a failed gate, rolling back first when asked and possible.
fn fail(d: &Deploy, failed: &Verdict) -> String {
    let mut msg = format!("{} did not become ready: {}", d.unit, failed.summary());
    if let Verdict::CrashLoop { evidence, .. } = failed {
        msg += "\n  journal:\n";
        for line in evidence
            .iter()
            .rev()
            .take(25)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            msg += &format!("    | {line}\n");
        }
    }
    if !d.rollback {
        msg += "\n  left as it is for debugging (--no-rollback)";
        return msg;
    }
    let lkg = lkg_path(&d.unit);
    let current = fs::read(&d.unit_path).unwrap_or_default();
    match fs::read(&lkg) {
        Ok(good) if good != current => {
            let _ = systemctl(&["stop", &d.unit]);
            let restored = write_file_atomic(Path::new(&d.unit_path), &good, "root", "root", 0o644)
                .and_then(|_| systemctl(&["daemon-reload"]))
                .and_then(|_| restart_and_watch(d));
            match restored {
                Ok(Some(Verdict::Ready { after_ms })) => {
                    msg += &format!(
                        "\n  rolled back to the last unit that passed the health gate ({lkg}): ready again after {:.1}s",
                        after_ms as f64 / 1000.0
                    );
                }
                Ok(Some(v)) => {
                    msg += &format!(
                        "\n  rolled back to {lkg}, but it failed too: {}",
                        v.summary()
                    )
                }
                Ok(None) => msg += &format!("\n  rolled back to {lkg}"),
                Err(e) => msg += &format!("\n  rollback to {lkg} failed: {e}"),
            }
        }
        _ => {
            let _ = systemctl(&["stop", &d.unit]);
            msg += "\n  no earlier unit passed the health gate, so there is nothing to roll back to; the unit was stopped";
        }
    }
    msg
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
