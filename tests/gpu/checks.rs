//! Guest checks: the verdicts the binary printed on the H200 machine are what the library
//! concludes here from the same raw probe output; hand-made drift (a driver mismatch, a
//! missing GPU, nvcc absent, torch absent or blind); and a whole run through the local
//! transport with stand-in programs that print the captured text.

use std::path::Path;
use std::process::Command;

use provision::gpu::checks::{
    self, CheckReport, CheckStatus, CudaExpectation, GuestExpectations, TorchExpectation,
};
use provision::gpu::probe::{Section, Sections, parse_sections};
use provision::transport::local::LocalTransport;

/// The checkout, read when the test runs (cargo sets it), so a test binary shared between
/// checkouts through one target folder still reads this checkout's fixtures.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

fn fixture(path: &str) -> String {
    let full = format!("{}/tests/fixtures/gpu/{path}", manifest_dir());
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

const UUID0: &str = "GPU-4a0f4724-ce2e-401e-401a-c916ec5586e7";
const UUID1: &str = "GPU-bd921741-4472-2f2e-9847-d8171173854c";
const ABSENT: &str = "GPU-00000000-1111-2222-3333-444444444444";

/// What the device run's `check-ok` asked for.
fn ok_expectations() -> GuestExpectations {
    GuestExpectations {
        gpus: vec![UUID0.into(), UUID1.into()],
        driver_version: None,
        cuda: Some(CudaExpectation {
            release: "13.0".into(),
            home: "/usr/local/cuda-13.0".into(),
        }),
        torch: Some(TorchExpectation {
            venv: "/opt/torch/.venv".into(),
            tp: 2,
        }),
        root: String::new(),
    }
}

fn status(report: &CheckReport, name: &str) -> CheckStatus {
    report
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap()
        .status
}

fn check<'a>(report: &'a CheckReport, name: &str) -> &'a checks::Check {
    report.checks.iter().find(|c| c.name == name).unwrap()
}

fn text(report: &CheckReport, name: &str) -> String {
    let c = check(report, name);
    format!(
        "{}\n{}\n{}",
        c.summary,
        c.details.join("\n"),
        c.remedies.join("\n")
    )
}

/// Each check's name, status and summary, as the device's JSON has them.
fn verdicts(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                c["summary"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn healthy_guest_as_on_the_h200_machine() {
    let report = checks::evaluate_guest(
        &ok_expectations(),
        &parse_sections(&fixture("h200x2/check-ok-probe.raw")),
    );
    let there: serde_json::Value =
        serde_json::from_str(&fixture("h200x2/check-ok-json.txt")).unwrap();
    assert_eq!(
        verdicts(&serde_json::to_value(&report).unwrap()),
        verdicts(&there)
    );
    assert!(report.checks.iter().all(|c| c.status == CheckStatus::Ok));
    assert!(!report.drifted());
}

#[test]
fn drifted_expectations_as_on_the_h200_machine() {
    let expect = GuestExpectations {
        gpus: vec![UUID0.into(), ABSENT.into()],
        driver_version: Some("570.86.15".into()),
        cuda: Some(CudaExpectation {
            release: "12.8".into(),
            home: "/usr/local/cuda-13.0".into(),
        }),
        torch: Some(TorchExpectation {
            venv: "/opt/torch/.venv".into(),
            tp: 4,
        }),
        root: String::new(),
    };
    let report = checks::evaluate_guest(
        &expect,
        &parse_sections(&fixture("h200x2/check-drift-probe.raw")),
    );
    let there: serde_json::Value =
        serde_json::from_str(&fixture("h200x2/check-drift-json.txt")).unwrap();
    assert_eq!(
        verdicts(&serde_json::to_value(&report).unwrap()),
        verdicts(&there)
    );
    assert!(report.checks.iter().all(|c| c.status == CheckStatus::Drift));
    assert!(report.drifted());
    let gpus = text(&report, "gpus");
    assert!(gpus.contains(&format!("- {ABSENT}")), "{gpus}");
    assert!(
        gpus.contains(&format!("+ {UUID1} (NVIDIA H200, guest index 1)")),
        "{gpus}"
    );
    assert!(gpus.contains(&format!("  {UUID0}")), "{gpus}");
    let driver = text(&report, "driver");
    assert!(
        driver.contains("NVIDIA-Linux-x86_64-570.86.15.run --no-kernel-module"),
        "{driver}"
    );
    let cuda = text(&report, "cuda");
    assert!(cuda.contains("- 12.8") && cuda.contains("+ 13.0"), "{cuda}");
    assert!(cuda.contains("cuda-toolkit-12-8"), "{cuda}");
    let torch = text(&report, "torch");
    assert!(
        torch.contains("- 4 (tp)") && torch.contains("+ 2 (torch"),
        "{torch}"
    );
}

fn ok_sections() -> Sections {
    parse_sections(&fixture("h200x2/check-ok-probe.raw"))
}

fn set(sections: &mut Sections, name: &str, output: &str, status: i32) {
    sections.insert(
        name.into(),
        Section {
            output: output.into(),
            status,
        },
    );
}

#[test]
fn a_driver_library_mismatch_is_drift_with_the_remedy() {
    let mut s = ok_sections();
    set(
        &mut s,
        "smi-list",
        &fixture("handmade/smi-mismatch.txt"),
        18,
    );
    set(
        &mut s,
        "smi-version",
        &fixture("handmade/smi-mismatch.txt"),
        18,
    );
    set(
        &mut s,
        "libs",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15\n/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15\n",
        0,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "gpus"), CheckStatus::Drift);
    assert_eq!(status(&report, "driver"), CheckStatus::Drift);
    let driver = text(&report, "driver");
    assert!(
        driver.contains(
            "driver/library version mismatch: userspace 570.86, kernel module 580.159.04"
        ),
        "{driver}"
    );
    assert!(
        driver.contains("- 580.159.04 (the node's kernel module)"),
        "{driver}"
    );
    assert!(
        driver.contains("+ 570.86.15 (/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15)"),
        "{driver}"
    );
    assert!(
        driver.contains("NVIDIA-Linux-x86_64-580.159.04.run --no-kernel-module"),
        "{driver}"
    );
    assert!(driver.contains("reboot the node"), "{driver}");
}

#[test]
fn a_stale_userspace_library_is_drift_even_when_nvml_answers() {
    let mut s = ok_sections();
    let libs = format!(
        "{}/usr/lib/x86_64-linux-gnu/libcuda.so.575.51.03\n",
        fixture("h200x2/libs-ldconfig.txt")
    );
    set(&mut s, "libs", &libs, 0);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    let driver = text(&report, "driver");
    assert_eq!(status(&report, "driver"), CheckStatus::Drift, "{driver}");
    assert!(driver.contains("+ 575.51.03 (/usr/lib/x86_64-linux-gnu/libcuda.so.575.51.03)"));
}

#[test]
fn the_driver_version_falls_back_to_nvml_without_library_files() {
    let mut s = ok_sections();
    set(&mut s, "libs", "", 0);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "driver"), CheckStatus::Ok);
    assert!(text(&report, "driver").contains("NVML 580.159 matches"));
    set(&mut s, "smi-version", "", 127);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "driver"), CheckStatus::Drift);
    assert!(text(&report, "driver").contains("no NVIDIA userspace driver found"));
}

#[test]
fn a_missing_gpu_is_listed() {
    let mut s = ok_sections();
    let first_only = fixture("h200x2/smi-L.txt")
        .lines()
        .next()
        .unwrap()
        .to_string();
    set(&mut s, "smi-list", &first_only, 0);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "gpus"), CheckStatus::Drift);
    let gpus = text(&report, "gpus");
    assert!(
        gpus.contains("the guest sees 1 GPU(s), 2 selected: 1 missing, 0 not selected"),
        "{gpus}"
    );
    assert!(gpus.contains(&format!("- {UUID1}")), "{gpus}");
}

#[test]
fn uuids_compare_without_case() {
    let mut expect = ok_expectations();
    expect.gpus = vec![UUID0.to_uppercase(), UUID1.into()];
    let report = checks::evaluate_guest(&expect, &ok_sections());
    assert_eq!(status(&report, "gpus"), CheckStatus::Ok);
}

#[test]
fn guest_nvml_failures_name_their_cause() {
    let mut s = ok_sections();
    set(
        &mut s,
        "smi-list",
        &fixture("handmade/smi-nvml-unknown-error.txt"),
        255,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert!(text(&report, "gpus").contains("lxc.cgroup2.devices.allow"));
    set(
        &mut s,
        "smi-list",
        &fixture("handmade/smi-no-driver.txt"),
        9,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert!(text(&report, "gpus").contains("/dev/nvidia-uvm"));
    set(&mut s, "smi-list", "sh: 1: nvidia-smi: not found\n", 127);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert!(text(&report, "gpus").contains("nvidia-smi is not installed in the guest"));
}

#[test]
fn nvcc_absent_as_the_shell_said_on_the_h200_machine() {
    let mut s = ok_sections();
    set(&mut s, "nvcc", &fixture("h200x2/nvcc-missing.txt"), 127);
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "cuda"), CheckStatus::Drift);
    let cuda = text(&report, "cuda");
    assert!(
        cuda.contains("no nvcc at /usr/local/cuda-13.0/bin/nvcc"),
        "{cuda}"
    );
    assert!(cuda.contains("cuda-toolkit-13-0"), "{cuda}");
}

#[test]
fn a_driver_too_old_for_the_toolkit_is_drift() {
    let mut s = ok_sections();
    set(
        &mut s,
        "smi-version",
        &fixture("handmade/smi-version-570.txt"),
        0,
    );
    let mut expect = ok_expectations();
    expect.driver_version = Some("570.86.15".into());
    set(&mut s, "libs", "/usr/lib/libcuda.so.570.86.15\n", 0);
    let report = checks::evaluate_guest(&expect, &s);
    assert_eq!(status(&report, "driver"), CheckStatus::Ok);
    assert_eq!(status(&report, "cuda"), CheckStatus::Drift);
    assert!(
        text(&report, "cuda")
            .contains("the driver supports CUDA up to 12.8, older than the toolkit 13.0")
    );
}

#[test]
fn torch_absent_is_skipped_and_blind_torch_is_drift() {
    let mut s = ok_sections();
    set(
        &mut s,
        "torch",
        "{\"torch\": null, \"error\": \"ModuleNotFoundError: No module named 'torch'\"}\n",
        0,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "torch"), CheckStatus::Skipped);
    assert!(text(&report, "torch").contains("torch is not installed in /opt/torch/.venv"));
    assert!(!report.drifted());

    // What torch printed on the H200 machine with CUDA_VISIBLE_DEVICES empty.
    set(
        &mut s,
        "torch",
        &fixture("h200x2/torch-probe-novisible.txt"),
        0,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert_eq!(status(&report, "torch"), CheckStatus::Drift);
    let torch = text(&report, "torch");
    assert!(
        torch.contains("sees 0 GPU(s), the service's tp is 2"),
        "{torch}"
    );
    assert!(torch.contains("torch cannot use the GPUs"), "{torch}");

    set(
        &mut s,
        "torch",
        "sh: 1: /opt/torch/.venv/bin/python: not found\n",
        127,
    );
    let report = checks::evaluate_guest(&ok_expectations(), &s);
    assert!(text(&report, "torch").contains("no python at /opt/torch/.venv/bin/python"));
}

#[test]
fn checks_not_asked_for_are_not_run() {
    let mut expect = ok_expectations();
    expect.cuda = None;
    expect.torch = None;
    let probe = checks::guest_probe(&expect).script();
    assert!(!probe.contains("nvcc") && !probe.contains("import torch"));
    let report = checks::evaluate_guest(&expect, &ok_sections());
    let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, ["gpus", "driver"]);
}

fn write_exec(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    assert!(
        Command::new("chmod")
            .arg("+x")
            .arg(path)
            .status()
            .unwrap()
            .success()
    );
}

/// A guest copy under `dir`: stand-in nvidia-smi, ldconfig, nvcc and venv python printing
/// the captured text, the driver libraries as empty files, /proc's driver version.
fn fake_guest(dir: &Path) -> (GuestExpectations, LocalTransport) {
    let fx = |p: &str| format!("{}/tests/fixtures/gpu/h200x2/{p}", manifest_dir());
    write_exec(
        &dir.join("bin/nvidia-smi"),
        &format!(
            "#!/bin/sh\ncase \"$1\" in\n  -L) cat '{}' ;;\n  --version) cat '{}' ;;\n  *) exit 2 ;;\nesac\n",
            fx("smi-L.txt"),
            fx("smi-version.txt")
        ),
    );
    write_exec(&dir.join("bin/ldconfig"), "#!/bin/sh\nexit 0\n");
    write_exec(
        &dir.join("cuda/bin/nvcc"),
        &format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && cat '{}'\n",
            fx("nvcc.txt")
        ),
    );
    write_exec(
        &dir.join("venv/bin/python"),
        &format!(
            "#!/bin/sh\n[ \"$1\" = -c ] && cat '{}'\n",
            fx("torch-probe.txt")
        ),
    );
    let root = dir.join("guest root");
    for lib in ["libcuda.so.580.159.04", "libnvidia-ml.so.580.159.04"] {
        let p = root.join("usr/lib/x86_64-linux-gnu").join(lib);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }
    let version = root.join("proc/driver/nvidia/version");
    std::fs::create_dir_all(version.parent().unwrap()).unwrap();
    std::fs::write(version, fixture("h200x2/proc-driver-version.txt")).unwrap();
    let expect = GuestExpectations {
        gpus: vec![UUID0.into(), UUID1.into()],
        driver_version: None,
        cuda: Some(CudaExpectation {
            release: "13.0".into(),
            home: dir.join("cuda").display().to_string(),
        }),
        torch: Some(TorchExpectation {
            venv: dir.join("venv").display().to_string(),
            tp: 2,
        }),
        root: root.display().to_string(),
    };
    let transport = LocalTransport::with_env(vec![
        (
            "PATH".into(),
            format!("{}/bin:/usr/bin:/bin", dir.display()),
        ),
        ("LD_LIBRARY_PATH".into(), String::new()),
    ]);
    (expect, transport)
}

#[test]
fn runs_through_the_local_transport_in_one_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let (expect, transport) = fake_guest(tmp.path());
    let (report, raw) = checks::run_guest_checks_raw(&transport, &expect).unwrap();
    assert_eq!(raw.matches("@@provision-begin").count(), 6, "{raw}");
    for c in &report.checks {
        assert_eq!(c.status, CheckStatus::Ok, "{c:?}");
    }
    assert!(
        text(&report, "driver")
            .contains("guest root/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04")
    );

    let mut wrong = expect.clone();
    wrong.torch.as_mut().unwrap().tp = 4;
    wrong.driver_version = Some("570.86.15".into());
    let report = checks::run_guest_checks(&transport, &wrong).unwrap();
    assert_eq!(status(&report, "torch"), CheckStatus::Drift);
    assert_eq!(status(&report, "driver"), CheckStatus::Drift);
    assert!(report.drifted());
}

/// A value of `h200x1-userspace/host/vars.txt` (what the device run used).
fn userspace_var(name: &str) -> String {
    fixture("h200x1-userspace/host/vars.txt")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in vars.txt"))
}

/// The agent's answer to the userspace probe, as `provision agent` printed it in the
/// container (`h200x1-userspace/<phase>/probe.txt`).
fn userspace_facts(phase: &str) -> provision::resources::wire::Facts {
    use provision::resources::wire::{Event, Facts};
    let text = fixture(&format!("h200x1-userspace/{phase}/probe.txt"));
    let event: Event = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    let Event::Facts { answers, .. } = event else {
        panic!("not a facts event: {text}")
    };
    Facts::Read(
        answers
            .into_iter()
            .map(|a| (a.probe, a.fact.expect("answered")))
            .collect(),
    )
}

#[test]
fn installed_userspace_checks_ok_in_a_container_of_its_own_on_the_h200_machine() {
    let version = userspace_var("VERSION");
    let expect = GuestExpectations {
        gpus: vec![userspace_var("UUID")],
        driver_version: Some(version.clone()),
        cuda: Some(CudaExpectation {
            release: "13.0".into(),
            home: "/usr/local/cuda-13.0".into(),
        }),
        torch: Some(TorchExpectation {
            venv: "/opt/torch/.venv".into(),
            tp: 1,
        }),
        root: String::new(),
    };
    let report = checks::evaluate_guest(
        &expect,
        &parse_sections(&fixture("h200x1-userspace/after/check-ok-probe.raw")),
    );
    let there: serde_json::Value =
        serde_json::from_str(&fixture("h200x1-userspace/after/check-ok-json.txt")).unwrap();
    assert_eq!(
        verdicts(&serde_json::to_value(&report).unwrap()),
        verdicts(&there)
    );
    assert!(!report.drifted(), "{report:?}");
    // The libraries are the installed ones in the container's own /usr/lib, not the
    // machine's /usr/local/nvidia (the earlier h200x1-lxc run bound that in).
    let driver = text(&report, "driver");
    assert!(
        driver.contains(&format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{version}")),
        "{driver}"
    );
    assert!(!driver.contains("/usr/local/nvidia"), "{driver}");
    // Another module version on the node is named by the same probe output.
    let other = GuestExpectations {
        driver_version: Some("580.95.05".into()),
        ..expect
    };
    let report = checks::evaluate_guest(
        &other,
        &parse_sections(&fixture("h200x1-userspace/after/check-ok-probe.raw")),
    );
    assert_eq!(status(&report, "driver"), CheckStatus::Drift);
    assert!(text(&report, "driver").contains("differs from the kernel module 580.95.05"));
}

#[test]
fn the_userspace_resource_reads_the_h200_container_as_installed_only_after_the_install() {
    use provision::plan::Action;
    use provision::resources::Resource;
    use provision::resources::gpu_userspace::{GpuUserspaceSpec, Installer};
    let version = userspace_var("VERSION");
    let spec = GpuUserspaceSpec {
        version: version.clone(),
        installer: Some(Installer {
            url: userspace_var("URL"),
            sha256: userspace_var("SHA"),
            version: Some(version.clone()),
        }),
        packages: vec![],
    };
    let before = spec
        .diff(&userspace_facts("before"))
        .unwrap()
        .expect("a change");
    assert_eq!(before.action, Action::Create);
    assert_eq!(spec.diff(&userspace_facts("after")).unwrap(), None);
    // The node's module moved on: the installed userspace is drift, an update.
    let newer = GpuUserspaceSpec {
        version: "580.95.05".into(),
        installer: None,
        packages: vec!["libnvidia-compute-580=580.95.05-0ubuntu1".into()],
    };
    let d = newer
        .diff(&userspace_facts("after"))
        .unwrap()
        .expect("drift");
    assert_eq!(d.action, Action::Update);
}
