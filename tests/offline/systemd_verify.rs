//! `systemd-analyze verify` on every unit the inventories render: real systemd decides
//! whether the unit parses, not our reading of its manual. Needs root (CI runs as root)
//! to give the unit's interpreter a path in a private mount namespace.

use std::path::Path;
use std::process::Command;

use provision::cli::render::rendered_files;

fn units_of(inventory: &str) -> Vec<(String, String)> {
    let prepared = provision::cli::prepare(Path::new(inventory)).unwrap();
    rendered_files(&prepared.desired, &|_| "/etc/pve".to_string())
        .into_iter()
        .filter(|f| f.relative.extension().is_some_and(|e| e == "service"))
        .map(|f| (f.relative.display().to_string(), f.content))
        .collect()
}

fn verify(name: &str, unit: &str) {
    assert!(
        Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .is_ok(),
        "systemd-analyze is missing: install systemd (scripts/test-deps does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(Path::new(name).file_name().unwrap());
    std::fs::write(&file, unit).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .and_then(|l| l.split_whitespace().next())
        .expect("the unit has an ExecStart")
        .to_string();
    // The interpreter exists only on the target; give it a path in a private /root so
    // verify checks everything else without touching this machine.
    let script = format!(
        "mount -t tmpfs none /root && mkdir -p \"$(dirname {exec})\" && cp /bin/true {exec} && exec systemd-analyze verify {}",
        file.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Operation not permitted"),
        "this test needs root to make a private mount namespace: {stderr}"
    );
    assert!(
        out.status.success(),
        "{name}: systemd-analyze failed: {stderr}"
    );
    // verify exits 0 on unknown keys and bad values; any message is a finding.
    assert!(
        stderr.trim().is_empty(),
        "{name}: systemd-analyze says:\n{stderr}"
    );
}

#[test]
fn llm_two_unit_verifies() {
    let units = units_of("inventory/llm-two.yaml");
    assert_eq!(units.len(), 1);
    for (name, unit) in units {
        verify(&name, &unit);
    }
}

#[test]
fn example_units_verify() {
    for (name, unit) in units_of("examples/qwen3.5-397b-nvfp4.yaml") {
        verify(&name, &unit);
    }
}

#[test]
fn a_broken_unit_is_caught() {
    let (name, unit) = units_of("inventory/llm-two.yaml").remove(0);
    let broken = unit.replace("StartLimitBurst=", "StartLimitBurts=");
    let result = std::panic::catch_unwind(|| verify(&name, &broken));
    assert!(
        result.is_err(),
        "systemd-analyze did not flag an unknown key"
    );
}

/// The degraded variants (inventory `fallback:`) are whole units too: they must verify.
#[test]
fn fallback_units_verify() {
    let prepared = provision::cli::prepare(Path::new("inventory/llm-two.yaml")).unwrap();
    let mut count = 0;
    for t in &prepared.desired {
        for d in &t.resources {
            if let provision::resources::ResourceSpec::Service(s) = &d.spec {
                for fb in &s.fallbacks {
                    assert!(!fb.content.contains("--speculative"), "{}", fb.content);
                    assert!(
                        !fb.content.contains("SGLANG_ENABLE_SPEC_V2"),
                        "{}",
                        fb.content
                    );
                    verify(
                        &format!("{}.service", fb.name.replace(' ', "-")),
                        &fb.content,
                    );
                    count += 1;
                }
            }
        }
    }
    assert_eq!(count, 1, "llm-two declares one fallback");
}
