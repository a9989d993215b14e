//! The command line as a user meets it: exit codes, error text for a corpus of bad
//! inventories (snapshotted), the offline plan and the rendered unit of llm-two.

use std::path::Path;

use assert_cmd::Command;

fn provision() -> Command {
    let mut cmd = Command::cargo_bin("provision").unwrap();
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env_remove("PVE_TOKEN")
        .env_remove("HF_TOKEN");
    cmd
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    let out = provision().args(args).output().unwrap();
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
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
            let r = run(&["validate", &rel]);
            assert_eq!(r.code, 0, "{rel}: {}", r.stderr);
        }
    }
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
fn offline_plan_json_is_stable_and_complete() {
    let r = run(&["plan", "--offline", "--json", "inventory/llm-two.yaml"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(plan["format_version"], 1);
    assert_eq!(plan["mode"], "offline");
    // The JSON round-trips into the plan type apply executes.
    let typed: provision::plan::Plan = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(typed.summary.create, 13);
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
    ] {
        assert!(
            dir.path().join(f).is_file(),
            "{f} missing; printed: {}",
            r.stdout
        );
    }
    assert_eq!(r.stdout.lines().count(), 3, "{}", r.stdout);
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
