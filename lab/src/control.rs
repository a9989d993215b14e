//! `lab up`, `down`, `reinstall`, `status`, `env`: the host side of the lab (state directory,
//! bridge, API server process, node sshd with `pct`), printed as shell exports.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::paths::Settings;
use crate::server::auth::Secrets;

/// An error with a hint telling the user what to do.
#[derive(Debug)]
pub struct Hinted {
    /// What went wrong.
    pub message: String,
    /// What to do about it.
    pub hint: String,
}

impl std::fmt::Display for Hinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Hinted {}

fn hinted(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    Hinted {
        message: message.into(),
        hint: hint.into(),
    }
    .into()
}

/// Refuses clearly when the lab cannot work here: not root, or LXC missing.
pub fn preflight() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(hinted(
            "the lab must run as root (it drives LXC, a bridge and sshd)",
            "run it with sudo, or as root in CI",
        ));
    }
    for tool in ["lxc-start", "lxc-attach", "ip", "ssh-keygen", "tar", "zstd"] {
        if which(tool).is_none() {
            return Err(hinted(
                format!("`{tool}` is not installed"),
                "run scripts/lab-deps (installs lxc, iproute2, openssh, zstd and builds the template)",
            ));
        }
    }
    if which("sshd").is_none() && !Path::new("/usr/sbin/sshd").exists() {
        return Err(hinted("`sshd` is not installed", "run scripts/lab-deps"));
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn pid_alive(pidfile: &Path, needle: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains(needle)
        .then_some(pid)
}

fn server_pidfile(lab: &Settings) -> PathBuf {
    lab.run_dir().join("pve-lab.pid")
}

fn sshd_pidfile(lab: &Settings) -> PathBuf {
    lab.run_dir().join("sshd.pid")
}

/// True when the API server of the lab in `lab.dir` runs.
pub fn is_up(lab: &Settings) -> bool {
    pid_alive(&server_pidfile(lab), "pve-lab").is_some()
}

/// The lab's settings: saved ones when it is up, else from the environment.
pub fn settings() -> Result<Settings> {
    let fresh = Settings::from_env()?;
    match Settings::load(&fresh.dir) {
        Ok(saved) if is_up(&saved) => Ok(saved),
        _ => Ok(fresh),
    }
}

/// The cached template built by `scripts/lab-deps`.
fn cached_template(lab: &Settings) -> Result<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lab.cache_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("debian-12-lab_") && n.ends_with(".tar.zst"))
        })
        .collect();
    found.sort();
    found.pop().ok_or_else(|| {
        hinted(
            format!("no cached Debian template in {}", lab.cache_dir.display()),
            "run scripts/lab-deps (about 2 minutes the first time)",
        )
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ensure_key(path: &Path, comment: &str) -> Result<()> {
    if !path.exists() {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(path))?;
    }
    Ok(())
}

/// Refuses a bridge network that another interface already routes (another lab, a VPN...):
/// containers would be unreachable, or worse, reach someone else's hosts.
fn check_subnet_free(lab: &Settings) -> Result<()> {
    let (ip, len) = lab.bridge_net()?;
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    let net = format!("{}/{len}", std::net::Ipv4Addr::from(u32::from(ip) & mask));
    let out = Command::new("ip")
        .args(["-4", "-o", "route", "show", "to", "match", &net])
        .output()?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let dev = line
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .unwrap_or("");
        let covers = line
            .split_whitespace()
            .next()
            .is_some_and(|dst| dst != "default" && dst.ends_with(&format!("/{len}")));
        if covers && dev != lab.bridge {
            return Err(hinted(
                format!("the lab network {net} is already routed through {dev}"),
                "set LAB_BRIDGE_CIDR (and LAB_BRIDGE) to a free network for this lab",
            ));
        }
    }
    Ok(())
}

fn ensure_bridge(lab: &Settings) -> Result<()> {
    check_subnet_free(lab)?;
    let br = &lab.bridge;
    if !Path::new("/sys/class/net").join(br).exists() {
        run(Command::new("ip").args(["link", "add", br, "type", "bridge"]))?;
        std::fs::write(lab.run_dir().join("bridge-created"), br)?;
    }
    let addrs = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", br])
        .output()?;
    if !String::from_utf8_lossy(&addrs.stdout).contains(&format!(" {} ", lab.bridge_cidr)) {
        run(Command::new("ip").args(["addr", "add", &lab.bridge_cidr, "dev", br]))?;
    }
    run(Command::new("ip").args(["link", "set", br, "up"]))?;
    // Nothing from the containers is forwarded off the bridge, whatever the host's ip_forward.
    let _ = std::fs::write(format!("/proc/sys/net/ipv4/conf/{br}/forwarding"), "0");
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{br}/disable_ipv6"), "1");
    Ok(())
}

fn install_bin(lab: &Settings, exe: &Path) -> Result<PathBuf> {
    let bin = lab.bin_dir();
    std::fs::create_dir_all(&bin)?;
    let dest = bin.join("pve-lab");
    let same = std::fs::read(exe)
        .ok()
        .zip(std::fs::read(&dest).ok())
        .is_some_and(|(a, b)| a == b);
    if !same {
        let tmp = bin.join(".pve-lab.tmp");
        std::fs::copy(exe, &tmp).with_context(|| format!("copying {}", exe.display()))?;
        std::fs::rename(&tmp, &dest)?;
    }
    let pct = format!(
        "#!/bin/sh\n# pct of the provision lab: same configs and locks as its API.\nexec {} --dir {} pct \"$@\"\n",
        dest.display(),
        lab.dir.display()
    );
    let pct_path = bin.join("pct");
    std::fs::write(&pct_path, pct)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pct_path, std::fs::Permissions::from_mode(0o755))?;
    Ok(dest)
}

fn start_server(lab: &Settings, bin: &Path) -> Result<()> {
    if is_up(lab) {
        return Ok(());
    }
    let log = std::fs::File::create(lab.run_dir().join("pve-lab.log"))?;
    let child = unsafe {
        Command::new(bin)
            .args(["--dir"])
            .arg(&lab.dir)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // SAFETY: setsid is async-signal-safe; the server leaves our session and terminal.
            .pre_exec(|| {
                libc::setsid();
                Ok(())
            })
            .spawn()
            .context("starting pve-lab serve")?
    };
    std::fs::write(server_pidfile(lab), child.id().to_string())?;
    let secrets = Secrets::load(lab)?;
    let client = crate::client::PveClient::with_timeout(
        &format!("https://127.0.0.1:{}/api2/json", lab.api_port),
        pve::Trust::Insecure,
        crate::client::Auth::Token(secrets.root_token()),
        Duration::from_secs(5),
    )?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if client.call("GET", "/version", &[]).is_ok() {
            return Ok(());
        }
        if pid_alive(&server_pidfile(lab), "pve-lab").is_none() || Instant::now() > deadline {
            let log =
                std::fs::read_to_string(lab.run_dir().join("pve-lab.log")).unwrap_or_default();
            bail!("the API server did not come up:\n{}", log.trim());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a Proxmox node's root has in `~/.bashrc` and `~/.profile`: Debian's defaults
/// (base-files' `dot.bashrc` and `dot.profile`), nothing run.
const NODE_BASHRC: &str = "# ~/.bashrc: executed by bash(1) for non-login shells.\n\n\
# Note: PS1 and umask are already set in /etc/profile. You should not\n\
# need this unless you want different defaults for root.\n";
const NODE_PROFILE: &str = "# ~/.profile: executed by Bourne-compatible login shells.\n\n\
if [ \"$BASH\" ]; then\n  if [ -f ~/.bashrc ]; then\n    . ~/.bashrc\n  fi\nfi\n\n\
mesg n 2> /dev/null || true\n";

fn start_sshd(lab: &Settings) -> Result<()> {
    let ssh = lab.dir.join("ssh");
    std::fs::create_dir_all(&ssh)?;
    // The node's root home as a Proxmox node has it. The node is this host, whose root
    // may run anything from ~/.bashrc (pyenv, conda: 0.2-0.5 s), which bash reads for
    // every command over SSH; a node login would then measure this machine's shell setup.
    let home = lab.dir.join("node-home");
    std::fs::create_dir_all(&home)?;
    std::fs::write(home.join(".bashrc"), NODE_BASHRC)?;
    std::fs::write(home.join(".profile"), NODE_PROFILE)?;
    let s = lab.secrets_dir();
    let config = format!(
        "# The lab node's sshd (root login with the lab key, `pct` on PATH).\n\
         Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\n\
         AuthorizedKeysFile {ak}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\nSubsystem sftp internal-sftp\n\
         SetEnv PATH={bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LAB_DIR={dir} HOME={home}\n",
        port = lab.ssh_port,
        hk = s.join("ssh_host_ed25519_key").display(),
        pid = sshd_pidfile(lab).display(),
        ak = s.join("authorized_keys").display(),
        bin = lab.bin_dir().display(),
        dir = lab.dir.display(),
        home = home.display(),
    );
    std::fs::write(ssh.join("sshd_config"), config)?;
    if pid_alive(&sshd_pidfile(lab), "sshd").is_some() {
        return Ok(());
    }
    // sshd wants its privilege separation directory.
    std::fs::create_dir_all("/run/sshd")?;
    let sshd = which("sshd").unwrap_or_else(|| PathBuf::from("/usr/sbin/sshd"));
    run(Command::new(sshd)
        .arg("-f")
        .arg(ssh.join("sshd_config"))
        .arg("-E")
        .arg(lab.run_dir().join("sshd.log")))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", lab.ssh_port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "the node sshd did not come up; see {}",
                lab.run_dir().join("sshd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The exports `up` and `env` print.
pub fn exports(lab: &Settings) -> Result<Vec<(String, String)>> {
    let secrets = Secrets::load(lab)?;
    let fp = std::fs::read_to_string(lab.secrets_dir().join("fingerprint")).unwrap_or_default();
    // Storage keeps every template ever linked there: export the one the cache holds now
    // (the current recipe), else the newest.
    let mut labs: Vec<String> = crate::node::volumes::templates(lab)
        .into_iter()
        .map(|t| t.0)
        .filter(|v| v.contains("debian-12-lab_"))
        .collect();
    labs.sort();
    let cached = cached_template(lab)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let template = cached
        .and_then(|c| labs.iter().find(|v| v.ends_with(&c)).cloned())
        .or_else(|| labs.pop())
        .unwrap_or_default();
    let v = |k: &str, v: String| (k.to_string(), v);
    Ok(vec![
        v("PVE_URL", format!("https://127.0.0.1:{}", lab.api_port)),
        v("PVE_NODE", lab.node.clone()),
        v("LAB_CLUSTER_NODES", lab.cluster_nodes.join(",")),
        v("PVE_TOKEN", secrets.root_token()),
        v("PVE_FINGERPRINT", fp.trim().to_string()),
        v("PVE_ROOT_PASSWORD", secrets.root_password.clone()),
        v("PVE_NODE_SSH", format!("127.0.0.1:{}", lab.ssh_port)),
        v("PVE_NODE_SSH_KEY", lab.node_key().display().to_string()),
        // The same, one value each, for inventories (`ssh: { host: { env: ... } }`).
        v("PVE_NODE_SSH_HOST", "127.0.0.1".to_string()),
        v("PVE_NODE_SSH_PORT", lab.ssh_port.to_string()),
        v("LAB_SHARED_DIR", lab.shared_dir.display().to_string()),
        v("LAB_BRIDGE_CIDR", lab.bridge_cidr.clone()),
        v("LAB_GATEWAY", lab.bridge_ip().to_string()),
        v("LAB_GUEST_IP", guest_ip(lab)),
        v("LAB_BRIDGE", lab.bridge.clone()),
        v(
            "LAB_MIRROR_URL",
            format!("http://{}:{}/", lab.bridge_ip(), lab.mirror_port),
        ),
        v("LAB_MIRROR_DIR", lab.mirror_dir.display().to_string()),
        v("LAB_PVE_ROOT", lab.pve_root().display().to_string()),
        v("LAB_TEMPLATE", template),
        v("LAB_AUDIT_TOKEN", secrets.audit_token()),
        v("LAB_PRIVSEP_TOKEN", secrets.privsep_token()),
        v("LAB_DIR", lab.dir.display().to_string()),
        v("LAB_LOCK_DIR", lab.lock_dir.display().to_string()),
        v("LAB_VETH_PREFIX", lab.veth_prefix.clone()),
        v("LAB_GPU_ROOT", crate::gpu::root(lab).display().to_string()),
    ])
}

/// The address `examples/lab.yaml` gives its container: `.10` of the bridge network, with
/// its prefix (outside the ranges the lab's own tests and the testkit hand out).
fn guest_ip(lab: &Settings) -> String {
    let (ip, len) = lab
        .bridge_net()
        .unwrap_or((std::net::Ipv4Addr::new(10, 77, 0, 1), 24));
    let mask = u32::MAX << (32 - u32::from(len));
    let guest = std::net::Ipv4Addr::from((u32::from(ip) & mask) | 10);
    format!("{guest}/{len}")
}

/// Formats exports for `eval`.
pub fn render_exports(vars: &[(String, String)]) -> String {
    vars.iter()
        .map(|(k, v)| format!("export {k}='{}'\n", v.replace('\'', "'\\''")))
        .collect()
}

/// Brings the lab up (idempotent) and returns its exports.
pub fn up(exe: &Path) -> Result<Vec<(String, String)>> {
    up_with(exe, running_as_asked()?)
}

/// The settings `up` (or `reinstall`) works with: the running lab's, when one runs in
/// `LAB_DIR`, else the environment's. A running lab whose settings differ from what the
/// environment sets now is an error naming each difference: keeping it silently gave a
/// caller another lab than it asked for (a non-cluster lab to a run that set
/// `LAB_CLUSTER_NODES`), and restarting it would stop containers others may be using.
fn running_as_asked() -> Result<Settings> {
    let asked = Settings::from_env()?;
    let Ok(running) = Settings::load(&asked.dir) else {
        return Ok(asked);
    };
    if !is_up(&running) {
        return Ok(asked);
    }
    let is_set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty());
    let diff = running.differences(&asked, &is_set);
    if diff.is_empty() {
        return Ok(running);
    }
    Err(hinted(
        format!(
            "the lab in {} is already running with other settings than asked for:\n  {}",
            running.dir.display(),
            diff.join("\n  ")
        ),
        format!(
            "`scripts/lab down` first (with LAB_DIR={}), then `scripts/lab up` again; or unset those variables to use the running lab as it is",
            running.dir.display()
        ),
    ))
}

/// [`up`] with these settings.
fn up_with(exe: &Path, lab: Settings) -> Result<Vec<(String, String)>> {
    preflight()?;
    let template = cached_template(&lab)?;
    for d in [
        lab.conf_dir(),
        lab.lxc_path(),
        lab.template_dir(),
        lab.run_dir(),
        lab.secrets_dir(),
        lab.shared_dir.clone(),
        lab.mirror_dir.clone(),
    ] {
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(lab.secrets_dir(), std::fs::Permissions::from_mode(0o700))?;
    let link = lab.pve_root().join("lxc");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("nodes/{}/lxc", lab.node), &link)?;
    }
    let in_storage = lab
        .template_dir()
        .join(template.file_name().expect("file name"));
    if !in_storage.exists() && std::fs::hard_link(&template, &in_storage).is_err() {
        std::fs::copy(&template, &in_storage)?;
    }
    lab.save()?;
    Secrets::load_or_create(&lab)?;
    ensure_key(&lab.node_key(), "lab-node-login")?;
    ensure_key(
        &lab.secrets_dir().join("ssh_host_ed25519_key"),
        "lab-node-host",
    )?;
    std::fs::copy(
        lab.node_key().with_extension("pub"),
        lab.secrets_dir().join("authorized_keys"),
    )?;
    ensure_bridge(&lab)?;
    let bin = install_bin(&lab, exe)?;
    crate::gpu::install(&lab)?;
    start_server(&lab, &bin)?;
    start_sshd(&lab)?;
    let vars = exports(&lab)?;
    std::fs::write(lab.dir.join("lab.env"), render_exports(&vars))?;
    Ok(vars)
}

/// The process group of `pid` (`/proc/PID/stat`, field 5).
fn pgid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Stops the process in `pidfile`; when it leads its own process group (the server does, by
/// `setsid`), the whole group, so no helper it started (a template copy) outlives it.
fn kill_pidfile(pidfile: &Path, needle: &str) {
    if let Some(pid) = pid_alive(pidfile, needle) {
        let target = if pgid_of(pid) == Some(pid) { -pid } else { pid };
        // SAFETY: signalling a pid (or its own group) read from our pid file and checked by
        // its command line.
        unsafe { libc::kill(target, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            if std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if pid_alive(pidfile, needle).is_some() {
            // SAFETY: as above.
            unsafe { libc::kill(target, libc::SIGKILL) };
        }
    }
    let _ = std::fs::remove_file(pidfile);
}

/// Stops every container, the server, sshd, and removes the bridge the lab made.
pub fn down(lab: &Settings) -> Result<()> {
    preflight()?;
    let node = crate::node::Node::new(lab.clone());
    let names: Vec<String> = std::fs::read_dir(lab.lxc_path())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    for name in &names {
        if let Ok(vmid) = name.parse::<u32>()
            && node.is_running(vmid)
        {
            let _ = Command::new("lxc-stop")
                .arg("-P")
                .arg(lab.lxc_path())
                .args(["-n", name, "--kill"])
                .output();
        }
    }
    kill_pidfile(&server_pidfile(lab), "pve-lab");
    kill_pidfile(&sshd_pidfile(lab), "sshd");
    let marker = lab.run_dir().join("bridge-created");
    if marker.exists() || Path::new("/sys/class/net").join(&lab.bridge).exists() {
        let _ = Command::new("ip")
            .args(["link", "del", &lab.bridge])
            .output();
        let _ = std::fs::remove_file(marker);
    }
    Ok(())
}

/// Wipes the node (configs, containers, unpacked templates, keys of the host) but keeps the
/// shared data directory, the mirror and the client credentials, then brings it up again.
pub fn reinstall(exe: &Path) -> Result<Vec<(String, String)>> {
    let lab = running_as_asked()?;
    down(&lab)?;
    if crate::node::has_mounts_below(&lab.dir) {
        bail!(
            "refusing to wipe {}: something is mounted below it",
            lab.dir.display()
        );
    }
    let keep_secrets = ["secrets.json", "id_ed25519", "id_ed25519.pub"];
    for entry in std::fs::read_dir(&lab.dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p == lab.shared_dir || p == lab.mirror_dir {
            continue;
        }
        if p == lab.secrets_dir() {
            for s in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                if !keep_secrets.contains(&s.file_name().to_string_lossy().as_ref()) {
                    let _ = std::fs::remove_file(s.path());
                }
            }
            continue;
        }
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    // The same lab again: its saved ports, bridge and directories, not the environment's
    // (which need not name them: the exports do not carry the ports).
    up_with(exe, lab)
}

/// A human summary of the lab's state.
pub fn status(lab: &Settings) -> String {
    let mut out = format!(
        "lab dir: {}\napi server: {}\nnode sshd: {}\nbridge {}: {}\n",
        lab.dir.display(),
        if is_up(lab) { "running" } else { "stopped" },
        if pid_alive(&sshd_pidfile(lab), "sshd").is_some() {
            "running"
        } else {
            "stopped"
        },
        lab.bridge,
        if Path::new("/sys/class/net").join(&lab.bridge).exists() {
            "present"
        } else {
            "absent"
        },
    );
    let cluster = !lab.cluster_nodes.is_empty();
    for member in lab.members() {
        let node = crate::node::Node::new(member);
        for vmid in node.list() {
            let state = if node.is_running(vmid) {
                "running"
            } else {
                "stopped"
            };
            match cluster {
                true => out.push_str(&format!("CT {vmid} on {}: {state}\n", node.lab.node)),
                false => out.push_str(&format!("CT {vmid}: {state}\n")),
            }
        }
    }
    out
}
