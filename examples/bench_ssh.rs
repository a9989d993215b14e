//! Benchmark of the SSH transport against OpenSSH's own client, both talking to one real
//! sshd on loopback: latency of a no-op command and a 20 MiB stdin→stdout round trip, and
//! what the server's log counts per command (connections, logins, channels).
//!
//! Run: `cargo run --release --example bench_ssh` (as root; needs openssh-server and
//! openssh-client). Prints a markdown table for BENCHMARKS.md.

#[path = "../tests/support/sshd.rs"]
mod sshd;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use provision::transport::Transport;
use provision::transport::ssh::{SshOptions, SshTransport};

const RUNS: usize = 40;
const BIG_RUNS: usize = 5;
const BIG: usize = 20 << 20;
const T: Duration = Duration::from_secs(60);

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id");
    sshd::keygen(&key);
    let server = sshd::Sshd::start(&[&dir.path().join("id.pub")]);
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, server.known_hosts_line()).unwrap();
    let mut opts = SshOptions::new("127.0.0.1");
    opts.port = Some(server.port);
    opts.user = Some("root".into());
    opts.identity_file = Some(key.clone());
    opts.known_hosts = Some(known.clone());
    opts.ssh_config = Some(PathBuf::from("/dev/null"));
    let openssh = OpenSsh {
        port: server.port,
        key: key.clone(),
        known: known.clone(),
        control: dir.path().join("cm.sock"),
    };
    let big: Vec<u8> = (0..BIG as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();

    // Connect once, then one channel per command.
    let connect = median(
        (0..5)
            .map(|_| time(|| drop(SshTransport::connect(&opts).unwrap())))
            .collect(),
    );
    server.wait_for("Accepted publickey", 5);
    let (conns0, logins0, chans0, execs0) = counts(&server);
    let t = SshTransport::connect(&opts).unwrap();
    t.exec("true", b"", T).unwrap(); // warm-up
    let ours = median(
        (0..RUNS)
            .map(|_| time(|| assert!(t.exec("true", b"", T).unwrap().success())))
            .collect(),
    );
    let ours_big = median(
        (0..BIG_RUNS)
            .map(|_| time(|| assert_eq!(t.exec("cat", &big, T).unwrap().stdout.len(), BIG)))
            .collect(),
    );
    server.wait_for("req exec", execs0 + 1 + RUNS + BIG_RUNS);
    let (conns1, logins1, chans1, execs1) = counts(&server);
    let channels = t.channels_opened();
    drop(t);

    let fresh = median(
        (0..RUNS / 4) // a new process, connection and login each time: slow
            .map(|_| time(|| openssh.run(&[], "true", b"")))
            .collect(),
    );
    openssh.run(&openssh.master(), "true", b""); // starts the master
    let muxed = median(
        (0..RUNS)
            .map(|_| time(|| openssh.run(&openssh.master(), "true", b"")))
            .collect(),
    );
    let muxed_big = median(
        (0..BIG_RUNS)
            .map(|_| time(|| openssh.run(&openssh.master(), "cat", &big)))
            .collect(),
    );
    openssh.stop_master();

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!("machine: {cpu}, {} cores", num_cpus());
    println!("one sshd on 127.0.0.1 (OpenSSH server, LogLevel DEBUG1), ed25519 keys\n");
    println!("| measurement | provision (ssh2) | OpenSSH `ssh` | OpenSSH time / ours |");
    println!("|---|---|---|---|");
    println!(
        "| connect + handshake + login (median of 5) | {} | — | — |",
        ms(connect)
    );
    println!(
        "| no-op command, median of {RUNS} | {} (one session) | {} (new connection each) | {:.1}× |",
        ms(ours),
        ms(fresh),
        fresh.as_secs_f64() / ours.as_secs_f64()
    );
    println!(
        "| no-op command, median of {RUNS} | {} (one session) | {} (ControlMaster) | {:.2}× |",
        ms(ours),
        ms(muxed),
        muxed.as_secs_f64() / ours.as_secs_f64()
    );
    println!(
        "| 20 MiB through `cat` and back, median of {BIG_RUNS} | {} ({:.0} MiB/s) | {} (ControlMaster) | {:.2}× |",
        ms(ours_big),
        20.0 / ours_big.as_secs_f64(),
        ms(muxed_big),
        muxed_big.as_secs_f64() / ours_big.as_secs_f64()
    );
    let commands = 1 + RUNS + BIG_RUNS;
    println!(
        "\nsshd log for the {commands} commands over one transport: {} connection(s), {} login(s), \
         {} session channel(s), {} exec request(s); channels_opened() = {channels}",
        conns1 - conns0,
        logins1 - logins0,
        chans1 - chans0,
        execs1 - execs0
    );
}

/// (connections, logins, session channels, exec requests) in the server's log.
fn counts(server: &sshd::Sshd) -> (usize, usize, usize, usize) {
    (
        server.count("Connection from"),
        server.count("Accepted publickey"),
        server.count("ctype session"),
        server.count("req exec"),
    )
}

struct OpenSsh {
    port: u16,
    key: PathBuf,
    known: PathBuf,
    control: PathBuf,
}

impl OpenSsh {
    fn master(&self) -> Vec<String> {
        vec![
            "-o".into(),
            "ControlMaster=auto".into(),
            "-o".into(),
            format!("ControlPath={}", self.control.display()),
            "-o".into(),
            "ControlPersist=60".into(),
        ]
    }

    fn run(&self, extra: &[String], command: &str, stdin: &[u8]) {
        let mut child = Command::new("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes", "-p"])
            .arg(self.port.to_string())
            .arg("-i")
            .arg(&self.key)
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known.display()))
            .args(extra)
            .arg("root@127.0.0.1")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), stdin.len());
    }

    fn stop_master(&self) {
        let _ = Command::new("ssh")
            .args(["-F", "/dev/null", "-o"])
            .arg(format!("ControlPath={}", self.control.display()))
            .args(["-O", "exit", "root@127.0.0.1"])
            .stderr(Stdio::null())
            .status();
    }
}

fn time(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
