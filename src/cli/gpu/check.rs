//! `provision gpu check`: a guest's GPU checks, run here.

use clap::Args;
use console::Style;

use super::{Capture, parse_release, parse_uuid, save_raw};
use crate::cli::ExitStatus;
use crate::gpu::checks::{CudaExpectation, TorchExpectation};
use crate::gpu::{self, CheckStatus, GuestExpectations};
use crate::printer::Printer;
use crate::transport::local::LocalTransport;

/// Arguments of `provision gpu check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
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

/// Runs the verb.
pub fn run(
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
        return Ok(ExitStatus::drift_if(report.drifted()));
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
    Ok(ExitStatus::drift_if(report.drifted()))
}
