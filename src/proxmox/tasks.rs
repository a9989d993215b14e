//! Following a task (a UPID) to `stopped`; an exit status other than `OK` is an error that
//! carries the last lines of the task's log.

use std::time::Duration;

use serde_json::Value;

use super::client::ApiReader;
use super::error::ProxmoxError;
use crate::resources::op::Deadline;

/// Lines of the log shown when a task fails.
const LOG_TAIL: usize = 12;

/// Waits for the task `upid` (the `data` of the call that started it) to stop, at most
/// until `deadline` (its operation's limit); returns its log when it ended `OK`.
pub fn follow(api: &ApiReader, upid: &Value, deadline: Deadline) -> Result<(), ProxmoxError> {
    let upid = upid.as_str().unwrap_or_default();
    let kind = pve::upid::Upid::decode(upid)
        .map(|u| format!("{} {}", u.kind, u.id))
        .unwrap_or_else(|| upid.to_string());
    let status_path = api.node_path(&format!("/tasks/{upid}/status"));
    let mut pause = Duration::from_millis(100);
    loop {
        let st = api.get(&status_path, &[])?;
        if st["status"] == "stopped" {
            let exit = st["exitstatus"].as_str().unwrap_or("").to_string();
            if exit == "OK" {
                return Ok(());
            }
            return Err(ProxmoxError::Task {
                node: api.label.clone(),
                kind,
                exitstatus: exit,
                log: log_tail(api, upid),
            });
        }
        if deadline.passed() {
            return Err(ProxmoxError::Task {
                node: api.label.clone(),
                kind,
                exitstatus: format!(
                    "still running at its operation's limit ({}s)",
                    deadline.limit().as_secs()
                ),
                log: log_tail(api, upid),
            });
        }
        std::thread::sleep(pause.min(deadline.left()));
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// The last lines of a task's log, indented; what could not be read says so.
fn log_tail(api: &ApiReader, upid: &str) -> String {
    let path = api.node_path(&format!("/tasks/{upid}/log"));
    match api.get(&path, &[("start", "0"), ("limit", "5000")]) {
        Ok(Value::Array(lines)) => {
            let text: Vec<String> = lines
                .iter()
                .filter_map(|l| l["t"].as_str().map(|t| format!("  | {t}")))
                .collect();
            let skip = text.len().saturating_sub(LOG_TAIL);
            format!("task log (last lines):\n{}", text[skip..].join("\n"))
        }
        Ok(_) => "task log: empty".into(),
        Err(e) => format!("task log could not be read: {e}"),
    }
}
