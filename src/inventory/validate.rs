//! The rules between values, all in one place. Every problem is reported (not just the
//! first), each with `file:line:col`, the offending value and a hint.

use std::collections::{HashMap, HashSet};

use super::container::{Container, GpuSelector, IpConfig};
use super::load::{Loaded, did_you_mean};
use super::node::Node;
use super::spanned::{Pos, Sp};
use super::text::{Name, Text};
use crate::diagnostic::{Diagnostic, Diagnostics};

/// The smallest and largest container IDs Proxmox accepts.
pub const VMID_RANGE: std::ops::RangeInclusive<u64> = 100..=999_999_999;

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

/// Checks everything that parsing alone cannot. `known_roles` are the role names found
/// in the role folders and built in.
pub fn validate(loaded: &Loaded, known_roles: &[String]) -> Result<(), Diagnostics> {
    let mut v = Validator {
        loaded,
        errors: Vec::new(),
    };
    if loaded.inventory.nodes.is_empty() {
        v.err(
            loaded.top_level_pos("nodes"),
            "the inventory declares no nodes",
            "add a node under `nodes:`; see inventory/llm-two.yaml",
        );
    }
    for (node_name, node) in &loaded.inventory.nodes {
        v.node(node_name, node);
        let mut vmids: HashMap<u64, &Name> = HashMap::new();
        for (ct_name, ct) in &node.containers {
            if let Some(first) = vmids.insert(ct.vmid.value, ct_name) {
                v.err(
                    ct.vmid.pos,
                    format!("vmid {} is used twice on node `{node_name}`", ct.vmid.value),
                    format!("container `{first}` already has it; give `{ct_name}` another vmid"),
                );
            }
            v.container(ct_name, ct, known_roles);
        }
    }
    // vmids are unique in a Proxmox cluster: the nodes naming one cluster share them.
    let mut in_cluster: HashMap<(&str, u64), (&Name, &Name)> = HashMap::new();
    for (node_name, node) in &loaded.inventory.nodes {
        let Some(cluster) = &node.cluster else {
            continue;
        };
        for (ct_name, ct) in &node.containers {
            let key = (cluster.value.as_str(), ct.vmid.value);
            if let Some((other_node, other_ct)) = in_cluster.insert(key, (node_name, ct_name))
                && other_node != node_name
            {
                v.err(
                    ct.vmid.pos,
                    format!(
                        "vmid {} is also container `{other_ct}`'s on node `{other_node}`, in the same cluster `{}`",
                        ct.vmid.value,
                        cluster.value.as_str()
                    ),
                    format!("vmids are unique in a Proxmox cluster; give `{ct_name}` another vmid"),
                );
            }
        }
    }
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(Diagnostics(v.errors))
    }
}

struct Validator<'a> {
    loaded: &'a Loaded,
    errors: Vec<Diagnostic>,
}

impl Validator<'_> {
    fn err(&mut self, pos: Pos, message: impl Into<String>, hint: impl Into<String>) {
        let d = self.loaded.diag(pos, message).hint(hint);
        self.errors.push(d);
    }

    fn node(&mut self, name: &Name, node: &Node) {
        let url = node.api.url.literal().unwrap_or("https://from-env");
        let rest = url.strip_prefix("https://");
        match rest {
            None => self.err(
                node.api.url.pos,
                format!("the API URL `{url}` is not https"),
                "Proxmox serves its API over HTTPS on port 8006, e.g. `https://10.1.2.6:8006`",
            ),
            Some(r) if r.is_empty() || r.starts_with('/') => self.err(
                node.api.url.pos,
                format!("the API URL `{url}` names no host"),
                "write e.g. `https://10.1.2.6:8006`",
            ),
            Some(_) => {}
        }
        let tls = &node.api.tls;
        match (&tls.fingerprint, &tls.ca_file) {
            (Some(_), Some(ca)) => self.err(
                ca.pos,
                format!("node `{name}` names both a fingerprint and a CA file"),
                "keep one way to trust the node's certificate",
            ),
            (None, None) => self.err(
                node.api.url.pos,
                format!("node `{name}` says nothing about trusting its TLS certificate"),
                "add `tls: { fingerprint: \"AB:CD:...\" }` (from `pvenode cert info` on the node) or `tls: { ca_file: pve-root-ca.pem }`",
            ),
            (Some(fp), None) => {
                let hex: String = fp
                    .literal()
                    .unwrap_or(&"0".repeat(64))
                    .chars()
                    .filter(|c| *c != ':')
                    .collect();
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        fp.pos,
                        "the TLS fingerprint is not a SHA-256 fingerprint",
                        "write the 32 bytes as hex, with or without colons, as `pvenode cert info` prints them",
                    );
                }
            }
            (None, Some(_)) => {}
        }
        if node.api.token.is_none() && node.api.password.is_none() {
            self.err(
                node.api.url.pos,
                format!("node `{name}` gives no API credentials"),
                "add `token: { env: PVE_TOKEN }`, or `password: { env: PVE_ROOT_PASSWORD }` for root@pam",
            );
        }
        for (pos, message, hint) in super::host::problems(
            node.model_storage.as_ref(),
            &node.templates,
            node.nvidia.as_ref(),
        ) {
            self.err(pos, message, hint);
        }
        // The model storage and the NVIDIA side are read and changed on the node itself.
        if node.ssh.host.is_none() && (node.model_storage.is_some() || node.nvidia.is_some()) {
            self.err(
                node.api.url.pos,
                format!("node `{name}` has no `ssh.host`: its `model_storage` and `nvidia` are read and changed on the node over SSH"),
                "add `ssh: { host: ..., identity_file: ... }` (root) to the node",
            );
        }
        // Without node SSH, containers are still created and changed through the API
        // (their guests must answer SSH themselves); GPU passthrough lines are root-only
        // and raw `lxc.*` lines cannot go through the API at all.
        let with_gpus: Vec<&str> = node
            .containers
            .iter()
            .filter(|(_, ct)| ct.gpus.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        if node.ssh.host.is_none() && !with_gpus.is_empty() {
            self.err(
                node.api.url.pos,
                format!(
                    "node `{name}` has no `ssh.host`: the GPU passthrough lines of container(s) {} are root-only steps (devN, raw lxc.* lines) that cannot run without it",
                    with_gpus.join(", ")
                ),
                "add `ssh: { host: ..., identity_file: ... }` (root) to the node: an API token cannot write these lines, and raw lxc.* lines cannot go through the API at all",
            );
        }
    }

    fn container(&mut self, name: &Name, ct: &Container, known_roles: &[String]) {
        if !VMID_RANGE.contains(&ct.vmid.value) {
            self.err(
                ct.vmid.pos,
                format!("vmid {} is out of range", ct.vmid.value),
                "Proxmox container IDs run from 100 to 999999999",
            );
        }
        let template = ct.template.as_str();
        let ok_template = template.split_once(':').is_some_and(|(storage, vol)| {
            !storage.is_empty() && vol.starts_with("vztmpl/") && vol.len() > 7
        });
        if !ok_template {
            self.err(
                ct.template.pos,
                format!("`{template}` is not a template volume ID"),
                "write STORAGE:vztmpl/FILE, e.g. `local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst`",
            );
        }
        if ct.cores.value == 0 {
            self.err(
                ct.cores.pos,
                "a container needs at least one core",
                "set `cores: 1` or more",
            );
        }
        if ct.memory.bytes() < 16 * 1024 * 1024 {
            self.err(
                ct.memory.pos,
                format!("memory {} is too small", ct.memory.value),
                "Proxmox needs at least 16M",
            );
        }
        let size = ct.rootfs.size.value;
        if size.bytes() == 0 || !size.bytes().is_multiple_of(1024 * 1024 * 1024) {
            self.err(
                ct.rootfs.size.pos,
                format!(
                    "root filesystem size {} is not a whole number of GiB",
                    ct.rootfs.size.value
                ),
                "Proxmox allocates container disks in GiB, e.g. `200G`",
            );
        }
        self.network(name, ct);
        self.mounts(ct);
        self.gpus(ct);
        self.roles(ct, known_roles);
        self.software(ct);
        self.services(name, ct);
    }

    fn network(&mut self, name: &Name, ct: &Container) {
        let mut names = HashSet::new();
        for nic in &ct.network {
            if !names.insert(nic.name.as_str()) {
                self.err(
                    nic.name.pos,
                    format!("interface `{}` is declared twice", nic.name.value),
                    "give each interface its own name",
                );
            }
            if let (IpConfig::Static(addr, prefix), Some(gw)) = (nic.ip.value, &nic.gateway) {
                let mask = if prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - prefix)
                };
                if u32::from(addr) & mask != u32::from(gw.0) & mask {
                    self.err(
                        gw.pos,
                        format!("gateway {} is outside {}", gw.value, nic.ip.value),
                        "the gateway must be on the interface's subnet",
                    );
                }
            }
        }
        if ct.ssh.host.is_none() {
            let has_static = ct
                .network
                .first()
                .is_some_and(|n| matches!(n.ip.value, IpConfig::Static(..)));
            if !has_static {
                self.err(
                    ct.vmid.pos,
                    format!("container `{name}` has no address to reach it by SSH"),
                    "give its first interface a static `ip:` or set `ssh: { host: ... }`",
                );
            }
        }
    }

    fn mounts(&mut self, ct: &Container) {
        let mut paths = HashSet::new();
        for m in &ct.mounts {
            if m.path.as_str() == "/" {
                self.err(
                    m.path.pos,
                    "a mount cannot cover the container's root",
                    "mount it below /, e.g. `/shared`",
                );
            }
            if !paths.insert(m.path.as_str()) {
                self.err(
                    m.path.pos,
                    format!("`{}` is mounted twice", m.path.value),
                    "keep one mount per container path",
                );
            }
        }
    }

    fn gpus(&mut self, ct: &Container) {
        let Some(gpus) = &ct.gpus else { return };
        if gpus.devices.is_empty() {
            self.err(
                gpus.method.pos,
                "`gpus.devices` is empty",
                "list the GPUs by index or UUID, or remove `gpus:`",
            );
        }
        let mut seen = HashSet::new();
        for d in &gpus.devices {
            if !seen.insert(&d.value) {
                self.err(
                    d.pos,
                    format!("GPU `{}` is listed twice", d.value),
                    "list each GPU once",
                );
            }
        }
        let by_index = gpus
            .devices
            .iter()
            .any(|d| matches!(d.value, GpuSelector::Index(_)));
        let by_uuid = gpus
            .devices
            .iter()
            .any(|d| matches!(d.value, GpuSelector::Uuid(_)));
        if by_index && by_uuid {
            self.err(
                gpus.devices[0].pos,
                "GPUs are selected both by index and by UUID",
                "use one kind; UUIDs stay stable when cards are added or moved",
            );
        }
    }

    fn roles(&mut self, ct: &Container, known_roles: &[String]) {
        let mut seen = HashSet::new();
        for role in &ct.roles {
            if !seen.insert(role.as_str()) {
                self.err(
                    role.pos,
                    format!("role `{}` is listed twice", role.value),
                    "list each role once",
                );
            }
            if !known_roles.iter().any(|r| r == role.as_str()) {
                let hint = match did_you_mean(role.as_str(), known_roles) {
                    Some(best) => format!("did you mean `{best}`?"),
                    None => format!("known roles: {}", known_roles.join(", ")),
                };
                self.err(role.pos, format!("unknown role `{}`", role.value), hint);
            }
            let needs: &[(&str, bool, &str)] = &[
                ("cuda", ct.cuda.is_some(), "cuda"),
                ("ml-env", ct.ml_env.is_some(), "ml_env"),
                ("gpu-passthrough", ct.gpus.is_some(), "gpus"),
                ("model-store", !ct.models.is_empty(), "models"),
                ("sglang", !ct.services.is_empty(), "services"),
            ];
            for (r, present, section) in needs {
                if role.as_str() == *r && !present {
                    self.err(
                        role.pos,
                        format!("role `{r}` needs a `{section}:` section"),
                        format!("add `{section}:` to this container or drop the role"),
                    );
                }
            }
        }
    }

    fn software(&mut self, ct: &Container) {
        for p in &ct.packages {
            let (name, version) = match p.as_str().split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (p.as_str(), None),
            };
            let name_ok = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && name.len() > 1
                && name.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.')
                });
            let version_ok = version.is_none_or(|v| {
                !v.is_empty()
                    && v.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~' | ':' | '-')
                    })
            });
            if !name_ok || !version_ok {
                self.err(
                    p.pos,
                    format!("`{}` is not a Debian package", p.value),
                    "write `name` or `name=version`, e.g. `htop` or `git=1:2.39.5-0+deb12u2`",
                );
            }
        }
        let mut source_names = HashSet::new();
        for s in &ct.apt_sources {
            if !source_names.insert(s.name.as_str()) {
                self.err(
                    s.name.pos,
                    format!("APT source `{}` is declared twice", s.name.value),
                    "give each source its own name",
                );
            }
            let line = s.line.as_str();
            if !(line.starts_with("deb ") || line.starts_with("deb-src ")) {
                self.err(
                    s.line.pos,
                    format!("`{line}` is not a one-line APT source"),
                    "write `deb [options] URI SUITE [COMPONENT...]`",
                );
            }
        }
        if let Some(env) = &ct.ml_env {
            if let Some(src) = &env.sglang {
                let rev = src.revision.as_str();
                if rev.len() != 40 || !rev.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        src.revision.pos,
                        format!("`{rev}` is not a pinned commit"),
                        "write the full 40-hex commit (`git rev-parse HEAD`), so every rebuild gets the same code",
                    );
                }
                if src.path.starts_with(&env.path) {
                    self.err(
                        src.path.pos,
                        "the SGLang checkout is inside the venv",
                        "keep the checkout beside the venv, e.g. `/root/sglang-main`",
                    );
                }
            }
            let mut seen = HashMap::new();
            for p in &env.packages {
                if let Some(first) = seen.insert(p.normalized_name(), p) {
                    self.err(
                        p.pos,
                        format!("`{}` is pinned twice (also `{}`)", p.value, first.value),
                        "keep one pin per package",
                    );
                }
            }
            if let Some(idx) = &env.index
                && let (Some(url), Some(_)) = (&idx.url, &idx.wheelhouse)
            {
                self.err(
                    url.pos,
                    "both an index URL and a wheelhouse are set",
                    "a wheelhouse means no index (air-gapped): keep one",
                );
            }
        }
        for (name, model) in &ct.models {
            let repo = model.repo.as_str();
            let ok = repo.split_once('/').is_some_and(|(org, n)| {
                let part = |s: &str| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                };
                part(org) && part(n)
            });
            if !ok {
                self.err(
                    model.repo.pos,
                    format!("`{repo}` is not a Hugging Face repository"),
                    "write ORG/NAME, e.g. `Qwen/Qwen3.5-122B-A10B`",
                );
            }
            for g in model.include.iter().chain(&model.exclude) {
                if let Err(e) = globset::Glob::new(g.as_str()) {
                    self.err(
                        g.pos,
                        format!("`{}` is not a glob: {}", g.value, e.kind()),
                        "use *, ? and [..], e.g. `*.safetensors`",
                    );
                }
            }
            let under = ct.mounts.iter().any(|m| model.path.starts_with(&m.path));
            if !under {
                let mounts: Vec<&str> = ct.mounts.iter().map(|m| m.path.as_str()).collect();
                let hint = if mounts.is_empty() {
                    "models belong on shared storage that survives the container: add a mount (e.g. a host dataset at `/shared`) and put the model under it".to_string()
                } else {
                    format!(
                        "put it under a mount ({}), so it survives rebuilding the container",
                        mounts.join(", ")
                    )
                };
                self.err(
                    model.path.pos,
                    format!(
                        "model `{name}` at `{}` is outside every mount",
                        model.path.value
                    ),
                    hint,
                );
            }
        }
        let mut paths: HashMap<&str, &Name> = HashMap::new();
        for (name, model) in &ct.models {
            if let Some(other) = paths.insert(model.path.as_str(), name) {
                self.err(
                    model.path.pos,
                    format!(
                        "models `{other}` and `{name}` share the path `{}`",
                        model.path.value
                    ),
                    "give each model its own folder",
                );
            }
        }
    }

    fn directives(&mut self, service: &Name, d: &super::service::UnitDirectives) {
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
            if super::service::MANAGED_DIRECTIVES.contains(&name.as_str()) {
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

    fn services(&mut self, ct_name: &Name, ct: &Container) {
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
                    let ok = super::service::FALLBACK_DROPPABLE.contains(&w.as_str())
                        || w.as_str()
                            .strip_prefix("environment.")
                            .is_some_and(|n| svc.environment.keys().any(|k| k.as_str() == n));
                    if !ok {
                        let hint = match did_you_mean(
                            w.as_str(),
                            super::service::FALLBACK_DROPPABLE,
                        ) {
                            Some(best) => format!("did you mean `{best}`?"),
                            None => format!(
                                "droppable: {}, or environment.NAME of a variable the service sets",
                                super::service::FALLBACK_DROPPABLE.join(", ")
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
            if restart.policy.value != super::service::RestartPolicy::No
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
                        super::units::TimeSpan::from_millis(loop_time),
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

/// The first of `positions` written in the file: a rule between two values may break by a
/// default on one side, and the error must still point at the value the user wrote (found
/// by fuzzing: `stall_timeout: 0m` against the default `poll_interval`).
fn written(positions: &[Pos]) -> Pos {
    positions
        .iter()
        .copied()
        .find(Pos::is_known)
        .unwrap_or_default()
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

/// The unit a service runs as: its `unit:` or `<service>.service`, always with the suffix.
pub fn unit_name(service: &Name, unit: Option<&Sp<Name>>) -> String {
    let base = unit.map_or(service.as_str(), |u| u.as_str());
    if base.ends_with(".service") {
        base.to_string()
    } else {
        format!("{base}.service")
    }
}
