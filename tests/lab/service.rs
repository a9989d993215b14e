//! The seeds' episodes, under real systemd in a lab container, with the SGLang stand-in
//! (tests/support/sglang-standin: NOT SGLang) installed editable from a git checkout into
//! the ml-env, as SGLang is on llm-two:
//! 1. the unit without the two flags: refused by the preflight with SGLang's own message,
//!    the running service untouched;
//! 2. a fix not written, or written but not loaded: reported;
//! 3. a hang at distributed init: called a hang within the stall timeout, rolled back;
//! 4. a crash loop that `systemctl is-active` calls active: called a crash loop at once;
//! 5. a slow but progressing load: waited for.
//!
//! Also: no restart when nothing changed, a restart when only the environment changed, a
//! fallback reported as degraded, and (issue 26) a refused preflight that stops the apply
//! before the model's weights are downloaded from a fake hub.

use crate::cli_support::Provision;
use crate::guestlab;

use std::path::Path;
use std::time::Instant;

use guestlab::{Guest, host};

/// The message SGLang 0.5.10 gives for the seeds' first unit (no space after `no_buffer.`).
const SEED_ERROR: &str = "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.";

/// The stand-in's knobs for the seeds' hang: silent after `Init torch distributed begin.`
const HANG_AT_INIT: &[(&str, &str)] = &[
    ("SGLANG_STANDIN_MODE", "hang"),
    ("SGLANG_STANDIN_HANG_AT", "distributed_init"),
];

struct Lab {
    g: Guest,
    shared: tempfile::TempDir,
    commit: String,
    /// The container declares `gpus:` (the lab container has none to show).
    gpus: std::cell::Cell<bool>,
    /// A hub the model is downloaded from (the `model-store` role), instead of a folder
    /// placed by the test.
    hub: std::cell::RefCell<Option<String>>,
    /// The container's `mounts:` and `restart:` lines, when not the default (`/shared`
    /// declared from a folder that is not there, so never a reboot).
    container: std::cell::RefCell<Option<String>>,
}

/// A container with `/shared` holding a Qwen3.5-shaped model folder, and a mirror with the
/// stand-in as a git repository (its project under `python/`, as SGLang's is) and a
/// wheelhouse with the build backends.
fn lab(name: &str) -> Lab {
    let (g, shared, commit) = guestlab::standin_guest(name);
    Lab {
        gpus: std::cell::Cell::new(false),
        hub: std::cell::RefCell::new(None),
        container: std::cell::RefCell::new(None),
        g,
        shared,
        commit,
    }
}

/// How long the deploy step took on the target, from apply's progress line
/// (`deploy sglang-qwen.service and wait until it is ready ... FAILED (9.3s)`): the time
/// to a verdict, without this machine's load on the SSH round trips around it.
fn deploy_seconds(stderr: &str) -> f64 {
    stderr
        .lines()
        // The step's end (its start is a line of its own, streamed as it begins).
        .find(|l| {
            l.contains(": deploy sglang-qwen.service")
                && (l.contains(" ... done (") || l.contains(" ... FAILED ("))
        })
        .and_then(|l| l.rsplit_once('(').map(|(_, t)| t))
        .and_then(|t| t.split_once('s').map(|(n, _)| n))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no deploy step in:\n{stderr}"))
}

/// The 1-based line of `path` that starts (after blanks) with `key`.
fn line_of(path: &Path, key: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .position(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {}", path.display()))
        + 1
}

/// `file:line:col` of the value of `key` in the inventory `path`, as apply names it.
fn value_at(path: &Path, key: &str) -> String {
    let line = line_of(path, key);
    let text = std::fs::read_to_string(path).unwrap();
    let column = text.lines().nth(line - 1).unwrap().find(key).unwrap() + key.len() + 2;
    format!("{}:{line}:{column}", path.display())
}

/// The line of `stderr` that says where the failed service is declared.
fn declared_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("the service is declared at "))
        .unwrap_or_else(|| panic!("no position in:\n{stderr}"))
        .trim()
}

impl Lab {
    /// Saves a plan of the current inventory and applies it, expecting exit 1: its stderr.
    fn apply_saved_failing(&self, name: &str) -> String {
        let saved = self.g.dir.path().join(name);
        self.g
            .expect(&["plan", "--out", saved.to_str().unwrap()], 0);
        let (code, out, err) = self.g.apply_saved(&saved, &[]);
        assert_eq!(code, Some(1), "{out}\n{err}");
        err
    }

    /// Writes the seeds' first unit (without the two settings) and applies it, expecting
    /// the preflight to refuse it in SGLang's own words: apply's stderr.
    fn apply_refused(&self) -> String {
        self.inventory(false, &[], "");
        let (_, err) = self.g.expect(&["apply", "--yes"], 1);
        assert!(
            err.contains("preflight of sglang-qwen.service failed; nothing was restarted"),
            "{err}"
        );
        assert!(err.contains(SEED_ERROR), "{err}");
        err
    }

    /// Writes the inventory: llm-two's service, with `flags` deciding whether the two
    /// settings the seeds' first unit lacked are there, and `env` more environment (the
    /// stand-in's knobs).
    fn inventory(&self, flags: bool, env: &[(&str, &str)], extra: &str) {
        self.inventory_parts(flags, flags, env, extra)
    }

    /// [`Lab::inventory`] with the two settings of the seeds' fix chosen one by one:
    /// `strategy` (`extra_buffer`) and `spec_v2` (`SGLANG_ENABLE_SPEC_V2=1`).
    fn inventory_parts(&self, strategy: bool, spec_v2: bool, env: &[(&str, &str)], extra: &str) {
        let flags = strategy;
        let mut environment = String::from("              SGLANG_STANDIN_LINE: \"0.5.10\"\n");
        if spec_v2 {
            environment += "              SGLANG_ENABLE_SPEC_V2: \"1\"\n";
        }
        for (k, v) in env {
            environment += &format!("              {k}: \"{v}\"\n");
        }
        let strategy = if flags {
            "            mamba_scheduler_strategy: extra_buffer\n"
        } else {
            ""
        };
        self.g.inventory(&format!(
            "{container}{gpus}{ml_env}        models:
          qwen3.5-122b:
            repo: Qwen/Qwen3.5-122B-A10B
            path: /shared/models/Qwen3.5-122B-A10B
{endpoint}        services:
          sglang-qwen:
            model: qwen3.5-122b
            served_model_name: qwen3.5-122b
            tp: 1
            host: 0.0.0.0
            port: 30000
            trust_remote_code: true
            attention_backend: triton
            kv_cache_dtype: bf16
            reasoning_parser: qwen3
            tool_call_parser: qwen3_coder
            speculative: {{ algorithm: NEXTN, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4 }}
{strategy}            environment:
{environment}            restart: {{ delay: 1s, start_limit_burst: 3, start_limit_interval: 60s }}
            readiness: {{ deadline: 60s, stall_timeout: 5s, poll_interval: 500ms }}
{extra}",
            container = self.container.borrow().clone().unwrap_or_else(|| {
                "        mounts: [{ host: /unused, path: /shared }]\n".into()
            }),
            ml_env = self.ml_env(),
            endpoint = self
                .hub
                .borrow()
                .as_ref()
                .map_or(String::new(), |e| format!("            endpoint: {e}\n")),
            gpus = if self.gpus.get() {
                "        gpus: { devices: [0] }\n"
            } else {
                ""
            },
        ));
    }

    /// The container's roles and ml-env: the stand-in installed from its git checkout.
    fn ml_env(&self) -> String {
        let model_store = if self.hub.borrow().is_some() {
            "model-store, "
        } else {
            ""
        };
        format!(
            "        roles: [ml-env, {model_store}sglang]
        ml_env:
          path: /root/ml-env
          python: \"3.11\"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
          runtime_packages: []           # the lab mirror serves no compiler
          index: {{ wheelhouse: /opt/wheels }}
          sglang:
            repo: {mirror}/git/sglang.git
            revision: {commit}
            path: /root/sglang-main
",
            mirror = self.g.mirror_url,
            commit = self.commit,
        )
    }

    /// Renders the inventory's unit and copies it into the container by hand, as the
    /// seeds did with scp: no daemon-reload, no restart.
    fn write_unit_by_hand(&self) {
        let rendered = tempfile::tempdir().unwrap();
        let out = Provision::new(["render", "--out"])
            .arg(rendered.path())
            .arg(self.g.dir.path().join("inventory.yaml"))
            .output();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        host(&format!(
            "cp {} {}/etc/systemd/system/sglang-qwen.service",
            rendered
                .path()
                .join("guest/t/etc/systemd/system/sglang-qwen.service")
                .display(),
            self.g.ct.rootfs().display()
        ));
    }

    fn main_pid(&self) -> String {
        self.g
            .sh("systemctl show -p MainPID --value sglang-qwen.service")
            .trim()
            .to_string()
    }

    fn unit(&self) -> String {
        self.g.sh("cat /etc/systemd/system/sglang-qwen.service")
    }

    fn serving(&self) -> bool {
        self.g
            .ct
            .ssh("curl -sf http://127.0.0.1:30000/v1/models || python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:30000/v1/models').read().decode())\"")
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("qwen3.5-122b"))
            .unwrap_or(false)
    }
}

#[test]
fn preflight_refuses_the_seeds_first_unit_and_reloads_are_verified() {
    let l = lab("svc-seed");
    // A healthy service first: the ml-env with the stand-in, the unit, enabled and ready.
    l.inventory(true, &[], "");
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    assert!(l.serving());
    assert_eq!(
        l.g.sh("systemctl is-enabled sglang-qwen.service"),
        "enabled\n"
    );
    let (pid, unit) = (l.main_pid(), l.unit());

    // Nothing changed: no restart.
    let (out, _) = l.g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");
    assert_eq!(l.main_pid(), pid);

    // Episode 1: the unit without the two flags. Refused before anything is written, with
    // SGLang's own words; the running service is untouched.
    let err = l.apply_refused();
    // Found after rendering, on the target, and still pointing at the inventory's line.
    let inventory = l.g.dir.path().join("inventory.yaml");
    let served = value_at(&inventory, "served_model_name:");
    assert_eq!(
        declared_line(&err),
        format!("the service is declared at {served}")
    );
    // The same plan saved and applied later: refused alike, naming the same place.
    let saved = l.apply_saved_failing("refused.plan.json");
    assert!(
        saved.contains("preflight of sglang-qwen.service failed; nothing was restarted"),
        "{saved}"
    );
    assert!(saved.contains(SEED_ERROR), "{saved}");
    assert_eq!(declared_line(&saved), declared_line(&err));
    assert_eq!(l.unit(), unit, "the unit was written despite the preflight");
    assert_eq!(
        l.main_pid(),
        pid,
        "the service was restarted despite the preflight"
    );
    assert!(l.serving());

    // Episode 2a: the fix is in the inventory but was never written: check shows the diff.
    l.inventory(true, &[("FIX", "1")], "");
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(drift.contains("+Environment=FIX=1"), "{drift}");

    // Episode 2b: written by hand but never loaded (no daemon-reload): the file matches,
    // systemd does not, and check says so.
    l.write_unit_by_hand();
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(
        !drift.contains("+Environment=FIX=1"),
        "the file was written: {drift}"
    );
    assert!(drift.contains("daemon-reload needed"), "{drift}");
    assert!(
        drift.contains("loaded Environment lacks `FIX=1`"),
        "{drift}"
    );

    // Apply reloads, proves systemd loaded it, restarts (only the environment changed).
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{err}");
    assert_ne!(
        l.main_pid(),
        pid,
        "an environment change restarts the service"
    );
    assert!(
        l.g.sh("systemctl show -p Environment --value sglang-qwen.service")
            .contains("FIX=1")
    );
    l.g.expect(&["check"], 0);
}

/// A reboot for new root-only lines (`restart: allowed`) restarts the server with its
/// container. The plan says so on the guest, and apply reaches the guest again once it has
/// booted and waits for the server the boot started to be ready (not restarting it) before
/// it ends: what runs after an apply that exits 0 is proven, not assumed.
#[test]
fn a_reboot_for_new_lines_waits_for_the_server_to_serve_again() {
    let l = lab("svc-reboot");
    let extra = tempfile::tempdir().unwrap();
    let mounts = |more: &str| {
        format!(
            "        hostname: ct{}\n        restart: allowed\n        mounts:\n          - {{ host: {}, path: /shared }}\n{more}",
            l.g.ct.vmid,
            l.shared.path().display()
        )
    };
    l.g.with_container.set(true);
    *l.container.borrow_mut() = Some(mounts(""));
    l.inventory(true, &[], "");
    l.g.expect(&["apply", "--yes"], 0);
    assert!(l.serving());
    l.g.expect(&["check"], 0);
    // When the container's init started, in ticks since the host booted: new at each boot
    // (a fresh boot's PIDs repeat).
    let boot = || l.g.sh("cut -d' ' -f22 /proc/1/stat");
    let booted = boot();

    *l.container.borrow_mut() = Some(mounts(&format!(
        "          - {{ host: {}, path: /extra }}\n",
        extra.path().display()
    )));
    l.inventory(true, &[], "");
    let (plan, _) = l.g.expect(&["plan"], 0);
    assert!(plan.contains("mp1"), "{plan}");
    assert!(
        plan.contains("after CT")
            && plan.contains("reboot: apply reaches this guest again once it has booted"),
        "{plan}"
    );
    assert!(plan.contains("~ service sglang-qwen.service"), "{plan}");
    assert!(plan.contains("ready again after CT"), "{plan}");

    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    let reboot = err
        .find("reboot CT")
        .unwrap_or_else(|| panic!("no reboot:\n{err}"));
    let back = err
        .find("booted again after CT")
        .unwrap_or_else(|| panic!("the guest was not reached again after the boot:\n{err}"));
    let gate = err
        .find("deploy sglang-qwen.service and wait until it is ready (restarted only if it does not get there) ... done")
        .unwrap_or_else(|| panic!("the server was not waited for:\n{err}"));
    assert!(reboot < back && back < gate, "{err}");
    assert!(err.contains("(not restarted)"), "{err}");
    // Served when apply ends: the boot's own server, not one apply started again.
    assert!(l.serving());
    assert_ne!(boot(), booted, "the container did not reboot");
    assert_eq!(l.g.sh("findmnt -n -o TARGET /extra"), "/extra\n");
    l.g.expect(&["check"], 0);

    // The same through a saved plan: it is checked against the guest as it was read (over
    // the plan's connection, before the reboot), then applied as above.
    *l.container.borrow_mut() = Some(mounts(""));
    l.inventory(true, &[], "");
    let saved = l.g.dir.path().join("reboot.plan");
    l.g.expect(&["plan", "--out", saved.to_str().unwrap()], 0);
    let booted = boot();
    let (code, out, err) = l.g.apply_saved(&saved, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("booted again after CT"), "{err}");
    assert!(err.contains("(not restarted)"), "{err}");
    assert!(l.serving());
    assert_ne!(boot(), booted, "the container did not reboot");
    assert_eq!(l.g.sh("findmnt -n -o TARGET /extra || true"), "");
    l.g.expect(&["check"], 0);
}

#[test]
fn hang_and_crash_loop_are_told_apart_and_rolled_back() {
    let l = lab("svc-fail");
    l.inventory(true, &[], "");
    l.g.expect(&["apply", "--yes"], 0);
    let good = l.unit();

    // Episode 3: a hang at distributed init, called after the stall timeout (5 s) plus a
    // poll, not after the deadline (60 s); the last good unit comes back.
    l.inventory(true, HANG_AT_INIT, "");
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    // The verdict, the rollback and the old unit's own start, all within the deploy step.
    let took = deploy_seconds(&err);
    assert!(
        err.contains("hang: stalled at:") && err.contains("Init torch distributed begin."),
        "{err}"
    );
    assert!(
        err.contains("(no log line, output, reads, CPU or GPU memory growth for 5s, port closed)"),
        "{err}"
    );
    assert!(
        err.contains("rolled back to the last unit that passed the health gate"),
        "{err}"
    );
    assert!(err.contains("ready again"), "{err}");
    assert!(
        took < 25.0,
        "the hang took {took:.1}s to call and roll back"
    );
    assert_eq!(l.unit(), good);
    assert!(l.serving());

    // Episode 4: a crash loop (it passes the preflight, then dies at start), called at
    // once with the traceback, and rolled back.
    l.inventory(
        true,
        &[
            ("SGLANG_STANDIN_MODE", "crash"),
            ("SGLANG_STANDIN_CRASH_AT", "start"),
        ],
        "",
    );
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    let took = deploy_seconds(&err);
    assert!(err.contains("crash loop"), "{err}");
    assert!(
        err.contains("Traceback") && err.contains("RuntimeError"),
        "{err}"
    );
    assert!(err.contains("rolled back"), "{err}");
    assert!(
        took < 15.0,
        "the crash loop took {took:.1}s to call and roll back"
    );
    assert_eq!(l.unit(), good);
    assert!(l.serving());
    let inventory = l.g.dir.path().join("inventory.yaml");
    assert_eq!(
        declared_line(&err),
        format!(
            "the service is declared at {}",
            value_at(&inventory, "served_model_name:")
        )
    );
    // The same deploy from a saved plan fails alike and names the same place.
    let saved = l.apply_saved_failing("crash.plan.json");
    assert!(
        saved.contains("crash loop") && saved.contains("rolled back"),
        "{saved}"
    );
    assert_eq!(declared_line(&saved), declared_line(&err));
    assert_eq!(l.unit(), good);
    assert!(l.serving());

    // --no-rollback leaves the failure in place for debugging.
    let (_, err) = l.g.expect(&["apply", "--yes", "--no-rollback"], 1);
    assert!(err.contains("left as it is for debugging"), "{err}");
    assert_ne!(l.unit(), good);

    // A fallback (as the seeds did by hand: without MTP) that works: reported as degraded.
    l.inventory(
        true,
        &[("SGLANG_STANDIN_MODE", "hang")],
        "            fallback:
              - name: without MTP
                without: [speculative, mamba_scheduler_strategy, environment.SGLANG_ENABLE_SPEC_V2, environment.SGLANG_STANDIN_MODE]
",
    );
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    assert!(err.contains("run DEGRADED"), "{err}");
    assert!(err.contains("runs fallback `without MTP`"), "{err}");
    assert!(l.serving());
    let unit = l.unit();
    assert!(
        !unit.contains("--speculative-algorithm") && !unit.contains("SGLANG_STANDIN_MODE"),
        "{unit}"
    );
    // The difference from the inventory stays visible.
    l.g.expect(&["check"], 2);
}

#[test]
fn a_slow_load_that_keeps_talking_is_waited_for() {
    let l = lab("svc-slow");
    // Episode 5: 12 s of loading with a progress line every shard, a 5 s stall timeout:
    // the journal keeps moving, so it is loading, not hanging.
    l.inventory(
        true,
        &[
            ("SGLANG_STANDIN_MODE", "slow"),
            ("SGLANG_STANDIN_LOAD_SECONDS", "12"),
            ("SGLANG_STANDIN_PROGRESS", "lines"),
        ],
        "",
    );
    let started = Instant::now();
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(
        started.elapsed().as_secs() >= 12,
        "it did not wait for the load"
    );
    assert!(err.contains("ready after"), "{err}");
    assert!(l.serving());
    assert!(
        Path::new(&l.g.ct.rootfs())
            .join("var/lib/provision/last-known-good/sglang-qwen.service")
            .is_file()
    );

    // Issue 11, finding 1: a load that shows progress as real SGLang does, a tqdm bar of
    // carriage returns that journald holds until the load ends, for three times the
    // stall timeout. Nothing reaches the journal for 15 s, but the process keeps writing:
    // waited for, and ready.
    l.inventory(
        true,
        &[
            ("SGLANG_STANDIN_MODE", "slow"),
            ("SGLANG_STANDIN_LOAD_SECONDS", "15"),
            ("SGLANG_STANDIN_PROGRESS", "tqdm"),
        ],
        "",
    );
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    let took = deploy_seconds(&err);
    assert!(
        took >= 15.0,
        "the load was not waited for: {took:.1}s\n{err}"
    );
    assert!(err.contains("ready after"), "{err}");
    assert!(l.serving());
    let journal =
        l.g.sh("journalctl -u sglang-qwen.service -o cat --no-pager");
    assert!(
        journal.contains("Loading safetensors checkpoint shards: 100% Completed"),
        "the stand-in printed no tqdm bar: {journal}"
    );

    // A load in progress that provision did not start (the node rebooted and systemd
    // started the unit): not ready yet, so `check` calls it drift, but apply waits for
    // the running server instead of restarting it and throwing the load away.
    l.g.sh("systemctl restart sglang-qwen.service");
    let pid = l.main_pid();
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(
        drift.contains("not ready") && drift.contains("apply waits for it first"),
        "{drift}"
    );
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    assert_eq!(
        l.main_pid(),
        pid,
        "apply restarted a loading server:\n{err}"
    );
    assert!(err.contains("(not restarted)"), "{err}");
    assert!(l.serving());
    l.g.expect(&["check"], 0);

    // The seeds' hang, silent at distributed init: still called within the stall timeout
    // plus one poll (5 s + 0.5 s: the verdict says 5 s without progress, not 6).
    l.inventory(true, HANG_AT_INIT, "");
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    assert!(
        err.contains("Init torch distributed begin.")
            && err.contains("CPU or GPU memory growth for 5s, port closed"),
        "{err}"
    );
    assert!(l.serving(), "the tqdm unit came back");
}

/// Issue 26: a healthy first start that outlives its deadline is not killed while it makes
/// progress. A 6 s deadline, a 5 s stall timeout and a 15 s load shown as real SGLang
/// shows it (a tqdm bar the journal holds until the end, so only the process's own
/// activity moves): ready, not "not ready before the deadline".
#[test]
fn a_load_that_outlives_its_deadline_while_progressing_is_waited_for() {
    let l = lab("svc-overdue");
    l.inventory(
        true,
        &[
            ("SGLANG_STANDIN_MODE", "slow"),
            ("SGLANG_STANDIN_LOAD_SECONDS", "15"),
            ("SGLANG_STANDIN_PROGRESS", "tqdm"),
        ],
        "",
    );
    let path = l.g.dir.path().join("inventory.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("deadline: 60s"), "{text}");
    std::fs::write(&path, text.replace("deadline: 60s", "deadline: 6s")).unwrap();
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    let took = deploy_seconds(&err);
    assert!(
        took >= 15.0,
        "the load was not waited for: {took:.1}s\n{err}"
    );
    assert!(err.contains("ready after"), "{err}");
    assert!(l.serving());
}

/// Issue 11, findings 2, 3 and 5: what runs is compared with what is declared; a crash
/// loop and a server that does not answer are drift; preflight warnings are shown.
#[test]
fn check_compares_what_runs_and_sees_crash_loops_and_silent_servers() {
    let l = lab("svc-run");
    // The seeds' half fix: extra_buffer without SGLANG_ENABLE_SPEC_V2=1. It starts; the
    // preflight's warning reaches apply's output and its JSON.
    l.inventory_parts(true, false, &[], "");
    let (out, err) = l.g.expect(&["apply", "--yes", "--json"], 0);
    let warning = "SGLANG_ENABLE_SPEC_V2=1 is unset";
    assert!(err.contains("warning: ") && err.contains(warning), "{err}");
    assert!(out.contains(warning), "not in the JSON: {out}");
    // ...and the plan, once SGLang is installed and something changes.
    l.inventory_parts(true, false, &[("OTHER", "1")], "");
    let (out, _) = l.g.expect(&["plan"], 0);
    assert!(out.contains("! warning:") && out.contains(warning), "{out}");
    let (out, _) = l.g.expect(&["plan", "--json"], 0);
    assert!(
        out.contains("\"warnings\"") && out.contains(warning),
        "{out}"
    );

    // Finding 2: the fix written and loaded (daemon-reload) but never restarted: the file
    // and systemd agree with the inventory, the process does not.
    l.inventory_parts(true, true, &[], "");
    let pid = l.main_pid();
    l.write_unit_by_hand();
    l.g.sh("systemctl daemon-reload");
    assert!(
        l.g.sh("systemctl show -p Environment --value sglang-qwen.service")
            .contains("SGLANG_ENABLE_SPEC_V2=1")
    );
    assert_eq!(l.main_pid(), pid);
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(
        drift.contains(&format!(
            "the running process (PID {pid}) lacks SGLANG_ENABLE_SPEC_V2=1"
        )),
        "{drift}"
    );
    let (out, _) = l.g.expect(&["apply", "--yes"], 0);
    assert!(!out.contains("No changes"), "{out}");
    let now = l.main_pid();
    assert_ne!(now, pid, "apply did not restart the stale process");
    let environ = l.g.sh(&format!("tr '\\0' '\\n' < /proc/{now}/environ"));
    assert!(
        environ.lines().any(|l| l == "SGLANG_ENABLE_SPEC_V2=1"),
        "{environ}"
    );
    l.g.expect(&["check"], 0);

    // Finding 3: a crash loop left in place. Whatever moment check looks at (activating,
    // active between two crashes, failed), systemd has counted a restart: drift, named.
    l.inventory(
        true,
        &[
            ("SGLANG_STANDIN_MODE", "crash"),
            ("SGLANG_STANDIN_CRASH_AT", "start"),
        ],
        "",
    );
    l.g.expect(&["apply", "--yes", "--no-rollback"], 1);
    let deadline = Instant::now() + std::time::Duration::from_secs(90);
    while l
        .g
        .sh("systemctl show -p NRestarts --value sglang-qwen.service")
        .trim()
        == "0"
    {
        assert!(
            Instant::now() < deadline,
            "systemd never restarted the crashing unit"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(
        drift.contains("sglang-qwen.service crashed: systemd restarted it"),
        "{drift}"
    );

    // A server that runs but does not answer (left hanging with --no-rollback): systemd
    // says active (running); check says it is not ready.
    l.inventory(true, HANG_AT_INIT, "");
    l.g.expect(&["apply", "--yes", "--no-rollback"], 1);
    assert_eq!(
        l.g.sh("systemctl is-active sglang-qwen.service").trim(),
        "active"
    );
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(drift.contains("service sglang-qwen.service"), "{drift}");
    assert!(
        drift.contains("readiness") && drift.contains("not ready"),
        "{drift}"
    );
}

/// Issue 11, finding 4 and "also found": environment values that need quoting, a
/// CPU-only service without `gpus:` or `models:`, and unit directives; a deploy that
/// fails after writing leaves the last unit that passed the gate loaded.
#[test]
fn quoted_environment_values_directives_and_a_failed_load_restored() {
    let l = lab("svc-quote");
    let values: &[(&str, &str)] = &[
        ("TWO_WORDS", "two words"),
        ("QUOTES", r#"say "hi" and 'bye'"#),
        ("DOLLAR", "$HOME and ${PATH}"),
        ("PERCENT", "50% done %n"),
        ("BACKSLASH", r"back\slash\n"),
    ];
    let write = |more: &str| {
        let mut env = String::from("              SGLANG_STANDIN_LINE: '0.5.10'\n");
        for (k, v) in values {
            env += &format!("              {k}: '{}'\n", v.replace('\'', "''"));
        }
        env += more;
        l.g.inventory(&format!(
            "        mounts: [{{ host: /unused, path: /shared }}]
{ml_env}        services:
          sglang-qwen:
            model_path: /shared/models/Qwen3.5-122B-A10B
            served_model_name: qwen3.5-122b
            port: 30000
            environment:
{env}            restart: {{ delay: 1s, start_limit_burst: 3, start_limit_interval: 60s }}
            readiness: {{ deadline: 60s, stall_timeout: 5s, poll_interval: 500ms }}
            systemd:
              limit_nofile: \"65536\"
              nice: 5
              exec_start_pre: [[/bin/sh, -c, \"echo pre > /run/sglang-pre\"]]
              extra: {{ TasksMax: \"4096\" }}
",
            ml_env = l.ml_env(),
        ));
    };
    write("");
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    l.g.expect(&["check"], 0);
    let (out, _) = l.g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");
    let pid = l.main_pid();
    let environ = l.g.sh(&format!("tr '\\0' '\\n' < /proc/{pid}/environ"));
    for (k, v) in values {
        assert!(
            environ.lines().any(|line| line == format!("{k}={v}")),
            "{k}={v} not in {environ}"
        );
    }
    let shown =
        l.g.sh("systemctl show -p LimitNOFILE,Nice,TasksMax sglang-qwen.service");
    for want in ["LimitNOFILE=65536", "Nice=5", "TasksMax=4096"] {
        assert!(shown.contains(want), "{want} not in {shown}");
    }
    assert_eq!(l.g.sh("cat /run/sglang-pre"), "pre\n");
    let good = l.unit();

    // A drop-in written by someone else makes systemd load another value than the one
    // provision writes: the deploy fails after its daemon-reload, and the last unit that
    // passed the gate is put back and loaded; the running process is left alone.
    l.g.sh("mkdir -p /etc/systemd/system/sglang-qwen.service.d && printf '[Service]\\nEnvironment=SGLANG_STANDIN_LINE=0.5.23\\n' > /etc/systemd/system/sglang-qwen.service.d/zz-local.conf");
    write("              NEW: '1'\n");
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    assert!(
        err.contains("systemd did not load what was written"),
        "{err}"
    );
    assert!(err.contains("is loaded again"), "{err}");
    assert_eq!(l.unit(), good);
    assert_eq!(
        l.g.sh("systemctl show -p NeedDaemonReload --value sglang-qwen.service"),
        "no\n"
    );
    assert!(
        !l.g.sh("systemctl show -p Environment --value sglang-qwen.service")
            .contains("NEW=1")
    );
    assert_eq!(l.main_pid(), pid);
    assert!(l.serving());
}

/// A role of the user's own with a service of its own (not SGLang, no inventory
/// `services:`): its unit file is a `file` resource, the service names only its unit, and
/// provision proves systemd loaded that file. Converges, stays converged, and a change of
/// the file restarts it.
#[test]
fn a_users_own_role_with_a_service_of_its_own() {
    let g = Guest::new("svc-own");
    let role = |seconds: u32| {
        format!(
            r#"description: A server of the user's own.
resources:
  - kind: file
    path: /etc/systemd/system/my-server.service
    content: "[Unit]\nDescription=mine\n[Service]\nExecStart=/bin/sleep {seconds}\n[Install]\nWantedBy=multi-user.target\n"
  - kind: service
    unit: my-server.service
    unit_path: /etc/systemd/system/my-server.service
    depends_on: ["file:/etc/systemd/system/my-server.service"]
"#
        )
    };
    g.role("my-server", &role(100_000));
    g.inventory("        roles: [my-server]\n");
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    assert_eq!(g.sh("systemctl is-active my-server.service"), "active\n");
    assert_eq!(g.sh("systemctl is-enabled my-server.service"), "enabled\n");
    g.expect(&["check"], 0);
    let (out, _) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");

    // A new command line in the role's unit file: written, loaded, restarted.
    g.role("my-server", &role(200_000));
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("my-server.service"), "{plan}");
    g.expect(&["apply", "--yes"], 0);
    let pid = g.sh("systemctl show -p MainPID --value my-server.service");
    assert_eq!(
        g.sh(&format!("tr '\\0' ' ' < /proc/{}/cmdline", pid.trim())),
        "/bin/sleep 200000 "
    );
    g.expect(&["check"], 0);
}

/// Issue 26: a GPU service in a container that shows no GPU (no NVIDIA userspace, no
/// nvidia-smi) fails its preflight before the unit is written, instead of a warning.
#[test]
fn a_gpu_service_where_no_gpu_is_seen_fails_its_preflight() {
    let l = lab("svc-nogpu");
    l.gpus.set(true);
    l.inventory(true, &[], "");
    let (_, err) = l.g.expect(&["apply", "--yes"], 1);
    assert!(
        err.contains("the service runs on GPUs, but nvidia-smi cannot run here"),
        "{err}"
    );
    assert!(
        l.g.ct
            .ssh("test -e /etc/systemd/system/sglang-qwen.service")
            .is_ok_and(|o| !o.status.success()),
        "the unit was written despite the preflight"
    );
    // The same service without `gpus:` (a CPU-only stand-in): only a warning.
    l.gpus.set(false);
    l.inventory(true, &[], "");
    let (_, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("the GPU count was not checked"), "{err}");
}

/// Issue 26, fail early: the model's small files come first and the preflight runs on them,
/// so a refused argv stops the apply before one byte of the weights is fetched (on llm-two,
/// hours of download). Fixed, the next apply fetches the weights and the service serves.
#[test]
fn a_refused_preflight_stops_the_apply_before_the_weights_are_downloaded() {
    use fakehub::{Config, FakeHub, FileSpec, RepoSpec};
    let l = lab("svc-early");
    let model = l.shared.path().join("models/Qwen3.5-122B-A10B");
    std::fs::remove_dir_all(&model).unwrap();
    let mut repo = RepoSpec::synthetic("Qwen/Qwen3.5-122B-A10B", 2, 8 << 20);
    let config = repo
        .files
        .iter_mut()
        .find(|f| f.path == "config.json")
        .unwrap();
    *config = FileSpec::text(
        "config.json",
        r#"{"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}"#,
    );
    let hub = FakeHub::start(Config {
        listen: std::net::SocketAddr::new(l.g.bridge_ip(), 0),
        repos: vec![repo.clone()],
        hash_cache: None,
        ..Config::default()
    })
    .expect("the fake hub listens on the lab bridge");
    *l.hub.borrow_mut() = Some(hub.endpoint().to_string());
    let shards: Vec<&FileSpec> = repo
        .files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .collect();
    let small: u64 =
        repo.files.iter().map(|f| f.size).sum::<u64>() - shards.iter().map(|f| f.size).sum::<u64>();

    let err = l.apply_refused();
    assert!(model.join("config.json").is_file(), "{err}");
    for f in &shards {
        assert!(
            !model.join(&f.path).exists() && !model.join(format!("{}.part", f.path)).exists(),
            "{} was downloaded before the preflight refused the service:\n{err}",
            f.path
        );
    }
    let served = hub.stats().bytes_served;
    assert!(
        served <= small,
        "{served} bytes served, more than the {small} bytes of small files"
    );
    // The folder is not taken for the model: the pull is unfinished, and check says so.
    let (drift, _) = l.g.expect(&["check"], 2);
    assert!(drift.contains("an unfinished pull"), "{drift}");

    // Fixed: the weights come, then the unit, and the service serves the model.
    l.inventory(true, &[], "");
    let (out, err) = l.g.expect(&["apply", "--yes"], 0);
    assert!(err.contains("ready after"), "{out}\n{err}");
    assert!(l.serving());
    for f in &shards {
        let got = std::fs::read(model.join(&f.path)).unwrap();
        assert!(
            got == fakehub::bytes(&repo.id, &f.path, f.size),
            "{}",
            f.path
        );
    }
    l.g.expect(&["check"], 0);
}
