//! The SSH transport against real OpenSSH servers on loopback: execution, streaming,
//! quoting, timeouts, host key policy, authentication, ssh config, ProxyJump and session
//! reuse, each counted in the server's own log.

use crate::guard::within;
use crate::sshd;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use provision::transport::ssh::{HostKeyPolicy, SshOptions, SshTransport};
use provision::transport::{Transport, TransportError, shell_join};
use sha2::{Digest, Sha256};
use sshd::{Agent, Sshd, keygen, ssh_keygen_fingerprint};
use tempfile::TempDir;

const T: Duration = Duration::from_secs(20);

/// A client key pair and a scratch directory for known_hosts and config files.
struct Client {
    dir: TempDir,
}

impl Client {
    fn new() -> Client {
        let dir = tempfile::tempdir().unwrap();
        keygen(&dir.path().join("id"));
        Client { dir }
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("id")
    }

    fn public(&self) -> PathBuf {
        self.dir.path().join("id.pub")
    }

    fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }

    /// Options for `sshd` with its host key already trusted and the client key named; an
    /// empty ssh config, so the test machine's own `~/.ssh/config` cannot interfere.
    fn options(&self, sshd: &Sshd) -> SshOptions {
        self.trust(sshd);
        self.bare_options(sshd)
    }

    /// Like `options`, without trusting the host key.
    fn bare_options(&self, sshd: &Sshd) -> SshOptions {
        let empty = self.dir.path().join("empty_config");
        if !empty.exists() {
            fs::write(&empty, "").unwrap();
        }
        let mut o = SshOptions::new("127.0.0.1");
        o.port = Some(sshd.port);
        o.user = Some("root".into());
        o.identity_file = Some(self.key());
        o.known_hosts = Some(self.known_hosts());
        o.ssh_config = Some(empty);
        o.agent_socket = Some(PathBuf::from("/nonexistent/agent.sock"));
        o.connect_timeout = Duration::from_secs(5);
        o
    }

    fn trust(&self, sshd: &Sshd) {
        let mut text = fs::read_to_string(self.known_hosts()).unwrap_or_default();
        text += &sshd.known_hosts_line();
        fs::write(self.known_hosts(), text).unwrap();
    }
}

fn connect(opts: &SshOptions) -> SshTransport {
    SshTransport::connect(opts).unwrap_or_else(|e| panic!("connect: {e}"))
}

#[test]
fn exec_returns_stdout_stderr_and_status() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    assert_eq!(t.describe(), format!("root@127.0.0.1:{}", sshd.port));
    let out = t.exec("cat; echo err >&2; exit 3", b"hello", T).unwrap();
    assert_eq!(out.stdout, b"hello");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status, Some(3));
    let out = t.exec("kill -9 $$", b"", T).unwrap();
    assert_eq!(out.status, None, "killed by a signal: no exit status");
    // A command that exits 124 by itself before its deadline is not a timeout.
    let out = t.exec("exit 124", b"", T).unwrap();
    assert_eq!(out.status, Some(124));
    // A command that ignores its stdin does not block the transport.
    let out = t.exec("true", &vec![7u8; 8 << 20], T).unwrap();
    assert!(out.success());
    // Output ends before the process does: its exit status is still waited for.
    let out = t.exec("exec >&- 2>&-; sleep 1; exit 5", b"", T).unwrap();
    assert_eq!(out.status, Some(5));
}

#[test]
fn twenty_megabytes_round_trip_through_stdin_and_stdout() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    let data: Vec<u8> = (0..20u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let started = Instant::now();
    let out = t.exec("cat; echo done >&2", &data, T).unwrap();
    let took = started.elapsed();
    assert!(out.success(), "{}", out.stderr_text());
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(Sha256::digest(&out.stdout), Sha256::digest(&data));
    assert_eq!(out.stderr, b"done\n");
    eprintln!("20 MiB through cat and back: {took:?}");
    // Large output with no input, and a checksum computed remotely.
    let out = t.exec("sha256sum", &data, T).unwrap();
    assert!(out.stdout_text().starts_with(&hex(&Sha256::digest(&data))));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn hostile_words_stay_inert_on_the_remote_side() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    let canary = client.dir.path().join("pwned");
    let words = [
        "plain".to_string(),
        String::new(),
        "it's".into(),
        format!("$(touch {})", canary.display()),
        format!("`touch {}`", canary.display()),
        format!("a; touch {}", canary.display()),
        format!("x\ntouch {}", canary.display()),
        format!("'; touch {}; '", canary.display()),
        "*".into(),
        "/*".into(),
        "~root".into(),
        "$HOME".into(),
        "\\".into(),
        "\"".into(),
        "-n".into(),
        "a\tb".into(),
        "ünïcode".into(),
    ];
    let command = format!("printf '%s\\0' {}", shell_join(&words));
    let out = t.exec(&command, b"", T).unwrap();
    assert!(out.success(), "{}", out.stderr_text());
    let got: Vec<String> = out
        .stdout
        .split(|&b| b == 0)
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect();
    let mut expected = words.to_vec();
    expected.push(String::new());
    assert_eq!(got, expected);
    assert!(!canary.exists(), "a hostile word was executed");
}

/// Whether a process whose command line contains `marker` is running.
fn running(marker: &str) -> bool {
    Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .unwrap()
        .status
        .success()
}

/// Whether the process is gone before `limit`: the bound only keeps a broken kill from
/// hanging the test; it is far above the few seconds a kill takes on a loaded machine.
fn gone_within(marker: &str, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if !running(marker) {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_command_past_its_timeout_is_killed_on_the_remote_side() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    let marker = format!("{}.{}", 600 + std::process::id() % 100, line!());
    let err = t
        .exec(
            &format!("sleep {marker} | cat"),
            b"",
            Duration::from_secs(1),
        )
        .unwrap_err();
    // The command sleeps for hundreds of seconds: a Timeout is the limit at work.
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(gone_within(
        &format!("sleep {marker}"),
        Duration::from_secs(60)
    ));

    // A command that ignores TERM gets KILL a few seconds later.
    let marker = format!("{}.{}", 700 + std::process::id() % 100, line!());
    let err = t
        .exec(
            &format!("trap '' TERM; sleep {marker}"),
            b"",
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(gone_within(
        &format!("sleep {marker}"),
        Duration::from_secs(60)
    ));
    // The session is still good for the next command.
    assert!(t.exec("true", b"", T).unwrap().success());
}

#[test]
fn the_local_wait_is_bounded_even_when_the_remote_side_holds_on() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    // A process that leaves the command's process group keeps its stdout open, so the
    // channel never reaches EOF: only the local deadline ends the wait.
    let pidfile = client.dir.path().join("escaped.pid");
    let command = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 40'",
        pidfile.display()
    );
    let err = t.exec(&command, b"", Duration::from_secs(1)).unwrap_err();
    // The deadline ended the wait, not the escaped `sleep 40`: it still runs.
    let pid = fs::read_to_string(&pidfile).unwrap_or_default();
    let alive = !pid.trim().is_empty() && Path::new(&format!("/proc/{}", pid.trim())).exists();
    let _ = Command::new("kill").arg(pid.trim()).status();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
    assert!(
        alive,
        "the wait ended only with the escaped process (pid {pid:?})"
    );
    // The session survives an abandoned channel.
    assert_eq!(t.exec("echo ok", b"", T).unwrap().stdout_text(), "ok\n");
}

#[test]
fn an_unknown_host_key_is_refused_with_its_fingerprint() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let opts = client.bare_options(&sshd);
    let err = SshTransport::connect(&opts).unwrap_err();
    let TransportError::UnknownHostKey { fingerprint, .. } = &err else {
        panic!("expected an unknown host key, got: {err}");
    };
    assert_eq!(*fingerprint, ssh_keygen_fingerprint(&sshd.host_key_pub()));
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "the host key of 127.0.0.1:{} is not known",
            sshd.port
        )),
        "{text}"
    );
    assert!(text.contains(fingerprint.as_str()), "{text}");
    assert!(text.contains("--accept-new-host-keys"), "{text}");
    assert!(
        !client.known_hosts().exists(),
        "strict mode wrote known_hosts"
    );
    assert_eq!(sshd.count("Accepted publickey"), 0, "logged in anyway");
}

#[test]
fn accept_new_adds_the_key_and_strict_mode_then_accepts_it() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let mut opts = client.bare_options(&sshd);
    opts.host_key_policy = HostKeyPolicy::AcceptNew;
    let t = connect(&opts);
    assert!(t.exec("true", b"", T).unwrap().success());
    drop(t);
    let text = fs::read_to_string(client.known_hosts()).unwrap();
    assert!(
        text.starts_with(&format!("[127.0.0.1]:{} ssh-ed25519 ", sshd.port)),
        "{text}"
    );
    // OpenSSH itself agrees the recorded key is this server's.
    let found = Command::new("ssh-keygen")
        .arg("-F")
        .arg(format!("[127.0.0.1]:{}", sshd.port))
        .arg("-f")
        .arg(client.known_hosts())
        .output()
        .unwrap();
    assert!(found.status.success());
    opts.host_key_policy = HostKeyPolicy::Strict;
    let t = connect(&opts);
    assert!(t.exec("true", b"", T).unwrap().success());
}

#[test]
fn a_changed_host_key_is_refused_even_with_accept_new() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let other = client.dir.path().join("other_host_key");
    keygen(&other);
    let old = fs::read_to_string(other.with_extension("pub")).unwrap();
    let mut fields = old.split_whitespace();
    let entry = format!(
        "# a comment line\nunrelated.example {} {}\n[127.0.0.1]:{} {} {}\n",
        "ssh-ed25519",
        fields.clone().nth(1).unwrap(),
        sshd.port,
        fields.next().unwrap(),
        fields.next().unwrap()
    );
    fs::write(client.known_hosts(), &entry).unwrap();
    for policy in [HostKeyPolicy::Strict, HostKeyPolicy::AcceptNew] {
        let mut opts = client.bare_options(&sshd);
        opts.host_key_policy = policy;
        let err = SshTransport::connect(&opts).unwrap_err();
        let TransportError::ChangedHostKey(change) = &err else {
            panic!("expected a changed host key, got: {err}");
        };
        assert_eq!(change.line, 3);
        assert_eq!(
            change.fingerprint,
            ssh_keygen_fingerprint(&sshd.host_key_pub())
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("{}:3", client.known_hosts().display())),
            "{text}"
        );
        assert!(text.contains("ssh-keygen -f"), "{text}");
        assert!(
            text.contains(&format!("-R '[127.0.0.1]:{}'", sshd.port)),
            "{text}"
        );
    }
    assert_eq!(fs::read_to_string(client.known_hosts()).unwrap(), entry);
    assert_eq!(sshd.count("Accepted publickey"), 0);
}

#[test]
fn hashed_known_hosts_entries_are_honoured() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    client.trust(&sshd);
    // Let OpenSSH hash the file, as HashKnownHosts does.
    let status = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(client.known_hosts())
        .output()
        .unwrap()
        .status;
    assert!(status.success());
    let text = fs::read_to_string(client.known_hosts()).unwrap();
    assert!(text.starts_with("|1|"), "{text}");
    assert!(!text.contains("127.0.0.1"), "{text}");
    let t = connect(&client.bare_options(&sshd));
    assert!(t.exec("true", b"", T).unwrap().success());
}

#[test]
fn a_host_with_several_keys_is_asked_for_the_type_on_file() {
    let client = Client::new();
    // libssh2 would pick ECDSA first; only ed25519 is on file.
    let sshd = Sshd::start_with_host_keys(&[&client.public()], &["ecdsa", "ed25519"]);
    fs::write(client.known_hosts(), sshd.known_hosts_line_of("ed25519")).unwrap();
    let t = connect(&client.bare_options(&sshd));
    assert!(t.exec("true", b"", T).unwrap().success());
    drop(t);
    assert_eq!(sshd.count("kex: host key algorithm: ssh-ed25519"), 1);
    // With the ECDSA key on file instead, that one is asked for.
    fs::write(client.known_hosts(), sshd.known_hosts_line_of("ecdsa")).unwrap();
    connect(&client.bare_options(&sshd));
    assert_eq!(
        sshd.count("kex: host key algorithm: ecdsa-sha2-nistp256"),
        1
    );
}

#[test]
fn agent_keys_log_in() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let agent = Agent::start();
    agent.add(&client.key());
    let mut opts = client.options(&sshd);
    opts.identity_file = None;
    opts.agent_socket = Some(agent.socket());
    // No key file could be the one that worked: the config names a key that does not exist.
    let config = client.dir.path().join("config");
    fs::write(&config, "Host *\n  IdentityFile /nonexistent/key\n").unwrap();
    opts.ssh_config = Some(config);
    let t = connect(&opts);
    assert!(t.exec("true", b"", T).unwrap().success());
    assert_eq!(sshd.count("Accepted publickey"), 1);
}

#[test]
fn a_key_the_server_does_not_know_is_an_auth_error() {
    let client = Client::new();
    // An authorized key behind a passphrase: we cannot use it, and say so.
    let locked = client.dir.path().join("locked");
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "a passphrase", "-f"])
        .arg(&locked)
        .status()
        .unwrap();
    assert!(status.success());
    let sshd = Sshd::start(&[&client.public(), &locked.with_extension("pub")]);
    let wrong = client.dir.path().join("wrong");
    keygen(&wrong);
    let agent = Agent::start(); // empty
    let mut opts = client.options(&sshd);
    opts.identity_file = Some(wrong.clone());
    let err = SshTransport::connect(&opts).unwrap_err();
    assert!(matches!(err, TransportError::AuthFailed { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("root@127.0.0.1:{}", sshd.port)),
        "{text}"
    );
    assert!(
        text.contains(&format!("key file {}: refused", wrong.display())),
        "{text}"
    );

    opts.identity_file = Some(locked.clone());
    let text = SshTransport::connect(&opts).unwrap_err().to_string();
    assert!(
        text.contains(&format!("key file {}: cannot be loaded", locked.display())),
        "{text}"
    );

    opts.identity_file = None;
    opts.agent_socket = Some(agent.socket());
    let config = client.dir.path().join("config");
    fs::write(&config, format!("IdentityFile {}\n", wrong.display())).unwrap();
    opts.ssh_config = Some(config);
    let text = SshTransport::connect(&opts).unwrap_err().to_string();
    assert!(text.contains("holds no keys"), "{text}");
    assert!(text.contains(&wrong.display().to_string()), "{text}");
}

#[test]
fn an_ssh_config_alias_gives_hostname_port_user_and_key() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    client.trust(&sshd);
    let config = client.dir.path().join("config");
    fs::write(
        &config,
        format!(
            "Host guest\n  HostName 127.0.0.1\n  Port {}\n  User root\n  IdentityFile {}\n  ServerAliveInterval 15\n",
            sshd.port,
            client.key().display()
        ),
    )
    .unwrap();
    let mut opts = SshOptions::new("guest");
    opts.ssh_config = Some(config);
    opts.known_hosts = Some(client.known_hosts());
    opts.agent_socket = Some(PathBuf::from("/nonexistent/agent.sock"));
    let t = connect(&opts);
    assert_eq!(t.describe(), format!("root@127.0.0.1:{}", sshd.port));
    assert_eq!(t.exec("id -un", b"", T).unwrap().stdout_text(), "root\n");
}

#[test]
fn proxy_jump_runs_the_session_through_the_jump_host() {
    let client = Client::new();
    let jump = Sshd::start(&[&client.public()]);
    let target = Sshd::start(&[&client.public()]);

    // Neither host key known: the jump host is checked first, by its own name.
    let mut opts = client.bare_options(&target);
    opts.proxy_jump = Some(format!("root@127.0.0.1:{}", jump.port));
    let err = SshTransport::connect(&opts).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{} is not known", jump.port)),
        "{err}"
    );
    // Jump host known, target not: the target is checked too.
    client.trust(&jump);
    let err = SshTransport::connect(&opts).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{} is not known", target.port)),
        "{err}"
    );
    client.trust(&target);
    let t = connect(&opts);
    let data = vec![42u8; 3 << 20];
    let out = t.exec("wc -c", &data, T).unwrap();
    assert_eq!(out.stdout_text().trim(), (3 << 20).to_string());
    assert!(t.exec("true", b"", T).unwrap().success());
    drop(t);
    // Dropping the transport says goodbye to both hosts, through the tunnel too.
    assert_eq!(target.wait_for("Received disconnect", 1), 1);
    assert!(jump.wait_for("Received disconnect", 2) >= 1);
    // Each attempt that got past the jump host opened one forwarding channel on it; the
    // target logged in once and ran both commands in that one session.
    assert_eq!(jump.wait_for("ctype direct-tcpip", 2), 2);
    assert_eq!(target.wait_for("req exec", 2), 2);
    assert_eq!(target.count("Accepted publickey"), 1);

    // The same route from an ssh config file.
    let config = client.dir.path().join("config");
    fs::write(
        &config,
        format!(
            "Host node\n  HostName 127.0.0.1\n  Port {}\n  User root\n\
             Host guest\n  HostName 127.0.0.1\n  Port {}\n  User root\n  ProxyJump node\n\
             Host *\n  IdentityFile {}\n",
            jump.port,
            target.port,
            client.key().display()
        ),
    )
    .unwrap();
    let mut opts = SshOptions::new("guest");
    opts.ssh_config = Some(config);
    opts.known_hosts = Some(client.known_hosts());
    opts.agent_socket = Some(PathBuf::from("/nonexistent/agent.sock"));
    let t = connect(&opts);
    assert_eq!(t.exec("echo via", b"", T).unwrap().stdout_text(), "via\n");
    drop(t);
    assert_eq!(jump.wait_for("ctype direct-tcpip", 3), 3);
}

#[test]
fn one_session_carries_every_command() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    const N: usize = 6;
    for i in 0..N {
        let out = t.exec(&format!("echo {i}"), b"", T).unwrap();
        assert_eq!(out.stdout_text(), format!("{i}\n"));
    }
    assert_eq!(t.channels_opened(), N);
    assert_eq!(sshd.wait_for("req exec", N), N);
    assert_eq!(sshd.count("Connection from"), 1);
    assert_eq!(sshd.count("Accepted publickey"), 1);
    assert_eq!(sshd.count("ctype session"), N);
}

#[test]
fn connect_errors_are_bounded_and_named() {
    // Nothing listening.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = Client::new();
    let mut opts = SshOptions::new("127.0.0.1");
    opts.port = Some(port);
    opts.known_hosts = Some(client.known_hosts());
    opts.ssh_config = Some(PathBuf::from("/dev/null"));
    let err = SshTransport::connect(&opts).unwrap_err();
    assert!(matches!(err, TransportError::Unreachable { .. }), "{err}");

    // Something listening that never speaks SSH: the handshake times out.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    opts.port = Some(silent.local_addr().unwrap().port());
    opts.connect_timeout = Duration::from_millis(700);
    // Without the handshake timeout this connect would wait for ever: it returning at all
    // is the limit at work (the guard only keeps a regression from hanging the test).
    let err = within(
        Duration::from_secs(120),
        "connect to a listener that never speaks SSH (the 700 ms handshake timeout)",
        move || SshTransport::connect(&opts).unwrap_err(),
    );
    assert!(matches!(err, TransportError::Unreachable { .. }), "{err}");
    drop(silent);
}

#[test]
fn commands_from_several_threads_share_the_session() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let t = connect(&client.options(&sshd));
    thread::scope(|s| {
        for i in 0..4 {
            let t = &t;
            s.spawn(move || {
                for j in 0..5 {
                    let out = t.exec(&format!("echo {i}-{j}"), b"", T).unwrap();
                    assert_eq!(out.stdout_text(), format!("{i}-{j}\n"));
                }
            });
        }
    });
    assert_eq!(t.channels_opened(), 20);
    assert_eq!(sshd.count("Accepted publickey"), 1);
}

#[test]
fn keepalives_flow_while_idle_and_during_a_long_command() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let mut opts = client.options(&sshd);
    opts.keepalive_interval = Duration::from_secs(1); // libssh2 rounds 1 up to 2
    let t = connect(&opts);
    // Idle until the first keepalive shows in the server's log.
    let idle = sshd.wait_for("keepalive@libssh2.org", 1);
    assert!(idle >= 1, "no keepalive while idle");
    assert!(t.exec("sleep 2.5", b"", T).unwrap().success());
    let busy = sshd.wait_for("keepalive@libssh2.org", idle + 1);
    assert!(busy > idle, "no keepalive during the command");
}

#[test]
fn a_lost_connection_fails_the_running_command_and_the_next_one_reconnects() {
    let client = Client::new();
    let sshd = Sshd::start(&[&client.public()]);
    let mut opts = client.options(&sshd);
    opts.connect_timeout = Duration::from_secs(2);
    let t = connect(&opts);
    assert!(t.exec("true", b"", T).unwrap().success());
    let pidfile = client.dir.path().join("sleep.pid");
    let command = format!("echo $$ > {}; exec sleep 8", pidfile.display());
    let err = thread::scope(|s| {
        let running = s.spawn(|| t.exec(&command, b"", T));
        sshd.wait_for("req exec", 2);
        // The command has started once it wrote its pid.
        let until = Instant::now() + Duration::from_secs(60);
        while fs::read_to_string(&pidfile).map_or(true, |p| p.trim().is_empty()) {
            assert!(Instant::now() < until, "the command never started");
            thread::sleep(Duration::from_millis(10));
        }
        // Kill this server's session processes (the listener's children): the
        // connection ends from the far side in the middle of the command.
        let status = Command::new("pkill")
            .args(["-KILL", "-P", &sshd.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        running.join().unwrap().unwrap_err()
    });
    assert!(
        matches!(
            err,
            TransportError::Unreachable { .. } | TransportError::Io { .. }
        ),
        "{err}"
    );
    // The error came while the cut-off command still ran (its `sleep 8` outlives its
    // session): the client saw the connection end, it did not wait the command out.
    let pid = fs::read_to_string(&pidfile).unwrap();
    assert!(
        Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "the error came only after the command ended"
    );
    // The orphaned command would end by itself; do not leave it behind.
    let _ = Command::new("kill").arg(pid.trim()).status();
    // The command was cut off, so it is not run again; the next command gets a new
    // connection.
    assert_eq!(t.exec("echo back", b"", T).unwrap().stdout_text(), "back\n");
    assert_eq!(t.connections_opened(), 2);
    assert_eq!(sshd.count("Accepted publickey"), 2);
}
