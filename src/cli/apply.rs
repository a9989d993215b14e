//! `provision apply`: plan, show, confirm, then execute exactly that plan; or execute a
//! plan saved by `provision plan --out`, after checking that the targets still read as they
//! did when it was made.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::plan::{print_plan, read};
use super::targets::TargetArgs;
use super::{ExitStatus, from_engine, from_session, load_valid, session_open};
use crate::diagnostic::Diagnostic;
use crate::engine::reconcile;
use crate::plan::{FORMAT_VERSION, Plan};
use crate::printer::Printer;
use crate::session::WriteSession;

/// Arguments of `provision apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The inventory file, or a plan saved by `provision plan --out FILE` (applied exactly as
    /// saved, refused when a target changed since).
    pub inventory: PathBuf,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
    /// Print the plan and the outcome as one JSON document.
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
    /// Run the NVIDIA driver installer the plan shows (`nodes.X.nvidia.installer`); the
    /// node needs a reboot afterwards. Without it, a plan that installs the driver is
    /// refused.
    #[arg(long)]
    pub install_driver: bool,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// How many times apply plans again after waiting for runs left by a gone provision.
const REPLANS: usize = 3;

/// Runs `provision apply`. When a target was held by a run that a gone provision left
/// (killed, its laptop closed), that run is waited for and the target read and planned
/// again, so what it did is not done twice and what it left is done.
pub fn run(args: &ApplyArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let mut replans = 0;
    loop {
        match run_once(args, printer) {
            Err(e)
                if replans < REPLANS
                    && waited_for_left_run(&e)
                    && saved_plan(&args.inventory)?.is_none() =>
            {
                replans += 1;
                printer.status("The run left on the target has ended; reading the targets again.");
            }
            other => return other,
        }
    }
}

/// Whether `e` is a wait for a run left by a gone provision (nothing of this apply ran).
fn waited_for_left_run(e: &anyhow::Error) -> bool {
    use crate::access::AccessError;
    use crate::agent::client::AgentError;
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<AccessError>(),
            Some(AccessError::Agent(a))
                if matches!(a.downcast_ref::<AgentError>(), Some(AgentError::Waited { .. }))
        ) || matches!(
            c.downcast_ref::<AgentError>(),
            Some(AgentError::Waited { .. })
        )
    })
}

fn run_once(args: &ApplyArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let saved = saved_plan(&args.inventory)?;
    let (loaded, library) = match &saved {
        Some(plan) => {
            if !args.targets.targets.is_empty() {
                return Err(Diagnostic::new(
                    "a saved plan is applied whole; --target cannot narrow it",
                )
                .hint("make the plan with --target instead: `provision plan --target T --out FILE`")
                .into());
            }
            let loaded = crate::inventory::load(Path::new(&plan.inventory)).map_err(|e| {
                anyhow::Error::from(e).context(format!(
                    "cannot load the inventory the plan was made from, `{}`, to reach its targets",
                    plan.inventory
                ))
            })?;
            (loaded, None)
        }
        None => {
            let (loaded, library) = load_valid(&args.inventory)?;
            (loaded, Some(library))
        }
    };
    // A saved plan made with --verify-full is re-read the same way, or every re-hashed
    // answer would differ from a metadata-only one and the plan would look stale.
    let mut target_args = args.targets.clone();
    target_args.verify_full |= saved
        .iter()
        .flat_map(|p| &p.targets)
        .any(|t| t.read.as_ref().is_some_and(|r| r.verify_full));
    // One session for the whole apply: the plan is read through it and its writers reuse
    // the same logins and agent binary.
    let session =
        WriteSession::open(&loaded, target_args.settings(), printer).map_err(from_session)?;
    let (plan, saved) = match (saved, library) {
        (Some(plan), _) => (plan, true),
        (None, library) => {
            let library = library.expect("an inventory is loaded with its library");
            let read = read(&session, &args.inventory, &library, &args.targets)?;
            (read.whole().map_err(from_engine)?, false)
        }
    };
    if !args.json {
        print_plan(&plan, false, printer)?;
    }
    if !plan.summary.has_changes() {
        session.report_calls();
        if args.json {
            print_report(&plan, false, &[], printer)?;
        }
        return Ok(ExitStatus::Success);
    }
    if !args.yes {
        confirm()?;
    }
    // Events stream as they come (bars, lines, or JSON lines on stderr with --json).
    let display = super::progress::Display::new(printer, args.json);
    let applied = reconcile::apply(
        &plan,
        reconcile::ApplyOptions {
            rollback: !args.no_rollback,
            allow_replace: args.allow_replace,
            install_driver: args.install_driver,
            allow_destroy: args.targets.allow_destroy,
            saved,
        },
        &args.targets.limits(),
        &|target| {
            session
                .writer(target, Some(display.observer(target.target.heading())))
                .map_err(session_open)
        },
        &|target, step| {
            let heading = target.heading();
            // Agent steps were shown as they ended; the API's are shown here.
            if !args.json && !display.shown(&heading, &step.description) {
                let verdict = step
                    .detail
                    .as_ref()
                    .and_then(|d| {
                        serde_json::from_value::<crate::resources::service::deploy::DeployReport>(
                            d.clone(),
                        )
                        .ok()
                    })
                    .and_then(|r| r.verdict)
                    .map(|v| format!(": {}", v.summary()))
                    .unwrap_or_default();
                let line = super::progress::step_line(
                    printer,
                    &heading,
                    &step.description,
                    step.error.is_none(),
                    step.millis,
                );
                printer.status(&format!("{line}{verdict}"));
            }
            // A preflight that passes may still have something to say (a setting that
            // works, but not as well as it could).
            let warnings = step
                .detail
                .as_ref()
                .and_then(|d| {
                    serde_json::from_value::<crate::resources::service::preflight::PreflightReport>(
                        d.clone(),
                    )
                    .ok()
                })
                .map(|r| r.warnings)
                .unwrap_or_default();
            for w in warnings {
                printer.warn(&format!("{}: {w}", target.heading()));
            }
        },
    );
    display.finish();
    session.report_calls();
    let outcomes = applied.map_err(from_engine)?;
    let steps: usize = outcomes.iter().map(|o| o.steps.len()).sum();
    if args.json {
        print_report(&plan, true, &outcomes, printer)?;
    } else {
        printer.result(&format!(
            "Apply complete: {} change(s) made in {steps} step(s), each verified on its target.\n",
            plan.summary.create + plan.summary.update + plan.summary.replace + plan.summary.delete
        ));
    }
    Ok(ExitStatus::Success)
}

/// The plan saved at `path`, or `None` when `path` is not one (an inventory).
fn saved_plan(path: &Path) -> anyhow::Result<Option<Plan>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        // Unreadable or not UTF-8: the inventory loader says why, with its own hints.
        Err(_) => return Ok(None),
    };
    if !text.trim_start().starts_with('{') {
        return Ok(None);
    }
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    let Some(version) = value.get("format_version").and_then(|v| v.as_u64()) else {
        return Ok(None);
    };
    if version != u64::from(FORMAT_VERSION) {
        let made_by = if version < u64::from(FORMAT_VERSION) {
            "an older"
        } else {
            "a newer"
        };
        return Err(Diagnostic::new(format!(
            "{} is a plan in format {version}; this provision reads format {FORMAT_VERSION}",
            path.display()
        ))
        .cause(format!("it was made by {made_by} provision, whose plans this one would read differently (docs/plan-format.md lists what each version changed)"))
        .hint("make the plan again with this provision: `provision plan --out FILE INVENTORY`")
        .into());
    }
    let plan: Plan = serde_json::from_value(value).map_err(|e| {
        Diagnostic::new(format!(
            "{} is not a plan provision can apply",
            path.display()
        ))
        .cause(e.to_string())
        .hint("plans are written by `provision plan --out FILE`; do not edit them")
    })?;
    Ok(Some(plan))
}

/// Prints the plan and what apply did as one JSON document.
fn print_report(
    plan: &Plan,
    applied: bool,
    outcomes: &[reconcile::TargetOutcome],
    printer: &Printer,
) -> anyhow::Result<()> {
    let report = serde_json::json!({
        "plan": plan,
        "applied": applied,
        "targets": outcomes.iter().map(|o| serde_json::json!({
            "target": o.target,
            "steps": o.steps.iter().map(|s| serde_json::json!({"step": s.description, "millis": s.millis, "detail": s.detail})).collect::<Vec<_>>(),
            "millis": o.millis,
        })).collect::<Vec<_>>(),
    });
    printer.result(&format!("{}\n", serde_json::to_string_pretty(&report)?));
    Ok(())
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
