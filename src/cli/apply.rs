//! `provision apply`: plan, show, confirm, then execute exactly that plan.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use console::Style;

use super::plan::{print_plan, read_plan};
use super::targets::{Connections, TargetArgs};
use super::{ExitStatus, prepare};
use crate::agent::client::AgentBinary;
use crate::diagnostic::Diagnostic;
use crate::engine::online;
use crate::printer::Printer;

/// Arguments of `provision apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    /// Print the plan and the outcome as JSON.
    #[arg(long)]
    pub json: bool,
    /// When a restarted service fails its health gate, leave it as it is for debugging
    /// instead of rolling back to its last healthy unit.
    #[arg(long)]
    pub no_rollback: bool,
    /// Destroy and recreate a container whose create-only settings (template,
    /// `unprivileged`, rootfs storage) changed. Host bind-mounted data is kept.
    #[arg(long)]
    pub allow_replace: bool,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// Runs `provision apply`.
pub fn run(args: &ApplyArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    let loaded = prepared.loaded.clone();
    let plan = read_plan(
        &args.inventory.display().to_string(),
        prepared,
        &args.targets,
        printer,
    )?;
    print_plan(&plan, args.json, printer)?;
    if !plan.summary.has_changes() {
        return Ok(ExitStatus::Success);
    }
    if !args.yes {
        confirm()?;
    }
    let binary = Arc::new(AgentBinary::current()?);
    let mut conns = Connections::new(&loaded, &args.targets, binary, printer);
    let green = printer.style_err(Style::new().green());
    let red = printer.style_err(Style::new().red().bold());
    let outcomes = online::apply(
        &plan,
        online::ApplyOptions {
            rollback: !args.no_rollback,
            allow_replace: args.allow_replace,
        },
        &mut |target| conns.connect(target),
        &mut |target, step| {
            let mark = if step.error.is_none() {
                green.apply_to("done")
            } else {
                red.apply_to("FAILED")
            };
            let verdict = step
                .detail
                .as_ref()
                .and_then(|d| {
                    serde_json::from_value::<crate::agent::deploy::DeployReport>(d.clone()).ok()
                })
                .and_then(|r| r.verdict)
                .map(|v| format!(": {}", v.summary()))
                .unwrap_or_default();
            printer.status(&format!(
                "{}: {} ... {mark} ({:.1}s){verdict}",
                target.heading(),
                step.description,
                step.millis as f64 / 1000.0
            ));
            // A preflight that passes may still have something to say (a setting that
            // works, but not as well as it could).
            let warnings = step
                .detail
                .as_ref()
                .and_then(|d| {
                    serde_json::from_value::<crate::agent::preflight::PreflightReport>(d.clone())
                        .ok()
                })
                .map(|r| r.warnings)
                .unwrap_or_default();
            for w in warnings {
                printer.warn(&format!("{}: {w}", target.heading()));
            }
        },
    )?;
    let steps: usize = outcomes.iter().map(|o| o.steps.len()).sum();
    if args.json {
        let report = serde_json::json!({
            "applied": true,
            "targets": outcomes.iter().map(|o| serde_json::json!({
                "target": o.target,
                "steps": o.steps.iter().map(|s| serde_json::json!({"step": s.description, "millis": s.millis, "detail": s.detail})).collect::<Vec<_>>(),
                "millis": o.millis,
            })).collect::<Vec<_>>(),
        });
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&report)?));
    } else {
        printer.result(&format!(
            "Apply complete: {} change(s) made in {steps} step(s), each verified on its target.\n",
            plan.summary.create + plan.summary.update + plan.summary.replace + plan.summary.delete
        ));
    }
    Ok(ExitStatus::Success)
}

/// Asks on the terminal; refuses without one (scripts pass `--yes`).
fn confirm() -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Diagnostic::new(
            "refusing to apply without confirmation: stdin is not a terminal",
        )
        .hint("review the plan above and pass --yes to apply it")
        .into());
    }
    eprint!("Apply this plan? Only 'yes' is accepted: ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if answer.trim() == "yes" {
        Ok(())
    } else {
        Err(Diagnostic::new("apply cancelled; nothing was changed").into())
    }
}
