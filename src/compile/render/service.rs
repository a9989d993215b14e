//! A service of the inventory, built once in Rust from its typed fields: the one
//! [`ServiceSpec`] that the plan, the deploy and the health gate use (argv, environment,
//! user, readiness, preflight), and, derived from it ([`ServiceView::of`]), the
//! [`ServiceView`] a unit template renders the unit file from. The served name and the port
//! are written once, into the argv; the readiness and the view read them from there.
//! Nothing here goes through JSON and back: roles only say that a container gets the
//! service (`kind: service`, `of:`), templates only render file contents.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::sglang;
use crate::health::Readiness;
use crate::inventory::Pos;
use crate::inventory::container::Container;
use crate::inventory::service::{Service, UnitDirectives};
use crate::inventory::text::Name;
use crate::inventory::validate::unit_name;
use crate::resources::service::preflight::Preflight;
use crate::resources::service::{Declared, Fallback, ServiceSpec};

/// How long SGLang's own argument check may take (it imports torch: tens of seconds).
const PREFLIGHT_TIMEOUT_MS: u64 = 180_000;

/// One inventory service, built.
#[derive(Debug, Clone)]
pub struct BuiltService {
    /// Its name under `services:`.
    pub name: String,
    /// The service as it runs; its fallbacks are added by the role that names the unit
    /// template (their unit files are file contents).
    pub spec: ServiceSpec,
    /// What the unit template sees as `service`, fallbacks included.
    pub view: ServiceView,
    /// Each fallback: its own service (argv, environment) and view.
    pub fallbacks: Vec<(String, ServiceSpec, ServiceView)>,
}

impl BuiltService {
    /// The service with its fallbacks' unit files rendered by `render` (a view in, the
    /// unit file out).
    pub fn with_fallbacks<E>(
        &self,
        mut render: impl FnMut(&ServiceView) -> Result<String, E>,
    ) -> Result<ServiceSpec, E> {
        let mut spec = self.spec.clone();
        for (name, fb, view) in &self.fallbacks {
            spec.fallbacks.push(Fallback {
                name: name.clone(),
                content: render(view)?,
                exec_start: fb.exec_start.clone(),
                environment: fb.environment.clone(),
            });
        }
        Ok(spec)
    }
}

/// A `NAME=value` pair of the unit's environment.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVar {
    /// The variable.
    pub name: String,
    /// Its value, unquoted.
    pub value: String,
}

/// A line of the unit's `[Service]` section from the inventory's `systemd:` settings.
#[derive(Debug, Clone, Serialize)]
pub struct Directive {
    /// The directive.
    pub name: String,
    /// Its value as the unit file takes it.
    pub value: String,
}

/// `Restart=` and its limits, as systemd spells them.
#[derive(Debug, Clone, Serialize)]
pub struct RestartView {
    /// `Restart=`.
    pub policy: &'static str,
    /// `RestartSec=`.
    pub delay: String,
    /// `StartLimitBurst=`.
    pub start_limit_burst: u32,
    /// `StartLimitIntervalSec=`.
    pub start_limit_interval: String,
    /// `TimeoutStartSec=`.
    pub timeout_start: String,
    /// `TimeoutStopSec=`.
    pub timeout_stop: String,
}

/// The model a service serves, when it is one of the container's `models:`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRef {
    /// `org/name`.
    pub repo: String,
    /// Its folder.
    pub path: String,
}

/// What a unit template sees as `service` (docs/roles.md lists it): the service's
/// description plus what only the unit file needs (the argv by line, the restart policy,
/// extra directives).
#[derive(Debug, Clone, Serialize)]
pub struct ServiceView {
    /// Its name under `services:`.
    pub name: String,
    /// The unit's name.
    pub unit: String,
    /// The unit's file.
    pub unit_path: String,
    /// `Description=`.
    pub description: String,
    /// `User=`.
    pub user: String,
    /// `WorkingDirectory=`.
    pub working_directory: String,
    /// `Environment=` lines.
    pub environment: Vec<EnvVar>,
    /// The argv, one flag (with its value) per group.
    pub argv: Vec<Vec<String>>,
    /// The same words, flat.
    pub exec_start: Vec<String>,
    /// The environment as `NAME=value`.
    pub environment_assignments: Vec<String>,
    /// `--served-model-name`.
    pub served_model_name: String,
    /// `--port`.
    pub port: u16,
    /// `--tp-size`.
    pub tp: u32,
    /// What the service runs on (`kind:name`), as the shipped roles declare it.
    pub depends_on: Vec<String>,
    /// systemd's restart policy.
    pub restart: RestartView,
    /// The health gate.
    pub readiness: Option<Readiness>,
    /// The preflight's settings.
    pub preflight: Option<Preflight>,
    /// The model, when it is one of the container's `models:`.
    pub model: Option<ModelRef>,
    /// Extra `[Service]` lines.
    pub directives: Vec<Directive>,
    /// The fallbacks' views.
    pub fallbacks: Vec<ServiceView>,
    /// The fallback's name, in a fallback's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_name: Option<String>,
}

/// What only the unit file says (not part of what runs): its description, systemd's
/// restart policy, the model it names, extra directives.
struct UnitOnly {
    description: String,
    restart: RestartView,
    model: Option<ModelRef>,
    directives: Vec<Directive>,
}

impl ServiceView {
    /// The view of `spec`'s unit file: everything that runs is read from the spec (the argv
    /// `groups` are its `exec_start` by line, `environment` its assignments by name), so
    /// the unit text and the spec the plan, deploy and gate use cannot say two things.
    fn of(
        name: &str,
        spec: &ServiceSpec,
        environment: Vec<EnvVar>,
        groups: Vec<Vec<String>>,
        unit: UnitOnly,
    ) -> ServiceView {
        ServiceView {
            name: name.to_string(),
            unit: spec.unit.clone(),
            unit_path: spec.unit_path.clone(),
            description: unit.description,
            user: spec.user.clone(),
            working_directory: spec.working_directory.clone(),
            environment,
            argv: groups,
            exec_start: spec.exec_start.clone(),
            environment_assignments: spec.environment.clone(),
            served_model_name: flag_value(&spec.exec_start, "--served-model-name").to_string(),
            port: flag_value(&spec.exec_start, "--port")
                .parse()
                .unwrap_or_default(),
            tp: flag_value(&spec.exec_start, "--tp-size")
                .parse()
                .unwrap_or_default(),
            depends_on: spec.depends_on.clone(),
            restart: unit.restart,
            readiness: spec.readiness.clone(),
            preflight: spec.preflight.clone(),
            model: unit.model,
            directives: unit.directives,
            fallbacks: Vec::new(),
            fallback_name: None,
        }
    }
}

/// The value after `flag` in `argv` (`--port` → `30000`); empty when it is not there.
fn flag_value<'a>(argv: &'a [String], flag: &str) -> &'a str {
    argv.iter()
        .position(|w| w == flag)
        .and_then(|i| argv.get(i + 1))
        .map_or("", String::as_str)
}

/// Every service of container `ct`, declared in `file`.
pub fn build_all(ct: &Container, file: &Path) -> Vec<BuiltService> {
    ct.services
        .iter()
        .map(|(name, svc)| {
            let (spec, mut view) = build(name, svc, ct, file);
            let fallbacks: Vec<(String, ServiceSpec, ServiceView)> = svc
                .fallback
                .iter()
                .map(|f| {
                    let (fb, mut fb_view) = build(name, &svc.with_fallback(f), ct, file);
                    fb_view.fallback_name = Some(f.name.to_string());
                    (f.name.to_string(), fb, fb_view)
                })
                .collect();
            view.fallbacks = fallbacks.iter().map(|(_, _, v)| v.clone()).collect();
            BuiltService {
                name: name.to_string(),
                spec,
                view,
                fallbacks,
            }
        })
        .collect()
}

/// One service: the spec and the view of its unit file.
fn build(name: &Name, svc: &Service, ct: &Container, file: &Path) -> (ServiceSpec, ServiceView) {
    let unit = unit_name(name, svc.unit.as_ref());
    let unit_path = format!("/etc/systemd/system/{unit}");
    let model = svc.model.as_ref().and_then(|m| ct.models.get(m.as_str()));
    let (model_path, model_pos) = match (&svc.model_path, &svc.model) {
        (Some(p), _) => (p.to_string(), p.pos),
        (None, Some(m)) => (model.map(|m| m.path.to_string()).unwrap_or_default(), m.pos),
        (None, None) => (String::new(), svc.served_model_name.pos),
    };
    let python = ct.ml_env.as_ref().map_or("python3".to_string(), |e| {
        e.bin().join("python3").to_string()
    });
    let (environment, env_positions) = environment(svc, ct);
    let working_directory = svc
        .working_directory
        .as_ref()
        .map(|w| w.to_string())
        .or_else(|| {
            ct.ml_env
                .as_ref()
                .and_then(|e| e.sglang.as_ref().map(|s| s.path.to_string()))
        })
        .or_else(|| ct.ml_env.as_ref().map(|e| e.path.to_string()))
        .unwrap_or_else(|| "/".to_string());
    let argv = sglang::argv(svc, &python, &model_path, model_pos);
    let preflight = ct.ml_env.as_ref().map(|env| Preflight {
        venv: crate::generations::paths(env).venv,
        links: crate::generations::paths(env).links,
        model_path: model_path.clone(),
        tp: svc.tp.value,
        timeout_ms: PREFLIGHT_TIMEOUT_MS,
        gpus: ct.gpus.is_some(),
    });
    let mut settings = argv.positions.clone();
    settings.extend(env_positions);
    let mut spec = ServiceSpec {
        unit: unit.clone(),
        unit_path: unit_path.clone(),
        exec_start: argv.flat(),
        environment: environment
            .iter()
            .map(|e| format!("{}={}", e.name, e.value))
            .collect(),
        user: svc.user.to_string(),
        working_directory,
        enabled: true,
        depends_on: runs_on(&unit_path, svc, ct, &model_path),
        readiness: None,
        preflight,
        fallbacks: Vec::new(),
        declared: Declared {
            file: file.to_path_buf(),
            service: svc.served_model_name.pos,
            settings,
        },
    };
    // The argv is the one place the served name and the port are written: the gate asks
    // for what the server was started with.
    let served = flag_value(&spec.exec_start, "--served-model-name").to_string();
    let port = flag_value(&spec.exec_start, "--port").to_string();
    spec.readiness = Some(Readiness {
        url: svc.readiness.url.as_ref().map_or_else(
            || format!("http://127.0.0.1:{port}/v1/models"),
            |u| u.to_string(),
        ),
        served_model_name: served.clone(),
        deadline_ms: svc.readiness.deadline.millis(),
        stall_timeout_ms: svc.readiness.stall_timeout.millis(),
        poll_interval_ms: svc.readiness.poll_interval.millis(),
    });
    let unit_only = UnitOnly {
        description: svc.description.as_ref().map_or_else(
            || {
                format!(
                    "SGLang serving {served} ({})",
                    model.map_or(model_path.clone(), |m| m.repo.to_string())
                )
            },
            |d| d.to_string(),
        ),
        restart: RestartView {
            policy: svc.restart.policy.as_str(),
            delay: svc.restart.delay.systemd(),
            start_limit_burst: svc.restart.start_limit_burst.value,
            start_limit_interval: svc.restart.start_limit_interval.systemd(),
            timeout_start: svc.restart.timeout_start.systemd(),
            timeout_stop: svc.restart.timeout_stop.systemd(),
        },
        model: model.map(|m| ModelRef {
            repo: m.repo.to_string(),
            path: m.path.to_string(),
        }),
        directives: directive_lines(&svc.systemd)
            .into_iter()
            .map(|(name, value)| Directive { name, value })
            .collect(),
    };
    let view = ServiceView::of(name.as_str(), &spec, environment, argv.groups, unit_only);
    (spec, view)
}

/// The unit's environment: CUDA and the venv on the paths, then the inventory's own
/// variables (with where each was set). No `LD_LIBRARY_PATH`: the dynamic loader searches
/// it before a library's RUNPATH, so the toolkit's `lib64` would replace the CUDA libraries
/// torch's wheels ship and find through their RUNPATH (`nvidia/*/lib`), which torch was
/// built against; `nvcc` (FlashInfer's JIT) needs only `CUDA_HOME` and `PATH`.
fn environment(svc: &Service, ct: &Container) -> (Vec<EnvVar>, BTreeMap<String, Pos>) {
    let var = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value,
    };
    let mut vars = Vec::new();
    let mut path_dirs: Vec<String> = Vec::new();
    if let Some(env) = &ct.ml_env {
        path_dirs.push(env.bin().to_string());
    }
    if let Some(c) = &ct.cuda {
        vars.push(var("CUDA_HOME", c.home().to_string()));
        path_dirs.push(c.home().join("bin").to_string());
    }
    path_dirs.push("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string());
    vars.push(var("PATH", path_dirs.join(":")));
    let mut positions = BTreeMap::new();
    for (k, v) in &svc.environment {
        vars.push(var(k.as_str(), v.to_string()));
        positions.insert(k.to_string(), v.pos);
    }
    (vars, positions)
}

/// What the service runs on, as `kind:name` addresses: a change of any of them means a
/// restart. Those no role of the container declares are dropped once the roles are
/// expanded (`compile::desired`), so no role is named here.
fn runs_on(unit_path: &str, svc: &Service, ct: &Container, model_path: &str) -> Vec<String> {
    let mut deps = vec![format!("file:{unit_path}")];
    if svc.model.is_some() {
        deps.push(format!("model:{model_path}"));
    }
    if let Some(env) = &ct.ml_env {
        // Built at the generation's folders; what the unit runs switches with the
        // generation (`generation:` the venv's stable path).
        let g = crate::generations::paths(env);
        deps.push(format!("venv:{}", g.venv));
        deps.push(format!("generation:{}", env.path));
        if !env.packages.is_empty() {
            deps.push(format!("pip_packages:{}", g.venv));
        }
        if let (Some(s), Some(checkout)) = (&env.sglang, &g.checkout) {
            deps.push(format!("git_checkout:{checkout}"));
            deps.push(format!("pip_editable:{checkout}/{}", s.subdirectory));
        }
    }
    if let Some(c) = &ct.cuda {
        deps.push(format!("cuda_toolkit:{}", c.home()));
    }
    deps
}

/// A service's extra directives as `(name, value)` lines, values as the unit file takes them
/// (`ExecStartPre=` quoted word by word).
fn directive_lines(d: &UnitDirectives) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut put = |name: &str, value: String| out.push((name.to_string(), value));
    if let Some(v) = &d.limit_nofile {
        put("LimitNOFILE", v.to_string());
    }
    if let Some(v) = &d.limit_memlock {
        put("LimitMEMLOCK", v.to_string());
    }
    if let Some(v) = &d.nice {
        put("Nice", v.value.to_string());
    }
    if let Some(v) = &d.oom_score_adjust {
        put("OOMScoreAdjust", v.value.to_string());
    }
    if !d.cpu_affinity.is_empty() {
        let cpus: Vec<String> = d.cpu_affinity.iter().map(|c| c.to_string()).collect();
        put("CPUAffinity", cpus.join(" "));
    }
    for argv in &d.exec_start_pre {
        let words: Vec<String> = argv
            .iter()
            .map(|w| super::systemd::quote_exec_word(w.as_str()))
            .collect();
        put("ExecStartPre", words.join(" "));
    }
    for (name, value) in &d.extra {
        put(name.as_str(), value.to_string());
    }
    // `%` starts a specifier in every directive; the Exec lines are escaped word by word.
    for (name, value) in &mut out {
        if name != "ExecStartPre" {
            *value = value.replace('%', "%%");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const LLM_TWO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/inventory/llm-two.yaml");

    /// The services of llm-two's one container, built.
    fn llm_two_services() -> Vec<BuiltService> {
        let loaded = crate::inventory::load(Path::new(LLM_TWO)).unwrap();
        let (_, node) = loaded.inventory.nodes.iter().next().unwrap();
        let (_, ct) = node.containers.iter().next().unwrap();
        build_all(ct, Path::new(LLM_TWO))
    }

    /// llm-two's service, built: the argv and environment carry where the inventory set
    /// them, so findings after rendering name the line to change.
    #[test]
    fn positions_travel_with_the_built_service() {
        let path = Path::new(LLM_TWO);
        let built = llm_two_services();
        let text = std::fs::read_to_string(path).unwrap();
        let at = |needle: &str| {
            let (n, line) = text
                .lines()
                .enumerate()
                .find(|(_, l)| l.trim_start().starts_with(needle))
                .unwrap();
            let col = line.find(':').unwrap() + 3;
            format!("{}:{}:{col}", path.display(), n + 1)
        };
        let spec = &built[0].spec;
        assert_eq!(
            spec.declared.at("--mamba-scheduler-strategy"),
            Some(at("mamba_scheduler_strategy:"))
        );
        assert_eq!(
            spec.declared.at("SGLANG_ENABLE_SPEC_V2"),
            Some(at("SGLANG_ENABLE_SPEC_V2:"))
        );
        assert_eq!(
            spec.declared.at("--nothing"),
            Some(at("served_model_name:"))
        );
        // CUDA for nvcc, and nothing that outranks the RUNPATH of torch's own libraries.
        let env: Vec<&str> = spec
            .environment
            .iter()
            .filter_map(|e| e.split_once('=').map(|(n, _)| n))
            .collect();
        assert_eq!(env, ["CUDA_HOME", "PATH", "SGLANG_ENABLE_SPEC_V2"]);
        // The gate asks for the name and the port the server is started with.
        let readiness = spec.readiness.as_ref().unwrap();
        assert_eq!(readiness.served_model_name, "qwen3.5-122b");
        assert_eq!(readiness.url, "http://127.0.0.1:30000/v1/models");
        assert_eq!(readiness.port(), Some(30000));
        // The fallback drops the two settings and keeps everything else.
        let (name, fb, _) = &built[0].fallbacks[0];
        assert_eq!(name, "without MTP");
        assert!(
            !fb.exec_start
                .iter()
                .any(|w| w == "--mamba-scheduler-strategy")
        );
        assert!(
            !fb.environment
                .iter()
                .any(|e| e.starts_with("SGLANG_ENABLE_SPEC_V2="))
        );
        assert_eq!(fb.unit_path, spec.unit_path);
    }

    /// The words and assignments a unit file's `ExecStart=` (with its `\` continuations)
    /// and `Environment=` lines give systemd, unquoted as systemd unquotes them.
    fn unit_argv_and_environment(unit: &str) -> (Vec<String>, Vec<String>) {
        let unescape = |w: String| w.replace("%%", "%");
        let mut lines = unit.lines();
        let mut argv = Vec::new();
        let mut env = Vec::new();
        while let Some(line) = lines.next() {
            if let Some(first) = line.strip_prefix("ExecStart=") {
                let mut text = first.to_string();
                while let Some(head) = text.strip_suffix('\\') {
                    text = format!("{head} {}", lines.next().unwrap_or_default());
                }
                argv = crate::resources::service::systemd::split_shown(&text)
                    .into_iter()
                    .map(|w| unescape(w.replace("$$", "$")))
                    .collect();
            } else if let Some(a) = line.strip_prefix("Environment=") {
                env.extend(
                    crate::resources::service::systemd::split_shown(a)
                        .into_iter()
                        .map(unescape),
                );
            }
        }
        (argv, env)
    }

    /// The unit text is rendered from the spec: the built-in template, given llm-two's
    /// service and its fallback, makes systemd run exactly the spec's argv with exactly
    /// its environment (what the deploy otherwise finds out only on the target).
    #[test]
    fn the_unit_file_runs_what_the_spec_says() {
        let built = llm_two_services();
        let renderer = crate::compile::render::Renderer::new(None).unwrap();
        let unit = |view: &ServiceView| {
            let ctx = serde_json::json!({ "service": view, "cuda": true });
            renderer.render("sglang.service.hbs", &ctx).unwrap()
        };
        let b = &built[0];
        assert_eq!(
            unit_argv_and_environment(&unit(&b.view)),
            (b.spec.exec_start.clone(), b.spec.environment.clone())
        );
        let (_, fb, fb_view) = &b.fallbacks[0];
        assert_eq!(
            unit_argv_and_environment(&unit(fb_view)),
            (fb.exec_start.clone(), fb.environment.clone())
        );
        assert!(b.spec.exec_start.len() > fb.exec_start.len());
    }
}
