//! The SGLang preflight, run on the target before a service is (re)started: rules that
//! know SGLang's releases, the port, the model folder, the GPUs, and then the installed
//! SGLang's own argument handling on the exact argv (`sglang_preflight.py`). A failing
//! preflight stops the apply before the unit is written: the running service is untouched.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// What to check before (re)starting one service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreflightSpec {
    /// The unit it is for.
    pub unit: String,
    /// The venv's Python.
    pub python: String,
    /// The venv (to read the installed SGLang's version).
    pub venv: String,
    /// The argv after `-m sglang.launch_server`.
    pub args: Vec<String>,
    /// The unit's `NAME=value` environment.
    pub environment: Vec<String>,
    /// The unit's working directory.
    pub working_directory: String,
    /// The unit's user.
    pub user: String,
    /// The port it listens on.
    pub port: u16,
    /// The model folder.
    pub model_path: String,
    /// Tensor parallel size.
    pub tp: u32,
    /// How long SGLang's parser may take (it imports torch: tens of seconds).
    pub timeout_ms: u64,
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

/// The release rules: `(errors, warnings)` for this argv on this SGLang and model.
pub fn release_rules(
    spec: &PreflightSpec,
    version: Option<(u32, u32, u32)>,
    arch: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    let Some(v) = version else {
        return (errors, warnings);
    };
    let args = resolve_abbreviations(&spec.args, &known_flags(v));
    let speculative = flag_value(&args, "--speculative-algorithm").is_some();
    let hybrid = arch.is_some_and(|a| HYBRID_GDN.contains(&a));
    let old_flag = flag_value(&args, "--mamba-scheduler-strategy");
    let new_flag = flag_value(&args, "--mamba-radix-cache-strategy");
    let strategy = new_flag.or(old_flag);
    let radix_off = args.iter().any(|a| a == "--disable-radix-cache");
    let spec_v2 = has_env(&spec.environment, "SGLANG_ENABLE_SPEC_V2");
    let line = format!("{}.{}.{}", v.0, v.1, v.2);
    if ((0, 5, 10)..(0, 5, 14)).contains(&v) && speculative && hybrid && !radix_off {
        if strategy != Some("extra_buffer") {
            errors.push(format!(
                "speculative decoding on the hybrid GDN model {} with the radix cache needs `mamba_scheduler_strategy: extra_buffer` on SGLang {line} (it stops at start otherwise: \"not compatible with radix cache when using --mamba-scheduler-strategy no_buffer\")",
                arch.unwrap_or("?")
            ));
        }
        if v < (0, 5, 13) && spec_v2.as_deref() != Some("1") {
            warnings.push(format!(
                "SGLANG_ENABLE_SPEC_V2=1 is unset: on SGLang {line} speculative decoding then runs without the overlap scheduler"
            ));
        }
    }
    if v >= (0, 5, 20) && old_flag.is_some() {
        errors.push(format!(
            "SGLang {line} no longer knows --mamba-scheduler-strategy (removed in 0.5.20); set `mamba_radix_cache_strategy` instead, or drop it: `auto` picks extra_buffer"
        ));
    } else if v >= (0, 5, 14) && old_flag.is_some() {
        warnings.push(format!(
            "--mamba-scheduler-strategy is deprecated on SGLang {line}; its new name is --mamba-radix-cache-strategy (`mamba_radix_cache_strategy`)"
        ));
    }
    if v < (0, 5, 14) && new_flag.is_some() {
        errors.push(format!(
            "SGLang {line} does not know --mamba-radix-cache-strategy (new in 0.5.14); use `mamba_scheduler_strategy`"
        ));
    }
    if v >= (0, 5, 14) && spec_v2.is_some() {
        warnings.push(format!(
            "SGLANG_ENABLE_SPEC_V2 has no effect on SGLang {line} (speculative decoding always runs the V2 worker)"
        ));
    }
    (errors, warnings)
}

/// The installed SGLang's version, from its dist-info in the venv.
fn installed_version(venv: &str) -> Option<String> {
    let fact = crate::agent::probe::venv(Path::new(venv)).ok()??;
    fact.packages.get("sglang").cloned()
}

fn architecture(model_path: &str) -> Result<Option<String>, String> {
    let config = Path::new(model_path).join("config.json");
    let text = match std::fs::read_to_string(&config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} does not exist: the model is not (fully) downloaded",
                config.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", config.display())),
    };
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", config.display()))?;
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
fn run_parser(spec: &PreflightSpec) -> Result<Option<String>, String> {
    let mut cmd = if spec.user == "root" {
        Command::new("timeout")
    } else {
        let mut c = Command::new("runuser");
        c.args(["-u", &spec.user, "--", "timeout"]);
        c
    };
    cmd.arg("--kill-after=5")
        .arg(format!("{}s", spec.timeout_ms.div_ceil(1000)))
        .arg(&spec.python)
        .arg("-")
        .args(&spec.args)
        .current_dir(&spec.working_directory)
        .env("HF_HUB_OFFLINE", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for e in &spec.environment {
        if let Some((k, v)) = e.split_once('=') {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", spec.python))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(PARSER_SCRIPT.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot run {}: {e}", spec.python))?;
    if out.status.code() == Some(124) {
        return Err(format!(
            "SGLang's argument check did not finish within {}s",
            spec.timeout_ms / 1000
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            format!(
                "SGLang's argument check printed no result (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" / ")
            )
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
        return Err(format!("SGLang does not import in {}: {error}", spec.venv));
    }
    Err(error)
}

/// An NCCL all-reduce across the service's GPUs (the first `tp` it sees), in its ml-env,
/// with its environment: a line with the bus bandwidth, or why it failed with remedies.
fn nccl(spec: &PreflightSpec) -> Result<String, String> {
    use crate::gpu::nccl::{NcclOptions, NcclOutcome, hang_remedies, run_preflight};
    let gpus = (0..spec.tp)
        .map(crate::inventory::container::GpuSelector::Index)
        .collect();
    let mut opts = NcclOptions::new(gpus, spec.python.clone());
    opts.timeout = Duration::from_secs(90);
    opts.env = spec
        .environment
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let transport = crate::transport::local::LocalTransport::default();
    let run = run_preflight(&transport, &opts)
        .map_err(|e| format!("the NCCL preflight could not run: {e}"))?;
    match &run.outcome {
        NcclOutcome::Healthy(h) => Ok(format!(
            "NCCL all-reduce across {} GPUs: healthy, bus bandwidth {:.1} GB/s",
            h.world, h.busbw_gbps
        )),
        NcclOutcome::Hung { after_s, .. } => Err(format!(
            "NCCL all-reduce across {} GPUs hung after {after_s:.0} s, as SGLang would at `Init torch distributed begin.`; try:\n      {}",
            spec.tp,
            hang_remedies().join("\n      ")
        )),
        NcclOutcome::Crashed { rank, code, .. } => Err(format!(
            "NCCL all-reduce failed: rank {rank} exited with {code}"
        )),
        NcclOutcome::TooFewGpus { visible, .. } => Err(format!(
            "torch sees {visible} GPUs in {}, fewer than tp {}",
            spec.venv, spec.tp
        )),
        NcclOutcome::TorchMissing { error, .. } => {
            Err(format!("torch does not import in {}: {error}", spec.venv))
        }
        NcclOutcome::NcclMissing { torch, .. } => {
            Err(format!("torch {torch} in {} has no NCCL", spec.venv))
        }
    }
}

/// Runs every check; `Err` lists what stops the deploy, SGLang's own words verbatim.
pub fn preflight(spec: &PreflightSpec) -> Result<PreflightReport, String> {
    let mut report = PreflightReport {
        sglang_version: installed_version(&spec.venv),
        ..Default::default()
    };
    let mut errors = Vec::new();
    match architecture(&spec.model_path) {
        Ok(a) => report.architecture = a,
        Err(e) => errors.push(e),
    }
    let version = report.sglang_version.as_deref().and_then(release);
    if report.sglang_version.is_none() {
        errors.push(format!("SGLang is not installed in {}", spec.venv));
    }
    let (rule_errors, warnings) = release_rules(spec, version, report.architecture.as_deref());
    errors.extend(rule_errors);
    report.warnings.extend(warnings);
    match visible_gpus() {
        Some(n) if (spec.tp as usize) > n => errors.push(format!(
            "tp {} needs {} GPUs, but the container sees {n} (nvidia-smi -L)",
            spec.tp, spec.tp
        )),
        // The seeds lost ten minutes to a server hung at NCCL init: prove the GPUs can
        // all-reduce in this ml-env, with the service's environment, before restarting.
        Some(_) if spec.tp > 1 => match nccl(spec) {
            Ok(line) => report.warnings.push(line),
            Err(e) => errors.push(e),
        },
        Some(_) => {}
        None => report
            .warnings
            .push("nvidia-smi is not available here: the GPU count was not checked".into()),
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], spec.port));
    if TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
        && !unit_active(&spec.unit)
    {
        errors.push(format!(
            "port {} is already in use by another process, not {}",
            spec.port, spec.unit
        ));
    }
    // SGLang's own verdict is shown even when a rule already objects: its words are the
    // ones people search for. Without SGLang or the model's config it cannot run.
    if report.sglang_version.is_some() && Path::new(&spec.model_path).join("config.json").is_file()
    {
        match run_parser(spec) {
            Ok(None) => {}
            Ok(Some(w)) => report.warnings.push(w),
            Err(e) => errors.push(format!(
                "SGLang {} refuses these arguments:\n    {e}",
                report.sglang_version.as_deref().unwrap_or("?")
            )),
        }
    }
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "preflight of {} failed; nothing was restarted:\n  - {}",
            spec.unit,
            errors.join("\n  - ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(args: &[&str], env: &[&str]) -> PreflightSpec {
        PreflightSpec {
            unit: "sglang-qwen.service".into(),
            python: "/root/ml-env/bin/python3".into(),
            venv: "/root/ml-env".into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            environment: env.iter().map(|s| s.to_string()).collect(),
            working_directory: "/root".into(),
            user: "root".into(),
            port: 30000,
            model_path: "/shared/models/x".into(),
            tp: 4,
            timeout_ms: 120_000,
        }
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
            errors[0].contains("needs `mamba_scheduler_strategy: extra_buffer`"),
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
            errors[0].contains("needs `mamba_scheduler_strategy: extra_buffer`"),
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
            warnings.iter().any(|w| w.contains("deprecated")),
            "{warnings:?}"
        );
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("SGLANG_ENABLE_SPEC_V2 has no effect")),
            "{warnings:?}"
        );
        let (errors, _) = release_rules(&old, Some((0, 5, 23)), ARCH);
        assert!(
            errors[0].contains("no longer knows --mamba-scheduler-strategy"),
            "{errors:?}"
        );
        let new = spec(&["--mamba-radix-cache-strategy", "extra_buffer"], &[]);
        assert!(release_rules(&new, Some((0, 5, 23)), ARCH).0.is_empty());
        assert!(release_rules(&new, Some((0, 5, 10)), ARCH).0[0].contains("new in 0.5.14"));
    }
}
