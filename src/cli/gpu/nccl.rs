//! `provision gpu nccl`: the NCCL all-reduce preflight across the selected GPUs.

use clap::Args;

use super::{parse_env, save_raw};
use crate::cli::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::gpu::nccl::{self, NcclOptions, Simulate};
use crate::gpu::{self};
use crate::inventory::container::GpuSelector;
use crate::inventory::units::{Size, TimeSpan};
use crate::printer::Printer;
use crate::transport::local::LocalTransport;

/// Arguments of `provision gpu nccl`.
#[derive(Debug, Args)]
pub struct NcclArgs {
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

/// Runs the verb.
pub fn run(
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
    match crate::gpu::nccl_report::verdict(&run, &gpus) {
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
