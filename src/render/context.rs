//! The values templates and roles see for one container: the inventory's declarations plus
//! what follows from them (the venv's `bin`, the unit's argv and environment, device paths).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::sglang;
use crate::inventory::container::{Container, GpuMethod, GpuSelector, IpConfig};
use crate::inventory::node::Node;
use crate::inventory::secret::{SecretRef, resolve_local};
use crate::inventory::service::{Service, UnitDirectives};
use crate::inventory::text::Name;
use crate::inventory::validate::unit_name;

/// The Hugging Face Hub, when a model names no endpoint.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// What the node says about its GPUs, when it has been read (not in an offline plan).
#[derive(Debug, Clone, Default)]
pub struct NodeGpuView {
    /// Major number of `nvidia` (the GPU and control nodes) from `/proc/devices`; 195 on
    /// every driver so far, but read like the others rather than trusted.
    pub nvidia_major: Option<u32>,
    /// Major number of `nvidia-uvm` from `/proc/devices` (dynamic, unlike nvidia's 195).
    pub nvidia_uvm_major: Option<u32>,
    /// Device minor (`/dev/nvidiaN`) by GPU UUID.
    pub minor_by_uuid: BTreeMap<String, u32>,
    /// Device minor by `nvidia-smi` index.
    pub minor_by_index: BTreeMap<u32, u32>,
    /// The `/dev/nvidia*` nodes that exist on the node; empty when not read. The shared
    /// nodes (`nvidiactl`, `nvidia-uvm`, …) are passed only where they exist: Proxmox
    /// refuses to start a container whose `devN` names a missing node.
    pub device_nodes: Vec<String>,
}

/// The major the NVIDIA driver registers its GPU and control nodes under; offline plans
/// assume it (and say so), read plans take the node's `/proc/devices`.
pub const NVIDIA_MAJOR: u32 = 195;

/// Placeholder for a value only the node can tell.
fn unknown(what: &str) -> String {
    format!("<{what}: read from the node>")
}

/// The address to reach a container by SSH: `ssh.host`, else its first static address.
pub fn guest_host(ct: &Container) -> Option<String> {
    if let Some(h) = &ct.ssh.host {
        return Some(h.to_string());
    }
    ct.network.first().and_then(|n| match n.ip.value {
        IpConfig::Static(addr, _) => Some(addr.to_string()),
        IpConfig::Dhcp => None,
    })
}

/// The template/role context for container `ct_name` on node `node_name`.
pub fn container_context(
    node_name: &Name,
    node: &Node,
    ct_name: &Name,
    ct: &Container,
    gpu_view: Option<&NodeGpuView>,
    base_dir: &Path,
) -> Value {
    let cuda = ct.cuda.as_ref().map(|c| {
        let home = c.home();
        json!({
            "version": c.version.to_string(),
            "home": home.to_string(),
            "bin": home.join("bin").to_string(),
            "lib64": home.join("lib64").to_string(),
            "package": c.package(),
        })
    });
    let ml_env = ct.ml_env.as_ref().map(|env| {
        let index = env.index.as_ref();
        json!({
            "path": env.path.to_string(),
            "bin": env.bin().to_string(),
            "python": env.python.to_string(),
            "interpreter": env.bin().join("python3").to_string(),
            "packages": env.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "index_url": index.and_then(|i| i.url.as_ref()).map(|u| u.to_string()),
            "extra_index_urls": index.map(|i| i.extra_urls.iter().map(|u| u.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
            "wheelhouse": index.and_then(|i| i.wheelhouse.as_ref()).map(|w| w.to_string()),
            "sglang": env.sglang.as_ref().map(|s| json!({
                "repo": s.repo.to_string(),
                "revision": s.revision.to_string(),
                "path": s.path.to_string(),
                "source": s.path.join(s.subdirectory.as_str()).to_string(),
                "extras": s.extras.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            })),
        })
    });
    let models: Vec<Value> = ct
        .models
        .iter()
        .map(|(name, m)| {
            let parent = m
                .path
                .as_str()
                .rsplit_once('/')
                .map(|(p, _)| if p.is_empty() { "/" } else { p })
                .unwrap_or("/");
            json!({
                "name": name.to_string(),
                "repo": m.repo.to_string(),
                "revision": m.revision.to_string(),
                "include": m.include.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                "exclude": m.exclude.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                "path": m.path.to_string(),
                "parent": parent,
                "endpoint": m.endpoint.as_ref().map_or(DEFAULT_HF_ENDPOINT.to_string(), |e| e.to_string()),
                // File references are made absolute here: the token is read at apply time.
                "token": m.token.as_ref().map(|t| match &t.value {
                    SecretRef::File(p) => json!({"file": resolve_local(p, base_dir).display().to_string()}),
                    other => json!(other),
                }),
            })
        })
        .collect();
    let services: Vec<Value> = ct
        .services
        .iter()
        .map(|(name, svc)| {
            let mut ctx = service_context(name, svc, ct, &cuda, &ml_env);
            ctx["fallbacks"] = svc
                .fallback
                .iter()
                .map(|f| {
                    let mut fb = service_context(name, &svc.with_fallback(f), ct, &cuda, &ml_env);
                    fb["fallback_name"] = json!(f.name.to_string());
                    fb
                })
                .collect();
            ctx
        })
        .collect();
    json!({
        "node": {
            "name": node_name.to_string(),
            "pve_node": node.api.node.to_string(),
            "config_root": node.config_root.to_string(),
        },
        "container": {
            "name": ct_name.to_string(),
            "vmid": ct.vmid.value,
            "hostname": ct.hostname.as_ref().map_or(ct_name.to_string(), |h| h.to_string()),
            "address": guest_host(ct),
            "unprivileged": ct.unprivileged.value,
        },
        "cuda": cuda,
        "ml_env": ml_env,
        "gpus": ct.gpus.as_ref().map(|g| {
            let devices: Vec<GpuSelector> = g.devices.iter().map(|d| d.value.clone()).collect();
            gpus_context(&devices, g.method.value, gpu_view)
        }),
        "models": models,
        "services": services,
    })
}

/// The `gpus` value templates see: the selected GPUs' device nodes and the majors, from the
/// node's facts when `view` has them (the lines `lxc-gpu-passthrough.conf.hbs` renders).
pub fn gpus_context(
    devices: &[GpuSelector],
    method: GpuMethod,
    view: Option<&NodeGpuView>,
) -> Value {
    let mut nodes: Vec<String> = devices
        .iter()
        .map(|d| {
            let minor = match d {
                // Offline, an index is taken as its device minor, which holds on nodes
                // where nvidia-smi's PCI order matches the driver's; the node's facts
                // replace it when read.
                GpuSelector::Index(i) => Some(
                    view.and_then(|v| v.minor_by_index.get(i).copied())
                        .unwrap_or(*i),
                ),
                GpuSelector::Uuid(u) => view.and_then(|v| v.minor_by_uuid.get(u).copied()),
            };
            match minor {
                Some(m) => format!("/dev/nvidia{m}"),
                None => format!("/dev/nvidia{}", unknown(&format!("minor of {d}"))),
            }
        })
        .collect();
    for extra in [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ] {
        let present = view
            .is_none_or(|v| v.device_nodes.is_empty() || v.device_nodes.iter().any(|n| n == extra));
        if present {
            nodes.push(extra.to_string());
        }
    }
    let nvidia = view.and_then(|v| v.nvidia_major).unwrap_or(NVIDIA_MAJOR);
    let uvm = view
        .and_then(|v| v.nvidia_uvm_major)
        .map_or_else(|| unknown("nvidia-uvm major"), |m| m.to_string());
    json!({
        "method": match method { GpuMethod::Dev => "dev", GpuMethod::Lxc => "lxc" },
        "count": devices.len(),
        "selected": devices.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "device_nodes": nodes,
        "majors": { "nvidia": nvidia, "nvidia_uvm": uvm },
    })
}

fn service_context(
    name: &Name,
    svc: &Service,
    ct: &Container,
    cuda: &Option<Value>,
    ml_env: &Option<Value>,
) -> Value {
    let unit = unit_name(name, svc.unit.as_ref());
    let model = svc.model.as_ref().and_then(|m| ct.models.get(m.as_str()));
    let model_path = match (&svc.model_path, model) {
        (Some(p), _) => p.to_string(),
        (None, Some(m)) => m.path.to_string(),
        (None, None) => String::new(),
    };
    let env_path = ct.ml_env.as_ref().map(|e| e.path.to_string());
    let python = ct.ml_env.as_ref().map_or("python3".to_string(), |e| {
        e.bin().join("python3").to_string()
    });
    let mut environment: Vec<Value> = Vec::new();
    let mut path_dirs: Vec<String> = Vec::new();
    if let Some(env) = &ct.ml_env {
        path_dirs.push(env.bin().to_string());
    }
    if let Some(c) = cuda {
        environment.push(json!({"name": "CUDA_HOME", "value": c["home"]}));
        path_dirs.push(c["bin"].as_str().unwrap_or_default().to_string());
    }
    path_dirs.push("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string());
    environment.push(json!({"name": "PATH", "value": path_dirs.join(":")}));
    if let Some(c) = cuda {
        environment.push(json!({"name": "LD_LIBRARY_PATH", "value": c["lib64"]}));
    }
    for (k, v) in &svc.environment {
        environment.push(json!({"name": k.to_string(), "value": v.to_string()}));
    }
    let working_directory = svc
        .working_directory
        .as_ref()
        .map(|w| w.to_string())
        .or_else(|| {
            ct.ml_env
                .as_ref()
                .and_then(|e| e.sglang.as_ref().map(|s| s.path.to_string()))
        })
        .or(env_path.clone())
        .unwrap_or_else(|| "/".to_string());
    let unit_path = format!("/etc/systemd/system/{unit}");
    let argv = sglang::argv(svc, &python, &model_path);
    let environment_assignments: Vec<String> = environment
        .iter()
        .map(|e| {
            format!(
                "{}={}",
                e["name"].as_str().unwrap_or(""),
                e["value"].as_str().unwrap_or("")
            )
        })
        .collect();
    // What the service runs on, as the shipped roles declare it; a restart follows any
    // change of these. Only roles the container lists contribute resources.
    let has_role = |r: &str| ct.roles.iter().any(|x| x.as_str() == r);
    let mut depends_on = vec![format!("file:{unit_path}")];
    if model.is_some() && has_role("model-store") {
        depends_on.push(format!("model:{model_path}"));
    }
    if let Some(env) = ml_env.as_ref().filter(|_| has_role("ml-env")) {
        let p = env["path"].as_str().unwrap_or_default();
        depends_on.push(format!("venv:{p}"));
        if env["packages"].as_array().is_some_and(|a| !a.is_empty()) {
            depends_on.push(format!("pip_packages:{p}"));
        }
        if let Some(s) = env["sglang"].as_object() {
            depends_on.push(format!(
                "git_checkout:{}",
                s["path"].as_str().unwrap_or_default()
            ));
            depends_on.push(format!(
                "pip_editable:{}",
                s["source"].as_str().unwrap_or_default()
            ));
        }
    }
    if let Some(c) = cuda.as_ref().filter(|_| has_role("cuda")) {
        depends_on.push(format!(
            "cuda_toolkit:{}",
            c["home"].as_str().unwrap_or_default()
        ));
    }
    let description = svc.description.as_ref().map_or_else(
        || {
            format!(
                "SGLang serving {} ({})",
                svc.served_model_name.value,
                model.map_or(model_path.clone(), |m| m.repo.to_string())
            )
        },
        |d| d.to_string(),
    );
    let readiness_url = svc.readiness.url.as_ref().map_or_else(
        || format!("http://127.0.0.1:{}/v1/models", svc.port.value),
        |u| u.to_string(),
    );
    json!({
        "name": name.to_string(),
        "unit": unit,
        "unit_path": unit_path,
        "description": description,
        "user": svc.user.to_string(),
        "working_directory": working_directory,
        "environment": environment,
        "argv": argv,
        "exec_start": sglang::flat_argv(&argv),
        "environment_assignments": environment_assignments,
        "served_model_name": svc.served_model_name.to_string(),
        "port": svc.port.value,
        "tp": svc.tp.value,
        "depends_on": depends_on,
        "restart": {
            "policy": svc.restart.policy.as_str(),
            "delay": svc.restart.delay.systemd(),
            "start_limit_burst": svc.restart.start_limit_burst.value,
            "start_limit_interval": svc.restart.start_limit_interval.systemd(),
            "timeout_start": svc.restart.timeout_start.systemd(),
            "timeout_stop": svc.restart.timeout_stop.systemd(),
        },
        "readiness": {
            "url": readiness_url,
            "served_model_name": svc.served_model_name.to_string(),
            "port": svc.port.value,
            "deadline_ms": svc.readiness.deadline.millis(),
            "stall_timeout_ms": svc.readiness.stall_timeout.millis(),
            "poll_interval_ms": svc.readiness.poll_interval.millis(),
        },
        "model": model.map(|m| json!({"repo": m.repo.to_string(), "path": m.path.to_string()})),
        "directives": directive_lines(&svc.systemd)
            .into_iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect::<Vec<_>>(),
        "preflight": ct.ml_env.as_ref().map(|env| json!({
            "unit": unit,
            "python": python,
            "venv": env.path.to_string(),
            // What follows `python -m sglang.launch_server`.
            "args": sglang::flat_argv(&argv).into_iter().skip(3).collect::<Vec<_>>(),
            "environment": environment_assignments,
            "working_directory": working_directory,
            "user": svc.user.to_string(),
            "port": svc.port.value,
            "model_path": model_path,
            "tp": svc.tp.value,
            "timeout_ms": 180_000,
        })),
    })
}

/// A service's extra directives as `(name, value)` lines, values as the unit file takes them
/// (`ExecStartPre=` quoted word by word).
pub fn directive_lines(d: &UnitDirectives) -> Vec<(String, String)> {
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
