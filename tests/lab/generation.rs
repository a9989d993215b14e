//! Generations on the lab, under real systemd with the SGLang stand-in
//! (tests/support/sglang-standin: NOT SGLang) built editable from a git checkout:
//! 1. an upgrade to a build that dies at import (as SGLang does after a torch upgrade
//!    without a rebuilt kernel; the preflight imports only `server_args` and passes): the
//!    old generation comes back whole, keeps serving and survives a restart by hand, and
//!    `check` says the declared generation is not in place;
//! 2. an upgrade that passes: the old generation is kept, `history` shows both,
//!    `rollback` returns to it, gated;
//! 3. the seeds' box: `/root/ml-env` a real folder, adopted (never rebuilt or lost) and
//!    rolled back to.

use crate::cli_support::Provision;
use crate::guestlab;

use std::time::{Duration, Instant};

use guestlab::{Guest, build_backends, git_repo, host};

/// What the broken build raises at import: the loader's words for a kernel built against
/// another torch (SGLang's `sgl_kernel` after a torch upgrade).
const BROKEN: &str = "ImportError: /root/ml-env/lib/python3.11/site-packages/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEa";

struct Lab {
    g: Guest,
    _shared: tempfile::TempDir,
    /// The stand-in as released, a build that dies at import, and a later good build.
    good: String,
    broken: String,
    good2: String,
    /// The ml-env's installer, declared so that whether the workstation caches uv's wheel
    /// does not decide it: pip (the seeds' venv was made with pip), uv for a benchmark.
    installer: String,
}

fn lab(name: &str) -> Lab {
    let shared = tempfile::tempdir().unwrap();
    let model = shared.path().join("models/Qwen3.5-122B-A10B");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}"#,
    )
    .unwrap();
    let g = Guest::with_shared(name, shared.path());
    let standin = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/sglang-standin");
    let trees: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    for t in &trees {
        host(&format!(
            "mkdir -p {0}/python && cp -a {standin}/pyproject.toml {standin}/src {0}/python/",
            t.path().display()
        ));
    }
    // The broken build: the server's entry point fails at import; `server_args` (all the
    // preflight imports) still loads.
    let launch = trees[1].path().join("python/src/sglang/launch_server.py");
    let text = std::fs::read_to_string(&launch).unwrap();
    let marker = "from sglang.srt.server_args import prepare_server_args\n";
    assert!(text.contains(marker));
    let message = BROKEN.trim_start_matches("ImportError: ");
    std::fs::write(
        &launch,
        text.replacen(
            marker,
            &format!("{marker}raise ImportError({message:?})\n"),
            1,
        ),
    )
    .unwrap();
    // A later good build: another commit, the same behaviour.
    host(&format!(
        "echo '# build 2' >> {}/python/src/sglang/version.py",
        trees[2].path().display()
    ));
    let paths: Vec<&std::path::Path> = trees.iter().map(|t| t.path()).collect();
    let mut commits = git_repo(&g.mirror_dir, "sglang", &paths);
    build_backends(&g.mirror_dir);
    host(&format!(
        "mkdir -p {0}/opt/wheels && cp {1}/wheels/*.whl {0}/opt/wheels/",
        g.ct.rootfs().display(),
        g.mirror_dir.display()
    ));
    let good2 = commits.pop().unwrap();
    let broken = commits.pop().unwrap();
    let good = commits.pop().unwrap();
    Lab {
        g,
        _shared: shared,
        good,
        broken,
        good2,
        installer: "pip".into(),
    }
}

impl Lab {
    /// The inventory with SGLang at `revision`.
    fn inventory(&self, revision: &str) {
        self.inventory_with(revision, "")
    }

    /// The inventory with SGLang at `revision` and `packages` (a YAML list's items, or
    /// nothing) in the ml-env.
    fn inventory_with(&self, revision: &str, packages: &str) {
        self.g.inventory(&format!(
            "        mounts: [{{ host: /unused, path: /shared }}]
        roles: [ml-env, sglang]
        ml_env:
          path: /root/ml-env
          python: \"3.11\"
          installer: {installer}
          runtime_packages: []           # the lab mirror serves no compiler
          packages: [{packages}]
          index: {{ wheelhouse: /opt/wheels }}
          sglang:
            repo: {mirror}/git/sglang.git
            revision: {revision}
            path: /root/sglang-main
        models:
          qwen3.5-122b:
            repo: Qwen/Qwen3.5-122B-A10B
            path: /shared/models/Qwen3.5-122B-A10B
        services:
          sglang-qwen:
            model: qwen3.5-122b
            served_model_name: qwen3.5-122b
            tp: 1
            port: 30000
            trust_remote_code: true
            environment:
              SGLANG_STANDIN_LINE: \"0.5.10\"
              STANDIN_GENERATION: \"{revision}\"   # the unit of each generation is its own
            restart: {{ delay: 1s, start_limit_burst: 3, start_limit_interval: 60s }}
            readiness: {{ deadline: 60s, stall_timeout: 10s, poll_interval: 500ms }}
",
            mirror = self.g.mirror_url,
            installer = self.installer,
        ));
    }

    fn serving(&self) -> bool {
        self.g
            .ct
            .ssh("python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:30000/v1/models').read().decode())\"")
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("qwen3.5-122b"))
            .unwrap_or(false)
    }

    /// Waits until the server answers, up to the inventory's own deadline (60 s): a
    /// condition polled, not a sleep hoping for it.
    fn wait_serving(&self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if self.serving() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        false
    }

    /// Where `/root/ml-env` points (empty when it is not a symlink).
    fn venv_link(&self) -> String {
        self.g
            .sh("readlink /root/ml-env || true")
            .trim()
            .to_string()
    }
}

#[test]
fn an_upgrade_that_dies_at_import_brings_the_whole_old_generation_back() {
    let l = lab("gen-broken");
    l.inventory(&l.good);
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    let first = l.venv_link();
    assert!(
        first.starts_with("/root/.provision-generations/ml-env-"),
        "{first}"
    );
    l.g.expect(&["check"], 0);

    // The upgrade: built beside, the preflight passes (it imports only server_args), the
    // restart crash-loops at import.
    l.inventory(&l.broken);
    let (plan, _) = l.g.expect(&["plan"], 0);
    assert!(plan.contains("generation"), "{plan}");
    let (out, err) = l.g.expect(&["apply", "--yes"], 1);
    let all = format!("{out}\n{err}");
    assert!(all.contains("crash"), "{all}");
    assert!(
        all.contains("undefined symbol"),
        "the journal names the failure: {all}"
    );
    assert!(
        all.contains(
            "rolled back to the last unit that passed the health gate, on its generation 1"
        ) && all.contains("ready again after"),
        "{all}"
    );
    assert_eq!(
        l.venv_link(),
        first,
        "the stable path points at the old generation"
    );
    assert!(l.serving(), "the old generation serves");

    // A restart by hand starts the old generation again (the venv is not the broken one).
    l.g.sh("systemctl restart sglang-qwen.service");
    assert!(
        l.wait_serving(),
        "the old generation did not come back after a restart by hand"
    );

    // The declared generation is not in place: drift until a later apply succeeds.
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(drift.contains("generation /root/ml-env"), "{drift}");
    assert!(
        drift.contains("gate failed"),
        "the failure is named: {drift}"
    );
    let (history, _) = l.g.expect(&["history"], 0);
    assert!(history.contains("gate FAILED"), "{history}");
    // Still drift at the next check, and gone once a later apply succeeds.
    l.g.expect(&["check"], 2);
    l.inventory(&l.good2);
    l.g.expect(&["apply", "--yes"], 0);
    l.g.expect(&["check"], 0);
}

/// A build that fails (a package the wheelhouse does not have) leaves what runs untouched
/// and restartable, `check` 2, its half-built folder named by `history`; the next switch
/// names it in `plan` and prunes it.
#[test]
fn a_failed_build_leaves_what_runs_and_the_next_switch_prunes_its_folder() {
    let l = lab("gen-failbuild");
    l.inventory(&l.good);
    l.g.expect(&["apply", "--yes"], 0);
    let first = l.venv_link();
    l.inventory_with(&l.good, "\"no-such-package==1.0\"");
    let (out, err) = l.g.expect(&["apply", "--yes"], 1);
    assert!(
        format!("{out}{err}").contains("no-such-package"),
        "the failure is named: {out}\n{err}"
    );
    assert_eq!(l.venv_link(), first, "what runs was not switched");
    assert!(l.serving());
    l.g.sh("systemctl restart sglang-qwen.service");
    assert!(l.wait_serving(), "what runs does not restart by hand");
    l.g.expect(&["check"], 2);
    let half =
        l.g.sh(&format!(
            "ls -d /root/.provision-generations/ml-env-* | grep -v -x -F '{first}' || true"
        ))
        .trim()
        .to_string();
    assert!(
        half.starts_with("/root/.provision-generations/ml-env-"),
        "{half}"
    );
    let (history, _) = l.g.expect(&["history"], 0);
    let short = half.rsplit('/').next().unwrap();
    assert!(
        history.contains("built, never switched to") && history.contains(short),
        "{history}"
    );
    // The next switch names it and prunes it; what runs before it stays (the previous).
    l.inventory(&l.good2);
    let (plan, _) = l.g.expect(&["plan"], 0);
    assert!(
        plan.contains("the switch prunes") && plan.contains(short),
        "{plan}"
    );
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(
        err.contains(&format!("pruned {half} (built, never switched to)")),
        "{out}\n{err}"
    );
    l.g.sh(&format!("test ! -e {half} && test -d {first}"));
    l.g.expect(&["check"], 0);
}

#[test]
fn a_passing_upgrade_keeps_the_old_generation_and_rollback_returns_to_it() {
    let l = lab("gen-pass");
    l.inventory(&l.good);
    l.g.expect(&["apply", "--yes"], 0);
    let first = l.venv_link();
    l.inventory(&l.good2);
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    let second = l.venv_link();
    assert_ne!(first, second);
    // The old generation is kept, whole.
    l.g.sh(&format!(
        "test -x {first}/bin/python3 && test -d {first}/lib"
    ));
    let (history, _) = l.g.expect(&["history"], 0);
    let gens: Vec<&str> = history
        .lines()
        .filter(|l| l.contains("gate passed"))
        .collect();
    assert_eq!(gens.len(), 2, "{history}");
    assert!(
        history.contains("/root/sglang-main: sglang-main-"),
        "what changed: {history}"
    );
    l.g.expect(&["check"], 0);

    let (out, err) = l.g.expect(&["rollback"], 0);
    assert!(out.contains("on its generation 1"), "{out}\n{err}");
    assert_eq!(l.venv_link(), first);
    assert!(l.serving());
    let (history, _) = l.g.expect(&["history"], 0);
    assert!(
        history.lines().any(|l| l.starts_with("  *   1")),
        "generation 1 is current: {history}"
    );
    // The inventory still declares the second: drift. Declaring the first again, what
    // runs is in place: check 0.
    l.g.expect(&["check"], 2);
    l.inventory(&l.good);
    l.g.expect(&["check"], 0);
    // Apply goes forward again without building anything.
    l.inventory(&l.good2);
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(
        !err.contains("pip install"),
        "nothing is rebuilt: {out}\n{err}"
    );
    assert_eq!(l.venv_link(), second);
    l.g.expect(&["check"], 0);
}

#[test]
fn a_real_ml_env_folder_is_adopted_never_rebuilt_or_lost() {
    let l = lab("gen-adopt");
    l.inventory(&l.good);
    l.g.expect(&["apply", "--yes"], 0);
    // The seeds' box: /root/ml-env and /root/sglang-main real folders, SGLang installed
    // editable from /root/sglang-main, what serves.
    l.g.sh(
        "set -e; for p in /root/ml-env /root/sglang-main; do d=$(readlink $p); rm $p; cp -a $d $p; done; \
         /root/ml-env/bin/python3 -m pip install -q --no-index --find-links /opt/wheels -e /root/sglang-main/python; \
         echo seeds > /root/ml-env/marker; systemctl restart sglang-qwen.service",
    );
    assert!(
        l.g.sh("/root/ml-env/bin/python3 -c 'import sglang; print(sglang.__file__)'")
            .starts_with("/root/sglang-main/"),
        "the seeds' venv names the stable checkout"
    );
    assert!(l.wait_serving());
    let (plan, _) = l.g.expect(&["plan"], 0);
    assert!(plan.contains("is a real folder"), "{plan}");
    l.inventory(&l.good2);
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    let adopted =
        l.g.sh("ls -d /root/.provision-generations/ml-env-adopted-*")
            .trim()
            .to_string();
    assert_eq!(l.g.sh(&format!("cat {adopted}/marker")), "seeds\n");
    let (history, _) = l.g.expect(&["history"], 0);
    assert!(history.contains("adopted (was serving)"), "{history}");
    // Back to the adopted folders: they name the stable paths, which point at them again.
    l.g.expect(&["rollback"], 0);
    assert_eq!(l.venv_link(), adopted);
    assert!(l.serving());
    assert_eq!(l.g.sh("cat /root/ml-env/marker"), "seeds\n");
}

/// The seconds in `... ready after 1.6s` (the gate's verdict: the server's own start).
fn ready_after(stderr: &str) -> f64 {
    let at = stderr
        .rfind("ready after ")
        .unwrap_or_else(|| panic!("no verdict in:\n{stderr}"));
    stderr[at + "ready after ".len()..]
        .split('s')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no seconds in:\n{stderr}"))
}

/// `scripts/bench-generations`: an apply that switches between two generations already
/// built (the inventory's SGLang revision changed back and forth), timed from apply's
/// start to its exit (the server serving), against the server's own start (the gate's
/// `ready after`); and the disk a kept generation takes.
#[test]
#[ignore = "a benchmark: scripts/bench-generations runs it"]
fn bench_switch_between_two_built_generations() {
    let mut l = lab("gen-bench");
    if let Ok(i) = std::env::var("INSTALLER") {
        l.installer = i;
    }
    l.inventory(&l.good);
    l.g.expect(&["apply", "--yes"], 0);
    l.inventory(&l.good2);
    l.g.expect(&["apply", "--yes"], 0);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    for i in 0..reps {
        let rev = if i % 2 == 0 { &l.good } else { &l.good2 };
        l.inventory(rev);
        let start = Instant::now();
        let (out, err) = l.g.expect(&["apply", "--yes"], 0);
        let total = start.elapsed().as_secs_f64();
        assert!(
            !err.contains("pip install") && !err.contains("uv pip install"),
            "rebuilt: {out}\n{err}"
        );
        assert!(l.serving());
        let server = ready_after(&err);
        println!(
            "switch {i}: apply to serving {total:.2} s, server start {server:.2} s, provision {:.2} s",
            total - server
        );
    }
    for line in
        l.g.sh("du -sk /root/.provision-generations/* | sort -k2")
            .lines()
    {
        println!("disk: {line}");
    }
}

/// How a kill point is reached: a line the apply prints, a process the run starts on the
/// target, or a hold inside the switch (`generations::target::HOLD_DIR`: the switch waits
/// at that point while a file exists).
enum At {
    Line(&'static str),
    /// A process whose command line matches (`pgrep -f`, a regular expression written so
    /// that it does not match itself): the guest itself kills the run once it appears, so
    /// the kill lands while that process runs. A line (printed when its
    /// step starts, seen here after the stream and the test's poll) is killed only after an
    /// SSH round trip, by which time a loaded run may be steps further.
    Process(&'static str),
    Hold(&'static str),
}

impl Lab {
    /// The generation the running server is on, as (the revision its unit names, the venv
    /// it runs): the unit's `STANDIN_GENERATION` from the process's environment, and the
    /// venv its interpreter's path names (a pinned unit names the folder, a unit as
    /// declared names `/root/ml-env`, whose link nothing moves after a boot).
    fn running_generation(&self) -> (String, String) {
        let out = self.g.sh(
            "pid=$(systemctl show -p MainPID --value sglang-qwen.service); \
             tr '\\0' '\\n' < /proc/$pid/environ | sed -n 's/^STANDIN_GENERATION=//p'; \
             exe=$(tr '\\0' '\\n' < /proc/$pid/cmdline | head -1); \
             readlink -f \"$(dirname \"$(dirname \"$exe\")\")\"",
        );
        let mut lines = out.lines().map(str::to_string);
        (
            lines.next().unwrap_or_default(),
            lines.next().unwrap_or_default(),
        )
    }

    /// Asserts that the server serves, on one whole generation: the unit of a revision on
    /// that revision's venv (`venvs`: revision -> venv, of the generations switched to).
    /// `why` is what the kill left (the apply's output, the unit's states), for the message.
    fn serves_one_generation(
        &self,
        name: &str,
        when: &str,
        venvs: &[(String, String)],
        why: &dyn Fn() -> String,
    ) {
        assert!(
            self.wait_serving(),
            "{name}: nothing serves {when}\n{}",
            why()
        );
        let (unit_rev, venv) = self.running_generation();
        let want = venvs
            .iter()
            .find(|(rev, _)| *rev == unit_rev)
            .map(|(_, v)| v.as_str());
        assert_eq!(
            want,
            Some(venv.as_str()),
            "{name}: {when}, the unit of revision {unit_rev} runs on {venv}: not one generation\n{}",
            why()
        );
    }
}

/// kill -9 of provision and of its detached run on the target (as a crash of both would)
/// at every step of an upgrade's switch, the unit changing with it: during the new
/// generation's build, as the switch starts, after its units are pinned, between its two
/// link renames, after the links and after the units are written, and inside the health
/// gate. After each, a restart by hand and then a reboot of the container bring the
/// service up on one whole generation (old or new: its unit on its venv), and the next
/// apply converges (gated) with check 0.
#[test]
fn kill_9_at_each_step_of_a_switch_leaves_one_generation_that_starts() {
    let l = lab("gen-kill");
    let points = [
        (
            "pip install -e of the new generation",
            At::Process("[ ]-e /root/.provision-generations/sglang-main-"),
        ),
        ("the switch's start", At::Line("switch /root/ml-env")),
        ("the units pinned", At::Hold("pinned")),
        ("one link moved", At::Hold("one-link")),
        ("both links moved", At::Hold("linked")),
        ("the units written", At::Hold("written")),
        (
            "the health gate",
            At::Line("deploy sglang-qwen.service and wait until it is ready"),
        ),
    ];
    l.inventory(&l.good);
    l.g.expect(&["apply", "--yes"], 0);
    // Revision -> its venv, once an apply has switched to it: the generations that may run.
    let mut venvs = vec![(l.good.clone(), l.venv_link())];
    // good2 first: the first point kills its build.
    let mut revs = [&l.good2, &l.good].into_iter().cycle();
    for (name, at) in points {
        let rev = revs.next().unwrap();
        l.inventory(rev);
        if let At::Hold(point) = at {
            l.g.sh(&format!(
                "mkdir -p /run/provision/hold-switch && touch /run/provision/hold-switch/{point}"
            ));
        }
        let running = l.venv_link();
        let err_path = l.g.dir.path().join("kill.err");
        let mut child = Provision::new(["apply", "--yes", "--target", "guest.t"])
            .known_hosts(&l.g.dir.path().join("known_hosts"), false)
            .arg(l.g.dir.path().join("inventory.yaml"))
            .env_remove("SSH_AUTH_SOCK")
            .command()
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let mut seen = false;
        while start.elapsed() < Duration::from_secs(120) {
            seen = match at {
                At::Line(line) => std::fs::read_to_string(&err_path)
                    .unwrap_or_default()
                    .contains(line),
                At::Process(pattern) => l
                    .g
                    .sh(&format!(
                        "timeout 120 sh -c 'until pgrep -f -- \"$0\" >/dev/null; do sleep 0.02; done; \
                         systemctl kill --signal=KILL \"provision-apply-*\"; echo killed' '{pattern}' || true"
                    ))
                    .contains("killed"),
                At::Hold(point) => {
                    l.g.sh(&format!(
                        "test -e /run/provision/hold-switch/{point}.reached && echo y || true"
                    ))
                    .contains('y')
                }
            };
            if seen || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            seen,
            "{name}: the apply never reached it:\n{}",
            std::fs::read_to_string(&err_path).unwrap_or_default()
        );
        child.kill().unwrap();
        child.wait().unwrap();
        l.g.sh("systemctl kill --signal=KILL 'provision-apply-*' 2>/dev/null; rm -rf /run/provision/hold-switch; true");
        // The stable paths are links to built folders; a build killed switched nothing.
        let venv = l.venv_link();
        if let At::Process(_) = at {
            assert_eq!(
                venv, running,
                "{name}: the kill in the build moved the link"
            );
        }
        assert!(
            venv.starts_with("/root/.provision-generations/"),
            "{name}: {venv}"
        );
        l.g.sh(&format!(
            "test -x {venv}/bin/python3 && test -f {venv}/pyvenv.cfg"
        ));
        // A restart by hand (systemd's loaded unit) and a boot (the unit on disk) each
        // start one whole generation.
        let killed = std::fs::read_to_string(&err_path).unwrap_or_default();
        let state = l.g.sh(
            "ls -l /root/ml-env /root/sglang-main; systemctl cat sglang-qwen.service; \
             journalctl --no-pager -o short-precise -u 'provision-apply-*' -u sglang-qwen.service | tail -n 60 | cut -c1-300",
        );
        let why = || format!("the apply killed:\n{killed}\nthe guest after the kill:\n{state}");
        l.g.sh("systemctl reset-failed sglang-qwen.service; systemctl restart sglang-qwen.service");
        l.serves_one_generation(name, "after a restart by hand", &venvs, &why);
        l.g.reboot();
        l.serves_one_generation(name, "after a reboot", &venvs, &why);
        // The next apply converges, and gates what it switched to.
        l.g.expect(&["apply", "--yes"], 0);
        if !venvs.iter().any(|(r, _)| r == rev) {
            venvs.push((rev.clone(), l.venv_link()));
        }
        l.g.expect(&["check"], 0);
        assert!(l.serving(), "{name}");
        let (history, _) = l.g.expect(&["history"], 0);
        let current = history
            .lines()
            .find(|h| h.starts_with("  *"))
            .unwrap_or_default();
        assert!(current.contains("gate passed"), "{name}: {history}");
    }
}
