//! The SGLang command line, built from the typed service fields. The unit file, the
//! deploy's proof of what systemd loaded and the preflight (which runs SGLang's own parser
//! on this exact argv) all take it from the one service description, so what is checked is
//! what runs.

use std::collections::BTreeMap;

use crate::inventory::Pos;
use crate::inventory::service::Service;

/// The server's argv, grouped one flag (with its value) per group so the unit puts each
/// on its own line (the first group is the interpreter and module), and where the
/// inventory set each flag, so a finding about a flag points at its line.
#[derive(Debug, Clone, Default)]
pub struct Argv {
    /// The words, by line of the unit file.
    pub groups: Vec<Vec<String>>,
    /// The inventory position behind each flag.
    pub positions: BTreeMap<String, Pos>,
}

impl Argv {
    fn flag(&mut self, name: &str, value: Option<String>, pos: Pos) {
        let mut g = vec![name.to_string()];
        g.extend(value);
        self.groups.push(g);
        self.positions.entry(name.to_string()).or_insert(pos);
    }

    /// The argv as one flat list.
    pub fn flat(&self) -> Vec<String> {
        self.groups.iter().flatten().cloned().collect()
    }
}

/// The argv of `service` run by `python` on the model at `model_path` (set at `model_pos`).
pub fn argv(service: &Service, python: &str, model_path: &str, model_pos: Pos) -> Argv {
    let mut a = Argv {
        groups: vec![vec![
            python.to_string(),
            "-m".to_string(),
            "sglang.launch_server".to_string(),
        ]],
        positions: BTreeMap::new(),
    };
    a.flag("--model-path", Some(model_path.to_string()), model_pos);
    a.flag(
        "--served-model-name",
        Some(service.served_model_name.to_string()),
        service.served_model_name.pos,
    );
    // The real flag; `--tp` only works as an argparse abbreviation of it.
    a.flag(
        "--tp-size",
        Some(service.tp.value.to_string()),
        service.tp.pos,
    );
    a.flag("--host", Some(service.host.to_string()), service.host.pos);
    a.flag(
        "--port",
        Some(service.port.value.to_string()),
        service.port.pos,
    );
    if service.trust_remote_code.value {
        a.flag("--trust-remote-code", None, service.trust_remote_code.pos);
    }
    let optional = [
        ("--attention-backend", &service.attention_backend),
        ("--kv-cache-dtype", &service.kv_cache_dtype),
        ("--reasoning-parser", &service.reasoning_parser),
        ("--tool-call-parser", &service.tool_call_parser),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            a.flag(name, Some(v.to_string()), v.pos);
        }
    }
    if let Some(spec) = &service.speculative {
        let pos = spec.algorithm.pos;
        a.flag(
            "--speculative-algorithm",
            Some(spec.algorithm.as_str().to_string()),
            pos,
        );
        a.flag(
            "--speculative-num-steps",
            Some(spec.num_steps.to_string()),
            spec.num_steps.pos,
        );
        a.flag(
            "--speculative-eagle-topk",
            Some(spec.eagle_topk.to_string()),
            spec.eagle_topk.pos,
        );
        a.flag(
            "--speculative-num-draft-tokens",
            Some(spec.num_draft_tokens.to_string()),
            spec.num_draft_tokens.pos,
        );
        if let Some(draft) = &spec.draft_model_path {
            a.flag(
                "--speculative-draft-model-path",
                Some(draft.to_string()),
                draft.pos,
            );
        }
    }
    if let Some(s) = &service.mamba_scheduler_strategy {
        a.flag("--mamba-scheduler-strategy", Some(s.to_string()), s.pos);
    }
    if let Some(s) = &service.mamba_radix_cache_strategy {
        a.flag("--mamba-radix-cache-strategy", Some(s.to_string()), s.pos);
    }
    if let Some(f) = &service.mem_fraction_static {
        a.flag("--mem-fraction-static", Some(f.value.to_string()), f.pos);
    }
    // Free arguments: a value follows its flag on the same line.
    let extra_start = a.groups.len();
    for arg in &service.extra_args {
        let word = arg.to_string();
        if word.starts_with("--") {
            let flag = word.split('=').next().unwrap_or_default().to_string();
            a.positions.entry(flag).or_insert(arg.pos);
        }
        let after_extra = a.groups.len() > extra_start;
        match a.groups.last_mut() {
            Some(last)
                if !word.starts_with('-')
                    && last.len() == 1
                    && last[0].starts_with("--")
                    && after_extra =>
            {
                last.push(word)
            }
            _ => a.groups.push(vec![word]),
        }
    }
    a
}
