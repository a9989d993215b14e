//! Many targets at once, on the lab's real containers: `check` and `apply` over several
//! guests read and change them concurrently, keep each target's lines together, try every
//! target unless `--fail-fast`, and give one exit code for all (0 clean, 2 drift, 1 error).
//! And a cluster: a container found on another node than declared is drift naming both.
//!
//! The cluster test needs the lab in cluster mode (`LAB_CLUSTER_NODES=lab2` at `lab up`,
//! docs/lab.md); it fails saying so otherwise.

use crate::cli_support::Provision;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::lab_support::{lab, slot};
use provision_lab::testkit::{ContainerSpec, LabEnv, TestContainer};

/// Containers made at once (each create waits for its SSH).
fn containers(lab: &LabEnv, specs: Vec<ContainerSpec>) -> Vec<TestContainer> {
    std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .into_iter()
            .map(|spec| s.spawn(move || lab.create_container(spec).expect("a lab container")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn guest_spec() -> ContainerSpec {
    ContainerSpec {
        privileged: true,
        memory_mb: 512,
        ..Default::default()
    }
}

/// An inventory of `cts` (name, container, roles), the lab's node `lab` in cluster `c1`
/// when `cluster`.
fn inventory(
    lab: &LabEnv,
    dir: &Path,
    cts: &[(&str, &TestContainer, &str)],
    cluster: bool,
) -> PathBuf {
    let v = |k: &str| lab.vars.get(k).cloned().unwrap_or_default();
    let cidr = v("LAB_BRIDGE_CIDR");
    let (node_host, node_port) = v("PVE_NODE_SSH")
        .split_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap_or_default();
    let mut text = format!(
        "paths: {{ roles: roles }}
nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      token: {{ env: PVE_TOKEN }}
      tls: {{ fingerprint: {{ env: PVE_FINGERPRINT }} }}
    ssh: {{ host: {node_host}, port: {node_port} }}
{cluster}    containers:
",
        node = lab.node(),
        cluster = if cluster { "    cluster: c1\n" } else { "" },
    );
    for (name, ct, roles) in cts {
        text.push_str(&format!(
            "      {name}:
        vmid: {vmid}
        template: {template}
        hostname: ct{vmid}
        cores: 1
        memory: 512M
        rootfs: {{ storage: local, size: 4G }}
        unprivileged: true
        network:
          - {{ bridge: {bridge}, ip: {ip}/{prefix}, gateway: {gateway} }}
        ssh:
          identity_file: {key}
        roles: [{roles}]
",
            vmid = ct.vmid,
            template = v("LAB_TEMPLATE"),
            bridge = v("LAB_BRIDGE"),
            ip = ct.ip,
            prefix = cidr.split('/').nth(1).unwrap_or("24"),
            gateway = cidr.split('/').next().unwrap_or_default(),
            key = ct.key.display(),
        ));
    }
    let roles = dir.join("roles");
    std::fs::create_dir_all(&roles).unwrap();
    // A few small things (several step lines per target), and a file no write can land (a `/proc` path reads as absent).
    std::fs::write(
        roles.join("small.yaml"),
        "description: a few small things\nresources:\n  - kind: file\n    path: /etc/provision-many.conf\n    content: \"many = 1\\n\"\n  - kind: directory\n    path: /etc/provision-many.d\n  - kind: file\n    path: /etc/provision-many.d/more.conf\n    content: \"more = 1\\n\"\n",
    )
    .unwrap();
    std::fs::write(
        roles.join("unwritable.yaml"),
        "description: a file that cannot be written\nresources:\n  - kind: file\n    path: /proc/provision-many.conf\n    content: \"no\\n\"\n",
    )
    .unwrap();
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn provision(lab: &LabEnv, dir: &Path, args: &[&str]) -> Output {
    Provision::new(args)
        .known_hosts(&dir.join("known_hosts"), true)
        .arg(dir.join("inventory.yaml"))
        .env_remove("SSH_AUTH_SOCK")
        .lab_api(&lab.vars)
        .output()
}

/// Runs provision, asserting its exit code; stdout and stderr.
fn expect(lab: &LabEnv, dir: &Path, args: &[&str], code: i32) -> (String, String) {
    let out = provision(lab, dir, args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "provision {args:?} exited {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status.code()
    );
    (stdout, stderr)
}

/// Asserts that each target in `names` has at least `min` step lines (`guest NAME (...):
/// STEP ... done|FAILED (T)`), each one whole. Targets run at once and their lines stream
/// as the steps end, so lines of different targets interleave (as Terraform's do); what
/// must hold is that no line is torn or unattributed.
fn assert_grouped(stderr: &str, names: &[&str], min: usize) {
    let whole = regex::Regex::new(
        r"^(guest|container|node) [A-Za-z0-9_.-]+ \([^)]*\): .+ \.\.\. \S*(done|FAILED)\S* \(\d+\.\ds\)",
    )
    .unwrap();
    let steps: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" ... done") || l.contains(" ... FAILED"))
        .collect();
    for l in &steps {
        assert!(
            whole.is_match(l),
            "a torn or unattributed step line {l:?} in:\n{stderr}"
        );
    }
    for name in names {
        let of = steps
            .iter()
            .filter(|l| l.starts_with(&format!("guest {name} (")))
            .count();
        assert!(
            of >= min,
            "fewer than {min} step lines of {name} in:\n{stderr}"
        );
    }
}

fn drift_by_hand(ct: &TestContainer) {
    ct.ssh_ok("echo 'many = 2' > /etc/provision-many.conf")
        .unwrap();
}

fn file_of(ct: &TestContainer) -> String {
    ct.ssh_ok("cat /etc/provision-many.conf").unwrap()
}

#[test]
fn many_guests_are_checked_and_applied_together_with_one_exit_code() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let cts = containers(&lab, vec![guest_spec(), guest_spec(), guest_spec()]);
    let (a, b, c) = (&cts[0], &cts[1], &cts[2]);
    // The cluster's listing finds running containers by their LXC monitors' sockets in
    // one pass (no process per container): these three, started, are listed running.
    let all = lab
        .api()
        .unwrap()
        .call("GET", "/cluster/resources", &[("type", "vm")])
        .unwrap();
    for ct in &cts {
        let listed = all
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["vmid"] == ct.vmid);
        assert_eq!(
            listed.map(|r| r["status"].clone()),
            Some(serde_json::json!("running")),
            "CT {} in {all}",
            ct.vmid
        );
    }
    inventory(
        &lab,
        dir.path(),
        &[("a", a, "small"), ("b", b, "small"), ("c", c, "small")],
        false,
    );
    let guests = [
        "--target", "guest.a", "--target", "guest.b", "--target", "guest.c",
    ];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        extra
            .iter()
            .copied()
            .chain(guests.iter().copied())
            .collect()
    };

    // From scratch: all three at once, each target's step lines whole and attributed.
    let (_, err) = expect(&lab, dir.path(), &with(&["apply", "--yes"]), 0);
    assert_grouped(&err, &["a", "b", "c"], 2);
    for ct in [a, b, c] {
        assert_eq!(file_of(ct), "many = 1\n");
    }
    expect(&lab, dir.path(), &with(&["check"]), 0);

    // Drift on one: 2, naming it only.
    drift_by_hand(b);
    let (out, _) = expect(&lab, dir.path(), &with(&["check"]), 2);
    assert!(out.contains("guest b"), "{out}");
    assert!(
        !out.contains("guest a (") && !out.contains("guest c ("),
        "{out}"
    );

    // One target unreadable (its sshd stopped): error (1) over drift, and the drift of the
    // others is still shown.
    a.ssh_ok("systemctl stop ssh.socket ssh.service 2>/dev/null; systemctl stop ssh.service; true")
        .unwrap();
    let (out, err) = expect(&lab, dir.path(), &with(&["check"]), 1);
    assert!(out.contains("guest b"), "the drift of b is shown:\n{out}");
    assert!(err.contains("guest a"), "the error names a:\n{err}");
    assert!(err.contains("1 of 3"), "{err}");

    // --fail-fast, one at a time: a fails first and nothing else is read.
    let (out, err) = expect(
        &lab,
        dir.path(),
        &with(&["check", "--fail-fast", "--parallelism", "1"]),
        1,
    );
    assert!(!out.contains("guest b"), "b was not read:\n{out}");
    assert!(err.contains("--fail-fast"), "{err}");

    // Bring a back; give c a change that cannot be written. Apply tries every target:
    // b is fixed although c fails, and the error covers c.
    a.exec(&["systemctl", "start", "ssh.service"]).unwrap();
    a.wait_ssh(std::time::Duration::from_secs(60)).unwrap();
    inventory(
        &lab,
        dir.path(),
        &[("a", a, "unwritable"), ("b", b, "small"), ("c", c, "small")],
        false,
    );
    let (_, err) = expect(&lab, dir.path(), &with(&["apply", "--yes"]), 1);
    assert_grouped(&err, &["b"], 1);
    assert!(err.contains("guest a"), "{err}");
    assert_eq!(file_of(b), "many = 1\n", "b was applied although a failed");

    // With --fail-fast, one at a time, a's failure stops b's change.
    drift_by_hand(b);
    let (_, err) = expect(
        &lab,
        dir.path(),
        &with(&["apply", "--yes", "--fail-fast", "--parallelism", "1"]),
        1,
    );
    assert!(err.contains("not applied (--fail-fast"), "{err}");
    assert_eq!(file_of(b), "many = 2\n", "b was left alone after a failed");
}

#[test]
fn a_container_on_another_node_of_its_cluster_is_drift_naming_both_nodes() {
    let lab = lab();
    let other = lab
        .vars
        .get("LAB_CLUSTER_NODES")
        .and_then(|n| n.split(',').find(|n| !n.is_empty()))
        .map(str::to_string)
        .expect(
            "the lab runs in cluster mode: `LAB_CLUSTER_NODES=lab2 scripts/lab up` (docs/lab.md)",
        );
    let dir = tempfile::tempdir().unwrap();
    let ct = lab
        .create_container(ContainerSpec {
            node: Some(other.clone()),
            start: false,
            wait_ssh: false,
            ..Default::default()
        })
        .expect("a container on the other node");
    // The cluster lists it on the other node, whichever member's API is asked.
    let api = lab.api().unwrap();
    let all = api
        .call("GET", "/cluster/resources", &[("type", "vm")])
        .unwrap();
    let listed = all
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["vmid"] == ct.vmid)
        .unwrap_or_else(|| panic!("CT {} not in {all}", ct.vmid))
        .clone();
    assert_eq!(listed["node"], other.as_str());
    // Not started: no LXC monitor, so asked one by one, and stopped.
    assert_eq!(listed["status"], "stopped");
    // vmids are unique cluster-wide: the declared node refuses it, naming the other.
    let template = lab.vars["LAB_TEMPLATE"].clone();
    let vmid = ct.vmid.to_string();
    let refused = lab
        .root_api()
        .unwrap()
        .call(
            "POST",
            &format!("/nodes/{}/lxc", lab.node()),
            &[("vmid", vmid.as_str()), ("ostemplate", template.as_str())],
        )
        .expect_err("a second CT with the vmid");
    assert!(
        refused
            .message
            .contains(&format!("already exists on node '{other}'")),
        "{refused:?}"
    );

    inventory(&lab, dir.path(), &[("moved", &ct, "small")], true);
    let (out, _) = expect(
        &lab,
        dir.path(),
        &["check", "--target", "container.moved"],
        2,
    );
    assert!(
        out.contains(&format!("node `{other}`")) && out.contains(&format!("node `{}`", lab.node())),
        "the drift names both nodes:\n{out}"
    );
    eprintln!("check of a misplaced container:\n{out}");

    // Where the cluster puts its containers is read once per check, as the node's version
    // and listing are, not once per container: two container targets read together make
    // the calls each makes alone, less those three.
    let calls = |err: &str| -> usize {
        err.lines()
            .find_map(|l| l.strip_prefix(&format!("node {}: ", lab.node())))
            .and_then(|l| l.strip_suffix(" API call(s)"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("-v counts the node's API calls:\n{err}"))
    };
    let second = lab
        .create_container(ContainerSpec {
            start: false,
            wait_ssh: false,
            ..Default::default()
        })
        .expect("a second container, on the declared node");
    inventory(
        &lab,
        dir.path(),
        &[("moved", &ct, "small"), ("second", &second, "small")],
        true,
    );
    let check = |targets: &[&'static str]| -> String {
        let mut args = vec!["check", "-v"];
        for t in targets {
            args.extend(["--target", t]);
        }
        expect(&lab, dir.path(), &args, 2).1
    };
    let moved = check(&["container.moved"]);
    let alone = check(&["container.second"]);
    let both = check(&["container.moved", "container.second"]);
    assert_eq!(
        calls(&both),
        calls(&moved) + calls(&alone) - 3,
        "--- moved\n{moved}\n--- second\n{alone}\n--- both\n{both}"
    );
    drop(second);
    inventory(&lab, dir.path(), &[("moved", &ct, "small")], true);
    // Apply refuses rather than writing on the declared node, and migration says it is
    // not built.
    let (_, err) = expect(
        &lab,
        dir.path(),
        &["apply", "--yes", "--target", "container.moved"],
        1,
    );
    assert!(err.contains("nothing was changed"), "{err}");
    let (_, err) = expect(
        &lab,
        dir.path(),
        &["plan", "--migrate", "--target", "container.moved"],
        1,
    );
    assert!(err.contains("not built"), "{err}");

    // Outside a cluster the declared node alone is asked: the container is absent there.
    inventory(&lab, dir.path(), &[("moved", &ct, "small")], false);
    let (out, _) = expect(
        &lab,
        dir.path(),
        &["plan", "--target", "container.moved"],
        0,
    );
    assert!(out.contains("1 to add"), "{out}");
    assert!(!out.contains(&format!("node `{other}`")), "{out}");
}

/// "Accepted publickey" lines in `ct`'s sshd journal, read without logging in.
fn accepted(ct: &TestContainer) -> usize {
    let out = ct
        .exec(&["journalctl", "-u", "ssh", "--no-pager", "-o", "cat"])
        .expect("the container's sshd journal");
    String::from_utf8_lossy(&out.stdout)
        .matches("Accepted publickey")
        .count()
}

/// A guest's login starts before its node's listing says whether its container runs, but
/// only where known_hosts already holds every key on the way: a guest whose container is
/// not there, at an address another host answers, is planned as new with no login to that
/// host and nothing added to known_hosts, even with --accept-new-host-keys. (A second,
/// real guest read in the same check keeps provision running past the time such a login
/// would take.)
#[test]
fn a_guest_whose_container_is_not_there_is_not_logged_in_to_ahead() {
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let cts = containers(&lab, vec![guest_spec(), guest_spec()]);
    let (other, real) = (&cts[0], &cts[1]);
    let path = inventory(
        &lab,
        dir.path(),
        &[("gone", other, "small"), ("real", real, "small")],
        false,
    );
    // The other container's address, at a vmid no container has.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            &format!("vmid: {}", other.vmid),
            &format!("vmid: {}", slot::MANY_ABSENT.vmid),
        )
        .replace(
            &format!("hostname: ct{}", other.vmid),
            &format!("hostname: ct{}", slot::MANY_ABSENT.vmid),
        );
    std::fs::write(&path, text).unwrap();
    // The testkit's own login (its wait for SSH) is in the journal before counting from it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let before = loop {
        let n = accepted(other);
        if n >= 1 || std::time::Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let (_, err) = expect(
        &lab,
        dir.path(),
        &[
            "check",
            "-v",
            "--target",
            "container.gone",
            "--target",
            "guest.gone",
            "--target",
            "container.real",
            "--target",
            "guest.real",
        ],
        2,
    );
    assert!(
        err.contains(&format!("CT {} does not exist yet", slot::MANY_ABSENT.vmid)),
        "{err}"
    );
    assert!(err.contains("guest.real: 1 SSH login(s)"), "{err}");
    assert!(!err.contains("guest.gone: 1 SSH login(s)"), "{err}");
    assert_eq!(
        accepted(other),
        before,
        "no login to the host at that address"
    );
    let known = std::fs::read_to_string(dir.path().join("known_hosts")).unwrap_or_default();
    assert!(
        !known.contains(&other.ip.to_string()),
        "nothing added to known_hosts for that address: {known}"
    );
}
