//! Hours-long applies on a real lab container, with a model of a few GiB from the fake hub
//! on the lab bridge: the apply streams its events while the download runs (the bytes
//! advance before the step ends), a second apply meanwhile is refused by the target's lock
//! with the holder named, and killing the SSH connection (the sshd session processes in
//! the container) mid-download loses nothing: the download goes on detached, provision
//! re-attaches and reports success, and the hub served every byte exactly once. A provision
//! killed outright leaves its run going; the next apply waits for it, then plans the rest.

use crate::cli_support::Provision;
use crate::guestlab;

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fakehub::{Config, FakeHub, Fault, FaultKind, RepoSpec};
use guestlab::Guest;

const SHARD: u64 = 1 << 30;

/// Polls `what` every half second until it holds, failing after `limit`.
fn wait_for(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        if Instant::now() >= until {
            // The apply's log, when `what` names one.
            let log = what
                .rsplit(" in ")
                .next()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default();
            panic!("timed out waiting for {what}:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The JSON objects among `text`'s lines (stderr also carries plain warnings).
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A fake hub on the lab bridge serving `repos`, every file at most `bytes_per_sec` when
/// given (slow enough that what a test looks at is surely still running, with no race on
/// its pace).
fn hub(g: &Guest, repos: Vec<RepoSpec>, bytes_per_sec: Option<u64>) -> FakeHub {
    let hub = FakeHub::start(Config {
        listen: SocketAddr::new(g.bridge_ip(), 0),
        repos,
        ..Config::default()
    })
    .expect("the fake hub listens on the lab bridge");
    if let Some(bytes_per_sec) = bytes_per_sec {
        hub.add_fault(Fault::new("", FaultKind::Slow { bytes_per_sec }, None));
    }
    hub
}

/// The inventory: the model-store role with each named repo of `hub` (`org/<name>`) at
/// `/shared/models/<name>`.
fn models(g: &Guest, hub: &FakeHub, names: &[&str]) {
    let mut text = "        mounts: [{ host: /unused, path: /shared }]\n        roles: [model-store]\n        models:\n".to_string();
    for n in names {
        text += &format!(
            "          {n}: {{ repo: org/{n}, revision: main, path: /shared/models/{n}, endpoint: {} }}\n",
            hub.endpoint()
        );
    }
    g.inventory(&text);
}

/// `provision apply --yes [--json]` in the background, stderr into a file.
fn spawn_apply(g: &Guest, stderr: &std::path::Path, json: bool) -> Child {
    Provision::new(["apply", "--yes"])
        .args(json.then_some("--json"))
        .args(["--target", "guest.t"])
        .known_hosts(&g.dir.path().join("known_hosts"), true)
        .arg(g.dir.path().join("inventory.yaml"))
        .env_remove("SSH_AUTH_SOCK")
        .command()
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn a_download_streams_holds_the_lock_and_survives_a_dropped_connection() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("stream", shared.path());
    let repo = RepoSpec::synthetic("org/big", 2, SHARD);
    let size: u64 = repo.files.iter().map(|f| f.size).sum();
    // Two shards at 20 MiB/s each: more than 50 s.
    let hub = hub(&g, vec![repo], Some(20 << 20));
    models(&g, &hub, &["big"]);

    let log = g.dir.path().join("apply.stderr");
    let mut first = spawn_apply(&g, &log, true);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let bytes_done = |events: &[serde_json::Value]| -> Vec<u64> {
        events
            .iter()
            .filter(|e| e["event"] == "progress" && e["kind"] == "bytes")
            .map(|e| e["done"].as_u64().unwrap())
            .collect()
    };
    // Streamed: bytes arrive while the download runs, long before it ends.
    wait_for(
        Duration::from_secs(300),
        &format!("the download's bytes in {}", log.display()),
        || {
            assert!(
                first.try_wait().unwrap().is_none(),
                "ended early: {}",
                read_log()
            );
            bytes_done(&json_lines(&read_log())).iter().any(|&d| d > 0)
        },
    );

    // A second apply while the first holds the target: refused, the holder named.
    let second = g.provision(&["apply", "--yes"]);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains("another apply is running on"), "{err}");
    assert!(
        err.contains(&format!("provision pid {}", first.id())),
        "the holder is named: {err}"
    );
    assert!(err.contains("since 20"), "{err}");

    // Drop the connection under the running download: kill the sshd processes serving
    // provision's session in the container (the listener stays).
    let served_before = hub.stats().bytes_served;
    assert!(served_before < size, "the download is still running");
    let killed = g.ct.exec(&["pkill", "-KILL", "-f", "^sshd: root"]).unwrap();
    assert!(killed.status.success(), "no sshd session to kill");

    let status = {
        let until = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(s) = first.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < until,
                "the apply did not end: {}",
                read_log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let mut stdout = String::new();
    first
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let text = read_log();
    assert!(status.success(), "{text}");
    assert!(text.contains("connection lost"), "{text}");
    assert!(text.contains("re-attached"), "{text}");

    // stdout: one JSON document, the apply done.
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(report["applied"], true);

    // The stream, in order: the bytes advance before the download's step ends.
    let events = json_lines(&text);
    let download = events
        .iter()
        .find(|e| {
            e["event"] == "step_started"
                && e["description"]
                    .as_str()
                    .unwrap()
                    .starts_with("download org/big")
        })
        .expect("the download's step started")["index"]
        .clone();
    let done_at = events
        .iter()
        .position(|e| e["event"] == "step_done" && e["index"] == download)
        .expect("the download's step ended");
    assert!(events[done_at]["error"].is_null(), "{}", events[done_at]);
    let before = bytes_done(&events[..done_at]);
    assert!(before.len() >= 2, "{before:?}");
    assert!(before.windows(2).all(|w| w[0] <= w[1]), "{before:?}");
    assert!(before.first() < before.last(), "{before:?}");
    assert!(*before.last().unwrap() <= size);

    // Never a second download beside the first: every byte served exactly once.
    assert_eq!(hub.stats().bytes_served, size);
    let dest = shared.path().join("models/big");
    assert_eq!(
        std::fs::metadata(dest.join("model-00002-of-00002.safetensors"))
            .unwrap()
            .len(),
        SHARD
    );

    // The target kept the run's events; the lock is free again.
    let runs = g.sh("cat /var/lib/provision/runs/*/events.jsonl");
    assert!(runs.contains("\"kind\":\"bytes\""), "{runs}");
    assert!(runs.contains("\"event\":\"finished\""), "{runs}");
    let (out, _) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");
}

/// Ctrl-C during the first of two downloads: the current step finishes, the next is not
/// started, provision says what state the target is in; the next apply does the rest.
#[test]
fn ctrl_c_finishes_the_current_step_and_starts_no_other() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("ctrlc", shared.path());
    // At 2 MiB/s a model takes more than 30 s: the interrupt surely lands inside the first.
    let hub = hub(
        &g,
        vec![
            RepoSpec::synthetic("org/a", 1, 128 << 20),
            RepoSpec::synthetic("org/b", 1, 128 << 20),
        ],
        Some(2 << 20),
    );
    models(&g, &hub, &["a", "b"]);
    let log = g.dir.path().join("apply.stderr");
    // Not a terminal, no --json: one plain line per event, as a CI log shows it.
    let mut apply = spawn_apply(&g, &log, false);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(
        Duration::from_secs(300),
        &format!("the first download's bytes in {}", log.display()),
        || {
            assert!(
                apply.try_wait().unwrap().is_none(),
                "ended early: {}",
                read_log()
            );
            read_log().lines().any(|l| {
                l.contains("):   model-00001-of-00001.safetensors ")
                    && l.contains(", total ")
                    && l.contains("/s, eta ")
            })
        },
    );
    let served = |repo: &str| -> u64 {
        hub.stats()
            .bytes_by_file
            .iter()
            .filter(|(k, _)| k.starts_with(repo))
            .map(|(_, v)| v)
            .sum()
    };
    let first = if served("org/a/") > 0 { "a" } else { "b" };
    let other = if first == "a" { "b" } else { "a" };
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(apply.id() as i32, libc::SIGINT) };
    let until = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = apply.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the apply did not end: {}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = read_log();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("stops after its current step"), "{text}");
    assert!(text.contains("apply interrupted on"), "{text}");
    assert!(text.contains("nothing is half-written"), "{text}");
    // The step that ran finished whole; the other never started.
    let shard = "model-00001-of-00001.safetensors";
    assert_eq!(
        std::fs::metadata(shared.path().join("models").join(first).join(shard))
            .unwrap()
            .len(),
        128 << 20
    );
    assert_eq!(served(&format!("org/{other}/")), 0);
    // `guest t (root@IP:22): download ... ...` as it starts, `... done (17.8s)` as it ends.
    let step = format!("): download org/{first}@main into /shared/models/{first} ...");
    assert!(text.lines().any(|l| l.ends_with(&step)), "{text}");
    assert!(
        text.lines().any(|l| l.contains(&format!("{step} done ("))),
        "{text}"
    );
    assert!(!text.contains(&format!("download org/{other}")), "{text}");

    // The next apply does the rest, and only the rest.
    hub.reset_stats();
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(served(&format!("org/{first}/")), 0);
    assert!(served(&format!("org/{other}/")) >= 128 << 20);
}

/// A download that stops receiving bytes (the hub holds the connection open and sends
/// nothing) is stopped after the stall limit, not after a total deadline; what it fetched is
/// kept, and the next apply resumes it instead of starting over.
///
/// The hub sends nothing past 16 MiB on every request, retries included: the client's
/// kernel may drop a silent connection on its own (reqwest's TCP user timeout of 30 s, seen
/// on the lab's bridge), and a retry that got the rest would race the stall limit.
#[test]
fn a_stalled_download_is_stopped_and_the_next_apply_resumes_it() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("stall", shared.path());
    const SIZE: u64 = 64 << 20;
    const SENT: u64 = 16 << 20;
    let hub = hub(&g, vec![RepoSpec::synthetic("org/s", 1, SIZE)], None);
    let shard = "model-00001-of-00001.safetensors";
    hub.add_fault(Fault::new(
        shard,
        FaultKind::StallFrom { offset: SENT },
        None,
    ));
    models(&g, &hub, &["s"]);
    let out = g.provision_env(
        &["apply", "--yes"],
        &[("PROVISION_DOWNLOAD_STALL_SECS", "20")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("made no progress for 20s"), "{err}");
    assert!(err.contains("was stopped"), "{err}");
    assert_eq!(hub.stats().bytes_by_file[&format!("org/s/{shard}")], SENT);

    // The next apply (the hub healthy again) fetches only the rest.
    hub.clear_faults();
    hub.reset_stats();
    g.expect(&["apply", "--yes"], 0);
    let rest = hub.stats().bytes_by_file[&format!("org/s/{shard}")];
    assert!(rest <= SIZE - SENT, "fetched {rest} bytes again");
    assert_eq!(
        std::fs::metadata(shared.path().join("models/s").join(shard))
            .unwrap()
            .len(),
        SIZE
    );
}

/// `kill -9` of provision mid-download: the run goes on on the target; the next apply finds
/// it held by a provision that is gone, waits for that run instead of refusing or starting
/// the download again, reads the target again and ends with nothing left to do.
#[test]
fn a_killed_apply_is_waited_for_and_not_started_twice() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("kill9", shared.path());
    const SHARD: u64 = 256 << 20;
    let repo = RepoSpec::synthetic("org/k", 1, SHARD);
    let size: u64 = repo.files.iter().map(|f| f.size).sum();
    // Slow (some seconds per shard): the kill surely lands inside the download.
    let hub = hub(&g, vec![repo], Some(4 << 20));
    models(&g, &hub, &["k"]);
    let log = g.dir.path().join("apply.stderr");
    let mut first = spawn_apply(&g, &log, false);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(
        Duration::from_secs(300),
        &format!("the download's first bytes in {}", log.display()),
        || {
            assert!(
                first.try_wait().unwrap().is_none(),
                "ended early: {}",
                read_log()
            );
            hub.stats().bytes_served > 0
        },
    );
    // kill -9, and reaped: its pid is dead, as after a shell's kill.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(
        hub.stats().bytes_served < size,
        "the download is still running"
    );

    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(
        err.contains("which is gone; waiting for that run to end"),
        "{err}"
    );
    assert!(err.contains("reading the targets again"), "{err}");
    assert!(!err.contains("another apply is running"), "{err}");
    assert!(out.contains("No changes"), "{out}\n{err}");
    // One download, the orphaned run's: every byte served exactly once.
    assert_eq!(
        hub.stats().bytes_served,
        size,
        "{err}\n{}",
        g.sh("grep -hv '\"bytes\"' /var/lib/provision/runs/*/events.jsonl")
    );
    assert_eq!(
        std::fs::metadata(
            shared
                .path()
                .join("models/k/model-00001-of-00001.safetensors")
        )
        .unwrap()
        .len(),
        SHARD
    );
    g.expect(&["check"], 0);
}
