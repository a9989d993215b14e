//! The NCCL preflight: before a multi-GPU service starts, an all-reduce across its GPUs in
//! its ml-env, one process per GPU, with its NCCL environment and a short deadline. A
//! tensor-parallel server that would hang at NCCL init hangs here instead, in seconds, with
//! the known remedies printed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::inventory::container::GpuSelector;
use crate::transport::{Transport, TransportError, shell_quote};

/// The launcher and rank program, fed to `python -` so nothing is installed on the target.
pub const SCRIPT: &str = include_str!("nccl_allreduce.py");

/// What the launcher's lines start with.
const PREFIX: &str = "PROVISION-NCCL ";

/// Time the transport allows past the launcher's own deadline by default, for the launcher to
/// stop its ranks and report; only a launcher stuck before it can watch (an `import torch`
/// that never returns) runs into it.
pub const TRANSPORT_GRACE: Duration = Duration::from_secs(15);

/// What to run.
#[derive(Debug, Clone)]
pub struct NcclOptions {
    /// One rank per GPU: CUDA indices as the service sees them, or UUIDs (then
    /// `CUDA_VISIBLE_DEVICES` is set to them).
    pub gpus: Vec<GpuSelector>,
    /// The ml-env's python.
    pub python: String,
    /// The deadline for the whole preflight, torch's import included.
    pub timeout: Duration,
    /// The service's environment (NCCL_*, CUDA_VISIBLE_DEVICES, …).
    pub env: Vec<(String, String)>,
    /// Bytes per all-reduce.
    pub bytes: u64,
    /// Timed all-reduces.
    pub iters: u32,
    /// Untimed all-reduces first.
    pub warmup: u32,
    /// How long the transport waits past `timeout` before it kills the launcher itself.
    pub grace: Duration,
    /// Testing only: provoke a failure.
    pub simulate: Option<Simulate>,
}

impl NcclOptions {
    /// Defaults for `gpus` with `python`: 30 s, 64 MiB, 20 timed of 5 warm-up all-reduces.
    pub fn new(gpus: Vec<GpuSelector>, python: impl Into<String>) -> Self {
        NcclOptions {
            gpus,
            python: python.into(),
            timeout: Duration::from_secs(30),
            env: Vec::new(),
            bytes: 64 << 20,
            iters: 20,
            warmup: 5,
            grace: TRANSPORT_GRACE,
            simulate: None,
        }
    }
}

/// Failures provoked on purpose, to prove the preflight detects them. Testing only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simulate {
    /// This rank joins the rendezvous, then never joins NCCL.
    HangRank(u32),
    /// This rank raises an error after the rendezvous.
    CrashRank(u32),
}

/// Why the preflight could not be run at all (as opposed to: ran and found a problem).
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// The options make no sense.
    #[error("{0}")]
    Options(String),
    /// The transport failed (other than by the deadline, which is a hang).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The python does not exist or cannot run.
    #[error("cannot run {python}: {output}")]
    PythonNotFound {
        /// The python asked for.
        python: String,
        /// What the shell said.
        output: String,
    },
    /// The launcher ended without a verdict.
    #[error("the preflight ended without a result (exit status {status:?}): {tail}")]
    NoResult {
        /// Its exit status.
        status: Option<i32>,
        /// The end of what it printed.
        tail: String,
    },
}

/// What the launcher says before it starts the ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclStart {
    /// Ranks.
    pub world: u32,
    /// The CUDA device of each rank.
    pub devices: Vec<u32>,
    /// How many GPUs torch sees.
    pub visible: u32,
    /// torch's version.
    pub torch: String,
    /// The CUDA release torch was built for.
    pub cuda: Option<String>,
    /// NCCL's version as torch reports it.
    pub nccl: String,
    /// The python that ran.
    pub python: String,
    /// The NCCL_* variables the ranks ran with.
    pub nccl_env: BTreeMap<String, String>,
}

/// A healthy all-reduce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcclHealthy {
    /// Ranks.
    pub world: u32,
    /// Each rank's device name.
    pub device_names: Vec<String>,
    /// Bytes per all-reduce.
    pub bytes: u64,
    /// Timed all-reduces.
    pub iters: u32,
    /// Seconds per all-reduce (the slowest rank's mean).
    pub time_per_iter_s: f64,
    /// Algorithm bandwidth, GB/s (bytes / time).
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s (algorithm bandwidth × 2(n−1)/n, as nccl-tests reports it).
    pub busbw_gbps: f64,
    /// Seconds from the first all-reduce's start to its end: NCCL's communicator setup.
    pub init_s: f64,
    /// Seconds the launcher ran.
    pub elapsed_s: f64,
}

/// Where one rank was when the preflight stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    /// The rank.
    pub rank: u32,
    /// Its last stage: `starting`, `import`, `rendezvous`, `nccl_init`, `warmup`,
    /// `allreduce`, `done` (or `simulated_hang`).
    pub stage: String,
    /// Seconds it had been in that stage.
    pub for_s: f64,
    /// The end of its stdout that was not the launcher's (NCCL_DEBUG goes there).
    #[serde(default)]
    pub stdout_tail: Vec<String>,
    /// The end of its stderr.
    #[serde(default)]
    pub stderr_tail: Vec<String>,
}

/// Who noticed the hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectedBy {
    /// The launcher's deadline: the ranks' stages are known.
    Launcher,
    /// The transport's deadline: the launcher itself never got to report.
    Transport,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum NcclOutcome {
    /// The all-reduce ran and gave the right sum.
    Healthy(NcclHealthy),
    /// Some rank did not finish by the deadline.
    Hung {
        /// Seconds until the hang was declared.
        after_s: f64,
        /// The deadline, seconds.
        timeout_s: f64,
        /// Who declared it.
        detected_by: DetectedBy,
        /// Where each rank was (empty when the transport declared it).
        ranks: Vec<RankState>,
    },
    /// A rank exited with an error (or the sum was wrong).
    Crashed {
        /// The first rank that failed.
        rank: u32,
        /// Its exit code (negative: killed by that signal).
        code: i32,
        /// Seconds into the preflight.
        after_s: f64,
        /// Set when the all-reduce returned a wrong sum.
        wrong_sum: Option<serde_json::Value>,
        /// Every rank's state and output tails.
        ranks: Vec<RankState>,
    },
    /// Fewer GPUs are visible than ranks were asked for.
    TooFewGpus {
        /// The CUDA devices asked for.
        wanted: Vec<u32>,
        /// How many torch sees.
        visible: u32,
        /// `CUDA_VISIBLE_DEVICES`, when set.
        cuda_visible_devices: Option<String>,
    },
    /// torch cannot be imported by that python.
    TorchMissing {
        /// The python.
        python: String,
        /// The import error.
        error: String,
    },
    /// torch is there but without NCCL.
    NcclMissing {
        /// The python.
        python: String,
        /// torch's version.
        torch: String,
    },
}

/// A preflight's full result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclRun {
    /// The verdict.
    #[serde(flatten)]
    pub outcome: NcclOutcome,
    /// What ran, when the launcher got that far.
    pub start: Option<NcclStart>,
    /// Seconds from the call to its return, as the caller measured it.
    pub wall_s: f64,
    /// What the launcher printed on stdout, raw (empty when the transport killed it).
    #[serde(skip)]
    pub launcher_stdout: String,
}

impl NcclRun {
    /// Whether the all-reduce was healthy.
    pub fn healthy(&self) -> bool {
        matches!(self.outcome, NcclOutcome::Healthy(_))
    }
}

/// What to try when the all-reduce hangs.
pub fn hang_remedies() -> Vec<String> {
    [
        "rerun with NCCL_DEBUG=INFO (`--env NCCL_DEBUG=INFO`) to see the last step each rank reached",
        "NCCL_P2P_DISABLE=1: PCIe peer-to-peer through a switch with ACS enabled, or an IOMMU in translated mode, is the common cause of a hang at init",
        "on the node: disable ACS on the PCIe switches, or boot with `iommu=pt` (`amd_iommu=on iommu=pt` / `intel_iommu=on iommu=pt`)",
        "NCCL_IB_DISABLE=1 when there is no working InfiniBand/RoCE (a single machine needs none)",
        "check that every GPU of the service is visible in the container (`nvidia-smi -L`, `provision gpu check`)",
    ]
    .map(String::from)
    .to_vec()
}

/// The configuration the launcher reads.
#[derive(Debug, Serialize)]
struct LauncherConfig<'a> {
    source: &'a str,
    devices: Vec<u32>,
    visible_devices: Option<String>,
    env: BTreeMap<&'a str, &'a str>,
    timeout_s: f64,
    bytes: u64,
    iters: u32,
    warmup: u32,
    hang_rank: Option<u32>,
    crash_rank: Option<u32>,
}

/// The CUDA devices each rank uses, and the `CUDA_VISIBLE_DEVICES` to set when GPUs are
/// named by UUID.
fn devices(gpus: &[GpuSelector]) -> Result<(Vec<u32>, Option<String>), NcclError> {
    if gpus.is_empty() {
        return Err(NcclError::Options("no GPUs given".into()));
    }
    let distinct: BTreeSet<String> = gpus.iter().map(|g| g.to_string().to_lowercase()).collect();
    if distinct.len() != gpus.len() {
        return Err(NcclError::Options("a GPU is named twice".into()));
    }
    let indices: Option<Vec<u32>> = gpus
        .iter()
        .map(|g| match g {
            GpuSelector::Index(i) => Some(*i),
            GpuSelector::Uuid(_) => None,
        })
        .collect();
    if let Some(indices) = indices {
        return Ok((indices, None));
    }
    let uuids: Option<Vec<&str>> = gpus
        .iter()
        .map(|g| match g {
            GpuSelector::Uuid(u) => Some(u.as_str()),
            GpuSelector::Index(_) => None,
        })
        .collect();
    match uuids {
        Some(uuids) => Ok(((0..uuids.len() as u32).collect(), Some(uuids.join(",")))),
        None => Err(NcclError::Options(
            "name the GPUs either all by index or all by UUID".into(),
        )),
    }
}

/// The program fed to `python -`: the script, then a call of its launcher with the
/// configuration. The configuration travels on stdin, never on a command line, because the
/// service's environment may hold secrets.
fn program(opts: &NcclOptions) -> Result<String, NcclError> {
    let (devices, visible_devices) = devices(&opts.gpus)?;
    let (mut hang_rank, mut crash_rank) = (None, None);
    match opts.simulate {
        Some(Simulate::HangRank(r)) => hang_rank = Some(r),
        Some(Simulate::CrashRank(r)) => crash_rank = Some(r),
        None => {}
    }
    if let Some(r) = hang_rank.or(crash_rank)
        && r as usize >= devices.len()
    {
        return Err(NcclError::Options(format!(
            "rank {r} does not exist: there are {} ranks",
            devices.len()
        )));
    }
    let config = LauncherConfig {
        source: SCRIPT,
        devices,
        visible_devices,
        env: opts
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        timeout_s: opts.timeout.as_secs_f64(),
        bytes: opts.bytes,
        iters: opts.iters.max(1),
        warmup: opts.warmup,
        hang_rank,
        crash_rank,
    };
    let json = serde_json::to_string(&config).expect("the configuration serializes");
    // A JSON string is also a valid Python string literal.
    let literal = serde_json::to_string(&json).expect("a string serializes");
    Ok(format!(
        "{SCRIPT}\nsys.exit(launcher_main(json.loads({literal})))\n"
    ))
}

/// Runs the preflight through `transport` and says how it went.
pub fn run_preflight(transport: &dyn Transport, opts: &NcclOptions) -> Result<NcclRun, NcclError> {
    let program = program(opts)?;
    let started = Instant::now();
    let result = transport.exec(
        &command(opts),
        program.as_bytes(),
        opts.timeout + opts.grace,
    );
    let wall_s = started.elapsed().as_secs_f64();
    let out = match result {
        Err(TransportError::Timeout { .. }) => {
            return Ok(NcclRun {
                outcome: NcclOutcome::Hung {
                    after_s: wall_s,
                    timeout_s: opts.timeout.as_secs_f64(),
                    detected_by: DetectedBy::Transport,
                    ranks: Vec::new(),
                },
                start: None,
                wall_s,
                launcher_stdout: String::new(),
            });
        }
        Err(e) => return Err(e.into()),
        Ok(out) => out,
    };
    let stdout = out.stdout_text();
    let stderr = out.stderr_text();
    match parse_events(&stdout) {
        Ok((start, outcome)) => Ok(NcclRun {
            outcome,
            start,
            wall_s,
            launcher_stdout: stdout,
        }),
        Err(_) if matches!(out.status, Some(126 | 127)) => Err(NcclError::PythonNotFound {
            python: opts.python.clone(),
            output: stderr.trim().to_string(),
        }),
        Err(_) => Err(NcclError::NoResult {
            status: out.status,
            tail: tail(&format!("{stdout}{stderr}"), 15),
        }),
    }
}

/// The command line: the python reading its program from stdin, nothing else.
fn command(opts: &NcclOptions) -> String {
    format!("exec {} -u -", shell_quote(&opts.python))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// An event line of the launcher.
#[derive(Debug, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum RankEvent {
    Start(NcclStart),
    Result(NcclHealthy),
    Hung {
        after_s: f64,
        timeout_s: f64,
        ranks: Vec<RankState>,
    },
    Crash {
        rank: u32,
        code: i32,
        after_s: f64,
        wrong_sum: Option<serde_json::Value>,
        ranks: Vec<RankState>,
    },
    TooFewGpus {
        wanted: Vec<u32>,
        visible: u32,
        cuda_visible_devices: Option<String>,
    },
    TorchMissing {
        python: String,
        error: String,
    },
    NcclMissing {
        python: String,
        torch: String,
    },
}

/// Reads the launcher's stdout: the start line, if any, and the verdict (pure: the tests
/// feed it what the device machines printed). Lines without the prefix are ignored.
pub fn parse_events(stdout: &str) -> Result<(Option<NcclStart>, NcclOutcome), LauncherOutput> {
    let mut start = None;
    let mut verdict = None;
    for line in stdout.lines() {
        let Some(json) = line.strip_prefix(PREFIX) else {
            continue;
        };
        let event: RankEvent =
            serde_json::from_str(json).map_err(|source| LauncherOutput::BadLine {
                line: line.to_string(),
                source,
            })?;
        let outcome = match event {
            RankEvent::Start(s) => {
                start = Some(s);
                continue;
            }
            RankEvent::Result(h) => NcclOutcome::Healthy(h),
            RankEvent::Hung {
                after_s,
                timeout_s,
                ranks,
            } => NcclOutcome::Hung {
                after_s,
                timeout_s,
                detected_by: DetectedBy::Launcher,
                ranks,
            },
            RankEvent::Crash {
                rank,
                code,
                after_s,
                wrong_sum,
                ranks,
            } => NcclOutcome::Crashed {
                rank,
                code,
                after_s,
                wrong_sum,
                ranks,
            },
            RankEvent::TooFewGpus {
                wanted,
                visible,
                cuda_visible_devices,
            } => NcclOutcome::TooFewGpus {
                wanted,
                visible,
                cuda_visible_devices,
            },
            RankEvent::TorchMissing { python, error } => {
                NcclOutcome::TorchMissing { python, error }
            }
            RankEvent::NcclMissing { python, torch } => NcclOutcome::NcclMissing { python, torch },
        };
        verdict = Some(outcome);
    }
    verdict.map(|v| (start, v)).ok_or(LauncherOutput::NoVerdict)
}

/// Why the launcher's stdout holds no verdict.
#[derive(Debug, thiserror::Error)]
pub enum LauncherOutput {
    /// A line with the prefix that is not an event.
    #[error("bad launcher line `{line}`: {source}")]
    BadLine {
        /// The line.
        line: String,
        /// Why it is not an event.
        #[source]
        source: serde_json::Error,
    },
    /// No line said how the run ended.
    #[error("no verdict line")]
    NoVerdict,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_become_cuda_visible_devices() {
        let a = "GPU-11111111-2222-3333-4444-555555555555".to_string();
        let b = "GPU-66666666-2222-3333-4444-555555555555".to_string();
        let (devs, visible) =
            devices(&[GpuSelector::Uuid(a.clone()), GpuSelector::Uuid(b.clone())]).unwrap();
        assert_eq!(devs, vec![0, 1]);
        assert_eq!(visible, Some(format!("{a},{b}")));
    }

    #[test]
    fn mixed_duplicate_and_empty_selections_are_refused() {
        let uuid = GpuSelector::Uuid("GPU-11111111-2222-3333-4444-555555555555".into());
        assert!(devices(&[GpuSelector::Index(0), uuid]).is_err());
        assert!(devices(&[GpuSelector::Index(1), GpuSelector::Index(1)]).is_err());
        assert!(devices(&[]).is_err());
    }

    #[test]
    fn secrets_in_the_environment_stay_off_the_command_line() {
        let mut opts = NcclOptions::new(vec![GpuSelector::Index(0)], "/venv/bin/python");
        opts.env = vec![("HF_TOKEN".into(), "hf_secret'$(x)".into())];
        let program = program(&opts).unwrap();
        assert!(program.contains("hf_secret'$(x)"));
        assert!(!command(&opts).contains("hf_secret"));
        assert_eq!(command(&opts), "exec /venv/bin/python -u -");
    }
}
