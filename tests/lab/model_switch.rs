//! A model switch on a model store too small for both models: `/shared` is a tmpfs of a
//! fixed size bind-mounted into a real lab container. The plan reads the hub's listing and
//! the target's free space (statvfs, from the agent) and says that B does not fit beside A
//! before anything changes; apply refuses without a change; `--prune-models` (A no longer
//! declared) deletes A first and then downloads B.

use crate::guestlab;
use crate::hub_support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use fakehub::{Config, FakeHub, RepoSpec};
use guestlab::Guest;

/// A tmpfs of `mib` MiB mounted on `dir`, unmounted (and `dir` removed) when dropped.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts it.
    pub fn mount(dir: &Path, mib: u64) -> Tmpfs {
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .expect("mount runs")
            .success();
        assert!(
            ok,
            "mounting a tmpfs on {} (the lab tests run as root)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Two models of about 31 MiB each (two 12 MiB shards, a 7 MiB tokenizer).
fn repos() -> (RepoSpec, RepoSpec) {
    (
        RepoSpec::synthetic("org/a", 2, 12 << 20),
        RepoSpec::synthetic("org/b", 2, 12 << 20),
    )
}

fn inventory(g: &Guest, hub: &FakeHub, models: &[&str]) {
    let mut decl = String::new();
    for m in models {
        decl.push_str(&hub_support::model_entry(m, &format!("org/{m}"), m, hub));
    }
    g.inventory(&format!(
        "        mounts: [{{ host: /unused, path: /shared }}]
        roles: [model-store]
        models:
{decl}"
    ));
}

#[test]
fn a_model_that_does_not_fit_beside_the_old_one_is_refused_before_any_change() {
    let shared = tempfile::tempdir().unwrap();
    // Room for one model, not two.
    let _fs = Tmpfs::mount(shared.path(), 48);
    let g = Guest::with_shared("switch", shared.path());
    let (a, b) = repos();
    let hub = FakeHub::start(Config {
        listen: SocketAddr::new(g.bridge_ip(), 0),
        repos: vec![a.clone(), b.clone()],
        page_size: 3,
        hash_cache: None,
        ..Config::default()
    })
    .expect("the fake hub listens on the lab bridge");
    let models = shared.path().join("models");

    // A fits: the plan says what it fetches and what is free.
    inventory(&g, &hub, &["a"]);
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("to fetch, "), "{plan}");
    assert!(plan.contains("free on /shared"), "{plan}");
    g.expect(&["apply", "--yes"], 0);
    hub_support::assert_identical(&a, &models.join("a"));

    // B instead of A: A stays (no longer declared, kept: data is never deleted by
    // omission), so B does not fit; the plan says so, with the numbers and the way on.
    inventory(&g, &hub, &["b"]);
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("does not fit: needs 30.7 MiB, "), "{plan}");
    assert!(plan.contains("free on /shared"), "{plan}");
    assert!(plan.contains("pass --prune-models"), "{plan}");
    let (out, _) = g.expect(&["check"], 2);
    assert!(out.contains("does not fit"), "{out}");

    // apply refuses before any change: nothing of B, A as it was.
    hub.reset_stats();
    let (_, err) = g.expect(&["apply", "--yes"], 1);
    assert!(err.contains("does not fit"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(hub.stats().bytes_served, 0);
    assert!(!models.join("b").exists());
    hub_support::assert_identical(&a, &models.join("a"));

    // The store grown to 64 MiB: B fits beside A, and a plan saved so. Then 5 MiB go to
    // something else before it is applied: the free bytes are not in the read digest, but
    // the saved plan's download is checked against them again and refused whole.
    let remount = |mib: u64| {
        guestlab::host(&format!(
            "mount -o remount,size={mib}m {}",
            shared.path().display()
        ))
    };
    remount(64);
    let saved = g.dir.path().join("b.plan.json");
    let (plan, _) = g.expect(&["plan", "--out", saved.to_str().unwrap()], 0);
    assert!(!plan.contains("does not fit"), "{plan}");
    std::fs::write(shared.path().join("filler"), vec![1u8; 5 << 20]).unwrap();
    let (code, out, err) = g.apply_saved(&saved, &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("the saved plan is stale; nothing was changed"),
        "{err}"
    );
    assert!(
        err.contains("/shared/models/b no longer fits: needs 30.7 MiB, "),
        "{err}"
    );
    assert!(!models.join("b").exists());
    std::fs::remove_file(shared.path().join("filler")).unwrap();
    remount(48);

    // --prune-models: A's folder is deleted first, then B downloaded and verified.
    let (plan, _) = g.expect(&["plan", "--prune-models", "--detailed-exitcode"], 2);
    assert!(!plan.contains("does not fit"), "{plan}");
    let (del, add) = (
        plan.find("- model /shared/models/a")
            .expect("A's removal planned"),
        plan.find("+ model /shared/models/b")
            .expect("B's download planned"),
    );
    assert!(del < add, "the removal comes before the download:\n{plan}");
    g.expect(&["apply", "--yes", "--prune-models"], 0);
    assert!(!models.join("a").exists());
    hub_support::assert_identical(&b, &models.join("b"));
    g.expect(&["check"], 0);
}
