//! `provision plan`: what would change to make reality match the inventory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::targets::{TargetArgs, select};
use super::{ExitStatus, from_engine, from_session, load_valid, prepare, session_open};
use crate::agent::client::AgentBinary;
use crate::compile::Library;
use crate::engine::offline_plan;
use crate::engine::{DesiredTarget, reconcile, removal};
use crate::inventory::Loaded;
use crate::plan::Target;
use crate::plan::{Plan, render_human};
use crate::printer::Printer;
use crate::proxmox::ApiReader;
use crate::session::{Api, Session, ssh};
use crate::timing;

/// Arguments of `provision plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    /// Plan against an empty world (everything to create), with no network at all.
    #[arg(long)]
    pub offline: bool,
    /// Print the plan as JSON (see docs/plan-format.md).
    #[arg(long)]
    pub json: bool,
    /// Exit 2 when there are changes (0 when none, 1 on error).
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Also save the plan to FILE, for `provision apply FILE` to execute exactly.
    #[arg(long, value_name = "FILE", conflicts_with = "offline")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// Runs `provision plan`.
pub fn run(args: &PlanArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let start = std::time::Instant::now();
    let inventory = args.inventory.display().to_string();
    let read = if args.offline {
        let prepared = timing::time("inventory: load, render", || prepare(&args.inventory))?;
        let desired = select(prepared.desired, &args.targets)?;
        reconcile::PartialPlan {
            plan: offline_plan(&inventory, &desired),
            failures: Vec::new(),
        }
    } else {
        let (loaded, library) =
            timing::time("inventory: load, render", || load_valid(&args.inventory))?;
        let session = open_session::<ApiReader>(&loaded, &args.targets, printer)?;
        let read = read_targets(&inventory, &library, &session, &args.targets, printer)?;
        session.report_calls();
        read
    };
    // The targets that were read are shown even when others could not be; a plan that
    // misses some is an error and is not saved.
    timing::time("print", || print_read(&read, args.json, printer))?;
    printer.verbose(&timing::render(&timing::take(), start.elapsed()));
    let plan = read.whole().map_err(from_engine)?;
    if let Some(out) = &args.out {
        save_plan(&plan, out)?;
        printer.status(&format!(
            "Saved the plan to {0}; `provision apply {0}` executes exactly it.",
            out.display()
        ));
    }
    Ok(if args.detailed_exitcode && plan.summary.has_changes() {
        ExitStatus::Changes
    } else {
        ExitStatus::Success
    })
}

/// A session on `loaded` with the settings `targets` gives and this provision's agent
/// binary (hashed once for the whole run): a [`ReadSession`](crate::session::ReadSession)
/// for `plan` and `check`, a [`WriteSession`](crate::session::WriteSession) for `apply`.
pub fn open_session<'a, A: Api>(
    loaded: &'a Loaded,
    targets: &TargetArgs,
    printer: &'a Printer,
) -> anyhow::Result<Session<'a, A>> {
    let binary = Arc::new(timing::time("agent binary: load", AgentBinary::current)?);
    Ok(Session::new(loaded, targets.settings(), binary, printer))
}

/// Reads the selected targets through `session`, concurrently as `--parallelism` allows,
/// and plans against those that could be read; the others are returned with their errors.
/// The desired state is computed here, once, with the nodes' live GPU facts. Only reads,
/// whatever the session: the engine's plan is handed readers alone.
pub fn read_targets<A: Api>(
    inventory: &str,
    library: &Library,
    session: &Session<'_, A>,
    targets: &TargetArgs,
    printer: &Printer,
) -> anyhow::Result<reconcile::PartialPlan> {
    if targets.migrate {
        return Err(crate::diagnostic::Diagnostic::new(
            "--migrate: moving a container between the nodes of a cluster is not built yet; nothing was read or changed",
        )
        .hint(crate::resources::container::MIGRATE_NOT_BUILT)
        .into());
    }
    let loaded = session.loaded();
    let (desired, live) = timing::time("gpus: live facts", || {
        super::node::with_live_gpus(library, session, targets, printer)
    })?;
    let undeclared = undeclared(&desired, loaded, targets);
    let desired = select(desired, targets)?;
    let desired = ssh::with_login_keys(desired, loaded, session.settings());
    session.warn_insecure();
    session.reading(&desired);
    let mut read = reconcile::plan(
        inventory,
        &desired,
        targets.verify_full,
        &undeclared,
        &targets.limits(),
        &|d| {
            printer.status(&format!("reading {}", d.target.heading()));
            session.reader(d).map_err(session_open)
        },
    );
    super::node::refuse_root_only(&read.plan, loaded, session)?;
    ssh::refuse_keyless_creates(&read.plan, loaded, session.settings()).map_err(from_session)?;
    super::assumed::refuse_missing(&read.plan, loaded, session, printer)?;
    super::privileges::refuse_missing(&read.plan, loaded, session)?;
    read.plan = timing::time("gpus: checks", || {
        super::node::gpu_checks(
            read.plan,
            &desired,
            &live,
            &|n, v| session.running(n, v),
            printer,
        )
    })?;
    Ok(read)
}

/// Writes `plan` to `path` atomically (a temp file beside it, then a rename).
fn save_plan(plan: &Plan, path: &Path) -> anyhow::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut text = serde_json::to_string_pretty(plan)?;
    text.push('\n');
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot save the plan as {}", path.display()))
}

/// Prints the plan of the targets read; when some could not be, "no changes" is not
/// claimed for them (the error that follows names them).
pub fn print_read(
    read: &reconcile::PartialPlan,
    json: bool,
    printer: &Printer,
) -> anyhow::Result<()> {
    if read.failures.is_empty() || json || read.plan.summary.has_changes() {
        return print_plan(&read.plan, json, printer);
    }
    printer.result(&format!(
        "No changes in the {} target(s) read; {} could not be read (below).\n",
        read.plan.targets.len(),
        read.failures.len()
    ));
    Ok(())
}

/// Prints a plan for people, or as JSON.
pub fn print_plan(plan: &Plan, json: bool, printer: &Printer) -> anyhow::Result<()> {
    if json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(plan)?));
    } else {
        printer.result(&render_human(plan, printer.color_out()));
    }
    Ok(())
}

/// What the plan does with what is no longer declared: containers this inventory created
/// are looked for on every node in a plan of the whole inventory (none with `--target`,
/// which reads only what it names); every vmid of the inventory counts as declared.
fn undeclared(
    desired: &[DesiredTarget],
    loaded: &Loaded,
    targets: &TargetArgs,
) -> removal::Undeclared {
    let containers = |d: &DesiredTarget| match &d.target {
        Target::Container { node, vmid, .. } => Some((node.clone(), *vmid)),
        _ => None,
    };
    let declared: Vec<(String, u64)> = desired.iter().filter_map(containers).collect();
    let nodes: Vec<String> = match targets.targets.is_empty() {
        true => loaded
            .inventory
            .nodes
            .keys()
            .map(|n| n.to_string())
            .collect(),
        false => Vec::new(),
    };
    removal::Undeclared {
        prune_models: targets.prune_models,
        allow_destroy: targets.allow_destroy,
        allow_downtime: targets.allow_downtime,
        declared: declared.into_iter().map(|(_, v)| v).collect(),
        nodes,
        owner: crate::session::owner(loaded),
    }
}
