//! Real OpenSSH servers and agents for tests: each `Sshd` is its own `/usr/sbin/sshd` on a
//! free loopback port with a fresh host key, an authorized_keys file of the test's choosing
//! and a DEBUG1 log the test can count connections and channels in. Killed on drop.

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Runs `ssh-keygen` to make an ed25519 key pair at `path` (and `path.pub`).
pub fn keygen(path: &Path) {
    keygen_typed(path, "ed25519");
}

/// Runs `ssh-keygen` to make a key pair of `kind` (`ed25519`, `ecdsa`, `rsa`) at `path`.
pub fn keygen_typed(path: &Path, kind: &str) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-C"])
        .arg(format!(
            "test-{}",
            path.file_name().unwrap().to_string_lossy()
        ))
        .arg("-f")
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .expect("ssh-keygen runs (install openssh-client)");
    assert!(status.success(), "ssh-keygen failed");
}

/// The fingerprint `ssh-keygen -lf` prints for a public key file (`SHA256:...`).
pub fn ssh_keygen_fingerprint(public_key: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(public_key)
        .output()
        .expect("ssh-keygen runs");
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .expect("ssh-keygen -lf prints bits, fingerprint, comment")
        .to_string()
}

/// One sshd on 127.0.0.1.
pub struct Sshd {
    child: Child,
    /// Its port.
    pub port: u16,
    /// Its directory (host key, authorized_keys, config, log).
    pub dir: TempDir,
    /// Its host key types, the first one being the one `host_key_pub` names.
    host_key_types: Vec<String>,
}

impl Sshd {
    /// Starts an sshd with an ed25519 host key that accepts the public keys in
    /// `authorized` for any user.
    pub fn start(authorized: &[&Path]) -> Sshd {
        Sshd::start_with_host_keys(authorized, &["ed25519"])
    }

    /// Starts an sshd with one host key of each type in `types`.
    pub fn start_with_host_keys(authorized: &[&Path], types: &[&str]) -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        for kind in types {
            keygen_typed(&dir.path().join(format!("host_key_{kind}")), kind);
        }
        let host_key_types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
        let mut keys = String::new();
        for k in authorized {
            keys += &fs::read_to_string(k).unwrap();
        }
        fs::write(dir.path().join("authorized_keys"), keys).unwrap();
        // sshd refuses to start without its privilege separation directory.
        fs::create_dir_all("/run/sshd").unwrap();
        // Another test may take the port between our probe and sshd's bind: try again.
        for _ in 0..10 {
            let port = free_port();
            let config = dir.path().join("sshd_config");
            fs::write(&config, config_text(dir.path(), port, &host_key_types)).unwrap();
            let log = dir.path().join("log");
            let _ = fs::remove_file(&log);
            let mut child = Command::new("/usr/sbin/sshd")
                .args(["-D", "-f"])
                .arg(&config)
                .arg("-E")
                .arg(&log)
                .stdin(Stdio::null())
                .spawn()
                .expect("/usr/sbin/sshd runs (install openssh-server)");
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                let text = fs::read_to_string(&log).unwrap_or_default();
                if text.contains(&format!("Server listening on 127.0.0.1 port {port}")) {
                    return Sshd {
                        child,
                        port,
                        dir,
                        host_key_types,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "sshd did not start; its log:\n{}",
            fs::read_to_string(dir.path().join("log")).unwrap_or_default()
        );
    }

    /// The public key file of the host's first host key.
    pub fn host_key_pub(&self) -> PathBuf {
        self.host_key_pub_of(&self.host_key_types[0])
    }

    /// The public key file of the host key of type `kind`.
    pub fn host_key_pub_of(&self, kind: &str) -> PathBuf {
        self.dir.path().join(format!("host_key_{kind}.pub"))
    }

    /// A `known_hosts` line for the first host key, as OpenSSH writes it for a non-22 port.
    pub fn known_hosts_line(&self) -> String {
        self.known_hosts_line_of(&self.host_key_types[0])
    }

    /// A `known_hosts` line for the host key of type `kind`.
    pub fn known_hosts_line_of(&self, kind: &str) -> String {
        let key = fs::read_to_string(self.host_key_pub_of(kind)).unwrap();
        let mut fields = key.split_whitespace();
        format!(
            "[127.0.0.1]:{} {} {}\n",
            self.port,
            fields.next().unwrap(),
            fields.next().unwrap()
        )
    }

    /// The process id of the listener (session processes are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// How many log lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }

    /// Waits until the log has at least `n` lines containing `needle` (session processes
    /// write their lines a moment after the client has moved on).
    pub fn wait_for(&self, needle: &str, n: usize) -> usize {
        let started = Instant::now();
        loop {
            let c = self.count(needle);
            // The bound only ends a wait for what never comes; callers assert the count.
            if c >= n || started.elapsed() > Duration::from_secs(30) {
                return c;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // The listener only: session processes end when their clients hang up.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `SetEnv SHLVL=1`: bash sources `~/.bashrc` for commands run by sshd only at shell level
/// 1, and this machine's root `.bashrc` may be slow (`pyenv init` takes a second or more),
/// which would swamp every measurement of the transport itself.
fn config_text(dir: &Path, port: u16, host_key_types: &[String]) -> String {
    let host_keys: String = host_key_types
        .iter()
        .map(|t| format!("HostKey {}/host_key_{t}\n", dir.display()))
        .collect();
    format!(
        "Port {port}\n\
         ListenAddress 127.0.0.1\n\
         {host_keys}\
         AuthorizedKeysFile {dir}/authorized_keys\n\
         PidFile none\n\
         UsePAM no\n\
         StrictModes no\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\n\
         AllowTcpForwarding yes\n\
         LogLevel DEBUG1\n\
         SetEnv SHLVL=1\n",
        dir = dir.display()
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real `ssh-agent` listening on a socket in its own directory, killed on drop. Its
/// socket is passed to children and to `SshOptions`, never set in this process's env.
pub struct Agent {
    child: Child,
    dir: TempDir,
}

impl Agent {
    /// Starts an agent.
    pub fn start() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("ssh-agent runs (install openssh-client)");
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no agent socket"
            );
            thread::sleep(Duration::from_millis(10));
        }
        Agent { child, dir }
    }

    /// The agent's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// Adds a private key with `ssh-add`.
    pub fn add(&self, key: &Path) {
        let status = Command::new("ssh-add")
            .arg("-q")
            .arg(key)
            .env("SSH_AUTH_SOCK", self.socket())
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "ssh-add failed");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
