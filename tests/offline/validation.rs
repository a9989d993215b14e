//! Every validation rule, on the llm-two inventory with one thing broken: the message,
//! the position it points at, and the hint.

use std::path::Path;

use provision::compile::Library;
use provision::diagnostic::Diagnostics;
use provision::inventory::load::{Loaded, parse_bytes};
use provision::inventory::validate::validate;

const LLM_TWO: &str = include_str!("../../inventory/llm-two.yaml");

/// Replaces `from` with `to` in llm-two (exactly once) and validates the result.
fn broken(from: &str, to: &str) -> String {
    assert_eq!(
        LLM_TWO.matches(from).count(),
        1,
        "`{from}` must occur once in llm-two.yaml"
    );
    check(&LLM_TWO.replacen(from, to, 1)).expect_err("the broken inventory must not validate")
}

/// Parses and validates `yaml`; the rendered errors when it fails.
fn check(yaml: &str) -> Result<(), String> {
    let path = Path::new("inventory/llm-two.yaml");
    let (inventory, source) = parse_bytes(path, yaml.as_bytes()).map_err(|d| d.render(false))?;
    let loaded = Loaded {
        path: path.to_path_buf(),
        base_dir: Path::new("inventory").to_path_buf(),
        source,
        inventory,
    };
    let library = Library::load(&loaded).map_err(|d| d.render(false))?;
    validate(&loaded, &library.roles.names()).map_err(|d: Diagnostics| d.render(false))?;
    provision::compile::desired_state(&loaded, &library, &|_| None)
        .map(|_| ())
        .map_err(|d| d.render(false))
}

fn line_of(needle: &str) -> usize {
    LLM_TWO
        .lines()
        .position(|l| l.contains(needle))
        .expect("needle in llm-two")
        + 1
}

#[test]
fn llm_two_is_valid() {
    check(LLM_TWO).unwrap();
}

#[test]
fn vmid_out_of_range() {
    let e = broken("vmid: 129", "vmid: 99");
    assert!(e.contains("vmid 99 is out of range"), "{e}");
    assert!(
        e.contains(&format!(
            "inventory/llm-two.yaml:{}:15",
            line_of("vmid: 129")
        )),
        "{e}"
    );
    assert!(
        e.contains("hint: Proxmox container IDs run from 100 to 999999999"),
        "{e}"
    );
    let e = broken("vmid: 129", "vmid: 1000000000");
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn duplicate_vmid_on_a_node() {
    let second = "      llm-three:\n        vmid: 129\n        template: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst\n        cores: 2\n        memory: 2G\n        rootfs: { storage: local-zfs, size: 8G }\n        network:\n          - { bridge: vmbr0, ip: 10.1.230.175/24 }\n";
    let yaml = LLM_TWO.replacen(
        "    containers:\n",
        &format!("    containers:\n{second}"),
        1,
    );
    let e = check(&yaml).unwrap_err();
    assert!(e.contains("vmid 129 is used twice on node `pve`"), "{e}");
    assert!(
        e.contains("hint: container `llm-three` already has it"),
        "{e}"
    );
}

#[test]
fn relative_path_is_refused() {
    let e = broken("path: /root/ml-env", "path: root/ml-env");
    assert!(e.contains("`root/ml-env` is a relative path"), "{e}");
    assert!(
        e.contains("hint: write it from the root, e.g. `/root/ml-env`"),
        "{e}"
    );
    assert!(
        e.contains(&format!(":{}:17", line_of("path: /root/ml-env"))),
        "{e}"
    );
}

#[test]
fn service_model_must_be_declared() {
    let e = broken("model: qwen3.5-122b", "model: qwen3.5-122");
    assert!(
        e.contains("serves model `qwen3.5-122`, which is not declared"),
        "{e}"
    );
    assert!(e.contains("did you mean `qwen3.5-122b`?"), "{e}");
}

#[test]
fn model_path_must_be_inside_a_mount() {
    let e = broken(
        "path: /shared/models/Qwen3.5-122B-A10B",
        "path: /srv/models/Qwen3.5-122B-A10B",
    );
    assert!(
        e.contains(
            "model `qwen3.5-122b` at `/srv/models/Qwen3.5-122B-A10B` is outside every mount"
        ),
        "{e}"
    );
    assert!(e.contains("hint: put it under a mount (/shared)"), "{e}");
}

#[test]
fn tp_cannot_exceed_passed_through_gpus() {
    let e = broken("devices: [0, 1, 2, 3]", "devices: [0, 1]");
    assert!(
        e.contains("tp 4 is more than the 2 GPU(s) passed through to `llm-two`"),
        "{e}"
    );
    assert!(e.contains(&format!(":{}:17", line_of("tp: 4"))), "{e}");
}

#[test]
fn duplicate_ports_and_units() {
    let svc = LLM_TWO.split("          sglang-qwen:\n").nth(1).unwrap();
    let twin = format!("          sglang-twin:\n{svc}");
    let yaml = format!("{LLM_TWO}{twin}");
    let e = check(&yaml).unwrap_err();
    assert!(
        e.contains("port 30000 is used by services `sglang-qwen` and `sglang-twin`"),
        "{e}"
    );
}

#[test]
fn newline_smuggled_into_a_flag() {
    let e = broken(
        "attention_backend: triton",
        "attention_backend: \"triton\\n--evil\"",
    );
    assert!(
        e.contains("not a valid name") || e.contains("newline"),
        "{e}"
    );
    let e = broken(
        "SGLANG_ENABLE_SPEC_V2: \"1\"",
        "SGLANG_ENABLE_SPEC_V2: \"1\\nExecStartPre=/bin/sh\"",
    );
    assert!(
        e.contains("contains a newline, which would reach a command line or a unit file"),
        "{e}"
    );
}

#[test]
fn control_characters_in_extra_args() {
    let e = broken(
        "tp: 4",
        "tp: 4\n            extra_args: [\"--x=\\u001b[2J\"]",
    );
    assert!(e.contains("U+001B"), "{e}");
}

#[test]
fn unknown_field_suggests_the_right_one() {
    let e = broken("tp: 4", "tpp: 4");
    assert!(e.contains("unknown field `tpp`"), "{e}");
    assert!(e.contains("hint: did you mean `tp`?"), "{e}");
}

#[test]
fn wrong_type() {
    let e = broken("cores: 32", "cores: many");
    assert!(e.contains(&format!(":{}:", line_of("cores: 32"))), "{e}");
}

#[test]
fn unquoted_versions_lose_zeros() {
    let e = broken("version: \"13.0\"", "version: 13.0");
    assert!(e.contains("read as the number 13"), "{e}");
    assert!(e.contains("hint: quote it"), "{e}");
}

#[test]
fn sizes_need_units() {
    let e = broken("memory: 256G", "memory: 256");
    assert!(e.contains("`256` has no unit"), "{e}");
    assert!(
        e.contains("hint: write a unit: `256M` for MiB or `256G` for GiB"),
        "{e}"
    );
}

#[test]
fn inline_secrets_are_refused_and_never_echoed() {
    let e = broken(
        "token: { env: PVE_TOKEN }",
        "token: root@pam!ci=0b4e-very-secret",
    );
    assert!(
        e.contains("secrets must not be written in the inventory"),
        "{e}"
    );
    assert!(!e.contains("very-secret"), "the secret was echoed: {e}");
    assert!(e.contains("hint: reference it instead"), "{e}");
}

#[test]
fn unpinned_packages_are_refused() {
    let e = broken("- torch==2.9.1", "- torch>=2.9");
    assert!(e.contains("`torch>=2.9` is not pinned"), "{e}");
}

#[test]
fn sglang_revision_must_be_a_commit() {
    let rev = LLM_TWO
        .lines()
        .map(str::trim)
        .find(|l| {
            l.strip_prefix("revision: ")
                .and_then(|v| v.split_whitespace().next())
                .is_some_and(|v| v.len() == 40)
        })
        .unwrap()
        .to_string();
    let e = broken(&rev, "revision: main");
    assert!(e.contains("`main` is not a pinned commit"), "{e}");
}

#[test]
fn restart_policy_must_end_a_crash_loop() {
    let e = broken(
        "tp: 4",
        "tp: 4\n            restart: { delay: 5m, start_limit_burst: 3, start_limit_interval: 10m }",
    );
    assert!(
        e.contains("a crash loop would never hit the start limit"),
        "{e}"
    );
}

#[test]
fn readiness_stall_shorter_than_deadline() {
    let e = broken("stall_timeout: 5m", "stall_timeout: 45m");
    assert!(
        e.contains("stall_timeout is not shorter than the deadline"),
        "{e}"
    );
}

/// A rule between two values broken by a default on one side points at the value the user
/// wrote (found by fuzzing: the error had no position).
#[test]
fn rules_broken_by_a_default_point_at_the_written_value() {
    let stall = line_of("stall_timeout: 5m");
    let e = broken("stall_timeout: 5m", "stall_timeout: 1s");
    assert!(
        e.contains("poll_interval is not shorter than stall_timeout")
            && e.contains(&format!("inventory/llm-two.yaml:{stall}:30")),
        "{e}"
    );
    let e = broken("tp: 4", "tp: 4\n            restart: { delay: 10m }");
    let restart = line_of("tp: 4") + 1;
    assert!(
        e.contains("a crash loop would never hit the start limit")
            && e.contains(&format!("inventory/llm-two.yaml:{restart}:")),
        "{e}"
    );
}

/// pep508_rs panics on a name ending in `.` before more text; provision refuses it with a
/// position instead (found by fuzzing: `torc9.==h.21`).
#[test]
fn pip_names_that_crash_the_pep508_parser_are_refused() {
    let e = broken("- torch==2.9.1", "- torch.==2.9.1");
    assert!(
        e.contains("must end with a letter or digit")
            && e.contains(&format!(
                "inventory/llm-two.yaml:{}:15",
                line_of("- torch==2.9.1")
            )),
        "{e}"
    );
}

#[test]
fn unknown_role_suggests() {
    let e = broken("sglang]", "sglan]");
    assert!(e.contains("unknown role `sglan`"), "{e}");
    assert!(e.contains("did you mean `sglang`?"), "{e}");
}

#[test]
fn role_needs_its_section() {
    let start = LLM_TWO.find("        cuda:\n").unwrap();
    let end = LLM_TWO[start..].find("\n\n").unwrap() + start + 2;
    let yaml = format!("{}{}", &LLM_TWO[..start], &LLM_TWO[end..]);
    let e = check(&yaml).unwrap_err();
    assert!(e.contains("role `cuda` needs a `cuda:` section"), "{e}");
}

#[test]
fn tls_needs_exactly_one_trust() {
    let e = broken(
        "ca_file: pve-root-ca.pem",
        "ca_file: pve-root-ca.pem\n        fingerprint: \"AB\"",
    );
    assert!(e.contains("names both a fingerprint and a CA file"), "{e}");
    let e = broken("ca_file: pve-root-ca.pem", "fingerprint: \"AB:CD\"");
    assert!(e.contains("is not a SHA-256 fingerprint"), "{e}");
}

#[test]
fn api_must_be_https() {
    let e = broken("url: https://", "url: http://");
    assert!(e.contains("is not https"), "{e}");
}

#[test]
fn gateway_outside_subnet() {
    let e = broken("gateway: 10.1.230.1", "gateway: 10.1.231.1");
    assert!(
        e.contains("gateway 10.1.231.1 is outside ") && e.contains("/24"),
        "{e}"
    );
}

#[test]
fn extra_args_must_not_repeat_typed_flags() {
    let e = broken("tp: 4", "tp: 4\n            extra_args: [\"--tp\", \"2\"]");
    assert!(
        e.contains("`--tp` in extra_args repeats a typed field"),
        "{e}"
    );
    assert!(e.contains("hint: set `tp` instead"), "{e}");
}

#[test]
fn all_problems_are_reported_together() {
    let yaml = LLM_TWO.replacen("vmid: 129", "vmid: 5", 1).replacen(
        "kv_cache_dtype: bf16",
        "kv_cache_dtype: bf16\n            mem_fraction_static: 1.5",
        1,
    );
    let e = check(&yaml).unwrap_err();
    assert!(e.contains("vmid 5 is out of range"), "{e}");
    assert!(
        e.contains("mem_fraction_static 1.5 is not between 0 and 1"),
        "{e}"
    );
    assert!(e.contains("2 errors"), "{e}");
}

/// The remaining rules, one broken value each: (what to replace, with what, expected text).
#[test]
fn every_other_rule() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "cores: 32 ",
            "cores: 0 ",
            "a container needs at least one core",
        ),
        ("memory: 256G", "memory: 8M", "memory 8M is too small"),
        ("size: 200G", "size: 200M", "is not a whole number of GiB"),
        (
            "local:vztmpl/ubuntu",
            "local:iso/ubuntu",
            "is not a template volume ID",
        ),
        (
            "            path: /shared\n",
            "            path: /\n",
            "a mount cannot cover the container's root",
        ),
        (
            "devices: [0, 1, 2, 3]",
            "devices: [0, 1, 1, 3]",
            "GPU `1` is listed twice",
        ),
        (
            "devices: [0, 1, 2, 3]",
            "devices: [0, 1, 2, \"GPU-5a3c2b1e-0000-1111-2222-333344445555\"]",
            "selected both by index and by UUID",
        ),
        (
            "devices: [0, 1, 2, 3]",
            "devices: [\"GPU-nope\"]",
            "neither a GPU index nor a GPU UUID",
        ),
        (
            "roles: [gpu-passthrough,",
            "roles: [cuda, gpu-passthrough,",
            "role `cuda` is listed twice",
        ),
        (
            "- torch==2.9.1",
            "- torch==2.9.1\n            - Torch==2.9.0",
            "is pinned twice",
        ),
        (
            "extra_urls: [https://download.pytorch.org/whl/cu130]",
            "url: https://pypi.org/simple\n            wheelhouse: /root/wheels",
            "both an index URL and a wheelhouse are set",
        ),
        (
            "path: /root/sglang-main",
            "path: /root/ml-env/sglang",
            "the SGLang checkout is inside the venv",
        ),
        (
            "repo: Qwen/Qwen3.5-122B-A10B",
            "repo: Qwen3.5-122B-A10B",
            "is not a Hugging Face repository",
        ),
        (
            "revision: main",
            "revision: main\n            include: [\"*.{json\"]",
            "is not a glob",
        ),
        ("tp: 4", "tp: 0", "tp must be at least 1"),
        (
            "num_steps: 3",
            "num_steps: 0",
            "speculative.num_steps must be at least 1",
        ),
        (
            "stall_timeout: 5m ",
            "stall_timeout: 5m\n              poll_interval: 10m ",
            "poll_interval is not shorter than stall_timeout",
        ),
        (
            "deadline: 30m ",
            "deadline: 30m\n              url: ftp://x/v1/models ",
            "is not an http(s) URL",
        ),
        (
            "algorithm: NEXTN",
            "algorithm: NEXT",
            "unknown value `NEXT`",
        ),
        ("swap: 0", "swap: -1", "cannot be negative"),
        ("port: 30000", "port: 70000", "70000"),
        (
            "SGLANG_ENABLE_SPEC_V2: \"1\"",
            "1SGLANG: \"1\"",
            "is not a valid environment variable name",
        ),
    ];
    for (from, to, want) in cases {
        let e = broken(from, to);
        assert!(
            e.contains(want),
            "replacing `{from}` with `{to}`: expected `{want}` in:\n{e}"
        );
        assert!(
            e.contains("inventory/llm-two.yaml"),
            "no location for `{want}`:\n{e}"
        );
    }
}

#[test]
fn several_models_and_services_must_not_collide() {
    let model = "          qwen3.5-122b:\n            repo: Qwen/Qwen3.5-122B-A10B\n            revision: main\n            path: /shared/models/Qwen3.5-122B-A10B\n";
    let twin = model.replace("qwen3.5-122b:", "other:");
    let e = broken(model, &format!("{model}{twin}"));
    assert!(
        e.contains("models `qwen3.5-122b` and `other` share the path"),
        "{e}"
    );
}

/// Lines of llm-two found by their key, so tests need not spell its addresses.
fn line_with(key: &str) -> String {
    LLM_TWO
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap()
        .to_string()
}

#[test]
fn addresses_and_ssh_rules() {
    let ip = line_with("ip: ");
    let indent = &ip[..ip.len() - ip.trim_start().len()];
    let e = broken(&ip, &format!("{indent}ip: dhcp"));
    assert!(e.contains("has no address to reach it by SSH"), "{e}");
    let without_prefix = ip.trim_end_matches("/24").to_string();
    let e = broken(&ip, &without_prefix);
    assert!(e.contains("has no prefix length"), "{e}");
    let host = line_with("host: ");
    let e = broken(&format!("    ssh:\n{host}\n"), "    ssh:\n");
    assert!(e.contains("has no `ssh.host`"), "{e}");
}

#[test]
fn duplicate_vmid_in_a_cluster() {
    let other = "  pve2:\n    cluster: lab\n    api: { url: https://192.0.2.7:8006, node: pve2, token: { env: PVE_TOKEN }, tls: { ca_file: pve-root-ca.pem } }\n    ssh: { host: 192.0.2.7 }\n    containers:\n      llm-three:\n        vmid: 129\n        template: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst\n        cores: 2\n        memory: 2G\n        rootfs: { storage: local-zfs, size: 8G }\n        network:\n          - { bridge: vmbr0, ip: 192.0.2.175/24 }\n";
    let clustered = LLM_TWO.replacen("  pve:\n", &format!("{other}  pve:\n    cluster: lab\n"), 1);
    let e = check(&clustered).unwrap_err();
    assert!(
        e.contains(
            "vmid 129 is also container `llm-three`'s on node `pve2`, in the same cluster `lab`"
        ),
        "{e}"
    );
    assert!(
        e.contains("hint: vmids are unique in a Proxmox cluster"),
        "{e}"
    );
    // Nodes outside a cluster may reuse a vmid: each node has its own.
    let apart = LLM_TWO.replacen(
        "  pve:\n",
        &format!("{}  pve:\n", other.replace("    cluster: lab\n", "")),
        1,
    );
    check(&apart).unwrap();
}

/// The position of `needle`'s first character in llm-two after replacing `from` by `to`.
fn pos_after(from: &str, to: &str, needle: &str) -> String {
    let text = LLM_TWO.replacen(from, to, 1);
    let line = text
        .lines()
        .position(|l| l.contains(needle))
        .expect("needle")
        + 1;
    let col = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.find(needle))
        .expect("col")
        + 1;
    format!("inventory/llm-two.yaml:{line}:{col}")
}

#[test]
fn values_proxmox_refuses_are_refused_in_its_words() {
    // Each is what the oracle's fixtures record Proxmox answering (crates/pve/tests/oracle.rs).
    let cases = [
        (
            "            gateway: 10.1.230.1\n",
            "            gateway: 10.1.230.1\n            vlan: 5000\n",
            "5000",
            "Proxmox refuses `tag=5000`: value must have a maximum value of 4094",
        ),
        (
            "ip: 10.1.230.174/24",
            "ip: 10.1.230.174/4",
            "10.1.230.174/4",
            "Proxmox refuses `ip=10.1.230.174/4`: value does not look like a valid ipv4 network configuration",
        ),
        (
            "        vmid: 129\n",
            "        vmid: 129\n        hostname: llm_two\n",
            "llm_two",
            "Proxmox refuses `hostname: llm_two`: invalid format - value does not look like a valid DNS name",
        ),
        (
            "        onboot: true\n",
            "        onboot: true\n        nameservers: [garbage]\n",
            "garbage",
            "Proxmox refuses `nameserver: garbage`: value does not look like a valid IP address",
        ),
    ];
    for (from, to, at, words) in cases {
        let e = broken(from, to);
        assert!(e.contains(words), "{to}: {e}");
        assert!(e.contains(&pos_after(from, to, at)), "{to}: {e}");
        assert!(e.contains("this is what Proxmox VE answers for it"), "{e}");
    }
}

#[test]
fn gpu_userspace_needs_one_pinned_source() {
    let e = broken(
        "              - nvidia-utils-580=580.95.05-0ubuntu1\n",
        "              - nvidia-utils-580\n",
    );
    assert!(
        e.contains("`nvidia-utils-580` is not pinned to a version"),
        "{e}"
    );
    assert!(e.contains("Driver/library version mismatch"), "{e}");
    let e = broken(
        "            packages:\n              - libnvidia-compute-580=580.95.05-0ubuntu1\n              - nvidia-utils-580=580.95.05-0ubuntu1\n",
        "            installer: { url: \"https://example.invalid/nvidia.run\", sha256: abc }\n",
    );
    assert!(
        e.contains("the installer's file name does not say its version"),
        "{e}"
    );
    assert!(
        e.contains("the installer's sha256 is not 64 hex digits"),
        "{e}"
    );
    let e = broken(
        "            packages:\n              - libnvidia-compute-580=580.95.05-0ubuntu1\n              - nvidia-utils-580=580.95.05-0ubuntu1\n",
        "            packages: []\n",
    );
    assert!(
        e.contains("needs exactly one of `installer` and `packages`"),
        "{e}"
    );
}

/// Issue 26, boot order: `devN` entries for /dev/nvidia-uvm* fail the container's start
/// when the node has not made them yet; a node that declares nothing making them at boot
/// is refused, at the GPU list, with both remedies.
#[test]
fn dev_passthrough_needs_the_uvm_nodes_made_at_boot() {
    let e = broken("uvm_at_boot: true", "uvm_at_boot: false");
    assert!(
        e.contains("container `llm-two` passes /dev/nvidia-uvm and /dev/nvidia-uvm-tools through as `devN` entries, but node `pve` declares nothing that creates them at boot"),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "inventory/llm-two.yaml:{}:21",
            line_of("devices: [0, 1, 2, 3]")
        )),
        "{e}"
    );
    assert!(e.contains("uvm_at_boot: true"), "{e}");
    assert!(e.contains("`gpus.method: lxc`"), "{e}");
    // Bind mounts marked optional do not stop a start: the lxc method is not refused.
    let lxc = LLM_TWO
        .replacen("uvm_at_boot: true", "uvm_at_boot: false", 1)
        .replacen("method: dev", "method: lxc", 1);
    check(&lxc).unwrap();
}

#[test]
fn a_served_model_declared_absent_and_an_unknown_state_are_refused_where_written() {
    let served = "            path: /shared/models/Qwen3.5-122B-A10B\n";
    let e = broken(served, &format!("{served}            state: absent\n"));
    assert!(
        e.contains(
            "service `sglang-qwen` serves model `qwen3.5-122b`, which is declared `state: absent`"
        ),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "inventory/llm-two.yaml:{}:20",
            line_of("model: qwen3.5-122b") + 1
        )),
        "{e}"
    );
    assert!(e.contains("remove the service first"), "{e}");
    let e = broken(served, &format!("{served}            state: gone\n"));
    assert!(
        e.contains(&format!(
            "inventory/llm-two.yaml:{}:20",
            line_of("path: /shared/models/Qwen3.5-122B-A10B") + 1
        )),
        "{e}"
    );
    assert!(e.contains("present") && e.contains("absent"), "{e}");
}
