//! The download engine against the fake hub on loopback: fresh download, no-op re-run,
//! corruption found and repaired, faults, gated repos, wrong revisions, disk full.

use crate::hub_support;

use std::path::Path;

use fakehub::{Fault, FaultKind};
use hub_support::{TOKEN, assert_identical, corrupt_keeping_mtime, hub, leftovers, model};
use provision::hub::{self, HubError, NoProgress, Problem, PullRequest, StoreState};
use provision::inventory::secret::Secret;

fn request(endpoint: &str, repo: &str, dest: &Path) -> PullRequest {
    let mut r = PullRequest::new(repo, "main", dest);
    r.endpoint = endpoint.to_string();
    r.chunk_size = 1 << 20;
    r.concurrency = 4;
    r
}

#[test]
fn fresh_download_is_identical_and_a_rerun_fetches_nothing() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let spec = model("org/model");
    let report = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(report.commit, hub.commit("org/model").unwrap());
    assert_eq!(report.files, spec.files.len());
    assert_eq!(report.files_fetched, spec.files.len());
    let total: u64 = spec.files.iter().map(|f| f.size).sum();
    assert_eq!(report.bytes_fetched, total);
    assert_identical(&spec, &dest);
    assert_eq!(leftovers(&dest), Vec::<String>::new());
    let stats = hub.stats();
    assert_eq!(stats.bytes_served, total);
    assert!(
        stats.tree_requests > 3,
        "pagination: {} pages",
        stats.tree_requests
    );
    assert!(stats.range_requests > 20, "large files came in ranges");
    assert_eq!(stats.auth_on_cdn, 0);
    let rec = hub::record::read(&dest).unwrap().unwrap();
    assert!(rec.complete);
    assert_eq!(rec.files.len(), spec.files.len());
    let shard = rec
        .files
        .iter()
        .find(|f| f.path.ends_with("00001-of-00002.safetensors"))
        .unwrap();
    assert_eq!(
        Some(shard.sha256.clone()),
        hub.sha256("org/model", &shard.path)
    );

    hub.reset_stats();
    let again = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(again.files_fetched, 0);
    assert_eq!(again.files_kept, spec.files.len());
    assert_eq!(again.bytes_fetched, 0);
    let stats = hub.stats();
    assert_eq!(stats.bytes_served, 0);
    assert_eq!(
        stats.content_requests + stats.resolve_get + stats.resolve_head,
        0
    );

    let st = hub::status(&dest, Some(&report.commit)).unwrap();
    assert_eq!(st.state, StoreState::Verified);
    assert_eq!(
        hub::status(&dest, Some("0000000000000000000000000000000000000000"))
            .unwrap()
            .state,
        StoreState::OtherCommit
    );
}

#[test]
fn corrupted_byte_is_found_by_full_verify_and_repaired_by_pull() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let spec = model("org/model");
    hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    let victim = "model-00002-of-00002.safetensors";
    corrupt_keeping_mtime(&dest.join(victim), 5_000_000);

    // Same size, mtime and inode: the metadata check cannot see it, by design.
    let quick = hub::verify(&dest, false, 0, &NoProgress).unwrap();
    assert!(quick.ok());
    assert_eq!(quick.hashed_files, 0);

    // inspect finds it too and records nothing: the record keeps every byte.
    let record = std::fs::read(dest.join(hub::RECORD_FILE)).unwrap();
    let seen = hub::inspect(&dest, true, 2, &NoProgress).unwrap();
    assert!(matches!(seen.problems.as_slice(), [Problem::Mismatch { path, .. }] if path == victim));
    assert_eq!(std::fs::read(dest.join(hub::RECORD_FILE)).unwrap(), record);
    assert_eq!(
        hub::status(&dest, None).unwrap().state,
        StoreState::Verified
    );

    let full = hub::verify(&dest, true, 2, &NoProgress).unwrap();
    assert_eq!(full.hashed_files, spec.files.len());
    assert!(matches!(full.problems.as_slice(), [Problem::Mismatch { path, .. }] if path == victim));
    assert_eq!(
        hub::status(&dest, None).unwrap().state,
        StoreState::Incomplete
    );

    hub.reset_stats();
    let report = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(report.files_fetched, 1);
    assert_eq!(
        hub.stats().bytes_served,
        12 << 20,
        "only the bad file is fetched again"
    );
    assert_identical(&spec, &dest);
    assert!(hub::verify(&dest, true, 0, &NoProgress).unwrap().ok());
}

#[test]
fn pull_verify_full_rehashes_and_repairs() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    corrupt_keeping_mtime(&dest.join("tokenizer.json"), 17);
    corrupt_keeping_mtime(&dest.join("config.json"), 3);
    let mut req = request(hub.endpoint(), "org/model", &dest);
    req.verify_full = true;
    hub.reset_stats();
    let report = hub::pull(&req, &NoProgress).unwrap();
    assert_eq!(report.files_fetched, 2);
    assert_eq!(report.files_adopted, model("org/model").files.len() - 2);
    assert_identical(&model("org/model"), &dest);
}

#[test]
fn existing_files_without_a_record_are_hashed_not_downloaded() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    std::fs::remove_file(dest.join(hub::RECORD_FILE)).unwrap();
    hub.reset_stats();
    let report = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(report.files_fetched, 0);
    assert_eq!(report.files_adopted, model("org/model").files.len());
    assert_eq!(hub.stats().bytes_served, 0);
}

#[test]
fn include_and_exclude_select_files() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let mut req = request(hub.endpoint(), "org/model", &dest);
    req.include = vec!["*.json".into(), "original/".into()];
    req.exclude = vec!["tokenizer*".into()];
    let report = hub::pull(&req, &NoProgress).unwrap();
    let mut got: Vec<String> = hub::record::read(&dest)
        .unwrap()
        .unwrap()
        .files
        .into_iter()
        .map(|f| f.path)
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors.index.json",
            "original/params.json"
        ]
    );
    assert_eq!(report.files, 4);
    req.include = vec!["*.gguf".into()];
    assert!(matches!(
        hub::pull(&req, &NoProgress),
        Err(HubError::NothingSelected { .. })
    ));
}

#[test]
fn wrong_bytes_once_are_fetched_again_and_twice_are_an_error() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let victim = "model-00001-of-00002.safetensors";
    hub.add_fault(Fault::new(
        victim,
        FaultKind::Corrupt { offset: 3_333_333 },
        Some(1),
    ));
    let dest = dir.path().join("once");
    let report = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(report.files_refetched, [victim]);
    assert_identical(&model("org/model"), &dest);

    hub.add_fault(Fault::new(
        victim,
        FaultKind::Corrupt { offset: 3_333_333 },
        None,
    ));
    let dest = dir.path().join("always");
    let err = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap_err();
    match &err {
        HubError::Mismatch { path, .. } => assert_eq!(path, victim),
        other => panic!("expected a mismatch, got {other}"),
    }
    assert!(err.to_string().contains(victim));
    assert!(!dest.join(victim).exists(), "a mismatch is never placed");
}

#[test]
fn resets_and_server_errors_are_retried_from_where_they_stopped() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    hub.add_fault(Fault::new(
        "tokenizer.json",
        FaultKind::Reset { after: 300_000 },
        Some(3),
    ));
    hub.add_fault(Fault::new("", FaultKind::Status { code: 503 }, Some(3)));
    let spec = model("org/model");
    let report = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_identical(&spec, &dest);
    let total: u64 = spec.files.iter().map(|f| f.size).sum();
    assert_eq!(report.bytes_fetched, total, "nothing written twice");
    // Each reset loses at most what was in flight, never the bytes already written.
    assert!(hub.stats().bytes_served <= total + 3 * 300_000);
}

#[test]
fn a_server_ignoring_ranges_restarts_the_file_cleanly() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    hub.add_fault(Fault::new(
        "model-00002-of-00002.safetensors",
        FaultKind::IgnoreRange,
        Some(1),
    ));
    hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_identical(&model("org/model"), &dest);
    assert!(hub::verify(&dest, true, 0, &NoProgress).unwrap().ok());
}

#[test]
fn gated_repo_needs_a_token_and_the_token_stays_on_the_hub() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("g");
    let err = hub::pull(&request(hub.endpoint(), "org/gated", &dest), &NoProgress).unwrap_err();
    assert!(
        matches!(&err, HubError::Gated { token_given: false, repo, .. } if repo == "org/gated"),
        "{err}"
    );
    assert!(
        err.hints()
            .iter()
            .any(|h| h.contains("--token-env HF_TOKEN"))
    );

    let mut req = request(hub.endpoint(), "org/gated", &dest);
    req.token = Some(Secret::new("hf_wrong".into()));
    let err = hub::pull(&req, &NoProgress).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Gated {
                token_given: true,
                ..
            }
        ),
        "{err}"
    );

    req.token = Some(Secret::new(TOKEN.into()));
    hub::pull(&req, &NoProgress).unwrap();
    assert_identical(&model("org/gated"), &dest);
    // The CDN refuses requests carrying Authorization (400): none arrived.
    assert_eq!(hub.stats().auth_on_cdn, 0);
}

#[test]
fn wrong_revision_and_unknown_repo_are_clear_errors() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(hub.endpoint(), "org/model", dir.path());
    req.revision = "v9.9".into();
    let err = hub::pull(&req, &NoProgress).unwrap_err();
    assert!(
        matches!(&err, HubError::RevisionNotFound { revision, .. } if revision == "v9.9"),
        "{err}"
    );
    assert_eq!(err.to_string(), "revision `v9.9` not found in org/model");

    let req = request(hub.endpoint(), "org/nope", dir.path());
    let err = hub::pull(&req, &NoProgress).unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err}");

    // A full commit id is a revision too.
    let mut req = request(hub.endpoint(), "org/model", &dir.path().join("c"));
    req.revision = hub.commit("org/model").unwrap();
    req.include = vec!["config.json".into()];
    hub::pull(&req, &NoProgress).unwrap();
}

/// A small tmpfs the test mounts and removes (tests run as root).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount runs");
        assert!(
            ok.success(),
            "mounting a tmpfs needs root (tests run as root)"
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn disk_full_is_refused_before_the_first_byte() {
    let hub = hub();
    let fs = Tmpfs::mount("32m");
    let dest = fs.0.path().join("big");
    let err = hub::pull(&request(hub.endpoint(), "org/big", &dest), &NoProgress).unwrap_err();
    match &err {
        HubError::NoSpace { need, free, .. } => {
            assert!(*need > 48 << 20 && *free <= 32 << 20, "{err}");
        }
        other => panic!("expected no space, got {other}"),
    }
    let stats = hub.stats();
    assert_eq!(
        stats.content_requests + stats.resolve_get,
        0,
        "no byte requested"
    );

    // What fits, fits: the same mount takes a subset.
    let mut req = request(hub.endpoint(), "org/big", &dest);
    req.include = vec!["model-00001-*".into()];
    hub::pull(&req, &NoProgress).unwrap();
}

#[test]
fn one_large_file_gets_every_worker_on_its_ranges() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let mut req = request(hub.endpoint(), "org/model", &dest);
    req.include = vec!["model-00001-*".into()];
    req.concurrency = 8;
    // Slow responses keep all eight ranges in flight at once, so chunks complete out of
    // order and the hash catches up by reading them back.
    hub.add_fault(Fault::new(
        "",
        FaultKind::Slow {
            bytes_per_sec: 8_000_000,
        },
        None,
    ));
    let report = hub::pull(&req, &NoProgress).unwrap();
    assert_eq!(report.files, 1);
    assert_eq!(hub.stats().range_requests, 12);
    let spec = model("org/model");
    let shard = spec
        .files
        .iter()
        .find(|f| f.path.starts_with("model-00001"))
        .unwrap();
    let got = std::fs::read(dest.join(&shard.path)).unwrap();
    assert!(got == fakehub::bytes("org/model", &shard.path, shard.size));
}

#[test]
fn a_touched_file_is_rehashed_once_and_restamped() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    let touched = dest.join("config.json");
    let f = std::fs::File::options().write(true).open(&touched).unwrap();
    f.set_times(std::fs::FileTimes::new().set_modified(std::time::SystemTime::UNIX_EPOCH))
        .unwrap();
    let st = hub::status(&dest, None).unwrap();
    assert_eq!(st.state, StoreState::Changed);
    assert_eq!(st.changed, ["config.json"]);
    let v = hub::verify(&dest, false, 0, &NoProgress).unwrap();
    assert!(v.ok());
    assert_eq!(v.hashed_files, 1);
    assert_eq!(
        hub::status(&dest, None).unwrap().state,
        StoreState::Verified
    );
    let v = hub::verify(&dest, false, 0, &NoProgress).unwrap();
    assert_eq!(v.hashed_files, 0);
}

/// Issue 26, fail early: a first pass without the weights leaves the record unfinished (the
/// folder is never taken for the model), and the full pull after it fetches only the
/// weights; a first pass over a finished folder keeps the weights' entries, so the pull
/// after it trusts them instead of hashing them again.
#[test]
fn a_first_pass_without_the_weights_stays_unfinished_and_keeps_what_it_left_out() {
    let hub = hub();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("m");
    let spec = model("org/model");
    let weights = |p: &str| p.ends_with(".safetensors");
    let weight_bytes: u64 = spec
        .files
        .iter()
        .filter(|f| weights(&f.path))
        .map(|f| f.size)
        .sum();
    let total: u64 = spec.files.iter().map(|f| f.size).sum();
    let mut first = request(hub.endpoint(), "org/model", &dest);
    first.exclude = vec!["*.safetensors".into()];
    first.first_pass = true;

    let report = hub::pull(&first, &NoProgress).unwrap();
    assert_eq!(report.bytes_fetched, total - weight_bytes);
    assert!(dest.join("config.json").is_file());
    assert!(!dest.join("model-00001-of-00002.safetensors").exists());
    assert!(!hub::record::read(&dest).unwrap().unwrap().complete);
    assert_eq!(
        hub::status(&dest, None).unwrap().state,
        StoreState::Incomplete
    );

    hub.reset_stats();
    let full = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(full.bytes_fetched, weight_bytes);
    assert_eq!(hub.stats().bytes_served, weight_bytes);
    assert_identical(&spec, &dest);
    assert_eq!(
        hub::status(&dest, None).unwrap().state,
        StoreState::Verified
    );

    // Over a finished folder: nothing fetched, the weights' entries kept, nothing re-hashed.
    hub::pull(&first, &NoProgress).unwrap();
    let rec = hub::record::read(&dest).unwrap().unwrap();
    assert!(!rec.complete);
    assert_eq!(rec.files.len(), spec.files.len());
    let again = hub::pull(&request(hub.endpoint(), "org/model", &dest), &NoProgress).unwrap();
    assert_eq!(
        (again.files_fetched, again.files_adopted, again.files_kept),
        (0, 0, spec.files.len())
    );
    assert!(hub::record::read(&dest).unwrap().unwrap().complete);

    // A first pass that selects nothing is no error, and leaves the folder as it was.
    let mut none = first.clone();
    none.include = vec!["*.safetensors".into()];
    assert_eq!(hub::pull(&none, &NoProgress).unwrap().files, 0);
    assert!(hub::record::read(&dest).unwrap().unwrap().complete);
}
