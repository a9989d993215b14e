//! The agent end to end on this machine through the local transport: the real binary is
//! pushed (once, by sha256), answers probes in one round trip, applies steps, and the
//! engine plans, applies and verifies against what it finds. The same code runs over SSH.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use provision::access::{TargetReader, TargetWriter};
use provision::agent::client::{AgentBinary, AgentReader, AgentWriter};
use provision::engine::reconcile::{apply, plan};
use provision::engine::removal::Undeclared;
use provision::engine::schedule::Limits;
use provision::engine::{Desired, DesiredTarget};
use provision::plan::{Action, Target};
use provision::resources::ResourceSpec;
use provision::resources::directory::DirectorySpec;
use provision::resources::file::FileSpec;
use provision::transport::local::LocalTransport;
use provision::transport::{ExecOutput, Transport, TransportError};

/// The local transport, counting the commands (round trips) it runs.
#[derive(Default)]
struct Counting {
    inner: LocalTransport,
    calls: AtomicUsize,
    /// Requests that start a detached apply.
    starts: AtomicUsize,
}

impl Transport for Counting {
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if String::from_utf8_lossy(stdin).contains("\"op\":\"start\"") {
            self.starts.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.exec(command, stdin, timeout)
    }
    fn describe(&self) -> String {
        "local".into()
    }
}

/// The agent provision carries (scripts/build-agent), as the CLI pushes it.
fn binary() -> Arc<AgentBinary> {
    Arc::new(AgentBinary::current().unwrap())
}

fn reader(t: &Arc<Counting>, agent_dir: &Path) -> Box<dyn TargetReader> {
    Box::new(AgentReader::new(t.clone(), binary()).with_dir(agent_dir.to_str().unwrap()))
}

fn writer(t: &Arc<Counting>, agent_dir: &Path) -> Box<dyn TargetWriter> {
    Box::new(AgentWriter::new(t.clone(), binary()).with_dir(agent_dir.to_str().unwrap()))
}

fn desired(root: &Path, content: &str) -> Vec<DesiredTarget> {
    let dir = root.join("etc/app");
    let file = |name: &str, content: &str, mode| {
        ResourceSpec::File(FileSpec {
            path: dir.join(name).display().to_string(),
            content: content.to_string(),
            owner: "root".into(),
            group: "root".into(),
            mode,
        })
    };
    let resources = vec![
        ResourceSpec::Directory(DirectorySpec {
            path: dir.display().to_string(),
            owner: "root".into(),
            group: "root".into(),
            mode: 0o750,
        }),
        file("app.conf", content, 0o640),
        // Hostile names and content stay data.
        file(
            "it's $(touch pwned); `id`.txt",
            "a; rm -rf /\n$(reboot)\n'\"\\\n",
            0o600,
        ),
    ];
    vec![DesiredTarget {
        target: Target::Guest {
            name: "local".into(),
            address: "local".into(),
        },
        resources: resources
            .into_iter()
            .map(|spec| Desired { spec, role: None })
            .collect(),
    }]
}

#[test]
fn push_once_probe_apply_verify_and_detect_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let agent_dir = tmp.path().join("agent");
    let root = tmp.path().join("root");
    let t = Arc::new(Counting::default());
    let want = desired(&root, "listen = 8080\n");

    // First contact: one call finds no agent, one pushes it and answers.
    let p = plan(
        "inv.yaml",
        &want,
        false,
        &Undeclared::default(),
        &Limits::default(),
        &|_| Ok(reader(&t, &agent_dir)),
    )
    .whole()
    .unwrap();
    assert_eq!(t.calls.load(Ordering::SeqCst), 2);
    assert_eq!(p.summary.create, 3, "{p:#?}");
    let pushed: Vec<_> = std::fs::read_dir(agent_dir.join("bin")).unwrap().collect();
    assert_eq!(pushed.len(), 1, "one agent binary, content-addressed");

    // Later reads: one round trip for all facts of the target.
    t.calls.store(0, Ordering::SeqCst);
    let p = plan(
        "inv.yaml",
        &want,
        false,
        &Undeclared::default(),
        &Limits::default(),
        &|_| Ok(reader(&t, &agent_dir)),
    )
    .whole()
    .unwrap();
    assert_eq!(t.calls.load(Ordering::SeqCst), 1);

    // Apply: one round trip starts the steps (detached on the target), one or more follow
    // their events until the last, one verifies.
    t.calls.store(0, Ordering::SeqCst);
    let outcomes = apply(
        &p,
        Default::default(),
        &Limits::default(),
        &|_| Ok(writer(&t, &agent_dir)),
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(t.starts.load(Ordering::SeqCst), 1);
    assert!(t.calls.load(Ordering::SeqCst) >= 3);
    // The three writes, between the two writes of the record of what provision manages.
    assert_eq!(outcomes[0].steps.len(), 5);
    assert!(agent_dir.join("managed.json").is_file());
    let conf = root.join("etc/app/app.conf");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "listen = 8080\n");
    assert!(!Path::new("pwned").exists() && !root.join("etc/app/pwned").exists());
    let hostile = root.join("etc/app/it's $(touch pwned); `id`.txt");
    assert_eq!(
        std::fs::read_to_string(&hostile).unwrap(),
        "a; rm -rf /\n$(reboot)\n'\"\\\n"
    );

    // Converged: nothing to do.
    let p = plan(
        "inv.yaml",
        &want,
        false,
        &Undeclared::default(),
        &Limits::default(),
        &|_| Ok(reader(&t, &agent_dir)),
    )
    .whole()
    .unwrap();
    assert!(!p.summary.has_changes(), "{p:#?}");
    assert_eq!(p.summary.unchanged, 3);

    // Drift by hand: content and mode.
    std::fs::write(&conf, "listen = 9090\n").unwrap();
    let p = plan(
        "inv.yaml",
        &want,
        false,
        &Undeclared::default(),
        &Limits::default(),
        &|_| Ok(reader(&t, &agent_dir)),
    )
    .whole()
    .unwrap();
    let c = &p.targets[0].changes;
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].action, Action::Update);
    assert!(
        c[0].diff
            .as_deref()
            .unwrap()
            .contains("-listen = 9090\n+listen = 8080"),
        "{:?}",
        c[0].diff
    );
    apply(
        &p,
        Default::default(),
        &Limits::default(),
        &|_| Ok(writer(&t, &agent_dir)),
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "listen = 8080\n");
}

#[test]
fn a_file_no_longer_declared_is_removed_unless_it_changed_since() {
    let tmp = tempfile::tempdir().unwrap();
    let agent_dir = tmp.path().join("agent");
    let root = tmp.path().join("root");
    let t = Arc::new(Counting::default());
    let all = desired(&root, "listen = 8080\n");
    let run = |want: &[DesiredTarget]| {
        let p = plan(
            "inv.yaml",
            want,
            false,
            &Undeclared::default(),
            &Limits::default(),
            &|_| Ok(reader(&t, &agent_dir)),
        )
        .whole()
        .unwrap();
        if p.summary.has_changes() {
            apply(
                &p,
                Default::default(),
                &Limits::default(),
                &|_| Ok(writer(&t, &agent_dir)),
                &|_, _| {},
            )
            .unwrap();
        }
        p
    };
    run(&all);
    let (conf, hostile) = (
        root.join("etc/app/app.conf"),
        root.join("etc/app/it's $(touch pwned); `id`.txt"),
    );
    // app.conf no longer declared: a `-` change, and gone after apply.
    let mut fewer = all.clone();
    fewer[0].resources.remove(1);
    let p = run(&fewer);
    let c = &p.targets[0].changes;
    assert_eq!(c.len(), 1, "{c:#?}");
    assert_eq!(c[0].action, Action::Delete);
    assert_eq!(c[0].name, conf.display().to_string());
    assert!(!conf.exists(), "the file no longer declared is still there");
    assert!(hostile.exists());
    assert!(!run(&fewer).summary.has_changes());
    // A file changed by hand since provision wrote it is kept, and said so.
    let mut none = fewer.clone();
    none[0].resources.remove(1);
    std::fs::write(&hostile, "mine now\n").unwrap();
    let p = run(&none);
    assert!(!p.summary.has_changes(), "{p:#?}");
    assert!(
        p.targets[0].warnings[0].contains("changed since provision wrote it: kept"),
        "{:?}",
        p.targets[0].warnings
    );
    assert_eq!(std::fs::read_to_string(&hostile).unwrap(), "mine now\n");
}

#[test]
fn a_failing_step_stops_the_run_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let t = Arc::new(Counting::default());
    let root = tmp.path().join("root");
    let mut want = desired(&root, "x\n");
    if let ResourceSpec::File(f) = &mut want[0].resources[1].spec {
        f.owner = "no-such-user-for-provision".into();
    }
    let agent_dir = tmp.path().join("agent");
    let p = plan(
        "inv.yaml",
        &want,
        false,
        &Undeclared::default(),
        &Limits::default(),
        &|_| Ok(reader(&t, &agent_dir)),
    )
    .whole()
    .unwrap();
    let err = apply(
        &p,
        Default::default(),
        &Limits::default(),
        &|_| Ok(writer(&t, &agent_dir)),
        &|_, _| {},
    )
    .unwrap_err();
    let text = provision::cli::render_error(&provision::cli::from_engine(err), false);
    assert!(text.contains("failed on guest local"), "{text}");
    assert!(
        text.contains("no such user: no-such-user-for-provision"),
        "{text}"
    );
    // The step after the failed one did not run.
    assert!(!root.join("etc/app/it's $(touch pwned); `id`.txt").exists());
}

#[test]
fn an_offline_plan_is_refused_before_any_connection() {
    // Every kind llm-two declares can be applied now (the container through the API, its
    // root-only lines over node SSH, the guest through the agent); a plan made against an
    // empty world still cannot be: it is refused whole, before anything is reached.
    let prepared = provision::cli::prepare(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/inventory/llm-two.yaml"
    )))
    .unwrap();
    let p = provision::engine::offline_plan("llm-two", &prepared.desired);
    let connected = std::sync::atomic::AtomicBool::new(false);
    let err = apply(
        &p,
        Default::default(),
        &Limits::default(),
        &|_| {
            connected.store(true, std::sync::atomic::Ordering::SeqCst);
            Err("must not connect".into())
        },
        &|_, _| {},
    )
    .unwrap_err();
    let text = provision::cli::render_error(&provision::cli::from_engine(err), false);
    assert!(
        text.contains("made with --offline against an empty world; nothing was changed"),
        "{text}"
    );
    assert!(!connected.load(std::sync::atomic::Ordering::SeqCst));
}

/// A second provision version: the same agent with other bytes, so another sha256.
fn other_version(dir: &Path) -> Arc<AgentBinary> {
    let path = dir.join("provision-other");
    let mut bytes = binary().unpacked().unwrap();
    bytes.extend_from_slice(b"\0another provision version\0");
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    Arc::new(AgentBinary::from_path(path).unwrap())
}

fn cached(agent_dir: &Path) -> Vec<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<(String, u64)> = std::fs::read_dir(agent_dir.join("bin"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().ino(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn two_versions_reading_one_target_keep_each_others_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let agent_dir = tmp.path().join("agent");
    let root = tmp.path().join("root");
    let want = desired(&root, "listen = 8080\n");
    let t = Arc::new(Counting::default());
    let (a, b) = (binary(), other_version(tmp.path()));
    let read_with = |bin: &Arc<AgentBinary>| {
        let bin = bin.clone();
        let t = t.clone();
        let dir = agent_dir.clone();
        plan(
            "inv.yaml",
            &want,
            false,
            &Undeclared::default(),
            &Limits::default(),
            &move |_| {
                Ok(Box::new(
                    AgentReader::new(t.clone(), bin.clone()).with_dir(dir.to_str().unwrap()),
                ))
            },
        )
        .whole()
        .unwrap()
    };
    read_with(&a);
    read_with(&b);
    let both = cached(&agent_dir);
    assert_eq!(both.len(), 2, "{both:?}");
    // Alternating checks: each finds its own agent where it left it, in one round trip.
    for bin in [&a, &b, &a, &b] {
        t.calls.store(0, Ordering::SeqCst);
        let p = read_with(bin);
        assert_eq!(p.summary.create, 3);
        assert_eq!(t.calls.load(Ordering::SeqCst), 1, "no push again");
        assert_eq!(cached(&agent_dir), both, "same binaries, same inodes");
    }
    assert!(
        !root.exists(),
        "reading wrote nothing outside the agent cache"
    );

    // An apply by B prunes A only once A has been unused for days.
    let p = read_with(&b);
    let apply_b = |p: &provision::plan::Plan| {
        apply(
            p,
            Default::default(),
            &Limits::default(),
            &|_| {
                Ok(Box::new(
                    AgentWriter::new(t.clone(), b.clone()).with_dir(agent_dir.to_str().unwrap()),
                ))
            },
            &|_, _| {},
        )
        .unwrap()
    };
    apply_b(&p);
    assert_eq!(cached(&agent_dir), both, "A was used just now: kept");
    let a_path = agent_dir.join("bin").join(
        &both
            .iter()
            .find(|(n, _)| a.sha256().starts_with(&n[10..]))
            .unwrap()
            .0,
    );
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(&a_path)
        .unwrap()
        .set_times(
            std::fs::FileTimes::new()
                .set_accessed(long_ago)
                .set_modified(long_ago),
        )
        .unwrap();
    std::fs::write(root.join("etc/app/app.conf"), "drift\n").unwrap();
    apply_b(&read_with(&b));
    assert!(!a_path.exists(), "unused for 30 days: pruned by an apply");
    assert_eq!(cached(&agent_dir).len(), 1);
    // A comes back by itself on its next read.
    read_with(&a);
    assert_eq!(cached(&agent_dir).len(), 2);
}

/// An agent that speaks another protocol (another provision version's, found in the cache
/// under the name this one expects, or named by `PROVISION_AGENT_BINARY`) is refused with
/// both versions named, before anything past its greeting is read. The stand-in answers
/// as such an agent does: its greeting line in the form every version keeps, then an
/// event this version does not know.
#[test]
fn an_agent_of_another_protocol_is_refused_naming_both_versions() {
    use provision::resources::wire::{PROTOCOL_VERSION, Probe};
    let tmp = tempfile::tempdir().unwrap();
    let other = PROTOCOL_VERSION + 1;
    let path = tmp.path().join("provision-agent-next");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncat >/dev/null\n\
             echo '{{\"event\":\"hello\",\"protocol\":{other},\"version\":\"9.0.0\"}}'\n\
             echo '{{\"event\":\"facts_v{other}\",\"rows\":[]}}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let t = Arc::new(Counting::default());
    let agent_dir = tmp.path().join("agent");
    let reader = AgentReader::new(t, Arc::new(AgentBinary::from_path(path).unwrap()))
        .with_dir(agent_dir.to_str().unwrap());
    let err = reader
        .read(&[Probe::Path(provision::resources::file::PathProbe {
            path: "/etc/hostname".into(),
        })])
        .unwrap_err()
        .to_string();
    let theirs = format!("speaks protocol {other} (provision 9.0.0)");
    let ours = format!(
        "this provision speaks protocol {PROTOCOL_VERSION} (provision {})",
        env!("CARGO_PKG_VERSION")
    );
    assert!(err.contains(&theirs) && err.contains(&ours), "{err}");
    assert!(err.contains("scripts/build-agent"), "{err}");
}
