//! An apply that outlives its connection. `Request::Start` makes a run folder
//! (`<dir>/runs/<run>/`), writes the request there (mode 0600: it may carry a token) and
//! starts a detached runner: a transient systemd unit (`systemd-run`) where systemd is PID 1,
//! else a process in its own session. The runner takes the target's lock
//! (`<dir>/apply.lock`, `flock`), deletes the request, and appends every event to
//! `events.jsonl`. The client follows that file by offset (`Request::Follow`), one short
//! round trip at a time, so a dropped SSH connection loses nothing: reconnect and ask again
//! from the same offset. `Request::Stop` leaves a `stop` file the runner reads between steps,
//! or (`now`) ends the runner's process group. Each follow touches the run's `followed`
//! file: its age tells a later apply whether a client still follows the run.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::resources::wire::{Event, Holder, Step};

/// Most bytes of events one follow answer carries.
const CHUNK: u64 = 1 << 20;
/// The file whose age says how long ago a client last followed the run.
const FOLLOWED: &str = "followed";
/// How long a start waits for the runner's first event.
const START_WAIT: Duration = Duration::from_secs(60);

/// Why a run could not be started or followed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A file of the run could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The run's id is not a plain name.
    #[error("`{0}` is not a run id (letters, digits, `-`, `.` only)")]
    BadId(String),
    /// The runner never said whether it started.
    #[error("the detached apply did not start within {0:?}{1}")]
    NotStarted(Duration, String),
    /// No such run.
    #[error("no run `{0}` on this target")]
    Unknown(String),
}

/// The agent's state folder: `<dir>` of `<dir>/bin/provision-*`, else the default.
pub fn state_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .filter(|p| super::cache::is_cached(p))
        .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| {
            PathBuf::from(
                std::env::var("PROVISION_AGENT_DIR")
                    .unwrap_or_else(|_| super::client::DEFAULT_AGENT_DIR.to_string()),
            )
        })
}

fn run_dir(run: &str) -> Result<PathBuf, RunError> {
    let ok = !run.is_empty()
        && !run.starts_with('.')
        && run
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !ok {
        return Err(RunError::BadId(run.to_string()));
    }
    Ok(state_dir().join("runs").join(run))
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RunError {
    let path = path.to_path_buf();
    move |source| RunError::Io { what, path, source }
}

/// Starts run `run` (or finds it started): its first event, `Started` or `Busy`.
pub fn start(run: &str, steps: Vec<Step>, holder: Holder) -> Result<Event, RunError> {
    let dir = run_dir(run)?;
    let events = dir.join("events.jsonl");
    if !dir.exists() {
        fs::create_dir_all(dir.parent().unwrap_or(&dir)).map_err(io("cannot create", &dir))?;
        let tmp = dir.with_extension("new");
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir(&tmp).map_err(io("cannot create", &tmp))?;
        let body = serde_json::to_vec(&(steps, holder)).expect("a request serializes");
        let req = tmp.join("request.json");
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&req)
            .and_then(|mut f| f.write_all(&body))
            .map_err(io("cannot write", &req))?;
        let beat = tmp.join(FOLLOWED);
        fs::write(&beat, b"").map_err(io("cannot write", &beat))?;
        // The folder appears whole or not at all: a second start of the same run (its
        // answer was lost) finds it and starts nothing.
        fs::rename(&tmp, &dir).map_err(io("cannot create", &dir))?;
        spawn_runner(&dir)?;
    }
    let waited = Instant::now();
    loop {
        if let Some(first) = read_events(&events, 0, CHUNK)?.0.into_iter().next() {
            return Ok(first);
        }
        if waited.elapsed() > START_WAIT {
            let log = fs::read_to_string(dir.join("runner.log")).unwrap_or_default();
            let tail = log
                .lines()
                .last()
                .map(|l| format!(": {l}"))
                .unwrap_or_default();
            return Err(RunError::NotStarted(START_WAIT, tail));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `<exe> agent --run DIR` detached from this process and its connection.
fn spawn_runner(dir: &Path) -> Result<(), RunError> {
    let exe = std::env::current_exe().map_err(io("cannot find", Path::new("/proc/self/exe")))?;
    let log = dir.join("runner.log");
    let out = File::create(&log).map_err(io("cannot write", &log))?;
    let err = out.try_clone().map_err(io("cannot write", &log))?;
    let systemd = Path::new("/run/systemd/system").is_dir()
        && std::env::var_os("PROVISION_AGENT_NO_SYSTEMD").is_none();
    let mut cmd = if systemd {
        let unit = format!(
            "provision-apply-{}",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("run")
        );
        let mut c = Command::new("systemd-run");
        c.args(["--quiet", "--collect", "--unit", &unit]);
        // A unit starts with systemd's bare environment; the run gets the one this agent
        // was started with (HOME for git and pip, proxies on air-gapped hosts, the locale).
        for (k, v) in std::env::vars_os() {
            let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
                continue;
            };
            if !k.starts_with("SSH_") && !matches!(k, "INVOCATION_ID" | "JOURNAL_STREAM") {
                c.arg(format!("--setenv={k}={v}"));
            }
        }
        c.arg("--");
        c.arg(&exe);
        c
    } else {
        let mut c = Command::new(&exe);
        // SAFETY: setsid is async-signal-safe and touches no memory of this process.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        c
    };
    cmd.arg("agent")
        .arg("--run")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = cmd
        .spawn()
        .map_err(io("cannot start the runner for", dir))?;
    if systemd {
        // systemd-run returns once the unit is queued; its failure is the start's.
        let status = child
            .wait()
            .map_err(io("cannot start the runner for", dir))?;
        if !status.success() {
            let log = fs::read_to_string(&log).unwrap_or_default();
            return Err(RunError::NotStarted(Duration::ZERO, format!(": {log}")));
        }
    }
    Ok(())
}

/// Appends events to a run's file, one line each, flushed as written.
#[derive(Clone)]
struct EventLog(Arc<Mutex<File>>);

impl EventLog {
    fn emit(&self, e: &Event) {
        let mut line = serde_json::to_vec(e).expect("an event serializes");
        line.push(b'\n');
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // One write per line: a follower never sees half of one as complete.
        let _ = f.write_all(&line);
    }
}

/// The runner: `provision agent --run DIR`. Takes the lock and runs the steps, every event
/// into `DIR/events.jsonl`.
pub fn runner(dir: &Path) -> Result<(), RunError> {
    let req = dir.join("request.json");
    let body = fs::read(&req).map_err(io("cannot read", &req))?;
    let _ = fs::remove_file(&req);
    let (steps, mut holder): (Vec<Step>, Holder) =
        serde_json::from_slice(&body).map_err(|e| RunError::Io {
            what: "cannot parse",
            path: req.clone(),
            source: std::io::Error::other(e),
        })?;
    let events = dir.join("events.jsonl");
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&events)
        .map_err(io("cannot write", &events))?;
    let log = EventLog(Arc::new(Mutex::new(file)));
    let state = state_dir();
    let lock_path = state.join("apply.lock");
    let holder_path = state.join("apply.holder");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io("cannot open", &lock_path))?;
    // SAFETY: flock on a descriptor this function owns; held until the process exits.
    let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut other = fs::read(&holder_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Holder>(&b).ok())
            .unwrap_or(Holder {
                host: "?".into(),
                pid: 0,
                user: "?".into(),
                since: "?".into(),
                run: "?".into(),
                agent_pid: 0,
                idle_secs: None,
            });
        other.idle_secs = idle_secs(&state.join("runs").join(&other.run));
        log.emit(&Event::Busy { holder: other });
        return Ok(());
    }
    holder.run = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    holder.agent_pid = std::process::id();
    let text = serde_json::to_vec(&holder).expect("a holder serializes");
    // Whole or not at all: a racing start reads either the old holder or this one.
    let tmp = holder_path.with_extension("tmp");
    let _ = fs::write(&tmp, &text).and_then(|()| fs::rename(&tmp, &holder_path));
    let _ = fs::write(dir.join("pid"), holder.agent_pid.to_string());
    log.emit(&Event::Started { holder });
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| super::cache::is_cached(p));
    let _hold = exe.as_deref().and_then(|p| super::cache::hold(p).ok());
    let mut stopped = false;
    for (index, step) in steps.iter().enumerate() {
        if dir.join("stop").exists() {
            stopped = true;
            break;
        }
        log.emit(&Event::StepStarted {
            index,
            description: step.describe(),
        });
        let started = Instant::now();
        let sink = log.clone();
        let result = crate::progress::scoped(
            move |p| {
                sink.emit(&Event::Progress {
                    index,
                    progress: p.clone(),
                })
            },
            || step.run(),
        );
        let failed = result.is_err();
        let (detail, error, hints) = match result {
            Ok(detail) => (detail, None, Vec::new()),
            Err(e) => (None, Some(e.message), e.hints),
        };
        log.emit(&Event::StepDone {
            index,
            error,
            hints,
            detail,
            millis: started.elapsed().as_millis() as u64,
        });
        if failed {
            break;
        }
    }
    log.emit(&Event::Finished { stopped });
    if let Some(exe) = &exe
        && let Some(bin) = exe.parent()
    {
        let _ = super::cache::stamp(exe);
        let _ = super::cache::prune(bin, exe, super::cache::PRUNE_AFTER);
    }
    prune_runs(&state.join("runs"), dir);
    Ok(())
}

/// Removes run folders older than the agent cache's prune age (never `keep`).
fn prune_runs(runs: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > super::cache::PRUNE_AFTER);
        if old && e.path() != keep && !alive(&e.path()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Complete event lines of `path` from `offset`, at most `max` bytes; the offset after them.
fn read_events(path: &Path, offset: u64, max: u64) -> Result<(Vec<Event>, u64), RunError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(io("cannot read", path)(e)),
    };
    f.seek(SeekFrom::Start(offset))
        .map_err(io("cannot read", path))?;
    let mut buf = Vec::new();
    f.take(max)
        .read_to_end(&mut buf)
        .map_err(io("cannot read", path))?;
    let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut events = Vec::new();
    for line in buf[..complete].split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let e = serde_json::from_slice(line).map_err(|e| RunError::Io {
            what: "a damaged line in",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        events.push(e);
    }
    Ok((events, offset + complete as u64))
}

/// Whether the run's runner process is alive (its pid, running this very run).
fn alive(dir: &Path) -> bool {
    runner_pid(dir).is_some()
}

fn runner_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let want = dir.as_os_str().as_encoded_bytes();
    cmdline
        .split(|&b| b == 0)
        .any(|arg| arg == want)
        .then_some(pid)
}

/// Seconds since a client last followed the run in `dir`, when its folder says.
fn idle_secs(dir: &Path) -> Option<u64> {
    let at = fs::metadata(dir.join(FOLLOWED)).ok()?.modified().ok()?;
    Some(at.elapsed().unwrap_or_default().as_secs())
}

/// The run's events from `offset`, waiting up to `wait` for a new one.
pub fn follow(run: &str, offset: u64, wait: Duration) -> Result<Event, RunError> {
    let dir = run_dir(run)?;
    if !dir.is_dir() {
        return Err(RunError::Unknown(run.to_string()));
    }
    // Rewritten, not just opened: its modification time is the heartbeat.
    let beat = dir.join(FOLLOWED);
    fs::write(&beat, b"").map_err(io("cannot write", &beat))?;
    let path = dir.join("events.jsonl");
    let until = Instant::now() + wait;
    loop {
        // Liveness first: a runner that wrote its last line and exited is seen with it.
        let running = alive(&dir);
        let (events, next) = read_events(&path, offset, CHUNK)?;
        if !events.is_empty() || !running || Instant::now() >= until {
            return Ok(Event::Followed {
                events,
                offset: next,
                running,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asks the run to stop after its current step, or at once when `now`.
pub fn stop(run: &str, now: bool) -> Result<Event, RunError> {
    let dir = run_dir(run)?;
    if !dir.is_dir() {
        return Err(RunError::Unknown(run.to_string()));
    }
    let flag = dir.join("stop");
    fs::write(&flag, b"").map_err(io("cannot write", &flag))?;
    let pid = runner_pid(&dir);
    if now && let Some(pid) = pid {
        return Ok(Event::Stopping {
            running: !end_group(pid, || runner_pid(&dir) == Some(pid), STOP_GRACE),
        });
    }
    Ok(Event::Stopping {
        running: pid.is_some(),
    })
}

/// How long a runner told to stop at once has to end before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Ends the process group `pid` leads (the runner: setsid, or systemd's; its tools go too):
/// SIGTERM, then SIGKILL if `alive` still holds after `grace`. Whether it ended, waiting
/// as long again after the SIGKILL.
fn end_group(pid: i32, alive: impl Fn() -> bool, grace: Duration) -> bool {
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        // SAFETY: kill(2) with a pid the caller read and checked; no memory is shared.
        unsafe {
            libc::kill(-pid, signal);
        }
        let until = Instant::now() + grace;
        while alive() {
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !alive() {
            return true;
        }
    }
    false
}

pub use crate::machine::utc_now;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_plain_names() {
        assert!(run_dir("20261201-abc.1").is_ok());
        assert!(run_dir("../x").is_err());
        assert!(run_dir(".hidden").is_err());
        assert!(run_dir("").is_err());
    }

    #[test]
    fn only_complete_lines_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e");
        let line = serde_json::to_string(&Event::Finished { stopped: false }).unwrap();
        fs::write(&p, format!("{line}\n{{\"event\":\"fin")).unwrap();
        let (events, next) = read_events(&p, 0, CHUNK).unwrap();
        assert_eq!(events, vec![Event::Finished { stopped: false }]);
        assert_eq!(next, line.len() as u64 + 1);
        let (more, same) = read_events(&p, next, CHUNK).unwrap();
        assert!(more.is_empty());
        assert_eq!(same, next);
    }

    /// A runner that ignores SIGTERM (a handler, a blocked mask) is still ended: the stop
    /// that a stall limit sends must not leave it downloading.
    #[test]
    fn a_group_that_ignores_sigterm_is_killed_after_the_grace() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ])
        .stdout(Stdio::piped());
        // SAFETY: setsid is async-signal-safe and touches no memory of this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        // Its trap is set once it says so.
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready, "ready\n");
        let exited = std::sync::atomic::AtomicBool::new(false);
        let started = Instant::now();
        let ended = std::thread::scope(|s| {
            s.spawn(|| {
                child.wait().unwrap();
                exited.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            end_group(
                pid,
                || !exited.load(std::sync::atomic::Ordering::SeqCst),
                Duration::from_millis(300),
            )
        });
        assert!(ended);
        // Not ended by the SIGTERM: it took the SIGKILL after the grace.
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[test]
    fn utc_now_is_rfc3339() {
        let now = utc_now();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
    }
}
