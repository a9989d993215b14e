//! A service's rules: its model, ml-env, tp, port and unit, its systemd directives,
//! `extra_args`, fallbacks, restart limits and readiness settings.

use std::collections::HashMap;

use super::{Validator, unit_name, written};
use crate::inventory::container::Container;
use crate::inventory::load::did_you_mean;
use crate::inventory::spanned::Sp;
use crate::inventory::text::{Name, Text};

/// The SGLang flags the typed service fields produce; `extra_args` must not repeat them.
const TYPED_FLAGS: &[(&str, &str)] = &[
    ("--model-path", "model"),
    ("--model", "model"),
    ("--served-model-name", "served_model_name"),
    ("--tp", "tp"),
    ("--tp-size", "tp"),
    ("--tensor-parallel-size", "tp"),
    ("--host", "host"),
    ("--port", "port"),
    ("--trust-remote-code", "trust_remote_code"),
    ("--attention-backend", "attention_backend"),
    ("--kv-cache-dtype", "kv_cache_dtype"),
    ("--reasoning-parser", "reasoning_parser"),
    ("--tool-call-parser", "tool_call_parser"),
    ("--speculative-algorithm", "speculative.algorithm"),
    ("--speculative-algo", "speculative.algorithm"),
    ("--speculative-num-steps", "speculative.num_steps"),
    ("--speculative-eagle-topk", "speculative.eagle_topk"),
    (
        "--speculative-num-draft-tokens",
        "speculative.num_draft_tokens",
    ),
    ("--mamba-scheduler-strategy", "mamba_scheduler_strategy"),
    ("--mamba-radix-cache-strategy", "mamba_radix_cache_strategy"),
    ("--mem-fraction-static", "mem_fraction_static"),
];

impl Validator<'_> {
    pub(super) fn directives(
        &mut self,
        service: &Name,
        d: &crate::inventory::service::UnitDirectives,
    ) {
        if let Some(n) = &d.nice
            && !(-20..=19).contains(&n.value)
        {
            self.err(
                n.pos,
                format!("nice {} is outside -20..19", n.value),
                "-20 runs first, 19 last; 0 is the default",
            );
        }
        if let Some(n) = &d.oom_score_adjust
            && !(-1000..=1000).contains(&n.value)
        {
            self.err(
                n.pos,
                format!("oom_score_adjust {} is outside -1000..1000", n.value),
                "-1000 is never killed for memory, 1000 first",
            );
        }
        for (field, limit) in [
            ("limit_nofile", &d.limit_nofile),
            ("limit_memlock", &d.limit_memlock),
        ] {
            if let Some(l) = limit {
                let v = l.as_str();
                let digits = v.trim_end_matches(['K', 'M', 'G', 'T']);
                let ok = v == "infinity"
                    || (!digits.is_empty()
                        && digits.chars().all(|c| c.is_ascii_digit())
                        && (field == "limit_memlock" || digits == v));
                if !ok {
                    self.err(
                        l.pos,
                        format!("{field} `{v}` is not a limit"),
                        "a number such as 1048576, or `infinity`",
                    );
                }
            }
        }
        for cpus in &d.cpu_affinity {
            let ok = cpus.as_str().split(',').all(|part| {
                let mut ends = part.splitn(2, '-');
                let number = |s: Option<&str>| {
                    s.is_some_and(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()))
                };
                let first = ends.next();
                number(first) && ends.next().is_none_or(|e| number(Some(e)))
            });
            if !ok {
                self.err(
                    cpus.pos,
                    format!("cpu_affinity `{}` is not a CPU list", cpus.value),
                    "CPU numbers and ranges, e.g. \"0-31\" or \"0,2,4\"",
                );
            }
        }
        for argv in &d.exec_start_pre {
            match argv.first() {
                Some(first) if first.as_str().starts_with('/') => {}
                Some(first) => self.err(
                    first.pos,
                    format!(
                        "exec_start_pre of `{service}` runs `{}`, not an absolute path",
                        first.value
                    ),
                    "start each command with its absolute path, e.g. /usr/bin/nvidia-smi",
                ),
                None => {}
            }
        }
        for (name, value) in &d.extra {
            if crate::inventory::service::MANAGED_DIRECTIVES.contains(&name.as_str()) {
                let typed = match name.as_str() {
                    "LimitNOFILE" => "set `systemd.limit_nofile` instead",
                    "LimitMEMLOCK" => "set `systemd.limit_memlock` instead",
                    "Nice" => "set `systemd.nice` instead",
                    "OOMScoreAdjust" => "set `systemd.oom_score_adjust` instead",
                    "CPUAffinity" => "set `systemd.cpu_affinity` instead",
                    "ExecStartPre" => "set `systemd.exec_start_pre` instead",
                    _ => "provision writes it from the service's typed fields",
                };
                self.err(
                    value.pos,
                    format!("`{name}` in systemd.extra is a directive provision writes itself"),
                    typed,
                );
            }
        }
    }

    pub(super) fn services(&mut self, ct_name: &Name, ct: &Container) {
        let gpu_count = ct.gpus.as_ref().map_or(0, |g| g.devices.len());
        let model_names: Vec<&str> = ct.models.keys().map(|k| k.as_str()).collect();
        let mut ports: HashMap<u16, &Name> = HashMap::new();
        let mut units: HashMap<String, &Name> = HashMap::new();
        for (name, svc) in &ct.services {
            match (&svc.model, &svc.model_path) {
                (Some(model), None) if !ct.models.contains_key(model.as_str()) => {
                    let hint = match did_you_mean(model.as_str(), &model_names) {
                        Some(best) => format!("did you mean `{best}`?"),
                        None if model_names.is_empty() => {
                            "declare it under `models:` in this container, or give its folder as `model_path:`".to_string()
                        }
                        None => format!("declared models: {}", model_names.join(", ")),
                    };
                    self.err(
                        model.pos,
                        format!(
                            "service `{name}` serves model `{}`, which is not declared",
                            model.value
                        ),
                        hint,
                    );
                }
                (Some(model), None)
                    if ct.models.get(model.as_str()).is_some_and(|m| m.absent()) =>
                {
                    self.err(
                        model.pos,
                        format!(
                            "service `{name}` serves model `{}`, which is declared `state: absent`",
                            model.value
                        ),
                        "serve another model, or remove the service first: `state: absent` deletes the folder",
                    );
                }
                (Some(model), Some(_)) => self.err(
                    model.pos,
                    format!("service `{name}` sets both `model` and `model_path`"),
                    "keep `model` for a model under `models:`, or `model_path` for a folder provision does not manage",
                ),
                (None, None) => self.err(
                    svc.served_model_name.pos,
                    format!("service `{name}` names no model"),
                    "set `model:` (a name under `models:`) or `model_path:` (a folder on the container)",
                ),
                _ => {}
            }
            if ct.ml_env.is_none() {
                self.err(
                    svc.served_model_name.pos,
                    format!("service `{name}` needs an `ml_env:` to run from"),
                    "declare the Python environment with SGLang under `ml_env:`",
                );
            }
            if svc.tp.value == 0 {
                self.err(
                    svc.tp.pos,
                    "tp must be at least 1",
                    "tp is the number of GPUs one model instance spans",
                );
            } else if svc.tp.value > 1 && svc.tp.value as usize > gpu_count {
                // tp 1 runs on whatever the container sees: a CPU-only server, or GPUs
                // passed through by something other than provision.
                self.err(
                    svc.tp.pos,
                    format!(
                        "tp {} is more than the {gpu_count} GPU(s) passed through to `{ct_name}`",
                        svc.tp.value
                    ),
                    "lower tp or pass more GPUs through under `gpus.devices`",
                );
            }
            if let Some(first) = ports.insert(svc.port.value, name) {
                self.err(
                    svc.port.pos,
                    format!(
                        "port {} is used by services `{first}` and `{name}`",
                        svc.port.value
                    ),
                    "give each service its own port",
                );
            }
            let unit = unit_name(name, svc.unit.as_ref());
            if let Some(first) = units.insert(unit.clone(), name) {
                self.err(
                    svc.unit
                        .as_ref()
                        .map_or(svc.served_model_name.pos, |u| u.pos),
                    format!("unit `{unit}` is used by services `{first}` and `{name}`"),
                    "give each service its own unit",
                );
            }
            if let (Some(old), Some(_)) = (
                &svc.mamba_scheduler_strategy,
                &svc.mamba_radix_cache_strategy,
            ) {
                self.err(old.pos, "both names of the mamba strategy are set", "keep the one your SGLang knows: mamba_scheduler_strategy up to 0.5.19, mamba_radix_cache_strategy from 0.5.14");
            }
            if let Some(f) = &svc.mem_fraction_static
                && !(f.value > 0.0 && f.value < 1.0)
            {
                self.err(
                    f.pos,
                    format!("mem_fraction_static {} is not between 0 and 1", f.value),
                    "a fraction such as 0.85",
                );
            }
            self.directives(name, &svc.systemd);
            if let Some(spec) = &svc.speculative {
                for (n, field) in [
                    (&spec.num_steps, "num_steps"),
                    (&spec.eagle_topk, "eagle_topk"),
                    (&spec.num_draft_tokens, "num_draft_tokens"),
                ] {
                    if n.value == 0 {
                        self.err(
                            n.pos,
                            format!("speculative.{field} must be at least 1"),
                            "e.g. num_steps 3, eagle_topk 1, num_draft_tokens 4",
                        );
                    }
                }
            }
            for arg in &svc.extra_args {
                let flag = arg.as_str().split('=').next().unwrap_or("");
                if let Some((_, field)) = TYPED_FLAGS.iter().find(|(f, _)| *f == flag) {
                    self.err(
                        arg.pos,
                        format!("`{flag}` in extra_args repeats a typed field"),
                        format!("set `{field}` instead, so provision can check it"),
                    );
                }
            }
            for f in &svc.fallback {
                for w in &f.without {
                    let ok = crate::inventory::service::FALLBACK_DROPPABLE.contains(&w.as_str())
                        || w.as_str()
                            .strip_prefix("environment.")
                            .is_some_and(|n| svc.environment.keys().any(|k| k.as_str() == n));
                    if !ok {
                        let hint = match did_you_mean(
                            w.as_str(),
                            crate::inventory::service::FALLBACK_DROPPABLE,
                        ) {
                            Some(best) => format!("did you mean `{best}`?"),
                            None => format!(
                                "droppable: {}, or environment.NAME of a variable the service sets",
                                crate::inventory::service::FALLBACK_DROPPABLE.join(", ")
                            ),
                        };
                        self.err(
                            w.pos,
                            format!("fallback `{}` cannot drop `{}`", f.name.value, w.value),
                            hint,
                        );
                    }
                }
                for arg in &f.extra_args {
                    let flag = arg.as_str().split('=').next().unwrap_or("");
                    if let Some((_, field)) = TYPED_FLAGS.iter().find(|(fl, _)| *fl == flag) {
                        self.err(
                            arg.pos,
                            format!("`{flag}` in a fallback's extra_args repeats a typed field"),
                            format!(
                                "the fallback keeps `{field}` unless it lists it under `without`"
                            ),
                        );
                    }
                }
            }
            let restart = &svc.restart;
            let loop_time = restart.delay.millis() * u64::from(restart.start_limit_burst.value);
            if restart.policy.value != crate::inventory::service::RestartPolicy::No
                && loop_time >= restart.start_limit_interval.millis()
            {
                self.err(
                    written(&[
                        restart.start_limit_interval.pos,
                        restart.delay.pos,
                        restart.start_limit_burst.pos,
                    ]),
                    format!(
                        "a crash loop would never hit the start limit: {} restarts {} apart take at least {}, not less than the {} interval",
                        restart.start_limit_burst.value,
                        restart.delay.value,
                        crate::inventory::units::TimeSpan::from_millis(loop_time),
                        restart.start_limit_interval.value
                    ),
                    "lengthen start_limit_interval or shorten delay, so a crashing server ends `failed` instead of looping while `systemctl is-active` says active",
                );
            }
            let r = &svc.readiness;
            if r.stall_timeout.value >= r.deadline.value {
                self.err(written(&[r.stall_timeout.pos, r.deadline.pos]), "stall_timeout is not shorter than the deadline", "a hang should be called well before giving up, e.g. stall_timeout 5m, deadline 30m");
            }
            if r.poll_interval.value >= r.stall_timeout.value {
                self.err(
                    written(&[r.poll_interval.pos, r.stall_timeout.pos]),
                    "poll_interval is not shorter than stall_timeout",
                    "poll every few seconds, e.g. 2s",
                );
            }
            if let Some(url) = &r.url {
                check_http_url(self, url);
            }
        }
    }
}

fn check_http_url(v: &mut Validator<'_>, url: &Sp<Text>) {
    let s = url.as_str();
    if !(s.starts_with("http://") || s.starts_with("https://")) {
        v.err(
            url.pos,
            format!("`{s}` is not an http(s) URL"),
            "e.g. `http://127.0.0.1:30000/v1/models`",
        );
    }
}
