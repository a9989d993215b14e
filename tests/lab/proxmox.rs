//! `provision plan/check/apply` on containers through the lab's Proxmox API (real LXC under
//! it): create and start, a second apply with nothing to do, memory/cores/network changes in
//! place, a new mount point pending until an allowed restart, drift made through the API found
//! by `check` (exit 2) and repaired, adoption, a vmid held by another container, a template
//! change refused without `--allow-replace`, lock timeouts and 596s retried, a failing task
//! showing its log, and a no-op check within 5 API calls. Needs root and the lab
//! (`eval "$(scripts/lab up)"`, or the testkit brings one up).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::cli_support::Provision;
use crate::lab_support::{Slot, cleanup, lab, slot};
use assert_cmd::Command;
use provision_lab::server::faults::{FaultKind, FaultRule};
use provision_lab::testkit::LabEnv;

/// A slot's address on the lab bridge and the gateway.
fn address(lab: &LabEnv, at: Slot) -> (String, String) {
    let cidr = &lab.vars["LAB_BRIDGE_CIDR"];
    let (gw, _) = cidr.split_once('/').unwrap();
    let net: Vec<&str> = gw.split('.').collect();
    let host = at.ip_host;
    (
        format!("{}.{}.{}.{host}/24", net[0], net[1], net[2]),
        gw.to_string(),
    )
}

/// What an inventory for one lab container says.
struct Inv {
    vmid: u32,
    name: &'static str,
    memory: &'static str,
    cores: u32,
    ip: String,
    gw: String,
    mounts: Vec<(PathBuf, &'static str)>,
    password: bool,
    restart: &'static str,
    template: String,
}

impl Inv {
    fn new(lab: &LabEnv, at: Slot, name: &'static str) -> Inv {
        let (ip, gw) = address(lab, at);
        Inv {
            vmid: at.vmid,
            name,
            memory: "512M",
            cores: 1,
            ip,
            gw,
            mounts: Vec::new(),
            password: false,
            restart: "never",
            template: lab.vars["LAB_TEMPLATE"].clone(),
        }
    }

    fn write(&self, lab: &LabEnv, dir: &Path) -> PathBuf {
        let auth = if self.password {
            "password: { env: PVE_ROOT_PASSWORD }"
        } else {
            "token: { env: PVE_TOKEN }"
        };
        let mounts: String = self
            .mounts
            .iter()
            .map(|(host, path)| {
                format!("          - {{ host: {}, path: {path} }}\n", host.display())
            })
            .collect();
        let mounts = if mounts.is_empty() {
            String::new()
        } else {
            format!("        mounts:\n{mounts}")
        };
        let text = format!(
            r#"nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      {auth}
      tls:
        fingerprint: {{ env: PVE_FINGERPRINT }}
    ssh:
      host: 127.0.0.1
      port: 1
    containers:
      {name}:
        vmid: {vmid}
        template: {template}
        cores: {cores}
        memory: {memory}
        swap: 0
        rootfs: {{ storage: local, size: 2G }}
        features: {{ nesting: true }}
        network:
          - bridge: {bridge}
            ip: {ip}
            gateway: {gw}
        tags: [Lab, provision]
        restart: {restart}
{mounts}"#,
            node = lab.node(),
            name = self.name,
            vmid = self.vmid,
            template = self.template,
            cores = self.cores,
            memory = self.memory,
            bridge = lab.vars["LAB_BRIDGE"],
            ip = self.ip,
            gw = self.gw,
            restart = self.restart,
        );
        let path = dir.join("inventory.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Runs `provision ARGS INVENTORY --target container.NAME` with the lab's exports.
fn provision(lab: &LabEnv, args: &[&str], inv: &Path, name: &str) -> Output {
    let mut p = Provision::new(args)
        .arg(inv)
        .args(["--target", &format!("container.{name}")])
        .clean_env(None);
    for k in [
        "PVE_URL",
        "PVE_TOKEN",
        "PVE_FINGERPRINT",
        "PVE_ROOT_PASSWORD",
    ] {
        p = p.env(k, &lab.vars[k]);
    }
    Command::from_std(p.command())
        .timeout(Duration::from_secs(600))
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn expect(o: &Output, code: i32) -> String {
    let t = text(o);
    assert_eq!(o.status.code(), Some(code), "{t}");
    t
}

fn config(lab: &LabEnv, vmid: u32) -> serde_json::Value {
    lab.api()
        .unwrap()
        .call(
            "GET",
            &format!("/nodes/{}/lxc/{vmid}/config", lab.node()),
            &[],
        )
        .unwrap()
}

fn running(lab: &LabEnv, vmid: u32) -> bool {
    lab.api()
        .unwrap()
        .call(
            "GET",
            &format!("/nodes/{}/lxc/{vmid}/status/current", lab.node()),
            &[],
        )
        .unwrap()["status"]
        == "running"
}

#[test]
fn create_converge_update_drift_and_replace() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let _guard = cleanup(&lab, slot::PA_ONE);
    let mut inv = Inv::new(&lab, slot::PA_ONE, "pa-one");
    let path = inv.write(&lab, dir.path());

    let out = provision(&lab, &["plan", "--detailed-exitcode"], &path, inv.name);
    let t = expect(&out, 2);
    assert!(t.contains("ostemplate"), "{t}");

    expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    assert!(running(&lab, 9301));
    let conf = config(&lab, 9301);
    assert_eq!(conf["memory"], 512);
    assert_eq!(conf["tags"], "lab;provision");

    // Converged: nothing to do, within the call budget.
    let t = expect(&provision(&lab, &["check", "-v"], &path, inv.name), 0);
    let calls: usize = t
        .lines()
        .find_map(|l| l.split("node lab: ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no call count in:\n{t}"));
    assert!(calls <= 5, "a no-op check took {calls} API calls");
    let t = expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    assert!(!t.contains("Apply complete"), "{t}");

    // Memory, cores and the address change in place, live.
    inv.memory = "1G";
    inv.cores = 2;
    inv.ip = address(&lab, slot::PA_ONE_MOVED).0;
    let path = inv.write(&lab, dir.path());
    let t = expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    assert!(t.contains("applies live"), "{t}");
    let conf = config(&lab, 9301);
    assert_eq!(
        (conf["memory"].clone(), conf["cores"].clone()),
        (1024.into(), 2.into())
    );
    assert!(conf["net0"].as_str().unwrap().contains(&inv.ip), "{conf}");
    expect(&provision(&lab, &["check"], &path, inv.name), 0);

    // Drift made through the API is found, then repaired.
    lab.api()
        .unwrap()
        .call(
            "PUT",
            &format!("/nodes/{}/lxc/9301/config", lab.node()),
            &[("memory", "768"), ("tags", "other")],
        )
        .unwrap();
    let t = expect(&provision(&lab, &["check"], &path, inv.name), 2);
    assert!(t.contains("memory") && t.contains("768"), "{t}");
    expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    expect(&provision(&lab, &["check"], &path, inv.name), 0);

    // A new bind mount needs root@pam (a ticket) or node SSH, and stays pending until a
    // restart, which `restart: allowed` permits. The host data is untouched.
    let host = PathBuf::from(&lab.vars["LAB_SHARED_DIR"]).join("pa-one-data");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("keep"), "data").unwrap();
    inv.mounts = vec![(host.clone(), "/data")];
    let path = inv.write(&lab, dir.path());
    let t = expect(&provision(&lab, &["plan"], &path, inv.name), 0);
    assert!(
        t.contains("+ pve_lines 9301 root-only") && t.contains("+ mp0"),
        "a token cannot add a bind mount through the API: with node SSH it is a node step:\n{t}"
    );
    inv.password = true;
    inv.restart = "allowed";
    let path = inv.write(&lab, dir.path());
    let t = expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    assert!(t.contains("reboot"), "{t}");
    assert!(
        config(&lab, 9301)["mp0"]
            .as_str()
            .unwrap()
            .contains("mp=/data")
    );
    assert!(running(&lab, 9301));
    expect(&provision(&lab, &["check"], &path, inv.name), 0);

    // A template change is a replace, refused without --allow-replace.
    inv.template = inv.template.replace(".tar.zst", "-other.tar.zst");
    let path = inv.write(&lab, dir.path());
    let t = expect(&provision(&lab, &["check"], &path, inv.name), 2);
    assert!(t.contains("-/+"), "{t}");
    let t = expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 1);
    assert!(
        t.contains("--allow-replace") && t.contains("nothing was changed"),
        "{t}"
    );
    assert!(running(&lab, 9301));
    assert_eq!(std::fs::read_to_string(host.join("keep")).unwrap(), "data");
    std::fs::remove_dir_all(&host).unwrap();
}

#[test]
fn adopts_an_existing_container_and_refuses_a_taken_vmid() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let _guard = cleanup(&lab, slot::PA_ADOPT);
    let inv = Inv::new(&lab, slot::PA_ADOPT, "pa-adopt");
    let (ip, gw) = (inv.ip.clone(), inv.gw.clone());
    let net0 = format!(
        "name=eth0,bridge={},ip={ip},gw={gw}",
        lab.vars["LAB_BRIDGE"]
    );
    let upid = lab
        .api()
        .unwrap()
        .call(
            "POST",
            &format!("/nodes/{}/lxc", lab.node()),
            &[
                ("vmid", "9311"),
                ("ostemplate", &lab.vars["LAB_TEMPLATE"]),
                ("hostname", "pa-adopt"),
                ("memory", "256"),
                ("net0", &net0),
                ("rootfs", "local:2"),
            ],
        )
        .unwrap();
    let exit = lab
        .api()
        .unwrap()
        .wait_task(lab.node(), upid.as_str().unwrap(), Duration::from_secs(300))
        .unwrap();
    assert_eq!(exit, "OK");
    let path = inv.write(&lab, dir.path());
    let t = expect(
        &provision(&lab, &["plan", "--detailed-exitcode"], &path, inv.name),
        2,
    );
    assert!(t.contains("adopted") && !t.contains("ostemplate"), "{t}");
    expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    expect(&provision(&lab, &["check"], &path, inv.name), 0);
    assert_eq!(config(&lab, 9311)["memory"], 512);

    // The same vmid under another name is someone else's container.
    let other = Inv::new(&lab, slot::PA_ADOPT, "pa-other");
    let path = other.write(&lab, dir.path());
    let t = expect(&provision(&lab, &["plan"], &path, other.name), 1);
    assert!(t.contains("pa-adopt") && t.contains("pa-other"), "{t}");
}

fn fault(
    path: &str,
    method: &str,
    kind: FaultKind,
    count: u32,
    message: Option<&str>,
) -> FaultRule {
    FaultRule {
        method: Some(method.into()),
        path: path.into(),
        param: None,
        count,
        kind,
        message: message.map(str::to_string),
        status: None,
        delay_ms: None,
        hold_lock: true,
    }
}

#[test]
fn transient_failures_are_retried_and_a_failed_task_shows_its_log() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let _guard = cleanup(&lab, slot::PA_FAULTS);
    let inv = Inv::new(&lab, slot::PA_FAULTS, "pa-faults");
    let path = inv.write(&lab, dir.path());
    let node = lab.node().to_string();

    lab.inject_fault(&fault(
        &format!("^/nodes/{node}/lxc$"),
        "POST",
        FaultKind::TaskError,
        1,
        Some("unpacking failed: disk full (lab fault)"),
    ))
    .unwrap();
    let t = expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 1);
    assert!(
        t.contains("disk full (lab fault)") && t.contains("task log"),
        "{t}"
    );
    lab.clear_faults().unwrap();
    // What the failed create left is named as such, not adopted or taken for another CT.
    let t = expect(&provision(&lab, &["plan"], &path, inv.name), 1);
    assert!(t.contains("failed create"), "{t}");
    drop(cleanup(&lab, slot::PA_FAULTS));

    expect(&provision(&lab, &["apply", "--yes"], &path, inv.name), 0);
    // Reads meet a lock timeout and a 596, and are retried.
    lab.inject_fault(&fault(
        &format!("^/nodes/{node}/lxc/9321/config$"),
        "GET",
        FaultKind::LockTimeout,
        2,
        None,
    ))
    .unwrap();
    lab.inject_fault(&fault(
        &format!("^/nodes/{node}/lxc$"),
        "GET",
        FaultKind::BrokenPipe,
        1,
        None,
    ))
    .unwrap();
    let t = expect(&provision(&lab, &["check"], &path, inv.name), 0);
    assert!(!t.contains("error"), "{t}");
    lab.clear_faults().unwrap();
}

#[test]
fn refused_credentials_are_an_error_naming_node_and_call_never_absent() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let inv = Inv::new(&lab, slot::PA_AUTH, "pa-auth");
    let path = inv.write(&lab, dir.path());
    let bad = format!(
        "{}=00000000-0000-0000-0000-000000000000",
        lab.vars["PVE_TOKEN"].split('=').next().unwrap()
    );
    let out = Provision::new(["check"])
        .arg(&path)
        .args(["--target", "container.pa-auth"])
        .env("PVE_URL", &lab.vars["PVE_URL"])
        .env("PVE_FINGERPRINT", &lab.vars["PVE_FINGERPRINT"])
        .env("PVE_TOKEN", &bad)
        .output();
    let t = expect(&out, 1);
    assert!(
        t.contains("node `lab`") && t.contains("GET /version"),
        "{t}"
    );
    assert!(!t.contains("00000000-0000"), "the token leaked:\n{t}");
    // A wrong pin is refused before anything is sent.
    let out = Provision::new(["check"])
        .arg(&path)
        .args(["--target", "container.pa-auth"])
        .env("PVE_URL", &lab.vars["PVE_URL"])
        .env("PVE_FINGERPRINT", "AA:".repeat(31) + "AA")
        .env("PVE_TOKEN", &lab.vars["PVE_TOKEN"])
        .output();
    let t = expect(&out, 1);
    assert!(t.contains("fingerprint"), "{t}");
}
