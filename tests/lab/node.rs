//! The node side against the lab's real node: commands and the agent in a container
//! through `pct exec`/`pct push` over the node's sshd (pinned host key), bootstrap of a
//! container without sshd or key from the lab's apt mirror, host keys recorded so the guest
//! connection is strict from the first contact, root-only config edits under the
//! config lock, and GPU passthrough from the node's live (stand-in) GPU facts applied by
//! real LXC. Needs the lab (`scripts/lab up`, as root).

use crate::cli_support::Provision;
use crate::guestlab;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use guestlab::{Guest, host};
use provision::access::TargetReader;
use provision::agent::client::{AgentBinary, AgentReader};
use provision::compile::{Library, desired_state};
use provision::inventory::container::GpuSelector;
use provision::node::NodeError;
use provision::node::bootstrap::{self, BootstrapSpec, GuestEntry, HostKeyTrust};
use provision::node::config_edit::{self, ConfigEdit, ConfigFile};
use provision::node::gpu::{self as node_gpu, NodeGpus};
use provision::resources::op::Deadline;
use provision::resources::pve_lines::PveLinesSpec;
use provision::resources::wire::{Fact, Facts, Probe};
use provision::resources::{Resource, ResourceSpec};
use provision::transport::pct::PctTransport;
use provision::transport::ssh::{HostKeyPolicy, SshOptions, SshTransport};
use provision::transport::{Transport, TransportError};

/// A node operation's deadline, as its writer gives it: a minute from now.
pub(crate) fn minute() -> Deadline {
    Deadline::after(Duration::from_secs(60))
}
use provision_lab::testkit::ContainerSpec;

const T: Duration = Duration::from_secs(60);

/// A known_hosts of the test's own that pins the lab node's host key.
pub(crate) fn node_ssh_known_hosts(g: &Guest) -> PathBuf {
    let (host, port) = g.lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let pub_key = std::fs::read_to_string(g.lab.dir().join("secrets/ssh_host_ed25519_key.pub"))
        .expect("the lab node's host key");
    let mut parts = pub_key.split_whitespace();
    let line = format!(
        "[{host}]:{port} {} {}\n",
        parts.next().unwrap(),
        parts.next().unwrap()
    );
    let known = g.dir.path().join("node_known_hosts");
    std::fs::write(&known, line).unwrap();
    known
}

/// SSH to the lab node as root, its host key pinned in a known_hosts of the test's own.
pub(crate) fn node_ssh(g: &Guest) -> Arc<dyn Transport> {
    let lab = &g.lab;
    let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let known = node_ssh_known_hosts(g);
    let mut o = SshOptions::new(host);
    o.port = Some(port);
    o.user = Some("root".into());
    o.identity_file = Some(lab.key_path());
    o.known_hosts = Some(known);
    o.ssh_config = Some(PathBuf::from("/dev/null"));
    o.host_key_policy = HostKeyPolicy::Strict;
    Arc::new(SshTransport::connect(&o).expect("node ssh"))
}

/// A strict SSH connection to the guest, as provision makes it after bootstrap.
fn guest_ssh(g: &Guest, known: &Path) -> Result<SshTransport, TransportError> {
    let mut o = SshOptions::new(g.ct.ip.to_string());
    o.port = Some(22);
    o.user = Some("root".into());
    o.identity_file = Some(g.lab.key_path());
    o.known_hosts = Some(known.to_path_buf());
    o.ssh_config = Some(PathBuf::from("/dev/null"));
    o.connect_timeout = Duration::from_secs(5);
    SshTransport::connect(&o)
}

pub(crate) fn sh(t: &dyn Transport, cmd: &str) -> String {
    let out = t.exec(cmd, &[], T).unwrap();
    assert!(
        out.success(),
        "`{cmd}` on {}: {:?} {}",
        t.describe(),
        out.status,
        out.stderr_text()
    );
    out.stdout_text()
}

#[test]
fn commands_files_and_the_agent_go_through_the_node() {
    let g = Guest::new("node-exec");
    let node = node_ssh(&g);
    let ct = PctTransport::new(node.clone(), g.ct.vmid);
    // Inside the container: its own hostname, stdin reaches the command, exit codes pass.
    assert_eq!(sh(&ct, "hostname").trim(), format!("ct{}", g.ct.vmid));
    let started = std::time::Instant::now();
    for _ in 0..10 {
        sh(&ct, "true");
    }
    let through_pct = started.elapsed() / 10;
    let started = std::time::Instant::now();
    for _ in 0..10 {
        sh(node.as_ref(), "true");
    }
    eprintln!(
        "measured: one command through pct exec over node SSH: {through_pct:?}; on the node itself: {:?}",
        started.elapsed() / 10
    );
    let out = ct.exec("cat; exit 7", b"fed through pct", T).unwrap();
    assert_eq!(out.status, Some(7));
    assert_eq!(out.stdout_text(), "fed through pct");
    // pct push writes the file with its mode, atomically beside the destination.
    ct.push(b"pushed\n", "/etc/provision-pushed", 0o640)
        .unwrap();
    assert_eq!(
        g.sh("stat -c '%a %U' /etc/provision-pushed; cat /etc/provision-pushed; ls /etc | grep -c provision-push || true"),
        "640 root\npushed\n1\n"
    );
    // The agent is pushed and answers through the node, as in a container without sshd.
    let agent = AgentReader::new(
        Arc::new(PctTransport::new(node.clone(), g.ct.vmid)),
        Arc::new(AgentBinary::current().unwrap()),
    );
    let probe = Probe::Path(provision::resources::file::PathProbe {
        path: "/etc/provision-pushed".into(),
    });
    let facts = agent.read(std::slice::from_ref(&probe)).unwrap();
    match facts.path(&probe) {
        Ok(Some(p)) => assert_eq!(p.mode, 0o640),
        other => panic!("unexpected fact {other:?}"),
    }
    // A stopped container is an error of the transport, never an empty answer.
    let missing = PctTransport::new(node, 9099);
    match missing.exec("true", &[], T) {
        Err(TransportError::Unreachable { reason, .. }) => {
            assert!(reason.contains("does not exist"), "{reason}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

/// The openssh packages `scripts/lab-deps` keeps, as a flat apt repository on the mirror.
fn openssh_repo(g: &Guest) -> String {
    let cache = std::env::var("LAB_CACHE_DIR").unwrap_or("/var/cache/provision-lab".into());
    let debs = Path::new(&cache).join("debs");
    assert!(
        debs.join(".").exists(),
        "{} is missing: run scripts/lab-deps",
        debs.display()
    );
    let repo = g.mirror_dir.join("apt");
    std::fs::create_dir_all(&repo).unwrap();
    host(&format!(
        "cp {}/openssh-*.deb {} && cd {} && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null",
        debs.display(),
        repo.display(),
        repo.display()
    ));
    format!("deb [trusted=yes] {}/apt ./", g.mirror_url)
}

#[test]
fn bootstrap_installs_sshd_and_the_key_then_ssh_is_strict() {
    let g = Guest::with(
        "node-boot",
        ContainerSpec {
            memory_mb: 1024,
            ..Default::default()
        },
    );
    let node = node_ssh(&g);
    let ct = PctTransport::new(node, g.ct.vmid);
    let source = openssh_repo(&g);
    // A template without sshd or key: take them away through the node.
    sh(
        &ct,
        "systemctl stop ssh.service ssh.socket 2>/dev/null; \
         DEBIAN_FRONTEND=noninteractive apt-get purge -y -q openssh-server >/dev/null && \
         rm -f /root/.ssh/authorized_keys /etc/apt/sources.list.d/*.list && \
         sed -i 's/^deb /# deb /' /etc/apt/sources.list 2>/dev/null; true",
    );
    assert!(!g.ct.ssh("true").unwrap().status.success());
    let key = std::fs::read_to_string(g.lab.key_path().with_extension("pub")).unwrap();
    let spec = BootstrapSpec {
        authorized_keys: vec![key.trim().to_string()],
        apt_sources: vec![(
            "/etc/apt/sources.list.d/lab-mirror.list".into(),
            format!("# Managed by provision.\n{source}\n"),
        )],
    };
    let before = bootstrap::read(&ct, &spec).unwrap();
    assert!(!before.sshd_installed, "{before:?}");
    assert_eq!(before.missing_keys.len(), 1);
    assert!(before.host_keys.is_empty(), "purge removes the host keys");
    assert_eq!(before.actions().len(), 3, "{:?}", before.actions());

    // The keys come through the pinned node, so the first guest connection is strict.
    let known = g.dir.path().join("guest_known_hosts");
    let ip = g.ct.ip.to_string();
    let entry = GuestEntry {
        known_hosts: &known,
        host: &ip,
        port: 22,
    };
    let started = std::time::Instant::now();
    let report = bootstrap::hand_over(&ct, &spec, entry, HostKeyTrust::Recreated).unwrap();
    eprintln!(
        "measured: bootstrap (apt install of openssh-server from the mirror, key, start): {:?}",
        started.elapsed()
    );
    assert_eq!(report.done.len(), 3, "{:?}", report.done);
    assert!(
        report.host_keys.iter().any(|k| k.key_type == "ssh-ed25519"),
        "{report:?}"
    );
    // Installed from the mirror, and nothing left to do.
    let policy = sh(
        &ct,
        "apt-cache policy openssh-server | grep -c 'apt ./' || true",
    );
    assert_eq!(
        policy.trim(),
        "1",
        "openssh-server comes from the lab mirror"
    );
    assert!(bootstrap::read(&ct, &spec).unwrap().actions().is_empty());
    let text = std::fs::read_to_string(&known).unwrap();
    assert_eq!(text.lines().count(), report.host_keys.len(), "{text}");
    // The same keys again (a later run on the existing container): nothing to write.
    let again = bootstrap::record_host_keys(
        &known,
        &ip,
        22,
        g.ct.vmid.into(),
        &report.host_keys,
        HostKeyTrust::Existing,
    );
    assert_eq!(again.unwrap(), 0);
    let guest = guest_ssh(&g, &known).expect("strict SSH after bootstrap");
    assert_eq!(sh(&guest, "hostname").trim(), format!("ct{}", g.ct.vmid));
    drop(guest);

    // Keys changed behind provision's back: the guest connection and the bootstrap refuse.
    sh(
        &ct,
        "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && systemctl restart ssh.service",
    );
    match guest_ssh(&g, &known) {
        Err(TransportError::ChangedHostKey(_)) => {}
        other => panic!("a changed host key must be refused, got {other:?}"),
    }
    let now = bootstrap::read(&ct, &spec).unwrap();
    match bootstrap::record_host_keys(
        &known,
        &ip,
        22,
        g.ct.vmid.into(),
        &now.host_keys,
        HostKeyTrust::Existing,
    ) {
        Err(NodeError::HostKeyChanged { line, .. }) => assert_eq!(line, 1),
        other => panic!("expected HostKeyChanged, got {other:?}"),
    }
    // After provision recreated a container, its new keys replace the old ones.
    bootstrap::record_host_keys(
        &known,
        &ip,
        22,
        g.ct.vmid.into(),
        &now.host_keys,
        HostKeyTrust::Recreated,
    )
    .unwrap();
    let text = std::fs::read_to_string(&known).unwrap();
    assert_eq!(text.lines().count(), now.host_keys.len(), "{text}");
    guest_ssh(&g, &known).expect("strict SSH with the recreated keys");
}

/// The config file and lock of `g`'s container on the lab node.
pub(crate) fn config_file(g: &Guest) -> ConfigFile {
    ConfigFile::new(
        &g.lab.vars["LAB_PVE_ROOT"],
        g.lab.node(),
        &g.lab.vars["LAB_LOCK_DIR"],
        g.ct.vmid.into(),
    )
}

#[test]
fn raw_lines_are_edited_under_the_lock_and_applied_by_lxc() {
    let g = Guest::new("node-conf");
    let node = node_ssh(&g);
    let file = config_file(&g);
    let vmid = g.ct.vmid;
    // Something pending (a running container keeps `nameserver` for its next start) and a
    // snapshot section: both must come through the edit unchanged.
    sh(
        node.as_ref(),
        &format!("pct set {vmid} --nameserver 10.84.0.53"),
    );
    sh(
        node.as_ref(),
        &format!(
            "printf '\\n[before-gpu]\\narch: amd64\\nhostname: ct{vmid}\\nsnaptime: 1700000000\\n' >> {}",
            file.path
        ),
    );
    let read = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    assert!(read.text.contains("[pve:pending]"), "{}", read.text);
    let rest_before = read.text[read.text.find("\n[").unwrap()..].to_string();

    let edit = ConfigEdit {
        add_lxc: vec![("lxc.prlimit.nofile".into(), "4321".into())],
        ..Default::default()
    };
    let back = config_edit::write(node.as_ref(), &file, &read, &edit, minute()).unwrap();
    assert_eq!(
        back.conf.main.lxc,
        vec![("lxc.prlimit.nofile".to_string(), "4321".to_string())]
    );
    assert_eq!(&back.text[back.text.find("\n[").unwrap()..], rest_before);
    // The lab's API and pct read the edited file like Proxmox's (digest included).
    let pct = sh(node.as_ref(), &format!("pct config {vmid}"));
    assert!(pct.contains("lxc.prlimit.nofile: 4321"), "{pct}");
    // Real LXC applies the line at the next start, and the pending change with it.
    sh(
        node.as_ref(),
        &format!("pct stop {vmid} && pct start {vmid}"),
    );
    g.ct.wait_ssh(Duration::from_secs(60)).unwrap();
    let limits = g.sh("grep 'Max open files' /proc/1/limits");
    assert!(limits.split_whitespace().any(|w| w == "4321"), "{limits}");
    let applied = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    assert_eq!(
        applied.conf.get("nameserver"),
        Some("10.84.0.53"),
        "{}",
        applied.text
    );
    assert!(!applied.text.contains("[pve:pending]"), "{}", applied.text);
    assert!(applied.text.contains("[before-gpu]"), "{}", applied.text);

    // Someone changed the config after our read: refused, nothing overwritten.
    let stale = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    sh(node.as_ref(), &format!("pct set {vmid} --onboot 1"));
    let undo = ConfigEdit {
        remove_lxc: edit.add_lxc.clone(),
        ..Default::default()
    };
    match config_edit::write(node.as_ref(), &file, &stale, &undo, minute()) {
        Err(NodeError::Conflict { vmid: v }) => assert_eq!(v, u64::from(vmid)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(
        config_edit::read(node.as_ref(), &file, minute())
            .unwrap()
            .text
            .contains("lxc.prlimit.nofile")
    );
    // An edit whose operation's time is up starts no command (an exec given no time would
    // wait without a bound) and writes nothing.
    let spent = Deadline::after(Duration::ZERO);
    match config_edit::write(node.as_ref(), &file, &stale, &undo, spent) {
        Err(NodeError::OutOfTime { limit_s: 0, .. }) => {}
        other => panic!("expected out of time, got {other:?}"),
    }
    match config_edit::read(node.as_ref(), &file, spent) {
        Err(e @ NodeError::OutOfTime { .. }) => {
            assert!(e.to_string().contains("operation's limit"), "{e}")
        }
        other => panic!("expected out of time, got {other:?}"),
    }

    // The lock held elsewhere (as pct and the API take it): waits, then times out.
    let fresh = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    // `cat` holds the lock until its stdin closes, so the lock ends with this test's pipe.
    let mut holder = std::process::Command::new("flock")
        .arg(&file.lock)
        .arg("cat")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Wait until the holder has the lock, so the test does not race its start.
    while std::process::Command::new("flock")
        .args(["-n", &file.lock, "true"])
        .status()
        .unwrap()
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "flock never took the lock"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = config_edit::write(node.as_ref(), &file, &fresh, &undo, minute());
    drop(holder.stdin.take());
    holder.wait().unwrap();
    match result {
        Err(NodeError::LockTimeout { lock, .. }) => assert_eq!(lock, file.lock),
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    // Released: the same edit goes through.
    let back = config_edit::write(node.as_ref(), &file, &fresh, &undo, minute()).unwrap();
    assert!(back.conf.main.lxc.is_empty());

    // Options pct takes go through `pct set` with the digest; on a running container a
    // feature stays pending until the next start, which the read-back accepts.
    let set = vec![("features".to_string(), "nesting=1,keyctl=1".to_string())];
    let after =
        config_edit::pct_set(node.as_ref(), &file, back.digest(), &set, &[], minute()).unwrap();
    let pending = &after.conf.pending.props;
    assert_eq!(
        after
            .conf
            .get("features")
            .or(pending.get("features").map(String::as_str)),
        Some("nesting=1,keyctl=1")
    );
    match config_edit::pct_set(node.as_ref(), &file, back.digest(), &set, &[], minute()) {
        Err(NodeError::Conflict { .. }) => {}
        other => panic!("a stale digest must be refused, got {other:?}"),
    }
}

const GPU1: &str = "GPU-bd921741-4472-2f2e-9847-d8171173854c";

/// A copy of the lab's stand-in GPUs (real device nodes) that this test may change.
fn gpu_root(g: &Guest) -> String {
    let root = g.dir.path().join("gpu");
    std::fs::create_dir_all(&root).unwrap();
    host(&format!(
        "cp -a {}/. {}",
        g.lab.vars["LAB_GPU_ROOT"],
        root.display()
    ));
    root.display().to_string()
}

/// The passthrough lines the inventory's `gpu-passthrough` role renders from `gpus`.
fn rendered_lines(g: &Guest, gpus: &NodeGpus, method: &str) -> Vec<(String, String)> {
    let path = g.inventory(&format!(
        "        gpus:\n          devices: [{GPU1}]\n          method: {method}\n        roles: [gpu-passthrough]\n"
    ));
    let loaded = provision::inventory::load(&path).unwrap();
    let library = Library::load(&loaded).unwrap();
    // The view the template sees, from the facts read over node SSH.
    let desired = desired_state(&loaded, &library, &|_| Some(gpus.view())).unwrap();
    let mut spec = desired
        .iter()
        .flat_map(|t| &t.resources)
        .find_map(|d| match &d.spec {
            ResourceSpec::PveLines(p) => Some(p.clone()),
            _ => None,
        })
        .expect("the gpu-passthrough role renders lines");
    gpus.localize(&mut spec);
    spec.pairs()
}

/// Opens `path` inside the container: `ENXIO` means the cgroup let it through to a
/// driver that is not there (the stand-in), `EPERM` that the cgroup refused it.
fn open_error(g: &Guest, path: &str) -> String {
    let out = g.ct.ssh(&format!("head -c1 {path}")).unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn restart(g: &Guest, node: &dyn Transport) {
    let vmid = g.ct.vmid;
    sh(node, &format!("pct stop {vmid} && pct start {vmid}"));
    g.ct.wait_ssh(Duration::from_secs(60)).unwrap();
}

#[test]
fn gpu_passthrough_from_live_node_facts_is_applied_by_lxc() {
    let g = Guest::new("node-gpu");
    let node = node_ssh(&g);
    let root = gpu_root(&g);
    let gpus = node_gpu::read(node.as_ref(), &root).unwrap();
    let f = &gpus.facts;
    assert!(f.problems.is_empty(), "{:?}", f.problems);
    assert_eq!(f.driver.as_ref().unwrap().version, "580.159.04");
    assert_eq!(f.gpus.len(), 2);
    assert_eq!(f.major("nvidia-uvm"), Some(238));
    let gpu = f.gpu(&GpuSelector::Uuid(GPU1.into())).unwrap();
    assert_eq!((gpu.info.index, gpu.minor), (1, Some(1)));

    let wanted = rendered_lines(&g, &gpus, "lxc");
    let text: Vec<String> = wanted.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    assert!(
        text.contains(&"lxc.cgroup2.devices.allow: c 238:* rwm".to_string()),
        "{text:#?}"
    );
    assert!(
        text.contains(&format!(
            "lxc.mount.entry: {root}/dev/nvidia1 dev/nvidia1 none bind,optional,create=file"
        )),
        "{text:#?}"
    );
    assert!(!text.iter().any(|l| l.contains("nvidia0")), "{text:#?}");

    // Applied over node SSH as root, then started by real LXC.
    let file = config_file(&g);
    let found = config_edit::read(node.as_ref(), &file, minute())
        .unwrap()
        .pairs();
    let spec = |lines: &[(String, String)]| PveLinesSpec {
        vmid: g.ct.vmid.into(),
        label: "gpu-passthrough".into(),
        lines: lines.iter().map(|(k, v)| format!("{k}: {v}")).collect(),
        owner: None,
        retire: Vec::new(),
    };
    let facts = |raw: &config_edit::RawConfig| {
        let probe = Probe::PveContainer(provision::resources::container::PveContainerProbe {
            vmid: g.ct.vmid.into(),
        });
        Facts::Read(HashMap::from([(
            probe,
            Fact::PveContainer(Some(raw.fact(false))),
        )]))
    };
    let before = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    assert!(spec(&wanted).diff(&facts(&before)).unwrap().is_some());
    assert!(!gpus.edit(&wanted, &found).is_empty());
    let owns = |k: &str, v: &str| gpus.owns(k, v);
    let after = config_edit::converge(node.as_ref(), &file, &wanted, &owns, minute()).unwrap();
    // Converged: a second run reads and writes nothing.
    let again = config_edit::converge(node.as_ref(), &file, &wanted, &owns, minute()).unwrap();
    assert_eq!(again.digest(), after.digest());
    assert!(
        spec(&wanted).diff(&facts(&after)).unwrap().is_none(),
        "{}",
        after.text
    );
    let d = gpus.drift(&after.pairs());
    assert!(d.is_empty(), "{d:?}");
    restart(&g, node.as_ref());
    // Inside: exactly the selected GPU and the shared nodes, with the node's numbers, and
    // the cgroup lets them through; a major it does not allow is refused.
    assert_eq!(
        g.sh("stat -c '%n %F %Hr:%Lr' /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools"),
        "/dev/nvidia1 character special file 195:1\n/dev/nvidiactl character special file 195:255\n\
         /dev/nvidia-uvm character special file 238:0\n/dev/nvidia-uvm-tools character special file 238:1\n"
    );
    assert_eq!(g.sh("ls /dev | grep -c '^nvidia0$' || true").trim(), "0");
    for path in ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        let e = open_error(&g, path);
        assert!(e.contains("No such device or address"), "{path}: {e}");
    }
    g.sh("mknod /root/cap c 241 1");
    assert!(open_error(&g, "/root/cap").contains("Operation not permitted"));

    // Without the `c 195:* rwm` rule the GPU node is refused: the rules are enforced.
    let no_195 = ConfigEdit {
        remove_lxc: vec![("lxc.cgroup2.devices.allow".into(), "c 195:* rwm".into())],
        ..Default::default()
    };
    config_edit::apply(node.as_ref(), &file, &no_195, minute()).unwrap();
    restart(&g, node.as_ref());
    assert!(open_error(&g, "/dev/nvidia1").contains("Operation not permitted"));

    // The driver comes back under another uvm major: the old rule is drift, and the lines
    // rendered from the new facts replace it.
    host(&format!(
        "sed -i 's/^238 nvidia-uvm$/511 nvidia-uvm/' {root}/proc/devices && \
         rm {root}/dev/nvidia-uvm {root}/dev/nvidia-uvm-tools && \
         mknod {root}/dev/nvidia-uvm c 511 0 && mknod {root}/dev/nvidia-uvm-tools c 511 1"
    ));
    let moved = node_gpu::read(node.as_ref(), &root).unwrap();
    assert_eq!(moved.facts.major("nvidia-uvm"), Some(511));
    let now = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let drift = moved.drift(&now.pairs());
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert!(
        drift[0].contains("c 238:* rwm") && drift[0].contains("nvidia-uvm 511"),
        "{drift:?}"
    );
    let wanted = rendered_lines(&g, &moved, "lxc");
    assert!(spec(&wanted).diff(&facts(&now)).unwrap().is_some());
    let edit = moved.edit(&wanted, &now.pairs());
    assert_eq!(
        edit.remove_lxc,
        vec![(
            "lxc.cgroup2.devices.allow".to_string(),
            "c 238:* rwm".to_string()
        )]
    );
    let fixed = config_edit::apply(node.as_ref(), &file, &edit, minute()).unwrap();
    assert!(spec(&wanted).diff(&facts(&fixed)).unwrap().is_none());
    assert!(moved.drift(&fixed.pairs()).is_empty());
    restart(&g, node.as_ref());
    assert_eq!(g.sh("stat -c '%Hr:%Lr' /dev/nvidia-uvm"), "511:0\n");
    assert!(open_error(&g, "/dev/nvidia-uvm").contains("No such device or address"));
    assert!(open_error(&g, "/dev/nvidia1").contains("No such device or address"));
}

/// `provision` against `g`'s inventory with the node's key, its pinned host key and the
/// lab's stand-in GPUs as the node's.
fn provision_gpu_inventory(g: &Guest, gpus: &str, args: &[&str]) -> std::process::Output {
    provision_with_node_ssh(
        g,
        &format!(
            "        gpus:\n          devices: [{gpus}]\n          method: lxc\n        roles: [gpu-passthrough]\n"
        ),
        args,
    )
}

/// `provision ARGS` against `g`'s inventory with `body` (the container's further fields),
/// the node's key, its pinned host key, the lab's config root and the lab's stand-in GPUs
/// as the node's.
pub(crate) fn provision_with_node_ssh(
    g: &Guest,
    body: &str,
    args: &[&str],
) -> std::process::Output {
    let path = g.inventory(body);
    let text = std::fs::read_to_string(&path).unwrap();
    let node_ssh = g.lab.vars["PVE_NODE_SSH"].replacen(':', ", port: ", 1);
    let text = text.replacen(
        &format!("ssh: {{ host: {node_ssh} }}"),
        &format!(
            "ssh: {{ host: {node_ssh}, identity_file: {} }}\n    config_root: {}",
            g.lab.key_path().display(),
            g.lab.vars["LAB_PVE_ROOT"]
        ),
        1,
    );
    assert!(text.contains("identity_file: /"), "{text}");
    std::fs::write(&path, text).unwrap();
    node_ssh_known_hosts(g);
    Provision::new(args)
        .known_hosts(&g.dir.path().join("node_known_hosts"), false)
        .arg(&path)
        .env(node_gpu::ROOT_ENV, &g.lab.vars["LAB_GPU_ROOT"])
        .env_remove("SSH_AUTH_SOCK")
        .output()
}

#[test]
fn plan_refuses_a_gpu_the_node_does_not_have() {
    let g = Guest::new("node-gpu-cli");
    let out = provision_gpu_inventory(&g, "5", &["plan"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("inventory.yaml:"), "{stderr}");
    assert!(
        stderr.contains("container `t`: the node has no GPU 5 (it has 0 GPU-4a0f4724-ce2e-401e-401a-c916ec5586e7, 1 GPU-bd921741-4472-2f2e-9847-d8171173854c)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: select GPUs by the index or UUID"),
        "{stderr}"
    );
}

#[test]
fn gpu_dev_entries_go_through_pct_set_and_reach_the_container() {
    let g = Guest::new("node-gpu-dev");
    let node = node_ssh(&g);
    // The lab's own stand-ins, unchanged here: `devN` shows them at the same path inside,
    // and the container's /tmp is its own tmpfs, so a copy there would be hidden.
    let root = g.lab.vars["LAB_GPU_ROOT"].clone();
    let gpus = node_gpu::read(node.as_ref(), &root).unwrap();
    let wanted = rendered_lines(&g, &gpus, "dev");
    let keys: Vec<&str> = wanted.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["dev0", "dev1", "dev2", "dev3"], "{wanted:?}");
    assert_eq!(wanted[0].1, format!("{root}/dev/nvidia1"));
    let file = config_file(&g);
    let found = config_edit::read(node.as_ref(), &file, minute())
        .unwrap()
        .pairs();
    let edit = gpus.edit(&wanted, &found);
    assert_eq!(edit.set, wanted);
    let after = config_edit::apply(node.as_ref(), &file, &edit, minute()).unwrap();
    let pending = &after.conf.pending.props;
    for (k, v) in &wanted {
        assert_eq!(
            after.conf.get(k).or(pending.get(k).map(String::as_str)),
            Some(v.as_str()),
            "{}",
            after.text
        );
    }
    restart(&g, node.as_ref());
    // `devN` binds the node at its own path and allows exactly it in the cgroup.
    assert_eq!(
        g.sh(&format!(
            "stat -c '%Hr:%Lr' {root}/dev/nvidia1 {root}/dev/nvidia-uvm"
        )),
        "195:1\n238:0\n"
    );
    let e = open_error(&g, &format!("{root}/dev/nvidia1"));
    assert!(e.contains("No such device or address"), "{e}");
    assert_eq!(
        g.sh(&format!("ls {root}/dev | grep -c '^nvidia0$' || true"))
            .trim(),
        "0"
    );
    // Selecting no GPU any more removes the entries passthrough owns.
    let now = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let edit = gpus.edit(&[], &now.pairs());
    assert_eq!(edit.delete, ["dev0", "dev1", "dev2", "dev3"]);
}
