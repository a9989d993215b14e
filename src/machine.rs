//! Primitives the agent uses on the machine it runs on: running a program, looking up
//! users and groups, and writing a file atomically. Every kind's agent-side code goes
//! through these, so each exists once.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// The agent's state folder on this machine, set once by the agent as it starts (the folder
/// its binary is cached under); what it keeps there (the record of what provision manages)
/// follows it, so an agent run from a test's own folder never touches the machine's.
static STATE_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Sets [`state_dir`] (the first call wins).
pub fn set_state_dir(dir: PathBuf) {
    let _ = STATE_DIR.set(dir);
}

/// The agent's state folder: as set by the agent, else `/var/lib/provision`.
pub fn state_dir() -> PathBuf {
    STATE_DIR
        .get()
        .cloned()
        .unwrap_or_else(|| PathBuf::from("/var/lib/provision"))
}

/// Runs `cmd` to its end, or for `limit` at most: `None` when it ran past that, after its
/// whole process group (it leads one) was killed. Its stdin is empty; what it printed
/// comes back when it ends in time. Nothing is waited on past the limit, not even a
/// process the kernel holds in an uninterruptible wait (a hung GPU's `nvidia-smi`).
pub fn output_within(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> std::io::Result<Option<std::process::Output>> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let group = child.id() as libc::pid_t;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // stderr on a thread of its own, so neither pipe fills while the other is read.
        let errs = std::thread::spawn(move || {
            let mut e = Vec::new();
            if let Some(err) = err.as_mut() {
                let _ = err.read_to_end(&mut e);
            }
            e
        });
        let mut stdout = Vec::new();
        if let Some(out) = out.as_mut() {
            let _ = out.read_to_end(&mut stdout);
        }
        let stderr = errs.join().unwrap_or_default();
        let _ = tx.send(child.wait().map(|status| std::process::Output {
            status,
            stdout,
            stderr,
        }));
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.map(Some),
        Err(_) => {
            // SAFETY: signals the process group this function made (`process_group(0)`
            // made the child its leader); the child is reaped only after its pipes close,
            // so while any of the group holds them, the id is still the group's.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            Ok(None)
        }
    }
}

/// Why something on the machine the agent runs on failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A program exited non-zero.
    #[error("{command} exited with {status}:\n{output}")]
    Exit {
        /// The command line.
        command: String,
        /// Its exit code, or "a signal".
        status: String,
        /// The last lines of its stderr (or stdout when stderr was empty).
        output: String,
    },
    /// A file-system call failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("create", "read", ...).
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A user or group name that the machine does not know.
    #[error("no such {kind}: {name}")]
    UnknownId {
        /// "user" or "group".
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A file that reads back different from what was written.
    #[error("{} reads back different from what was written (sha256 {got} instead of {want})", path.display())]
    ReadBack {
        /// The file.
        path: PathBuf,
        /// sha256 read back.
        got: String,
        /// sha256 written.
        want: String,
    },
    /// A program ran past its limit and was killed with what it started.
    #[error("{command} did not finish within {}s and was killed: {why}", limit.as_secs())]
    Hung {
        /// The command.
        command: String,
        /// Its limit.
        limit: std::time::Duration,
        /// What a program that hangs there usually waits on.
        why: String,
    },
    /// Something read on the machine is not in the form expected.
    #[error("{what}: {detail}")]
    Unexpected {
        /// What was read.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
}

impl HostError {
    /// A file-system error on `path`, as a `map_err` argument.
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HostError {
        let path = path.to_path_buf();
        move |source| HostError::Io {
            action,
            path,
            source,
        }
    }
}

/// Runs a program, failing with its output's tail when it exits non-zero. Its output
/// lines are reported as progress while it runs (at most a few a second), so a long apt or
/// pip run shows its last line on the workstation.
pub fn run(program: &str, args: &[String], env: &[(&str, &str)]) -> Result<(), HostError> {
    execute(program, args, env, true).map(drop)
}

/// Runs a program; its stdout, or an error with its output's tail when it exits non-zero.
pub fn output(program: &str, args: &[String], env: &[(&str, &str)]) -> Result<String, HostError> {
    execute(program, args, env, false)
}

/// Runs a program; its stdout, or an error with its output's tail. With `report`, its
/// lines go out as progress while it runs.
fn execute(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    report: bool,
) -> Result<String, HostError> {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HostError::Spawn {
            program: program.to_string(),
            source,
        })?;
    let last = std::sync::Arc::new(std::sync::Mutex::new(None::<std::time::Instant>));
    let stdout = child
        .stdout
        .take()
        .map(|s| reported(Box::new(s), last.clone(), report));
    let stderr = child
        .stderr
        .take()
        .map(|s| reported(Box::new(s), last, report));
    let status = child.wait().map_err(|source| HostError::Spawn {
        program: program.to_string(),
        source,
    })?;
    let collect = |t: Option<std::thread::JoinHandle<Vec<u8>>>| {
        t.and_then(|t| t.join().ok()).unwrap_or_default()
    };
    let out = std::process::Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    };
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    if text.trim().is_empty() {
        text = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let lines: Vec<&str> = text.lines().collect();
    Err(HostError::Exit {
        command: format!("{program} {}", args.join(" ")),
        status: out
            .status
            .code()
            .map_or("a signal".to_string(), |c| c.to_string()),
        output: lines[lines.len().saturating_sub(15)..].join("\n"),
    })
}

/// Reads `stream` to its end on a thread; with `report`, its newest complete line goes
/// out as progress (at most one every 300 ms across the program's streams, `last` shared
/// between them). Every byte read.
fn reported(
    mut stream: Box<dyn std::io::Read + Send>,
    last: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    report: bool,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        let mut line_start = 0;
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            if !report {
                continue;
            }
            let Some(end) = all[line_start..].iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let end = line_start + end;
            let mut when = last.lock().unwrap_or_else(|p| p.into_inner());
            if when.is_none_or(|w| w.elapsed() >= std::time::Duration::from_millis(300)) {
                let text = String::from_utf8_lossy(&all[line_start..end]);
                // The newest line; a progress bar redraws with \r, its last state counts.
                let newest = text.lines().last().unwrap_or_default();
                crate::progress::line(newest.rsplit('\r').next().unwrap_or_default());
                *when = Some(std::time::Instant::now());
            }
            line_start = end + 1;
        }
        all
    })
}

/// `systemctl show` of `props` for `unit`, as `property -> value`: the one parser of its
/// `Key=value` lines.
pub fn systemctl_show(unit: &str, props: &[&str]) -> Result<BTreeMap<String, String>, HostError> {
    let text = output(
        "systemctl",
        &[
            "show".into(),
            format!("--property={}", props.join(",")),
            "--".into(),
            unit.to_string(),
        ],
        &[],
    )?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// A user (in `/etc/passwd`) or group (in `/etc/group`) id by name; numbers pass as they are.
pub fn lookup_id(file: &str, name: &str) -> Result<u32, HostError> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let text = fs::read_to_string(file).map_err(HostError::io("read", Path::new(file)))?;
    id_entries(&text)
        .find_map(|(n, id)| (n == name).then_some(id))
        .ok_or_else(|| HostError::UnknownId {
            kind: if file.ends_with("passwd") {
                "user"
            } else {
                "group"
            },
            name: name.to_string(),
        })
}

/// `(name, id)` of each line of an `/etc/passwd` or `/etc/group` text: the one parser of
/// both files.
fn id_entries(text: &str) -> impl Iterator<Item = (&str, u32)> {
    text.lines().filter_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let id = f.nth(1)?.parse().ok()?;
        Some((name, id))
    })
}

/// Owner and group names from /etc/passwd and /etc/group (uid/gid as text when unnamed).
pub fn id_names() -> (BTreeMap<u32, String>, BTreeMap<u32, String>) {
    let read = |file: &str| -> BTreeMap<u32, String> {
        let text = fs::read_to_string(file).unwrap_or_default();
        id_entries(&text)
            .map(|(name, id)| (id, name.to_string()))
            .collect()
    };
    (read("/etc/passwd"), read("/etc/group"))
}

/// Sets owner, group and permission bits of `path`.
pub fn set_owner_mode(path: &Path, owner: &str, group: &str, mode: u32) -> Result<(), HostError> {
    let uid = lookup_id("/etc/passwd", owner)?;
    let gid = lookup_id("/etc/group", group)?;
    chown(path, Some(uid), Some(gid)).map_err(HostError::io("chown", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(HostError::io("chmod", path))
}

/// Writes `bytes` to `path` atomically with owner and mode, then reads it back and
/// compares sha256: a write that did not land is an error, not a success.
pub fn write_file_atomic(
    path: &Path,
    bytes: &[u8],
    owner: &str,
    group: &str,
    mode: u32,
) -> Result<(), HostError> {
    let dir = path.parent().ok_or_else(|| HostError::Unexpected {
        what: path.display().to_string(),
        detail: "it has no parent folder".into(),
    })?;
    fs::create_dir_all(dir).map_err(HostError::io("create", dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = dir.join(format!(".{name}.provision-{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(HostError::io("create", &tmp))?;
        f.write_all(bytes).map_err(HostError::io("write", &tmp))?;
        f.sync_all().map_err(HostError::io("sync", &tmp))?;
        drop(f);
        set_owner_mode(&tmp, owner, group, mode)?;
        fs::rename(&tmp, path).map_err(HostError::io("rename into", path))?;
        // The rename is durable only once the folder is synced.
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(HostError::io("sync", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    let back = fs::read(path).map_err(HostError::io("read back", path))?;
    let (want, got) = (Sha256::digest(bytes), Sha256::digest(&back));
    if want != got {
        return Err(HostError::ReadBack {
            path: path.to_path_buf(),
            got: hex::encode(got),
            want: hex::encode(want),
        });
    }
    Ok(())
}

/// sha256 of a file, hex, read in chunks (installers are hundreds of MB).
pub fn sha256_file(path: &Path) -> Result<String, HostError> {
    let mut file = fs::File::open(path).map_err(HostError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf).map_err(HostError::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Now, as RFC 3339 UTC (`2026-12-01T07:33:40Z`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_command_within_its_limit_answers_and_one_past_it_is_killed_with_its_children() {
        let mut quick = Command::new("/bin/sh");
        quick.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = output_within(&mut quick, std::time::Duration::from_secs(60))
            .unwrap()
            .expect("ended in time");
        assert_eq!(
            (o.stdout.as_slice(), o.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
        assert_eq!(o.status.code(), Some(3));
        // A hang (the shell waiting on a child that never ends, as on a hung GPU's
        // nvidia-smi): killed at the limit, the child with it.
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child");
        let mut hung = Command::new("/bin/sh");
        hung.arg("-c").arg(format!(
            "sleep 600 & echo $! > {}; wait",
            pid_file.display()
        ));
        let gone = output_within(&mut hung, std::time::Duration::from_millis(500)).unwrap();
        assert!(gone.is_none(), "{gone:?}");
        let child: i32 = fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed, then reaped by its parent's end (or left a zombie to init): not running.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
            assert!(
                std::time::Instant::now() < deadline,
                "sleep {child} still runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn atomic_write_replaces_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/unit.service");
        write_file_atomic(&p, b"one\n", "root", "root", 0o644).unwrap();
        write_file_atomic(&p, b"two\n", "root", "root", 0o600).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        // No temp files left behind.
        assert_eq!(fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn unknown_owner_fails_before_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, "old").unwrap();
        let e = write_file_atomic(&p, b"new", "no-such-user-xyz", "root", 0o644).unwrap_err();
        assert!(e.to_string().contains("no such user"), "{e}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
