//! Node facts: what the binary concluded on the H200 machine is what the library concludes
//! here from the same raw probe output; failure variants; and a whole run through the local
//! transport against a copy of the machine's /proc and /dev (device nodes made with mknod,
//! which needs root, as CI runs) with a stand-in nvidia-smi that prints the captured text.

use crate::gpunode;

use gpunode::{fake_node, fake_smi, fixture};
use provision::gpu::facts::{self, FactSources};
use provision::gpu::probe::{Section, parse_sections};
use provision::inventory::container::GpuSelector;
use provision::transport::local::LocalTransport;

const UUID1: &str = "GPU-bd921741-4472-2f2e-9847-d8171173854c";

#[test]
fn facts_match_what_the_h200_machine_printed() {
    let sections = parse_sections(&fixture("h200x2/facts-probe.raw"));
    let facts = facts::node_facts_from_sections(&sections, "");
    let here = serde_json::to_value(&facts).unwrap();
    let there: serde_json::Value = serde_json::from_str(&fixture("h200x2/facts-json.txt")).unwrap();
    assert_eq!(here, there);
    assert!(facts.problems.is_empty(), "{:?}", facts.problems);
    assert_eq!(facts.driver.as_ref().unwrap().version, "580.159.04");
    assert_eq!(facts.major("nvidia-uvm"), Some(238));
    let gpu = facts.gpu(&GpuSelector::Uuid(UUID1.into())).unwrap();
    assert_eq!(gpu.info.index, 1);
    assert_eq!(gpu.device_path().as_deref(), Some("/dev/nvidia1"));
    assert_eq!(facts.gpu(&GpuSelector::Index(0)).unwrap().minor, Some(0));
    assert!(facts.gpu(&GpuSelector::Index(2)).is_none());
}

fn with(raw: &str, name: &str, output: &str, status: i32) -> provision::gpu::probe::Sections {
    let mut sections = parse_sections(raw);
    sections.insert(
        name.to_string(),
        Section {
            output: output.to_string(),
            status,
        },
    );
    sections
}

fn messages(f: &provision::gpu::NodeFacts) -> String {
    f.problems
        .iter()
        .map(|p| format!("{} / {}", p.message, p.hint))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_kernel_module_is_a_problem_with_a_remedy() {
    let raw = fixture("h200x2/facts-probe.raw");
    let s = with(
        &raw,
        "proc-version",
        "cat: /proc/driver/nvidia/version: No such file or directory\n",
        1,
    );
    let f = facts::node_facts_from_sections(&s, "");
    assert!(f.driver.is_none());
    let m = messages(&f);
    assert!(m.contains("no NVIDIA kernel module is loaded"), "{m}");
    assert!(m.contains("modprobe nvidia"), "{m}");
}

#[test]
fn a_node_side_version_mismatch_says_reboot() {
    let raw = fixture("h200x2/facts-probe.raw");
    let s = with(&raw, "query-gpu", &fixture("handmade/smi-mismatch.txt"), 18);
    let f = facts::node_facts_from_sections(&s, "");
    assert!(f.gpus.is_empty());
    let m = messages(&f);
    assert!(
        m.contains("NVML 570.86) is not its loaded kernel module's version (580.159.04)"),
        "{m}"
    );
    assert!(m.contains("reboot the node"), "{m}");
}

#[test]
fn nvidia_smi_missing_on_the_node() {
    let raw = fixture("h200x2/facts-probe.raw");
    let s = with(&raw, "query-gpu", "sh: 1: nvidia-smi: not found\n", 127);
    let m = messages(&facts::node_facts_from_sections(&s, ""));
    assert!(m.contains("nvidia-smi is not installed on the node"), "{m}");
}

#[test]
fn missing_uvm_node_and_gpu_node_are_problems() {
    let raw = fixture("h200x2/facts-probe.raw");
    let stat: String = fixture("h200x2/dev-stat.txt")
        .lines()
        .filter(|l| !l.ends_with("/dev/nvidia-uvm") && !l.ends_with("/dev/nvidia1"))
        .map(|l| format!("{l}\n"))
        .collect();
    let s = with(&raw, "dev-nodes", &stat, 0);
    let m = messages(&facts::node_facts_from_sections(&s, ""));
    assert!(m.contains("/dev/nvidia-uvm does not exist"), "{m}");
    assert!(m.contains("nvidia-modprobe -u -c=0"), "{m}");
    assert!(m.contains("GPU 1 (GPU-bd921741"), "{m}");
    assert!(m.contains("has no device node /dev/nvidia1"), "{m}");
}

#[test]
fn a_gpu_without_a_proc_entry_has_no_known_node() {
    let raw = fixture("h200x2/facts-probe.raw");
    let only_first: String = fixture("h200x2/proc-gpus.txt")
        .lines()
        .take(12)
        .map(|l| format!("{l}\n"))
        .collect();
    let s = with(&raw, "proc-gpus", &only_first, 0);
    let f = facts::node_facts_from_sections(&s, "");
    assert_eq!(f.gpus[0].minor, Some(0));
    assert_eq!(f.gpus[1].minor, None);
    assert!(messages(&f).contains("vfio-pci"));
}

#[test]
fn gathers_through_the_local_transport_from_a_node_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("node root");
    fake_node(&root, "h200x2");
    let path = fake_smi(tmp.path(), "h200x2");
    let transport = LocalTransport::with_env(vec![("PATH".into(), path)]);
    let sources = FactSources {
        root: root.display().to_string(),
    };
    let (facts, raw) = facts::gather_node_facts_raw(&transport, &sources).unwrap();
    assert!(raw.contains("@@provision-begin query-gpu"));
    let there: serde_json::Value = serde_json::from_str(&fixture("h200x2/facts-json.txt")).unwrap();
    let mut here = serde_json::to_value(&facts).unwrap();
    // stat lists nodes in its own order (glob order under the copy); compare them as sets.
    let sort = |v: &mut serde_json::Value| {
        v["device_nodes"]
            .as_array_mut()
            .unwrap()
            .sort_by_key(|n| n["path"].as_str().unwrap().to_string())
    };
    let mut there = there;
    sort(&mut here);
    sort(&mut there);
    assert_eq!(here, there);
}
