//! The node's own resources (`node.NAME`) on the lab, through the CLI as a user runs it:
//! the directory model store made and left intact on re-apply, a store in the way refused
//! with the evidence, a template fetched by the node with its checksum when missing and a
//! wrong checksum refused with nothing kept, and the NVIDIA host checks on the outputs
//! captured on a real H200 node (the unit written under the node's root, never this
//! machine's `/etc`). Needs root and the lab (`eval "$(scripts/lab up)"`).

use crate::cli_support::Provision;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::lab_support::lab;
use provision_lab::testkit::LabEnv;
use sha2::{Digest, Sha256};

/// A scratch folder removed on drop, with everything the test made outside it listed for
/// removal too.
struct Scratch {
    dir: tempfile::TempDir,
    extra: Vec<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.extra {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        }
    }
}

fn scratch() -> Scratch {
    Scratch {
        dir: tempfile::tempdir().unwrap(),
        extra: Vec::new(),
    }
}

/// The node's part of an inventory (no containers), `host` added under the node.
fn inventory(lab: &LabEnv, s: &Scratch, host: &str) -> PathBuf {
    let (addr, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let text = format!(
        r#"nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      token: {{ env: PVE_TOKEN }}
      tls:
        fingerprint: {{ env: PVE_FINGERPRINT }}
    ssh: {{ host: {addr}, port: {port}, identity_file: {key} }}
{host}"#,
        node = lab.node(),
        key = lab.key_path().display(),
    );
    let path = s.dir.path().join("inventory.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A known_hosts that pins the lab node's host key.
fn known_hosts(lab: &LabEnv, s: &Scratch) -> PathBuf {
    let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
    let key = std::fs::read_to_string(lab.dir().join("secrets/ssh_host_ed25519_key.pub")).unwrap();
    let mut parts = key.split_whitespace();
    let line = format!(
        "[{host}]:{port} {} {}\n",
        parts.next().unwrap(),
        parts.next().unwrap()
    );
    let path = s.dir.path().join("known_hosts");
    std::fs::write(&path, line).unwrap();
    path
}

/// `provision ARGS INVENTORY --target node.lab` with the lab's exports; `root` is the
/// node's root (`PROVISION_NODE_ROOT`).
fn provision(lab: &LabEnv, s: &Scratch, args: &[&str], root: Option<&Path>) -> Output {
    let mut cmd = Provision::new(args)
        .arg(s.dir.path().join("inventory.yaml"))
        .args(["--target", "node.lab"])
        .known_hosts(&known_hosts(lab, s), false)
        .clean_env(None)
        .lab_api(&lab.vars);
    if let Some(r) = root {
        cmd = cmd.env("PROVISION_NODE_ROOT", r);
    }
    cmd.output()
}

fn expect(o: &Output, code: i32) -> String {
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(code), "{t}");
    t
}

fn unique(what: &str) -> String {
    format!("host-{what}-{}", std::process::id())
}

#[test]
fn directory_store_is_created_then_left_intact() {
    let lab = lab();
    let mut s = scratch();
    let store = PathBuf::from(&lab.vars["LAB_SHARED_DIR"]).join(unique("store"));
    s.extra.push(store.clone());
    let _ = std::fs::remove_dir_all(&store);
    inventory(
        &lab,
        &s,
        &format!("    model_storage: {{ path: {} }}\n", store.display()),
    );
    let plan = expect(&provision(&lab, &s, &["check"], None), 2);
    assert!(plan.contains("node lab"), "{plan}");
    assert!(
        plan.contains(&format!("+ model_storage {}", store.display())),
        "{plan}"
    );
    assert!(!store.exists(), "check wrote nothing");
    expect(&provision(&lab, &s, &["apply", "--yes"], None), 0);
    assert!(store.is_dir());
    // Models land there; a second apply changes nothing and keeps them.
    std::fs::create_dir_all(store.join("models/m")).unwrap();
    std::fs::write(store.join("models/m/weights.safetensors"), b"weights").unwrap();
    let again = expect(&provision(&lab, &s, &["apply", "--yes"], None), 0);
    assert!(again.contains("No changes"), "{again}");
    assert_eq!(
        std::fs::read(store.join("models/m/weights.safetensors")).unwrap(),
        b"weights"
    );
    expect(&provision(&lab, &s, &["check"], None), 0);
}

#[test]
fn a_file_in_the_stores_place_is_a_conflict_and_kept() {
    let lab = lab();
    let mut s = scratch();
    let store = PathBuf::from(&lab.vars["LAB_SHARED_DIR"]).join(unique("in-the-way"));
    s.extra.push(store.clone());
    std::fs::write(&store, b"someone's data").unwrap();
    inventory(
        &lab,
        &s,
        &format!("    model_storage: {{ path: {} }}\n", store.display()),
    );
    let check = expect(&provision(&lab, &s, &["check"], None), 2);
    assert!(check.contains("is a File, not a directory"), "{check}");
    let apply = expect(&provision(&lab, &s, &["apply", "--yes"], None), 1);
    assert!(apply.contains("nothing was changed"), "{apply}");
    assert!(apply.contains("is a File, not a directory"), "{apply}");
    assert_eq!(std::fs::read(&store).unwrap(), b"someone's data");
}

/// The template's file in the node's storage.
fn in_storage(lab: &LabEnv, file: &str) -> PathBuf {
    lab.dir().join("storage/local/template/cache").join(file)
}

fn listed(lab: &LabEnv, volume: &str) -> bool {
    let data = lab
        .api()
        .unwrap()
        .call(
            "GET",
            &format!("/nodes/{}/storage/local/content", lab.node()),
            &[("content", "vztmpl")],
        )
        .unwrap();
    data.as_array()
        .unwrap()
        .iter()
        .any(|v| v["volid"] == volume)
}

#[test]
fn a_missing_template_is_fetched_with_its_checksum_and_a_wrong_one_refused() {
    let lab = lab();
    let mut s = scratch();
    let file = format!("{}_1.0-1_amd64.tar.zst", unique("tmpl"));
    let volume = format!("local:vztmpl/{file}");
    let served = PathBuf::from(&lab.vars["LAB_MIRROR_DIR"]).join(&file);
    s.extra.push(served.clone());
    s.extra.push(in_storage(&lab, &file));
    let body = format!("a template standing in for {file}\n").repeat(1000);
    std::fs::write(&served, &body).unwrap();
    let good = hex::encode(Sha256::digest(body.as_bytes()));
    let wrong = hex::encode(Sha256::digest(b"something else"));
    let url = format!("{}{file}", lab.vars["LAB_MIRROR_URL"]);
    let write = |sum: &str| {
        inventory(
            &lab,
            &s,
            &format!(
                "    templates:\n      - {{ volume: \"{volume}\", url: \"{url}\", checksum: {sum}, checksum_algorithm: sha256 }}\n"
            ),
        )
    };
    write(&wrong);
    let check = expect(&provision(&lab, &s, &["check"], None), 2);
    assert!(check.contains(&format!("+ template {volume}")), "{check}");
    assert!(check.contains(&format!("sha256 = {wrong}")), "{check}");
    let refused = expect(&provision(&lab, &s, &["apply", "--yes"], None), 1);
    assert!(refused.contains("checksum mismatch"), "{refused}");
    assert!(
        !listed(&lab, &volume),
        "nothing is kept after a wrong checksum"
    );
    assert!(!in_storage(&lab, &file).exists());

    write(&good);
    let applied = expect(&provision(&lab, &s, &["apply", "--yes"], None), 0);
    assert!(applied.contains(&format!("download {volume}")), "{applied}");
    assert!(listed(&lab, &volume));
    assert_eq!(
        std::fs::read(in_storage(&lab, &file)).unwrap(),
        body.as_bytes()
    );
    expect(&provision(&lab, &s, &["check"], None), 0);
}

/// A node root made from what was captured on a real H200 node: the driver's version file,
/// the UVM device node (a plain file standing in), and a kernel command line.
fn gpu_root(s: &Scratch, uvm: bool) -> PathBuf {
    let root = s.dir.path().join("node-root");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu/h200x2");
    std::fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::copy(
        fixtures.join("proc-driver-version.txt"),
        root.join("proc/driver/nvidia/version"),
    )
    .unwrap();
    std::fs::write(
        root.join("proc/cmdline"),
        "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet\n",
    )
    .unwrap();
    if uvm {
        std::fs::write(root.join("dev/nvidia-uvm"), "").unwrap();
    }
    root
}

#[test]
fn nvidia_host_checks_on_an_h200_nodes_outputs() {
    let lab = lab();
    let s = scratch();
    let root = gpu_root(&s, false);
    // The pinned driver is the loaded one (580.159.04): only the boot-time pieces differ.
    inventory(
        &lab,
        &s,
        "    nvidia:\n      driver: \"580.159\"\n      kernel_cmdline: [iommu=pt]\n",
    );
    let check = expect(&provision(&lab, &s, &["check"], Some(&root)), 2);
    assert!(check.contains("~ nvidia_host driver 580.159"), "{check}");
    assert!(!check.contains("driver ="), "the module matches: {check}");
    assert!(
        check.contains("nvidia-persistenced.service = disabled, not running -> enabled, running"),
        "{check}"
    );
    assert!(
        check.contains("nvidia-uvm-init.service     = absent -> enabled"),
        "{check}"
    );
    assert!(check.contains("/dev/nvidia-uvm"), "{check}");
    assert!(
        check.contains("kernel command line lacks `iommu=pt`")
            && check.contains("GRUB_CMDLINE_LINUX_DEFAULT"),
        "{check}"
    );
    // nvidia-persistenced comes with the driver, which this root does not have installed.
    let apply = expect(&provision(&lab, &s, &["apply", "--yes"], Some(&root)), 1);
    assert!(
        apply.contains("nvidia-persistenced.service: not installed on the node"),
        "{apply}"
    );

    // Without persistenced, the UVM unit is written and enabled under the node's root.
    let root = gpu_root(&s, true);
    inventory(
        &lab,
        &s,
        "    nvidia: { driver: \"580.159.04\", persistenced: false }\n",
    );
    expect(&provision(&lab, &s, &["apply", "--yes"], Some(&root)), 0);
    let unit = root.join("etc/systemd/system/nvidia-uvm-init.service");
    assert!(
        std::fs::read_to_string(&unit)
            .unwrap()
            .contains("ExecStart=/usr/bin/nvidia-modprobe -u -c0")
    );
    let link = root.join("etc/systemd/system/multi-user.target.wants/nvidia-uvm-init.service");
    assert_eq!(
        std::fs::read_link(link).unwrap(),
        Path::new("/etc/systemd/system/nvidia-uvm-init.service")
    );
    assert!(!Path::new("/etc/systemd/system/nvidia-uvm-init.service").exists());
    expect(&provision(&lab, &s, &["check"], Some(&root)), 0);

    // Another pin: drift with the remedy, and the install only with --install-driver.
    inventory(
        &lab,
        &s,
        "    nvidia:\n      driver: \"550.127.05\"\n      persistenced: false\n      installer: { path: /root/NVIDIA-Linux-x86_64-550.127.05.run, sha256: 0000000000000000000000000000000000000000000000000000000000000000 }\n",
    );
    let drift = expect(&provision(&lab, &s, &["check"], Some(&root)), 2);
    assert!(
        drift.contains("driver = 580.159.04 -> 550.127.05"),
        "{drift}"
    );
    assert!(
        drift.contains("install NVIDIA driver 550.127.05 on the node and reboot")
            && drift.contains("the containers' userspace must be 550.127.05 too"),
        "{drift}"
    );
    let refused = expect(&provision(&lab, &s, &["apply", "--yes"], Some(&root)), 1);
    assert!(
        refused.contains("runs only with `apply --install-driver`"),
        "{refused}"
    );
    assert!(refused.contains("nothing was changed"), "{refused}");
}
