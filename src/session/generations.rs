//! The generations of an ml-env on its guest, through a session: `history` reads the
//! record (one probe, through a reader), `rollback` runs the one step that goes back to the
//! previous generation that passed its gate (through a writer, so only a write session).

use super::{Api, Session, SessionError, WriteSession};
use crate::access::{Op, OpOutcome};
use crate::engine::DesiredTarget;
use crate::plan::TargetPlan;
use crate::resources::generation::{GenerationFact, GenerationSpec};
use crate::resources::service::ServiceSpec;
use crate::resources::wire::Step;
use crate::resources::{Resource, ResourceSpec};

/// A guest that declares an ml-env: its desired target, its generation and its services.
pub type MlEnvGuest = (DesiredTarget, GenerationSpec, Vec<ServiceSpec>);

/// The guests among `desired` that declare an ml-env (a `generation`), with their services.
pub fn ml_env_guests(desired: Vec<DesiredTarget>) -> Vec<MlEnvGuest> {
    desired
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
        .collect()
}

impl<A: Api> Session<'_, A> {
    /// What the guest of `d` records of generation `g` (nothing recorded: the empty record).
    pub fn generation(
        &self,
        d: &DesiredTarget,
        g: &GenerationSpec,
    ) -> Result<GenerationFact, SessionError> {
        let probe = g.probes().remove(0);
        let facts = self.reader(d)?.read(std::slice::from_ref(&probe))?;
        Ok(facts.generation(&probe)?.cloned().unwrap_or_default())
    }
}

impl WriteSession<'_> {
    /// Sends `d`'s services back to the previous generation that passed its gate; one
    /// outcome per step, a failed one carrying its error.
    pub fn rollback(
        &self,
        d: &DesiredTarget,
        services: Vec<ServiceSpec>,
    ) -> Result<Vec<OpOutcome>, SessionError> {
        let writer = self.writer(&TargetPlan::empty(d.target.clone()), None)?;
        Ok(writer.run(&[Op::Guest(Step::RollbackGeneration(
            crate::resources::generation::RollbackGenerationStep { services },
        ))])?)
    }
}
