//! Lab timings for docs/bench-lab.md, on a private lab instance (its own directory, ports and
//! bridge), so a running shared lab is not disturbed. Run as root:
//! `cargo run --release -p provision-lab --example bench -- [RUNS]`.
//! The "fresh" figure (apt + debootstrap) is `time scripts/lab-deps` on a clean cache.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use provision_lab::testkit::{ContainerSpec, LabEnv};

fn pve_lab(bin: &Path, dir: &Path, arg: &str) -> String {
    let out = Command::new(bin)
        .arg(arg)
        .env("LAB_DIR", dir)
        .env("LAB_API_PORT", "18106")
        .env("LAB_SSH_PORT", "12322")
        .env("LAB_MIRROR_PORT", "18180")
        .env("LAB_BRIDGE", "vmbrbench")
        .env("LAB_BRIDGE_CIDR", "10.214.77.1/24")
        .env("LAB_VETH_PREFIX", "vbn")
        .env("LAB_LOCK_DIR", dir.join("locks"))
        .env_remove("LAB_SHARED_DIR")
        .env_remove("LAB_MIRROR_DIR")
        .output()
        .expect("pve-lab runs");
    assert!(
        out.status.success(),
        "pve-lab {arg}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let exe = std::env::current_exe().expect("own path");
    let bin = exe.ancestors().nth(2).expect("target dir").join("pve-lab");
    assert!(
        bin.exists(),
        "build pve-lab first: cargo build --release -p provision-lab"
    );
    let dir = Path::new("/var/tmp/lab-bench");
    let (mut ups, mut downs) = (vec![], vec![]);
    for i in 0..runs {
        let _ = std::fs::remove_dir_all(dir);
        let t = Instant::now();
        pve_lab(&bin, dir, "up");
        ups.push(t.elapsed());
        let t = Instant::now();
        pve_lab(&bin, dir, "down");
        downs.push(t.elapsed());
        eprintln!("run {}: up {:?}, down {:?}", i + 1, ups[i], downs[i]);
    }
    // Containers on one lab: the first create unpacks the template into the state dir.
    let lab = LabEnv::from_exports(&pve_lab(&bin, dir, "up"));
    let t = Instant::now();
    drop(
        lab.create_container(ContainerSpec::default())
            .expect("container"),
    );
    let first = t.elapsed();
    let (mut unpriv, mut privd) = (vec![], vec![]);
    for i in 0..runs {
        for (privileged, out) in [(false, &mut unpriv), (true, &mut privd)] {
            let t = Instant::now();
            let ct = lab
                .create_container(ContainerSpec {
                    privileged,
                    ..Default::default()
                })
                .expect("container");
            out.push(t.elapsed());
            drop(ct);
        }
        eprintln!(
            "run {}: create→ssh unprivileged {:?}, privileged {:?}",
            i + 1,
            unpriv[i],
            privd[i]
        );
    }
    pve_lab(&bin, dir, "down");
    let _ = std::fs::remove_dir_all(dir);
    println!("| what | median of {runs} |");
    println!("| --- | --- |");
    println!(
        "| `lab up`, cached template, empty state dir | {:.2} s |",
        median(ups).as_secs_f64()
    );
    println!(
        "| first create → SSH ready (unpacks the template into the state dir) | {:.2} s (once) |",
        first.as_secs_f64()
    );
    println!(
        "| create → SSH ready, unprivileged | {:.2} s |",
        median(unpriv).as_secs_f64()
    );
    println!(
        "| create → SSH ready, privileged | {:.2} s |",
        median(privd).as_secs_f64()
    );
    println!("| `lab down` | {:.2} s |", median(downs).as_secs_f64());
}
