//! Guests other than the lab's Debian 12: one `apply` creates a container from a Debian 11
//! template (glibc 2.31, OpenSSL 1.1, as Proxmox VE 7 nodes and many long-lived guests
//! are) and one from a Debian 13 template (glibc 2.41), bootstraps both through the node,
//! and converges each guest (an APT package from the lab's own repository, a file, a venv
//! with a pinned package from an index on the lab mirror); `check` then exits 0. The agent
//! pushed is the one provision carries, which needs nothing from either C library. The
//! templates come from `scripts/lab-deps` (`debootstrap`, cached once). Needs the lab.

use crate::cli_support::Provision;
use crate::guestlab;
use crate::lab_support::slot;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use guestlab::{Deb, apt_repo, host, wheel};
use provision::agent::client::AgentBinary;
use provision_lab::testkit::LabEnv;

/// Where `scripts/lab-deps` caches templates.
const CACHE: &str = "/var/cache/provision-lab";

/// One guest: its suite's template, a vmid and address of this test's own, its Python.
struct Other {
    name: &'static str,
    template: &'static str,
    vmid: u32,
    ip_host: u32,
    python: &'static str,
    glibc: &'static str,
}

const OTHERS: [Other; 2] = [
    Other {
        name: "bullseye",
        template: "debian-11-lab_11.1-1_amd64.tar.zst",
        vmid: slot::BULLSEYE.vmid,
        ip_host: slot::BULLSEYE.ip_host,
        python: "3.9",
        glibc: "2.31",
    },
    Other {
        name: "trixie",
        template: "debian-13-lab_13.1-1_amd64.tar.zst",
        vmid: slot::TRIXIE.vmid,
        ip_host: slot::TRIXIE.ip_host,
        python: "3.13",
        glibc: "2.41",
    },
];

/// The test's state: the lab, its folder, its folder on the mirror; containers removed on drop.
struct World {
    lab: LabEnv,
    dir: tempfile::TempDir,
    mirror_dir: PathBuf,
    mirror_url: String,
}

impl Drop for World {
    fn drop(&mut self) {
        if let Ok(api) = self.lab.root_api() {
            let node = self.lab.node().to_string();
            for o in &OTHERS {
                let base = format!("/nodes/{node}/lxc/{}", o.vmid);
                for (method, path) in [("POST", format!("{base}/status/stop")), ("DELETE", base)] {
                    if let Ok(upid) = api.call(method, &path, &[]) {
                        let _ = api.wait_task(
                            &node,
                            upid.as_str().unwrap_or(""),
                            Duration::from_secs(60),
                        );
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.mirror_dir);
    }
}

impl World {
    fn new() -> World {
        let lab = LabEnv::from_env_or_up().expect("the lab is up (scripts/lab up, as root)");
        // The templates where the node's storage has them (the lab keeps every template
        // linked there, as a node keeps what it downloaded).
        let storage = lab.dir().join("storage/local/template/cache");
        for o in &OTHERS {
            let cached = Path::new(CACHE).join(o.template);
            assert!(
                cached.is_file(),
                "{} is missing: run scripts/lab-deps (it builds the other guests' templates once)",
                cached.display()
            );
            let linked = storage.join(o.template);
            if !linked.exists() && std::fs::hard_link(&cached, &linked).is_err() {
                std::fs::copy(&cached, &linked).unwrap();
            }
        }
        let sub = format!("other-guests-{}", std::process::id());
        let mirror_dir = PathBuf::from(&lab.vars["LAB_MIRROR_DIR"]).join(&sub);
        std::fs::create_dir_all(&mirror_dir).unwrap();
        let mirror_url = format!("{}/{sub}", lab.vars["LAB_MIRROR_URL"].trim_end_matches('/'));
        World {
            lab,
            dir: tempfile::tempdir().unwrap(),
            mirror_dir,
            mirror_url,
        }
    }

    fn ip(&self, o: &Other) -> String {
        let (gw, _) = self.lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        let net: Vec<&str> = gw.split('.').collect();
        format!("{}.{}.{}.{}", net[0], net[1], net[2], o.ip_host)
    }

    /// The APT repository, the index with the pinned package, the role and the inventory.
    fn write(&self) {
        let apt = apt_repo(
            &self.mirror_dir,
            &self.mirror_url,
            &[Deb {
                name: "provision-tool",
                version: "1.0",
                files: &[("/usr/bin/provision-tool", "#!/bin/sh\necho 1.0\n", 0o755)],
            }],
        );
        wheel(&self.mirror_dir, "provision-probe", "1.0.0");
        wheel(&self.mirror_dir, "provision-probe", "2.0.0");
        // A PEP 503 index: the mirror lists the project's folder as links to its wheels.
        host(&format!(
            "mkdir -p {0}/simple/provision-probe && cp {0}/wheels/*.whl {0}/simple/provision-probe/",
            self.mirror_dir.display()
        ));
        let mirror_host = self
            .mirror_url
            .trim_start_matches("http://")
            .split([':', '/'])
            .next()
            .unwrap()
            .to_string();
        let roles = self.dir.path().join("roles");
        std::fs::create_dir_all(&roles).unwrap();
        std::fs::write(
            roles.join("other-guest.yaml"),
            format!(
                "description: pip's trust in the (plain HTTP) lab mirror, and a file of the guest's own.
resources:
  - kind: file
    path: /etc/pip.conf
    content: \"[global]\\ntrusted-host = {mirror_host}\\n\"
  - kind: file
    path: /etc/other-guest.conf
    content: \"converged = yes\\n\"
    mode: \"0640\"
"
            ),
        )
        .unwrap();
        let lab = &self.lab;
        let (host, port) = lab.vars["PVE_NODE_SSH"].split_once(':').unwrap();
        let key = lab.key_path();
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        let (gw, _) = lab.vars["LAB_BRIDGE_CIDR"].split_once('/').unwrap();
        let mut containers = String::new();
        for o in &OTHERS {
            containers.push_str(&format!(
                r#"      {name}:
        vmid: {vmid}
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
        apt_sources:
          - {{ name: lab, line: "{apt}" }}
        packages: [provision-tool=1.0]
        roles: [other-guest, ml-env]
        ml_env:
          path: /opt/ml-env
          python: "{python}"
          installer: pip                 # pip's own paths; tests/lab/uv.rs has uv's
          packages: [provision-probe==1.0.0]
          index: {{ url: "{mirror}/simple/" }}
          # The toolchain the ml-env role installs by default (a C compiler, Python's
          # headers) is on the lab's mirror for bookworm only; this test is of the agent.
          runtime_packages: []
"#,
                name = o.name,
                vmid = o.vmid,
                template = o.template,
                bridge = lab.vars["LAB_BRIDGE"],
                ip = self.ip(o),
                public = public.trim(),
                key = key.display(),
                python = o.python,
                mirror = self.mirror_url,
            ));
        }
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
    containers:
{containers}"#,
            node = lab.node(),
            key = key.display(),
            root = lab.vars["LAB_PVE_ROOT"],
        );
        std::fs::write(self.dir.path().join("inventory.yaml"), text).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        let lab = &self.lab;
        let mut cmd = Provision::new(args)
            .known_hosts(&self.dir.path().join("known_hosts"), true)
            .arg(self.dir.path().join("inventory.yaml"))
            .clean_env(Some(self.dir.path()))
            .env("PROVISION_NODE_LOCK_DIR", &lab.vars["LAB_LOCK_DIR"]);
        for k in ["PVE_URL", "PVE_FINGERPRINT", "PVE_ROOT_PASSWORD"] {
            cmd = cmd.env(k, &lab.vars[k]);
        }
        // Another agent to push, as a user may name one (and as the CLI's own binary shows
        // this test failing on Debian 11: libssl.so.3 is missing there).
        if let Some(agent) = std::env::var_os("PROVISION_AGENT_BINARY") {
            cmd = cmd.env("PROVISION_AGENT_BINARY", agent);
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

    /// A command in a guest over SSH, strict against the keys provision recorded.
    fn guest(&self, o: &Other, cmd: &str) -> String {
        let out = Command::new("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-o"])
            .arg("StrictHostKeyChecking=yes")
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.path().join("known_hosts").display()
            ))
            .arg("-i")
            .arg(self.lab.key_path())
            .arg(format!("root@{}", self.ip(o)))
            .arg(cmd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{cmd}` in {}: {}",
            o.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn debian_11_and_13_guests_are_created_bootstrapped_converged_and_check_clean() {
    let w = World::new();
    w.write();
    let out = w.expect(&["apply", "--yes"], 0);
    assert!(out.contains("Apply complete"), "{out}");
    let sha = AgentBinary::current().unwrap().sha256()[..16].to_string();
    for o in &OTHERS {
        // The guest is what it claims: its own C library, and no OpenSSL 3 on Debian 11
        // (which an agent linked against the workstation's would need).
        let libc = w.guest(o, "getconf GNU_LIBC_VERSION");
        assert_eq!(libc.trim(), format!("glibc {}", o.glibc), "{}", o.name);
        if o.name == "bullseye" {
            let ssl = w.guest(
                o,
                "ls /usr/lib/x86_64-linux-gnu/ | grep '^libssl.so' || true",
            );
            assert!(!ssl.contains("libssl.so.3"), "{ssl}");
        }
        assert_eq!(w.guest(o, "provision-tool").trim(), "1.0", "{}", o.name);
        assert_eq!(
            w.guest(o, "stat -c '%a %s' /etc/other-guest.conf").trim(),
            "640 16"
        );
        let probe = w.guest(
            o,
            "/opt/ml-env/bin/python -c 'import provision_probe; print(provision_probe.__version__)'",
        );
        assert_eq!(probe.trim(), "1.0.0", "{}", o.name);
        // The agent that did it: the one provision carries, in the cache by its hash.
        let agents = w.guest(o, "ls /var/lib/provision/bin");
        assert_eq!(agents.trim(), format!("provision-{sha}"), "{}", o.name);
    }
    let check = w.expect(&["check"], 0);
    assert!(!check.contains("cannot run provision's agent"), "{check}");
}
