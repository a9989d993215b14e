//! The ml-env built by uv on a real lab container: uv's real static binary from PyPI (the
//! pinned wheel `scripts/test-deps` caches in /var/cache/provision-tests/uv) pushed from the
//! workstation, the venv made by `uv venv`, local-version wheels pinned as `==1.0` from an
//! offline wheelhouse and a find-links folder, and the SGLang stand-in (tests/support/
//! sglang-standin: NOT SGLang) installed editable from its git checkout, its build backend
//! from the wheelhouse; then the import check. A second apply has nothing to do; uv removed
//! from the target is drift that apply pushes again. Without `installer` the ml-env is uv's
//! whether or not the workstation's cache holds the wheel; `installer: pip` plans no uv.
//! Needs the lab (`scripts/test` brings it up).

use crate::guestlab;

use std::path::Path;

use guestlab::{Guest, build_backends, git_repo, host, wheel};

/// Where `scripts/test-deps` caches the pinned uv wheel.
const CACHE: &str = "/var/cache/provision-tests";

fn uv_cache() -> &'static str {
    assert!(
        Path::new(CACHE).join("uv").is_dir(),
        "{CACHE}/uv is missing: run scripts/test-deps (it downloads uv's wheel from PyPI once)"
    );
    CACHE
}

fn expect(g: &Guest, args: &[&str], cache: &str, code: i32) -> (String, String) {
    let out = g.provision_env(args, &[("PROVISION_CACHE_DIR", cache)]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "provision {args:?} exited {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status.code()
    );
    (stdout, stderr)
}

fn inventory(g: &Guest, installer: &str, commit: &str) {
    g.inventory(&format!(
        "        roles: [ml-env]
        ml_env:
          path: /opt/ml-env
          python: \"3.11\"
{installer}          packages: [demo-pkg==1.0, demo-kernel==1.0]
          runtime_packages: []           # the lab mirror serves no compiler
          index: {{ wheelhouse: /opt/wheels, find_links: [/opt/kernels] }}
          imports: [demo_pkg, demo_kernel, sglang.srt.server_args]
          sglang:
            repo: {mirror}/git/sglang.git
            revision: {commit}
            path: /root/sglang-main
",
        mirror = g.mirror_url,
    ));
}

#[test]
fn uv_builds_the_ml_env_offline_with_sglang_editable_and_checks_clean() {
    let cache = uv_cache();
    let g = Guest::new("uv");
    wheel(&g.mirror_dir, "demo-pkg", "1.0+cu130");
    build_backends(&g.mirror_dir);
    let kernels = tempfile::tempdir().unwrap();
    wheel(kernels.path(), "demo-kernel", "1.0+cu130");
    let tree = tempfile::tempdir().unwrap();
    let standin = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/sglang-standin");
    host(&format!(
        "mkdir -p {0}/python && cp -a {standin}/pyproject.toml {standin}/src {0}/python/",
        tree.path().display()
    ));
    let commit = git_repo(&g.mirror_dir, "sglang", &[tree.path()]).remove(0);
    let root = g.ct.rootfs();
    host(&format!(
        "mkdir -p {0}/opt/wheels {0}/opt/kernels && cp {1}/wheels/*.whl {0}/opt/wheels/ && cp {2}/wheels/*.whl {0}/opt/kernels/",
        root.display(),
        g.mirror_dir.display(),
        kernels.path().display()
    ));

    // No `installer`: uv, with or without the wheel in the workstation's cache (apply
    // fetches it where it is missing), so both plan the same.
    let empty = tempfile::tempdir().unwrap();
    inventory(&g, "", &commit);
    let (plan, _) = expect(&g, &["plan", "--detailed-exitcode"], cache, 2);
    assert!(
        plan.contains("+ uv /var/lib/provision/tools/uv-0.13.9-"),
        "{plan}"
    );
    let (uncached, _) = expect(
        &g,
        &["plan", "--detailed-exitcode"],
        &empty.path().display().to_string(),
        2,
    );
    assert_eq!(uncached, plan);
    // `installer: pip`: no uv.
    inventory(&g, "          installer: pip\n", &commit);
    let (plan, _) = expect(&g, &["plan", "--detailed-exitcode"], cache, 2);
    assert!(!plan.contains("+ uv "), "{plan}");

    inventory(&g, "          installer: uv\n", &commit);
    let (out, err) = expect(&g, &["apply", "--yes"], cache, 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    assert!(
        // Built beside, at its generation's own folder (the stable path links to it).
        err.contains("uv venv --python python3.11 /opt/.provision-generations/ml-env-"),
        "{err}"
    );
    assert!(
        err.contains("uv pip install -e /root/.provision-generations/sglang-main-"),
        "{err}"
    );
    // uv made the venv (it has no pip) and took the local builds for `==1.0`.
    let cfg = g.sh("cat /opt/ml-env/pyvenv.cfg");
    assert!(cfg.contains("uv = 0.13.9"), "{cfg}");
    // In the container: /opt/ml-env is a symlink whose target is a path inside it.
    assert_eq!(
        g.sh("test -e /opt/ml-env/bin/pip && echo pip || echo none")
            .trim(),
        "none"
    );
    let version = |m: &str| {
        g.sh(&format!(
            "/opt/ml-env/bin/python -c 'import {m}; print({m}.__version__)'"
        ))
        .trim()
        .to_string()
    };
    assert_eq!(version("demo_pkg"), "1.0+cu130");
    assert_eq!(version("demo_kernel"), "1.0+cu130");
    let file = g.sh("/opt/ml-env/bin/python -c 'import sglang; print(sglang.__file__)'");
    let checkout = g.sh("readlink -f /root/sglang-main");
    assert!(
        file.trim()
            .starts_with(&format!("{}/python/", checkout.trim())),
        "editable, from the checkout /root/sglang-main links to ({checkout}): {file}"
    );

    expect(&g, &["check"], cache, 0);
    let (out, _) = expect(&g, &["apply", "--yes"], cache, 0);
    assert!(out.contains("No changes"), "{out}");

    // uv gone from the target: drift, and apply pushes it again.
    let uv = g.sh("ls /var/lib/provision/tools/uv-0.13.9-*/uv");
    g.sh(&format!("rm {}", uv.trim()));
    let (drift, _) = expect(&g, &["check"], cache, 2);
    assert!(
        drift.contains("+ uv /var/lib/provision/tools/uv-0.13.9-"),
        "{drift}"
    );
    expect(&g, &["apply", "--yes"], cache, 0);
    assert!(
        g.sh(&format!("{} --version", uv.trim()))
            .contains("uv 0.13.9")
    );
    expect(&g, &["check"], cache, 0);
}
