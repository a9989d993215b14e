//! The whole Proxmox side through the CLI, as a user drives it: the built `provision`
//! binary against the lab (its API and its node's SSH, real LXC under both) with an
//! inventory written to a temp dir. From an empty node `apply` creates the container
//! (stopped), writes its GPU passthrough lines over node SSH, starts it, bootstraps its
//! guest through the node (host keys recorded, no `--accept-new-host-keys`) and converges
//! the guest; a second apply has nothing to do; in-place changes; drift made through the
//! API, through `pct set` over node SSH and by editing the config file is found by `check`
//! (exit 2) and repaired; a template change is refused without `--allow-replace`; an
//! existing container is adopted and its GPU lines take effect at an allowed reboot.
//! Needs root and the lab (`eval "$(scripts/lab up)"`, or the testkit brings one up).

use crate::cli_support::{Provision, Ran};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use provision_lab::server::faults::{FaultKind, FaultRule};
use provision_lab::testkit::{ContainerSpec, LabEnv, TestContainer};

pub(crate) use crate::lab_support::{Slot, cleanup, lab, slot};

/// A test's own directory: inventory, roles, known_hosts pinning the lab node.
pub(crate) struct Cli {
    pub(crate) lab: LabEnv,
    pub(crate) dir: tempfile::TempDir,
}

/// What the inventory's one container says.
pub(crate) struct Ct {
    name: &'static str,
    pub(crate) vmid: u32,
    hostname: Option<String>,
    ip_host: u32,
    pub(crate) memory: &'static str,
    cores: u32,
    pub(crate) mount: Option<PathBuf>,
    restart: &'static str,
    template: String,
    pub(crate) content: &'static str,
    disk_gib: u32,
    /// Authenticate with the API token instead of a root@pam ticket.
    token: bool,
    /// Pass a GPU through (the `gpu-passthrough` role).
    pub(crate) gpu: bool,
    /// A create-only setting: changing it replaces the container.
    unprivileged: bool,
    /// The GPU's userspace from this installer (`url`, `sha256`).
    userspace: Option<(String, String)>,
}

impl Cli {
    pub(crate) fn new(lab: LabEnv) -> Cli {
        let dir = tempfile::tempdir().unwrap();
        let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = std::fs::read_to_string(lab.dir().join("secrets/ssh_host_ed25519_key.pub"))
            .expect("the lab node's host key");
        let mut parts = key.split_whitespace();
        std::fs::write(
            dir.path().join("known_hosts"),
            format!(
                "[{host}]:{port} {} {}\n",
                parts.next().unwrap(),
                parts.next().unwrap()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("roles")).unwrap();
        Cli { lab, dir }
    }

    pub(crate) fn ct(&self, name: &'static str, at: Slot) -> Ct {
        Ct {
            name,
            vmid: at.vmid,
            hostname: None,
            ip_host: at.ip_host,
            memory: "512M",
            cores: 1,
            mount: None,
            restart: "never",
            template: self.lab.vars["LAB_TEMPLATE"].clone(),
            content: "hello = 1\n",
            disk_gib: 2,
            token: false,
            gpu: true,
            unprivileged: false,
            userspace: None,
        }
    }

    fn ip(&self, ct: &Ct) -> String {
        let (gw, _) = self.lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        let net: Vec<&str> = gw.split('.').collect();
        format!("{}.{}.{}.{}", net[0], net[1], net[2], ct.ip_host)
    }

    /// Writes the inventory (and its role) for `ct`; `node_ssh: false` leaves the node
    /// without SSH.
    pub(crate) fn write(&self, ct: &Ct, node_ssh: bool) -> PathBuf {
        let lab = &self.lab;
        let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = lab.key_path();
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let (gw, _) = lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        std::fs::write(
            self.dir.path().join("roles/app.yaml"),
            format!(
                "description: A small guest.\nresources:\n  - kind: file\n    path: /etc/app.conf\n    content: {:?}\n",
                ct.content
            ),
        )
        .unwrap();
        let node_ssh = if node_ssh {
            format!(
                "ssh: {{ host: {host}, port: {port}, identity_file: {} }}",
                key.display()
            )
        } else {
            "ssh: { user: root }".into()
        };
        let hostname = ct
            .hostname
            .as_ref()
            .map(|h| format!("        hostname: {h}\n"))
            .unwrap_or_default();
        let mounts = ct
            .mount
            .as_ref()
            .map(|m| {
                format!(
                    "        mounts:\n          - {{ host: {}, path: /data }}\n",
                    m.display()
                )
            })
            .unwrap_or_default();
        let text = format!(
            r#"paths: {{ roles: roles }}
nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      {auth}
      tls: {{ fingerprint: {{ env: PVE_FINGERPRINT }} }}
    {node_ssh}
    config_root: {root}
    containers:
      {name}:
        vmid: {vmid}
{hostname}        template: {template}
        cores: {cores}
        memory: {memory}
        swap: 0
        rootfs: {{ storage: local, size: {disk}G }}
        unprivileged: {unprivileged}
        network:
          - {{ bridge: {bridge}, ip: {ip}/24, gateway: {gw} }}
        restart: {restart}
        ssh_keys: [{public:?}]
        ssh: {{ identity_file: {key} }}
{gpus}{mounts}"#,
            node = lab.node(),
            root = lab.vars["LAB_PVE_ROOT"],
            name = ct.name,
            vmid = ct.vmid,
            template = ct.template,
            cores = ct.cores,
            memory = ct.memory,
            bridge = lab.vars["LAB_BRIDGE"],
            ip = self.ip(ct),
            restart = ct.restart,
            disk = ct.disk_gib,
            unprivileged = ct.unprivileged,
            auth = if ct.token {
                "token: { env: PVE_TOKEN }"
            } else {
                "password: { env: PVE_ROOT_PASSWORD }"
            },
            gpus = match (ct.gpu, &ct.userspace) {
                (true, None) => "        gpus: { devices: [1], method: lxc }\n        roles: [gpu-passthrough, app]\n".to_string(),
                (true, Some((url, sha256))) => format!("        gpus: {{ devices: [1], method: lxc, userspace: {{ installer: {{ url: {url:?}, sha256: {sha256} }} }} }}\n        roles: [gpu-passthrough, app]\n"),
                (false, _) => "        roles: [app]\n".to_string(),
            },
            public = public.trim(),
            key = key.display(),
        );
        let path = self.dir.path().join("inventory.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `provision ARGS FILE` (an inventory or a saved plan) with the lab's exports and this
    /// test's known_hosts.
    fn run_on(&self, args: &[&str], file: &Path) -> Output {
        let lab = &self.lab;
        let mut cmd = Provision::new(args)
            .known_hosts(&self.dir.path().join("known_hosts"), false)
            .arg(file)
            .clean_env(Some(self.dir.path()))
            .env("PROVISION_NODE_ROOT", &lab.vars["LAB_GPU_ROOT"])
            .env("PROVISION_NODE_LOCK_DIR", &lab.vars["LAB_LOCK_DIR"]);
        for k in [
            "PVE_URL",
            "PVE_FINGERPRINT",
            "PVE_ROOT_PASSWORD",
            "PVE_TOKEN",
        ] {
            cmd = cmd.env(k, &lab.vars[k]);
        }
        cmd.output()
    }

    pub(crate) fn expect(&self, args: &[&str], code: i32) -> String {
        self.expect_on(args, &self.dir.path().join("inventory.yaml"), code)
    }

    /// `provision ARGS INVENTORY` must exit with `code`; what it printed, apart.
    pub(crate) fn ran(&self, args: &[&str], code: i32) -> Ran {
        let ran = Ran::from(self.run_on(args, &self.dir.path().join("inventory.yaml")));
        ran.expect(code);
        ran
    }

    /// `provision ARGS FILE` must exit with `code`; its stdout and stderr.
    fn expect_on(&self, args: &[&str], file: &Path, code: i32) -> String {
        Ran::from(self.run_on(args, file)).expect(code)
    }

    /// A command in the guest over SSH as root, checked against this test's known_hosts
    /// (strict: the keys provision recorded from the node).
    pub(crate) fn guest(&self, ct: &Ct, cmd: &str) -> String {
        self.ssh(&format!("root@{}", self.ip(ct)), "22", cmd)
    }

    /// A command on the lab node over its SSH as root.
    pub(crate) fn node(&self, cmd: &str) -> String {
        let (host, port) = self.lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        self.ssh(&format!("root@{host}"), port, cmd)
    }

    /// Waits, up to a minute, until the guest answers SSH: after an apply that restarted
    /// its container (apply does not wait for a guest it does not change, and a check
    /// right after reads it through the node while its sshd starts).
    pub(crate) fn wait_guest(&self, ct: &Ct) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let to = format!("root@{}", self.ip(ct));
        while !self.ssh_output(&to, "22", "true").status.success() {
            assert!(
                std::time::Instant::now() < deadline,
                "{to} did not answer SSH within a minute"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn ssh(&self, to: &str, port: &str, cmd: &str) -> String {
        let o = self.ssh_output(to, port, cmd);
        assert!(
            o.status.success(),
            "`{cmd}` on {to}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn ssh_output(&self, to: &str, port: &str, cmd: &str) -> std::process::Output {
        Command::new("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-p", port])
            // A guest gone mid-command fails the test instead of hanging it.
            .args(["-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=10"])
            .args(["-o", "ServerAliveCountMax=6"])
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.path().join("known_hosts").display()
            ))
            .arg("-i")
            .arg(self.lab.key_path())
            .arg(to)
            .arg(cmd)
            .output()
            .unwrap()
    }

    pub(crate) fn conf(&self, vmid: u32) -> PathBuf {
        Path::new(&self.lab.vars["LAB_PVE_ROOT"])
            .join(format!("nodes/{}/lxc/{vmid}.conf", self.lab.node()))
    }
}

/// Whether the plan in `text` shows `name` changing as `change` (`a -> b`).
fn changed(text: &str, name: &str, change: &str) -> bool {
    text.lines().any(|l| {
        l.trim_start().starts_with(&format!("~ {name} ")) && l.trim_end().ends_with(change)
    })
}

/// Each of `lines` is in `out`, in this order.
fn assert_in_order(out: &str, lines: &[&str]) {
    let at: Vec<usize> = lines
        .iter()
        .map(|s| out.find(s).unwrap_or_else(|| panic!("no `{s}` in\n{out}")))
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "not in order {lines:?}:\n{out}"
    );
}

/// The selected stand-in GPU is in the container with its major:minor, the cgroup lets
/// it be opened (ENXIO from the stand-in, not EPERM), and the other GPU is not there.
fn assert_gpu_visible(cli: &Cli, ct: &Ct) {
    let out = cli.guest(
        ct,
        "stat -c '%t:%T' /dev/nvidia1 /dev/nvidiactl; ls /dev/nvidia0 2>&1; head -c1 /dev/nvidia1 2>&1; true",
    );
    assert!(out.starts_with("c3:1\nc3:ff\n"), "{out}");
    assert!(out.contains("'/dev/nvidia0': No such file"), "{out}");
    assert!(out.contains("No such device or address"), "{out}");
}

#[test]
fn from_an_empty_node_create_bootstrap_converge_change_drift_repair() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::PXC_ONE);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-one", slot::PXC_ONE);
    cli.write(&ct, true);

    // The plan shows the node step and the bootstrap before anything exists.
    let plan = cli.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("node step, root only"), "{plan}");
    assert!(plan.contains("bootstrap"), "{plan}");
    assert!(plan.contains("+ file /etc/app.conf"), "{plan}");

    // One apply, no --accept-new-host-keys: create -> lines -> start -> bootstrap -> guest.
    let out = cli.expect(&["apply", "--yes"], 0);
    assert_in_order(
        &out,
        &[
            "create CT 9261 (started after its root-only lines)",
            "locked edit of",
            "start CT 9261",
            "bootstrap through node",
            "write /etc/app.conf",
        ],
    );
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    assert_gpu_visible(&cli, &ct);
    cli.expect(&["plan", "--detailed-exitcode"], 0);

    // In place: memory, cores, a bind mount (root@pam ticket), the guest's file.
    let data = cli.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("kept"), "host data\n").unwrap();
    ct.memory = "768M";
    ct.cores = 2;
    ct.mount = Some(data);
    ct.restart = "allowed";
    ct.content = "hello = 2\n";
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(changed(&out, "memory", "512 -> 768"), "{out}");
    cli.expect(&["check"], 0);
    assert_eq!(
        cli.guest(&ct, "cat /etc/app.conf /data/kept"),
        "hello = 2\nhost data\n"
    );
    assert_eq!(cli.guest(&ct, "nproc").trim(), "2");

    // Drift through the API, through `pct set` over node SSH, and in the file itself.
    let api = cli.lab.root_api().unwrap();
    let base = format!("/nodes/{}/lxc/9261/config", cli.lab.node());
    api.call("PUT", &base, &[("cores", "1")]).unwrap();
    cli.node("pct set 9261 --memory 1024");
    let conf = cli.conf(9261);
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(text.contains("c 238:* rwm"), "{text}");
    std::fs::write(&conf, text.replace("c 238:* rwm", "c 509:* rwm")).unwrap();
    let ran = cli.ran(&["check"], 2);
    let drift = ran.text();
    // The report as a user reads it: what drifted, where, and what apply would do (stdout;
    // the progress lines on stderr come in the order the reads run).
    insta::with_settings!({filters => vec![
        (r"https://127\.0\.0\.1:\d+", "https://[lab api]"),
        (r"127\.0\.0\.1:\d+", "[lab node ssh]"),
        (r"\d+\.\d+ ?m?s\b", "[time]"),
        (r"/tmp/\.tmp\w+", "[test dir]"),
    ]}, {
        insta::assert_snapshot!("check_drift_api_pct_and_file", ran.stdout);
    });
    assert!(changed(&drift, "cores", "1 -> 2"), "{drift}");
    assert!(changed(&drift, "memory", "1024 -> 768"), "{drift}");
    assert!(
        drift.contains("+ lxc.cgroup2.devices.allow = c 238:* rwm")
            && drift.contains("- lxc.cgroup2.devices.allow = c 509:* rwm"),
        "{drift}"
    );
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("1 line(s) added, 1 removed"), "{out}");
    cli.expect(&["check"], 0);
    // `restart: allowed`: the container was rebooted for its new lines.
    cli.wait_guest(&ct);
    assert_gpu_visible(&cli, &ct);

    // A new address: changed live; the guest, now unknown at that address, is
    // bootstrapped through the node and its keys (the same ones) recorded there.
    ct.ip_host = slot::PXC_ONE_MOVED.ip_host;
    ct.content = "hello = 3\n";
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("read through node"), "{out}");
    assert!(out.contains("bootstrap through node"), "{out}");
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 3\n");
    cli.expect(&["check"], 0);

    // A template change is refused without --allow-replace, and nothing changes.
    let before = std::fs::read_to_string(&conf).unwrap();
    ct.template = ct.template.replace(".tar.zst", "-other.tar.zst");
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 1);
    assert!(out.contains("--allow-replace"), "{out}");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), before);
}

/// A GPU that stopped answering: the container's `nvidia-smi` (here one that never
/// returns, as on a GPU with Xid errors) would hold the guest's read for its hours; the
/// agent ends its GPU view at the view's limit, with what it started, and `check` names it
/// and exits 1.
#[test]
fn a_hung_nvidia_smi_in_the_container_fails_the_check_naming_it() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::HUNG_SMI);
    let cli = Cli::new(lab);
    let ct = cli.ct("pxc-hungsmi", slot::HUNG_SMI);
    cli.write(&ct, true);
    cli.expect(&["apply", "--yes"], 0);
    cli.expect(&["check"], 0);
    cli.guest(
        &ct,
        "printf '#!/bin/sh\\nexec sleep 86400\\n' > /usr/local/bin/nvidia-smi && \
         chmod 755 /usr/local/bin/nvidia-smi",
    );
    let out = cli.expect(&["check"], 1);
    assert!(
        out.contains("the GPU view script") && out.contains("did not finish within 60s"),
        "{out}"
    );
    assert_eq!(
        cli.guest(&ct, "pgrep -c -x sleep || true").trim(),
        "0",
        "the view's nvidia-smi was left running"
    );
    // One target at a time, the view is read through the node (`pct exec`): the same
    // minute, then the same cause named.
    let out = cli.expect(&["check", "--parallelism", "1"], 1);
    assert!(
        out.contains("did not finish within 60s") && out.contains("Xid errors"),
        "{out}"
    );
}

/// A container made behind provision's back (`spec`), and an inventory that declares it
/// as it is (address, host name, disk) under `name`, with node SSH. The container is
/// destroyed when the third value is dropped.
fn existing(spec: ContainerSpec, name: &'static str) -> (Cli, Ct, TestContainer) {
    let lab = lab();
    let existing = lab.create_container(spec).expect("a lab container");
    let cli = Cli::new(lab);
    let mut ct = cli.ct(
        name,
        Slot {
            vmid: existing.vmid,
            ip_host: existing.ip.octets()[3].into(),
        },
    );
    ct.hostname = Some(format!("ct{}", existing.vmid));
    ct.disk_gib = 4;
    cli.write(&ct, true);
    (cli, ct, existing)
}

/// A privileged container, stopped, as [`Cli::ct`]'s inventory has it but for its start.
fn stopped() -> ContainerSpec {
    ContainerSpec {
        privileged: true,
        start: false,
        wait_ssh: false,
        extra: vec![("swap".into(), "0".into())],
        ..Default::default()
    }
}

#[test]
fn an_existing_container_is_adopted_and_rebooted_for_its_gpu_lines() {
    // A container provision did not create, running, with its guest answering SSH.
    let spec = ContainerSpec {
        privileged: true,
        ..Default::default()
    };
    let (cli, mut ct, _existing) = existing(spec, "pxc-adopt");
    let plan = cli.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("adopted"), "{plan}");
    assert!(!plan.contains("+ container"), "never recreated: {plan}");
    assert!(plan.contains("read through node"), "{plan}");
    // Its host key is not on file: the guest is read through the node, then apply
    // bootstraps it (keys recorded from the node) before SSH takes over. `restart:
    // never`: the lines are written but wait for the next start, and apply says so.
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("bootstrap through node"), "{out}");
    assert!(out.contains("take effect at its next start"), "{out}");
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    // The config matches, but the running container does not see its GPU: drift.
    let drift = cli.expect(&["check"], 2);
    assert!(
        drift.contains("/dev/nvidia1 is not in the container"),
        "{drift}"
    );
    ct.restart = "allowed";
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("reboot CT"), "{out}");
    assert!(out.contains("GPU checks in CT"), "{out}");
    let clean = cli.expect(&["plan", "--detailed-exitcode"], 0);
    assert!(
        clean.contains("driver: not checked (no nvidia-smi in the container)"),
        "{clean}"
    );
    // Rebooted by that apply: its sshd may still be starting.
    cli.wait_guest(&ct);
    assert_gpu_visible(&cli, &ct);
}

#[test]
fn a_stopped_container_without_its_lines_gets_them_then_starts() {
    // What a kill -9 between the create and the root-only lines leaves: the container
    // there, stopped, without its lines. Its own op has nothing to do through the API (the
    // start follows the lines); the apply still goes on to the lines, the start and the
    // guest (it once stopped with "the agent ... stopped after 2 of 3 steps").
    let (cli, ct, _existing) = existing(stopped(), "pxc-stopped");
    let plan = cli.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("status = stopped -> running"), "{plan}");
    assert!(!plan.contains("swap"), "{plan}");
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("starts after its root-only lines"), "{out}");
    assert!(out.contains("locked edit of"), "{out}");
    assert!(out.contains("start CT"), "{out}");
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    cli.expect(&["check"], 0);
    assert_gpu_visible(&cli, &ct);
}

#[test]
fn a_start_that_finds_the_container_started_by_an_earlier_task_is_done() {
    // What a kill -9 during the start task leaves: the task still going on the node (here
    // slowed to 8 s, holding the config lock) while the next apply reads the container
    // stopped and starts it; its start then finds it running (`CT N already running`).
    let (cli, mut ct, existing) = existing(stopped(), "pxc-started");
    ct.gpu = false;
    cli.write(&ct, true);
    let start = format!(
        "/nodes/{}/lxc/{}/status/start",
        cli.lab.node(),
        existing.vmid
    );
    cli.lab
        .inject_fault(&FaultRule {
            method: Some("POST".into()),
            path: format!("^{start}$"),
            param: None,
            count: 1,
            kind: FaultKind::SlowTask,
            message: None,
            status: None,
            delay_ms: Some(8000),
            hold_lock: true,
        })
        .unwrap();
    cli.lab
        .root_api()
        .unwrap()
        .call("POST", &start, &[])
        .unwrap();
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("status = stopped -> running"), "{out}");
    assert!(
        out.contains("already running (started by an earlier task"),
        "{out}"
    );
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    cli.expect(&["check"], 0);
}

#[test]
fn gpu_lines_without_node_ssh_are_refused_before_anything_changes() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::PXC_NOSSH);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-nossh", slot::PXC_NOSSH);
    ct.token = true;
    cli.write(&ct, false);
    for cmd in ["plan", "apply"] {
        let out = cli.expect(&[cmd, "--yes"][..if cmd == "plan" { 1 } else { 2 }], 1);
        assert!(out.contains("has no `ssh.host`"), "{out}");
        assert!(out.contains("root-only"), "{out}");
    }
    assert!(!cli.conf(9263).exists(), "nothing was created");
}

/// A host directory with a file in it, to bind-mount.
fn host_data(cli: &Cli) -> PathBuf {
    let data = cli.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("kept"), "host data\n").unwrap();
    data
}

#[test]
fn a_bind_mount_with_a_token_is_a_node_step_over_node_ssh() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::PXC_TOKMNT);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-tokmnt", slot::PXC_TOKMNT);
    ct.token = true;
    ct.mount = Some(host_data(&cli));
    cli.write(&ct, true);

    // The token may not write the bind mount: the plan makes it a node step.
    let plan = cli.expect(&["plan", "--detailed-exitcode"], 2);
    assert!(plan.contains("9264 root-only"), "{plan}");
    assert!(plan.contains("node step, root only"), "{plan}");

    // create (stopped, without the mount) -> `pct set -mp0` over node SSH -> start.
    let out = cli.expect(&["apply", "--yes"], 0);
    assert_in_order(
        &out,
        &[
            "create CT 9264 (started after its root-only lines)",
            "pct set 9264 (mp0)",
            "start CT 9264",
            "write /etc/app.conf",
        ],
    );
    assert_eq!(cli.guest(&ct, "cat /data/kept"), "host data\n");
    assert_gpu_visible(&cli, &ct);
    let conf = std::fs::read_to_string(cli.conf(9264)).unwrap();
    assert!(conf.contains("mp0: "), "{conf}");

    // Converged: Proxmox's own form of mp0 is no drift.
    cli.expect(&["plan", "--detailed-exitcode"], 0);
    cli.expect(&["check"], 0);
}

#[test]
fn a_bind_mount_with_a_token_and_no_node_ssh_is_refused_at_plan_time() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::PXC_TOKNOSSH);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-toknossh", slot::PXC_TOKNOSSH);
    ct.token = true;
    ct.gpu = false;
    let data = host_data(&cli);
    ct.mount = Some(data.clone());
    cli.write(&ct, false);
    let out = cli.expect(&["plan"], 1);
    assert!(out.contains("mount point type bind"), "{out}");
    assert!(
        out.contains(&format!("mp0 = {},mp=/data", data.display())),
        "names the step: {out}"
    );
    assert!(out.contains("ssh:"), "hints at node SSH: {out}");
    assert!(!cli.conf(9265).exists(), "nothing was created");
}

#[test]
fn a_saved_plan_builds_from_nothing_and_a_replace_builds_the_guest_again() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::PXC_SAVED);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-saved", slot::PXC_SAVED);
    ct.gpu = false;
    cli.write(&ct, true);

    // Reviewed first, then applied exactly: the container does not exist when the plan is
    // made, so its guest is planned as new and is not read again before the create.
    let first = cli.dir.path().join("first.plan");
    let plan = cli.expect(&["plan", "--out", first.to_str().unwrap()], 0);
    assert!(plan.contains("+ file /etc/app.conf"), "{plan}");
    cli.expect_on(&["apply", "--yes"], &first, 0);
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    cli.expect(&["plan", "--detailed-exitcode"], 0);

    // A create-only setting changes: the new container's guest is built whole again (its
    // file unchanged in the inventory is still written), from a saved plan too.
    ct.unprivileged = true;
    cli.write(&ct, true);
    let replace = cli.dir.path().join("replace.plan");
    let plan = cli.expect(&["plan", "--out", replace.to_str().unwrap()], 0);
    assert!(
        plan.contains(
            "re-planned: container.pxc-saved is replaced, so its guest is planned as new"
        ),
        "{plan}"
    );
    assert!(plan.contains("+ file /etc/app.conf"), "{plan}");
    let out = cli.expect_on(&["apply", "--yes"], &replace, 1);
    assert!(out.contains("--allow-replace"), "{out}");
    cli.expect_on(&["apply", "--yes", "--allow-replace"], &replace, 0);
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 1\n");
    let conf = std::fs::read_to_string(cli.conf(9266)).unwrap();
    assert!(conf.contains("unprivileged: 1"), "{conf}");
    cli.expect(&["check"], 0);

    // Stopped behind provision's back: its guest cannot be read. check names the stop and
    // does not call the guest's resources missing; apply starts it, reads the guest and
    // rewrites nothing that is already there (from a saved plan too).
    let stamp = cli.guest(&ct, "stat -c %Y.%i /etc/app.conf");
    let api = cli.lab.root_api().unwrap();
    let node = cli.lab.node().to_string();
    let upid = api
        .call("POST", &format!("/nodes/{node}/lxc/9266/status/stop"), &[])
        .unwrap();
    api.wait_task(&node, upid.as_str().unwrap(), Duration::from_secs(60))
        .unwrap();
    let stopped = cli.dir.path().join("stopped.plan");
    let drift = cli.expect(&["check"], 2);
    assert!(changed(&drift, "status", "stopped -> running"), "{drift}");
    assert!(drift.contains("not read: CT 9266 is stopped"), "{drift}");
    assert!(!drift.contains("+ file /etc/app.conf"), "{drift}");
    assert!(drift.contains("0 to add, 1 to change"), "{drift}");
    cli.expect(&["plan", "--out", stopped.to_str().unwrap()], 0);
    let out = cli.expect_on(&["apply", "--yes"], &stopped, 0);
    assert!(!out.contains("write /etc/app.conf"), "{out}");
    assert_eq!(cli.guest(&ct, "stat -c %Y.%i /etc/app.conf"), stamp);
    cli.expect(&["check"], 0);
}

/// Puts back a file of the lab node on drop (the stand-in module's version).
struct Restore(PathBuf, String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
    }
}

/// A stand-in NVIDIA installer of `version` on the lab mirror (tests/support/nvidia-userspace):
/// its URL and sha256.
fn stand_in_installer(lab: &LabEnv, version: &str) -> (String, String) {
    let dir = Path::new(&lab.vars["LAB_MIRROR_DIR"]).join("nvidia");
    let made = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/nvidia-userspace/make-run.sh"
    ))
    .arg(version)
    .arg(&dir)
    .output()
    .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let file = format!("NVIDIA-Linux-x86_64-{version}.run");
    let sum = Command::new("sha256sum")
        .arg(dir.join(&file))
        .output()
        .unwrap();
    let sha256 = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let base = lab.vars["LAB_MIRROR_URL"].trim_end_matches('/').to_string();
    (format!("{base}/nvidia/{file}"), sha256)
}

/// The lab node's stand-in module version is one for the whole lab: a test that changes it
/// and a test that reads it run one after the other.
static NODE_MODULE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_userspace_follows_a_driver_change_on_the_node() {
    let _module = NODE_MODULE.lock().unwrap_or_else(|p| p.into_inner());
    let lab = lab();
    let module = Path::new(&lab.vars["LAB_GPU_ROOT"]).join("proc/driver/nvidia/version");
    let original = std::fs::read_to_string(&module).expect("the lab node's stand-in module");
    let _restore = Restore(module.clone(), original.clone());
    // The captured H200 machine's module (tests/fixtures/gpu/h200x2/proc-driver-version.txt).
    let old = "580.159.04";
    assert!(original.contains(old), "{original}");
    let new = "580.172.08";
    let cli = Cli::new(lab);
    let _gone = cleanup(&cli.lab, slot::PXC_NVIDIA);
    let mut ct = cli.ct("pxc-nvidia", slot::PXC_NVIDIA);
    ct.userspace = Some(stand_in_installer(&cli.lab, old));
    let _cached_old = node_cache(&ct.userspace.as_ref().unwrap().1);
    cli.write(&ct, true);
    let plan = cli.expect(&["plan"], 0);
    assert!(plan.contains("gpu_userspace"), "{plan}");
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(
        out.contains(&format!(
            "install NVIDIA userspace {old} without the kernel module"
        )),
        "{out}"
    );
    let smi = "nvidia-smi --query-gpu=driver_version --format=csv,noheader; readlink -f /usr/lib/x86_64-linux-gnu/libcuda.so.1";
    assert_eq!(
        cli.guest(&ct, smi),
        format!("{old}\n/usr/lib/x86_64-linux-gnu/libcuda.so.{old}\n")
    );
    cli.expect(&["check"], 0);

    // The node's driver is upgraded (and the node rebooted): its module is another version.
    std::fs::write(&module, original.replace(old, new)).unwrap();
    let drift = cli.expect(&["check"], 2);
    assert!(
        changed(&drift, "libcuda.so.1", &format!("{old} -> {new}")),
        "{drift}"
    );
    assert!(
        drift.contains(&format!("the declared installer installs {old}")),
        "{drift}"
    );
    // In NVML's own words, with the remedy.
    assert!(
        drift.contains(&format!("Failed to initialize NVML: Driver/library version mismatch: the container has {old}, the node's module is {new}; `provision apply` installs {new}")),
        "{drift}"
    );
    // The lines are as declared: the version is the userspace's drift, not theirs.
    assert!(!drift.contains("~ pve_lines"), "{drift}");
    // An installer of the old version would install the mismatch again: refused.
    let refused = cli.expect(&["apply", "--yes"], 1);
    assert!(
        refused.contains(&format!("NVIDIA-Linux-x86_64-{new}.run")),
        "{refused}"
    );
    ct.userspace = Some(stand_in_installer(&cli.lab, new));
    let _cached_new = node_cache(&ct.userspace.as_ref().unwrap().1);
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(
        out.contains(&format!(
            "install NVIDIA userspace {new} without the kernel module"
        )),
        "{out}"
    );
    cli.expect(&["check"], 0);
    assert_eq!(
        cli.guest(&ct, smi),
        format!("{new}\n/usr/lib/x86_64-linux-gnu/libcuda.so.{new}\n")
    );
    let old_files = cli.guest(
        &ct,
        "ls /usr/lib/x86_64-linux-gnu/ | grep -c 580.159 || true",
    );
    assert_eq!(old_files.trim(), "0", "the earlier installation is removed");
}

/// A file server on the test host's loopback only: a container's `127.0.0.1` is its own,
/// so only the node (the lab's node is this host) reaches it. Counts the GETs it answers.
struct LoopbackServer {
    url: String,
    gets: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn loopback_server(file: PathBuf) -> LoopbackServer {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = gets.clone();
    let wanted = format!("GET /nvidia/{name} ");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = if first.starts_with(&wanted) {
                counted.fetch_add(1, Ordering::SeqCst);
                let body = std::fs::read(&file).unwrap();
                stream
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .and_then(|_| stream.write_all(&body))
            } else {
                stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
            };
        }
    });
    LoopbackServer {
        url: format!("http://127.0.0.1:{port}/nvidia/{name}"),
        gets,
    }
}

/// Removes a folder of the lab node on drop.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The node's cache folder of the installer of `sha256` (the lab's node is this host),
/// removed at the end.
fn node_cache(sha256: &str) -> Removed {
    let dir = Removed(PathBuf::from(format!(
        "/var/cache/provision/nvidia/{sha256}"
    )));
    let _ = std::fs::remove_dir_all(&dir.0);
    dir
}

impl LoopbackServer {
    fn gets(&self) -> usize {
        self.gets.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn the_node_fetches_the_userspace_run_and_pushes_it_into_a_container_that_cannot_reach_it() {
    let _module = NODE_MODULE.lock().unwrap_or_else(|p| p.into_inner());
    let lab = lab();
    let version = "580.159.04";
    let module = Path::new(&lab.vars["LAB_GPU_ROOT"]).join("proc/driver/nvidia/version");
    let node_module = std::fs::read_to_string(&module).expect("the lab node's stand-in module");
    assert!(node_module.contains(version), "{node_module}");
    let made = tempfile::tempdir().unwrap();
    let status = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/nvidia-userspace/make-run.sh"
    ))
    .arg(version)
    .arg(made.path())
    .status()
    .unwrap();
    assert!(status.success());
    let run = made
        .path()
        .join(format!("NVIDIA-Linux-x86_64-{version}.run"));
    // Its own checksum, so its own folder of the node's cache (`/var/cache/provision/nvidia/
    // <sha256>/`, shared by every lab on this host and by the other tests' installer): a
    // second lab running this test at the same time empties and fills another folder, and
    // the downloads counted below are this run's alone.
    let mut text = std::fs::read_to_string(&run).unwrap();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    text.push_str(&format!(
        "# served on the test host's loopback to test process {} ({nonce})\n",
        std::process::id()
    ));
    std::fs::write(&run, text).unwrap();
    let sum = Command::new("sha256sum").arg(&run).output().unwrap();
    let sha256 = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let server = loopback_server(run);
    // The node's cache (the lab's node is this host); what this test leaves is removed.
    let cache = node_cache(&sha256);
    let cached = cache.0.join(format!("NVIDIA-Linux-x86_64-{version}.run"));
    // A wrong checksum of this run's own too (its folder is checked for a left `.part`).
    let wrong = format!("{:0>64x}", nonce ^ u128::from(std::process::id()));
    let _wrong = node_cache(&wrong);
    let cli = Cli::new(lab);
    let _gone = cleanup(&cli.lab, slot::PXC_NVRUN);
    let mut ct = cli.ct("pxc-nvrun", slot::PXC_NVRUN);

    // A URL the node cannot fetch is named as the node's, with the hint.
    let missing = server.url.replace("/nvidia/", "/missing/");
    ct.userspace = Some((missing, sha256.clone()));
    cli.write(&ct, true);
    let unreachable = cli.expect(&["apply", "--yes"], 1);
    assert!(
        unreachable.contains("the node cannot download it")
            && unreachable.contains("404")
            && unreachable.contains("a local mirror"),
        "{unreachable}"
    );
    assert_eq!(server.gets(), 0);

    // A wrong sha256 is refused on the node: nothing is kept there, nothing pushed in.
    ct.userspace = Some((server.url.clone(), wrong.clone()));
    cli.write(&ct, true);
    let refused = cli.expect(&["apply", "--yes"], 1);
    assert!(
        refused.contains(&format!("has sha256 {sha256}, not the inventory's")),
        "{refused}"
    );
    assert!(refused.contains("nothing was pushed"), "{refused}");
    assert_eq!(server.gets(), 1, "the node downloaded it once");
    assert!(!cached.exists(), "a file of another checksum is not kept");
    assert_eq!(
        cli.node(&format!(
            "ls -A /var/cache/provision/nvidia/{wrong} 2>/dev/null | wc -l"
        ))
        .trim(),
        "0",
        "no .part is left"
    );
    let pushed = "ls -A /var/cache/provision/nvidia/ 2>/dev/null | wc -l";
    assert_eq!(cli.guest(&ct, pushed).trim(), "0", "nothing was pushed in");
    // The container's route to the URL fails: only the node reaches it.
    let port = server
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    assert_eq!(
        cli.guest(
            &ct,
            &format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo reached || echo refused")
        )
        .trim(),
        "refused"
    );

    // With its sha256, the node fetches it and pushes it in; the container installs it.
    ct.userspace = Some((server.url.clone(), sha256.clone()));
    cli.write(&ct, true);
    let out = cli.expect(&["apply", "--yes"], 0);
    assert!(out.contains("pct push"), "{out}");
    assert!(
        out.contains(&format!(
            "install NVIDIA userspace {version} without the kernel module"
        )),
        "{out}"
    );
    assert_eq!(server.gets(), 2);
    let smi = "nvidia-smi --query-gpu=driver_version --format=csv,noheader; readlink -f /usr/lib/x86_64-linux-gnu/libcuda.so.1";
    assert_eq!(
        cli.guest(&ct, smi),
        format!("{version}\n/usr/lib/x86_64-linux-gnu/libcuda.so.{version}\n")
    );
    assert!(cached.is_file(), "the node keeps the verified installer");
    assert_eq!(
        cli.guest(&ct, pushed).trim(),
        "0",
        "the pushed copy is removed after it ran"
    );
    cli.expect(&["check"], 0);

    // The userspace is lost in the container: apply installs it again from the node's
    // verified copy, without a download.
    cli.guest(&ct, "rm -f /usr/lib/x86_64-linux-gnu/libcuda.so*");
    cli.expect(&["check"], 2);
    cli.expect(&["apply", "--yes"], 0);
    assert_eq!(server.gets(), 2, "the cached installer is reused");
    cli.expect(&["check"], 0);
}
