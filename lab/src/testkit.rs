//! Real containers for tests, through the lab's own API.
//!
//! ```no_run
//! use provision_lab::testkit::{ContainerSpec, LabEnv};
//! let lab = LabEnv::from_env_or_up().unwrap();
//! let ct = lab.create_container(ContainerSpec::default()).unwrap();
//! let out = ct.ssh("systemctl is-system-running --wait").unwrap();
//! // dropping `ct` stops and destroys it
//! ```
//!
//! Many tests may create containers at once: the testkit gives each a vmid from 9100..=9199
//! and the address `.100 + (vmid - 9100)` on the lab bridge, retrying the next id when another
//! process holds one. Tests that pick their own addresses should stay outside .100-.199.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::client::{Auth, PveClient};
use crate::paths::Settings;
use crate::server::faults::FaultRule;

/// First vmid the testkit uses.
pub const VMID_BASE: u32 = 9100;
/// How many containers the testkit can hold at once.
pub const VMID_SLOTS: u32 = 100;

static ALLOC: Mutex<()> = Mutex::new(());

/// A loopback port nothing listens on now, for a private lab's API, sshd or mirror: the one
/// the kernel gives a listener on port 0, given back at once. Private labs started by tests
/// take these instead of fixed ports, so two of them on one host (two worktrees' test runs,
/// or a test's lab beside a developer's) never ask for the same port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A running lab, as its exports describe it.
#[derive(Debug, Clone)]
pub struct LabEnv {
    /// Exported variables (`PVE_URL`, `PVE_TOKEN`, ...).
    pub vars: BTreeMap<String, String>,
}

impl LabEnv {
    fn var(&self, k: &str) -> Result<&str> {
        self.vars
            .get(k)
            .map(String::as_str)
            .with_context(|| format!("the lab's exports lack {k}"))
    }

    /// `PVE_URL`.
    pub fn url(&self) -> &str {
        self.vars.get("PVE_URL").map_or("", String::as_str)
    }

    /// `PVE_NODE`.
    pub fn node(&self) -> &str {
        self.vars.get("PVE_NODE").map_or("lab", String::as_str)
    }

    /// The node's root login key (also authorised in testkit containers).
    pub fn key_path(&self) -> PathBuf {
        PathBuf::from(
            self.vars
                .get("PVE_NODE_SSH_KEY")
                .cloned()
                .unwrap_or_default(),
        )
    }

    /// The lab's state directory.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(
            self.vars
                .get("LAB_DIR")
                .cloned()
                .unwrap_or_else(|| crate::paths::DEFAULT_DIR.into()),
        )
    }

    /// Reads the exports from the environment (after `eval "$(scripts/lab up)"`), from the
    /// running lab's state directory, or brings the lab up with `pve-lab up`.
    pub fn from_env_or_up() -> Result<LabEnv> {
        crate::control::preflight()?;
        if std::env::var_os("PVE_URL").is_some() && std::env::var_os("LAB_DIR").is_some() {
            let vars = std::env::vars()
                .filter(|(k, _)| k.starts_with("PVE_") || k.starts_with("LAB_"))
                .collect();
            return Ok(LabEnv { vars });
        }
        let lab = crate::control::settings()?;
        if crate::control::is_up(&lab) {
            return Self::from_settings(&lab);
        }
        let bin = find_pve_lab().ok_or_else(|| crate::control::Hinted {
            message: "the lab is not up and no pve-lab binary was found".into(),
            hint: "run `scripts/lab up` first (or set PVE_LAB_BIN)".into(),
        })?;
        let mut cmd = Command::new(&bin);
        cmd.arg("up").stderr(Stdio::inherit());
        if std::env::var_os("LAB_PVE_SCHEMA").is_none()
            && let Some(schema) = find_schema()
        {
            cmd.env("LAB_PVE_SCHEMA", schema);
        }
        let out = cmd
            .output()
            .with_context(|| format!("running {} up", bin.display()))?;
        if !out.status.success() {
            bail!("`{} up` failed", bin.display());
        }
        Ok(LabEnv {
            vars: parse_exports(&String::from_utf8_lossy(&out.stdout)),
        })
    }

    /// A lab described by `export NAME='value'` lines, as `pve-lab up` prints them.
    pub fn from_exports(text: &str) -> LabEnv {
        LabEnv {
            vars: parse_exports(text),
        }
    }

    /// The exports of the lab whose state is in `lab.dir`.
    pub fn from_settings(lab: &Settings) -> Result<LabEnv> {
        Ok(LabEnv {
            vars: crate::control::exports(lab)?.into_iter().collect(),
        })
    }

    /// An API client authenticated with `PVE_TOKEN`.
    pub fn api(&self) -> Result<PveClient> {
        Ok(PveClient::new(
            &format!("{}/api2/json", self.var("PVE_URL")?),
            pve::Trust::Pin(self.var("PVE_FINGERPRINT")?.to_string()),
            Auth::Token(self.var("PVE_TOKEN")?.to_string()),
        )?)
    }

    /// An API client logged in as root@pam with a ticket.
    pub fn root_api(&self) -> Result<PveClient> {
        Ok(PveClient::login(
            &format!("{}/api2/json", self.var("PVE_URL")?),
            pve::Trust::Pin(self.var("PVE_FINGERPRINT")?.to_string()),
            "root@pam",
            self.var("PVE_ROOT_PASSWORD")?,
        )?)
    }

    /// Adds a fault rule (see `server::faults`).
    pub fn inject_fault(&self, rule: &FaultRule) -> Result<()> {
        let body = serde_json::to_vec(rule)?;
        let c = self.root_api()?;
        let Auth::Ticket { ticket, csrf } = &c.auth else {
            unreachable!("login gives a ticket")
        };
        let headers = [
            ("Content-Type", "application/json".to_string()),
            ("Cookie", format!("PVEAuthCookie={ticket}")),
            ("CSRFPreventionToken", csrf.clone()),
        ];
        let resp = crate::client::request(
            "POST",
            &format!("{}/lab/faults", c.base),
            &headers,
            &body,
            Some(self.var("PVE_FINGERPRINT")?),
        )?;
        if resp.status != 200 {
            bail!("adding the fault failed: {} {}", resp.status, resp.reason);
        }
        Ok(())
    }

    /// Active fault rules.
    pub fn faults(&self) -> Result<Value> {
        self.root_api()?
            .call("GET", "/lab/faults", &[])
            .map_err(|e| anyhow!("{e}"))
    }

    /// Removes all fault rules.
    pub fn clear_faults(&self) -> Result<()> {
        self.root_api()?
            .call("DELETE", "/lab/faults", &[])
            .map(|_| ())
            .map_err(|e| anyhow!("{e}"))
    }

    /// Whether another lab on this host uses `vmid` now (its veth exists or its config lock
    /// is held), so two labs' tests do not collide on names and locks.
    fn taken_elsewhere(&self, vmid: u32) -> bool {
        let prefix = self
            .vars
            .get("LAB_VETH_PREFIX")
            .map_or("veth", String::as_str);
        if Path::new("/sys/class/net")
            .join(format!("{prefix}{vmid}i0"))
            .exists()
        {
            return true;
        }
        let lock_dir = self
            .vars
            .get("LAB_LOCK_DIR")
            .map_or("/run/lock/lxc", String::as_str);
        let lock = Path::new(lock_dir).join(format!("pve-config-{vmid}.lock"));
        lock.exists() && crate::node::ConfigLock::acquire(&lock, Duration::ZERO).is_err()
    }

    /// The address the testkit gives a vmid.
    pub fn ip_for(&self, vmid: u32) -> Result<(Ipv4Addr, u8)> {
        let cidr = self.var("LAB_BRIDGE_CIDR")?;
        let (ip, len) = cidr
            .split_once('/')
            .context("LAB_BRIDGE_CIDR is not ADDRESS/PREFIX")?;
        let ip: Ipv4Addr = ip.parse()?;
        let len: u8 = len.parse()?;
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        let host = 100 + (vmid - VMID_BASE);
        Ok((Ipv4Addr::from((u32::from(ip) & mask) + host), len))
    }

    /// Creates and starts a container and waits until SSH answers.
    pub fn create_container(&self, spec: ContainerSpec) -> Result<TestContainer> {
        let api = self.root_api()?;
        let key = std::fs::read_to_string(self.key_path().with_extension("pub"))
            .context("reading the lab key")?;
        let bridge = self.var("LAB_BRIDGE")?.to_string();
        let gw = self
            .var("LAB_BRIDGE_CIDR")?
            .split('/')
            .next()
            .unwrap_or("")
            .to_string();
        let template = self.var("LAB_TEMPLATE")?.to_string();
        let node = spec.node.clone().unwrap_or_else(|| self.node().to_string());
        let guard = ALLOC.lock().unwrap_or_else(|e| e.into_inner());
        let mut chosen = None;
        for vmid in VMID_BASE..VMID_BASE + VMID_SLOTS {
            let conf = format!("etc/pve/nodes/{node}/lxc/{vmid}.conf");
            if self.dir().join(conf).exists() || self.taken_elsewhere(vmid) {
                continue;
            }
            let (ip, len) = self.ip_for(vmid)?;
            let mut params: Vec<(String, String)> = vec![
                ("vmid".into(), vmid.to_string()),
                ("ostemplate".into(), template.clone()),
                (
                    "hostname".into(),
                    spec.hostname.clone().unwrap_or_else(|| format!("ct{vmid}")),
                ),
                ("memory".into(), spec.memory_mb.to_string()),
                ("cores".into(), spec.cores.to_string()),
                (
                    "net0".into(),
                    format!("name=eth0,bridge={bridge},ip={ip}/{len},gw={gw}"),
                ),
                ("rootfs".into(), "local:4".into()),
                (
                    "unprivileged".into(),
                    if spec.privileged { "0" } else { "1" }.into(),
                ),
                ("ssh-public-keys".into(), key.clone()),
                ("start".into(), if spec.start { "1" } else { "0" }.into()),
            ];
            for (i, (host, ct)) in spec.mounts.iter().enumerate() {
                params.push((format!("mp{i}"), format!("{},mp={ct}", host.display())));
            }
            params.extend(spec.extra.iter().cloned());
            let refs: Vec<(&str, &str)> = params
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            match api.call("POST", &format!("/nodes/{node}/lxc"), &refs) {
                Ok(upid) => {
                    chosen = Some((vmid, ip, upid.as_str().unwrap_or("").to_string()));
                    break;
                }
                Err(e) if e.message.contains("already exists") => continue,
                Err(e) => bail!("creating a container failed: {e}"),
            }
        }
        drop(guard);
        let (vmid, ip, upid) = chosen.context("all testkit vmids are taken")?;
        let ct = TestContainer {
            vmid,
            ip,
            ssh_port: 22,
            key: self.key_path(),
            node: node.clone(),
            lab: self.clone(),
            api,
        };
        let exit = ct
            .api
            .wait_task(&node, &upid, Duration::from_secs(120))
            .map_err(|e| anyhow!("{e}"))?;
        if exit != "OK" {
            bail!("creating CT {vmid} failed: {exit}");
        }
        if spec.start && spec.wait_ssh {
            ct.wait_ssh(Duration::from_secs(30))?;
        }
        Ok(ct)
    }
}

fn parse_exports(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').replace("'\\''", "'")))
        .collect()
}

/// `../shared/pve-api/apidata-9.1.3.json` beside the checkout the tests run from, if present.
pub fn find_schema() -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    manifest
        .ancestors()
        .take(3)
        .map(|d| d.join("../shared/pve-api/apidata-9.1.3.json"))
        .find(|p| p.is_file())
}

fn find_pve_lab() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PVE_LAB_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("pve-lab"))
        .find(|p| p.is_file())
}

/// What container a test wants.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Privileged (`unprivileged: 0`) rather than Proxmox's default unprivileged.
    pub privileged: bool,
    /// Bind mounts: host directory and path inside.
    pub mounts: Vec<(PathBuf, String)>,
    /// Memory in MiB.
    pub memory_mb: u32,
    /// CPU cores.
    pub cores: u32,
    /// Host name (default `ct<vmid>`).
    pub hostname: Option<String>,
    /// More create parameters (`features`, `tags`, `dev0`, ...).
    pub extra: Vec<(String, String)>,
    /// Start after create.
    pub start: bool,
    /// Wait for SSH after start.
    pub wait_ssh: bool,
    /// The node to create it on, in cluster mode (default: the lab's `PVE_NODE`).
    pub node: Option<String>,
}

impl Default for ContainerSpec {
    fn default() -> Self {
        ContainerSpec {
            privileged: false,
            mounts: Vec::new(),
            memory_mb: 512,
            cores: 1,
            hostname: None,
            extra: Vec::new(),
            start: true,
            wait_ssh: true,
            node: None,
        }
    }
}

/// A container that is destroyed when dropped.
#[derive(Debug)]
pub struct TestContainer {
    /// Its vmid.
    pub vmid: u32,
    /// Its address on the lab bridge.
    pub ip: Ipv4Addr,
    /// SSH port (22).
    pub ssh_port: u16,
    /// Private key that logs in as root.
    pub key: PathBuf,
    /// The node it is on.
    pub node: String,
    lab: LabEnv,
    api: PveClient,
}

impl TestContainer {
    /// `ssh` options that reach this container as root.
    pub fn ssh_args(&self) -> Vec<String> {
        [
            "-i",
            &self.key.display().to_string(),
            "-p",
            &self.ssh_port.to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            // It bounds the banner exchange too: a fresh container's sshd on two loaded
            // cores took more than 5 s to send it in CI (a flaky
            // `unprivileged_bind_mount_shows_host_root_as_nobody`); 30 s is far above it.
            "-o",
            "ConnectTimeout=30",
            &format!("root@{}", self.ip),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Runs a shell command over SSH.
    pub fn ssh(&self, cmd: &str) -> Result<Output> {
        Command::new("ssh")
            .args(self.ssh_args())
            .arg(cmd)
            .stdin(Stdio::null())
            .output()
            .context("running ssh")
    }

    /// Runs a command over SSH; its stdout, or an error with its stderr.
    pub fn ssh_ok(&self, cmd: &str) -> Result<String> {
        let out = self.ssh(cmd)?;
        if !out.status.success() {
            bail!(
                "`{cmd}` in CT {} failed ({}): {}",
                self.vmid,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs a command with `lxc-attach` (what `pct exec` does).
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        Command::new("lxc-attach")
            .arg("-P")
            .arg(self.lab.dir().join("lxc"))
            .args(["-n", &self.vmid.to_string(), "--clear-env", "--"])
            .args(args)
            .output()
            .context("running lxc-attach")
    }

    /// Waits until `ssh true` succeeds.
    pub fn wait_ssh(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(
                &(self.ip, self.ssh_port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
                && self.ssh("true").is_ok_and(|o| o.status.success())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "CT {} ({}) did not answer SSH within {timeout:?}",
                    self.vmid,
                    self.ip
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The lab this container belongs to.
    pub fn lab(&self) -> &LabEnv {
        &self.lab
    }

    /// Root filesystem on the host.
    pub fn rootfs(&self) -> PathBuf {
        self.lab.dir().join(format!(
            "storage/local/images/{0}/vm-{0}-disk-0.raw",
            self.vmid
        ))
    }

    fn destroy_now(&self) -> Result<()> {
        let node = self.node.clone();
        let base = format!("/nodes/{node}/lxc/{}", self.vmid);
        if let Ok(upid) = self.api.call("POST", &format!("{base}/status/stop"), &[]) {
            let _ = self
                .api
                .wait_task(&node, upid.as_str().unwrap_or(""), Duration::from_secs(30));
        }
        let upid = self
            .api
            .call("DELETE", &base, &[])
            .map_err(|e| anyhow!("{e}"))?;
        let exit = self
            .api
            .wait_task(&node, upid.as_str().unwrap_or(""), Duration::from_secs(60))
            .map_err(|e| anyhow!("{e}"))?;
        if exit != "OK" {
            bail!("destroying CT {} failed: {exit}", self.vmid);
        }
        Ok(())
    }
}

impl Drop for TestContainer {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_now() {
            eprintln!("testkit: could not destroy CT {}: {e:#}", self.vmid);
        }
    }
}
