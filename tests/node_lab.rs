//! The node side against the lab's real node: commands and the agent in a container
//! through `pct exec`/`pct push` over the node's sshd (pinned host key), bootstrap of a
//! container without sshd or key from the lab's apt mirror, host keys recorded so the guest
//! connection is strict from the first contact. Needs the lab (`scripts/lab up`, as root).

#[path = "support/guestlab.rs"]
mod guestlab;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use guestlab::{Guest, host};
use provision::agent::client::{AgentBinary, AgentClient};
use provision::engine::facts::{Fact, Probe};
use provision::node::NodeError;
use provision::node::bootstrap::{self, BootstrapSpec, HostKeyTrust};
use provision::transport::node::NodeTransport;
use provision::transport::ssh::{HostKeyPolicy, SshOptions, SshTransport};
use provision::transport::{Transport, TransportError};
use provision_lab::testkit::ContainerSpec;

const T: Duration = Duration::from_secs(60);

/// SSH to the lab node as root, its host key pinned in a known_hosts of the test's own.
fn node_ssh(g: &Guest) -> Arc<dyn Transport> {
    let lab = &g.lab;
    let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let pub_key = std::fs::read_to_string(lab.dir().join("secrets/ssh_host_ed25519_key.pub"))
        .expect("the lab node's host key");
    let known = g.dir.path().join("node_known_hosts");
    let mut parts = pub_key.split_whitespace();
    let line = format!(
        "[{host}]:{port} {} {}\n",
        parts.next().unwrap(),
        parts.next().unwrap()
    );
    std::fs::write(&known, line).unwrap();
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

fn sh(t: &dyn Transport, cmd: &str) -> String {
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
    let ct = NodeTransport::new(node.clone(), g.ct.vmid);
    // Inside the container: its own hostname, stdin reaches the command, exit codes pass.
    assert_eq!(sh(&ct, "hostname").trim(), format!("ct{}", g.ct.vmid));
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
    let agent = AgentClient::new(
        Arc::new(NodeTransport::new(node.clone(), g.ct.vmid)),
        Arc::new(AgentBinary::from_path(env!("CARGO_BIN_EXE_provision").into()).unwrap()),
    );
    let probe = Probe::Path {
        path: "/etc/provision-pushed".into(),
    };
    let facts = agent.probe(std::slice::from_ref(&probe)).unwrap();
    match &facts[&probe] {
        Fact::Path(Some(p)) => assert_eq!(p.mode, 0o640),
        other => panic!("unexpected fact {other:?}"),
    }
    // A stopped container is an error of the transport, never an empty answer.
    let missing = NodeTransport::new(node, 9099);
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
    let ct = NodeTransport::new(node, g.ct.vmid);
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

    let report = bootstrap::run(&ct, &spec).unwrap();
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

    // The keys came through the pinned node, so the first guest connection is strict.
    let known = g.dir.path().join("guest_known_hosts");
    let ip = g.ct.ip.to_string();
    let n = bootstrap::record_host_keys(
        &known,
        &ip,
        22,
        g.ct.vmid.into(),
        &report.host_keys,
        HostKeyTrust::Recreated,
    )
    .unwrap();
    assert_eq!(n, report.host_keys.len());
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
