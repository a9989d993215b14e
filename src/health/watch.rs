//! Gathers [`Observation`]s on the target itself (the agent runs this): systemd's view of
//! the unit, the journal lines written since the (re)start, what the unit's processes
//! wrote, read and computed, whether the port accepts connections, and whether the server
//! lists its model. Polling happens next to the
//! server, so a poll costs milliseconds, not an SSH round trip.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use super::http::HttpClient;
use super::{Gate, Limits, Observation, Readiness, Verdict, activity};

/// The journal's position now, so a watch sees only what comes after it.
pub fn journal_cursor(unit: &str) -> Option<String> {
    let out = Command::new("journalctl")
        .args(["-u", unit, "-n", "0", "--show-cursor", "--no-pager", "-q"])
        .output()
        .ok()?;
    parse_cursor(&String::from_utf8_lossy(&out.stdout))
}

fn parse_cursor(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .map(|c| c.trim().to_string())
}

/// Journal lines of `unit` after `cursor`, and the new cursor.
fn journal_after(unit: &str, cursor: &Option<String>) -> (Vec<String>, Option<String>) {
    let mut cmd = Command::new("journalctl");
    cmd.args(["-u", unit, "-o", "cat", "--show-cursor", "--no-pager", "-q"]);
    match cursor {
        Some(c) => cmd.arg(format!("--after-cursor={c}")),
        None => cmd.args(["-n", "200"]),
    };
    let Ok(out) = cmd.output() else {
        return (Vec::new(), cursor.clone());
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let next = parse_cursor(&text).or_else(|| cursor.clone());
    let lines = text
        .lines()
        .filter(|l| !l.starts_with("-- cursor: "))
        .map(str::to_string)
        .collect();
    (lines, next)
}

/// `systemctl show` for a few properties.
pub fn unit_properties(unit: &str, props: &[&str]) -> BTreeMap<String, String> {
    // Unreadable reads as unknown: the watch judges from what it can see.
    crate::machine::systemctl_show(unit, props).unwrap_or_default()
}

fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

/// Whether an OpenAI-style `/v1/models` body lists `name`.
pub fn lists_model(body: &str, name: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["data"].as_array().cloned())
        .is_some_and(|models| models.iter().any(|m| m["id"].as_str() == Some(name)))
}

/// The `/health` URL next to a readiness URL.
pub fn health_url(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let base = rest.split('/').next().unwrap_or(rest);
    format!("http://{base}/health")
}

/// How often the gate says it still watches when the journal is silent.
pub const HEARTBEAT: Duration = Duration::from_secs(60);

/// Watches `unit` from `cursor` until a verdict on `spec`; `progress` sees each new last
/// line, and the last line again at least every [`HEARTBEAT`].
pub fn watch(
    unit: &str,
    spec: &Readiness,
    cursor: Option<String>,
    progress: &mut dyn FnMut(&str),
) -> Verdict {
    let mut gate = Gate::new(Limits {
        deadline: Duration::from_millis(spec.deadline_ms),
        stall_timeout: Duration::from_millis(spec.stall_timeout_ms),
    });
    let started = Instant::now();
    let mut cursor = cursor;
    let poll = Duration::from_millis(spec.poll_interval_ms.max(50));
    let health = health_url(&spec.url);
    let http = HttpClient::new(Duration::from_secs(2)).ok();
    let gpu = activity::gpu_memory_mib().is_some();
    let mut last_said = Instant::now();
    let mut said_overdue = false;
    loop {
        let props = unit_properties(
            unit,
            &[
                "ActiveState",
                "SubState",
                "NRestarts",
                "MainPID",
                "ExecMainStatus",
                "ControlGroup",
            ],
        );
        let (new_lines, next) = journal_after(unit, &cursor);
        cursor = next;
        let get = |k: &str| props.get(k).cloned().unwrap_or_default();
        let main_pid = get("MainPID").parse().ok().filter(|p| *p != 0);
        let pids = activity::unit_pids(&get("ControlGroup"), main_pid);
        let port_open = spec.port().is_some_and(port_open);
        let (model_listed, healthy) = match (&http, port_open) {
            (Some(http), true) => {
                let listed = http
                    .get(&spec.url)
                    .is_ok_and(|(s, body)| s == 200 && lists_model(&body, &spec.served_model_name));
                let healthy = listed && http.get(&health).is_ok_and(|(s, _)| s == 200);
                (listed, healthy)
            }
            _ => (false, false),
        };
        let obs = Observation {
            elapsed: started.elapsed(),
            active_state: get("ActiveState"),
            sub_state: get("SubState"),
            restarts: get("NRestarts").parse().unwrap_or(0),
            main_pid,
            exit_status: get("ExecMainStatus").parse().ok(),
            new_lines,
            activity: activity::read(&pids, gpu),
            port_open,
            model_listed,
            healthy,
        };
        let before = gate.last_line().to_string();
        let elapsed = obs.elapsed;
        if let Some(v) = gate.observe(&obs) {
            return v;
        }
        if gate.overdue(elapsed) && !said_overdue {
            said_overdue = true;
            progress(&format!(
                "past its {}s deadline and still making progress: waited for while it moves ({}s without progress is a hang)",
                spec.deadline_ms / 1000,
                spec.stall_timeout_ms / 1000
            ));
            last_said = Instant::now();
        } else if gate.last_line() != before || last_said.elapsed() >= HEARTBEAT {
            // Also a heartbeat while nothing new is logged: the client tells a gate that
            // still watches from a run that went quiet.
            progress(gate.last_line());
            last_said = Instant::now();
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_line() {
        let text = "line\n-- cursor: s=abc;i=12;b=x\n";
        assert_eq!(parse_cursor(text).as_deref(), Some("s=abc;i=12;b=x"));
    }

    #[test]
    fn models_listing() {
        let body = r#"{"object":"list","data":[{"id":"qwen3.5-122b","object":"model","owned_by":"sglang"}]}"#;
        assert!(lists_model(body, "qwen3.5-122b"));
        assert!(!lists_model(body, "other"));
        assert!(!lists_model("not json", "qwen3.5-122b"));
        assert_eq!(
            health_url("http://127.0.0.1:30000/v1/models"),
            "http://127.0.0.1:30000/health"
        );
    }
}
