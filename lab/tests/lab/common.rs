//! Shared helpers for the lab's integration tests (run as root against real LXC).
#![allow(dead_code)]

use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

use provision_lab::client::PveClient;
use provision_lab::error::ApiError;
use provision_lab::testkit::LabEnv;
use serde_json::Value;

/// The running lab (brought up once per test binary if it is not up).
pub fn lab() -> &'static LabEnv {
    static LAB: OnceLock<LabEnv> = OnceLock::new();
    LAB.get_or_init(|| {
        let lab = LabEnv::from_env_or_up()
            .expect("the lab must come up (run as root after scripts/lab-deps)");
        let status = lab.root_api().and_then(|c| {
            c.call("GET", "/lab/status", &[])
                .map_err(|e| anyhow::anyhow!("{e}"))
        });
        // Written past the test harness's capture, so every run says which it was.
        let line = match status {
            Ok(s) if s["schema"] == "on" => "lab: schema conformance layer: on".to_string(),
            Ok(s) => format!(
                "lab: schema conformance layer SKIPPED ({})",
                s["schema"].as_str().unwrap_or("")
            ),
            Err(e) => panic!("lab status: {e}"),
        };
        let _ = writeln!(std::io::stderr(), "{line}");
        lab
    })
}

/// The lab's config lock directory (`/run/lock/lxc` unless `LAB_LOCK_DIR` moved it).
pub fn lock_dir() -> String {
    lab()
        .vars
        .get("LAB_LOCK_DIR")
        .cloned()
        .unwrap_or_else(|| "/run/lock/lxc".into())
}

/// True when requests are checked against the official schema.
pub fn schema_on() -> bool {
    lab()
        .root_api()
        .unwrap()
        .call("GET", "/lab/status", &[])
        .unwrap()["schema"]
        == "on"
}

/// The token client.
pub fn api() -> PveClient {
    lab().api().unwrap()
}

/// A root@pam ticket client.
pub fn root() -> PveClient {
    lab().root_api().unwrap()
}

/// `/nodes/lab` + path.
pub fn node(path: &str) -> String {
    format!("/nodes/{}{path}", lab().node())
}

/// Waits for a task; returns its exit status.
pub fn wait(c: &PveClient, upid: &Value) -> String {
    c.wait_task(
        lab().node(),
        upid.as_str().expect("a UPID"),
        Duration::from_secs(120),
    )
    .expect("task status")
}

/// Calls and waits for the task the call starts; its exit status.
pub fn run_task(c: &PveClient, method: &str, path: &str, params: &[(&str, &str)]) -> String {
    let upid = c
        .call(method, path, params)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    wait(c, &upid)
}

/// Asserts an API error's status and message.
pub fn assert_err(r: Result<Value, ApiError>, status: u16, message: &str) -> ApiError {
    let e = r.expect_err("the call must fail");
    assert_eq!(
        (e.status, e.message.as_str()),
        (status, message),
        "errors: {:?}",
        e.errors
    );
    e
}

/// Bridge address and an address for a test's own vmid (9000..9099 map to .20..).
pub fn ip_for(vmid: u32) -> String {
    assert!((9000..9080).contains(&vmid));
    let cidr = &lab().vars["LAB_BRIDGE_CIDR"];
    let base = cidr
        .split('/')
        .next()
        .unwrap()
        .rsplit_once('.')
        .unwrap()
        .0
        .to_string();
    format!("{base}.{}", vmid - 9000 + 20)
}

/// Gateway (bridge address).
pub fn gw() -> String {
    lab().vars["LAB_BRIDGE_CIDR"]
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Create parameters for a container with a fixed vmid.
pub fn create_params(vmid: u32) -> Vec<(String, String)> {
    let key = std::fs::read_to_string(lab().key_path().with_extension("pub")).unwrap();
    vec![
        ("vmid".into(), vmid.to_string()),
        ("ostemplate".into(), lab().vars["LAB_TEMPLATE"].clone()),
        (
            "net0".into(),
            format!(
                "name=eth0,bridge={},ip={}/24,gw={}",
                lab().vars["LAB_BRIDGE"],
                ip_for(vmid),
                gw()
            ),
        ),
        ("rootfs".into(), "local:4".into()),
        ("ssh-public-keys".into(), key),
    ]
}

/// Borrowed view of owned params.
pub fn refs(p: &[(String, String)]) -> Vec<(&str, &str)> {
    p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Removes a container made by a test, whatever state it is in.
pub struct Cleanup(pub u32);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let c = root();
        let base = node(&format!("/lxc/{}", self.0));
        if let Ok(u) = c.call("POST", &format!("{base}/status/stop"), &[]) {
            let _ = c.wait_task(
                lab().node(),
                u.as_str().unwrap_or(""),
                Duration::from_secs(30),
            );
        }
        for _ in 0..100 {
            match c.call("DELETE", &base, &[]) {
                Ok(u) => {
                    let _ = c.wait_task(
                        lab().node(),
                        u.as_str().unwrap_or(""),
                        Duration::from_secs(60),
                    );
                    return;
                }
                Err(e) if e.message.contains("does not exist") => return,
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

/// Runs `ssh root@ip cmd` with the lab key; stdout on success.
pub fn ssh(ip: &str, cmd: &str) -> std::process::Output {
    std::process::Command::new("ssh")
        .args([
            "-i",
            &lab().key_path().display().to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args([
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            &format!("root@{ip}"),
            cmd,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// Waits until SSH to `ip` works.
pub fn wait_ssh(ip: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ssh(ip, "true").status.success() {
        assert!(std::time::Instant::now() < deadline, "no SSH on {ip}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Returns once someone holds CT `vmid`'s config lock (a task that took it): the event a
/// test waits for before it races that task for the lock. Probed with a non-blocking
/// flock, as the lab's own lock is taken (a probe that gets it lets go at once).
pub fn wait_until_locked(vmid: u32) {
    let path = format!("{}/pve-config-{vmid}.lock", lock_dir());
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(file) = std::fs::File::open(&path)
            && matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "nobody took {path} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
