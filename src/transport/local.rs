//! Runs commands on this machine: for the device machines' GPU checks and for tests.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{ExecOutput, Transport, TransportError};

/// Runs command lines with `sh -c` on the local machine.
#[derive(Debug, Clone, Default)]
pub struct LocalTransport {
    env: Vec<(String, String)>,
}

impl LocalTransport {
    /// A local transport that adds `env` to every child's environment.
    pub fn with_env(env: Vec<(String, String)>) -> Self {
        LocalTransport { env }
    }
}

impl Transport for LocalTransport {
    fn exec(
        &self,
        command: &str,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        let io_err = |source| TransportError::Io {
            target: self.describe(),
            source,
        };
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group, so a timeout kills the whole pipeline, not just `sh`.
            .process_group(0)
            .spawn()
            .map_err(|e| TransportError::Unreachable {
                target: self.describe(),
                reason: format!("cannot start sh: {e}"),
            })?;
        let pid = child.id();
        let mut child_stdin = child.stdin.take().expect("stdin is piped");
        let input = stdin.to_vec();
        let writer = thread::spawn(move || {
            // The child may exit without reading its stdin; a broken pipe is fine.
            let _ = child_stdin.write_all(&input);
        });
        let mut out = child.stdout.take().expect("stdout is piped");
        let mut err = child.stderr.take().expect("stderr is piped");
        let out_reader = thread::spawn(move || {
            let mut buf = Vec::new();
            out.read_to_end(&mut buf).map(|_| buf)
        });
        let err_reader = thread::spawn(move || {
            let mut buf = Vec::new();
            err.read_to_end(&mut buf).map(|_| buf)
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(io_err)? {
                break status;
            }
            if Instant::now() >= deadline {
                // Kill the whole group through kill(1): no unsafe code needed.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
                let _ = child.wait();
                return Err(TransportError::Timeout {
                    target: self.describe(),
                    command: abbreviate(command),
                    timeout,
                });
            }
            thread::sleep(Duration::from_millis(5));
        };
        let _ = writer.join();
        let stdout = out_reader
            .join()
            .expect("reader thread does not panic")
            .map_err(io_err)?;
        let stderr = err_reader
            .join()
            .expect("reader thread does not panic")
            .map_err(io_err)?;
        Ok(ExecOutput {
            status: status.code(),
            stdout,
            stderr,
        })
    }

    fn describe(&self) -> String {
        "local".to_string()
    }
}

/// The first line of a command, cut to a readable length, for messages.
pub(crate) fn abbreviate(command: &str) -> String {
    let first = command.lines().next().unwrap_or("");
    if first.chars().count() > 80 {
        format!("{}…", first.chars().take(80).collect::<String>())
    } else if command.contains('\n') {
        format!("{first} …")
    } else {
        first.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_with_stdin_and_status() {
        let t = LocalTransport::default();
        let out = t
            .exec(
                "cat; echo err >&2; exit 3",
                b"hello",
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(out.stdout, b"hello");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status, Some(3));
    }

    #[test]
    fn times_out_and_kills_the_group() {
        let t = LocalTransport::default();
        let started = Instant::now();
        let err = t
            .exec("sleep 30 | cat", b"", Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
        // Killed, not waited out: `sleep 30` would end only after 30 s.
        assert!(started.elapsed() < Duration::from_secs(25));
    }

    #[test]
    fn passes_extra_environment() {
        let t = LocalTransport::with_env(vec![("NCCL_NVLS_ENABLE".into(), "0".into())]);
        let out = t
            .exec("echo $NCCL_NVLS_ENABLE", b"", Duration::from_secs(5))
            .unwrap();
        assert_eq!(out.stdout_text(), "0\n");
    }
}
