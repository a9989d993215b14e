//! The SGLang command line and environment, built from the typed service fields. The unit
//! template and the preflight (which runs SGLang's own parser on this exact argv) both use
//! it, so what is checked is what runs.

use crate::inventory::service::Service;

/// The server's argv, grouped one flag (with its value) per group so the unit puts each
/// on its own line. The first group is the interpreter and module.
pub fn argv(service: &Service, python: &str, model_path: &str) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = vec![vec![
        python.to_string(),
        "-m".to_string(),
        "sglang.launch_server".to_string(),
    ]];
    let mut flag = |name: &str, value: Option<String>| {
        let mut g = vec![name.to_string()];
        g.extend(value);
        groups.push(g);
    };
    flag("--model-path", Some(model_path.to_string()));
    flag(
        "--served-model-name",
        Some(service.served_model_name.to_string()),
    );
    // The real flag; `--tp` only works as an argparse abbreviation of it.
    flag("--tp-size", Some(service.tp.value.to_string()));
    flag("--host", Some(service.host.to_string()));
    flag("--port", Some(service.port.value.to_string()));
    if service.trust_remote_code.value {
        flag("--trust-remote-code", None);
    }
    let optional = [
        ("--attention-backend", &service.attention_backend),
        ("--kv-cache-dtype", &service.kv_cache_dtype),
        ("--reasoning-parser", &service.reasoning_parser),
        ("--tool-call-parser", &service.tool_call_parser),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            flag(name, Some(v.to_string()));
        }
    }
    if let Some(spec) = &service.speculative {
        flag(
            "--speculative-algorithm",
            Some(spec.algorithm.as_str().to_string()),
        );
        flag("--speculative-num-steps", Some(spec.num_steps.to_string()));
        flag(
            "--speculative-eagle-topk",
            Some(spec.eagle_topk.to_string()),
        );
        flag(
            "--speculative-num-draft-tokens",
            Some(spec.num_draft_tokens.to_string()),
        );
        if let Some(draft) = &spec.draft_model_path {
            flag("--speculative-draft-model-path", Some(draft.to_string()));
        }
    }
    if let Some(s) = &service.mamba_scheduler_strategy {
        flag("--mamba-scheduler-strategy", Some(s.to_string()));
    }
    if let Some(s) = &service.mamba_radix_cache_strategy {
        flag("--mamba-radix-cache-strategy", Some(s.to_string()));
    }
    if let Some(f) = &service.mem_fraction_static {
        flag("--mem-fraction-static", Some(f.value.to_string()));
    }
    // Free arguments: a value follows its flag on the same line.
    let extra_start = groups.len();
    for arg in &service.extra_args {
        let word = arg.to_string();
        let after_extra = groups.len() > extra_start;
        match groups.last_mut() {
            Some(last)
                if !word.starts_with('-')
                    && last.len() == 1
                    && last[0].starts_with("--")
                    && after_extra =>
            {
                last.push(word)
            }
            _ => groups.push(vec![word]),
        }
    }
    groups
}

/// The argv as one flat list.
pub fn flat_argv(groups: &[Vec<String>]) -> Vec<String> {
    groups.iter().flatten().cloned().collect()
}
