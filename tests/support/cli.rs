//! One way for the tests to run provision's CLI: the binary cargo built for them, with
//! colour off, and what a test adds on top (a clean environment, the lab's API
//! credentials, a `known_hosts`, an inventory) said by name. Every test binary includes
//! it (`#[path = "../support/cli.rs"] mod cli_support;`), so what "run provision" means
//! is written once.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The provision binary the tests run.
pub const BIN: &str = env!("CARGO_BIN_EXE_provision");

/// How long one provision run in a test may take: far above the slowest (a source build
/// on a loaded machine, minutes), far below CI's time limit.
pub const RUN_LIMIT: Duration = Duration::from_secs(900);

/// The variables through which provision reaches the lab's Proxmox API.
pub const LAB_API: [&str; 3] = ["PVE_URL", "PVE_TOKEN", "PVE_FINGERPRINT"];

/// A provision command being put together.
pub struct Provision {
    cmd: Command,
}

impl Provision {
    /// `provision ARGS` with colour off, in the test's environment.
    pub fn new<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env("NO_COLOR", "1");
        Provision { cmd }
    }

    /// Only `PATH` and `HOME` (this `home`, or the test's own) are kept from the
    /// environment: no `LAB_*`, token or agent socket of the machine running the tests
    /// reaches provision unless the test adds it.
    pub fn clean_env(mut self, home: Option<&Path>) -> Self {
        let path = std::env::var("PATH").unwrap_or_default();
        let own_home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        self.cmd.env_clear().env("PATH", path).env("NO_COLOR", "1");
        match home {
            Some(h) => self.cmd.env("HOME", h),
            None => self.cmd.env("HOME", own_home),
        };
        self
    }

    /// The lab API's URL, token and fingerprint from `vars` (the lab's environment).
    pub fn lab_api(mut self, vars: &BTreeMap<String, String>) -> Self {
        for k in LAB_API {
            self.cmd.env(k, &vars[k]);
        }
        self
    }

    /// `--known-hosts FILE`, with `--accept-new-host-keys` when `accept_new`.
    pub fn known_hosts(mut self, file: &Path, accept_new: bool) -> Self {
        self.cmd.arg("--known-hosts").arg(file);
        if accept_new {
            self.cmd.arg("--accept-new-host-keys");
        }
        self
    }

    /// More arguments (the inventory, `--target`, ...), in order.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd.args(args);
        self
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// An environment variable.
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// An environment variable taken away.
    pub fn env_remove(mut self, key: &str) -> Self {
        self.cmd.env_remove(key);
        self
    }

    /// The working directory.
    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cmd.current_dir(dir);
        self
    }

    /// The command, to start it and watch it, or to hand to `assert_cmd`.
    pub fn command(self) -> Command {
        self.cmd
    }

    /// Runs it to its end, or for [`RUN_LIMIT`] at most: a run still going then is taken
    /// for hung, killed, and the test fails with what it printed so far (a hang fails a
    /// test, not the whole suite's time limit).
    pub fn output(mut self) -> Output {
        use std::io::Read;
        // Its arguments only: the environment carries the lab's credentials.
        let shown = self
            .cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("provision runs");
        let (tx, rx) = mpsc::channel();
        for (i, mut pipe) in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ]
        .into_iter()
        .enumerate()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                let _ = tx.send((i, bytes));
            });
        }
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("provision's status") {
                break Some(status);
            }
            if started.elapsed() >= RUN_LIMIT {
                eprintln!("{}", stacks(child.id()));
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut streams = [Vec::new(), Vec::new()];
        for _ in 0..2 {
            // Whatever it started may hold the pipes open after it is killed.
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok((i, bytes)) => streams[i] = bytes,
                Err(_) => break,
            }
        }
        let [stdout, stderr] = streams;
        match status {
            Some(status) => Output {
                status,
                stdout,
                stderr,
            },
            None => panic!(
                "provision ran past {} s and was killed (hung?): provision {shown}\n\
                 --- stdout\n{}\n--- stderr\n{}",
                RUN_LIMIT.as_secs(),
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ),
        }
    }

    /// Runs it to its end: its exit code and what it printed.
    pub fn run(self) -> Ran {
        Ran::from(self.output())
    }
}

/// Where each thread of process `pid` is, from gdb when the machine has it: what a hung
/// run waits on, printed before it is killed.
fn stacks(pid: u32) -> String {
    let gdb = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output();
    match gdb {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let frames: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("Thread ") || l.starts_with('#'))
                .take(400)
                .map(|l| l.get(..240).unwrap_or(l))
                .collect();
            format!(
                "--- the hung provision's threads (gdb)\n{}",
                frames.join("\n")
            )
        }
        _ => "--- no thread stacks of the hung provision (gdb is absent or failed)".into(),
    }
}

/// What one run of provision did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// The exit code (a run killed by a signal is a test failure).
    pub code: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl From<Output> for Ran {
    fn from(o: Output) -> Self {
        Ran {
            code: o.status.code().expect("provision exited, not killed"),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Ran {
    /// stdout, then stderr.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// stdout then stderr, failing the test unless it exited with `code`.
    pub fn expect(&self, code: i32) -> String {
        let text = self.text();
        assert_eq!(self.code, code, "provision exited {}:\n{text}", self.code);
        text
    }
}
