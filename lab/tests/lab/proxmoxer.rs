//! The independent client: lab/tests/python/test_proxmoxer.py (proxmoxer from PyPI) against
//! the running lab, in the venv that scripts/lab-deps makes.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn proxmoxer_drives_the_lab() {
    let venv = std::env::var("LAB_VENV").unwrap_or_else(|_| "/var/cache/provision-lab/venv".into());
    let python = Path::new(&venv).join("bin/python");
    assert!(
        python.exists(),
        "no Python venv with proxmoxer at {venv}: run scripts/lab-deps"
    );
    let _clean = (Cleanup(9020), Cleanup(9021));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_proxmoxer.py");
    let out = Command::new(python)
        .arg(&script)
        .envs(&lab().vars)
        .env("LAB_TEST_VMID", "9020")
        .env("LAB_TEST_IP", ip_for(9020))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "proxmoxer tests failed:\n{text}");
    assert!(
        text.contains("test_lifecycle_and_errors") && text.contains("OK"),
        "{text}"
    );
}
