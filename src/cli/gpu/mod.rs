//! `provision gpu facts|check|nccl|passthrough`: GPU facts, guest checks, the NCCL preflight
//! and the container lines that pass GPUs through, run on
//! this machine through the local transport (the reconciler runs the same library calls over
//! SSH on the node and in the guest).

mod check;
mod facts;
mod nccl;
mod passthrough;

use clap::{Args, Subcommand};

use super::ExitStatus;
use crate::gpu::{self};
use crate::inventory::container::GpuSelector;
use crate::printer::Printer;
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
    Facts(facts::FactsArgs),
    /// Guest checks: GPUs, driver, CUDA toolkit, torch (exit 0 ok, 2 drift, 1 error).
    Check(check::CheckArgs),
    /// NCCL preflight: an all-reduce across the GPUs, one process each, with a deadline (exit
    /// 0 healthy, 1 hung or failed).
    Nccl(nccl::NcclArgs),
    /// The container config lines that pass GPUs through, from this node's live facts
    /// (exit 0 printed, 1 the node cannot pass them).
    Passthrough(passthrough::PassthroughArgs),
}

fn parse_uuid(s: &str) -> Result<String, String> {
    match gpu::parse_gpu_selector(s).map_err(|e| e.to_string())? {
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
        GpuCommand::Facts(a) => facts::run(a, &transport, printer),
        GpuCommand::Check(a) => check::run(a, &transport, printer),
        GpuCommand::Nccl(a) => nccl::run(a, &transport, printer),
        GpuCommand::Passthrough(a) => passthrough::run(a, &transport, printer),
    }
}

/// Testing-only flags of the readers: a fake root, and saving what was read as a fixture.
/// Where raw command output goes, for fixtures.
#[derive(Debug, Args)]
pub struct Capture {
    /// Read /proc, /dev and library folders under this folder instead (testing only).
    #[arg(long, hide = true, default_value = "")]
    root: String,
    /// Also write the raw output this was read from to FILE (testing: fixture captures).
    #[arg(long, hide = true, value_name = "FILE")]
    save_raw: Option<std::path::PathBuf>,
}

fn save_raw(path: Option<&std::path::Path>, raw: &str) -> anyhow::Result<()> {
    if let Some(path) = path {
        std::fs::write(path, raw)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
