//! `provision gpu passthrough`: the container config lines that pass GPUs through, from this
//! node's live facts.

use clap::Args;

use super::{Capture, save_raw};
use crate::cli::ExitStatus;
use crate::compile::render::Renderer;
use crate::diagnostic::Diagnostic;
use crate::gpu::{self, FactSources};
use crate::inventory::container::{GpuMethod, GpuSelector};
use crate::printer::Printer;
use crate::transport::local::LocalTransport;

/// Arguments of `provision gpu passthrough`.
#[derive(Debug, Args)]
pub struct PassthroughArgs {
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

fn parse_method(s: &str) -> Result<GpuMethod, String> {
    match s {
        "dev" => Ok(GpuMethod::Dev),
        "lxc" => Ok(GpuMethod::Lxc),
        _ => Err(format!(
            "`{s}` is not a passthrough method; use `dev` or `lxc`"
        )),
    }
}

/// Runs the verb.
pub fn run(
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
    match crate::compile::render::passthrough::passthrough_lines(
        &facts,
        &args.gpus,
        args.method,
        &renderer,
    ) {
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
