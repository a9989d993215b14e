//! The guest reconciler against a real LXC container (real systemd, real sshd, real apt,
//! pip and git): from bare to converged, a second apply with nothing to do, drift made by
//! hand found by `check` (exit 2) and fixed by `apply`, `check` changing nothing, a changed
//! host key refused, hostile values inert. Needs the lab (`scripts/test` brings it up).

use crate::cli_support::Provision;
use crate::guestlab;

use guestlab::{Deb, Guest, apt_repo, git_repo, host, wheel};

const NVCC: &str = "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n";
const VERSION_JSON: &str = "{\"cuda\": {\"name\": \"CUDA SDK\", \"version\": \"13.0.88\"}}\n";

/// The mirror for one guest: an APT repository with a stand-in CUDA toolkit package and a
/// small tool in two versions, and a wheelhouse with a package in two versions.
fn feed(g: &Guest) -> String {
    let line = apt_repo(
        &g.mirror_dir,
        &g.mirror_url,
        &[
            Deb {
                name: "cuda-toolkit-13-0",
                version: "13.0.88-1",
                files: &[
                    ("/usr/local/cuda-13.0/bin/nvcc", NVCC, 0o755),
                    ("/usr/local/cuda-13.0/version.json", VERSION_JSON, 0o644),
                ],
            },
            Deb {
                name: "provision-tool",
                version: "1.0",
                files: &[("/usr/bin/provision-tool", "#!/bin/sh\necho 1.0\n", 0o755)],
            },
            Deb {
                name: "provision-tool",
                version: "1.1",
                files: &[("/usr/bin/provision-tool", "#!/bin/sh\necho 1.1\n", 0o755)],
            },
        ],
    );
    wheel(&g.mirror_dir, "provision-probe", "1.0.0");
    wheel(&g.mirror_dir, "provision-probe", "2.0.0");
    // Air-gapped hosts get a wheelhouse on disk: put it into the container's root.
    host(&format!(
        "mkdir -p {0}/opt/wheels && cp {1}/wheels/*.whl {0}/opt/wheels/",
        g.ct.rootfs().display(),
        g.mirror_dir.display()
    ));
    line
}

/// A role of the user's own: a config file whose content and name are hostile to shells.
const APP_ROLE: &str = r#"description: A config file with content no shell may interpret.
resources:
  - kind: directory
    path: /etc/app
    mode: "0750"
  - kind: file
    path: "/etc/app/it's $(touch pwned); `id`.conf"
    content: "listen = 8080\n$(touch /tmp/pwned)\n`reboot`\n'quoted' \"double\" \\ ; rm -rf /\n"
    mode: "0640"
"#;

fn body(apt_line: &str, probe_version: &str) -> String {
    // The one-line source's URI (`deb [trusted=yes] URI ./`).
    let uri = apt_line.split_whitespace().nth(2).unwrap_or_default();
    format!(
        "        apt_sources:
          - {{ name: lab, line: \"{apt_line}\" }}
        packages: [provision-tool=1.0]
        roles: [cuda, ml-env, app]
        cuda:
          version: \"13.0\"
          # The stand-in toolkit is on the lab's mirror, not NVIDIA's repository.
          repository: {{ uri: \"{uri}\", suites: [\"./\"], trusted: true }}
        ml_env:
          path: /opt/ml-env
          python: \"3.11\"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
          packages: [provision-probe=={probe_version}]
          runtime_packages: []           # the lab mirror serves no compiler
          index: {{ wheelhouse: /opt/wheels }}
"
    )
}

/// A snapshot of what `check` must not touch: mtimes and content hashes of the managed
/// files, the dpkg database, the venv's packages.
fn fingerprint(g: &Guest) -> String {
    g.sh(
        "stat -c '%n %Y %s' /etc/app /etc/app/* /etc/profile.d/cuda.sh /etc/apt/sources.list.d/lab.list /opt/ml-env/pyvenv.cfg; \
         md5sum /var/lib/dpkg/status /etc/app/*; ls /opt/ml-env/lib/python3.11/site-packages | md5sum; \
         ls -la /var/lib/provision/bin | md5sum",
    )
}

#[test]
fn bare_to_converged_then_drift_found_and_fixed() {
    let g = Guest::new("converge");
    let line = feed(&g);
    g.role("app", APP_ROLE);
    g.inventory(&body(&line, "1.0.0"));

    // From bare: everything to create.
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(
        plan.contains("~ apt packages") && plan.contains("+ provision-tool    = 1.0"),
        "{plan}"
    );
    assert!(
        plan.contains("+ venv /opt/.provision-generations/ml-env-"),
        "{plan}"
    );
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");

    // Converged: what the inventory says is really there.
    assert_eq!(g.sh("provision-tool"), "1.0\n");
    assert!(
        g.sh(". /etc/profile.d/cuda.sh && nvcc --version")
            .contains("release 13.0")
    );
    assert_eq!(
        g.sh(
            "/opt/ml-env/bin/python -c 'import provision_probe; print(provision_probe.__version__)'"
        ),
        "1.0.0\n"
    );
    let hostile = g.sh("cat \"/etc/app/it's \\$(touch pwned); \\`id\\`.conf\"");
    assert!(
        hostile.contains("$(touch /tmp/pwned)") && hostile.contains("`reboot`"),
        "{hostile}"
    );
    assert_eq!(
        g.sh("ls /tmp/pwned /pwned /root/pwned /etc/app/pwned 2>/dev/null | wc -l"),
        "0\n"
    );
    assert_eq!(g.sh("stat -c %a /etc/app"), "750\n");

    // A second apply has nothing to do; check agrees and exits 0.
    let (out, _) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");
    g.expect(&["check"], 0);

    // check is read-only: nothing it could touch changed.
    let before = fingerprint(&g);
    g.expect(&["check"], 0);
    g.expect(&["plan"], 0);
    assert_eq!(before, fingerprint(&g), "check or plan changed the target");

    // Drift by hand: a file edited, a package removed, a venv package upgraded.
    g.sh("echo 'listen = 9090' > \"/etc/app/it's \\$(touch pwned); \\`id\\`.conf\"");
    g.sh("dpkg -r provision-tool >/dev/null");
    g.sh(
        "/opt/ml-env/bin/pip install -q --no-index --find-links /opt/wheels provision-probe==2.0.0",
    );
    let before = fingerprint(&g);
    let (drift, _) = g.expect(&["check"], 2);
    assert_eq!(before, fingerprint(&g), "check changed the drifted target");
    assert!(drift.contains("~ file /etc/app/it's"), "{drift}");
    assert!(drift.contains("-listen = 9090"), "{drift}");
    assert!(
        drift.contains("provision-tool = installed") || drift.contains("provision-tool = 1.0"),
        "{drift}"
    );
    assert!(
        drift.contains("provision-probe = 2.0.0 -> 1.0.0"),
        "{drift}"
    );
    g.expect(&["apply", "--yes"], 0);
    g.expect(&["check"], 0);
    assert_eq!(g.sh("provision-tool"), "1.0\n");

    // A pinned version change in the inventory is an upgrade in place.
    g.inventory(&body(&line, "2.0.0").replace("provision-tool=1.0", "provision-tool=1.1"));
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("provision-tool = 1.0 -> 1.1"), "{plan}");
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(g.sh("provision-tool"), "1.1\n");
    g.expect(&["check"], 0);
}

#[test]
fn git_checkout_pinned_and_moved_back() {
    let g = Guest::new("git");
    let trees = tempfile::tempdir().unwrap();
    let (a, b) = (trees.path().join("a"), trees.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("VERSION"), "one\n").unwrap();
    std::fs::write(b.join("VERSION"), "two\n").unwrap();
    let commits = git_repo(&g.mirror_dir, "tool", &[&a, &b]);
    g.role(
        "checkout",
        &format!(
            "description: A pinned checkout.\nresources:\n  - kind: git_checkout\n    repo: {}/git/tool.git\n    revision: {}\n    path: /opt/tool\n",
            g.mirror_url, commits[0]
        ),
    );
    g.inventory("        roles: [checkout]\n");
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(g.sh("cat /opt/tool/VERSION"), "one\n");
    g.expect(&["check"], 0);

    // Moved to another commit by hand: drift, and apply moves it back.
    g.sh(&format!("git -C /opt/tool checkout -q {}", commits[1]));
    let (drift, _) = g.expect(&["check"], 2);
    assert!(
        drift.contains(&format!("commit = {} -> {}", commits[1], commits[0])),
        "{drift}"
    );
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(g.sh("cat /opt/tool/VERSION"), "one\n");

    // Local edits are drift too, and are discarded (the plan says so).
    g.sh("echo edited > /opt/tool/VERSION");
    let (drift, _) = g.expect(&["check"], 2);
    assert!(
        drift.contains("local changes; they will be discarded"),
        "{drift}"
    );
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(g.sh("cat /opt/tool/VERSION"), "one\n");

    // An origin pointed elsewhere by hand is drift (the next fetch would come from there);
    // apply points it back.
    let repo = format!("{}/git/tool.git", g.mirror_url);
    g.sh("git -C /opt/tool remote set-url origin http://elsewhere.invalid/tool.git");
    let (drift, _) = g.expect(&["check"], 2);
    assert!(
        drift.contains(&format!(
            "origin = http://elsewhere.invalid/tool.git -> {repo}"
        )),
        "{drift}"
    );
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(
        g.sh("git -C /opt/tool config --get remote.origin.url"),
        format!("{repo}\n")
    );
    g.expect(&["check"], 0);
}

#[test]
fn host_keys_unknown_then_accepted_then_changed_is_refused() {
    let g = Guest::new("hostkey");
    g.inventory("        packages: [openssh-server]\n");
    // Strict by default: an unknown key is refused with its fingerprint and the flag.
    let inventory = g.dir.path().join("inventory.yaml");
    let known_hosts = g.dir.path().join("strict_known_hosts");
    let out = Provision::new(["check", "--target", "guest.t"])
        .known_hosts(&known_hosts, false)
        .arg(&inventory)
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not known") && err.contains("SHA256:"),
        "{err}"
    );
    assert!(err.contains("--accept-new-host-keys"), "{err}");

    // Accepted once (the helper passes --accept-new-host-keys), then the key changes.
    g.expect(&["check"], 0);
    g.sh("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && systemctl restart ssh");
    let (_, err) = g.expect(&["check"], 1);
    assert!(err.contains("changed"), "{err}");
    assert!(err.contains("ssh-keygen"), "{err}");
}

#[test]
fn two_provision_versions_alternating_checks_keep_each_others_agent() {
    let g = Guest::new("twover");
    g.inventory("        packages: [openssh-server]\n");
    // Another version: the same program with other bytes, hence another sha256.
    let other = g.dir.path().join("provision-other");
    let mut bytes = std::fs::read(env!("CARGO_BIN_EXE_provision")).unwrap();
    bytes.extend_from_slice(b"\0another provision version\0");
    std::fs::write(&other, bytes).unwrap();
    let other = other.to_str().unwrap().to_string();
    let check_other = || {
        let out = g.provision_env(&["check"], &[("PROVISION_AGENT_BINARY", &other)]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    g.expect(&["check"], 0);
    check_other();
    let cache = || g.sh("stat -c '%n %i %s %Y' /var/lib/provision/bin/* | sort");
    let target = || {
        g.sh(
            "find / -xdev -path /proc -prune -o -path /var/lib/provision/bin -prune -o \
              -path /run -prune -o -path /tmp -prune -o -path /var/log -prune -o \
              -path /var/lib/systemd -prune -o -path /var/cache -prune -o \
              -newermt '-1 hour' -printf '%p %s %T@\\n' | sort | md5sum",
        )
    };
    let (both, rest) = (cache(), target());
    assert_eq!(both.lines().count(), 2, "{both}");
    for _ in 0..2 {
        g.expect(&["check"], 0);
        check_other();
        assert_eq!(
            cache(),
            both,
            "a check removed or replaced another version's agent"
        );
    }
    assert_eq!(
        target(),
        rest,
        "checks changed the target outside the agent cache"
    );
}

#[test]
fn a_saved_plan_is_applied_exactly_and_refused_when_stale() {
    let g = Guest::new("saved");
    g.role("app", APP_ROLE);
    g.inventory("        roles: [app]\n");
    let plan_file = g.dir.path().join("app.plan.json");
    let plan_arg = plan_file.to_str().unwrap();
    let apply_saved = |extra: &[&str]| g.apply_saved(&plan_file, extra);

    // Saved, then applied exactly: one JSON document says what was planned and done.
    g.expect(&["plan", "--out", plan_arg], 0);
    assert!(
        !g.sh("ls /etc").contains("app\n"),
        "plan wrote to the target"
    );
    let (code, out, err) = apply_saved(&["--json"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(doc["applied"], true);
    assert_eq!(doc["plan"]["summary"]["create"], 2, "{doc:#}");
    // The two writes, between the two writes of the record of what provision manages.
    assert_eq!(doc["targets"][0]["steps"].as_array().unwrap().len(), 4);
    assert_eq!(g.sh("stat -c %a /etc/app"), "750\n");
    g.expect(&["check"], 0);

    // Planned against drift, then the target changes before apply: refused, untouched.
    let conf = "\"/etc/app/it's \\$(touch pwned); \\`id\\`.conf\"";
    g.sh(&format!("echo one > {conf}"));
    g.expect(&["plan", "--out", plan_arg], 0);
    g.sh(&format!("echo two > {conf}"));
    let (code, out, err) = apply_saved(&[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("the saved plan is stale; nothing was changed"),
        "{err}"
    );
    assert!(err.contains("changed since the plan was made"), "{err}");
    assert_eq!(g.sh(&format!("cat {conf}")), "two\n");

    // A fresh plan of the same drift applies.
    g.expect(&["plan", "--out", plan_arg], 0);
    let (code, out, err) = apply_saved(&[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("Apply complete"), "{out}");
    g.expect(&["check"], 0);
}
