//! `provision history` and `provision rollback`: the generations of an ml-env on its
//! guests (what the record on each target says), and going back to the previous one that
//! passed its health gate, gated like an apply.

use std::path::PathBuf;

use clap::Args;

use super::targets::{TargetArgs, select};
use super::{ExitStatus, from_session, prepare};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::generations::record::history_lines;
use crate::generations::target::LinkState;
use crate::printer::Printer;
use crate::session::generations::{MlEnvGuest, ml_env_guests};
use crate::session::{ReadSession, WriteSession};

/// Arguments of `provision history` and `provision rollback`.
#[derive(Debug, Args)]
pub struct GenerationArgs {
    /// The inventory file.
    pub inventory: PathBuf,
    #[command(flatten)]
    pub targets: TargetArgs,
}

/// The selected guests that declare an ml-env; none is an error.
fn guests(desired: Vec<DesiredTarget>, args: &TargetArgs) -> anyhow::Result<Vec<MlEnvGuest>> {
    let out = ml_env_guests(select(desired, args)?);
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
    let conns = ReadSession::open(&prepared.loaded, args.targets.settings(), printer)
        .map_err(from_session)?;
    for (d, g, _) in guests(prepared.desired.clone(), &args.targets)? {
        let fact = conns.generation(&d, &g).map_err(from_session)?;
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
    let conns = WriteSession::open(&prepared.loaded, args.targets.settings(), printer)
        .map_err(from_session)?;
    let mut status = ExitStatus::Success;
    for (d, _, services) in guests(prepared.desired.clone(), &args.targets)? {
        let outcomes = conns.rollback(&d, services).map_err(from_session)?;
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
