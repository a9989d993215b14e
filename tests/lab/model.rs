//! The model store on a real lab container: the download runs on the target (the agent),
//! next to the storage, into `/shared` through a bind mount, from a fake hub on the lab
//! bridge. Fresh download, no-op re-run (zero bytes), a changed byte found by
//! `--verify-full` and repaired, a gated repo without a token, a wrong revision.

use crate::cli_support::Provision;
use crate::guestlab;
use crate::hub_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use fakehub::{Config, FakeHub};
use guestlab::Guest;

/// A fake hub on the lab bridge's address, so containers reach it.
fn bridge_hub(g: &Guest) -> FakeHub {
    let mut gated = hub_support::model("org/gated");
    gated.gated = true;
    FakeHub::start(Config {
        listen: SocketAddr::new(g.bridge_ip(), 0),
        repos: vec![hub_support::model("org/model"), gated],
        token: Some(hub_support::TOKEN.to_string()),
        page_size: 3,
        hash_cache: None,
        ..Config::default()
    })
    .expect("the fake hub listens on the lab bridge")
}

fn inventory(g: &Guest, hub: &FakeHub, repo: &str, revision: &str, token: bool) {
    let token = if token {
        "            token: { env: PROVISION_TEST_HF_TOKEN }\n"
    } else {
        ""
    };
    g.inventory(&format!(
        "        mounts: [{{ host: /unused, path: /shared }}]
        roles: [model-store]
        models:
          m:
            repo: {repo}
            revision: {revision}
            path: /shared/models/m
            endpoint: {endpoint}
{token}",
        endpoint = hub.endpoint(),
    ));
}

#[test]
fn download_on_the_target_into_shared_verify_and_repair() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("model", shared.path());
    let hub = bridge_hub(&g);
    let dest = shared.path().join("models/m");

    // Fresh: planned as a download, done on the target, every byte as the hub has it.
    inventory(&g, &hub, "org/model", "main", false);
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("+ model /shared/models/m"), "{plan}");
    g.expect(&["apply", "--yes"], 0);
    hub_support::assert_identical(&hub_support::model("org/model"), &dest);
    assert!(hub_support::leftovers(&dest).is_empty());
    assert!(
        dest.join(fakehub_record()).is_file(),
        "no verification record"
    );

    // No-op: nothing to do, and not one byte fetched to find that out.
    hub.reset_stats();
    let (out, _) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");
    g.expect(&["check"], 0);
    assert_eq!(hub.stats().bytes_served, 0);

    // A changed byte with size and mtime kept: the routine (metadata) check cannot see it,
    // --verify-full does, and apply fetches the file again.
    let shard = dest.join("model-00001-of-00002.safetensors");
    let meta = std::fs::metadata(&shard).unwrap();
    flip_byte(&shard, 4096);
    g.expect(&["check"], 0);
    let (drift, _) = g.expect(&["check", "--verify-full"], 2);
    assert!(drift.contains("no longer matches its sha256"), "{drift}");
    hub.reset_stats();
    g.expect(&["apply", "--yes", "--verify-full"], 0);
    hub_support::assert_identical(&hub_support::model("org/model"), &dest);
    let fetched = hub.stats().bytes_served;
    assert!(
        fetched > 0 && fetched <= meta.len(),
        "fetched {fetched} bytes to repair one file of {}",
        meta.len()
    );
    g.expect(&["check", "--verify-full"], 0);

    // The same repair through a saved plan: made with --verify-full, it is applied as saved
    // (re-read the same way, so not mistaken for stale) and repairs the file.
    flip_byte(&shard, 4096);
    let saved = g.dir.path().join("verify-full.plan.json");
    let (planned, _) = g.expect(
        &["plan", "--verify-full", "--out", saved.to_str().unwrap()],
        0,
    );
    assert!(planned.contains("~ model /shared/models/m"), "{planned}");
    let (code, _, err) = g.apply_saved(&saved, &[]);
    assert_eq!(code, Some(0), "{err}");
    hub_support::assert_identical(&hub_support::model("org/model"), &dest);
    g.expect(&["check", "--verify-full"], 0);
}

/// Flips one byte of `file` in place, keeping its size, mtime and inode: damage that only a
/// full re-hash can see.
fn flip_byte(file: &Path, offset: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let meta = std::fs::metadata(file).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut byte).unwrap();
    byte[0] ^= 0xff;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&byte).unwrap();
    f.set_modified(meta.modified().unwrap()).unwrap();
    drop(f);
    let after = std::fs::metadata(file).unwrap();
    assert_eq!(
        (after.len(), after.modified().unwrap(), after.ino()),
        (meta.len(), meta.modified().unwrap(), meta.ino())
    );
}

/// One entry of a [`snapshot`]: what a write would change. The access time is left out
/// (reading a file may set it); the change time is in, as any write or chmod sets it.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    mode: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    inode: u64,
    bytes: Option<Vec<u8>>,
}

/// Every file and folder under `roots`, with its stat and, for files, its bytes.
fn snapshot(roots: &[&Path]) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<PathBuf> = roots.iter().map(|r| r.to_path_buf()).collect();
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
        out.insert(
            p.clone(),
            Entry {
                mode: m.mode(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
                inode: m.ino(),
                bytes: m.is_file().then(|| std::fs::read(&p).unwrap()),
            },
        );
    }
    out
}

/// Asserts that `args` (a read-only command) exits `code` and leaves every file and folder
/// under `roots` exactly as it was; its stdout.
fn read_only(g: &Guest, roots: &[&Path], args: &[&str], code: i32) -> String {
    let before = snapshot(roots);
    let (out, _) = g.expect(args, code);
    let after = snapshot(roots);
    if before != after {
        let differ: Vec<_> = before
            .iter()
            .filter(|(p, e)| after.get(*p) != Some(*e))
            .map(|(p, _)| p.display().to_string())
            .chain(
                after
                    .keys()
                    .filter(|p| !before.contains_key(*p))
                    .map(|p| format!("{} (new)", p.display())),
            )
            .collect();
        panic!("`provision {args:?}` changed the target: {differ:?}");
    }
    out
}

#[test]
fn check_and_verify_full_never_write_to_the_target() {
    let shared = tempfile::tempdir().unwrap();
    let g = Guest::with_shared("model-ro", shared.path());
    let hub = bridge_hub(&g);
    let dest = shared.path().join("models/m");
    inventory(&g, &hub, "org/model", "main", false);
    g.expect(&["apply", "--yes"], 0);
    let agent = g.ct.rootfs().join("var/lib/provision");
    let roots = [dest.as_path(), agent.as_path()];
    assert!(agent.join("bin").is_dir(), "the agent is installed");

    // Clean: both checks pass and write nothing.
    read_only(&g, &roots, &["check"], 0);
    read_only(&g, &roots, &["check", "--verify-full"], 0);

    // Damaged, with size, mtime and inode kept: the routine check cannot see it and the full
    // one names the file; neither records anything.
    let shard = dest.join("model-00001-of-00002.safetensors");
    flip_byte(&shard, 4096);
    read_only(&g, &roots, &["check"], 0);
    let drift = read_only(&g, &roots, &["check", "--verify-full"], 2);
    assert!(
        drift.contains("model-00001-of-00002.safetensors no longer matches its sha256"),
        "{drift}"
    );
    read_only(&g, &roots, &["plan", "--verify-full"], 0);

    // The byte restored: nothing was recorded in between, so both checks are clean again.
    flip_byte(&shard, 4096);
    read_only(&g, &roots, &["check"], 0);
    read_only(&g, &roots, &["check", "--verify-full"], 0);

    // Damaged again and repaired by apply, which fetches that file and no other.
    flip_byte(&shard, 4096);
    hub.reset_stats();
    g.expect(&["apply", "--yes", "--verify-full"], 0);
    hub_support::assert_identical(&hub_support::model("org/model"), &dest);
    let fetched: Vec<_> = hub.stats().bytes_by_file.into_keys().collect();
    assert_eq!(
        fetched,
        vec!["org/model/model-00001-of-00002.safetensors".to_string()]
    );
    read_only(&g, &roots, &["check", "--verify-full"], 0);
}

/// The name of the verification record in a model folder.
fn fakehub_record() -> &'static str {
    provision::hub::RECORD_FILE
}

#[test]
fn gated_repo_and_wrong_revision_are_clear_errors() {
    let g = Guest::new("model-err");
    let hub = bridge_hub(&g);

    inventory(&g, &hub, "org/gated", "main", false);
    let (_, err) = g.expect(&["apply", "--yes"], 1);
    assert!(err.to_lowercase().contains("gated"), "{err}");
    assert!(err.contains("hint:"), "{err}");

    inventory(&g, &hub, "org/model", "no-such-branch", false);
    let (_, err) = g.expect(&["apply", "--yes"], 1);
    assert!(err.contains("no-such-branch"), "{err}");

    // With the token (read on the workstation, sent on stdin, never printed) it works.
    inventory(&g, &hub, "org/gated", "main", true);
    let text = Provision::new(["apply", "--yes", "--target", "guest.t"])
        .known_hosts(&g.dir.path().join("known_hosts"), true)
        .arg(g.dir.path().join("inventory.yaml"))
        .env("PROVISION_TEST_HF_TOKEN", hub_support::TOKEN)
        .run()
        .expect(0);
    assert!(!text.contains(hub_support::TOKEN), "the token was printed");
    assert!(text.contains("from env PROVISION_TEST_HF_TOKEN"), "{text}");
}
