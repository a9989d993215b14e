//! A real lab container to reconcile, and what air-gapped hosts are fed with, served from
//! the lab bridge: a flat APT repository of packages built here, a wheelhouse of wheels
//! built here, and git repositories over dumb HTTP. Nothing comes from the internet.

#![allow(dead_code)]

use crate::cli_support::Provision;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use provision_lab::testkit::{ContainerSpec, LabEnv, TestContainer};

/// A lab container plus this test's own folder on the lab's mirror.
pub struct Guest {
    /// The lab.
    pub lab: LabEnv,
    /// The container (destroyed on drop).
    pub ct: TestContainer,
    /// This test's files: inventory, roles, known_hosts.
    pub dir: tempfile::TempDir,
    /// This test's folder on the mirror.
    pub mirror_dir: PathBuf,
    /// Its URL, as containers reach it.
    pub mirror_url: String,
    /// Whether commands also plan and apply the container itself (its config through the
    /// lab's API and its root-only lines over the node's SSH), not only its guest.
    pub with_container: std::cell::Cell<bool>,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.mirror_dir);
    }
}

/// Runs a command on this machine; its stdout, or a panic with its stderr.
pub fn host(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Guest {
    /// A fresh privileged container (systemd, sshd, python3, git) on the lab bridge.
    pub fn new(name: &str) -> Guest {
        Self::with(
            name,
            ContainerSpec {
                privileged: true,
                memory_mb: 1024,
                ..Default::default()
            },
        )
    }

    /// A fresh privileged container with the host directory `shared` mounted at
    /// `/shared`, as llm-two has its model store.
    pub fn with_shared(name: &str, shared: &Path) -> Guest {
        Self::with(
            name,
            ContainerSpec {
                privileged: true,
                memory_mb: 1024,
                mounts: vec![(shared.to_path_buf(), "/shared".into())],
                ..Default::default()
            },
        )
    }

    /// The lab bridge's address on the host: where host-side services (the fake hub)
    /// listen for containers to reach them.
    pub fn bridge_ip(&self) -> std::net::IpAddr {
        self.lab.vars["LAB_BRIDGE_CIDR"]
            .split('/')
            .next()
            .and_then(|ip| ip.parse().ok())
            .expect("LAB_BRIDGE_CIDR is an address/prefix")
    }

    /// A fresh container made from `spec`.
    pub fn with(name: &str, spec: ContainerSpec) -> Guest {
        let lab = LabEnv::from_env_or_up().expect("the lab is up (scripts/lab up, as root)");
        let ct = lab.create_container(spec).expect("a lab container");
        let dir = tempfile::tempdir().unwrap();
        let mirror_root = PathBuf::from(lab.vars.get("LAB_MIRROR_DIR").expect("LAB_MIRROR_DIR"));
        let sub = format!("{name}-{}", ct.vmid);
        let mirror_dir = mirror_root.join(&sub);
        let _ = std::fs::remove_dir_all(&mirror_dir);
        std::fs::create_dir_all(&mirror_dir).unwrap();
        let base = lab
            .vars
            .get("LAB_MIRROR_URL")
            .expect("LAB_MIRROR_URL")
            .trim_end_matches('/')
            .to_string();
        Guest {
            mirror_url: format!("{base}/{sub}"),
            lab,
            ct,
            dir,
            mirror_dir,
            with_container: std::cell::Cell::new(false),
        }
    }

    /// Reboots the container through the lab's Proxmox API (shutdown, then start: a new
    /// systemd boot) and waits until it answers SSH again.
    pub fn reboot(&self) {
        let api = self.lab.api().unwrap();
        let node = self.ct.node.clone();
        let upid = api
            .call(
                "POST",
                &format!("/nodes/{node}/lxc/{}/status/reboot", self.ct.vmid),
                &[],
            )
            .unwrap();
        let exit = api
            .wait_task(
                &node,
                upid.as_str().unwrap_or(""),
                std::time::Duration::from_secs(120),
            )
            .unwrap();
        assert_eq!(exit, "OK", "the reboot task failed");
        self.ct
            .wait_ssh(std::time::Duration::from_secs(60))
            .unwrap();
    }

    /// Runs a shell command in the container as root; its stdout.
    pub fn sh(&self, cmd: &str) -> String {
        self.ct.ssh_ok(cmd).unwrap()
    }

    /// Writes the inventory: the lab node, this container (reached by SSH on the bridge
    /// with the lab's key) and `body`, the container's further fields (indented by 8).
    pub fn inventory(&self, body: &str) -> PathBuf {
        let lab = &self.lab;
        let fingerprint = lab.vars.get("PVE_FINGERPRINT").cloned().unwrap_or_default();
        let (node_host, node_port) = lab
            .vars
            .get("PVE_NODE_SSH")
            .and_then(|s| s.split_once(':'))
            .map(|(h, p)| (h.to_string(), p.to_string()))
            .unwrap_or(("127.0.0.1".into(), "2222".into()));
        let cidr = lab
            .vars
            .get("LAB_BRIDGE_CIDR")
            .cloned()
            .unwrap_or_else(|| "10.77.0.1/24".into());
        let paths = if self.dir.path().join("roles").is_dir() {
            "paths: { roles: roles }\n"
        } else {
            ""
        };
        let text = format!(
            "{paths}nodes:
  lab:
    api:
      url: {url}
      node: {node}
      token: {{ env: PVE_TOKEN }}
      tls: {{ fingerprint: \"{fingerprint}\" }}
    ssh: {{ host: {node_host}, port: {node_port}{node_key} }}
{config_root}    containers:
      t:
        vmid: {vmid}
        template: {template}
        cores: 1
        memory: 1G
        rootfs: {{ storage: local, size: 4G }}
        unprivileged: false
        network:
          - {{ bridge: {bridge}, ip: {ip}/{prefix}, gateway: {gateway} }}
        ssh:
          identity_file: {key}
{body}",
            // Root-only lines are written over the node's SSH, as root.
            node_key = if self.with_container.get() {
                format!(", identity_file: {}", lab.key_path().display())
            } else {
                String::new()
            },
            // ... in the lab node's own /etc/pve.
            config_root = match lab.vars.get("LAB_PVE_ROOT") {
                Some(root) if self.with_container.get() => format!("    config_root: {root}\n"),
                _ => String::new(),
            },
            url = lab.url(),
            node = lab.node(),
            vmid = self.ct.vmid,
            template = lab.vars.get("LAB_TEMPLATE").cloned().unwrap_or_default(),
            ip = self.ct.ip,
            key = self.ct.key.display(),
            bridge = lab
                .vars
                .get("LAB_BRIDGE")
                .cloned()
                .unwrap_or_else(|| "vmbr0".into()),
            gateway = cidr.split('/').next().unwrap_or_default(),
            prefix = cidr.split('/').nth(1).unwrap_or("24"),
        );
        let path = self.dir.path().join("inventory.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A role file `roles/<name>.yaml` beside the inventory.
    pub fn role(&self, name: &str, text: &str) {
        let dir = self.dir.path().join("roles");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
    }

    /// Runs provision against the inventory, on the guest target only (the Proxmox side is
    /// another issue's), with this test's own known_hosts.
    pub fn provision(&self, args: &[&str]) -> Output {
        self.provision_env(args, &[])
    }

    /// [`Self::provision`] with extra environment variables.
    pub fn provision_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(args)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    /// The command [`Self::provision`] runs, to start it and watch it run.
    pub fn command(&self, args: &[&str]) -> Command {
        let inventory = self.dir.path().join("inventory.yaml");
        let known_hosts = self.dir.path().join("known_hosts");
        let targets: &[&str] = if self.with_container.get() {
            &["--target", "container.t", "--target", "guest.t"]
        } else {
            &["--target", "guest.t"]
        };
        Provision::new(args)
            .args(targets)
            .known_hosts(&known_hosts, true)
            .arg(&inventory)
            .env_remove("SSH_AUTH_SOCK")
            .command()
    }

    /// Applies a plan saved by `plan --out` (whole: a saved plan takes no `--target`) with
    /// this test's own known_hosts and `extra` flags; exit code, stdout and stderr.
    pub fn apply_saved(&self, plan: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
        let out = Provision::new(["apply", "--yes"])
            .known_hosts(&self.dir.path().join("known_hosts"), false)
            .args(extra)
            .arg(plan)
            .env_remove("SSH_AUTH_SOCK")
            .output();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Self::provision`], asserting its exit code; stdout and stderr.
    pub fn expect(&self, args: &[&str], code: i32) -> (String, String) {
        let out = self.provision(args);
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
}

/// A container with `/shared` holding a Qwen3.5-shaped model folder, and a mirror with the
/// SGLang stand-in (tests/support/sglang-standin) as a git repository (its project under
/// `python/`, as SGLang's is) and the container's wheelhouse `/opt/wheels` with the build
/// backends: the container, the shared folder (kept while the test runs) and the commit.
pub fn standin_guest(name: &str) -> (Guest, tempfile::TempDir, String) {
    standin_guest_on(name, tempfile::tempdir().unwrap())
}

/// [`standin_guest`] with `shared` as the container's `/shared` (a filesystem the test
/// mounted there first, say).
pub fn standin_guest_on(
    name: &str,
    shared: tempfile::TempDir,
) -> (Guest, tempfile::TempDir, String) {
    let model = shared.path().join("models/Qwen3.5-122B-A10B");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}"#,
    )
    .unwrap();
    let g = Guest::with_shared(name, shared.path());
    let tree = tempfile::tempdir().unwrap();
    let standin = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/sglang-standin");
    host(&format!(
        "mkdir -p {0}/python && cp -a {standin}/pyproject.toml {standin}/src {0}/python/",
        tree.path().display()
    ));
    let commit = git_repo(&g.mirror_dir, "sglang", &[tree.path()]).remove(0);
    build_backends(&g.mirror_dir);
    host(&format!(
        "mkdir -p {0}/opt/wheels && cp {1}/wheels/*.whl {0}/opt/wheels/",
        g.ct.rootfs().display(),
        g.mirror_dir.display()
    ));
    (g, shared, commit)
}

/// A Debian package built here with dpkg-deb.
pub struct Deb<'a> {
    /// Package name.
    pub name: &'a str,
    /// Version.
    pub version: &'a str,
    /// Files: path inside the package, content, mode.
    pub files: &'a [(&'a str, &'a str, u32)],
}

/// Builds `debs` into a flat APT repository under `dir/apt`; the sources line that uses it.
pub fn apt_repo(dir: &Path, url: &str, debs: &[Deb]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let repo = dir.join("apt");
    std::fs::create_dir_all(&repo).unwrap();
    for deb in debs {
        let root = tempfile::tempdir().unwrap();
        let control = root.path().join("DEBIAN");
        std::fs::create_dir_all(&control).unwrap();
        std::fs::write(
            control.join("control"),
            format!(
                "Package: {}\nVersion: {}\nArchitecture: all\nMaintainer: provision tests <t@example.invalid>\nDescription: provision test package\n",
                deb.name, deb.version
            ),
        )
        .unwrap();
        for (path, content, mode) in deb.files {
            let p = root.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        let out = repo.join(format!("{}_{}_all.deb", deb.name, deb.version));
        host(&format!(
            "dpkg-deb --root-owner-group -Zgzip --build {} {} >/dev/null",
            root.path().display(),
            out.display()
        ));
    }
    host(&format!(
        "cd {} && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null",
        repo.display()
    ));
    format!("deb [trusted=yes] {url}/apt ./")
}

/// Builds a tiny wheel `name==version` into `dir/wheels`.
pub fn wheel(dir: &Path, name: &str, version: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/make_wheel.py");
    host(&format!(
        "python3 {script} {name} {version} {}",
        dir.join("wheels").display()
    ));
}

/// Copies the cached build backends (setuptools, wheel) into `dir/wheels`, so editable
/// installs build offline; `scripts/test-deps` fills the cache.
pub fn build_backends(dir: &Path) {
    let cache = Path::new("/var/cache/provision-tests/wheels");
    assert!(
        cache.is_dir(),
        "{} is missing: run scripts/test-deps (it downloads setuptools and wheel once)",
        cache.display()
    );
    host(&format!(
        "mkdir -p {0} && cp {1}/*.whl {0}/",
        dir.join("wheels").display(),
        cache.display()
    ));
}

/// A git repository served over dumb HTTP from `dir/git/<name>.git`, with one commit per
/// entry of `trees` (each a folder to commit as the whole tree); the commit ids.
pub fn git_repo(dir: &Path, name: &str, trees: &[&Path]) -> Vec<String> {
    let work = tempfile::tempdir().unwrap();
    let w = work.path().display();
    host(&format!(
        "git init -q -b main {w} && git -C {w} config user.email t@example.invalid && git -C {w} config user.name tests"
    ));
    let mut commits = Vec::new();
    for (i, tree) in trees.iter().enumerate() {
        host(&format!(
            "cd {w} && git rm -rq --ignore-unmatch . && cp -a {}/. . && git add -A && git commit -qm 'tree {i}'",
            tree.display()
        ));
        commits.push(
            host(&format!("git -C {w} rev-parse HEAD"))
                .trim()
                .to_string(),
        );
    }
    let bare = dir.join("git").join(format!("{name}.git"));
    host(&format!(
        "git clone -q --bare {w} {0} && git -C {0} update-server-info",
        bare.display()
    ));
    commits
}

/// A signing key made here with gpg, in its own GnuPG home (removed on drop).
pub struct GpgKey {
    home: tempfile::TempDir,
    /// Its fingerprint, as gpg prints it.
    pub fingerprint: String,
    /// Its public key, armored.
    pub public: String,
}

impl GpgKey {
    /// A new ed25519 signing key for `email`.
    pub fn new(email: &str) -> GpgKey {
        let home = tempfile::tempdir().unwrap();
        let gpg = format!("gpg --homedir {} --batch --quiet", home.path().display());
        host(&format!(
            "{gpg} --passphrase '' --quick-gen-key 'provision test <{email}>' ed25519 sign never 2>/dev/null"
        ));
        let colons = host(&format!("{gpg} --with-colons --list-keys {email}"));
        let fingerprint = colons
            .lines()
            .find_map(|l| l.strip_prefix("fpr:::::::::"))
            .and_then(|l| l.split(':').next())
            .expect("gpg lists the key's fingerprint")
            .to_string();
        let public = host(&format!("{gpg} --armor --export {email}"));
        GpgKey {
            home,
            fingerprint,
            public,
        }
    }

    /// Signs the flat repository in `dir` as a real archive is signed: a `Release` with
    /// the SHA256 of `Packages`, clear-signed as `InRelease`, detached as `Release.gpg`.
    pub fn sign_repo(&self, dir: &Path) {
        let gpg = format!(
            "gpg --homedir {} --batch --quiet --yes",
            self.home.path().display()
        );
        release(dir);
        host(&format!(
            "cd {} && {gpg} --clearsign -o InRelease Release && {gpg} -abs -o Release.gpg Release",
            dir.display()
        ));
    }
}

impl Drop for GpgKey {
    /// gpg starts an agent for the key's home; it is stopped with the key, so no process
    /// the test started outlives it.
    fn drop(&mut self) {
        let _ = std::process::Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "gpg-agent"])
            .status();
    }
}

/// Writes `dir/Release` for the flat repository there (what `apt-ftparchive release`
/// writes, reduced to what apt checks: the date and each index's size and SHA256).
pub fn release(dir: &Path) {
    host(&format!(
        "cd {} && {{ echo 'Origin: provision-test'; echo 'Label: provision-test'; echo \"Date: $(date -Ru)\"; echo 'SHA256:'; \
         echo \" $(sha256sum Packages | cut -d' ' -f1) $(stat -c %s Packages) Packages\"; }} > Release",
        dir.display()
    ));
}
