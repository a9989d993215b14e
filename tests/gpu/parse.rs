//! The GPU parsers on real text captured from an H200 machine (`tests/fixtures/gpu/h200x2`)
//! and on hand-made failure variants (`tests/fixtures/gpu/handmade`).

use provision::gpu::parse::{self, SmiFailure};

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

#[test]
fn proc_version_open_module_on_h200() {
    let m = parse::parse_proc_version(&fixture("h200x2/proc-driver-version.txt")).unwrap();
    assert_eq!(m.version, "580.159.04");
    assert!(m.open);
}

#[test]
fn proc_version_proprietary_module() {
    let m =
        parse::parse_proc_version(&fixture("handmade/proc-version-proprietary-550.txt")).unwrap();
    assert_eq!(m.version, "550.127.05");
    assert!(!m.open);
}

#[test]
fn proc_version_refuses_other_text() {
    let err =
        parse::parse_proc_version("cat: /proc/driver/nvidia/version: No such file").unwrap_err();
    assert!(err.to_string().contains("NVRM version"), "{err}");
}

#[test]
fn query_gpu_on_h200() {
    let gpus = parse::parse_query_gpu(&fixture("h200x2/query-gpu.txt")).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].index, 0);
    assert_eq!(gpus[0].uuid, UUID0);
    assert_eq!(gpus[0].name, "NVIDIA H200");
    assert_eq!(gpus[0].memory_mib, 143_771);
    assert_eq!(gpus[0].pci_bus_id, "00000000:00:06.0");
    assert_eq!(gpus[1].uuid, UUID1);
}

#[test]
fn query_gpu_keeps_a_name_with_a_comma_and_refuses_error_text() {
    let gpus = parse::parse_query_gpu(
        "0, GPU-0d3e1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b, Weird, Name, 97887 MiB, 00000000:01:00.0\n",
    )
    .unwrap();
    assert_eq!(gpus[0].name, "Weird, Name");
    assert_eq!(gpus[0].memory_mib, 97_887);
    // What nvidia-smi really printed for a bad field on the H200 machine.
    let err = parse::parse_query_gpu(&fixture("h200x2/smi-bad-field.txt")).unwrap_err();
    assert!(err.to_string().contains("bogus_field"), "{err}");
}

#[test]
fn proc_gpus_give_device_minors() {
    let gpus = parse::parse_proc_gpus(&fixture("h200x2/proc-gpus.txt")).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].uuid, UUID0);
    assert_eq!(gpus[0].bus_location, "0000:00:06.0");
    assert_eq!(gpus[0].minor, 0);
    assert_eq!(gpus[1].minor, 1);
    let err = parse::parse_proc_gpus("Model: X\nGPU UUID: GPU-1\n").unwrap_err();
    assert!(err.to_string().contains("Device Minor"), "{err}");
}

#[test]
fn proc_devices_nvidia_majors() {
    let majors = parse::parse_proc_devices(&fixture("h200x2/proc-devices.txt")).unwrap();
    let get = |n: &str| majors.iter().find(|m| m.name == n).map(|m| m.major);
    assert_eq!(get("nvidia"), Some(195));
    assert_eq!(get("nvidiactl"), Some(195));
    assert_eq!(get("nvidia-uvm"), Some(238));
    assert_eq!(get("nvidia-caps"), Some(241));
    // Only character devices named nvidia*: no `mem`, no block device.
    assert!(majors.iter().all(|m| m.name.starts_with("nvidia")));
    assert_eq!(majors.len(), 7);
}

#[test]
fn dev_nodes_from_stat() {
    let nodes = parse::parse_dev_nodes(&fixture("h200x2/dev-stat.txt")).unwrap();
    let get = |p: &str| {
        nodes
            .iter()
            .find(|n| n.path == p)
            .map(|n| (n.major, n.minor))
    };
    assert_eq!(get("/dev/nvidia0"), Some((195, 0)));
    assert_eq!(get("/dev/nvidiactl"), Some((195, 255)));
    assert_eq!(get("/dev/nvidia-uvm"), Some((238, 0)));
    assert_eq!(get("/dev/nvidia-uvm-tools"), Some((238, 1)));
    assert_eq!(get("/dev/nvidia-caps/nvidia-cap1"), Some((241, 1)));
    // The /dev/nvidia-caps folder itself is not a device.
    assert_eq!(get("/dev/nvidia-caps"), None);
    // And the majors agree with `ls -l` on the same machine.
    let ls = fixture("h200x2/dev-ls.txt");
    assert!(ls.contains("238,   0 Nov 29 20:42 /dev/nvidia-uvm\n"));
}

#[test]
fn smi_list_on_h200_and_with_mig() {
    let gpus = parse::parse_smi_list(&fixture("h200x2/smi-L.txt")).unwrap();
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, [UUID0, UUID1]);
    assert_eq!(gpus[1].name, "NVIDIA H200");
    let mig = parse::parse_smi_list(&fixture("handmade/smi-L-mig.txt")).unwrap();
    assert_eq!(mig.len(), 2);
    assert_eq!(mig[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(mig[0].mig.len(), 2);
    assert!(mig[1].mig.is_empty());
    let rtx = parse::parse_smi_list(&fixture("handmade/smi-L-rtx-4.txt")).unwrap();
    assert_eq!(rtx.len(), 4);
    assert_eq!(rtx[3].name, "NVIDIA RTX PRO 6000 Blackwell Server Edition");
}

#[test]
fn smi_list_refuses_an_error_message() {
    assert!(parse::parse_smi_list(&fixture("h200x2/smi-bad-index.txt")).is_err());
    assert!(parse::parse_smi_list(&fixture("handmade/smi-mismatch.txt")).is_err());
}

#[test]
fn smi_failures_are_classified() {
    assert_eq!(
        parse::classify_smi_failure(&fixture("handmade/smi-mismatch.txt")),
        SmiFailure::VersionMismatch {
            nvml_library: Some("570.86".into())
        }
    );
    assert_eq!(
        parse::classify_smi_failure(&fixture("handmade/smi-no-driver.txt")),
        SmiFailure::NoDriver
    );
    assert_eq!(
        parse::classify_smi_failure(&fixture("handmade/smi-no-devices.txt")),
        SmiFailure::NoDevices
    );
    assert_eq!(
        parse::classify_smi_failure(&fixture("handmade/smi-nvml-unknown-error.txt")),
        SmiFailure::NvmlInit {
            reason: "Unknown Error".into()
        }
    );
    assert_eq!(
        parse::classify_smi_failure(&fixture("h200x2/smi-bad-index.txt")),
        SmiFailure::Other {
            message: "ERROR: Option -i is not valid for this command. Please run 'nvidia-smi -h' for help.".into()
        }
    );
}

#[test]
fn smi_version_on_h200_and_570() {
    let v = parse::parse_smi_version(&fixture("h200x2/smi-version.txt"));
    assert_eq!(v.smi.as_deref(), Some("580.159.04"));
    assert_eq!(v.nvml.as_deref(), Some("580.159"));
    assert_eq!(v.driver.as_deref(), Some("580.159.04"));
    assert_eq!(v.cuda.as_deref(), Some("13.0"));
    let old = parse::parse_smi_version(&fixture("handmade/smi-version-570.txt"));
    assert_eq!(old.cuda.as_deref(), Some("12.8"));
    assert!(parse::version_prefix_matches(
        v.nvml.as_deref().unwrap(),
        "580.159.04"
    ));
    assert!(!parse::version_prefix_matches("580.15", "580.159.04"));
}

#[test]
fn nvcc_versions() {
    let v = parse::parse_nvcc_version(&fixture("h200x2/nvcc.txt")).unwrap();
    assert_eq!(v.release, "13.0");
    assert_eq!(v.build.as_deref(), Some("13.0.88"));
    let old = parse::parse_nvcc_version(&fixture("handmade/nvcc-12.8.txt")).unwrap();
    assert_eq!(old.release, "12.8");
    // What the shell said on the H200 machine for a toolkit that is not there.
    assert!(parse::parse_nvcc_version(&fixture("h200x2/nvcc-missing.txt")).is_err());
}

#[test]
fn user_libs_from_ldconfig_and_ls() {
    let libs = parse::parse_user_libs(&fixture("h200x2/libs-ldconfig.txt"));
    // Four resolved paths, two distinct files; the `=>` lines and unversioned names are not
    // files with versions.
    assert_eq!(libs.len(), 2, "{libs:?}");
    assert!(libs.iter().all(|l| l.version == "580.159.04"));
    assert!(libs.iter().any(|l| l.lib == "libcuda"));
    assert!(libs.iter().any(|l| l.lib == "libnvidia-ml"));
    // libcudadebugger and libcudart are other libraries.
    let other = parse::parse_user_libs(
        "/usr/lib/libcudadebugger.so.580.159.04\n/usr/lib/libcudart.so.13.0.96\n",
    );
    assert!(other.is_empty(), "{other:?}");
}

#[test]
fn versions_compare_numerically() {
    use std::cmp::Ordering;
    assert_eq!(
        parse::compare_versions("12.8", "13.0"),
        Some(Ordering::Less)
    );
    assert_eq!(
        parse::compare_versions("13.10", "13.9"),
        Some(Ordering::Greater)
    );
    assert_eq!(parse::compare_versions("13.0", "x"), None);
}
