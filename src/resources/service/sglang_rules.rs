//! Rules that know SGLang's releases: the options each release line has (recorded from the
//! real releases), argparse's abbreviations resolved as SGLang resolves them, and what each
//! line refuses or runs worse with. Pure: the plan runs them on what it read, the preflight
//! on the target before a restart.

use super::ServiceSpec;

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

    /// The seeds' error on 0.5.10: the hybrid model's speculative decoding needs the
    /// extra buffer.
    fn assert_needs_extra_buffer(s: &ServiceSpec) {
        let (errors, _) = release_rules(s, Some((0, 5, 10)), ARCH);
        assert!(
            errors[0]
                .message
                .contains("needs `mamba_scheduler_strategy: extra_buffer`"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_seeds_first_unit_is_refused_on_0_5_10() {
        let s = spec(&["--speculative-algorithm", "NEXTN"], &[]);
        assert_needs_extra_buffer(&s);
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
        assert_needs_extra_buffer(&s);
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
