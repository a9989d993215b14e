//! `provision gpu facts|check|nccl` as a user runs them: exit codes, and errors with their
//! causes and hints. Stand-in programs print text captured on the H200 machine; the NCCL
//! runs use the stand-in torch (see `tests/fixtures/gpu/README.md`) and need `python3`.

use crate::cli_support::Provision;
use std::path::Path;
use std::process::Command as StdCommand;

use assert_cmd::Command;
use predicates::str::contains;

const UUID0: &str = "GPU-4a0f4724-ce2e-401e-401a-c916ec5586e7";
const UUID1: &str = "GPU-bd921741-4472-2f2e-9847-d8171173854c";

/// The checkout, read when the test runs (cargo sets it), so a test binary shared between
/// checkouts through one target folder still reads this checkout's fixtures.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

fn fx(p: &str) -> String {
    format!("{}/tests/fixtures/gpu/{p}", manifest_dir())
}

fn write_exec(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    assert!(
        StdCommand::new("chmod")
            .arg("+x")
            .arg(path)
            .status()
            .unwrap()
            .success()
    );
}

/// Stand-ins for nvidia-smi, ldconfig, nvcc and a venv's python under `dir`, and a root with
/// the machine's /proc files and driver libraries.
fn fake_machine(dir: &Path) -> String {
    write_exec(
        &dir.join("bin/nvidia-smi"),
        &format!(
            "#!/bin/sh\ncase \"$1\" in\n  -L) cat '{}' ;;\n  --version) cat '{}' ;;\n  --query-gpu=*) cat '{}' ;;\n  *) exit 2 ;;\nesac\n",
            fx("h200x2/smi-L.txt"),
            fx("h200x2/smi-version.txt"),
            fx("h200x2/query-gpu.txt")
        ),
    );
    write_exec(&dir.join("bin/ldconfig"), "#!/bin/sh\nexit 0\n");
    write_exec(
        &dir.join("cuda/bin/nvcc"),
        &format!("#!/bin/sh\ncat '{}'\n", fx("h200x2/nvcc.txt")),
    );
    write_exec(
        &dir.join("venv/bin/python"),
        &format!("#!/bin/sh\ncat '{}'\n", fx("h200x2/torch-probe.txt")),
    );
    let root = dir.join("root");
    let put = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(
        "proc/driver/nvidia/version",
        &std::fs::read_to_string(fx("h200x2/proc-driver-version.txt")).unwrap(),
    );
    put(
        "proc/devices",
        &std::fs::read_to_string(fx("h200x2/proc-devices.txt")).unwrap(),
    );
    put("usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", "");
    format!("{}/bin:/usr/bin:/bin", dir.display())
}

fn provision(path: &str) -> Command {
    Command::from_std(
        Provision::new::<&str>([])
            .env("PATH", path)
            .env_remove("LD_LIBRARY_PATH")
            .command(),
    )
}

#[test]
fn facts_without_device_nodes_exit_1_with_hints() {
    let tmp = tempfile::tempdir().unwrap();
    let path = fake_machine(tmp.path());
    let root = tmp.path().join("root").display().to_string();
    provision(&path)
        .args(["gpu", "facts", "--root", &root])
        .assert()
        .code(1)
        .stdout(contains("driver   580.159.04 (open kernel module)"))
        .stdout(contains(format!(
            "GPU 0    {UUID0}  NVIDIA H200  143771 MiB"
        )))
        .stderr(contains(
            "error: /dev/nvidia-uvm does not exist on the node",
        ))
        .stderr(contains("hint: run `nvidia-modprobe -u -c=0`"));
    let out = provision(&path)
        .args(["gpu", "facts", "--json", "--root", &root])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["gpus"][1]["uuid"], UUID1);
    assert_eq!(json["majors"][2]["name"], "nvidia-uvm");
}

fn check_args(dir: &Path, gpus: &str, tp: &str) -> Vec<String> {
    [
        "gpu",
        "check",
        "--gpus",
        gpus,
        "--cuda",
        "13.0",
        "--cuda-home",
        &dir.join("cuda").display().to_string(),
        "--venv",
        &dir.join("venv").display().to_string(),
        "--tp",
        tp,
        "--root",
        &dir.join("root").display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn check_exits_0_when_all_is_as_declared_and_2_on_drift() {
    let tmp = tempfile::tempdir().unwrap();
    let path = fake_machine(tmp.path());
    provision(&path)
        .args(check_args(tmp.path(), &format!("{UUID0},{UUID1}"), "2"))
        .assert()
        .code(0)
        .stdout(contains("4 ok, 0 drift, 0 skipped"));
    provision(&path)
        .args(check_args(tmp.path(), UUID0, "4"))
        .assert()
        .code(2)
        .stdout(contains(format!("+ {UUID1} (NVIDIA H200, guest index 1)")))
        .stdout(contains("drift  torch"))
        .stdout(contains("2 ok, 2 drift, 0 skipped"));
}

#[test]
fn check_refuses_indices_with_a_reason() {
    provision("/usr/bin:/bin")
        .args(["gpu", "check", "--gpus", "0"])
        .assert()
        .failure()
        .stderr(contains(
            "a guest numbers its GPUs from 0, so name them by UUID",
        ));
}

fn nccl(dir: &Path) -> Command {
    Command::from_std(
        Provision::new::<&str>([])
            .env("PYTHONPATH", fx("fake_torch"))
            .env("FAKE_TORCH_DIR", dir)
            .env("FAKE_TORCH_GPUS", "2")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .command(),
    )
}

#[test]
fn nccl_healthy_exits_0_and_a_hang_exits_1_with_remedies() {
    let tmp = tempfile::tempdir().unwrap();
    nccl(tmp.path())
        .args([
            "gpu", "nccl", "--gpus", "0,1", "--size", "1M", "--iters", "3",
        ])
        .assert()
        .code(0)
        .stdout(contains(
            "NCCL all-reduce across 2 GPUs (Fake GPU): healthy",
        ))
        .stdout(contains("bus bandwidth"));
    nccl(tmp.path())
        .args([
            "gpu",
            "nccl",
            "--gpus",
            "0,1",
            "--timeout",
            "2s",
            "--simulate-hang-rank",
            "1",
        ])
        .assert()
        .code(1)
        .stderr(contains(
            "error: NCCL all-reduce across GPUs 0,1 hung after 2.",
        ))
        .stderr(contains("rank 0: nccl_init"))
        .stderr(contains("hint: NCCL_P2P_DISABLE=1"))
        .stderr(contains("iommu=pt"));
}

#[test]
fn nccl_json_reports_a_failure_and_still_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    let out = nccl(tmp.path())
        .args(["gpu", "nccl", "--gpus", "0,1,2", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["outcome"], "too_few_gpus");
    assert_eq!(json["visible"], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("but torch sees 2 GPU(s)"));
}

#[test]
fn nccl_with_a_missing_python_says_which() {
    let tmp = tempfile::tempdir().unwrap();
    nccl(tmp.path())
        .args([
            "gpu",
            "nccl",
            "--gpus",
            "0,1",
            "--python",
            "/nonexistent/bin/python",
        ])
        .assert()
        .code(1)
        .stderr(contains("error: cannot run /nonexistent/bin/python"))
        .stderr(contains("hint: point --python at the ml-env's python"));
}

#[test]
fn nccl_refuses_a_malformed_environment_entry() {
    provision("/usr/bin:/bin")
        .args(["gpu", "nccl", "--gpus", "0,1", "--env", "NCCL_P2P_DISABLE"])
        .assert()
        .failure()
        .stderr(contains("is not KEY=VALUE"));
}
