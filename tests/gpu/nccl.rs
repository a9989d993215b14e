//! The NCCL preflight. First what the launcher printed on the two-H200 machine (healthy runs,
//! a provoked hang, a crash, too few GPUs, no torch), parsed as the CLI parses it. Then the
//! launcher's process handling run for real here, with `tests/fixtures/gpu/fake_torch`
//! standing in for torch (CI has no GPU): its all-reduce is a real exchange between the rank
//! processes, so a rank that never joins really blocks the others. These need `python3`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use provision::gpu::nccl::{
    self, DetectedBy, NcclError, NcclOptions, NcclOutcome, NcclRun, Simulate,
};
use provision::gpu::nccl_report::verdict;
use provision::inventory::container::GpuSelector;
use provision::transport::local::LocalTransport;

use crate::guard::within;

/// The checkout, read when the test runs (cargo sets it), so a test binary shared between
/// checkouts through one target folder still reads this checkout's fixtures.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

fn fixture(path: &str) -> String {
    let full = format!("{}/tests/fixtures/gpu/{path}", manifest_dir());
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

fn device_run(name: &str) -> NcclRun {
    let (start, outcome) = nccl::parse_events(&fixture(&format!("h200x2/{name}.raw")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    NcclRun {
        outcome,
        start,
        wall_s: 0.0,
        launcher_stdout: String::new(),
    }
}

/// The JSON the CLI printed on the machine (after its status line on stderr).
fn device_json(name: &str) -> serde_json::Value {
    let text = fixture(&format!("h200x2/{name}.txt"));
    let json = &text[text.find('{').unwrap()..];
    let json = &json[..json.rfind("\n}").unwrap() + 2];
    serde_json::from_str(json).unwrap()
}

#[test]
fn healthy_runs_on_two_h200s() {
    for name in [
        "nccl-healthy-1",
        "nccl-healthy-2",
        "nccl-healthy-3",
        "nccl-uuids",
    ] {
        let run = device_run(name);
        let NcclOutcome::Healthy(h) = &run.outcome else {
            panic!("{name}: {:?}", run.outcome)
        };
        assert_eq!(h.world, 2);
        assert_eq!(h.device_names, ["NVIDIA H200", "NVIDIA H200"]);
        assert_eq!(h.bytes, 64 << 20);
        // Two ranks: bus bandwidth equals algorithm bandwidth (2(n-1)/n = 1).
        assert!((h.busbw_gbps - h.algbw_gbps).abs() < 1e-9);
        assert!(h.busbw_gbps > 200.0, "{name}: {}", h.busbw_gbps);
        let start = run.start.as_ref().unwrap();
        assert_eq!(start.torch, "2.11.0+cu130");
        assert_eq!(start.nccl, "2.28.9");
        assert_eq!(
            start.nccl_env.get("NCCL_NVLS_ENABLE").map(String::as_str),
            Some("0")
        );
        // What the library parses is what the binary printed there.
        let there = device_json(name);
        let mut here = serde_json::to_value(&run).unwrap();
        here["wall_s"] = there["wall_s"].clone();
        assert_eq!(here, there, "{name}");
        let text = verdict(&run, "0,1").unwrap();
        assert!(
            text.contains("healthy") && text.contains("bus bandwidth"),
            "{text}"
        );
    }
}

#[test]
fn p2p_disabled_is_healthy_but_an_order_of_magnitude_slower() {
    let NcclOutcome::Healthy(p2p) = device_run("nccl-p2p-disabled").outcome else {
        panic!()
    };
    let NcclOutcome::Healthy(normal) = device_run("nccl-healthy-1").outcome else {
        panic!()
    };
    assert!(p2p.busbw_gbps * 5.0 < normal.busbw_gbps);
    let start = device_run("nccl-p2p-disabled").start.unwrap();
    assert_eq!(
        start.nccl_env.get("NCCL_P2P_DISABLE").map(String::as_str),
        Some("1")
    );
}

#[test]
fn provoked_hangs_on_two_h200s_are_detected_at_the_deadline() {
    for (name, deadline, waiting, hanging) in
        [("nccl-hang-10s", 10.0, 0, 1), ("nccl-hang-20s", 20.0, 1, 0)]
    {
        let run = device_run(name);
        let NcclOutcome::Hung {
            after_s,
            timeout_s,
            detected_by,
            ranks,
        } = &run.outcome
        else {
            panic!("{name}: {:?}", run.outcome)
        };
        assert_eq!(*timeout_s, deadline);
        assert!(
            *after_s >= deadline && *after_s < deadline + 1.0,
            "{after_s}"
        );
        assert_eq!(*detected_by, DetectedBy::Launcher);
        assert_eq!(ranks[waiting].stage, "nccl_init");
        assert_eq!(ranks[hanging].stage, "simulated_hang");
        let err = verdict(&run, "0,1").unwrap_err().render(false);
        assert!(err.contains(&format!("hung after {after_s:.1} s")), "{err}");
        for remedy in [
            "NCCL_P2P_DISABLE=1",
            "NCCL_IB_DISABLE=1",
            "iommu=pt",
            "NCCL_DEBUG=INFO",
        ] {
            assert!(err.contains(remedy), "{remedy} missing from {err}");
        }
    }
    // With NCCL_DEBUG=INFO the waiting rank's last NCCL lines show where it stopped.
    let run = device_run("nccl-hang-10s");
    let NcclOutcome::Hung { ranks, .. } = &run.outcome else {
        panic!()
    };
    assert!(
        ranks[0]
            .stdout_tail
            .last()
            .unwrap()
            .contains("ncclCommInitRankConfig"),
        "{:?}",
        ranks[0].stdout_tail
    );
    let err = verdict(&run, "0,1").unwrap_err().render(false);
    assert!(
        err.contains("| vm:2128:2128 [0] NCCL INFO ncclCommInitRankConfig"),
        "{err}"
    );
}

#[test]
fn a_crashing_rank_on_two_h200s_shows_its_traceback() {
    let run = device_run("nccl-crash");
    let NcclOutcome::Crashed { rank, code, .. } = &run.outcome else {
        panic!("{:?}", run.outcome)
    };
    assert_eq!((*rank, *code), (1, 1));
    let err = verdict(&run, "0,1").unwrap_err().render(false);
    assert!(err.contains("rank 1 exited with status 1"), "{err}");
    assert!(err.contains("RuntimeError: simulated crash"), "{err}");
}

#[test]
fn too_few_gpus_and_no_torch_on_the_h200_machine() {
    match device_run("nccl-too-few").outcome {
        NcclOutcome::TooFewGpus {
            wanted, visible, ..
        } => {
            assert_eq!((wanted, visible), (vec![0, 1, 2], 2))
        }
        other => panic!("{other:?}"),
    }
    match device_run("nccl-too-few-cvd").outcome {
        NcclOutcome::TooFewGpus {
            visible,
            cuda_visible_devices,
            ..
        } => assert_eq!((visible, cuda_visible_devices.as_deref()), (1, Some("0"))),
        other => panic!("{other:?}"),
    }
    match device_run("nccl-torch-missing").outcome {
        NcclOutcome::TorchMissing { python, error } => {
            assert_eq!(python, "/usr/bin/python3");
            assert_eq!(error, "No module named 'torch'");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn output_without_a_verdict_is_an_error() {
    assert!(nccl::parse_events("").is_err());
    let start_only: String = fixture("h200x2/nccl-healthy-1.raw")
        .lines()
        .take(1)
        .collect();
    assert!(nccl::parse_events(&start_only).is_err());
}

// From here on: the launcher for real, with the stand-in torch.

fn fake_transport(dir: &Path, gpus: u32, extra: &[(&str, &str)]) -> LocalTransport {
    let mut env = vec![
        (
            "PYTHONPATH".to_string(),
            format!("{}/tests/fixtures/gpu/fake_torch", manifest_dir()),
        ),
        ("FAKE_TORCH_DIR".to_string(), dir.display().to_string()),
        ("FAKE_TORCH_GPUS".to_string(), gpus.to_string()),
        // No __pycache__ left in the fixture folder.
        ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    LocalTransport::with_env(env)
}

fn options(n: u32) -> NcclOptions {
    let mut o = NcclOptions::new((0..n).map(GpuSelector::Index).collect(), "python3");
    o.timeout = Duration::from_secs(20);
    o.bytes = 1 << 20;
    o.iters = 5;
    o.warmup = 2;
    o
}

#[test]
fn launcher_runs_one_process_per_gpu_with_the_service_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options(3);
    opts.env = vec![
        ("NCCL_P2P_DISABLE".into(), "1".into()),
        ("HF_TOKEN".into(), "hf_not_printed".into()),
    ];
    let run = nccl::run_preflight(&fake_transport(tmp.path(), 3, &[]), &opts).unwrap();
    let NcclOutcome::Healthy(h) = &run.outcome else {
        panic!("{:?}", run.outcome)
    };
    assert_eq!(h.world, 3);
    assert_eq!(h.iters, 5);
    assert!((h.busbw_gbps - h.algbw_gbps * 4.0 / 3.0).abs() < 1e-9);
    let start = run.start.as_ref().unwrap();
    assert_eq!(start.devices, [0, 1, 2]);
    assert_eq!(start.nccl_env["NCCL_P2P_DISABLE"], "1");
    // NVLink multicast stays off in every rank unless the service says otherwise.
    assert_eq!(start.nccl_env["NCCL_NVLS_ENABLE"], "0");
    assert!(!run.launcher_stdout.contains("hf_not_printed"));
    // Each of the three ranks wrote its share of every all-reduce: 1 rendezvous, 1 sum
    // check, 2 warm-ups, 5 timed.
    let files = std::fs::read_dir(tmp.path()).unwrap().count();
    assert_eq!(files, 3 * 9);
}

#[test]
fn a_rank_that_never_joins_is_reported_hung_at_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options(2);
    opts.timeout = Duration::from_secs(3);
    opts.simulate = Some(Simulate::HangRank(1));
    // The hung rank never ends by itself: returning at all is the launcher's limit at
    // work (the guard only keeps a regression from hanging the test).
    let transport = fake_transport(tmp.path(), 2, &[]);
    let run = within(
        Duration::from_secs(120),
        "the launcher's 3 s deadline for a rank that never joins",
        move || nccl::run_preflight(&transport, &opts).unwrap(),
    );
    let NcclOutcome::Hung {
        after_s,
        detected_by,
        ranks,
        ..
    } = &run.outcome
    else {
        panic!("{:?}", run.outcome)
    };
    assert_eq!(*detected_by, DetectedBy::Launcher);
    assert!(*after_s >= 3.0, "{after_s}");
    assert_eq!(ranks[0].stage, "nccl_init");
    assert_eq!(ranks[1].stage, "simulated_hang");
    // The launcher killed its ranks: no process with this run's environment is left.
    assert_eq!(
        processes_with_env(&format!("FAKE_TORCH_DIR={}", tmp.path().display())),
        0
    );
}

#[test]
fn the_leftover_process_scan_sees_a_live_process() {
    let entry = format!("PROVISION_GPU_TEST_MARK={}", std::process::id());
    let (k, v) = entry.split_once('=').unwrap();
    let mut child = Command::new("sleep").arg("30").env(k, v).spawn().unwrap();
    // The child's /proc environ is read as it becomes visible (once seen in CI as 0 right
    // after spawn on two loaded cores): wait for it, bounded; never seen fails below.
    let until = Instant::now() + Duration::from_secs(10);
    let mut seen = processes_with_env(&entry);
    while seen == 0 && Instant::now() < until {
        std::thread::yield_now();
        seen = processes_with_env(&entry);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(seen, 1);
    assert_eq!(processes_with_env(&entry), 0);
}

/// How many processes have `entry` in their environment.
fn processes_with_env(entry: &str) -> usize {
    let needle = format!("{entry}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("environ")).ok())
        .filter(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .count()
}

#[test]
fn a_crashing_rank_is_reported_with_its_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options(2);
    opts.simulate = Some(Simulate::CrashRank(0));
    let run = nccl::run_preflight(&fake_transport(tmp.path(), 2, &[]), &opts).unwrap();
    let NcclOutcome::Crashed {
        rank, code, ranks, ..
    } = &run.outcome
    else {
        panic!("{:?}", run.outcome)
    };
    assert_eq!((*rank, *code), (0, 1));
    assert!(ranks[0].stderr_tail.join("\n").contains("simulated crash"));
}

#[test]
fn a_wrong_sum_is_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let transport = fake_transport(tmp.path(), 2, &[("FAKE_TORCH_WRONG_SUM", "1")]);
    let run = nccl::run_preflight(&transport, &options(2)).unwrap();
    let NcclOutcome::Crashed { wrong_sum, .. } = &run.outcome else {
        panic!("{:?}", run.outcome)
    };
    assert_eq!(wrong_sum.as_ref().unwrap()["want"], 3.0);
    let err = verdict(&run, "0,1").unwrap_err().render(false);
    assert!(err.contains("got a wrong all-reduce sum"), "{err}");
}

#[test]
fn fewer_visible_gpus_than_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let run = nccl::run_preflight(&fake_transport(tmp.path(), 1, &[]), &options(2)).unwrap();
    assert!(matches!(
        run.outcome,
        NcclOutcome::TooFewGpus { visible: 1, .. }
    ));
    // GPUs named by UUID become CUDA_VISIBLE_DEVICES, in order.
    let a = "GPU-4a0f4724-ce2e-401e-401a-c916ec5586e7";
    let b = "GPU-bd921741-4472-2f2e-9847-d8171173854c";
    let mut opts = options(2);
    opts.gpus = vec![GpuSelector::Uuid(a.into()), GpuSelector::Uuid(b.into())];
    let run = nccl::run_preflight(&fake_transport(tmp.path(), 1, &[]), &opts).unwrap();
    match run.outcome {
        NcclOutcome::TooFewGpus {
            cuda_visible_devices,
            ..
        } => assert_eq!(cuda_visible_devices.unwrap(), format!("{a},{b}")),
        other => panic!("{other:?}"),
    }
}

fn write_exec(path: &Path, text: &str) {
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

#[test]
fn a_python_without_torch() {
    let tmp = tempfile::tempdir().unwrap();
    // -I -S: no site-packages and no PYTHONPATH, so no torch whatever this machine has.
    let python = tmp.path().join("python-without-torch");
    write_exec(&python, "#!/bin/sh\nexec python3 -I -S \"$@\"\n");
    let mut opts = options(2);
    opts.python = python.display().to_string();
    let run = nccl::run_preflight(&LocalTransport::default(), &opts).unwrap();
    match run.outcome {
        NcclOutcome::TorchMissing { error, .. } => assert!(error.contains("torch"), "{error}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_python_that_does_not_exist() {
    let mut opts = options(2);
    opts.python = "/nonexistent/ml-env/bin/python".into();
    match nccl::run_preflight(&LocalTransport::default(), &opts) {
        Err(NcclError::PythonNotFound { python, output }) => {
            assert_eq!(python, "/nonexistent/ml-env/bin/python");
            assert!(output.contains("not found"), "{output}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_launcher_that_never_reports_is_killed_by_the_transport() {
    let tmp = tempfile::tempdir().unwrap();
    let python = tmp.path().join("stuck-python");
    // It would end by itself only after an hour.
    write_exec(&python, "#!/bin/sh\nsleep 3600\n");
    let mut opts = options(2);
    opts.python = python.display().to_string();
    opts.timeout = Duration::from_secs(1);
    opts.grace = Duration::from_millis(500);
    // Killed, not waited out.
    let run = within(
        Duration::from_secs(120),
        "the transport's kill of a launcher that never reports (timeout 1 s, grace 0.5 s)",
        move || nccl::run_preflight(&LocalTransport::default(), &opts).unwrap(),
    );
    match &run.outcome {
        NcclOutcome::Hung {
            detected_by,
            after_s,
            ranks,
            ..
        } => {
            assert_eq!(*detected_by, DetectedBy::Transport);
            assert!(*after_s >= 1.5, "{after_s}");
            assert!(ranks.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let err = verdict(&run, "0,1").unwrap_err().render(false);
    assert!(err.contains("the launcher itself never reported"), "{err}");
}

#[test]
fn bad_options_are_refused_before_anything_runs() {
    let mut opts = options(2);
    opts.simulate = Some(Simulate::HangRank(2));
    assert!(matches!(
        nccl::run_preflight(&LocalTransport::default(), &opts),
        Err(NcclError::Options(_))
    ));
}
