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
use crate::generations::UnitFile;
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationFact {
    /// Stable path -> what is there.
    pub states: BTreeMap<String, LinkState>,
    /// The generations record (kept small by pruning): what `provision history` shows.
    #[serde(default)]
    pub record: crate::generations::record::Record,
    /// What the generations folders beside the stable paths hold: a switch prunes those
    /// no kept generation names.
    #[serde(default)]
    pub folders: Vec<String>,
}

/// Reads what `stables` are on this machine.
pub fn read(stables: &[String]) -> Result<GenerationFact, crate::machine::HostError> {
    let states: BTreeMap<String, LinkState> = stables
        .iter()
        .map(|s| (s.clone(), crate::generations::target::state(s)))
        .collect();
    let record = crate::generations::target::load()?;
    let folders = crate::generations::target::folders(stables);
    Ok(GenerationFact {
        states,
        record,
        folders,
    })
}

impl GenerationSpec {
    fn probe(&self) -> Probe {
        Probe::Generation(GenerationProbe {
            stables: self.links.keys().cloned().collect(),
        })
    }
}

impl Resource for GenerationSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

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
        // What the switch prunes, named before it runs.
        if let Some(f) = fact {
            let gone =
                f.record
                    .clone()
                    .prune_with(&self.links, crate::generations::KEEP, &f.folders);
            if !gone.is_empty() {
                let names: Vec<&str> = gone.iter().map(|d| crate::generations::short(d)).collect();
                delta = delta.reason(format!(
                    "the switch prunes {} (keeping what runs and the previous good generation)",
                    names.join(", ")
                ));
            }
        }
        Ok(Some(delta.reason(
            "built beside what runs; switched to right before the service's restart",
        )))
    }

    fn ops(&self, _change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::SwitchGeneration(SwitchGenerationStep {
            links: self.links.clone(),
            units: Vec::new(),
        })])
    }
}

/// `steps` with every generation switch moved to right before the first service deploy
/// (or to the end): after every build, the import check, the model download and the
/// preflight, so what fails there leaves what runs untouched. The unit file of a service
/// deployed on a switched generation is written by the switch itself (the unit a
/// generation runs is that generation's), not before it.
pub fn switch_last(steps: Vec<Step>) -> Vec<Step> {
    let (mut switches, rest): (Vec<Step>, Vec<Step>) = steps
        .into_iter()
        .partition(|s| matches!(s, Step::SwitchGeneration(SwitchGenerationStep { .. })));
    // Unit file -> the generation its service runs on (the links its preflight names).
    let runs_on: BTreeMap<String, BTreeMap<String, String>> = rest
        .iter()
        .filter_map(|s| match s {
            Step::DeployService(d) => d
                .service
                .preflight
                .as_ref()
                .map(|p| (d.service.unit_path.clone(), p.links.clone())),
            _ => None,
        })
        .collect();
    let mut kept = Vec::with_capacity(rest.len());
    for step in rest {
        let unit = match &step {
            Step::WriteFile(crate::resources::file::WriteFileStep {
                path,
                content,
                owner,
                group,
                mode,
            }) => runs_on.get(path).and_then(|links| {
                switches.iter_mut().find_map(|s| match s {
                    Step::SwitchGeneration(SwitchGenerationStep { links: l, units })
                        if l == links =>
                    {
                        Some((
                            units,
                            UnitFile {
                                path: path.clone(),
                                content: content.clone(),
                                owner: owner.clone(),
                                group: group.clone(),
                                mode: *mode,
                            },
                        ))
                    }
                    _ => None,
                })
            }),
            _ => None,
        };
        match unit {
            Some((units, u)) => units.push(u),
            None => kept.push(step),
        }
    }
    let at = kept
        .iter()
        .position(|s| matches!(s, Step::DeployService(_)))
        .unwrap_or(kept.len());
    kept.splice(at..at, switches);
    kept
}

/// Runs [`Step::SwitchGeneration`] on the target.
pub fn switch(
    links: &BTreeMap<String, String>,
    units: &[UnitFile],
) -> Result<(), crate::machine::HostError> {
    for note in crate::generations::target::switch(links, units, crate::machine::utc_now())? {
        crate::progress::line(&note);
    }
    Ok(())
}

/// Probe: what an ml-env's stable paths are (symlinks to a generation, real folders) and the generations record's word on them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GenerationProbe {
    /// The stable paths.
    pub stables: Vec<String>,
}

impl crate::resources::wire::AgentProbe for GenerationProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Generation(Some(read(
            &self.stables,
        )?)))
    }
}

/// Step: point an ml-env's stable paths at a built generation (one rename each), adopting a real folder found there; record it and prune old generations.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SwitchGenerationStep {
    /// Stable path -> the generation's folder.
    pub links: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// The unit files of the services on it, written as part of the switch (pinned to the generation's folders while the links move), not before it.
    pub units: Vec<crate::generations::UnitFile>,
}

impl crate::resources::wire::AgentStep for SwitchGenerationStep {
    fn describe(&self) -> String {
        format!(
            "switch {} to generation {}",
            self.links.keys().cloned().collect::<Vec<_>>().join(", "),
            self.links
                .values()
                .map(|d| crate::generations::short(d))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        switch(&self.links, &self.units)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(30))
    }
}

/// Step: `provision rollback`: the services of an ml-env back on the previous generation that passed its gate, gated again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RollbackGenerationStep {
    /// The services, as the inventory declares them (their health gates).
    pub services: Vec<crate::resources::service::ServiceSpec>,
}

impl crate::resources::wire::AgentStep for RollbackGenerationStep {
    fn describe(&self) -> String {
        format!(
            "roll {} back to the previous generation and wait until ready",
            self.services
                .iter()
                .map(|s| s.unit.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        Ok(serde_json::to_value(crate::resources::service::deploy::rollback(&self.services)?).ok())
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Quiet(crate::resources::wire::minutes(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str) -> Step {
        Step::WriteFile(crate::resources::file::WriteFileStep {
            path: path.into(),
            content: "[Service]\n".into(),
            owner: "root".into(),
            group: "root".into(),
            mode: 0o644,
        })
    }

    #[test]
    fn the_unit_of_a_service_on_a_switched_generation_is_written_by_the_switch() {
        let links = BTreeMap::from([(
            "/root/ml-env".to_string(),
            "/root/.provision-generations/ml-env-0123456789ab".to_string(),
        )]);
        let unit = "/etc/systemd/system/sglang-qwen.service";
        let service: crate::resources::service::ServiceSpec =
            serde_json::from_value(serde_json::json!({
                "unit": "sglang-qwen.service",
                "unit_path": unit,
                "exec_start": ["/root/ml-env/bin/python3"],
                "environment": [],
                "working_directory": "/root",
                "preflight": {
                    "venv": links["/root/ml-env"],
                    "links": links,
                    "model_path": "/shared/models/x",
                    "tp": 1,
                    "timeout_ms": 1000,
                },
            }))
            .unwrap();
        let deploy = Step::DeployService(Box::new(crate::resources::service::deploy::Deploy {
            service,
            restart: true,
            wait_first: false,
            rollback: true,
        }));
        let steps = vec![
            write(unit),
            write("/etc/other.conf"),
            Step::SwitchGeneration(SwitchGenerationStep {
                links: links.clone(),
                units: Vec::new(),
            }),
            deploy.clone(),
        ];
        let out = switch_last(steps);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0], write("/etc/other.conf"));
        match &out[1] {
            Step::SwitchGeneration(SwitchGenerationStep { links: l, units }) => {
                assert_eq!(l, &links);
                assert_eq!(units.len(), 1);
                assert_eq!(units[0].path, unit);
            }
            other => panic!("the switch is not second: {other:?}"),
        }
        assert_eq!(out[2], deploy);
        // Without a switch, the unit is written where it was.
        let plain = switch_last(vec![write(unit), deploy.clone()]);
        assert_eq!(plain, vec![write(unit), deploy]);
    }
}
