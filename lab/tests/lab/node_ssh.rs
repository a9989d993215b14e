//! The node's sshd and its `pct`: same configs, locks and containers as the API.

use crate::common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use provision_lab::server::faults::{FaultKind, FaultRule};

fn node_ssh(cmd: &str) -> Output {
    let (host, port) = lab().vars["PVE_NODE_SSH"]
        .split_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    std::process::Command::new("ssh")
        .args([
            "-i",
            &lab().vars["PVE_NODE_SSH_KEY"],
            "-p",
            &port,
            "-o",
            "StrictHostKeyChecking=no",
        ])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            &format!("root@{host}"),
            cmd,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn ok(cmd: &str) -> String {
    let out = node_ssh(cmd);
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pct_over_node_ssh_shares_state_with_the_api() {
    let vmid = 9010;
    let _clean = Cleanup(vmid);
    let c = api();
    assert_eq!(
        run_task(&c, "POST", &node("/lxc"), &refs(&create_params(vmid))),
        "OK"
    );
    assert_eq!(
        ok("command -v pct").trim(),
        lab().dir().join("bin/pct").display().to_string()
    );
    assert!(ok(&format!("pct config {vmid}")).contains(&format!(
        "rootfs: local:{vmid}/vm-{vmid}-disk-0.raw,size=4G"
    )));
    ok(&format!("pct start {vmid}"));
    assert_eq!(
        c.call("GET", &node(&format!("/lxc/{vmid}/status/current")), &[])
            .unwrap()["status"],
        "running"
    );
    assert_eq!(ok(&format!("pct status {vmid}")).trim(), "status: running");
    assert_eq!(
        ok(&format!("pct exec {vmid} -- cat /etc/hostname")).trim(),
        format!("CT{vmid}")
    );
    let out = node_ssh(&format!("pct exec {vmid} -- sh -c 'exit 3'"));
    assert_eq!(
        out.status.code(),
        Some(3),
        "pct exec passes the exit status through"
    );
    ok(&format!(
        "printf 'pushed' > /tmp/pct-push-{vmid} && pct push {vmid} /tmp/pct-push-{vmid} /root/pushed --perms 0640 && rm /tmp/pct-push-{vmid}"
    ));
    assert_eq!(
        ok(&format!("pct exec {vmid} -- stat -c '%a %U' /root/pushed")).trim(),
        "640 root"
    );
    assert_eq!(
        ok(&format!("pct exec {vmid} -- cat /root/pushed")),
        "pushed"
    );
    // pct set on a running container: hotplugged, as through the API.
    ok(&format!("pct set {vmid} --memory 900 --tags 'B;a'"));
    let conf = c
        .call("GET", &node(&format!("/lxc/{vmid}/config")), &[])
        .unwrap();
    assert_eq!(
        (conf["memory"].as_i64(), conf["tags"].as_str()),
        (Some(900), Some("a;b"))
    );
    // A root-only edit of the file over SSH is what the API reads.
    let root_dir = &lab().vars["LAB_PVE_ROOT"];
    ok(&format!(
        "echo 'lxc.cgroup2.devices.allow: c 195:* rwm' >> {root_dir}/lxc/{vmid}.conf"
    ));
    let after = c
        .call("GET", &node(&format!("/lxc/{vmid}/config")), &[])
        .unwrap();
    assert_eq!(
        after["lxc"],
        serde_json::json!([["lxc.cgroup2.devices.allow", "c 195:* rwm"]])
    );
    assert_ne!(after["digest"], conf["digest"]);
    ok(&format!("pct stop {vmid}"));
    assert_eq!(
        c.call("GET", &node(&format!("/lxc/{vmid}/status/current")), &[])
            .unwrap()["status"],
        "stopped"
    );
    let out = node_ssh(&format!("pct stop {vmid}"));
    assert_eq!(out.status.code(), Some(255));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("CT {vmid} not running")
    );
    let out = node_ssh("pct config 4242");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Configuration file 'nodes/lab/lxc/4242.conf' does not exist"
    );
}

#[test]
fn pct_waits_for_the_config_lock_an_api_task_holds() {
    let vmid = 9011;
    let _clean = Cleanup(vmid);
    let c = api();
    assert_eq!(
        run_task(&c, "POST", &node("/lxc"), &refs(&create_params(vmid))),
        "OK"
    );
    let rule = FaultRule {
        method: None,
        path: format!("^/nodes/lab/lxc/{vmid}/status/start$"),
        param: None,
        count: 1,
        kind: FaultKind::SlowTask,
        message: None,
        status: None,
        delay_ms: Some(2500),
        hold_lock: true,
    };
    lab().inject_fault(&rule).unwrap();
    let upid = c
        .call("POST", &node(&format!("/lxc/{vmid}/status/start")), &[])
        .unwrap();
    // The slow start task holds the lock before the racing call is made.
    wait_until_locked(vmid);
    let t = Instant::now();
    ok(&format!("pct set {vmid} --onboot 1"));
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "pct waited for the task's lock: {:?}",
        t.elapsed()
    );
    assert_eq!(wait(&c, &upid), "OK");
    assert_eq!(
        c.call("GET", &node(&format!("/lxc/{vmid}/config")), &[])
            .unwrap()["onboot"],
        1
    );
}
