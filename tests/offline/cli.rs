//! The command line as a user meets it: exit codes, error text for a corpus of bad
//! inventories (snapshotted), the offline plan and the rendered unit of llm-two.

use std::path::Path;

use assert_cmd::Command;

use crate::cli_support::{Provision, Ran};

/// provision in the repository's root, without the tokens of the machine running the tests.
fn provision() -> Command {
    Command::from_std(
        Provision::new::<&str>([])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("PVE_TOKEN")
            .env_remove("HF_TOKEN")
            .command(),
    )
}

fn run(args: &[&str]) -> Ran {
    Ran::from(provision().args(args).output().unwrap())
}

#[test]
fn validate_llm_two() {
    let r = run(&["validate", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("is valid: 1 node(s), 1 container(s)"),
        "{}",
        r.stdout
    );
}

#[test]
fn validate_examples() {
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")).unwrap()
    {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let rel = format!("examples/{}", path.file_name().unwrap().to_string_lossy());
            // examples/lab.yaml takes the lab's exports from the environment.
            let out = provision()
                .args(["validate", &rel])
                .envs(lab_example_env())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{rel}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Sample values of the variables examples/lab.yaml reads (tests/fixtures/lab-example.env).
pub fn lab_example_env() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lab-example.env");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Each bad inventory: exit 1, a clear error pointing into the file, never a panic.
#[test]
fn bad_inventories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 10, "the corpus shrank: {names:?}");
    for name in names {
        let rel = format!("tests/fixtures/bad/{name}");
        let r = run(&["validate", &rel]);
        assert_eq!(r.code, 1, "{rel} should fail with 1: {}", r.stderr);
        assert!(
            !r.stderr.contains("panicked"),
            "{rel} panicked: {}",
            r.stderr
        );
        assert!(r.stderr.starts_with("error: "), "{rel}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{rel} printed a result: {}", r.stdout);
        assert!(
            r.stderr.contains(&format!("{rel}:")),
            "{rel}: no file:line:col in {}",
            r.stderr
        );
        // The same file fails the same way in every command that reads it.
        let p = run(&["plan", "--offline", &rel]);
        assert_eq!(
            (p.code, &p.stderr),
            (1, &r.stderr),
            "{rel}: plan differs from validate"
        );
        insta::assert_snapshot!(format!("bad__{}", name.replace('.', "_")), r.stderr);
    }
}

#[test]
fn inline_token_is_never_printed() {
    let r = run(&["validate", "tests/fixtures/bad/inline-token.yaml"]);
    assert!(!r.stderr.contains("secret-value"), "{}", r.stderr);
    let r = run(&[
        "plan",
        "--offline",
        "--json",
        "tests/fixtures/bad/inline-token.yaml",
    ]);
    assert!(!r.stderr.contains("secret-value") && !r.stdout.contains("secret-value"));
}

#[test]
fn missing_file() {
    let r = run(&["validate", "inventory/nope.yaml"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("error: cannot read inventory/nope.yaml"),
        "{}",
        r.stderr
    );
}

#[test]
fn offline_plan_of_llm_two() {
    let r = run(&["plan", "--offline", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    insta::assert_snapshot!("plan_offline_llm_two", r.stdout);
    let r = run(&[
        "plan",
        "--offline",
        "--detailed-exitcode",
        "inventory/llm-two.yaml",
    ]);
    assert_eq!(
        r.code, 2,
        "changes pending must exit 2 with --detailed-exitcode"
    );
}

#[test]
fn the_default_installer_is_uv_whatever_the_workstation_has_cached() {
    // Two workstations, one with uv's wheel in its cache and one without: the same plan,
    // uv in both (the wheel is fetched at apply where it is missing). When the default
    // followed the cache, the empty one planned pip and another generation.
    let empty = tempfile::tempdir().unwrap();
    let cached = tempfile::tempdir().unwrap();
    let wheel = cached
        .path()
        .join("uv")
        .join(provision::resources::uv::WHEEL);
    std::fs::create_dir_all(wheel.parent().unwrap()).unwrap();
    std::fs::write(&wheel, b"a wheel the plan does not read").unwrap();
    let plan = |cache: &Path| {
        let out = provision()
            .env("PROVISION_CACHE_DIR", cache)
            .args(["plan", "--offline", "inventory/llm-two.yaml"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let without = plan(empty.path());
    assert!(
        without.contains("+ uv /var/lib/provision/tools/uv-0.13.9-"),
        "{without}"
    );
    assert_eq!(without, plan(cached.path()));
}

#[test]
fn offline_plan_json_is_stable_and_complete() {
    let r = run(&["plan", "--offline", "--json", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(plan["format_version"], provision::plan::FORMAT_VERSION);
    assert_eq!(plan["mode"], "offline");
    // The JSON round-trips into the plan type apply executes.
    let typed: provision::plan::Plan = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(typed.summary.create, 19);
    insta::assert_json_snapshot!("plan_offline_llm_two_json", plan);
}

#[test]
fn an_unreachable_node_is_an_error_naming_node_and_call() {
    // Loopback addresses and a closed port only: this must never reach a real host.
    for args in [
        &["plan", "tests/fixtures/loopback.yaml"][..],
        &["check", "tests/fixtures/loopback.yaml"][..],
        &["apply", "--yes", "tests/fixtures/loopback.yaml"][..],
    ] {
        let out = provision()
            .args(args)
            .env("PVE_TOKEN", "root@pam!ci=not-a-real-token")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("GET /version on node `homelab`: no answer"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("not-a-real-token"), "{stderr}");
    }
    let out = provision()
        .args(["check", "tests/fixtures/loopback.yaml"])
        .env_remove("PVE_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("environment variable `PVE_TOKEN` is not set"),
        "{stderr}"
    );
}

#[test]
fn schema_is_json_schema_of_the_inventory() {
    let r = run(&["schema"]);
    assert_eq!(r.code, 0);
    let schema: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(schema["title"], "Inventory");
    assert!(schema["properties"]["nodes"].is_object());
    let service = &schema["$defs"]["Service"]["properties"];
    assert!(
        service["served_model_name"]["description"]
            .as_str()
            .unwrap()
            .contains("/v1/models")
    );
    assert_eq!(schema["$defs"]["Service"]["additionalProperties"], false);
}

#[test]
fn render_writes_one_file_per_target_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let r = run(&["render", "inventory/llm-two.yaml", "--out", out]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let unit = std::fs::read_to_string(
        dir.path()
            .join("guest/llm-two/etc/systemd/system/sglang-qwen.service"),
    )
    .unwrap();
    insta::assert_snapshot!("sglang_qwen_unit", unit);
    for f in [
        "guest/llm-two/etc/profile.d/cuda.sh",
        "node/pve/etc/pve/lxc/129.conf.d/gpu-passthrough.conf",
        "node/pve/etc/pve/lxc/129.conf.d/root-only.conf",
    ] {
        assert!(
            dir.path().join(f).is_file(),
            "{f} missing; printed: {}",
            r.stdout
        );
    }
    assert_eq!(r.stdout.lines().count(), 4, "{}", r.stdout);
}

#[test]
fn color_only_when_asked_or_on_a_terminal() {
    let r = run(&["plan", "--offline", "inventory/llm-two.yaml"]);
    assert!(!r.stdout.contains('\u{1b}'), "no colour when piped");
    let out = provision()
        .args([
            "--color",
            "always",
            "plan",
            "--offline",
            "inventory/llm-two.yaml",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains('\u{1b}'));
}

#[test]
fn quiet_keeps_results_and_errors() {
    let r = run(&["-q", "validate", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("is valid"));
    let r = run(&["-q", "validate", "tests/fixtures/bad/empty.yaml"]);
    assert!(r.stderr.contains("error:"));
}

/// Editors read docs/inventory.schema.json (the inventories' `$schema` comment): it must be
/// what `provision schema` prints today.
#[test]
fn committed_schema_is_current() {
    let r = run(&["schema"]);
    let committed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/inventory.schema.json"),
    )
    .unwrap();
    assert!(
        committed == r.stdout,
        "docs/inventory.schema.json is stale: run `cargo run -q -- schema > docs/inventory.schema.json`"
    );
}

#[test]
fn usage_errors_exit_1_not_2() {
    // 2 means drift to CI scripts; a typo on the command line must not look like drift.
    let r = run(&["check", "--no-such-flag", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("--no-such-flag"), "{}", r.stderr);
    assert_eq!(run(&["--help"]).code, 0);
    assert_eq!(run(&["--version"]).code, 0);
}

#[test]
fn unreachable_guest_is_an_error_never_a_plan() {
    // A read that fails must never plan a create: exit 1 with the reason.
    let r = run(&[
        "check",
        "--target",
        "guest.tools",
        "tests/fixtures/loopback.yaml",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("127.0.0.1:1"), "{}", r.stderr);
    assert!(!r.stdout.contains("to add"), "{}", r.stdout);
    let r = run(&["check", "--target", "nope", "tests/fixtures/loopback.yaml"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("no target `nope`") && r.stderr.contains("guest.tools"),
        "{}",
        r.stderr
    );
}

#[test]
fn saved_plans_are_checked_before_anything_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    let path = file.to_str().unwrap();
    // An offline plan assumed an empty world: applying it would act on a guess.
    let r = run(&[
        "plan",
        "--offline",
        "--json",
        "--target",
        "guest.tools",
        "tests/fixtures/loopback.yaml",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    std::fs::write(&file, &r.stdout).unwrap();
    let r = run(&["apply", "--yes", path]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("made with --offline"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("127.0.0.1:1"),
        "nothing was reached: {}",
        r.stderr
    );
    // Saved plans are applied whole.
    let r = run(&["apply", "--yes", "--target", "guest.tools", path]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("applied whole"), "{}", r.stderr);
    // Another format version is refused by name.
    let text = r#"{"format_version": 99, "inventory": "x", "mode": "online", "targets": [], "summary": {}}"#;
    std::fs::write(&file, text).unwrap();
    let r = run(&["apply", "--yes", path]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("a plan in format 99"), "{}", r.stderr);
    assert!(
        r.stderr.contains("made by a newer provision"),
        "{}",
        r.stderr
    );
    // Format 1 kept no positions: refused, not applied without them.
    std::fs::write(&file, text.replace("99", "1")).unwrap();
    let r = run(&["apply", "--yes", path]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains(&format!(
            "is a plan in format 1; this provision reads format {}",
            provision::plan::FORMAT_VERSION
        )) && r.stderr.contains("make the plan again with this provision"),
        "{}",
        r.stderr
    );
    // Format 3 had no `replanned`: a guest planned again (its container replaced) would be
    // shown as if its changes were what was read. Refused by name, as a person reads it.
    std::fs::write(&file, text.replace("99", "3")).unwrap();
    let r = run(&["apply", "--yes", path]);
    assert_eq!(r.code, 1);
    insta::with_settings!({filters => vec![(r"/\S*/plan\.json", "[PLAN]")]}, {
        insta::assert_snapshot!("apply_refuses_a_format_3_plan", r.stderr);
    });
    // Format 3 lacked the typed deltas apply now acts on (a model storage conflict, an APT
    // key to write, the node's NVIDIA steps): refused by name too.
    std::fs::write(&file, text.replace("99", "3")).unwrap();
    let r = run(&["apply", "--yes", path]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains(&format!(
            "is a plan in format 3; this provision reads format {}",
            provision::plan::FORMAT_VERSION
        )),
        "{}",
        r.stderr
    );
    // --out needs a plan that read the targets.
    let r = run(&[
        "plan",
        "--offline",
        "--out",
        path,
        "tests/fixtures/loopback.yaml",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
}

#[test]
fn a_requirement_that_cannot_be_checked_is_refused_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cpu-only.yaml"),
    )
    .unwrap()
    .replace("roles: [ml-env]", "roles: [ml-env, extra]");
    std::fs::write(
        dir.path().join("inventory.yaml"),
        format!("paths: {{ roles: roles }}\n{inventory}"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("roles")).unwrap();
    std::fs::write(
        dir.path().join("roles/extra.yaml"),
        "description: A wheel by URL.\nresources:\n  - kind: pip_packages\n    venv: /opt/venv\n    packages: [\"x @ https://example.invalid/x.whl\"]\n",
    )
    .unwrap();
    let path = dir.path().join("inventory.yaml");
    let r = run(&["plan", "--offline", path.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("extra.yaml:3:"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("a URL cannot be compared with what is installed"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("hint:"), "{}", r.stderr);
}

/// llm-two with the user's own `sglang` role and unit template beside it.
fn with_own_role(role: &str, template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let inventory = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("inventory/llm-two.yaml"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("inventory.yaml"),
        format!("paths: {{ roles: roles, templates: templates }}\n{inventory}"),
    )
    .unwrap();
    for (sub, name, text) in [
        ("roles", "sglang.yaml", role),
        ("templates", "my-sglang.service.hbs", template),
    ] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        std::fs::write(dir.path().join(sub).join(name), text).unwrap();
    }
    dir
}

/// A user's role takes the inventory's service as provision built it (`of:`) and renders
/// the unit file, and each fallback's, from a template of its own.
#[test]
fn a_users_own_role_takes_the_built_service() {
    let role = r#"description: The user's own SGLang role.
requires: [services]
for_each: service
resources:
  - kind: file
    path: "{{service.unit_path}}"
    template: my-sglang.service.hbs
  - kind: service
    of: "{{service.name}}"
    unit_template: my-sglang.service.hbs
"#;
    let template = "[Service]\nUser={{service.user}}\n{{#each service.environment}}\nEnvironment={{systemd_env name value}}\n{{/each}}\nExecStart={{systemd_exec service.exec_start}}\n";
    let dir = with_own_role(role, template);
    let inventory = dir.path().join("inventory.yaml");
    let r = run(&["plan", "--offline", "--json", inventory.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    // The container's guest: the target after the node's and the container's own.
    let guest = plan["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"]["kind"] == "guest")
        .unwrap();
    let changes = guest["changes"].as_array().unwrap();
    let find = |address: &str| {
        changes
            .iter()
            .find(|c| c["address"].as_str().unwrap().ends_with(address))
            .unwrap_or_else(|| panic!("no {address} in {changes:?}"))
    };
    let unit = find("file:/etc/systemd/system/sglang-qwen.service")["spec"]["content"]
        .as_str()
        .unwrap();
    assert!(
        unit.starts_with("[Service]\nUser=root\nEnvironment=CUDA_HOME=/usr/local/cuda-13.0\n"),
        "{unit}"
    );
    assert!(
        unit.contains("ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server --model-path /shared/models/Qwen3.5-122B-A10B --served-model-name qwen3.5-122b"),
        "{unit}"
    );
    let service = &find("service:sglang-qwen.service")["spec"];
    assert_eq!(service["readiness"]["served_model_name"], "qwen3.5-122b");
    let fallback = service["fallbacks"][0]["content"].as_str().unwrap();
    assert!(fallback.starts_with("[Service]\n"), "{fallback}");
    assert!(
        !fallback.contains("--mamba-scheduler-strategy"),
        "{fallback}"
    );
    // What the service runs on, as far as this container's roles declare it.
    assert_eq!(
        service["depends_on"][0],
        "file:/etc/systemd/system/sglang-qwen.service"
    );
}

/// The stderr of an offline plan of llm-two with `role` as its sglang role, which fails.
fn refused_role(role: &str) -> String {
    let dir = with_own_role(role, "");
    let inventory = dir.path().join("inventory.yaml");
    let r = run(&["plan", "--offline", inventory.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    r.stderr
}

/// Where a service is declared is provision's to record: a role cannot claim a position.
#[test]
fn a_role_cannot_set_where_a_service_is_declared() {
    let err = refused_role(
        "description: Own.\nresources:\n  - kind: service\n    unit: own.service\n    unit_path: /etc/systemd/system/own.service\n    declared: { file: inventory.yaml, service: \"1:1\" }\n",
    );
    assert!(
        err.contains("roles/sglang.yaml:3:")
            && err
                .contains("field `declared`: where a service is declared is recorded by provision"),
        "{err}"
    );
}

/// What is no longer declared comes from the guest's record: a role cannot plan a removal.
#[test]
fn a_role_cannot_write_a_removal() {
    let err = refused_role(
        "description: Own.\nresources:\n  - kind: removed\n    entry: { kind: file, path: /etc/passwd, sha256: x }\n",
    );
    assert!(
        err.contains("roles/sglang.yaml:3:") && err.contains("a role cannot write it"),
        "{err}"
    );
}

/// `of:` must name a service of the container, and takes nothing the inventory says.
#[test]
fn a_users_role_naming_no_service_is_an_error_in_the_role() {
    let entry = |extra: &str| {
        format!(
            "description: Bad.\nrequires: [services]\nfor_each: service\nresources:\n  - kind: service\n    of: \"{{{{service.unit}}}}\"\n{extra}"
        )
    };
    let err = refused_role(&entry(""));
    assert!(
        err.contains("roles/sglang.yaml:5:")
            && err.contains("`of: sglang-qwen.service` names no service of this container"),
        "{err}"
    );
    let err = refused_role(
        &entry("    exec_start: [/bin/true]\n").replace("service.unit", "service.name"),
    );
    assert!(
        err.contains("field `exec_start`") && err.contains("takes only `unit_template`"),
        "{err}"
    );
}

/// examples/lab.yaml with the lab's exports: its plan carries the values of the
/// environment where the inventory references them (node SSH, the container's address,
/// bridge and mount), and secrets stay out of it.
#[test]
fn lab_example_takes_its_values_from_the_environment() {
    let env = lab_example_env();
    let out = provision()
        .args(["plan", "--offline", "examples/lab.yaml"])
        .envs(env.clone())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "net0            = name=eth0,bridge=vmbre,ip=10.85.0.10/24,gw=10.85.0.1",
        "mp0             = /var/lib/provision-lab-sample/shared,mp=/shared",
        "root@10.85.0.10:22",
        "http://10.85.0.1:8580/git/sglang.git",
    ] {
        assert!(stdout.contains(want), "no `{want}` in:\n{stdout}");
    }
    for (k, v) in &env {
        if k.contains("PASSWORD") || k.contains("TOKEN") {
            assert!(!stdout.contains(v.as_str()), "{k}'s value in the plan");
        }
    }
}

/// A variable not set: exit 1, each one named with the line and column it is referenced
/// at, and a hint.
#[test]
fn lab_example_without_the_environment_names_each_unset_variable() {
    let mut cmd = provision();
    cmd.args(["validate", "examples/lab.yaml"]);
    for (k, v) in lab_example_env() {
        if k == "LAB_GUEST_IP" || k == "PVE_NODE_SSH_PORT" {
            cmd.env_remove(&k);
        } else {
            cmd.env(k, v);
        }
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lab.yaml"))
            .unwrap();
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let port = format!("examples/lab.yaml:{}:13", line_of("env: PVE_NODE_SSH_PORT"));
    assert!(stderr.contains(&port), "no {port} in:\n{stderr}");
    assert!(
        stderr.contains("environment variable `PVE_NODE_SSH_PORT` is not set"),
        "{stderr}"
    );
    let ip = format!("line {}, column 17", line_of("env: LAB_GUEST_IP"));
    assert!(
        stderr.contains("`LAB_GUEST_IP` is not set") && stderr.contains(&ip),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: export PVE_NODE_SSH_PORT"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
