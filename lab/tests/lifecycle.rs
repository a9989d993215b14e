//! `up`, `reinstall` and `down` of a second, private lab instance (own directory, ports,
//! bridge and lock directory), so the shared lab other tests use is never disturbed.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use provision_lab::testkit::{ContainerSpec, LabEnv, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_pve-lab");

/// This process's private lab ports (API, sshd, mirror): free ones, the same for each call.
fn ports() -> (u16, u16, u16) {
    static PORTS: std::sync::OnceLock<(u16, u16, u16)> = std::sync::OnceLock::new();
    *PORTS.get_or_init(|| (free_port(), free_port(), free_port()))
}

fn pve_lab(dir: &Path, args: &[&str]) -> Output {
    let (api, ssh, mirror) = ports();
    Command::new(BIN)
        .args(args)
        .env("LAB_DIR", dir)
        .env("LAB_API_PORT", api.to_string())
        .env("LAB_SSH_PORT", ssh.to_string())
        .env("LAB_MIRROR_PORT", mirror.to_string())
        .env("LAB_BRIDGE", "vmbrlt")
        .env("LAB_BRIDGE_CIDR", "10.213.77.1/24")
        .env("LAB_VETH_PREFIX", "vlt")
        .env("LAB_LOCK_DIR", dir.join("locks"))
        .env_remove("LAB_SHARED_DIR")
        .env_remove("LAB_MIRROR_DIR")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn refuses_clearly_without_root_or_lxc() {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "up",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("error: the lab must run as root") && err.contains("hint: "),
        "{err}"
    );
    let out = Command::new(BIN)
        .arg("up")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("error: `lxc-start` is not installed")
            && err.contains("hint: run scripts/lab-deps"),
        "{err}"
    );
}

#[test]
fn refuses_a_network_another_interface_routes() {
    // The host's own uplink network: a lab bridge there would shadow real hosts.
    let addrs = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&addrs.stdout);
    let Some(cidr) = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .next()
    else {
        panic!("no global IPv4 address on this host: {text}");
    };
    let tmp = tempfile::Builder::new()
        .prefix("lab-subnet-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let out = Command::new(BIN)
        .arg("up")
        .env("LAB_DIR", tmp.path())
        .env("LAB_BRIDGE", "vmbrsn")
        .env("LAB_BRIDGE_CIDR", cidr)
        .env("LAB_API_PORT", "18206")
        .env("LAB_SSH_PORT", "12422")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("is already routed through") && err.contains("hint: set LAB_BRIDGE_CIDR"),
        "{err}"
    );
    assert!(!Path::new("/sys/class/net/vmbrsn").exists());
}

#[test]
fn reinstall_keeps_shared_data_and_down_leaves_nothing() {
    let tmp = tempfile::Builder::new()
        .prefix("lab-lifecycle-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dir = tmp.path();
    // Whatever happens below, this lab goes down before its directory is removed.
    struct Down<'a>(&'a Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = pve_lab(self.0, &["down"]);
        }
    }
    let _down = Down(dir);
    let t = Instant::now();
    let up = pve_lab(dir, &["up"]);
    assert!(up.status.success(), "{}", stderr(&up));
    eprintln!("second lab up in {:?}", t.elapsed());
    let lab = LabEnv::from_exports(&String::from_utf8_lossy(&up.stdout));
    assert_eq!(
        lab.vars["PVE_URL"],
        format!("https://127.0.0.1:{}", ports().0)
    );
    let shared = Path::new(&lab.vars["LAB_SHARED_DIR"]).to_path_buf();
    assert!(shared.starts_with(dir));
    // `up` again is a no-op that prints the same exports.
    let again = pve_lab(dir, &["up"]);
    assert_eq!(
        LabEnv::from_exports(&String::from_utf8_lossy(&again.stdout)).vars,
        lab.vars
    );

    let spec = ContainerSpec {
        privileged: true,
        mounts: vec![(shared.clone(), "/shared".into())],
        ..Default::default()
    };
    let ct = lab.create_container(spec).unwrap();
    ct.ssh_ok("echo model-bytes > /shared/model.bin").unwrap();
    let vmid = ct.vmid;
    std::mem::forget(ct); // the reinstall below is what removes it

    let re = pve_lab(dir, &["reinstall"]);
    assert!(re.status.success(), "{}", stderr(&re));
    let relab = LabEnv::from_exports(&String::from_utf8_lossy(&re.stdout));
    assert_ne!(
        relab.vars["PVE_FINGERPRINT"], lab.vars["PVE_FINGERPRINT"],
        "a reinstalled node has a new certificate"
    );
    assert_eq!(relab.vars["PVE_TOKEN"], lab.vars["PVE_TOKEN"]);
    assert_eq!(
        std::fs::read_to_string(shared.join("model.bin")).unwrap(),
        "model-bytes\n",
        "the /shared stand-in survives"
    );
    let api = relab.api().unwrap();
    assert_eq!(
        api.call("GET", "/nodes/lab/lxc", &[]).unwrap(),
        serde_json::json!([])
    );
    assert!(
        !dir.join(format!("etc/pve/nodes/lab/lxc/{vmid}.conf"))
            .exists()
    );
    assert!(
        !dir.join("cache/unpacked").exists(),
        "unpacked templates are wiped"
    );
    let content = api
        .call("GET", "/nodes/lab/storage/local/content", &[])
        .unwrap();
    assert!(content.to_string().contains(&relab.vars["LAB_TEMPLATE"]));
    let ct = relab.create_container(ContainerSpec::default()).unwrap();
    assert_eq!(ct.ssh_ok("echo rebuilt").unwrap().trim(), "rebuilt");
    std::mem::forget(ct); // `down` must stop it

    let t = Instant::now();
    let down = pve_lab(dir, &["down"]);
    assert!(down.status.success(), "{}", stderr(&down));
    eprintln!("second lab down in {:?}", t.elapsed());
    let running = Command::new("lxc-ls")
        .arg("-P")
        .arg(dir.join("lxc"))
        .arg("--running")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&running.stdout).trim(),
        "",
        "no container left running"
    );
    assert!(
        !Path::new("/sys/class/net/vmbrlt").exists(),
        "bridge removed"
    );
    // The mirror listened on the bridge address, gone with the bridge; loopback ports are checked.
    for (port, what) in [(ports().0, "API"), (ports().1, "sshd")] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "{what} still listening"
        );
    }
    let procs = Command::new("pgrep")
        .args(["-f", &dir.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&procs.stdout).trim(),
        "",
        "no process of this lab left"
    );
}
