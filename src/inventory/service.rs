//! A model server: the SGLang service, its unit's restart policy and its readiness check.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::spanned::Sp;
use super::text::{AbsPath, DirectiveName, EnvName, Host, Name, Text};
use super::units::TimeSpan;

/// A model server run by systemd.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// What serves: only `sglang` for now.
    #[serde(default)]
    pub kind: Sp<ServiceKind>,
    /// The systemd unit; defaults to `<service name>.service`.
    pub unit: Option<Sp<Name>>,
    /// The unit's `Description=`.
    pub description: Option<Sp<Text>>,
    /// The model to serve: a name under the container's `models:`. Leave it out and set
    /// `model_path` for a model provision does not download.
    pub model: Option<Sp<Name>>,
    /// The folder of a model already on the container (not under `models:`), e.g. on a
    /// shared mount managed elsewhere. Exactly one of `model` and `model_path`.
    pub model_path: Option<Sp<AbsPath>>,
    /// The name clients use (`--served-model-name`), listed by `/v1/models`.
    pub served_model_name: Sp<Text>,
    /// Tensor parallel size: how many GPUs one model instance spans (`--tp`).
    #[serde(default = "one")]
    pub tp: Sp<u32>,
    /// Address to listen on (`--host`).
    #[serde(default = "default_host")]
    pub host: Sp<Host>,
    /// Port to listen on (`--port`).
    #[serde(default = "default_port")]
    pub port: Sp<u16>,
    /// Run the model's own code from the hub (`--trust-remote-code`).
    #[serde(default)]
    pub trust_remote_code: Sp<bool>,
    /// Attention kernels (`--attention-backend`), e.g. `triton`.
    pub attention_backend: Option<Sp<Name>>,
    /// KV cache element type (`--kv-cache-dtype`), e.g. `bf16`.
    pub kv_cache_dtype: Option<Sp<Name>>,
    /// Parser for thinking output (`--reasoning-parser`), e.g. `qwen3`.
    pub reasoning_parser: Option<Sp<Name>>,
    /// Parser for tool calls (`--tool-call-parser`), e.g. `qwen3_coder`.
    pub tool_call_parser: Option<Sp<Name>>,
    /// Speculative decoding.
    pub speculative: Option<Speculative>,
    /// How the scheduler buffers state for hybrid (Mamba/GDN) models
    /// (`--mamba-scheduler-strategy`, SGLang 0.5.7 to 0.5.19), e.g. `extra_buffer`.
    pub mamba_scheduler_strategy: Option<Sp<Name>>,
    /// The same setting under its name from SGLang 0.5.14 (`--mamba-radix-cache-strategy`);
    /// the old name is gone from 0.5.20.
    pub mamba_radix_cache_strategy: Option<Sp<Name>>,
    /// Fraction of GPU memory for weights and KV cache (`--mem-fraction-static`).
    pub mem_fraction_static: Option<Sp<f64>>,
    /// More arguments, passed as written after the typed ones.
    #[serde(default)]
    pub extra_args: Vec<Sp<Text>>,
    /// Environment of the server process, e.g. `SGLANG_ENABLE_SPEC_V2: "1"`.
    #[serde(default)]
    pub environment: IndexMap<EnvName, Sp<Text>>,
    /// The user the server runs as.
    #[serde(default = "default_user")]
    pub user: Sp<Name>,
    /// Working directory; defaults to the SGLang checkout, else the venv.
    pub working_directory: Option<Sp<AbsPath>>,
    /// What systemd does when the server exits.
    #[serde(default)]
    pub restart: Restart,
    /// How to tell the service is ready, hung or crashing after a (re)start.
    #[serde(default)]
    pub readiness: Readiness,
    /// Degraded variants tried in order when the service fails its health gate (before
    /// rolling back), e.g. without speculative decoding. Success is reported as degraded.
    #[serde(default)]
    pub fallback: Vec<Fallback>,
    /// More systemd directives for the unit's `[Service]` section.
    #[serde(default)]
    pub systemd: UnitDirectives,
}

/// systemd directives added to the unit (systemd.exec(5), systemd.service(5)). The ones
/// provision writes itself (`ExecStart`, `Environment`, `User`, `Restart` ...) are set by
/// the typed fields above and cannot be given here.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnitDirectives {
    /// `LimitNOFILE=`: how many files the server may open, a number or `infinity`.
    pub limit_nofile: Option<Sp<Text>>,
    /// `LimitMEMLOCK=`: locked memory, bytes with an optional K/M/G suffix, or `infinity`.
    pub limit_memlock: Option<Sp<Text>>,
    /// `Nice=`: scheduling priority, -20 (first) to 19 (last).
    pub nice: Option<Sp<i32>>,
    /// `OOMScoreAdjust=`: -1000 (never killed for memory) to 1000.
    pub oom_score_adjust: Option<Sp<i32>>,
    /// `CPUAffinity=`: the CPUs the server may run on, as CPU numbers and ranges
    /// (`["0-31", "64-95"]`).
    #[serde(default)]
    pub cpu_affinity: Vec<Sp<Text>>,
    /// `ExecStartPre=`: commands run before the server starts, each an argv whose first
    /// word is an absolute path (`["/usr/bin/nvidia-smi", "-pm", "1"]`).
    #[serde(default)]
    pub exec_start_pre: Vec<Vec<Sp<Text>>>,
    /// Any other `[Service]` directive by name, e.g. `TasksMax: "4096"`.
    #[serde(default)]
    pub extra: IndexMap<DirectiveName, Sp<Text>>,
}

/// Directives provision writes itself; `systemd.extra` may not repeat them.
pub const MANAGED_DIRECTIVES: &[&str] = &[
    "Type",
    "User",
    "WorkingDirectory",
    "Environment",
    "ExecStart",
    "ExecStartPre",
    "Restart",
    "RestartSec",
    "TimeoutStartSec",
    "TimeoutStopSec",
    "KillMode",
    "LimitNOFILE",
    "LimitMEMLOCK",
    "Nice",
    "OOMScoreAdjust",
    "CPUAffinity",
    "StartLimitIntervalSec",
    "StartLimitBurst",
];

/// A degraded variant of a service: some typed settings dropped, arguments and
/// environment added.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// What it is, for the report (e.g. `without MTP`).
    pub name: Sp<Text>,
    /// Settings to drop: `speculative`, `mamba_scheduler_strategy`,
    /// `mamba_radix_cache_strategy`, `attention_backend`, `kv_cache_dtype`,
    /// `reasoning_parser`, `tool_call_parser`, `mem_fraction_static`, `extra_args`, or
    /// `environment.NAME`.
    #[serde(default)]
    pub without: Vec<Sp<Text>>,
    /// Arguments to add.
    #[serde(default)]
    pub extra_args: Vec<Sp<Text>>,
    /// Environment to add or change.
    #[serde(default)]
    pub environment: IndexMap<EnvName, Sp<Text>>,
}

/// The settings a fallback may drop.
pub const FALLBACK_DROPPABLE: &[&str] = &[
    "speculative",
    "mamba_scheduler_strategy",
    "mamba_radix_cache_strategy",
    "attention_backend",
    "kv_cache_dtype",
    "reasoning_parser",
    "tool_call_parser",
    "mem_fraction_static",
    "extra_args",
];

impl Service {
    /// This service as fallback `f` makes it.
    pub fn with_fallback(&self, f: &Fallback) -> Service {
        let mut s = self.clone();
        for w in &f.without {
            match w.as_str() {
                "speculative" => s.speculative = None,
                "mamba_scheduler_strategy" => s.mamba_scheduler_strategy = None,
                "mamba_radix_cache_strategy" => s.mamba_radix_cache_strategy = None,
                "attention_backend" => s.attention_backend = None,
                "kv_cache_dtype" => s.kv_cache_dtype = None,
                "reasoning_parser" => s.reasoning_parser = None,
                "tool_call_parser" => s.tool_call_parser = None,
                "mem_fraction_static" => s.mem_fraction_static = None,
                "extra_args" => s.extra_args.clear(),
                other => {
                    if let Some(name) = other.strip_prefix("environment.") {
                        s.environment.retain(|k, _| k.as_str() != name);
                    }
                }
            }
        }
        s.extra_args.extend(f.extra_args.iter().cloned());
        for (k, v) in &f.environment {
            s.environment.insert(k.clone(), v.clone());
        }
        s.fallback.clear();
        s
    }
}

/// Kinds of service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceKind {
    /// `python -m sglang.launch_server`.
    #[default]
    Sglang,
}

fn one() -> Sp<u32> {
    Sp::new(1)
}

fn default_host() -> Sp<Host> {
    Sp::new(Host::parse("127.0.0.1").expect("valid default"))
}

fn default_port() -> Sp<u16> {
    Sp::new(30000)
}

fn default_user() -> Sp<Name> {
    Sp::new(Name::parse("root").expect("valid default"))
}

/// Speculative decoding settings (`--speculative-*`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Speculative {
    /// Algorithm (`--speculative-algorithm`).
    pub algorithm: Sp<SpeculativeAlgorithm>,
    /// Draft steps (`--speculative-num-steps`).
    pub num_steps: Sp<u32>,
    /// Top-k of the draft tree (`--speculative-eagle-topk`).
    pub eagle_topk: Sp<u32>,
    /// Draft tokens verified per step (`--speculative-num-draft-tokens`).
    pub num_draft_tokens: Sp<u32>,
    /// A separate draft model path (`--speculative-draft-model-path`); NEXTN uses the
    /// model's own MTP layers and needs none.
    pub draft_model_path: Option<Sp<AbsPath>>,
}

/// Speculative decoding algorithms SGLang knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum SpeculativeAlgorithm {
    /// The model's own multi-token-prediction layers (Qwen3.5, DeepSeek).
    #[serde(rename = "NEXTN")]
    Nextn,
    /// EAGLE draft heads.
    #[serde(rename = "EAGLE")]
    Eagle,
    /// EAGLE-3 draft heads.
    #[serde(rename = "EAGLE3")]
    Eagle3,
    /// A separate small draft model.
    #[serde(rename = "STANDALONE")]
    Standalone,
    /// N-gram lookup drafting.
    #[serde(rename = "NGRAM")]
    Ngram,
}

impl SpeculativeAlgorithm {
    /// As SGLang spells it on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculativeAlgorithm::Nextn => "NEXTN",
            SpeculativeAlgorithm::Eagle => "EAGLE",
            SpeculativeAlgorithm::Eagle3 => "EAGLE3",
            SpeculativeAlgorithm::Standalone => "STANDALONE",
            SpeculativeAlgorithm::Ngram => "NGRAM",
        }
    }
}

/// systemd's restart policy for the server, bounded so a crash loop ends in `failed`
/// instead of spinning while `systemctl is-active` says `active`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Restart {
    /// `Restart=`.
    #[serde(default)]
    pub policy: Sp<RestartPolicy>,
    /// `RestartSec=`.
    #[serde(default = "default_restart_delay")]
    pub delay: Sp<TimeSpan>,
    /// `StartLimitBurst=`: starts allowed within the interval before the unit fails.
    #[serde(default = "default_burst")]
    pub start_limit_burst: Sp<u32>,
    /// `StartLimitIntervalSec=`.
    #[serde(default = "default_start_limit_interval")]
    pub start_limit_interval: Sp<TimeSpan>,
    /// `TimeoutStartSec=`.
    #[serde(default = "default_timeout_start")]
    pub timeout_start: Sp<TimeSpan>,
    /// `TimeoutStopSec=`: large models take a while to release GPU memory.
    #[serde(default = "default_timeout_stop")]
    pub timeout_stop: Sp<TimeSpan>,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            policy: Sp::default(),
            delay: default_restart_delay(),
            start_limit_burst: default_burst(),
            start_limit_interval: default_start_limit_interval(),
            timeout_start: default_timeout_start(),
            timeout_stop: default_timeout_stop(),
        }
    }
}

fn default_restart_delay() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(10))
}

fn default_burst() -> Sp<u32> {
    Sp::new(3)
}

fn default_start_limit_interval() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(600))
}

fn default_timeout_start() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(120))
}

fn default_timeout_stop() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(120))
}

/// systemd `Restart=` values that make sense for a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Never restart.
    No,
    /// Restart after a crash or a non-zero exit.
    #[default]
    OnFailure,
    /// Restart whenever it exits.
    Always,
}

impl RestartPolicy {
    /// As systemd spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::No => "no",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Always => "always",
        }
    }
}

/// The health gate after a (re)start.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    /// URL that lists the served model when ready; defaults to
    /// `http://127.0.0.1:<port>/v1/models`, checked from inside the container.
    pub url: Option<Sp<Text>>,
    /// Give up on a server that is not ready after this long and no longer makes progress
    /// (one that keeps moving is waited for: the stall timeout calls a hang).
    #[serde(default = "default_deadline")]
    pub deadline: Sp<TimeSpan>,
    /// Call it a hang when the process lives, the port is closed and the log has not
    /// moved for this long.
    #[serde(default = "default_stall")]
    pub stall_timeout: Sp<TimeSpan>,
    /// How often to look.
    #[serde(default = "default_poll")]
    pub poll_interval: Sp<TimeSpan>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            url: None,
            deadline: default_deadline(),
            stall_timeout: default_stall(),
            poll_interval: default_poll(),
        }
    }
}

fn default_deadline() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(1800))
}

fn default_stall() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(300))
}

fn default_poll() -> Sp<TimeSpan> {
    Sp::new(TimeSpan::secs(2))
}
