//! The SGLang preflight, run on the target before a service is (re)started: rules that
//! know SGLang's releases, the port, the model folder, the GPUs, and then the installed
//! SGLang's own argument handling on the exact argv (`sglang_preflight.py`). A failing
//! preflight stops the apply before the unit is written: the running service is untouched.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::resources::service::ServiceSpec;

/// The script that runs SGLang's parser without launching a server.
const PARSER_SCRIPT: &str = include_str!("sglang_preflight.py");

/// Long options of SGLang's server parser on the 0.5.10 line (up to 0.5.13), recorded
/// from the real release.
const FLAGS_0_5_10: &str = include_str!("sglang_flags/0.5.10.txt");
/// The same for the 0.5.23 line (0.5.14 on, where the mamba option was renamed).
const FLAGS_0_5_23: &str = include_str!("sglang_flags/0.5.23.txt");

/// The recorded long options of the line `version` belongs to.
pub fn known_flags(version: (u32, u32, u32)) -> Vec<&'static str> {
    let text = if version < (0, 5, 14) {
        FLAGS_0_5_10
    } else {
        FLAGS_0_5_23
    };
    text.lines().filter(|l| l.starts_with("--")).collect()
}

/// Rewrites argparse abbreviations to the options they stand for, as argparse does
/// (`--speculative-algo NEXTN` is `--speculative-algorithm NEXTN`, `--tp=4` is
/// `--tp-size=4`), so rules see what SGLang sees. An exact option, an unknown one and an
/// ambiguous prefix (argparse refuses those itself) stay as written.
pub fn resolve_abbreviations(args: &[String], flags: &[&str]) -> Vec<String> {
    args.iter()
        .map(|arg| {
            if !arg.starts_with("--") || arg == "--" {
                return arg.clone();
            }
            let (name, value) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (arg.as_str(), None),
            };
            if flags.contains(&name) {
                return arg.clone();
            }
            let mut matches = flags.iter().filter(|f| f.starts_with(name));
            match (matches.next(), matches.next()) {
                (Some(full), None) => match value {
                    Some(v) => format!("{full}={v}"),
                    None => full.to_string(),
                },
                _ => arg.clone(),
            }
        })
        .collect()
}

/// Hybrid (Gated DeltaNet) architectures that SGLang's mamba rules apply to.
pub const HYBRID_GDN: &[&str] = &[
    "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForCausalLM",
];

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
}

/// What a release rule found, and the argv flag or environment variable it is about (so a
/// message can point at the inventory line that set it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The flag (`--mamba-scheduler-strategy`) or variable (`SGLANG_ENABLE_SPEC_V2`).
    pub about: String,
    /// What is wrong, in words.
    pub message: String,
}

impl Finding {
    fn new(about: &str, message: String) -> Self {
        Finding {
            about: about.to_string(),
            message,
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
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

/// `(major, minor, patch)` of a version such as `0.5.10.dev12+gd116a8c` or `0.5.10+standin`.
pub fn release(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.split(['+', '-']).next()?;
    let mut parts = core.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
    });
    Some((
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next().and_then(Result::ok).unwrap_or(0),
    ))
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{flag}=")))
        })
}

fn has_env(env: &[String], name: &str) -> Option<String> {
    env.iter()
        .find_map(|e| e.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// The interpreter of a service's argv and the arguments after `-m sglang.launch_server`.
pub fn server_args(service: &ServiceSpec) -> (&str, &[String]) {
    let argv = &service.exec_start;
    let python = argv.first().map_or("python3", String::as_str);
    let args = match argv.iter().position(|w| w == "sglang.launch_server") {
        Some(i) => &argv[i + 1..],
        None => argv.get(1..).unwrap_or_default(),
    };
    (python, args)
}

/// The release rules: `(errors, warnings)` for this service's argv and environment on
/// this SGLang and model.
pub fn release_rules(
    service: &ServiceSpec,
    version: Option<(u32, u32, u32)>,
    arch: Option<&str>,
) -> (Vec<Finding>, Vec<Finding>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    let Some(v) = version else {
        return (errors, warnings);
    };
    let args = resolve_abbreviations(server_args(service).1, &known_flags(v));
    let speculative = flag_value(&args, "--speculative-algorithm").is_some();
    let hybrid = arch.is_some_and(|a| HYBRID_GDN.contains(&a));
    let old_flag = flag_value(&args, "--mamba-scheduler-strategy");
    let new_flag = flag_value(&args, "--mamba-radix-cache-strategy");
    let strategy = new_flag.or(old_flag);
    let radix_off = args.iter().any(|a| a == "--disable-radix-cache");
    let spec_v2 = has_env(&service.environment, "SGLANG_ENABLE_SPEC_V2");
    let line = format!("{}.{}.{}", v.0, v.1, v.2);
    if ((0, 5, 10)..(0, 5, 14)).contains(&v) && speculative && hybrid && !radix_off {
        if strategy != Some("extra_buffer") {
            let about = if old_flag.is_some() {
                "--mamba-scheduler-strategy"
            } else {
                "--speculative-algorithm"
            };
            errors.push(Finding::new(about, format!(
                "speculative decoding on the hybrid GDN model {} with the radix cache needs `mamba_scheduler_strategy: extra_buffer` on SGLang {line} (it stops at start otherwise: \"not compatible with radix cache when using --mamba-scheduler-strategy no_buffer\")",
                arch.unwrap_or("?")
            )));
        }
        if v < (0, 5, 13) && spec_v2.as_deref() != Some("1") {
            warnings.push(Finding::new("--speculative-algorithm", format!(
                "SGLANG_ENABLE_SPEC_V2=1 is unset: on SGLang {line} speculative decoding then runs without the overlap scheduler"
            )));
        }
    }
    if v >= (0, 5, 20) && old_flag.is_some() {
        errors.push(Finding::new("--mamba-scheduler-strategy", format!(
            "SGLang {line} no longer knows --mamba-scheduler-strategy (removed in 0.5.20); set `mamba_radix_cache_strategy` instead, or drop it: `auto` picks extra_buffer"
        )));
    } else if v >= (0, 5, 14) && old_flag.is_some() {
        warnings.push(Finding::new("--mamba-scheduler-strategy", format!(
            "--mamba-scheduler-strategy is deprecated on SGLang {line}; its new name is --mamba-radix-cache-strategy (`mamba_radix_cache_strategy`)"
        )));
    }
    if v < (0, 5, 14) && new_flag.is_some() {
        errors.push(Finding::new("--mamba-radix-cache-strategy", format!(
            "SGLang {line} does not know --mamba-radix-cache-strategy (new in 0.5.14); use `mamba_scheduler_strategy`"
        )));
    }
    if v >= (0, 5, 14) && spec_v2.is_some() {
        warnings.push(Finding::new("SGLANG_ENABLE_SPEC_V2", format!(
            "SGLANG_ENABLE_SPEC_V2 has no effect on SGLang {line} (speculative decoding always runs the V2 worker)"
        )));
    }
    (errors, warnings)
}

/// The installed SGLang's version, from its dist-info in the venv.
fn installed_version(venv: &str) -> Option<String> {
    let fact = crate::agent::probe::venv(Path::new(venv)).ok()??;
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

fn visible_gpus() -> Option<usize> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .count()
    })
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
        .current_dir(&service.working_directory)
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
    let mut opts = NcclOptions::new(gpus, server_args(service).0.to_string());
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
        Some(visible) if (check.tp as usize) > visible => problems.push(Problem::TooFewGpus {
            tp: check.tp,
            visible,
        }),
        // The seeds lost ten minutes to a server hung at NCCL init: prove the GPUs can
        // all-reduce in this ml-env, with the service's environment, before restarting.
        Some(_) if check.tp > 1 => match nccl(service, check) {
            Ok(line) => report.warnings.push(line),
            Err(e) => problems.push(Problem::Nccl(e)),
        },
        Some(_) => {}
        None => report
            .warnings
            .push("nvidia-smi is not available here: the GPU count was not checked".into()),
    }
    if let Some(port) = service.readiness.as_ref().map(|r| r.port) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(args: &[&str], env: &[&str]) -> ServiceSpec {
        let argv: Vec<String> = ["/root/ml-env/bin/python3", "-m", "sglang.launch_server"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        serde_json::from_value(serde_json::json!({
            "unit": "sglang-qwen.service",
            "unit_path": "/etc/systemd/system/sglang-qwen.service",
            "exec_start": argv,
            "environment": env,
            "working_directory": "/root",
            "preflight": {
                "venv": "/root/ml-env",
                "model_path": "/shared/models/x",
                "tp": 4,
                "timeout_ms": 120_000,
            },
        }))
        .unwrap()
    }

    const ARCH: Option<&str> = Some("Qwen3_5MoeForConditionalGeneration");

    #[test]
    fn versions() {
        assert_eq!(release("0.5.10.dev12+gd116a8c"), Some((0, 5, 10)));
        assert_eq!(release("0.5.10+standin"), Some((0, 5, 10)));
        assert_eq!(release("0.5.23"), Some((0, 5, 23)));
        assert_eq!(release("0.0.0.dev0"), Some((0, 0, 0)));
    }

    #[test]
    fn the_seeds_first_unit_is_refused_on_0_5_10() {
        let s = spec(&["--speculative-algorithm", "NEXTN"], &[]);
        let (errors, _) = release_rules(&s, Some((0, 5, 10)), ARCH);
        assert!(
            errors[0]
                .message
                .contains("needs `mamba_scheduler_strategy: extra_buffer`"),
            "{errors:?}"
        );
        let fixed = spec(
            &[
                "--speculative-algorithm",
                "NEXTN",
                "--mamba-scheduler-strategy",
                "extra_buffer",
            ],
            &["SGLANG_ENABLE_SPEC_V2=1"],
        );
        let (errors, warnings) = release_rules(&fixed, Some((0, 5, 10)), ARCH);
        assert!(
            errors.is_empty() && warnings.is_empty(),
            "{errors:?} {warnings:?}"
        );
        // Before 0.5.10 the radix cache was disabled silently; not an error there.
        assert!(release_rules(&s, Some((0, 5, 9)), ARCH).0.is_empty());
        // Not a hybrid model: no rule.
        assert!(
            release_rules(&s, Some((0, 5, 10)), Some("LlamaForCausalLM"))
                .0
                .is_empty()
        );
    }

    /// The seeds' own argv spelled the algorithm `--speculative-algo`, which argparse
    /// accepts as an abbreviation; the rules must see it.
    #[test]
    fn abbreviations_are_resolved_before_the_rules() {
        let s = spec(
            &["--speculative-algo", "NEXTN", "--mamba-sched=no_buffer"],
            &[],
        );
        let (errors, _) = release_rules(&s, Some((0, 5, 10)), ARCH);
        assert!(
            errors[0]
                .message
                .contains("needs `mamba_scheduler_strategy: extra_buffer`"),
            "{errors:?}"
        );
        let flags = known_flags((0, 5, 10));
        let words = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            resolve_abbreviations(
                &words(&["--tp", "4", "--tp-size=2", "--speculative-num", "x"]),
                &flags
            ),
            words(&["--tp-size", "4", "--tp-size=2", "--speculative-num", "x"]),
            "exact stays, unique prefix resolves, ambiguous stays"
        );
        assert_eq!(
            resolve_abbreviations(&words(&["--mamba-radix-cache"]), &known_flags((0, 5, 23))),
            words(&["--mamba-radix-cache-strategy"])
        );
    }

    #[test]
    fn the_flag_was_renamed_then_removed() {
        let old = spec(
            &["--mamba-scheduler-strategy", "extra_buffer"],
            &["SGLANG_ENABLE_SPEC_V2=1"],
        );
        let (errors, warnings) = release_rules(&old, Some((0, 5, 16)), ARCH);
        assert!(errors.is_empty());
        assert!(
            warnings.iter().any(|w| w.message.contains("deprecated")),
            "{warnings:?}"
        );
        assert!(
            warnings
                .iter()
                .any(|w| w.message.contains("SGLANG_ENABLE_SPEC_V2 has no effect")),
            "{warnings:?}"
        );
        let (errors, _) = release_rules(&old, Some((0, 5, 23)), ARCH);
        assert!(
            errors[0]
                .message
                .contains("no longer knows --mamba-scheduler-strategy"),
            "{errors:?}"
        );
        let new = spec(&["--mamba-radix-cache-strategy", "extra_buffer"], &[]);
        assert!(release_rules(&new, Some((0, 5, 23)), ARCH).0.is_empty());
        assert!(
            release_rules(&new, Some((0, 5, 10)), ARCH).0[0]
                .message
                .contains("new in 0.5.14")
        );
    }
}
