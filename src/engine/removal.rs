//! What a guest's record holds that the inventory no longer declares: read with the
//! target, planned as removals ahead of everything declared (a service that holds a port
//! or GPUs stops before a new one starts), and the record apply writes back.

use super::{Desired, DesiredTarget};
use crate::access::TargetReader;
use crate::plan::Target;
use crate::resources::ResourceSpec;
use crate::resources::managed::{self, Record};
use crate::resources::wire::{Facts, Probe};

/// `d`'s probes read on `reader` together with the guest's record, then the probes of what
/// the record holds and `d` no longer declares: `d` with those removals in front, the
/// facts, and every probe read (a saved plan reads them all again).
pub fn read_target(
    d: &DesiredTarget,
    reader: &dyn TargetReader,
    prune_models: bool,
) -> Result<(DesiredTarget, Facts, Vec<Probe>), super::error::EngineError> {
    let mut probes = d.probes();
    let guest = matches!(d.target, Target::Guest { .. });
    if guest && !probes.contains(&Probe::Managed {}) {
        probes.push(Probe::Managed {});
    }
    let mut facts = reader.read(&probes)?;
    let mut d = d.clone();
    let record = match guest {
        true => facts.managed(&Probe::Managed {})?.cloned(),
        false => None,
    };
    if let Some(record) = record {
        let declared: Vec<String> = d.resources.iter().map(|r| r.spec.address()).collect();
        let gone = managed::removals(&record, &declared, prune_models);
        let mut more: Vec<Probe> = Vec::new();
        for p in gone.iter().flat_map(crate::resources::Resource::probes) {
            if !probes.contains(&p) && !more.contains(&p) {
                more.push(p);
            }
        }
        if !more.is_empty() {
            let extra = reader.read(&more)?;
            if let (Facts::Read(have), Facts::Read(got)) = (&mut facts, extra) {
                have.extend(got);
            }
            probes.extend(more);
        }
        let removed = gone.into_iter().map(|r| Desired {
            spec: ResourceSpec::Removed(r),
            role: None,
        });
        d.resources = removed.chain(d.resources).collect();
    }
    Ok((d, facts, probes))
}

/// The record apply leaves on a guest planned from `d` and `facts`: what it declares, and
/// the model folders no longer declared that are kept on purpose. `None` for the other
/// targets.
pub fn record(d: &DesiredTarget, facts: &Facts) -> Option<Record> {
    if !matches!(d.target, Target::Guest { .. }) {
        return None;
    }
    let kept = d.resources.iter().filter(|r| match &r.spec {
        ResourceSpec::Removed(gone) => gone.kept(facts),
        _ => true,
    });
    Some(managed::record_of(kept.map(|r| &r.spec)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::managed::{Entry, Removal};
    use crate::resources::wire::Fact;

    fn removed(entry: Entry, prune: bool) -> Desired {
        Desired {
            spec: ResourceSpec::Removed(Removal { entry, prune }),
            role: None,
        }
    }

    #[test]
    fn the_record_keeps_a_model_folder_kept_on_purpose_and_drops_what_is_gone() {
        let model = Entry::Model {
            path: "/m/old".into(),
            repo: "o/old".into(),
        };
        let unit = Entry::Service {
            unit: "old.service".into(),
        };
        let d = |prune| DesiredTarget {
            target: Target::Guest {
                name: "t".into(),
                address: "root@h:22".into(),
            },
            resources: vec![removed(unit.clone(), prune), removed(model.clone(), prune)],
        };
        let facts = Facts::Read(
            [
                (
                    Probe::FolderSize {
                        path: "/m/old".into(),
                    },
                    Fact::FolderSize(Some(10)),
                ),
                (
                    Probe::Unit {
                        name: "old.service".into(),
                    },
                    Fact::Unit(None),
                ),
            ]
            .into(),
        );
        assert_eq!(
            record(&d(false), &facts).unwrap().entries,
            vec![model.clone()]
        );
        assert!(record(&d(true), &facts).unwrap().entries.is_empty());
        // Only guests keep a record.
        let mut node = d(false);
        node.target = Target::Node {
            node: "n".into(),
            api: "https://n:8006".into(),
        };
        assert_eq!(record(&node, &facts), None);
    }
}
