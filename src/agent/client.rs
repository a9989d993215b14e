//! The client side of the agent: make sure the target has this very binary (by sha256),
//! then send it one request. When the binary is already there, a request is one round
//! trip; the first contact costs one more, to push it.
//!
//! Two types, one per right: [`AgentReader`] only answers probes ([`TargetReader`]);
//! [`AgentWriter`] also runs steps ([`TargetWriter`]). Both may add this binary to the
//! target's agent cache (`<dir>/bin/provision-<sha256 prefix>`), which is content-addressed
//! and shared by every provision version: neither removes anything from it. Only the agent
//! itself prunes, at the end of an apply, and only binaries unused for days and not running
//! (see [`super::cache`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::attach::{self, Ended, Observer};
use crate::access::{AccessError, Op, OpOutcome, TargetReader, TargetWriter};
use crate::resources::wire::{Event, Fact, Facts, Holder, PROTOCOL_VERSION, Probe, Request};
use crate::transport::{Transport, TransportError, shell_quote};

/// Where agents live on targets, unless `PROVISION_AGENT_DIR` says otherwise (tests).
pub const DEFAULT_AGENT_DIR: &str = "/var/lib/provision";

/// The largest request sent in the same command as an agent push (through the shell's
/// `read`, one byte per system call); a larger one follows the push on its own.
const PUSH_REQUEST_MAX: usize = 64 * 1024;

/// Marker the remote script prints when the agent binary is not there yet.
const MISSING: &str = "provision-agent-missing";
/// The architecture of the agent provision carries (scripts/build-agent).
const AGENT_ARCH: &str = "x86_64";
/// Marker the remote script prints when a pushed binary arrived damaged.
const PUSH_FAILED: &str = "provision-agent-push-failed";
/// Marker the remote script prints when the binary is there but cannot run.
const EXEC_FAILED: &str = "provision-agent-exec-failed";

/// Why talking to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The command could not be run at all.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The target cannot execute this binary.
    #[error("{target} cannot run provision's agent ({detail})")]
    CannotRun {
        /// The target.
        target: String,
        /// What was seen (architecture, loader error).
        detail: String,
    },
    /// The agent answered something unexpected.
    #[error("the agent on {target} answered unexpectedly: {detail}")]
    Protocol {
        /// The target.
        target: String,
        /// What went wrong.
        detail: String,
    },
    /// The agent speaks another protocol than this provision (a stale agent build, or
    /// `PROVISION_AGENT_BINARY` naming another version's).
    #[error(
        "the agent on {target} speaks protocol {theirs} (provision {their_version}) but this \
         provision speaks protocol {PROTOCOL_VERSION} (provision {}); hint: rebuild both \
         with scripts/build-agent then cargo build, or unset PROVISION_AGENT_BINARY",
        env!("CARGO_PKG_VERSION")
    )]
    ProtocolMismatch {
        /// The target.
        target: String,
        /// The agent's protocol version.
        theirs: u32,
        /// The agent's provision version.
        their_version: String,
    },
    /// This provision was built without the agent it pushes.
    #[error(
        "cannot reach {target}: this provision carries no agent (it was built before the \
         agent was); hint: run scripts/build-agent, then build provision again (scripts/run \
         does both), or set PROVISION_AGENT_BINARY to a provision-agent binary"
    )]
    NotCarried {
        /// The target.
        target: String,
    },
    /// A probe could not be answered (which must not be taken as "absent").
    #[error("cannot read {probe:?} on {target}: {error}")]
    Probe {
        /// The target.
        target: String,
        /// The probe.
        probe: Box<Probe>,
        /// Why.
        error: String,
    },
    /// Pushing the binary failed.
    #[error("cannot install the agent on {target}: {detail}")]
    Push {
        /// The target.
        target: String,
        /// Why.
        detail: String,
    },
    /// Another apply holds the target's lock; nothing was started.
    #[error("another apply is running on {target}: {holder}; nothing was started")]
    Busy {
        /// The target.
        target: String,
        /// Who holds the lock.
        holder: Box<Holder>,
    },
    /// The target was held by a run left by a provision that is gone; it was waited for to
    /// its end, and this apply's steps were not started: what is left must be planned again.
    #[error(
        "waited on {target} for run {} left by provision pid {} of {}@{}, which is gone; \
         it has ended, and this apply's steps were not started there. Run apply again: it \
         reads what the run left and does the rest",
        holder.run, holder.pid, holder.user, holder.host
    )]
    Waited {
        /// The target.
        target: String,
        /// The run waited for.
        holder: Box<Holder>,
    },
    /// Ctrl-C: the run stopped cleanly between two steps.
    #[error(
        "apply interrupted on {target}: {done} of {total} step(s) done, the rest not started; \
         nothing is half-written. Run apply again to finish"
    )]
    Interrupted {
        /// The target.
        target: String,
        /// Steps that ran.
        done: usize,
        /// Steps asked for.
        total: usize,
    },
    /// A second Ctrl-C: provision stopped following, the run goes on.
    #[error(
        "stopped following {target}; the apply goes on there as run {} (agent pid {}) and \
         holds the target's lock until it ends; its events: <agent dir>/runs/{}/events.jsonl",
        holder.run, holder.agent_pid, holder.run
    )]
    Detached {
        /// The target.
        target: String,
        /// The run left going.
        holder: Box<Holder>,
    },
}

impl From<AgentError> for AccessError {
    fn from(e: AgentError) -> Self {
        AccessError::Agent(Box::new(e))
    }
}

/// The agent this provision pushes to targets, as it travels: its sha256 (which names it
/// in the target's cache) and a zstd frame of it; read once per run.
pub struct AgentBinary {
    /// Empty when this provision carries no agent: nothing to push, said when needed.
    sha256: String,
    zstd: Cow<'static, [u8]>,
    /// A gzip stream of it for a target without `zstd`: embedded, or made on first need.
    gzip: OnceLock<Cow<'static, [u8]>>,
}

impl std::fmt::Debug for AgentBinary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBinary")
            .field("sha256", &self.sha256)
            .field("zstd_len", &self.zstd.len())
            .finish()
    }
}

/// How a pushed agent is compressed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// zstd, where the target has the `zstd` command (Proxmox VE nodes do).
    Zstd,
    /// gzip, which every Debian and Ubuntu has (it is essential).
    Gzip,
}

impl AgentBinary {
    /// The agent this provision carries, or the binary `PROVISION_AGENT_BINARY` names. A
    /// provision built without one still reads Proxmox targets; a guest says what is missing.
    pub fn current() -> std::io::Result<Self> {
        match std::env::var_os("PROVISION_AGENT_BINARY") {
            Some(p) => Self::from_path(PathBuf::from(p)),
            None => Ok(Self::embedded().unwrap_or(AgentBinary {
                sha256: String::new(),
                zstd: Cow::Borrowed(&[]),
                gzip: OnceLock::new(),
            })),
        }
    }

    /// The agent embedded at build time (see `build.rs`), if it was built first.
    pub fn embedded() -> Option<Self> {
        #[cfg(embedded_agent)]
        {
            Some(AgentBinary {
                sha256: include_str!(concat!(env!("OUT_DIR"), "/agent.sha256")).to_string(),
                zstd: Cow::Borrowed(include_bytes!(concat!(env!("OUT_DIR"), "/agent.zst"))),
                gzip: OnceLock::from(Cow::Borrowed(
                    &include_bytes!(concat!(env!("OUT_DIR"), "/agent.gz"))[..],
                )),
            })
        }
        #[cfg(not(embedded_agent))]
        None
    }

    /// The binary at `path` (another build of the agent, in tests and overrides).
    pub fn from_path(path: PathBuf) -> std::io::Result<Self> {
        let bytes = std::fs::read(&path)?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        // A fast level: this is not the carried agent, whose frame is made once at build.
        let zstd = zstd::bulk::compress(&bytes, 3)?;
        Ok(AgentBinary {
            sha256,
            zstd: Cow::Owned(zstd),
            gzip: OnceLock::new(),
        })
    }

    /// The binary's sha256.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The binary itself, as it lands on a target.
    pub fn unpacked(&self) -> std::io::Result<Vec<u8>> {
        zstd::stream::decode_all(&self.zstd[..])
    }

    /// The bytes pushed to a target that decompresses `wire`.
    pub fn packed(&self, wire: Wire) -> std::io::Result<&[u8]> {
        match wire {
            Wire::Zstd => Ok(&self.zstd),
            Wire::Gzip => {
                if let Some(g) = self.gzip.get() {
                    return Ok(g);
                }
                let raw = self.unpacked()?;
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                std::io::Write::write_all(&mut enc, &raw)?;
                let gzip = enc.finish()?;
                Ok(self.gzip.get_or_init(|| Cow::Owned(gzip)))
            }
        }
    }
}

/// The connection both clients share: a transport, the binary and where it lives.
struct Conn {
    transport: Arc<dyn Transport>,
    binary: Arc<AgentBinary>,
    dir: String,
}

impl Conn {
    fn new(transport: Arc<dyn Transport>, binary: Arc<AgentBinary>) -> Self {
        let dir =
            std::env::var("PROVISION_AGENT_DIR").unwrap_or_else(|_| DEFAULT_AGENT_DIR.to_string());
        Conn {
            transport,
            binary,
            dir,
        }
    }

    fn target(&self) -> String {
        self.transport.describe()
    }

    fn remote_binary(&self) -> String {
        format!("{}/bin/provision-{}", self.dir, &self.binary.sha256[..16])
    }

    /// Sends one request, which must be answered within `timeout`; pushes the binary first
    /// if the target lacks it.
    fn call(&self, request: &Request, timeout: Duration) -> Result<Vec<Event>, AgentError> {
        if self.binary.sha256.is_empty() {
            return Err(AgentError::NotCarried {
                target: self.target(),
            });
        }
        let body = serde_json::to_vec(request).map_err(|e| AgentError::Protocol {
            target: self.target(),
            detail: e.to_string(),
        })?;
        let bin = shell_quote(&self.remote_binary());
        // A missing agent is pushed in the same connection's next command, compressed with
        // what the target has: the marker says whether that is zstd.
        let script = format!(
            "p={bin}; if [ ! -x \"$p\" ]; then if command -v zstd >/dev/null 2>&1; \
             then echo {MISSING} zstd; else echo {MISSING} gzip; fi; exit 0; fi; \
             \"$p\" agent; rc=$?; \
             if [ $rc -ge 126 ]; then echo \"{EXEC_FAILED} arch=$(uname -m) rc=$rc\" >&2; fi; exit $rc"
        );
        let mut out = self.transport.exec(&script, &body, timeout)?;
        // 127 with no output: the binary vanished between the test and exec (pruned by
        // an apply of another version after days unused); push it again.
        let vanished = out.status == Some(127) && out.stdout.is_empty();
        let missing = out
            .stdout_text()
            .trim()
            .strip_prefix(MISSING)
            .map(str::trim)
            .map(|w| if w == "zstd" { Wire::Zstd } else { Wire::Gzip });
        if vanished || missing.is_some() {
            let wire = missing.unwrap_or(Wire::Gzip);
            if body.len() > PUSH_REQUEST_MAX {
                // The shell's `read` takes the request a byte at a time (a 27 MB one, uv's
                // binary, took 40 s): the agent is pushed with an empty request, and this one
                // then goes straight to it.
                let empty = serde_json::to_vec(&Request::Probe {
                    probes: Vec::new(),
                    verify_full: false,
                })
                .expect("an empty probe request serialises");
                self.push_and_call(&empty, wire)?;
                out = self.transport.exec(&script, &body, timeout)?;
            } else {
                out = self.push_and_call(&body, wire)?;
            }
        }
        let stderr = out.stderr_text();
        if stderr.contains(EXEC_FAILED) {
            let arch = stderr
                .split("arch=")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or("?");
            let first = stderr.lines().next().unwrap_or("").to_string();
            let detail = if stderr.contains("GLIBC") {
                format!("its C library is older than the one the agent was built against: {first}")
            } else if stderr.contains("error while loading shared libraries") {
                format!("a library the agent needs is missing there: {first}")
            } else {
                format!(
                    "it is {arch}; the agent provision carries is built for {AGENT_ARCH}: {first}"
                )
            };
            return Err(AgentError::CannotRun {
                target: self.target(),
                detail,
            });
        }
        let text = out.stdout_text();
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        // The greeting first, alone: an agent of another protocol may answer the rest in a
        // form this one cannot read, and the greeting is what says so.
        match lines.next().map(serde_json::from_str::<Event>) {
            Some(Ok(Event::Hello { protocol, version })) if protocol != PROTOCOL_VERSION => {
                Err(AgentError::ProtocolMismatch {
                    target: self.target(),
                    theirs: protocol,
                    their_version: version,
                })
            }
            Some(Ok(hello @ Event::Hello { .. })) => {
                let mut events = vec![hello];
                for line in lines {
                    let event: Event =
                        serde_json::from_str(line).map_err(|e| AgentError::Protocol {
                            target: self.target(),
                            detail: format!("{e} in `{line}`"),
                        })?;
                    events.push(event);
                }
                if let Some(Event::BadRequest { error }) = events.get(1) {
                    return Err(AgentError::Protocol {
                        target: self.target(),
                        detail: error.clone(),
                    });
                }
                Ok(events)
            }
            _ => Err(AgentError::Protocol {
                target: self.target(),
                detail: format!(
                    "no greeting (exit {:?}): {}",
                    out.status,
                    stderr.lines().take(5).collect::<Vec<_>>().join(" / ")
                ),
            }),
        }
    }

    /// Adds the agent to the target's agent cache (compressed as `wire` says, checked by
    /// sha256 once unpacked; nothing else there is touched) and answers the request in the
    /// same round trip: stdin is the request on one line (the shell's `read` takes exactly
    /// that line), then the packed binary.
    fn push_and_call(
        &self,
        body: &[u8],
        wire: Wire,
    ) -> Result<crate::transport::ExecOutput, AgentError> {
        let dir = shell_quote(&format!("{}/bin", self.dir));
        let dest = shell_quote(&self.remote_binary());
        let sha = &self.binary.sha256;
        let unpack = match wire {
            Wire::Zstd => "zstd -dcq",
            Wire::Gzip => "gzip -dc",
        };
        let script = format!(
            "set -e; umask 022; IFS= read -r req; mkdir -p {dir}; t=$(mktemp {dir}/.push.XXXXXX); \
             if ! {unpack} > \"$t\"; then rm -f \"$t\"; echo \"{PUSH_FAILED} cannot unpack ({unpack})\" >&2; exit 3; fi; \
             sum=$(sha256sum \"$t\" | cut -d' ' -f1); \
             if [ \"$sum\" != {sha} ]; then rm -f \"$t\"; echo \"{PUSH_FAILED} checksum $sum after transfer\" >&2; exit 3; fi; \
             chmod 755 \"$t\"; mv -f \"$t\" {dest}; \
             set +e; printf '%s\\n' \"$req\" | {dest} agent; rc=$?; \
             if [ $rc -ge 126 ]; then echo \"{EXEC_FAILED} arch=$(uname -m) rc=$rc\" >&2; fi; exit $rc"
        );
        let packed = self.binary.packed(wire).map_err(|e| AgentError::Push {
            target: self.target(),
            detail: format!("cannot compress the agent: {e}"),
        })?;
        // serde_json writes no raw newlines, so the request is exactly one line.
        let mut stdin = body.to_vec();
        stdin.push(b'\n');
        stdin.extend_from_slice(packed);
        let out = self
            .transport
            .exec(&script, &stdin, Duration::from_secs(600))?;
        if out.stderr_text().contains(PUSH_FAILED)
            || (out.status == Some(3) && out.stdout.is_empty())
        {
            return Err(AgentError::Push {
                target: self.target(),
                detail: out.stderr_text().trim().to_string(),
            });
        }
        Ok(out)
    }

    /// Answers every probe in one request; a probe without an answer is an error.
    fn probe(&self, probes: &[Probe], verify_full: bool) -> Result<Facts, AgentError> {
        if probes.is_empty() {
            return Ok(Facts::Read(HashMap::new()));
        }
        // Reading is bounded by the hashing of what is there (`--verify-full` over
        // hundreds of GB), never by a download: hours are the honest bound.
        let start = std::time::Instant::now();
        let events = self.call(
            &Request::Probe {
                probes: probes.to_vec(),
                verify_full,
            },
            Duration::from_secs(6 * 3600),
        )?;
        let took = start.elapsed();
        let (answers, ready_us, probes_us) = events
            .into_iter()
            .find_map(|e| match e {
                Event::Facts {
                    answers,
                    ready_us,
                    probes_us,
                } => Some((answers, ready_us, probes_us)),
                _ => None,
            })
            .ok_or_else(|| AgentError::Protocol {
                target: self.target(),
                detail: "no facts in the answer".into(),
            })?;
        record_agent_time(took, ready_us, probes_us, &answers);
        let mut facts: HashMap<Probe, Fact> = HashMap::new();
        for a in answers {
            match (a.fact, a.error) {
                (Some(f), None) => {
                    facts.insert(a.probe, f);
                }
                (_, error) => {
                    return Err(AgentError::Probe {
                        target: self.target(),
                        probe: Box::new(a.probe),
                        error: error.unwrap_or_else(|| "no answer".into()),
                    });
                }
            }
        }
        for p in probes {
            if !facts.contains_key(p) {
                return Err(AgentError::Probe {
                    target: self.target(),
                    probe: Box::new(p.clone()),
                    error: "the agent did not answer it".into(),
                });
            }
        }
        Ok(Facts::Read(facts))
    }
}

/// Splits one probe request's `took` (`provision -v`) by what the agent says of its own
/// time: outside the agent (the SSH channel, the shell, the agent's exec before its
/// `main`), its start (reading and parsing the request), the probes' wall, and each probe
/// kind's own time (summed: they run concurrently). An agent that says nothing (an older
/// one) leaves the request whole.
fn record_agent_time(
    took: Duration,
    ready_us: Option<u64>,
    probes_us: Option<u64>,
    answers: &[crate::resources::wire::Answer],
) {
    let (Some(ready), Some(probes)) = (ready_us, probes_us) else {
        return;
    };
    let (ready, probes) = (Duration::from_micros(ready), Duration::from_micros(probes));
    crate::timing::record(
        "agent request: outside the agent (channel, shell, exec)",
        took.saturating_sub(ready + probes),
    );
    crate::timing::record("agent request: agent start, request read", ready);
    crate::timing::record("agent request: probes (wall, concurrent)", probes);
    for a in answers {
        if let Some(us) = a.took_us {
            crate::timing::record(
                format!("  agent probe: {}", probe_kind(&a.probe)),
                Duration::from_micros(us),
            );
        }
    }
}

/// A probe's kind as its wire tag says it (`packages`, `venv`, ...).
fn probe_kind(probe: &Probe) -> String {
    serde_json::to_value(probe)
        .ok()
        .and_then(|v| v.get("probe")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Read access to one target through its agent: probes only.
pub struct AgentReader {
    conn: Conn,
    verify_full: bool,
}

impl AgentReader {
    /// A reader for `transport`'s target.
    pub fn new(transport: Arc<dyn Transport>, binary: Arc<AgentBinary>) -> Self {
        AgentReader {
            conn: Conn::new(transport, binary),
            verify_full: false,
        }
    }

    /// Keeps agents under `dir` on the target instead of the default.
    pub fn with_dir(mut self, dir: &str) -> Self {
        self.conn.dir = dir.to_string();
        self
    }

    /// Re-hash model files instead of trusting their verification records (still only
    /// reading: the records are not rewritten).
    pub fn verify_full(mut self, full: bool) -> Self {
        self.verify_full = full;
        self
    }
}

impl TargetReader for AgentReader {
    fn describe(&self) -> String {
        self.conn.target()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        Ok(self.conn.probe(probes, self.verify_full)?)
    }
}

/// Write access to one target through its agent: probes and steps.
pub struct AgentWriter {
    conn: Conn,
    observe: Option<Observer>,
    verify_full: bool,
}

impl AgentWriter {
    /// A writer for `transport`'s target.
    pub fn new(transport: Arc<dyn Transport>, binary: Arc<AgentBinary>) -> Self {
        AgentWriter {
            conn: Conn::new(transport, binary),
            observe: None,
            verify_full: false,
        }
    }

    /// Hands every event of the run to `observe` as it arrives.
    pub fn observe(mut self, observe: Observer) -> Self {
        self.observe = Some(observe);
        self
    }

    /// Its reads (the stale-plan check and the verification after the steps) re-hash model
    /// files instead of trusting their records, as `--verify-full` asks.
    pub fn verify_full(mut self, full: bool) -> Self {
        self.verify_full = full;
        self
    }

    /// Keeps agents under `dir` on the target instead of the default.
    pub fn with_dir(mut self, dir: &str) -> Self {
        self.conn.dir = dir.to_string();
        self
    }
}

impl TargetReader for AgentWriter {
    fn describe(&self) -> String {
        self.conn.target()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        Ok(self.conn.probe(probes, self.verify_full)?)
    }
}

impl TargetWriter for AgentWriter {
    /// Runs the steps in order on the target; the outcomes of those that ran (the last
    /// one failed if the list is shorter than `ops`, or carries an error).
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let steps = ops
            .iter()
            .map(|op| match op {
                Op::Guest(step) => Ok(step.clone()),
                other => Err(AccessError::Unsupported {
                    target: self.conn.target(),
                    what: other.describe(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let total = steps.len();
        let target = self.conn.target();
        // Errors of the protocol layer name no target; this is where it is known.
        let named = |e: AgentError| match e {
            AgentError::Protocol { target: t, detail } if t.is_empty() => AgentError::Protocol {
                target: target.clone(),
                detail,
            },
            other => other,
        };
        let call = |r: &Request, t: Duration| self.conn.call(r, t);
        match attach::run_detached(&call, steps, &self.observe).map_err(named)? {
            Ended::Done(outcomes) => Ok(outcomes),
            Ended::Busy(holder) => Err(AgentError::Busy {
                target,
                holder: Box::new(holder),
            }
            .into()),
            Ended::Waited(holder) => Err(AgentError::Waited {
                target,
                holder: Box::new(holder),
            }
            .into()),
            Ended::Detached(holder) => Err(AgentError::Detached {
                target,
                holder: Box::new(holder),
            }
            .into()),
            Ended::Stopped(outcomes) => {
                if outcomes.iter().any(|o| o.error.is_some()) {
                    // The step that was running failed on its own: that is the news.
                    return Ok(outcomes);
                }
                Err(AgentError::Interrupted {
                    target,
                    done: outcomes.len(),
                    total,
                }
                .into())
            }
        }
    }
}
