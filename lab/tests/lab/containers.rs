//! Containers on real LXC, created through the API: create semantics, config changes
//! (applied, hotplugged, pending), power actions and their errors, locks, mounts, devices,
//! raw `lxc.*` lines, destroy, the mirror and the gateway.

use crate::common;

use std::time::Duration;

use common::*;
use provision_lab::server::faults::{FaultKind, FaultRule};
use provision_lab::testkit::ContainerSpec;

fn conf_path(vmid: u32) -> std::path::PathBuf {
    lab()
        .dir()
        .join(format!("etc/pve/nodes/lab/lxc/{vmid}.conf"))
}

#[test]
fn create_defaults_lock_and_duplicate() {
    let vmid = 9001;
    let _clean = Cleanup(vmid);
    let mut p = create_params(vmid);
    p.push(("tags".into(), "Web, db;web".into()));
    let c = api();
    // The task is made slow to start (its config written and locked, the flock free), so
    // what the call leaves behind is still there to see however fast the create runs.
    lab().inject_fault(&slow_create(vmid, 5000)).unwrap();
    let upid = c.call("POST", &node("/lxc"), &refs(&p)).unwrap();
    // The config exists, locked, as soon as the call returns.
    let raw = std::fs::read_to_string(conf_path(vmid)).unwrap();
    assert!(raw.contains("lock: create"), "{raw}");
    assert_err(
        c.call("POST", &node("/lxc"), &refs(&p)),
        500,
        &format!("CT {vmid} already exists on node 'lab'"),
    );
    assert_eq!(wait(&c, &upid), "OK");
    let conf = c
        .call("GET", &node(&format!("/lxc/{vmid}/config")), &[])
        .unwrap();
    assert_eq!(
        conf["unprivileged"], 1,
        "unprivileged defaults to 1 on create"
    );
    assert_eq!(conf["tags"], "db;web");
    assert_eq!(conf["hostname"], format!("CT{vmid}"));
    assert_eq!(
        (conf["memory"].as_i64(), conf["swap"].as_i64()),
        (Some(512), Some(512))
    );
    assert_eq!(conf["ostype"], "debian");
    let net0 = conf["net0"].as_str().unwrap();
    assert!(net0.starts_with("name=eth0,bridge="), "{net0}");
    assert!(
        net0.contains(",hwaddr=BC:24:11:") && net0.ends_with(",type=veth"),
        "{net0}"
    );
    assert_eq!(
        conf["rootfs"],
        format!("local:{vmid}/vm-{vmid}-disk-0.raw,size=4G")
    );
    assert_eq!(conf["digest"].as_str().unwrap().len(), 40);
    assert!(conf.get("lock").is_none());
    let list = c.call("GET", &node("/lxc"), &[]).unwrap();
    let me = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["vmid"] == vmid)
        .expect("listed");
    assert_eq!(me["status"], "stopped");
    let content = c
        .call(
            "GET",
            &node("/storage/local/content"),
            &[("content", "rootdir")],
        )
        .unwrap();
    assert!(
        content
            .to_string()
            .contains(&format!("local:{vmid}/vm-{vmid}-disk-0.raw"))
    );
}

#[test]
fn unprivileged_container_boots_and_answers_ssh() {
    let ct = lab().create_container(ContainerSpec::default()).unwrap();
    let out = ct
        .ssh_ok("systemctl is-system-running --wait; id -u; hostname; systemd-detect-virt")
        .unwrap();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["running", "0", &format!("ct{}", ct.vmid), "lxc"]
    );
    let st = api()
        .call(
            "GET",
            &node(&format!("/lxc/{}/status/current", ct.vmid)),
            &[],
        )
        .unwrap();
    assert_eq!(st["status"], "running");
    let pid = st["pid"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.contains("100000"),
        "unprivileged init runs as host uid 100000: {uid}"
    );
    // The route to host services on the bridge, and the mirror on the bridge address.
    let route = ct.ssh_ok("ip route show default").unwrap();
    assert!(route.contains(&format!("via {}", gw())), "{route}");
    let mirror = lab().vars["LAB_MIRROR_DIR"].clone();
    std::fs::write(format!("{mirror}/hello-{}.txt", ct.vmid), "from the mirror").unwrap();
    let url = format!("{}hello-{}.txt", lab().vars["LAB_MIRROR_URL"], ct.vmid);
    let got = ct.ssh_ok(&format!("python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())\"")).unwrap();
    assert_eq!(got.trim(), "from the mirror");
    std::fs::remove_file(format!("{mirror}/hello-{}.txt", ct.vmid)).unwrap();
    let hosts = ct.ssh_ok("cat /etc/hosts").unwrap();
    assert!(
        hosts.contains(&format!("127.0.1.1 ct{}", ct.vmid)),
        "{hosts}"
    );
}

#[test]
fn privileged_bind_mount_survives_destroy() {
    let host = std::path::PathBuf::from(&lab().vars["LAB_SHARED_DIR"]).join("bind-test");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("model.txt"), "weights").unwrap();
    let spec = ContainerSpec {
        privileged: true,
        mounts: vec![(host.clone(), "/shared".into())],
        ..Default::default()
    };
    let ct = lab().create_container(spec).unwrap();
    assert_eq!(ct.ssh_ok("cat /shared/model.txt").unwrap(), "weights");
    ct.ssh_ok("echo written-inside > /shared/inside.txt")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(host.join("inside.txt"))
            .unwrap()
            .trim(),
        "written-inside"
    );
    let conf = root()
        .call("GET", &node(&format!("/lxc/{}/config", ct.vmid)), &[])
        .unwrap();
    assert_eq!(conf["mp0"], format!("{},mp=/shared", host.display()));
    assert!(
        conf.get("unprivileged").is_none(),
        "privileged: no unprivileged key"
    );
    drop(ct);
    assert_eq!(
        std::fs::read_to_string(host.join("model.txt")).unwrap(),
        "weights",
        "destroy never touches bind-mounted data"
    );
    assert!(host.join("inside.txt").exists());
    std::fs::remove_dir_all(&host).unwrap();
}

#[test]
fn unprivileged_bind_mount_shows_host_root_as_nobody() {
    let host = std::path::PathBuf::from(&lab().vars["LAB_SHARED_DIR"]).join("unpriv-bind");
    std::fs::create_dir_all(&host).unwrap();
    let spec = ContainerSpec {
        mounts: vec![(host.clone(), "/shared".into())],
        ..Default::default()
    };
    let ct = lab().create_container(spec).unwrap();
    assert_eq!(
        ct.ssh_ok("stat -c %u /shared").unwrap().trim(),
        "65534",
        "as on Proxmox: no id shift for bind mounts"
    );
    drop(ct);
    std::fs::remove_dir_all(&host).unwrap();
}

#[test]
fn config_changes_applied_hotplugged_or_pending() {
    let vmid = 9002;
    let _clean = Cleanup(vmid);
    let c = root();
    let mut p = create_params(vmid);
    p.push(("unprivileged".into(), "0".into()));
    assert_eq!(run_task(&c, "POST", &node("/lxc"), &refs(&p)), "OK");
    let cfg = node(&format!("/lxc/{vmid}/config"));
    // Stopped: applied at once; the digest guards against concurrent edits.
    let before = c.call("GET", &cfg, &[]).unwrap();
    c.call(
        "PUT",
        &cfg,
        &[
            ("memory", "768"),
            ("description", "GPU server: llm"),
            ("digest", before["digest"].as_str().unwrap()),
        ],
    )
    .unwrap();
    assert_err(
        c.call(
            "PUT",
            &cfg,
            &[
                ("memory", "640"),
                ("digest", before["digest"].as_str().unwrap()),
            ],
        ),
        500,
        "detected modified configuration - file changed by other user? Try again.",
    );
    assert_err(
        c.call("PUT", &cfg, &[("delete", "memory")]),
        500,
        "unable to delete required option 'memory'",
    );
    c.call("PUT", &cfg, &[("delete", "description")]).unwrap();
    let after = c.call("GET", &cfg, &[]).unwrap();
    assert_eq!(after["memory"], 768);
    assert!(after.get("description").is_none());
    // Running: memory hotplugged into the cgroup, hostname at once, features left pending.
    assert_eq!(
        run_task(&c, "POST", &node(&format!("/lxc/{vmid}/status/start")), &[]),
        "OK"
    );
    c.call(
        "PUT",
        &cfg,
        &[
            ("memory", "1024"),
            ("hostname", "llm-two"),
            ("features", "nesting=1"),
        ],
    )
    .unwrap();
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/lxc.payload.{vmid}/memory.limit_in_bytes"
    ))
    .or_else(|_| {
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/unified/lxc.payload.{vmid}/memory.max"
        ))
    })
    .unwrap();
    assert_eq!(limit.trim(), (1024u64 << 20).to_string());
    let raw = std::fs::read_to_string(conf_path(vmid)).unwrap();
    let (main, pending) = raw.split_once("[pve:pending]").expect("a pending section");
    assert!(
        main.contains("memory: 1024") && main.contains("hostname: llm-two"),
        "{raw}"
    );
    assert!(
        pending.contains("features: nesting=1") && !main.contains("features:"),
        "{raw}"
    );
    assert_eq!(c.call("GET", &cfg, &[]).unwrap()["features"], "nesting=1");
    assert!(
        c.call("GET", &cfg, &[("current", "1")])
            .unwrap()
            .get("features")
            .is_none()
    );
    let pend = c
        .call("GET", &node(&format!("/lxc/{vmid}/pending")), &[])
        .unwrap();
    let f = pend
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["key"] == "features")
        .unwrap();
    assert_eq!(f["pending"], "nesting=1");
    // A reboot applies what was pending.
    assert_eq!(
        run_task(
            &c,
            "POST",
            &node(&format!("/lxc/{vmid}/status/reboot")),
            &[]
        ),
        "OK"
    );
    let raw = std::fs::read_to_string(conf_path(vmid)).unwrap();
    assert!(
        !raw.contains("[pve:pending]") && raw.contains("features: nesting=1"),
        "{raw}"
    );
    let lxc_conf = std::fs::read_to_string(lab().dir().join(format!("lxc/{vmid}/config"))).unwrap();
    assert!(lxc_conf.contains("nesting.conf"), "{lxc_conf}");
    assert_eq!(
        run_task(&c, "POST", &node(&format!("/lxc/{vmid}/status/stop")), &[]),
        "OK"
    );
}

#[test]
fn power_errors_as_proxmox_words_them() {
    let vmid = 9003;
    let _clean = Cleanup(vmid);
    let c = api();
    assert_eq!(
        run_task(&c, "POST", &node("/lxc"), &refs(&create_params(vmid))),
        "OK"
    );
    let st = |a: &str| node(&format!("/lxc/{vmid}/status/{a}"));
    assert_err(
        c.call("POST", &st("stop"), &[]),
        500,
        &format!("CT {vmid} not running"),
    );
    assert_err(
        c.call("POST", &st("shutdown"), &[]),
        500,
        &format!("CT {vmid} not running"),
    );
    assert_err(
        c.call("POST", &st("reboot"), &[]),
        500,
        &format!("VM {vmid} not running"),
    );
    assert_eq!(run_task(&c, "POST", &st("start"), &[]), "OK");
    assert_err(
        c.call("POST", &st("start"), &[]),
        500,
        &format!("CT {vmid} already running"),
    );
    assert_err(
        c.call("DELETE", &node(&format!("/lxc/{vmid}")), &[]),
        500,
        &format!("unable to destroy CT {vmid} - container is running"),
    );
    wait_ssh(&ip_for(vmid));
    assert_eq!(
        run_task(&c, "POST", &st("shutdown"), &[("timeout", "30")]),
        "OK"
    );
    assert_eq!(
        c.call("GET", &st("current"), &[]).unwrap()["status"],
        "stopped"
    );
    assert_eq!(
        run_task(&c, "DELETE", &node(&format!("/lxc/{vmid}")), &[]),
        "OK"
    );
    assert!(!conf_path(vmid).exists());
    assert!(
        !lab()
            .dir()
            .join(format!("storage/local/images/{vmid}"))
            .exists()
    );
}

#[test]
fn a_slow_create_holds_the_create_lock() {
    let vmid = 9004;
    let _clean = Cleanup(vmid);
    let c = api();
    // Slow to start its work: the config carries `lock: create` while the flock is free.
    let rule = slow_create(vmid, 1500);
    lab().inject_fault(&rule).unwrap();
    let upid = c
        .call("POST", &node("/lxc"), &refs(&create_params(vmid)))
        .unwrap();
    let cfg = node(&format!("/lxc/{vmid}/config"));
    match c.call("PUT", &cfg, &[("memory", "1024")]) {
        Err(e) => assert_eq!(e.message, "CT is locked (create)"),
        Ok(_) => panic!("a config change during create must fail"),
    }
    let cur = c
        .call("GET", &node(&format!("/lxc/{vmid}/status/current")), &[])
        .unwrap();
    assert_eq!(cur["lock"], "create");
    assert_eq!(wait(&c, &upid), "OK");
    assert!(
        c.call("GET", &node(&format!("/lxc/{vmid}/status/current")), &[])
            .unwrap()
            .get("lock")
            .is_none()
    );
}

#[test]
fn a_task_holding_the_config_lock_times_out_other_writers() {
    let vmid = 9005;
    let _clean = Cleanup(vmid);
    let c = api();
    assert_eq!(
        run_task(&c, "POST", &node("/lxc"), &refs(&create_params(vmid))),
        "OK"
    );
    let path = format!("^/nodes/lab/lxc/{vmid}/status/start$");
    let rule = FaultRule {
        method: None,
        path,
        param: None,
        count: 1,
        kind: FaultKind::SlowTask,
        message: None,
        status: None,
        delay_ms: Some(11_000),
        hold_lock: true,
    };
    lab().inject_fault(&rule).unwrap();
    let upid = c
        .call("POST", &node(&format!("/lxc/{vmid}/status/start")), &[])
        .unwrap();
    // The slow start task holds the lock before the racing call is made.
    wait_until_locked(vmid);
    let t = std::time::Instant::now();
    assert_err(
        c.call(
            "PUT",
            &node(&format!("/lxc/{vmid}/config")),
            &[("memory", "1024")],
        ),
        500,
        &format!(
            "can't lock file '{}/pve-config-{vmid}.lock' - got timeout",
            lock_dir()
        ),
    );
    assert!(
        t.elapsed() >= Duration::from_secs(9),
        "Proxmox waits 10 s for the lock"
    );
    assert_eq!(wait(&c, &upid), "OK");
    let st = c
        .call("GET", &node(&format!("/lxc/{vmid}/status/current")), &[])
        .unwrap();
    assert_eq!(st["status"], "running");
}

#[test]
fn devices_and_raw_lxc_lines_reach_lxc() {
    let vmid = 9006;
    let _clean = Cleanup(vmid);
    let c = root();
    let mut p = create_params(vmid);
    p.push(("unprivileged".into(), "0".into()));
    p.push(("dev0".into(), "/dev/net/tun".into()));
    assert_eq!(run_task(&c, "POST", &node("/lxc"), &refs(&p)), "OK");
    // A raw line as the provisioner adds it over SSH: straight into the file.
    let mut raw = std::fs::read_to_string(conf_path(vmid)).unwrap();
    raw.push_str("lxc.prlimit.nofile: 4321\n");
    std::fs::write(conf_path(vmid), raw).unwrap();
    let conf = c
        .call("GET", &node(&format!("/lxc/{vmid}/config")), &[])
        .unwrap();
    assert_eq!(
        conf["lxc"],
        serde_json::json!([["lxc.prlimit.nofile", "4321"]])
    );
    assert_eq!(
        run_task(&c, "POST", &node(&format!("/lxc/{vmid}/status/start")), &[]),
        "OK"
    );
    let ip = ip_for(vmid);
    wait_ssh(&ip);
    let out = ssh(
        &ip,
        "awk '/open files/ {print $4}' /proc/1/limits; stat -c '%t:%T' /dev/net/tun; exec 3<>/dev/net/tun && echo opened",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["4321", "a:c8", "opened"],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn many_containers_at_once_get_distinct_ids_and_addresses() {
    let handles: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(|| lab().create_container(ContainerSpec::default()).unwrap()))
        .collect();
    let cts: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut ids: Vec<u32> = cts.iter().map(|c| c.vmid).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    for ct in &cts {
        assert_eq!(ct.ssh_ok("hostname -I").unwrap().trim(), ct.ip.to_string());
    }
}

/// The create of `vmid` slow to start its work by `delay_ms`: its config is written and
/// locked (`lock: create`) while the flock is free, so a test sees what the call leaves.
fn slow_create(vmid: u32, delay_ms: u64) -> FaultRule {
    FaultRule {
        method: Some("POST".into()),
        path: "^/nodes/lab/lxc$".into(),
        param: Some(format!("vmid={vmid}")),
        count: 1,
        kind: FaultKind::SlowTask,
        message: None,
        status: None,
        delay_ms: Some(delay_ms),
        hold_lock: false,
    }
}
