//! The real `huggingface_hub` client accepts the fake hub: `snapshot_download` against it
//! gets byte-identical files, the same provision gets. Needs the venv `scripts/hub-deps`
//! prepares; without it the test fails and says so.

use crate::hub_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use hub_support::{TOKEN, assert_identical, hub, model};
use provision::hub::{self, NoProgress, PullRequest};

fn python() -> PathBuf {
    let venv = std::env::var_os("PROVISION_HUB_VENV").map_or_else(
        || PathBuf::from("/var/cache/provision/hub-venv"),
        PathBuf::from,
    );
    let py = venv.join("bin/python");
    assert!(
        py.exists(),
        "no huggingface_hub venv at {}: run scripts/hub-deps first",
        venv.display()
    );
    py
}

fn snapshot(endpoint: &str, repo: &str, dest: &Path, token: Option<&str>) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hub/snapshot.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args([endpoint, repo])
        .arg(dest)
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HOME", home.path())
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN");
    if let Some(t) = token {
        cmd.env("HF_TOKEN", t);
    }
    cmd.output().expect("python runs")
}

fn model_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
            // huggingface_hub keeps its metadata in .cache/, provision its record.
            if rel == ".cache" || rel == hub::RECORD_FILE {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn snapshot_download_gets_the_same_bytes_as_provision() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs");
    let out = snapshot(hub.endpoint(), "org/model", &theirs, None);
    assert!(
        out.status.success(),
        "snapshot_download failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec = model("org/model");
    assert_identical(&spec, &theirs);

    let ours = dir.path().join("ours");
    let mut req = PullRequest::new("org/model", "main", &ours);
    req.endpoint = hub.endpoint().to_string();
    hub::pull(&req, &NoProgress).unwrap();
    let (a, b) = (model_files(&theirs), model_files(&ours));
    assert_eq!(a.len(), spec.files.len());
    assert!(a == b, "the two downloads differ");
}

#[test]
fn snapshot_download_of_a_gated_repo_needs_the_token() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let out = snapshot(hub.endpoint(), "org/gated", &dir.path().join("anon"), None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GatedRepoError"), "{err}");

    let dest = dir.path().join("authed");
    let out = snapshot(hub.endpoint(), "org/gated", &dest, Some(TOKEN));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_identical(&model("org/gated"), &dest);
    // huggingface_hub drops the token when leaving the hub's origin too.
    assert_eq!(hub.stats().auth_on_cdn, 0);
}
