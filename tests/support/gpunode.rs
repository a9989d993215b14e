//! A copy of a captured GPU machine's node side: its /proc files and real character devices
//! (made with mknod, which needs root, as CI runs) under a folder, and an `nvidia-smi` that
//! prints the captured query output. `captures` is a folder under tests/fixtures/gpu/ with
//! `proc-driver-version.txt`, `proc-devices.txt`, `proc-gpus.txt`, `dev-stat.txt` and
//! `query-gpu.txt` as `capture.sh` or `scripts/gpu-lxc-h200` wrote them.

use std::path::Path;
use std::process::Command;

/// The checkout, read when the test runs (cargo sets it), so a test binary shared between
/// checkouts through one target folder still reads this checkout's fixtures.
pub fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

/// A fixture's text.
pub fn fixture(path: &str) -> String {
    let full = format!("{}/tests/fixtures/gpu/{path}", manifest_dir());
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {full}: {e}"))
}

/// Writes the node's /proc files and device nodes under `root`.
pub fn fake_node(root: &Path, captures: &str) {
    let w = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w(
        "proc/driver/nvidia/version",
        &fixture(&format!("{captures}/proc-driver-version.txt")),
    );
    w(
        "proc/devices",
        &fixture(&format!("{captures}/proc-devices.txt")),
    );
    // One `information` file per GPU, as the driver keeps them: each starts at `Model:`.
    let info = fixture(&format!("{captures}/proc-gpus.txt"));
    let mut gpus: Vec<String> = Vec::new();
    for line in info.lines() {
        if line.starts_with("Model:") || gpus.is_empty() {
            gpus.push(String::new());
        }
        let last = gpus.last_mut().unwrap();
        last.push_str(line);
        last.push('\n');
    }
    for (i, text) in gpus.iter().enumerate() {
        w(&format!("proc/driver/nvidia/gpus/{i}/information"), text);
    }
    std::fs::create_dir_all(root.join("dev/nvidia-caps")).unwrap();
    for line in fixture(&format!("{captures}/dev-stat.txt")).lines() {
        let parts: Vec<&str> = line.split('|').collect();
        if parts[0] != "character special file" {
            continue;
        }
        let major = u32::from_str_radix(parts[1], 16).unwrap().to_string();
        let minor = u32::from_str_radix(parts[2], 16).unwrap().to_string();
        let path = root.join(parts[3].trim_start_matches('/'));
        let status = Command::new("mknod")
            .arg(&path)
            .args(["c", &major, &minor])
            .status()
            .expect("mknod runs");
        assert!(
            status.success(),
            "mknod {} failed: these tests need root (CI runs them as root)",
            path.display()
        );
    }
}

/// A folder under `dir` with an `nvidia-smi` that prints the captured query output; returns
/// a PATH with it first.
pub fn fake_smi(dir: &Path, captures: &str) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let query = format!(
        "{}/tests/fixtures/gpu/{captures}/query-gpu.txt",
        manifest_dir()
    );
    let script = format!(
        "#!/bin/sh\ncase \"$*\" in\n  --query-gpu=index,uuid,name,memory.total,pci.bus_id\\ --format=csv,noheader) cat '{query}' ;;\n  *) echo \"unexpected arguments: $*\" >&2; exit 2 ;;\nesac\n"
    );
    let path = bin.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    format!("{}:/usr/bin:/bin", bin.display())
}
