//! `provision history` and `provision rollback`: the generations of an ml-env on its
//! guests (what the record on each target says), and going back to the previous one that
//! passed its health gate, gated like an apply.

use std::path::PathBuf;

use clap::Args;

use super::plan::open_session;
use super::targets::{TargetArgs, select};
use super::{ExitStatus, from_session, prepare};
use crate::access::Op;
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::generations::record::history_lines;
use crate::generations::target::LinkState;
use crate::plan::TargetPlan;
use crate::printer::Printer;
use crate::proxmox::{ApiReader, NodeApi};
use crate::resources::generation::GenerationSpec;
use crate::resources::service::ServiceSpec;
use crate::resources::wire::Step;
use crate::resources::{Resource, ResourceSpec};

/// Arguments of `provision history` and `provision rollback`.
#[derive(Debug, Args)]
pub struct GenerationArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// The guests that declare an ml-env (a `generation`), with their services.
fn guests(
    desired: Vec<DesiredTarget>,
    args: &TargetArgs,
) -> anyhow::Result<Vec<(DesiredTarget, GenerationSpec, Vec<ServiceSpec>)>> {
    let out: Vec<_> = select(desired, args)?
        .into_iter()
        .filter_map(|d| {
            let g = d.resources.iter().find_map(|r| match &r.spec {
                ResourceSpec::Generation(g) => Some(g.clone()),
                _ => None,
            })?;
            let services = d
                .resources
                .iter()
                .filter_map(|r| match &r.spec {
                    ResourceSpec::Service(s) => Some(s.as_ref().clone()),
                    _ => None,
                })
                .collect();
            Some((d, g, services))
        })
        .collect();
    if out.is_empty() {
        return Err(Diagnostic::new("no selected target declares an ml-env")
            .hint("generations are kept for a container's `ml_env`; name its guest with --target guest.NAME")
            .into());
    }
    Ok(out)
}

/// Runs `provision history`: each guest's generations, oldest first, `*` the one running.
pub fn history(args: &GenerationArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    // history only reads: a read session, which has no writer.
    let conns = open_session::<ApiReader>(&prepared.loaded, &args.targets, printer)?;
    for (d, g, _) in guests(prepared.desired.clone(), &args.targets)? {
        let probe = g.probes().remove(0);
        let facts = conns
            .reader(&d)
            .map_err(from_session)?
            .read(std::slice::from_ref(&probe))?;
        let fact = facts.generation(&probe)?.cloned().unwrap_or_default();
        let now = fact
            .states
            .iter()
            .filter_map(|(s, st)| match st {
                LinkState::Link(t) => Some((s.clone(), t.clone())),
                _ => None,
            })
            .collect();
        printer.result(&format!("{}:\n", d.target.heading()));
        if fact.record.generations.is_empty() {
            printer.result("  no generations recorded yet (an apply records them)\n");
        }
        for line in history_lines(&fact.record, &now) {
            printer.result(&format!("  {line}\n"));
        }
        for line in crate::generations::record::unswitched_lines(&fact.record, &now, &fact.folders)
        {
            printer.result(&format!("  {line}\n"));
        }
    }
    Ok(ExitStatus::Success)
}

/// Runs `provision rollback`: each selected guest's services go back to the previous
/// generation that passed its gate, and are gated there; exit 1 when one is not ready.
pub fn rollback(args: &GenerationArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let prepared = prepare(&args.inventory)?;
    let conns = open_session::<NodeApi>(&prepared.loaded, &args.targets, printer)?;
    let mut status = ExitStatus::Success;
    for (d, _, services) in guests(prepared.desired.clone(), &args.targets)? {
        let plan = TargetPlan {
            target: d.target.clone(),
            changes: Vec::new(),
            unchanged: 0,
            read: None,
            warnings: Vec::new(),
            not_read: None,
            manages: None,
            replanned: None,
        };
        let writer = conns.writer(&plan, None).map_err(from_session)?;
        let outcomes = writer.run(&[Op::Guest(Step::RollbackGeneration(
            crate::resources::generation::RollbackGenerationStep { services },
        ))])?;
        for o in outcomes {
            match &o.error {
                None => {
                    let notes = o
                        .detail
                        .as_ref()
                        .and_then(|d| {
                            serde_json::from_value::<
                                Vec<crate::resources::service::deploy::DeployReport>,
                            >(d.clone())
                            .ok()
                        })
                        .unwrap_or_default();
                    for r in notes {
                        for n in r.notes {
                            printer.result(&format!("{}: {}: {n}\n", d.target.heading(), r.unit));
                        }
                    }
                }
                Some(e) => {
                    printer.error(&format!("error: {}: {e}\n", d.target.heading()));
                    status = ExitStatus::Failure;
                }
            }
        }
    }
    Ok(status)
}
