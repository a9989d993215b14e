//! `provision gpu facts|check|nccl|passthrough`: GPU facts, guest checks, the NCCL preflight
//! and the container lines that pass GPUs through, run on
//! this machine through the local transport (the reconciler runs the same library calls over
//! SSH on the node and in the guest).

use clap::{Args, Subcommand};
use console::Style;

use super::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::gpu::checks::{CudaExpectation, TorchExpectation};
use crate::gpu::nccl::{self, DetectedBy, NcclOptions, NcclOutcome, NcclRun, RankState, Simulate};
use crate::gpu::{self, CheckStatus, FactSources, GuestExpectations, NodeFacts};
use crate::inventory::container::{GpuMethod, GpuSelector};
use crate::inventory::units::{Size, TimeSpan};
use crate::printer::Printer;
use crate::render::Renderer;
use crate::transport::local::LocalTransport;

/// Arguments of `provision gpu`.
#[derive(Debug, Args)]
pub struct GpuArgs {
    #[command(subcommand)]
    command: GpuCommand,
}

#[derive(Debug, Subcommand)]
enum GpuCommand {
    /// Node facts: driver, GPUs with their device nodes, device majors (exit 0 ready for
    /// passthrough, 1 not).
    Facts(FactsArgs),
    /// Guest checks: GPUs, driver, CUDA toolkit, torch (exit 0 ok, 2 drift, 1 error).
    Check(CheckArgs),
    /// NCCL preflight: an all-reduce across the GPUs, one process each, with a deadline (exit
    /// 0 healthy, 1 hung or failed).
    Nccl(NcclArgs),
    /// The container config lines that pass GPUs through, from this node's live facts
    /// (exit 0 printed, 1 the node cannot pass them).
    Passthrough(PassthroughArgs),
}

#[derive(Debug, Args)]
struct PassthroughArgs {
    /// The node's GPUs to pass: indices as nvidia-smi numbers them, or UUIDs (comma-separated).
    #[arg(long, required = true, value_delimiter = ',', value_parser = gpu::parse_gpu_selector)]
    gpus: Vec<GpuSelector>,
    /// `dev`: Proxmox devN entries (PVE 8.1+); `lxc`: cgroup allow lines with the node's
    /// majors and mount entries (any LXC).
    #[arg(long, default_value = "dev", value_parser = parse_method)]
    method: GpuMethod,
    #[command(flatten)]
    capture: Capture,
}

#[derive(Debug, Args)]
struct FactsArgs {
    /// Print the facts as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    capture: Capture,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The GPUs the guest must see, exactly, by UUID (comma-separated).
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_uuid)]
    gpus: Vec<String>,
    /// The node's kernel module version; default: this machine's /proc/driver/nvidia/version.
    #[arg(long, value_name = "VERSION")]
    driver_version: Option<String>,
    /// The CUDA toolkit release the inventory declares, e.g. 13.0.
    #[arg(long, value_name = "RELEASE", value_parser = parse_release)]
    cuda: Option<String>,
    /// Where the toolkit lives; default /usr/local/cuda-<release>.
    #[arg(long, value_name = "PATH", requires = "cuda")]
    cuda_home: Option<String>,
    /// The ml-env whose torch must see --tp GPUs.
    #[arg(long, value_name = "PATH", requires = "tp")]
    venv: Option<String>,
    /// The service's tensor parallel size.
    #[arg(long, requires = "venv")]
    tp: Option<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    capture: Capture,
}

/// Testing-only flags of the readers: a fake root, and saving what was read as a fixture.
#[derive(Debug, Args)]
struct Capture {
    /// Read /proc, /dev and library folders under this folder instead (testing only).
    #[arg(long, hide = true, default_value = "")]
    root: String,
    /// Also write the raw output this was read from to FILE (testing: fixture captures).
    #[arg(long, hide = true, value_name = "FILE")]
    save_raw: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct NcclArgs {
    /// The GPUs, one rank each: CUDA indices (0,1) or UUIDs.
    #[arg(long, required = true, value_delimiter = ',', value_parser = gpu::parse_gpu_selector)]
    gpus: Vec<GpuSelector>,
    /// The ml-env's python.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Deadline for the whole preflight; past it the all-reduce counts as hung.
    #[arg(long, default_value = "30s", value_parser = TimeSpan::parse)]
    timeout: TimeSpan,
    /// The service's environment, repeatable: --env NCCL_P2P_DISABLE=1.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Bytes per all-reduce.
    #[arg(long, default_value = "64M", value_parser = Size::parse)]
    size: Size,
    /// Timed all-reduces (after 5 untimed ones).
    #[arg(long, default_value_t = 20)]
    iters: u32,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Testing only: this rank joins the rendezvous and then never joins NCCL.
    #[arg(long, hide = true, value_name = "RANK")]
    simulate_hang_rank: Option<u32>,
    /// Testing only: this rank fails after the rendezvous.
    #[arg(
        long,
        hide = true,
        value_name = "RANK",
        conflicts_with = "simulate_hang_rank"
    )]
    simulate_crash_rank: Option<u32>,
    /// Also write the raw output this was read from to FILE (testing: fixture captures).
    #[arg(long, hide = true, value_name = "FILE")]
    save_raw: Option<std::path::PathBuf>,
}

fn parse_uuid(s: &str) -> Result<String, String> {
    match gpu::parse_gpu_selector(s)? {
        GpuSelector::Uuid(u) => Ok(u),
        GpuSelector::Index(_) => Err(format!(
            "`{s}` is an index; a guest numbers its GPUs from 0, so name them by UUID (`provision gpu facts` on the node lists them)"
        )),
    }
}

fn parse_release(s: &str) -> Result<String, String> {
    let ok = s.split_once('.').is_some_and(|(a, b)| {
        [a, b]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a CUDA release; write MAJOR.MINOR, e.g. 13.0"
        ))
    }
}

fn parse_method(s: &str) -> Result<GpuMethod, String> {
    match s {
        "dev" => Ok(GpuMethod::Dev),
        "lxc" => Ok(GpuMethod::Lxc),
        _ => Err(format!(
            "`{s}` is not a passthrough method; use `dev` or `lxc`"
        )),
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))?;
    let valid = !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("`{k}` is not an environment variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Runs `provision gpu`.
pub fn run(args: &GpuArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let transport = LocalTransport::default();
    match &args.command {
        GpuCommand::Facts(a) => facts(a, &transport, printer),
        GpuCommand::Check(a) => check(a, &transport, printer),
        GpuCommand::Nccl(a) => nccl(a, &transport, printer),
        GpuCommand::Passthrough(a) => passthrough(a, &transport, printer),
    }
}

fn passthrough(
    args: &PassthroughArgs,
    transport: &LocalTransport,
    printer: &Printer,
) -> anyhow::Result<ExitStatus> {
    let sources = FactSources {
        root: args.capture.root.clone(),
    };
    let (facts, raw) = gpu::facts::gather_node_facts_raw(transport, &sources)?;
    save_raw(args.capture.save_raw.as_deref(), &raw)?;
    let renderer = Renderer::new(None)?;
    match gpu::passthrough_lines(&facts, &args.gpus, args.method, &renderer) {
        Ok(lines) => {
            printer.result(&lines);
            Ok(ExitStatus::Success)
        }
        Err(e) => {
            // The node's own problems usually explain a refusal (no driver, no nodes).
            let d = facts
                .problems
                .iter()
                .fold(Diagnostic::new(e.to_string()), |d, p| {
                    d.cause(format!("{} ({})", p.message, p.hint))
                });
            Err(d.hint(e.hint()).into())
        }
    }
}

fn facts(
    args: &FactsArgs,
    transport: &LocalTransport,
    printer: &Printer,
) -> anyhow::Result<ExitStatus> {
    let sources = FactSources {
        root: args.capture.root.clone(),
    };
    let (facts, raw) = gpu::facts::gather_node_facts_raw(transport, &sources)?;
    save_raw(args.capture.save_raw.as_deref(), &raw)?;
    if args.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&facts)?));
    } else {
        printer.result(&render_facts(&facts));
    }
    if facts.problems.is_empty() {
        return Ok(ExitStatus::Success);
    }
    for p in &facts.problems {
        printer.error(
            &Diagnostic::new(&p.message)
                .hint(&p.hint)
                .render(printer.color_err()),
        );
    }
    Ok(ExitStatus::Failure)
}

fn save_raw(path: Option<&std::path::Path>, raw: &str) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, raw)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Node facts for people.
pub fn render_facts(facts: &NodeFacts) -> String {
    let mut out = String::new();
    match &facts.driver {
        Some(d) => {
            let kind = if d.open { "open" } else { "proprietary" };
            out += &format!("driver   {} ({kind} kernel module)\n", d.version);
        }
        None => out += "driver   none loaded\n",
    }
    for g in &facts.gpus {
        out += &format!(
            "GPU {:<4} {}  {}  {} MiB  {}  {}\n",
            g.info.index,
            g.info.uuid,
            g.info.name,
            g.info.memory_mib,
            g.info.pci_bus_id,
            g.device_path().unwrap_or_else(|| "no device node".into())
        );
    }
    let majors: Vec<String> = facts
        .majors
        .iter()
        .map(|m| format!("{} {}", m.name, m.major))
        .collect();
    out += &format!("majors   {}\n", or_none(&majors));
    let nodes: Vec<String> = facts
        .device_nodes
        .iter()
        .map(|n| format!("{} {}:{}", n.path, n.major, n.minor))
        .collect();
    out += &format!("nodes    {}\n", or_none(&nodes));
    out
}

fn or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

fn check(
    args: &CheckArgs,
    transport: &LocalTransport,
    printer: &Printer,
) -> anyhow::Result<ExitStatus> {
    let expect = GuestExpectations {
        gpus: args.gpus.clone(),
        driver_version: args.driver_version.clone(),
        cuda: args.cuda.as_ref().map(|release| CudaExpectation {
            release: release.clone(),
            home: args
                .cuda_home
                .clone()
                .unwrap_or_else(|| format!("/usr/local/cuda-{release}")),
        }),
        torch: args
            .venv
            .as_ref()
            .zip(args.tp)
            .map(|(venv, tp)| TorchExpectation {
                venv: venv.clone(),
                tp,
            }),
        root: args.capture.root.clone(),
    };
    let (report, raw) = gpu::checks::run_guest_checks_raw(transport, &expect)?;
    save_raw(args.capture.save_raw.as_deref(), &raw)?;
    if args.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&report)?));
        return Ok(report.exit_status());
    }
    let mut out = String::new();
    let verbose = printer.verbosity() >= crate::printer::Verbosity::Verbose;
    let (mut ok, mut drift, mut skipped) = (0, 0, 0);
    for c in &report.checks {
        let (word, style) = match c.status {
            CheckStatus::Ok => {
                ok += 1;
                ("ok", Style::new().green())
            }
            CheckStatus::Drift => {
                drift += 1;
                ("drift", Style::new().red().bold())
            }
            CheckStatus::Skipped => {
                skipped += 1;
                ("skip", Style::new().dim())
            }
        };
        let word = printer.style_out(style).apply_to(format!("{word:<5}"));
        out += &format!("{word}  {:<6}  {}\n", c.name, c.summary);
        if c.status == CheckStatus::Drift || verbose {
            for d in &c.details {
                out += &format!("               {d}\n");
            }
        }
        let hint = printer
            .style_out(Style::new().cyan().bold())
            .apply_to("hint:");
        for r in &c.remedies {
            out += &format!("               {hint} {r}\n");
        }
    }
    out += &format!("{ok} ok, {drift} drift, {skipped} skipped\n");
    printer.result(&out);
    Ok(report.exit_status())
}

fn nccl(
    args: &NcclArgs,
    transport: &LocalTransport,
    printer: &Printer,
) -> anyhow::Result<ExitStatus> {
    let mut opts = NcclOptions::new(args.gpus.clone(), args.python.clone());
    opts.timeout = args.timeout.as_duration();
    opts.env = args.env.clone();
    opts.bytes = args.size.bytes();
    opts.iters = args.iters;
    opts.simulate = match (args.simulate_hang_rank, args.simulate_crash_rank) {
        (Some(r), _) => Some(Simulate::HangRank(r)),
        (None, Some(r)) => Some(Simulate::CrashRank(r)),
        (None, None) => None,
    };
    let gpus: Vec<String> = args.gpus.iter().map(ToString::to_string).collect();
    let gpus = gpus.join(",");
    printer.status(&format!(
        "running an NCCL all-reduce across GPUs {gpus} with {} (deadline {})",
        args.python, args.timeout
    ));
    let run = match nccl::run_preflight(transport, &opts) {
        Ok(run) => run,
        Err(nccl::NcclError::PythonNotFound { python, output }) => {
            return Err(Diagnostic::new(format!("cannot run {python}"))
                .cause(output)
                .hint("point --python at the ml-env's python, e.g. /root/ml-env/bin/python")
                .into());
        }
        Err(e) => return Err(e.into()),
    };
    save_raw(args.save_raw.as_deref(), &run.launcher_stdout)?;
    if args.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&run)?));
    }
    match verdict(&run, &gpus) {
        Ok(text) => {
            if !args.json {
                printer.result(&text);
            }
            Ok(ExitStatus::Success)
        }
        Err(diagnostic) if args.json => {
            printer.error(&diagnostic.render(printer.color_err()));
            Ok(ExitStatus::Failure)
        }
        Err(diagnostic) => Err((*diagnostic).into()),
    }
}

/// The preflight's verdict for people: the healthy report, or the failure as an error with
/// its remedies.
pub fn verdict(run: &NcclRun, gpus: &str) -> Result<String, Box<Diagnostic>> {
    let with_env = |d: Diagnostic| match &run.start {
        Some(s) if !s.nccl_env.is_empty() => {
            let env: Vec<String> = s.nccl_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            d.cause(format!("ran with {}", env.join(" ")))
        }
        _ => d,
    };
    let failure = match &run.outcome {
        NcclOutcome::Healthy(h) => {
            let mut names = h.device_names.clone();
            names.dedup();
            let mut out = format!(
                "NCCL all-reduce across {} GPUs ({}): healthy\n",
                h.world,
                names.join(", ")
            );
            out += &format!(
                "  bus bandwidth  {:.1} GB/s (algorithm {:.1} GB/s; {:.0} MiB × {}, {:.3} ms each)\n",
                h.busbw_gbps,
                h.algbw_gbps,
                h.bytes as f64 / f64::from(1 << 20),
                h.iters,
                h.time_per_iter_s * 1e3
            );
            out += &format!(
                "  NCCL init      {:.2} s; whole preflight {:.1} s\n",
                h.init_s, run.wall_s
            );
            if let Some(s) = &run.start {
                out += &format!(
                    "  torch {}, CUDA {}, NCCL {}, {}\n",
                    s.torch,
                    s.cuda.as_deref().unwrap_or("none"),
                    s.nccl,
                    s.python
                );
            }
            return Ok(out);
        }
        NcclOutcome::Hung {
            after_s,
            timeout_s,
            detected_by,
            ranks,
        } => {
            let mut d = Diagnostic::new(format!(
                "NCCL all-reduce across GPUs {gpus} hung after {after_s:.1} s (deadline {timeout_s:.0} s)"
            ));
            if *detected_by == DetectedBy::Transport {
                d = d.cause("the launcher itself never reported (stuck importing torch or initializing CUDA?)");
            }
            d = with_env(rank_causes(d, ranks, false));
            nccl::hang_remedies().into_iter().fold(d, Diagnostic::hint)
        }
        NcclOutcome::Crashed {
            rank,
            code,
            after_s,
            wrong_sum,
            ranks,
        } => {
            let what = if wrong_sum.is_some() {
                format!("rank {rank} got a wrong all-reduce sum")
            } else {
                format!("rank {rank} exited with status {code}")
            };
            let mut d = Diagnostic::new(format!(
                "NCCL all-reduce across GPUs {gpus} failed after {after_s:.1} s: {what}"
            ));
            if let Some(w) = wrong_sum {
                d = d.cause(format!("sum check: {w}"));
            }
            d = with_env(rank_causes(d, ranks, true));
            d.hint("rerun with --env NCCL_DEBUG=INFO to see NCCL's own messages")
        }
        NcclOutcome::TooFewGpus {
            wanted,
            visible,
            cuda_visible_devices,
        } => {
            let wanted: Vec<String> = wanted.iter().map(ToString::to_string).collect();
            let mut d = Diagnostic::new(format!(
                "asked for CUDA devices {} but torch sees {visible} GPU(s)",
                wanted.join(",")
            ));
            if let Some(cvd) = cuda_visible_devices {
                d = d.cause(format!("CUDA_VISIBLE_DEVICES={cvd}"));
            }
            d.hint("check that the container sees every GPU of the service (`provision gpu check`)")
                .hint("check CUDA_VISIBLE_DEVICES in the service's environment")
        }
        NcclOutcome::TorchMissing { python, error } => {
            Diagnostic::new(format!("torch is not installed for {python}"))
                .cause(error.clone())
                .hint("point --python at the ml-env's python, e.g. /root/ml-env/bin/python")
        }
        NcclOutcome::NcclMissing { python, torch } => {
            Diagnostic::new(format!("torch {torch} at {python} was built without NCCL"))
                .hint("install a CUDA build of torch in the ml-env")
        }
    };
    Err(Box::new(failure))
}

/// One cause line per rank, with the end of its output when it has any.
fn rank_causes(mut d: Diagnostic, ranks: &[RankState], stderr_first: bool) -> Diagnostic {
    for r in ranks {
        d = d.cause(format!("rank {}: {} for {:.1} s", r.rank, r.stage, r.for_s));
        let lines = if stderr_first && !r.stderr_tail.is_empty() {
            &r.stderr_tail
        } else if !r.stdout_tail.is_empty() {
            &r.stdout_tail
        } else {
            &r.stderr_tail
        };
        let shown = &lines[lines.len().saturating_sub(8)..];
        for line in shown {
            d = d.cause(format!("  | {line}"));
        }
    }
    d
}
