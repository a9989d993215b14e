//! Pip versions compared as pip compares them (PEP 440), on a real lab container: wheels with
//! local version labels (`demo-pkg 1.0+cu130`, as PyTorch's CUDA index serves `torch`) pinned
//! as `demo-pkg==1.0`, and a range, installed from a wheelhouse on the target and from a
//! PEP 503 simple index on the lab mirror. The first apply exits 0, `check` exits 0, a second
//! apply has nothing to do; a version moved out of its range by hand is drift that apply
//! brings back. Needs the lab (`scripts/test` brings it up).

use crate::guestlab;

use guestlab::{Guest, host, wheel};

/// The wheels both tests install: a local-version build of a pinned package, and a range's
/// candidates (the newest inside the range has a local label too).
fn build_wheels(g: &Guest) {
    wheel(&g.mirror_dir, "demo-pkg", "1.0+cu130");
    wheel(&g.mirror_dir, "demo-range", "2.1+cu130");
    wheel(&g.mirror_dir, "demo-range", "3.0");
}

/// Where pip looks, as the inventory's `index:` and as a `pip_packages` resource's keys.
struct Source {
    inventory: String,
    resource: String,
}

/// The wheelhouse copied into the container's root, as air-gapped hosts have it.
fn wheelhouse(g: &Guest) -> Source {
    host(&format!(
        "mkdir -p {0}/opt/wheels && cp {1}/wheels/*.whl {0}/opt/wheels/",
        g.ct.rootfs().display(),
        g.mirror_dir.display()
    ));
    Source {
        inventory: "{ wheelhouse: /opt/wheels }".into(),
        resource: "    wheelhouse: /opt/wheels\n".into(),
    }
}

/// A PEP 503 simple index on the lab mirror: one folder per normalised project name whose
/// listing links its wheels (the mirror lists folders as HTML links, which is all PEP 503
/// asks of a project page).
fn simple_index(g: &Guest) -> Source {
    for project in ["demo-pkg", "demo-range"] {
        host(&format!(
            "mkdir -p {0}/simple/{project} && cp {0}/wheels/{1}-*.whl {0}/simple/{project}/",
            g.mirror_dir.display(),
            project.replace('-', "_")
        ));
    }
    let url = format!("{}/simple/", g.mirror_url);
    Source {
        inventory: format!("{{ url: \"{url}\" }}"),
        resource: format!("    index_url: \"{url}\"\n"),
    }
}

/// A role of the user's own: pip's trust in the (plain HTTP) lab mirror, and a second venv
/// whose package is a range rather than a pin.
fn range_role(g: &Guest, source: &Source) -> String {
    let mirror_host = g
        .mirror_url
        .trim_start_matches("http://")
        .split([':', '/'])
        .next()
        .unwrap()
        .to_string();
    format!(
        "description: A venv with a range of versions.
resources:
  - kind: file
    path: /etc/pip.conf
    content: \"[global]\\ntrusted-host = {mirror_host}\\n\"
  - kind: venv
    path: /opt/range-env
    python: \"3.11\"
  - kind: pip_packages
    venv: /opt/range-env
    packages: [\"demo-range>=2.0,<3\"]
{}",
        source.resource
    )
}

fn installed(g: &Guest, venv: &str, module: &str) -> String {
    g.sh(&format!(
        "{venv}/bin/python -c 'import {module}; print({module}.__version__)'"
    ))
    .trim()
    .to_string()
}

/// The whole story for one source: converge, nothing left to do, drift by hand, repaired.
fn local_versions_converge(name: &str, source_of: fn(&Guest) -> Source) {
    let g = Guest::new(name);
    build_wheels(&g);
    let source = source_of(&g);
    g.role("ranged", &range_role(&g, &source));
    g.inventory(&format!(
        "        roles: [ranged, ml-env]
        ml_env:
          path: /opt/ml-env
          python: \"3.11\"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
          packages: [demo-pkg==1.0]
          runtime_packages: []           # the lab mirror serves no compiler
          index: {}
",
        source.inventory
    ));

    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("demo-pkg"), "{plan}");
    assert!(plan.contains("demo-range"), "{plan}");
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    // pip took the local builds: `==1.0` is satisfied by `1.0+cu130`.
    assert_eq!(installed(&g, "/opt/ml-env", "demo_pkg"), "1.0+cu130");
    assert_eq!(installed(&g, "/opt/range-env", "demo_range"), "2.1+cu130");

    g.expect(&["check"], 0);
    g.expect(&["plan", "--detailed-exitcode"], 0);
    let (out, _) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("No changes"), "{out}");

    // Out of its range by hand: drift, named with the range, and apply brings it back.
    host(&format!(
        "cp {}/wheels/demo_range-3.0-py3-none-any.whl {}/tmp/",
        g.mirror_dir.display(),
        g.ct.rootfs().display()
    ));
    g.sh("/opt/range-env/bin/pip install -q --no-index /tmp/demo_range-3.0-py3-none-any.whl");
    assert_eq!(installed(&g, "/opt/range-env", "demo_range"), "3.0");
    let (drift, _) = g.expect(&["check"], 2);
    assert!(drift.contains("demo-range = 3.0 -> >=2.0, <3"), "{drift}");
    g.expect(&["apply", "--yes"], 0);
    assert_eq!(installed(&g, "/opt/range-env", "demo_range"), "2.1+cu130");
    g.expect(&["check"], 0);
}

#[test]
fn local_versions_from_a_wheelhouse_apply_once_and_check_clean() {
    local_versions_converge("pip-wheelhouse", wheelhouse);
}

#[test]
fn local_versions_from_a_simple_index_apply_once_and_check_clean() {
    local_versions_converge("pip-index", simple_index);
}

/// The stand-in CUDA wheels (tests/support/cuda-wheels) on the lab mirror: a CUDA 13 runtime
/// and PyPI's CUDA 12 kernel in the wheelhouse (copied into the container), the `+cu130`
/// kernel on a find-links page (the mirror's directory listing).
fn cuda_wheels(g: &Guest) {
    host(&format!(
        "python3 {}/tests/support/cuda-wheels/make_wheels.py {}/cuda >/dev/null && mkdir -p {}/opt/wheels && cp {1}/cuda/wheelhouse/*.whl {2}/opt/wheels/",
        env!("CARGO_MANIFEST_DIR"),
        g.mirror_dir.display(),
        g.ct.rootfs().display()
    ));
    // The lab mirror is plain HTTP (SGLang's page is HTTPS): pip trusts it only when told.
    let (ip, _) = g.lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
    g.sh(&format!(
        "printf '[global]\\ntrusted-host = {ip}\\n' > /etc/pip.conf"
    ));
}

fn kernel_inventory(g: &Guest, kernel: &str, find_links: &str) {
    g.inventory(&format!(
        "        roles: [ml-env]
        ml_env:
          path: /opt/ml-env
          python: \"3.11\"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
          packages: [lab-cuda-runtime==13.0, {kernel}]
          runtime_packages: []           # the lab mirror serves no compiler
          index: {{ wheelhouse: /opt/wheels, find_links: [{find_links}] }}
          imports: [labkernel]
"
    ));
}

#[test]
fn a_kernel_built_for_cuda_12_fails_the_import_check_naming_its_library() {
    let g = Guest::new("pip-kernel");
    cuda_wheels(&g);
    let page = format!("{}/cuda/kernels-cu130/", g.mirror_url);
    // Without the find-links page, as the editable install resolves it from PyPI: the
    // CUDA 12 build. (With the page, pip takes `1.0+cu130` for `==1.0` too: the higher.)
    kernel_inventory(&g, "labkernel==1.0", "");
    let (plan, _) = g.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(
        plan.contains("+ import_check /opt/.provision-generations/ml-env-"),
        "{plan}"
    );
    let (out, err) = g.expect(&["apply", "--yes"], 1);
    let text = format!("{out}{err}");
    assert!(
        text.contains("`import labkernel` fails in /opt/.provision-generations/ml-env-")
            && text.contains(": ImportError: libcudart.so.12: cannot open shared object file"),
        "{text}"
    );
    assert!(
        text.contains("+cu130"),
        "the hint names the CUDA 13 build: {text}"
    );
    // Not passed: the next plan runs it again.
    g.expect(&["check"], 2);
    // The CUDA 13 build, pinned from the find-links page.
    kernel_inventory(&g, "labkernel==1.0+cu130", &page);
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    assert_eq!(installed(&g, "/opt/ml-env", "labkernel"), "1.0+cu130");
    g.expect(&["check"], 0);
    // A package changed by hand in the venv: checked again.
    g.sh("/opt/ml-env/bin/pip install -q --no-index /opt/wheels/labkernel-1.0-py3-none-linux_x86_64.whl");
    let (drift, _) = g.expect(&["check"], 2);
    assert!(
        drift.contains("import_check /opt/.provision-generations/ml-env-"),
        "{drift}"
    );
}

/// The toolchain's packages (`scripts/lab-deps`: build-essential, python3.11-dev, libnuma1
/// and what the template lacks of their dependencies) as a flat repository on the mirror;
/// the sources line.
fn toolchain_repo(g: &Guest) -> String {
    let debs = std::path::Path::new("/var/cache/provision-lab/debs-toolchain");
    assert!(
        debs.is_dir(),
        "{} is missing: run scripts/lab-deps",
        debs.display()
    );
    host(&format!(
        "mkdir -p {0}/apt && cp {1}/*.deb {0}/apt/ && cd {0}/apt && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null",
        g.mirror_dir.display(),
        debs.display()
    ));
    format!("deb [trusted=yes] {}/apt ./", g.mirror_url)
}

fn toolchain_inventory(g: &Guest, source: &str, runtime: &str) {
    g.inventory(&format!(
        "        apt_sources:
          - {{ name: lab, line: \"{source}\" }}
        roles: [ml-env]
        ml_env:
          path: /opt/ml-env
          python: \"3.11\"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
{runtime}          index: {{ wheelhouse: /opt/wheels }}
          imports: [json]
"
    ));
}

#[test]
fn the_import_check_compiles_against_python_h_once_the_role_installs_the_toolchain() {
    let g = Guest::new("pip-cc");
    let source = toolchain_repo(&g);
    g.sh("mkdir -p /opt/wheels");
    // The lab template has no compiler and no Python.h: with only libnuma1 the C helper
    // cannot be built, as Triton's could not.
    toolchain_inventory(&g, &source, "          runtime_packages: [libnuma1]\n");
    let (out, err) = g.expect(&["apply", "--yes"], 1);
    let text = format!("{out}{err}");
    assert!(
        text.contains(
            "compiling a C helper against Python.h in /opt/.provision-generations/ml-env-"
        ) && text.contains("fails: no C compiler"),
        "{text}"
    );
    // The role's default run-time packages: build-essential, python3.11-dev, libnuma1.
    toolchain_inventory(&g, &source, "");
    let (plan, _) = g.expect(&["plan"], 0);
    assert!(plan.contains("+ build-essential"), "{plan}");
    assert!(plan.contains("+ python3.11-dev"), "{plan}");
    let (out, err) = g.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}\n{err}");
    assert!(
        err.contains("import json in /opt/.provision-generations/ml-env-")
            && err.contains("and compile a C helper against Python.h"),
        "{err}"
    );
    g.expect(&["check"], 0);
}
