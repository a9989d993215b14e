//! What a service really runs, read for `check`: its main process's command line and
//! environment, whether it started before its unit file last changed, and whether the
//! server answers its readiness URL. The seeds' fix reached the disk and systemd but not
//! the process; a loaded unit proves nothing about what runs.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::http::HttpClient;
use super::watch::{health_url, lists_model};

/// A unit's main process, as it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessFact {
    /// Its PID.
    pub pid: u32,
    /// Its command line (`/proc/PID/cmdline`).
    pub argv: Vec<String>,
    /// Its environment (`/proc/PID/environ`): each name with the sha256 of its value.
    /// Values may be secrets, so they never leave the target; equal digests are equal
    /// values.
    pub environment: BTreeMap<String, String>,
    /// It started before the unit's file or one of its drop-ins last changed: whatever
    /// changed there does not run yet.
    pub started_before_unit_change: bool,
}

/// The sha256 of an environment value, as [`ProcessFact::environment`] holds it.
pub fn value_digest(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

/// The main process of a unit whose `systemctl show` properties are `p`, when it has one
/// that can be read.
pub fn main_process(p: &BTreeMap<String, String>) -> Option<ProcessFact> {
    let pid: u32 = p.get("MainPID")?.parse().ok().filter(|p| *p != 0)?;
    let argv = split_nul(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?);
    let environment = split_nul(&std::fs::read(format!("/proc/{pid}/environ")).ok()?)
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), value_digest(v)))
        })
        .collect();
    let started = p
        .get("ExecMainStartTimestampMonotonic")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .and_then(|t| monotonic_to_wall(Duration::from_micros(t)));
    let files = p
        .get("FragmentPath")
        .into_iter()
        .chain(p.get("DropInPaths"))
        .flat_map(|v| v.split_whitespace())
        .filter(|f| !f.is_empty());
    let changed = files
        .filter_map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .max();
    Some(ProcessFact {
        pid,
        argv,
        environment,
        started_before_unit_change: matches!((started, changed), (Some(s), Some(c)) if s < c),
    })
}

fn split_nul(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}

/// A `CLOCK_MONOTONIC` reading (what systemd's `*TimestampMonotonic` hold) as wall time.
fn monotonic_to_wall(at: Duration) -> Option<SystemTime> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the current time into the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return None;
    }
    let mono_now = Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
    let wall_now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    let ago = mono_now.checked_sub(at)?;
    Some(UNIX_EPOCH + wall_now.checked_sub(ago)?)
}

/// What a server said at its readiness URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadinessFact {
    /// The HTTP status, when it answered.
    pub status: Option<u16>,
    /// Whether the answer listed the model and `/health` next to it answered 200, as the
    /// health gate requires.
    pub listed: bool,
    /// Why there was no answer (connection refused, a timeout).
    pub error: Option<String>,
}

impl ReadinessFact {
    /// One line for people: `HTTP 503`, `connection refused ...`.
    pub fn describe(&self) -> String {
        match (&self.status, &self.error) {
            (Some(200), _) if !self.listed => {
                "HTTP 200, but the model is not listed or /health is not 200".to_string()
            }
            (Some(s), _) => format!("HTTP {s}"),
            (None, Some(e)) => e.clone(),
            (None, None) => "no answer".to_string(),
        }
    }
}

/// Asks `url` once whether it lists `served_model_name`, and `/health` whether it is 200.
pub fn readiness(url: &str, served_model_name: &str) -> ReadinessFact {
    let client = HttpClient::new(Duration::from_secs(5));
    let answer = client.as_ref().map_err(|e| e.to_string()).and_then(|c| {
        c.get(url)
            .map(|(status, body)| (c, status, body))
            .map_err(|e| e.to_string())
    });
    match answer {
        Ok((client, status, body)) => ReadinessFact {
            status: Some(status),
            listed: status == 200
                && lists_model(&body, served_model_name)
                && client
                    .get(&health_url(url))
                    .is_ok_and(|(status, _)| status == 200),
            error: None,
        },
        Err(e) => ReadinessFact {
            status: None,
            listed: false,
            error: Some(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_as_a_unit_would_show_it() {
        let mut props = BTreeMap::new();
        props.insert("MainPID".to_string(), std::process::id().to_string());
        let me = main_process(&props).unwrap();
        assert_eq!(me.argv, std::env::args().collect::<Vec<_>>());
        let path = std::env::var("PATH").unwrap_or_default();
        assert_eq!(
            me.environment.get("PATH"),
            Some(&value_digest(&path)),
            "PATH's digest"
        );
        assert!(!me.started_before_unit_change);
        props.insert("MainPID".into(), "0".into());
        assert_eq!(main_process(&props), None);
    }

    #[test]
    fn a_process_older_than_its_unit_file_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let unit = dir.path().join("x.service");
        std::fs::write(&unit, "[Service]\n").unwrap();
        let mut props = BTreeMap::new();
        props.insert("MainPID".to_string(), std::process::id().to_string());
        props.insert("FragmentPath".into(), unit.display().to_string());
        // Started one second after boot: long before the file was written.
        props.insert("ExecMainStartTimestampMonotonic".into(), "1000000".into());
        assert!(main_process(&props).unwrap().started_before_unit_change);
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let later = (now.tv_sec as u64 + 3600) * 1_000_000;
        props.insert("ExecMainStartTimestampMonotonic".into(), later.to_string());
        assert!(!main_process(&props).unwrap().started_before_unit_change);
    }

    #[test]
    fn a_closed_port_is_not_ready() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let r = readiness(&format!("http://127.0.0.1:{port}/v1/models"), "m");
        assert_eq!((r.status, r.listed), (None, false));
        assert!(r.describe().contains("/v1/models"), "{}", r.describe());
    }
}
