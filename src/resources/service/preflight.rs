//! The SGLang preflight, run on the target before a service is (re)started: the rules that
//! know SGLang's releases (`sglang_rules`), the port, the model folder, the GPUs, and then the installed
//! SGLang's own argument handling on the exact argv (`sglang_preflight.py`). A failing
//! preflight stops the apply before the unit is written: the running service is untouched.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ServiceSpec;
use super::sglang_rules::{Finding, release, release_rules, server_args};

/// The script that runs SGLang's parser without launching a server.
const PARSER_SCRIPT: &str = include_str!("sglang_preflight.py");

/// The preflight's own settings; everything else it checks (the argv, environment, user,
/// working directory, port) is the service's, read from the one [`ServiceSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preflight {
    /// The venv (to read the installed SGLang's version).
    pub venv: String,
    /// The model folder.
    pub model_path: String,
    /// Tensor parallel size: how many GPUs must be there and all-reduce.
    pub tp: u32,
    /// How long SGLang's parser may take (it imports torch: tens of seconds).
    pub timeout_ms: u64,
    /// A GPU service (its container passes GPUs through): no `nvidia-smi`, no GPU it
    /// lists, or no accelerator SGLang sees is a failure, not a warning.
    #[serde(default)]
    pub gpus: bool,
    /// The ml-env's stable paths -> the generation being deployed: the preflight runs the
    /// new generation before the stable paths are switched to it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub links: std::collections::BTreeMap<String, String>,
}

impl Preflight {
    /// `path` under a stable path, as the same path in the generation being deployed.
    pub fn in_generation(&self, path: &str) -> String {
        for (stable, dir) in &self.links {
            if let Some(rest) = path.strip_prefix(stable.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{dir}{rest}");
            }
        }
        path.to_string()
    }
}

/// One thing that stops the deploy.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// The model has no `config.json`.
    #[error("{} does not exist: the model is not (fully) downloaded", .config.display())]
    ModelMissing {
        /// The file looked for.
        config: PathBuf,
    },
    /// `config.json` could not be read.
    #[error("cannot read {}: {source}", .config.display())]
    ConfigUnreadable {
        /// The file.
        config: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `config.json` is not JSON.
    #[error("{} is not JSON: {source}", .config.display())]
    ConfigNotJson {
        /// The file.
        config: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// No SGLang in the venv.
    #[error("SGLang is not installed in {venv}")]
    NotInstalled {
        /// The venv.
        venv: String,
    },
    /// A release rule refuses the argv.
    #[error("{0}")]
    Rule(Finding),
    /// Fewer GPUs than tp.
    #[error("tp {tp} needs {tp} GPUs, but the container sees {visible} (nvidia-smi -L)")]
    TooFewGpus {
        /// Tensor parallel size.
        tp: u32,
        /// GPUs `nvidia-smi -L` lists.
        visible: usize,
    },
    /// The NCCL all-reduce failed.
    #[error("{0}")]
    Nccl(NcclProblem),
    /// A GPU service in a container that shows no usable GPU.
    #[error("the service runs on GPUs, but {0}")]
    NoGpu(String),
    /// Another process holds the port.
    #[error("port {port} is already in use by another process, not {unit}")]
    PortInUse {
        /// The port.
        port: u16,
        /// The unit that may hold it.
        unit: String,
    },
    /// SGLang's own parser refused the argv (its words verbatim).
    #[error("SGLang {version} refuses these arguments:\n    {reason}")]
    Refused {
        /// The installed SGLang.
        version: String,
        /// Why.
        reason: ParserError,
    },
}

/// Why SGLang's argument check failed.
#[derive(Debug, thiserror::Error)]
pub enum ParserError {
    /// The interpreter could not be started.
    #[error("cannot run {python}: {source}")]
    Spawn {
        /// The interpreter.
        python: String,
        /// Why.
        source: std::io::Error,
    },
    /// It ran past its deadline.
    #[error("SGLang's argument check did not finish within {secs}s")]
    Timeout {
        /// The deadline.
        secs: u64,
    },
    /// It printed no verdict.
    #[error("SGLang's argument check printed no result (exit {code:?}): {stderr}")]
    NoResult {
        /// Its exit code.
        code: Option<i32>,
        /// The end of its stderr.
        stderr: String,
    },
    /// SGLang does not import.
    #[error("SGLang does not import in {venv}: {error}")]
    Import {
        /// The venv.
        venv: String,
        /// Python's error.
        error: String,
    },
    /// SGLang's parser said no, in its own words.
    #[error("{0}")]
    Refused(String),
}

/// Why the NCCL all-reduce across the service's GPUs failed.
#[derive(Debug, thiserror::Error)]
pub enum NcclProblem {
    /// The check itself could not run.
    #[error("the NCCL preflight could not run: {0}")]
    NotRun(#[from] crate::gpu::nccl::NcclError),
    /// It hung, as SGLang would at init.
    #[error("NCCL all-reduce across {tp} GPUs hung after {after_s:.0} s, as SGLang would at `Init torch distributed begin.`; try:\n      {}", .remedies.join("\n      "))]
    Hung {
        /// GPUs.
        tp: u32,
        /// Seconds until it was called hung.
        after_s: f64,
        /// What to try.
        remedies: Vec<String>,
    },
    /// A rank died.
    #[error("NCCL all-reduce failed: rank {rank} exited with {code}")]
    Crashed {
        /// The rank.
        rank: u32,
        /// Its exit code.
        code: i32,
    },
    /// torch sees fewer GPUs than tp.
    #[error("torch sees {visible} GPUs in {venv}, fewer than tp {tp}")]
    TooFewGpus {
        /// GPUs torch sees.
        visible: u32,
        /// The venv.
        venv: String,
        /// Tensor parallel size.
        tp: u32,
    },
    /// No torch.
    #[error("torch does not import in {venv}: {error}")]
    TorchMissing {
        /// The venv.
        venv: String,
        /// Python's error.
        error: String,
    },
    /// torch without NCCL.
    #[error("torch {torch} in {venv} has no NCCL")]
    NcclMissing {
        /// torch's version.
        torch: String,
        /// The venv.
        venv: String,
    },
}

/// Why a preflight did not pass.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The service declares no preflight.
    #[error("{unit} declares no preflight")]
    NotDeclared {
        /// The unit.
        unit: String,
    },
    /// The checks found problems; nothing was written or restarted.
    #[error("preflight of {unit} failed; nothing was restarted:\n  - {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  - "))]
    Failed {
        /// The unit.
        unit: String,
        /// What stops the deploy.
        problems: Vec<Problem>,
    },
}

/// What the preflight found (when it passes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreflightReport {
    /// The installed SGLang release.
    pub sglang_version: Option<String>,
    /// The model's architecture from its `config.json`.
    pub architecture: Option<String>,
    /// Things worth knowing that do not stop the deploy.
    pub warnings: Vec<String>,
}

/// The installed SGLang's version, from its dist-info in the venv.
fn installed_version(venv: &str) -> Option<String> {
    let fact = crate::resources::venv::read(Path::new(venv)).ok()??;
    fact.packages.get("sglang").cloned()
}

fn architecture(model_path: &str) -> Result<Option<String>, Problem> {
    let config = Path::new(model_path).join("config.json");
    let text = match std::fs::read_to_string(&config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Problem::ModelMissing { config });
        }
        Err(source) => return Err(Problem::ConfigUnreadable { config, source }),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| Problem::ConfigNotJson { config, source })?;
    Ok(v["architectures"][0].as_str().map(str::to_string))
}

/// The GPUs `nvidia-smi -L` lists, or why it lists none.
fn visible_gpus() -> Result<usize, String> {
    let out = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map_err(|e| format!("nvidia-smi cannot run here ({e}): the NVIDIA userspace is not installed (`gpus.userspace`)"))?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        return Err(format!(
            "nvidia-smi -L fails (exit {:?}): {text}",
            out.status.code()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .count())
}

fn unit_active(unit: &str) -> bool {
    Command::new("systemctl")
        .args(["is-active", "--quiet", unit])
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs SGLang's own parser on the argv; `Ok(None)` when it passes, `Ok(Some(warning))`
/// when it cannot judge (no accelerator), `Err` with SGLang's message when it refuses.
fn run_parser(service: &ServiceSpec, check: &Preflight) -> Result<Option<String>, ParserError> {
    let (python, args) = server_args(service);
    let python = &check.in_generation(python);
    let mut cmd = if service.user == "root" {
        Command::new("timeout")
    } else {
        let mut c = Command::new("runuser");
        c.args(["-u", &service.user, "--", "timeout"]);
        c
    };
    cmd.arg("--kill-after=5")
        .arg(format!("{}s", check.timeout_ms.div_ceil(1000)))
        .arg(python)
        .arg("-")
        .args(args)
        .current_dir(check.in_generation(&service.working_directory))
        .env("HF_HUB_OFFLINE", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for e in &service.environment {
        if let Some((k, v)) = e.split_once('=') {
            cmd.env(k, v);
        }
    }
    let spawn_error = |source| ParserError::Spawn {
        python: python.to_string(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(PARSER_SCRIPT.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_error)?;
    if out.status.code() == Some(124) {
        return Err(ParserError::Timeout {
            secs: check.timeout_ms / 1000,
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| ParserError::NoResult {
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / "),
        })?;
    if result["ok"] == serde_json::Value::Bool(true) {
        return Ok(None);
    }
    let error = result["error"].as_str().unwrap_or("").to_string();
    if error.contains("No accelerator") {
        return Ok(Some(format!(
            "SGLang's own argument check was inconclusive here (it needs a GPU): {error}"
        )));
    }
    if result["stage"] == "import" {
        return Err(ParserError::Import {
            venv: check.venv.clone(),
            error,
        });
    }
    Err(ParserError::Refused(error))
}

/// An NCCL all-reduce across the service's GPUs (the first `tp` it sees), in its ml-env,
/// with its environment: a line with the bus bandwidth, or why it failed with remedies.
fn nccl(service: &ServiceSpec, check: &Preflight) -> Result<String, NcclProblem> {
    use crate::gpu::nccl::{NcclOptions, NcclOutcome, hang_remedies, run_preflight};
    let gpus = (0..check.tp)
        .map(crate::inventory::container::GpuSelector::Index)
        .collect();
    let mut opts = NcclOptions::new(gpus, check.in_generation(server_args(service).0));
    opts.timeout = Duration::from_secs(90);
    opts.env = service
        .environment
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let transport = crate::transport::local::LocalTransport::default();
    let run = run_preflight(&transport, &opts)?;
    let venv = || check.venv.clone();
    match run.outcome {
        NcclOutcome::Healthy(h) => Ok(format!(
            "NCCL all-reduce across {} GPUs: healthy, bus bandwidth {:.1} GB/s",
            h.world, h.busbw_gbps
        )),
        NcclOutcome::Hung { after_s, .. } => Err(NcclProblem::Hung {
            tp: check.tp,
            after_s,
            remedies: hang_remedies(),
        }),
        NcclOutcome::Crashed { rank, code, .. } => Err(NcclProblem::Crashed { rank, code }),
        NcclOutcome::TooFewGpus { visible, .. } => Err(NcclProblem::TooFewGpus {
            visible,
            venv: venv(),
            tp: check.tp,
        }),
        NcclOutcome::TorchMissing { error, .. } => Err(NcclProblem::TorchMissing {
            venv: venv(),
            error,
        }),
        NcclOutcome::NcclMissing { torch, .. } => Err(NcclProblem::NcclMissing {
            torch,
            venv: venv(),
        }),
    }
}

/// Runs every check of `service`'s preflight; `Err` lists what stops the deploy, SGLang's
/// own words verbatim.
pub fn preflight(service: &ServiceSpec) -> Result<PreflightReport, PreflightError> {
    let Some(check) = &service.preflight else {
        return Err(PreflightError::NotDeclared {
            unit: service.unit.clone(),
        });
    };
    let mut report = PreflightReport {
        sglang_version: installed_version(&check.venv),
        ..Default::default()
    };
    let mut problems = Vec::new();
    match architecture(&check.model_path) {
        Ok(a) => report.architecture = a,
        Err(e) => problems.push(e),
    }
    let version = report.sglang_version.as_deref().and_then(release);
    if report.sglang_version.is_none() {
        problems.push(Problem::NotInstalled {
            venv: check.venv.clone(),
        });
    }
    let (rule_errors, warnings) = release_rules(service, version, report.architecture.as_deref());
    problems.extend(rule_errors.into_iter().map(Problem::Rule));
    report
        .warnings
        .extend(warnings.into_iter().map(|w| w.message));
    match visible_gpus() {
        Ok(visible) if (check.tp as usize) > visible => problems.push(Problem::TooFewGpus {
            tp: check.tp,
            visible,
        }),
        // The seeds lost ten minutes to a server hung at NCCL init: prove the GPUs can
        // all-reduce in this ml-env, with the service's environment, before restarting.
        Ok(_) if check.tp > 1 => match nccl(service, check) {
            Ok(line) => report.warnings.push(line),
            Err(e) => problems.push(Problem::Nccl(e)),
        },
        Ok(_) => {}
        Err(why) if check.gpus => problems.push(Problem::NoGpu(why)),
        Err(why) => report
            .warnings
            .push(format!("{why}: the GPU count was not checked")),
    }
    if let Some(port) = service.readiness.as_ref().and_then(|r| r.port()) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
            && !unit_active(&service.unit)
        {
            problems.push(Problem::PortInUse {
                port,
                unit: service.unit.clone(),
            });
        }
    }
    // SGLang's own verdict is shown even when a rule already objects: its words are the
    // ones people search for. Without SGLang or the model's config it cannot run.
    if let Some(version) = &report.sglang_version
        && Path::new(&check.model_path).join("config.json").is_file()
    {
        match run_parser(service, check) {
            Ok(None) => {}
            Ok(Some(w)) if check.gpus => problems.push(Problem::NoGpu(w)),
            Ok(Some(w)) => report.warnings.push(w),
            Err(reason) => problems.push(Problem::Refused {
                version: version.clone(),
                reason,
            }),
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(PreflightError::Failed {
            unit: service.unit.clone(),
            problems,
        })
    }
}
