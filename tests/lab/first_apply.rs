//! What llm-two's first real apply needs of the node and the workstation, through the CLI
//! against the lab (its API, its node's SSH, real LXC):
//! - a container provision creates gets the key provision logs in with (llm-two declares
//!   no `ssh_keys`): with only `ssh.identity_file` (a key this test makes, which the lab
//!   template does not hold), `apply` from an empty node creates, bootstraps and converges
//!   the guest; with no key at all (no identity file, no agent, nothing in ~/.ssh), `plan`
//!   refuses with a hint and nothing is created;
//! - a privilege-separated API token (the lab's `root@pam!privsep`, granted VM and
//!   datastore privileges but not `Sys.Modify`) is refused at `plan` for a privileged
//!   container, naming the privilege read from the node; an unprivileged one plans;
//! - a rootfs storage the node does not have (`local-zfs` on a non-ZFS install) and a bind
//!   mount's missing host directory are refused at `plan`, before anything is created.
//!
//! Needs root and the lab.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli_support::Provision;
use crate::lab_support::{Slot, cleanup, lab, slot};
use provision_lab::testkit::LabEnv;

/// The lab's network address with host part `host`.
fn ip(lab: &LabEnv, host: u32) -> String {
    let (gw, _) = lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
    let net: Vec<&str> = gw.split('.').collect();
    format!("{}.{}.{}.{host}", net[0], net[1], net[2])
}

/// An inventory of one container with node SSH and no `ssh_keys`; `identity` is the
/// guest's `ssh.identity_file`, when any.
fn inventory(dir: &Path, lab: &LabEnv, at: Slot, identity: Option<&Path>) -> PathBuf {
    let vmid = at.vmid;
    let (node_host, node_port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let (gw, _) = lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
    std::fs::create_dir_all(dir.join("roles")).unwrap();
    std::fs::write(
        dir.join("roles/app.yaml"),
        "description: A file.\nresources:\n  - kind: file\n    path: /etc/app.conf\n    content: \"keyed\\n\"\n",
    )
    .unwrap();
    let ssh = identity.map_or("ssh: { user: root }".to_string(), |k| {
        format!("ssh: {{ user: root, identity_file: {} }}", k.display())
    });
    let text = format!(
        r#"paths: {{ roles: roles }}
nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      password: {{ env: PVE_ROOT_PASSWORD }}
      tls: {{ fingerprint: {{ env: PVE_FINGERPRINT }} }}
    ssh: {{ host: {node_host}, port: {node_port}, identity_file: {node_key} }}
    config_root: {root}
    containers:
      keys-{vmid}:
        vmid: {vmid}
        template: {template}
        cores: 1
        memory: 512M
        rootfs: {{ storage: local, size: 2G }}
        unprivileged: false
        network:
          - {{ bridge: {bridge}, ip: {ip}/24, gateway: {gw} }}
        {ssh}
        roles: [app]
"#,
        node = lab.node(),
        node_key = lab.key_path().display(),
        root = lab.vars["LAB_PVE_ROOT"],
        template = lab.vars["LAB_TEMPLATE"],
        bridge = lab.vars["LAB_BRIDGE"],
        ip = ip(lab, at.ip_host),
    );
    let path = dir.join("inventory.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `provision ARGS INVENTORY` with the lab's exports, `home` as HOME, no ssh-agent, and a
/// known_hosts pinning the lab node.
fn provision(lab: &LabEnv, home: &Path, args: &[&str], inventory: &Path) -> (i32, String) {
    let known = home.join("known_hosts");
    if !known.exists() {
        let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = std::fs::read_to_string(lab.dir().join("secrets/ssh_host_ed25519_key.pub"))
            .expect("the lab node's host key");
        let mut parts = key.split_whitespace();
        let line = format!(
            "[{host}]:{port} {} {}\n",
            parts.next().unwrap(),
            parts.next().unwrap()
        );
        std::fs::write(&known, line).unwrap();
    }
    let mut cmd = Provision::new(args)
        .known_hosts(&known, false)
        .arg(inventory)
        .clean_env(Some(home))
        .env("PROVISION_NODE_LOCK_DIR", &lab.vars["LAB_LOCK_DIR"]);
    for k in [
        "PVE_URL",
        "PVE_FINGERPRINT",
        "PVE_ROOT_PASSWORD",
        "LAB_PRIVSEP_TOKEN",
    ] {
        cmd = cmd.env(
            k,
            lab.vars
                .get(k)
                .expect("the lab exports it (scripts/lab up)"),
        );
    }
    let ran = cmd.run();
    (ran.code, ran.text())
}

#[test]
fn a_new_container_gets_the_identity_files_key_without_ssh_keys() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::FIRST_KEYED);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("guest_key");
    let made = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "keys-lab-login",
            "-f",
        ])
        .arg(&key)
        .status()
        .unwrap();
    assert!(made.success());
    let inv = inventory(dir.path(), &lab, slot::FIRST_KEYED, Some(&key));

    let (code, plan) = provision(&lab, dir.path(), &["plan", "--detailed-exitcode"], &inv);
    assert_eq!(code, 2, "{plan}");
    assert!(plan.contains("keys-lab-login"), "{plan}");
    assert!(
        plan.contains(&format!("from identity file {}.pub", key.display())),
        "{plan}"
    );

    let (code, out) = provision(&lab, dir.path(), &["apply", "--yes"], &inv);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("write /etc/app.conf"), "{out}");
    // The guest answers that key, and only because the create gave it.
    let guest = Command::new("ssh")
        .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-o"])
        .arg(format!(
            "UserKnownHostsFile={}",
            dir.path().join("known_hosts").display()
        ))
        .arg("-i")
        .arg(&key)
        .arg(format!("root@{}", ip(&lab, slot::FIRST_KEYED.ip_host)))
        .arg("cat /etc/app.conf /root/.ssh/authorized_keys")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&guest.stdout);
    assert!(
        guest.status.success(),
        "{}",
        String::from_utf8_lossy(&guest.stderr)
    );
    assert!(text.starts_with("keyed\n"), "{text}");
    assert_eq!(text.matches("keys-lab-login").count(), 1, "{text}");
    let (code, out) = provision(&lab, dir.path(), &["check"], &inv);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn no_key_to_log_in_with_is_refused_before_anything_is_created() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::FIRST_NO_KEY);
    let dir = tempfile::tempdir().unwrap();
    let inv = inventory(dir.path(), &lab, slot::FIRST_NO_KEY, None);
    for verb in [&["plan"][..], &["apply", "--yes"][..]] {
        let (code, out) = provision(&lab, dir.path(), verb, &inv);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains("provision has no SSH key to log in to container `keys-9276` with"),
            "{out}"
        );
        assert!(out.contains("identity_file"), "{out}");
        assert!(out.contains("inventory.yaml:"), "{out}");
    }
    let conf =
        Path::new(&lab.vars["LAB_PVE_ROOT"]).join(format!("nodes/{}/lxc/9276.conf", lab.node()));
    assert!(!conf.exists(), "CT 9276 was created");
}

#[test]
fn a_storage_and_a_host_directory_the_node_lacks_are_refused_at_plan() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::FIRST_ABSENT);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("guest_key");
    assert!(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let inv = inventory(dir.path(), &lab, slot::FIRST_ABSENT, Some(&key));
    let present = dir.path().join("present");
    std::fs::create_dir_all(&present).unwrap();
    let text = std::fs::read_to_string(&inv).unwrap().replace(
        "rootfs: { storage: local, size: 2G }",
        &format!(
            "rootfs: {{ storage: local-zfs, size: 2G }}\n        mounts:\n          - {{ host: {}, path: /present }}\n          - {{ host: /srv/provision-test-absent-9278, path: /shared }}",
            present.display()
        ),
    );
    std::fs::write(&inv, text).unwrap();
    for verb in [&["plan"][..], &["apply", "--yes"][..]] {
        let (code, out) = provision(&lab, dir.path(), verb, &inv);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains(&format!(
                "storage `local-zfs` does not exist on node `{}`",
                lab.node()
            )),
            "{out}"
        );
        assert!(
            out.contains("storages there that hold containers: local"),
            "{out}"
        );
        assert!(
            out.contains("host directory /srv/provision-test-absent-9278 does not exist"),
            "{out}"
        );
        assert!(
            !out.contains(&format!("host directory {} ", present.display())),
            "{out}"
        );
        assert!(out.contains("inventory.yaml:"), "{out}");
    }
    let conf =
        Path::new(&lab.vars["LAB_PVE_ROOT"]).join(format!("nodes/{}/lxc/9278.conf", lab.node()));
    assert!(!conf.exists(), "CT 9278 was created");
}

#[test]
fn a_privilege_separated_token_lacking_sys_modify_is_refused_at_plan() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::FIRST_TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("guest_key");
    assert!(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let inv = inventory(dir.path(), &lab, slot::FIRST_TOKEN, Some(&key));
    let text = std::fs::read_to_string(&inv).unwrap().replace(
        "password: { env: PVE_ROOT_PASSWORD }",
        "token: { env: LAB_PRIVSEP_TOKEN }",
    );
    std::fs::write(&inv, &text).unwrap();
    for verb in [&["plan"][..], &["apply", "--yes"][..]] {
        let (code, out) = provision(&lab, dir.path(), verb, &inv);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.contains(&format!(
                "the API token of node `{}` lacks 1 privilege(s) this plan needs",
                lab.node()
            )),
            "{out}"
        );
        assert!(
            out.contains("Sys.Modify on / (create a privileged container: `unprivileged: false`)"),
            "{out}"
        );
        assert!(out.contains("--privsep 0"), "{out}");
    }
    let conf =
        Path::new(&lab.vars["LAB_PVE_ROOT"]).join(format!("nodes/{}/lxc/9279.conf", lab.node()));
    assert!(!conf.exists(), "CT 9279 was created");
    // Unprivileged, the same token has every privilege the create needs: it plans.
    std::fs::write(
        &inv,
        text.replace("unprivileged: false", "unprivileged: true"),
    )
    .unwrap();
    let (code, out) = provision(&lab, dir.path(), &["plan", "--detailed-exitcode"], &inv);
    assert_eq!(code, 2, "{out}");
}
