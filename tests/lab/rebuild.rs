//! The rebuild after a host reinstall, in one test, through the CLI as a user drives it:
//! a first `apply` on the lab brings up everything from the inventory (the node's model
//! storage, a template the node fetches with its checksum, the container, its guest, a
//! model from the fake hub onto `/shared`, a service health-gated on `/v1/models`); then
//! `scripts/lab reinstall` wipes the node but keeps `/shared`; `check` names everything
//! missing per node and container (exit 2); `apply` fetches and verifies the template,
//! recreates the container, converges its guest, finds the model verified on `/shared`
//! with ZERO model bytes fetched from the hub, and the service is healthy again; host keys
//! are recorded through the node both times (no `--accept-new-host-keys`).
//!
//! A reinstall wipes the node and gives it a new certificate and host key, so the test
//! brings up a private lab of its own (own directory, ports, bridge and lock directory)
//! and takes it down at the end: the shared lab the other tests use is never disturbed.
//! Needs root and the lab's packages (`scripts/test-deps`).

use crate::cli_support::Provision;
use crate::hub_support;
use crate::lab_support::slot;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use fakehub::{Config, FakeHub};
use provision_lab::testkit::{LabEnv, free_port};
use sha2::{Digest, Sha256};

const VMID: u32 = slot::REBUILD.vmid;
const IP_HOST: u32 = slot::REBUILD.ip_host;
const PORT: u16 = 30000;

/// A small server of the user's own that answers `/v1/models` with the model's name (and
/// `/health`, which the gate also asks) once
/// the model's files are on `/shared`: the service the health gate waits for.
const SERVER: &str = r#"import http.server, json, os, sys
path, name = sys.argv[1], sys.argv[2]
if not os.path.isfile(os.path.join(path, "config.json")):
    sys.exit("no model at " + path)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode()
        self.send_response(200 if self.path in ("/v1/models", "/health") else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
print("serving", name, flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", 30000), H).serve_forever()
"#;

struct Rebuild {
    lab: LabEnv,
    dir: tempfile::TempDir,
    store: PathBuf,
    template_file: String,
    served: PathBuf,
}

impl Drop for Rebuild {
    fn drop(&mut self) {
        if let Ok(api) = self.lab.root_api() {
            let node = self.lab.node().to_string();
            let base = format!("/nodes/{node}/lxc/{VMID}");
            for (method, path) in [("POST", format!("{base}/status/stop")), ("DELETE", base)] {
                if let Ok(upid) = api.call(method, &path, &[]) {
                    let _ =
                        api.wait_task(&node, upid.as_str().unwrap_or(""), Duration::from_secs(60));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.store);
        let _ = std::fs::remove_file(&self.served);
        let _ = std::fs::remove_file(
            self.lab
                .dir()
                .join("storage/local/template/cache")
                .join(&self.template_file),
        );
    }
}

impl Rebuild {
    fn ip(&self) -> String {
        let (gw, _) = self.lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        let net: Vec<&str> = gw.split('.').collect();
        format!("{}.{}.{}.{IP_HOST}", net[0], net[1], net[2])
    }

    /// Pins the node's host key (again after a reinstall, which makes a new one) in the
    /// test's known_hosts, keeping what provision recorded for the guest.
    fn pin_node(&self) {
        let (host, port) = self.lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = std::fs::read_to_string(self.lab.dir().join("secrets/ssh_host_ed25519_key.pub"))
            .expect("the lab node's host key");
        let mut parts = key.split_whitespace();
        let entry = format!("[{host}]:{port}");
        let path = self.dir.path().join("known_hosts");
        let mut lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with(&format!("{entry} ")))
            .map(str::to_string)
            .collect();
        lines.push(format!(
            "{entry} {} {}",
            parts.next().unwrap(),
            parts.next().unwrap()
        ));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    }

    fn write(&self, hub: &FakeHub, checksum: &str) {
        let lab = &self.lab;
        let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = lab.key_path();
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let (gw, _) = lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        std::fs::create_dir_all(self.dir.path().join("roles")).unwrap();
        std::fs::write(
            self.dir.path().join("roles/models-api.yaml"),
            format!(
                r#"description: A /v1/models server of the user's own over the model on /shared.
resources:
  - kind: file
    path: /opt/models-api.py
    content: {server:?}
  - kind: file
    path: /etc/systemd/system/models-api.service
    content: "[Unit]\nDescription=models api\n[Service]\nExecStart=/usr/bin/python3 /opt/models-api.py /shared/models/m m\n[Install]\nWantedBy=multi-user.target\n"
  - kind: service
    unit: models-api.service
    unit_path: /etc/systemd/system/models-api.service
    depends_on: ["file:/etc/systemd/system/models-api.service", "file:/opt/models-api.py"]
    readiness: {{ url: "http://127.0.0.1:{PORT}/v1/models", served_model_name: m, deadline_ms: 60000, stall_timeout_ms: 30000, poll_interval_ms: 200 }}
"#,
                server = SERVER
            ),
        )
        .unwrap();
        let text = format!(
            r#"paths: {{ roles: roles }}
nodes:
  lab:
    api:
      url: {{ env: PVE_URL }}
      node: {node}
      password: {{ env: PVE_ROOT_PASSWORD }}
      tls: {{ fingerprint: {{ env: PVE_FINGERPRINT }} }}
    ssh: {{ host: {host}, port: {port}, identity_file: {key} }}
    config_root: {root}
    model_storage: {{ path: {store} }}
    templates:
      - volume: "local:vztmpl/{template}"
        url: "{mirror}{template}"
        checksum: {checksum}
    containers:
      rebuilt:
        vmid: {VMID}
        template: "local:vztmpl/{template}"
        cores: 1
        memory: 512M
        swap: 0
        rootfs: {{ storage: local, size: 2G }}
        unprivileged: false
        network:
          - {{ bridge: {bridge}, ip: {ip}/24, gateway: {gw} }}
        ssh_keys: [{public:?}]
        ssh: {{ identity_file: {key} }}
        mounts: [{{ host: {store}, path: /shared }}]
        roles: [model-store, models-api]
        models:
          m:
            repo: org/model
            revision: {commit}
            path: /shared/models/m
            endpoint: {endpoint}
"#,
            node = lab.node(),
            key = key.display(),
            root = lab.vars["LAB_PVE_ROOT"],
            store = self.store.display(),
            template = self.template_file,
            mirror = lab.vars["LAB_MIRROR_URL"],
            bridge = lab.vars["LAB_BRIDGE"],
            ip = self.ip(),
            public = public.trim(),
            commit = hub.commit("org/model").unwrap(),
            endpoint = hub.endpoint(),
        );
        std::fs::write(self.dir.path().join("inventory.yaml"), text).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        let lab = &self.lab;
        let mut cmd = Provision::new(args)
            .known_hosts(&self.dir.path().join("known_hosts"), false)
            .arg(self.dir.path().join("inventory.yaml"))
            .clean_env(Some(self.dir.path()))
            .env("PROVISION_NODE_LOCK_DIR", &lab.vars["LAB_LOCK_DIR"]);
        for k in ["PVE_URL", "PVE_FINGERPRINT", "PVE_ROOT_PASSWORD"] {
            cmd = cmd.env(k, &lab.vars[k]);
        }
        cmd.output()
    }

    fn expect(&self, args: &[&str], code: i32) -> String {
        let o = self.run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.status.code(), Some(code), "provision {args:?}:\n{text}");
        text
    }

    /// A command in the guest over SSH, strict against the keys provision recorded.
    fn guest(&self, cmd: &str) -> String {
        let o = Command::new("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-o"])
            .arg("StrictHostKeyChecking=yes")
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.path().join("known_hosts").display()
            ))
            .arg("-i")
            .arg(self.lab.key_path())
            .arg(format!("root@{}", self.ip()))
            .arg(cmd)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "`{cmd}` in the guest: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// `scripts/lab ARG` with none of the shared lab's settings in its environment.
fn lab_script(arg: &str) -> Command {
    let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lab"));
    cmd.arg(arg);
    for (k, _) in std::env::vars() {
        if k.starts_with("LAB_") || k.starts_with("PVE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A lab of this test's own, down again when dropped (after everything in it).
struct PrivateLab {
    dir: tempfile::TempDir,
    /// API, sshd and mirror ports: free ones, taken when the lab is made.
    ports: (u16, u16, u16),
}

impl PrivateLab {
    fn settings(&self, cmd: &mut Command) {
        let dir = self.dir.path();
        let (api, ssh, mirror) = self.ports;
        cmd.env("LAB_DIR", dir)
            .env("LAB_API_PORT", api.to_string())
            .env("LAB_SSH_PORT", ssh.to_string())
            .env("LAB_MIRROR_PORT", mirror.to_string())
            .env("LAB_BRIDGE", "vmbrrb")
            .env("LAB_BRIDGE_CIDR", "10.213.79.1/24")
            .env("LAB_VETH_PREFIX", "vrb")
            .env("LAB_LOCK_DIR", dir.join("locks"));
    }

    fn up() -> (PrivateLab, LabEnv) {
        let lab = PrivateLab {
            dir: tempfile::Builder::new()
                .prefix("lab-rebuild-")
                .tempdir_in("/var/tmp")
                .unwrap(),
            ports: (free_port(), free_port(), free_port()),
        };
        let mut cmd = lab_script("up");
        lab.settings(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "scripts/lab up (the rebuild test's own lab; run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = LabEnv::from_exports(&String::from_utf8_lossy(&out.stdout));
        (lab, env)
    }
}

impl Drop for PrivateLab {
    fn drop(&mut self) {
        let mut cmd = lab_script("down");
        self.settings(&mut cmd);
        let _ = cmd.output();
    }
}

/// `scripts/lab reinstall` for this lab: the node wiped, `/shared` and the mirror kept.
fn reinstall(lab: &LabEnv) -> LabEnv {
    let mut cmd = lab_script("reinstall");
    for (k, v) in &lab.vars {
        if k.starts_with("LAB_") {
            cmd.env(k, v);
        }
    }
    // The ports are settings of `up`, not exports: the same ones again.
    let port = |url: &str| {
        url.trim_end_matches('/')
            .rsplit(':')
            .next()
            .unwrap()
            .to_string()
    };
    cmd.env("LAB_API_PORT", port(&lab.vars["PVE_URL"]))
        .env("LAB_SSH_PORT", port(&lab.vars["PVE_NODE_SSH"]))
        .env(
            "LAB_MIRROR_PORT",
            port(lab.vars["LAB_MIRROR_URL"].trim_end_matches('/')),
        );
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "scripts/lab reinstall: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    LabEnv::from_exports(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn rebuild_after_a_host_reinstall_fetches_no_model_bytes() {
    let (_private, lab) = PrivateLab::up();
    let ip: IpAddr = lab.vars["LAB_BRIDGE_CIDR"]
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let hub = FakeHub::start(Config {
        listen: SocketAddr::new(ip, 0),
        repos: vec![hub_support::model("org/model")],
        ..Config::default()
    })
    .expect("the fake hub listens on the lab bridge");
    // The lab's own template under a name of this test's, served by the mirror, so the
    // node has to fetch it (a reinstall puts only the lab's own name back).
    let cached = lab.vars["LAB_TEMPLATE"]
        .strip_prefix("local:vztmpl/")
        .unwrap()
        .to_string();
    let template_file = format!(
        "debian-12-rebuild{}_12.4-1_amd64.tar.zst",
        std::process::id()
    );
    let served = PathBuf::from(&lab.vars["LAB_MIRROR_DIR"]).join(&template_file);
    let r = Rebuild {
        store: PathBuf::from(&lab.vars["LAB_SHARED_DIR"])
            .join(format!("rebuild-{}", std::process::id())),
        template_file,
        served: served.clone(),
        dir: tempfile::tempdir().unwrap(),
        lab,
    };
    let source = r
        .lab
        .dir()
        .join("storage/local/template/cache")
        .join(&cached);
    let _ = std::fs::remove_file(&served);
    if std::fs::hard_link(&source, &served).is_err() {
        std::fs::copy(&source, &served).unwrap();
    }
    let checksum = hex::encode(Sha256::digest(std::fs::read(&served).unwrap()));
    r.pin_node();
    r.write(&hub, &checksum);

    // First apply, from an empty node.
    let started = Instant::now();
    let first = r.expect(&["apply", "--yes"], 0);
    let first_took = started.elapsed();
    assert!(
        first.contains(&format!("download local:vztmpl/{}", r.template_file)),
        "{first}"
    );
    let fetched = hub.stats().bytes_served;
    assert!(fetched > 0, "the first apply downloads the model");
    assert!(r.store.join("models/m/config.json").is_file());
    assert_eq!(
        r.guest("systemctl is-active models-api.service"),
        "active\n"
    );
    r.expect(&["check"], 0);

    // The node is reinstalled: containers, configs, templates and host keys gone, /shared kept.
    let mut r = r;
    r.lab = reinstall(&r.lab);
    r.pin_node();
    assert!(
        r.store.join("models/m/config.json").is_file(),
        "/shared survives"
    );
    hub.reset_stats();

    let check = r.expect(&["check"], 2);
    assert!(
        check.contains(&format!("+ template local:vztmpl/{}", r.template_file)),
        "{check}"
    );
    assert!(check.contains("container rebuilt"), "{check}");
    assert!(
        check.contains("it will be recreated from the inventory"),
        "{check}"
    );
    assert!(
        check.contains(&format!(
            "the model storage {} is already there and is reused as /shared",
            r.store.display()
        )),
        "{check}"
    );
    assert!(check.contains("guest rebuilt"), "{check}");

    let started = Instant::now();
    let rebuilt = r.expect(&["apply", "--yes"], 0);
    let rebuild_took = started.elapsed();
    assert!(
        rebuilt.contains(&format!("download local:vztmpl/{}", r.template_file)),
        "{rebuilt}"
    );
    let stats = hub.stats();
    assert_eq!(
        stats.bytes_served, 0,
        "no model byte fetched on rebuild: {stats:?}"
    );
    assert_eq!(
        r.guest("systemctl is-active models-api.service"),
        "active\n"
    );
    r.expect(&["check"], 0);
    eprintln!(
        "first apply {:.1} s ({fetched} model bytes), rebuild {:.1} s (0 model bytes)",
        first_took.as_secs_f64(),
        rebuild_took.as_secs_f64()
    );
}
