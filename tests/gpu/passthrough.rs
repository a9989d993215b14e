//! GPU passthrough lines from live node facts, against the run on a lent H200
//! (`tests/fixtures/gpu/h200x1-lxc/`, see its README): the lines rendered here from the node
//! facts captured there are the lines the real LXC container was started with; what the
//! container printed (nvidia-smi, a torch matmul, the guest checks, the NCCL preflight)
//! passes the same parsers and checks; and without the nvidia allow line the GPU was denied.

use crate::cli_support::Provision;
use crate::gpunode;

use assert_cmd::Command;
use gpunode::{fake_node, fake_smi, fixture};
use provision::compile::render::Renderer;
use provision::compile::render::passthrough::{PassthroughError, passthrough_lines};
use provision::gpu::checks::{
    self, CheckStatus, CudaExpectation, GuestExpectations, TorchExpectation,
};
use provision::gpu::facts::{NodeFacts, node_facts_from_sections};
use provision::gpu::nccl::{self, NcclOutcome};
use provision::gpu::parse;
use provision::gpu::probe::{Section, parse_sections};
use provision::inventory::container::{GpuMethod, GpuSelector};

const X1: &str = "h200x1-lxc";

fn x1(path: &str) -> String {
    fixture(&format!("{X1}/{path}"))
}

/// `KEY=VALUE` lines the device run recorded (the GPU's UUID, the CUDA release and home,
/// the venv).
fn var(name: &str) -> String {
    x1("host/vars.txt")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in vars.txt"))
}

fn host_facts() -> NodeFacts {
    node_facts_from_sections(&parse_sections(&x1("host/facts-probe.raw")), "")
}

fn lines(facts: &NodeFacts, gpus: &[GpuSelector], method: GpuMethod) -> String {
    passthrough_lines(facts, gpus, method, &Renderer::new(None).unwrap())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn uuid() -> GpuSelector {
    GpuSelector::Uuid(var("UUID"))
}

/// A major from the captured /proc/devices.
fn major(name: &str) -> u32 {
    parse::parse_proc_devices(&x1("host/proc-devices.txt"))
        .unwrap()
        .into_iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name} in /proc/devices"))
        .major
}

#[test]
fn the_lines_the_container_ran_with_come_from_the_captured_node_facts() {
    let facts = host_facts();
    assert!(facts.problems.is_empty(), "{:?}", facts.problems);
    let here = lines(&facts, &[uuid()], GpuMethod::Lxc);
    // What the binary printed on the machine, and what went into the container's config.
    assert_eq!(here, x1("host/passthrough-lxc.txt"));
    assert_eq!(here, x1("host/applied-lines.txt"));
    let uvm = major("nvidia-uvm");
    let nvidia = major("nvidia");
    assert!(here.contains(&format!("lxc.cgroup2.devices.allow: c {nvidia}:* rwm\n")));
    assert!(here.contains(&format!("lxc.cgroup2.devices.allow: c {uvm}:* rwm\n")));
    assert!(
        here.contains("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n")
    );
    // No line for a node the machine does not have (nvidia-modeset).
    assert!(!here.contains("modeset"), "{here}");

    // The config LXC read: every generated line in LXC's syntax, after `deny = a`.
    let config = x1("host/config-gpu.txt");
    let deny = config.find("lxc.cgroup2.devices.deny = a").unwrap();
    for line in here.lines() {
        let (key, value) = line.split_once(": ").unwrap();
        let at = config
            .find(&format!("{key} = {value}\n"))
            .unwrap_or_else(|| panic!("{line} is not in the container's config"));
        assert!(at > deny, "{line} comes before the deny-all rule");
    }
    // A second read of the node (the passthrough command's own) found the same facts.
    let again = node_facts_from_sections(&parse_sections(&x1("host/passthrough-probe.raw")), "");
    assert_eq!(again, facts);
    // The facts JSON the binary printed there is what the library reads here.
    let there: serde_json::Value = serde_json::from_str(&x1("host/facts-json.txt")).unwrap();
    assert_eq!(serde_json::to_value(&facts).unwrap(), there);
}

#[test]
fn index_and_uuid_give_the_same_lines_and_dev_entries_as_printed_there() {
    let facts = host_facts();
    assert_eq!(
        lines(&facts, &[GpuSelector::Index(0)], GpuMethod::Lxc),
        x1("host/passthrough-lxc-index.txt")
    );
    let dev = lines(&facts, &[uuid()], GpuMethod::Dev);
    assert_eq!(dev, x1("host/passthrough-dev.txt"));
    assert!(dev.starts_with("dev0: /dev/nvidia0\n"), "{dev}");
    assert!(!dev.contains("lxc."), "{dev}");
}

#[test]
fn a_gpu_the_node_lacks_is_refused_as_the_binary_refused_it() {
    let err = passthrough_lines(
        &host_facts(),
        &[GpuSelector::Index(1)],
        GpuMethod::Lxc,
        &Renderer::new(None).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, PassthroughError::NoSuchGpu { .. }), "{err:?}");
    let printed = x1("host/passthrough-absent.txt");
    assert!(printed.contains(&format!("error: {err}")), "{printed}");
    assert!(printed.contains(err.hint()), "{printed}");
    assert!(printed.contains(&var("UUID")), "{printed}");
}

/// The captured probe with `name`'s output replaced.
fn edited(name: &str, f: impl Fn(&str) -> String) -> NodeFacts {
    let mut sections = parse_sections(&x1("host/facts-probe.raw"));
    let old = sections[name].output.clone();
    sections.insert(
        name.to_string(),
        Section {
            output: f(&old),
            status: 0,
        },
    );
    node_facts_from_sections(&sections, "")
}

#[test]
fn the_majors_are_the_nodes_not_constants() {
    let uvm = major("nvidia-uvm");
    let moved = |text: &str| text.replace(&format!("{uvm} nvidia-uvm\n"), "511 nvidia-uvm\n");
    // The driver re-registered under 511 but the nodes still carry the old major: refused.
    let stale = edited("proc-devices", moved);
    let err = passthrough_lines(
        &stale,
        &[uuid()],
        GpuMethod::Lxc,
        &Renderer::new(None).unwrap(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "/dev/nvidia-uvm has major {uvm}, but /proc/devices gives `nvidia-uvm` major 511"
        )),
        "{err}"
    );
    assert!(err.hint().contains("nvidia-modprobe"));

    // Nodes remade under 511 too (stat prints majors in hex): the lines follow.
    let mut sections = parse_sections(&x1("host/facts-probe.raw"));
    for (name, edit) in [
        (
            "proc-devices",
            (
                format!("{uvm} nvidia-uvm\n"),
                "511 nvidia-uvm\n".to_string(),
            ),
        ),
        ("dev-nodes", (format!("|{uvm:x}|"), "|1ff|".to_string())),
    ] {
        let s = sections.get_mut(name).unwrap();
        assert!(s.output.contains(&edit.0), "{name}: {}", s.output);
        s.output = s.output.replace(&edit.0, &edit.1);
    }
    let here = lines(
        &node_facts_from_sections(&sections, ""),
        &[uuid()],
        GpuMethod::Lxc,
    );
    assert!(
        here.contains("lxc.cgroup2.devices.allow: c 511:* rwm\n"),
        "{here}"
    );
    assert!(!here.contains(&format!("c {uvm}:*")), "{here}");

    // Without nvidia-uvm loaded there is nothing to allow: refused, with the remedy.
    let unloaded = edited("proc-devices", |t| {
        t.replace(&format!("{uvm} nvidia-uvm\n"), "")
    });
    let err = passthrough_lines(
        &unloaded,
        &[uuid()],
        GpuMethod::Lxc,
        &Renderer::new(None).unwrap(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`nvidia-uvm` is not in the node's /proc/devices"
    );
    assert!(err.hint().contains("modprobe nvidia-uvm"));
}

#[test]
fn one_gpu_of_two_gets_only_its_own_node() {
    // The two-H200 machine's facts (h200x2): GPU 1 alone, then both by UUID.
    let facts = node_facts_from_sections(&parse_sections(&fixture("h200x2/facts-probe.raw")), "");
    let uuid1 = GpuSelector::Uuid("GPU-bd921741-4472-2f2e-9847-d8171173854c".into());
    let uuid0 = GpuSelector::Uuid("GPU-4a0f4724-ce2e-401e-401a-c916ec5586e7".into());
    let one = lines(&facts, std::slice::from_ref(&uuid1), GpuMethod::Lxc);
    assert!(one.contains("/dev/nvidia1 dev/nvidia1"), "{one}");
    assert!(!one.contains("/dev/nvidia0 "), "{one}");
    let both = lines(&facts, &[uuid0.clone(), uuid1], GpuMethod::Dev);
    assert!(
        both.starts_with("dev0: /dev/nvidia0\ndev1: /dev/nvidia1\n"),
        "{both}"
    );
    let err = passthrough_lines(
        &facts,
        &[uuid0, GpuSelector::Index(0)],
        GpuMethod::Lxc,
        &Renderer::new(None).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, PassthroughError::Duplicate { .. }), "{err}");
}

#[test]
fn inside_the_container_nvidia_smi_listed_exactly_the_selected_gpu() {
    let listed = parse::parse_smi_list(&x1("ct/smi-L.txt")).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].uuid, var("UUID"));
    assert_eq!(listed[0].index, 0);
    let dev = x1("ct/dev-ls.txt");
    for node in ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(dev.contains(node), "{dev}");
    }
}

/// The last JSON line a matmul run printed.
fn matmul(path: &str) -> serde_json::Value {
    let text = x1(path);
    serde_json::from_str(text.lines().rfind(|l| l.starts_with('{')).unwrap()).unwrap()
}

#[test]
fn a_torch_matmul_ran_in_the_container_as_fast_as_on_the_host() {
    let ct = matmul("ct/matmul.txt");
    let host = matmul("host/host-matmul.txt");
    for m in [&ct, &host] {
        assert_eq!(m["ok"], true, "{m}");
        assert_eq!(m["count"], 1, "{m}");
        assert_eq!(m["device"], "NVIDIA H200", "{m}");
    }
    let ratio = ct["tflops"].as_f64().unwrap() / host["tflops"].as_f64().unwrap();
    assert!(ratio > 0.9, "container/host {ratio}");
}

fn expectations(tp: u32) -> GuestExpectations {
    GuestExpectations {
        gpus: vec![var("UUID")],
        driver_version: None,
        cuda: Some(CudaExpectation {
            release: var("CUDA"),
            home: var("NVCC_HOME"),
        }),
        torch: Some(TorchExpectation {
            venv: var("VENV"),
            tp,
        }),
        root: String::new(),
    }
}

#[test]
fn the_guest_checks_pass_on_what_the_container_returned() {
    let report = checks::evaluate_guest(
        &expectations(1),
        &parse_sections(&x1("ct/check-ok-probe.raw")),
    );
    assert!(
        report.checks.iter().all(|c| c.status == CheckStatus::Ok),
        "{report:?}"
    );
    assert!(!report.drifted());
    let there: serde_json::Value = serde_json::from_str(&x1("ct/check-ok-json.txt")).unwrap();
    assert_eq!(serde_json::to_value(&report).unwrap(), there);

    // tp 2 with one GPU passed: torch drifts, with the remedy, as it did there.
    let tp2 = checks::evaluate_guest(
        &expectations(2),
        &parse_sections(&x1("ct/check-tp2-probe.raw")),
    );
    assert!(tp2.drifted());
    let torch = tp2.checks.iter().find(|c| c.name == "torch").unwrap();
    assert_eq!(torch.status, CheckStatus::Drift);
    assert!(torch.remedies.iter().any(|r| r.contains("tp")), "{torch:?}");
    let there: serde_json::Value = serde_json::from_str(&x1("ct/check-tp2.txt")).unwrap();
    assert_eq!(serde_json::to_value(&tp2).unwrap(), there);
}

fn nccl_outcome(path: &str) -> NcclOutcome {
    nccl::parse_events(&x1(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .1
}

#[test]
fn the_nccl_preflight_ran_in_the_container() {
    for i in 1..=3 {
        let NcclOutcome::Healthy(h) = nccl_outcome(&format!("ct/nccl-{i}.raw")) else {
            panic!("ct/nccl-{i}")
        };
        assert_eq!(h.world, 1);
        assert_eq!(h.device_names, ["NVIDIA H200"]);
    }
    match nccl_outcome("ct/nccl-hang.raw") {
        NcclOutcome::Hung { timeout_s, .. } => assert_eq!(timeout_s, 10.0),
        other => panic!("{other:?}"),
    }
    match nccl_outcome("ct/nccl-tp2.raw") {
        NcclOutcome::TooFewGpus {
            wanted, visible, ..
        } => {
            assert_eq!(wanted, [0, 1]);
            assert_eq!(visible, 1);
        }
        other => panic!("{other:?}"),
    }
    assert!(x1("ct/nccl-tp2.txt").contains("hint: check that the container sees every GPU"));
}

#[test]
fn without_an_allow_line_the_gpu_is_denied() {
    let applied = x1("host/applied-lines.txt");
    for (case, driver) in [("no-nvidia", "nvidia"), ("no-uvm", "nvidia-uvm")] {
        let removed = format!("lxc.cgroup2.devices.allow: c {}:* rwm", major(driver));
        let kept = x1(&format!("host/lines-{case}.txt"));
        assert!(applied.contains(&removed));
        assert!(!kept.contains(&removed), "{case}: {kept}");
        assert_eq!(kept.lines().count() + 1, applied.lines().count(), "{case}");
        // The nodes are there; the cgroup rule is what stops them.
        assert!(x1(&format!("{case}/dev-ls.txt")).contains("/dev/nvidia0"));
        assert!(
            x1(&format!("{case}/torch.txt")).ends_with("rc=1\n"),
            "{case}"
        );
    }
    let smi = x1("no-nvidia/smi-L.txt");
    assert!(smi.ends_with("rc=255\n"), "{smi}");
    assert!(matches!(
        parse::classify_smi_failure(&smi),
        parse::SmiFailure::NvmlInit { .. }
    ));
    // nvidia-smi needs no UVM; CUDA does.
    assert!(x1("no-uvm/smi-L.txt").ends_with("rc=0\n"));
}

#[test]
fn the_cli_prints_the_same_lines_from_a_copy_of_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("node");
    fake_node(&root, &format!("{X1}/host"));
    let path = fake_smi(tmp.path(), &format!("{X1}/host"));
    let run = |gpus: &str, method: &str| {
        Command::from_std(
            Provision::new(["gpu", "passthrough", "--gpus", gpus, "--method", method])
                .env("PATH", &path)
                .arg("--root")
                .arg(&root)
                .command(),
        )
        .assert()
    };
    run(&var("UUID"), "lxc")
        .code(0)
        .stdout(x1("host/passthrough-lxc.txt"));
    run("0", "dev")
        .code(0)
        .stdout(x1("host/passthrough-dev.txt"));
    run("1", "lxc")
        .code(1)
        .stdout("")
        .stderr(predicates::str::contains("error: the node has no GPU 1"))
        .stderr(predicates::str::contains(
            "hint: select GPUs by the index or UUID",
        ));
    run("0", "vfio")
        .code(1)
        .stderr(predicates::str::contains("use `dev` or `lxc`"));
}
