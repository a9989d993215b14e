//! The current generation of an ml-env: its stable paths (`/root/ml-env`,
//! `/root/sglang-main`) as symlinks to the declared generation's folders, built beside
//! (`crate::generations`). The switch is one rename per link, run right before the first
//! service deploy of the apply (after every build step and the preflight), so a failed
//! build or preflight leaves what runs untouched.

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::generations::record::Gate;
use crate::generations::target::LinkState;
use crate::plan::{Action, Attribute, Change};

/// The declared generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationSpec {
    /// The venv's stable path (`/root/ml-env`): the resource's name.
    pub venv: String,
    /// Stable path -> the declared generation's folder for it.
    pub links: BTreeMap<String, String>,
}

/// What the stable paths are, and the record's word on the generation they point at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationFact {
    /// Stable path -> what is there.
    pub states: BTreeMap<String, LinkState>,
    /// The generations record (kept small by pruning): what `provision history` shows.
    #[serde(default)]
    pub record: crate::generations::record::Record,
}

/// Reads what `stables` are on this machine.
pub fn read(stables: &[String]) -> Result<GenerationFact, crate::machine::HostError> {
    let states: BTreeMap<String, LinkState> = stables
        .iter()
        .map(|s| (s.clone(), crate::generations::target::state(s)))
        .collect();
    let record = crate::generations::target::load()?;
    Ok(GenerationFact { states, record })
}

impl GenerationSpec {
    fn probe(&self) -> Probe {
        Probe::Generation {
            stables: self.links.keys().cloned().collect(),
        }
    }
}

impl Resource for GenerationSpec {
    fn kind(&self) -> &'static str {
        "generation"
    }

    fn name(&self) -> String {
        self.venv.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![self.probe()]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let fact = facts.generation(&self.probe())?;
        let mut delta = Delta::new(Action::Update);
        let mut any = false;
        for (stable, want) in &self.links {
            let have = fact.and_then(|f| f.states.get(stable));
            let shown = match have {
                Some(LinkState::Link(t)) if t == want => continue,
                Some(LinkState::Link(t)) => crate::generations::short(t).to_string(),
                Some(LinkState::Folder) => {
                    delta = delta.reason(format!(
                        "{stable} is a real folder: it is kept as the adopted generation (moved beside, never rebuilt or deleted) and {stable} becomes a symlink"
                    ));
                    "a folder".into()
                }
                Some(LinkState::Other) => "a file".into(),
                Some(LinkState::Missing) | None => "absent".into(),
            };
            any = true;
            delta = delta.attr(Attribute::change(
                stable,
                Some(shown),
                Some(crate::generations::short(want).to_string()),
            ));
        }
        if !any {
            // Switched to by an apply that was killed before its health gate: the service
            // is restarted on it and gated (on a target whose generations are gated at all:
            // an ml-env without a service never is).
            let record = fact.map(|f| &f.record);
            let pending = record
                .and_then(|r| r.current(&self.links))
                .is_some_and(|g| g.gate == Gate::Pending);
            let gated = record.is_some_and(|r| r.generations.iter().any(|g| !g.units.is_empty()));
            if pending && gated {
                return Ok(Some(
                    Delta::new(Action::Update)
                        .attr(Attribute::change(
                            "gate",
                            Some("not gated".into()),
                            Some("passed".into()),
                        ))
                        .reason("switched to by an apply that ended before its health gate: the service is restarted on it and gated"),
                ));
            }
            return Ok(None);
        }
        // The declared generation was switched to before and failed its gate: say so, so
        // the drift reads as "not in place because it failed", not as a change not made.
        if let Some(g) = fact.and_then(|f| f.record.current(&self.links))
            && g.gate == Gate::Failed
        {
            delta = delta.reason(format!(
                "the declared generation (generation {}, {}) is not in place: its health gate failed{}",
                g.number,
                g.at,
                g.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
            ));
        }
        if fact.is_none_or(|f| f.states.values().all(|s| *s == LinkState::Missing)) {
            delta.action = Action::Create;
        }
        Ok(Some(delta.reason(
            "built beside what runs; switched to right before the service's restart",
        )))
    }

    fn ops(&self, _change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::SwitchGeneration {
            links: self.links.clone(),
        }])
    }
}

/// `steps` with every generation switch moved to right before the first service deploy
/// (or to the end): after every build, the import check, the model download and the
/// preflight, so what fails there leaves what runs untouched.
pub fn switch_last(steps: Vec<Step>) -> Vec<Step> {
    let (switches, mut rest): (Vec<Step>, Vec<Step>) = steps
        .into_iter()
        .partition(|s| matches!(s, Step::SwitchGeneration { .. }));
    let at = rest
        .iter()
        .position(|s| matches!(s, Step::DeployService(_)))
        .unwrap_or(rest.len());
    rest.splice(at..at, switches);
    rest
}

/// Runs [`Step::SwitchGeneration`] on the target.
pub fn switch(links: &BTreeMap<String, String>) -> Result<(), crate::machine::HostError> {
    for note in crate::generations::target::switch(links, crate::machine::utc_now())? {
        crate::progress::line(&note);
    }
    Ok(())
}
