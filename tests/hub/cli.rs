//! `provision model pull|verify|status` as a user runs them: exit codes, messages, tokens
//! never printed, and a download killed with SIGKILL halfway that resumes.

use crate::cli_support::Provision;
use crate::hub_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fakehub::{Fault, FaultKind};
use hub_support::{TOKEN, assert_identical, corrupt_keeping_mtime, hub, leftovers, model};

fn provision(args: &[&str]) -> Command {
    Provision::new(args).env_remove("HF_ENDPOINT").command()
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("provision runs");
    (
        status.code().expect("exit code"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn pull(endpoint: &str, repo: &str, dest: &Path) -> Command {
    let mut c = provision(&["model", "pull", repo]);
    c.arg(dest)
        .args(["--endpoint", endpoint, "--chunk-size", "1M"]);
    c
}

#[test]
fn pull_verify_repair_exit_codes() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let (code, out, err) = run(pull(hub.endpoint(), "org/model@main", &dest).arg("--json"));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["verified"], true);
    assert_eq!(report["commit"], hub.commit("org/model").unwrap());

    let (code, out, _) = run(provision(&["model", "verify"]).arg(&dest));
    assert_eq!(code, 0);
    assert!(out.starts_with("Verified org/model"), "{out}");
    let (code, _, _) = run(provision(&["model", "status"]).arg(&dest));
    assert_eq!(code, 0);

    corrupt_keeping_mtime(&dest.join("model-00001-of-00002.safetensors"), 1234);
    let (code, out, err) = run(provision(&["model", "verify", "--full"]).arg(&dest));
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("checksum mismatch: model-00001-of-00002.safetensors"),
        "{out}"
    );
    assert!(err.contains("provision model pull"), "{err}");
    let (code, _, _) = run(provision(&["model", "status"]).arg(&dest));
    assert_eq!(code, 2);

    let (code, out, err) = run(&mut pull(hub.endpoint(), "org/model", &dest));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 fetched"), "{out}");
    let (code, _, _) = run(provision(&["model", "verify", "--full"]).arg(&dest));
    assert_eq!(code, 0);
    assert_identical(&model("org/model"), &dest);
}

#[test]
fn errors_are_clear_and_tokens_never_printed() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("g");

    let (code, out, err) = run(&mut pull(hub.endpoint(), "org/gated", &dest));
    assert_eq!(code, 1, "{out}");
    assert!(err.starts_with("error: org/gated is gated"), "{err}");
    assert!(
        err.contains("hint: set a token: --token-env HF_TOKEN"),
        "{err}"
    );

    let secret = "hf_doNotPrintMe_93b1";
    let (code, out, err) = run(pull(hub.endpoint(), "org/gated", &dest)
        .args(["--token-env", "MY_HF_TOKEN", "-v"])
        .env("MY_HF_TOKEN", secret));
    assert_eq!(code, 1);
    assert!(err.contains("is gated"), "{err}");
    assert!(
        !out.contains(secret) && !err.contains(secret),
        "the token was printed"
    );

    let (code, out, err) = run(pull(hub.endpoint(), "org/gated", &dest)
        .args(["--token-env", "MY_HF_TOKEN"])
        .env("MY_HF_TOKEN", TOKEN));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(TOKEN) && !err.contains(TOKEN));

    let (code, _, err) = run(pull(hub.endpoint(), "org/gated", &dest)
        .args(["--token-env", "PROVISION_TEST_UNSET_TOKEN"])
        .env_remove("PROVISION_TEST_UNSET_TOKEN"));
    assert_eq!(code, 1);
    assert!(
        err.contains("environment variable `PROVISION_TEST_UNSET_TOKEN` is not set"),
        "{err}"
    );

    let (code, _, err) = run(&mut pull(hub.endpoint(), "org/model@v404", &dest));
    assert_eq!(code, 1);
    assert!(
        err.starts_with("error: revision `v404` not found in org/model"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");

    let (code, _, err) = run(provision(&["model", "verify"]).arg(dir.path()));
    assert_eq!(code, 1);
    assert!(err.contains("has no verification record"), "{err}");
    assert!(err.contains("hint: pull it first"), "{err}");

    let (code, _, err) = run(&mut pull("ftp://example.invalid", "org/model", &dest));
    assert_eq!(code, 1);
    assert!(err.contains("invalid endpoint"), "{err}");
}

/// Bytes recorded as written in the `.part.json` sidecars under `dest`.
fn recorded(dest: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dest) else {
        return 0;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(".part.json")
            && let Ok(text) = std::fs::read_to_string(&p)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        {
            total += v["done"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .sum::<u64>();
        }
    }
    total
}

#[test]
fn sigkill_halfway_resumes_and_refetches_at_most_one_chunk_per_file() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let spec = model("org/model");
    let chunk = 1u64 << 20;
    // Slow enough to stop it halfway; 4 connections at 1.5 MB/s each.
    hub.add_fault(Fault::new(
        "",
        FaultKind::Slow {
            bytes_per_sec: 1_500_000,
        },
        None,
    ));
    let log = dir.path().join("first.log");
    let mut child = pull(hub.endpoint(), "org/model", &dest)
        .args(["--concurrency", "4"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let big: u64 = spec
        .files
        .iter()
        .filter(|f| f.size > chunk)
        .map(|f| f.size)
        .sum();
    let deadline = Instant::now() + Duration::from_secs(60);
    let placed = |dest: &Path| -> u64 {
        spec.files
            .iter()
            .filter(|f| f.size > chunk && dest.join(&f.path).exists())
            .map(|f| f.size)
            .sum()
    };
    while recorded(&dest) + placed(&dest) < big * 2 / 5 {
        assert!(Instant::now() < deadline, "the download did not progress");
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let first = hub.stats();
    assert!(
        !leftovers(&dest).is_empty(),
        "parts are left to resume from"
    );

    hub.clear_faults();
    hub.reset_stats();
    let (code, out, err) = run(pull(hub.endpoint(), "org/model", &dest).arg("--json"));
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["bytes_resumed"].as_u64().unwrap() > 0, "{out}");
    let second = hub.stats();
    assert_identical(&spec, &dest);
    assert_eq!(leftovers(&dest), Vec::<String>::new());
    for f in &spec.files {
        let key = format!("org/model/{}", f.path);
        let a = first.bytes_by_file.get(&key).copied().unwrap_or(0);
        let b = second.bytes_by_file.get(&key).copied().unwrap_or(0);
        let again = (a + b).saturating_sub(f.size);
        assert!(
            again <= chunk,
            "{}: {again} bytes fetched again (first run {a}, second {b}, size {})",
            f.path,
            f.size
        );
    }
}
