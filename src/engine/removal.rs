//! What a guest's record holds that the inventory no longer declares: read with the
//! target, planned as removals ahead of everything declared (a service that holds a port
//! or GPUs stops before a new one starts), and the record apply writes back.

use super::error::EngineError;
use super::reconcile::Read;
use super::{Desired, DesiredTarget};
use crate::access::TargetReader;
use crate::plan::{ReadStamp, Target, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::managed::{self, Entry, Record, Removal};
use crate::resources::pve_lines;
use crate::resources::wire::{Fact, Facts, Probe};

/// What `plan` does with what the inventory no longer declares.
#[derive(Debug, Clone, Default)]
pub struct Undeclared {
    /// A model folder no longer declared is planned for deletion, not only named.
    pub prune_models: bool,
    /// A container provision created that is no longer declared is planned for destroying
    /// even when it is stopped (a running one always is a change apply refuses without it).
    pub allow_destroy: bool,
    /// Every vmid the inventory declares, on any node (a container found on another node
    /// than declared is misplaced, not undeclared).
    pub declared: Vec<u64>,
    /// The inventory's nodes whose containers are listed for those provision created.
    pub nodes: Vec<String>,
    /// The inventory file the plan is made from (its containers' markers name it).
    pub owner: String,
    /// A model download that fits only once a service holding a folder to be deleted has
    /// stopped is planned with that stop first (`--allow-downtime`).
    pub allow_downtime: bool,
}

/// What the scan of one node found: the plans of the undeclared containers provision
/// created there, and what could not be read, with why.
pub type Scanned = (Vec<TargetPlan>, Vec<(Target, EngineError)>);

/// The node's API, reached as any of its containers is (no spec: nothing declared).
pub fn lister(node: &str) -> DesiredTarget {
    DesiredTarget {
        target: Target::Container {
            node: node.to_string(),
            name: format!("(containers on {node})"),
            vmid: 0,
        },
        resources: Vec::new(),
    }
}

/// The containers provision created on `node` (one of `u.nodes`) that no vmid of
/// `u.declared` is, each planned as its own `container.<hostname>` target with one removal;
/// the node when its listing could not be read, with why.
pub fn scan(node: &str, u: &Undeclared, read: &Read) -> Scanned {
    let mut plans = Vec::new();
    let mut failures = Vec::new();
    let lister = lister(node);
    let probe = Probe::PveCreated(crate::resources::container::PveCreatedProbe {
        except: u.declared.clone(),
    });
    let found = read(&lister)
        .map_err(EngineError::Open)
        .and_then(|r| Ok(r.read(std::slice::from_ref(&probe))?))
        .and_then(|facts| Ok(facts.pve_created(&probe)?.cloned()));
    let created = match found {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            failures.push((lister.target, e));
            return (plans, failures);
        }
    };
    for (vmid, fact) in created {
        if u.declared.contains(&vmid) {
            continue;
        }
        match undeclared_plan(node, vmid, fact, u) {
            Ok(p) => plans.push(p),
            Err(e) => failures.push((
                Target::Container {
                    node: node.to_string(),
                    name: vmid.to_string(),
                    vmid,
                },
                e,
            )),
        }
    }
    (plans, failures)
}

/// The plan of one undeclared container provision created, from its config as listed.
fn undeclared_plan(
    node: &str,
    vmid: u64,
    fact: crate::resources::container::PveContainerFact,
    u: &Undeclared,
) -> Result<TargetPlan, EngineError> {
    let hostname = fact.current("hostname").unwrap_or("").to_string();
    let created =
        crate::resources::container::marker_created(&fact, vmid, &u.owner).unwrap_or_default();
    let removal = Removal {
        entry: Entry::Container {
            vmid,
            node: node.to_string(),
            hostname: hostname.clone(),
            created,
            owner: u.owner.clone(),
        },
        prune: u.allow_destroy,
        absent: false,
    };
    let d = DesiredTarget {
        target: Target::Container {
            node: node.to_string(),
            name: if hostname.is_empty() {
                vmid.to_string()
            } else {
                hostname
            },
            vmid,
        },
        resources: vec![Desired {
            spec: ResourceSpec::Removed(removal),
            role: None,
        }],
    };
    let probes = vec![Probe::PveContainer(
        crate::resources::container::PveContainerProbe { vmid },
    )];
    let facts = Facts::Read([(probes[0].clone(), Fact::PveContainer(Some(fact)))].into());
    let mut plan = super::diff_target(&d, &facts)?;
    plan.read = Some(ReadStamp {
        digest: facts.digest(&probes)?,
        probes,
        verify_full: false,
        prune_models: u.prune_models,
    });
    Ok(plan)
}

/// The removals of the labels whose lines the description of container `vmid` records
/// and that no `pve_lines` of `d` declares. A container with no record (made by an older
/// provision, or adopted) has nothing known to remove.
fn lines_removals(
    d: &DesiredTarget,
    facts: &Facts,
    vmid: u64,
) -> Result<Vec<Desired>, EngineError> {
    let probe = Probe::PveContainer(crate::resources::container::PveContainerProbe { vmid });
    let Ok(Some(found)) = facts.pve_container(&probe) else {
        return Ok(Vec::new());
    };
    let declared: Vec<&str> = d
        .resources
        .iter()
        .filter_map(|r| match &r.spec {
            ResourceSpec::PveLines(l) => Some(l.label.as_str()),
            _ => None,
        })
        .collect();
    Ok(pve_lines::recorded(found.current("description"))
        .into_iter()
        .filter(|(label, _)| !declared.contains(&label.as_str()))
        .map(|(label, lines)| Desired {
            spec: ResourceSpec::Removed(Removal {
                entry: Entry::PveLines { vmid, label, lines },
                prune: false,
                absent: false,
            }),
            role: None,
        })
        .collect())
}

/// Whether `spec` removes a role's lines from a container's config (over node SSH).
pub fn removes_lines(spec: &ResourceSpec) -> bool {
    matches!(
        spec,
        ResourceSpec::Removed(Removal {
            entry: Entry::PveLines { .. },
            ..
        })
    )
}

/// Whether `spec` destroys a container (a removal of an [`Entry::Container`]).
pub fn destroys_container(spec: &ResourceSpec) -> Option<u64> {
    match spec {
        ResourceSpec::Removed(Removal {
            entry: Entry::Container { vmid, .. },
            ..
        }) => Some(*vmid),
        _ => None,
    }
}

/// What [`read_target`] asks `d`'s target first: its resources' probes, and a guest's
/// record of what provision manages there.
pub fn first_probes(d: &DesiredTarget) -> Vec<Probe> {
    let mut probes = d.probes();
    let managed = Probe::Managed(crate::resources::managed::ManagedProbe {});
    if matches!(d.target, Target::Guest { .. }) && !probes.contains(&managed) {
        probes.push(managed);
    }
    probes
}

/// `d`'s probes read on `reader` together with the guest's record, then the probes of what
/// the record holds and `d` no longer declares: `d` with those removals in front, the
/// facts, and every probe read (a saved plan reads them all again).
pub fn read_target(
    d: &DesiredTarget,
    reader: &dyn TargetReader,
    prune_models: bool,
) -> Result<(DesiredTarget, Facts, Vec<Probe>), EngineError> {
    let mut probes = first_probes(d);
    let guest = matches!(d.target, Target::Guest { .. });
    let mut facts = reader.read(&probes)?;
    let mut d = d.clone();
    if let Target::Container { vmid, .. } = d.target {
        // Lines a role no longer declared had provision write, from the record in the
        // container's description (read with its config): removed with the role.
        let gone = lines_removals(&d, &facts, vmid)?;
        d.resources = gone.into_iter().chain(d.resources).collect();
    }
    let record = match guest {
        true => facts
            .managed(&Probe::Managed(crate::resources::managed::ManagedProbe {}))?
            .cloned(),
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

    fn removed(entry: Entry, prune: bool) -> Desired {
        Desired {
            spec: ResourceSpec::Removed(Removal {
                entry,
                prune,
                absent: false,
            }),
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
                    Probe::FolderSize(crate::resources::managed::FolderSizeProbe {
                        path: "/m/old".into(),
                    }),
                    Fact::FolderSize(Some(10)),
                ),
                (
                    Probe::Unit(crate::resources::service::UnitProbe {
                        name: "old.service".into(),
                    }),
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

    /// A node's listing as a reader: records the probes it is asked.
    struct Listing(std::sync::Arc<std::sync::Mutex<Vec<Probe>>>);

    impl TargetReader for Listing {
        fn describe(&self) -> String {
            "a node in memory".into()
        }

        fn read(&self, probes: &[Probe]) -> Result<Facts, crate::access::AccessError> {
            self.0.lock().unwrap().extend(probes.iter().cloned());
            Ok(Facts::Read(
                probes
                    .iter()
                    .map(|p| (p.clone(), Fact::PveCreated(Some(Default::default()))))
                    .collect(),
            ))
        }
    }

    #[test]
    fn the_scan_for_undeclared_containers_does_not_read_the_declared_ones_again() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let u = Undeclared {
            declared: vec![9281, 150],
            nodes: vec!["lab".into()],
            owner: "/srv/inventory.yaml".into(),
            ..Undeclared::default()
        };
        let (plans, failures) = scan("lab", &u, &|_| Ok(Box::new(Listing(asked.clone()))));
        assert!(plans.is_empty() && failures.is_empty());
        assert_eq!(
            *asked.lock().unwrap(),
            [Probe::PveCreated(
                crate::resources::container::PveCreatedProbe {
                    except: vec![9281, 150]
                }
            )]
        );
    }

    /// The scan of a node for undeclared containers is a job of the plan's schedule: with
    /// room for two reads it runs beside a declared target's read (which here waits for
    /// the scan to be asked, an event, not a sleep); one read at a time, after them.
    #[test]
    fn the_scan_runs_beside_the_declared_reads_when_there_is_room() {
        use crate::engine::schedule::Limits;
        use std::sync::{Mutex, mpsc};
        let u = Undeclared {
            declared: vec![150],
            nodes: vec!["lab".into()],
            owner: "/srv/inventory.yaml".into(),
            ..Undeclared::default()
        };
        let desired = [DesiredTarget {
            target: Target::Guest {
                name: "llm".into(),
                address: "10.0.0.5".into(),
            },
            resources: Vec::new(),
        }];
        let run = |limits: Limits| -> Vec<&'static str> {
            let order = Mutex::new(Vec::new());
            let (asked, scan_asked) = mpsc::channel();
            let asked = Mutex::new(asked);
            let scan_asked = Mutex::new(scan_asked);
            let asked_probes = std::sync::Arc::new(Mutex::new(Vec::new()));
            let read = |d: &DesiredTarget| -> Result<Box<dyn TargetReader>, crate::engine::error::OpenError> {
                if d.target == lister("lab").target {
                    order.lock().unwrap().push("scan");
                    asked.lock().unwrap().send(()).unwrap();
                    return Ok(Box::new(Listing(asked_probes.clone())));
                }
                let waited = match limits.parallelism > 1 {
                    true => scan_asked
                        .lock()
                        .unwrap()
                        .recv_timeout(std::time::Duration::from_secs(30))
                        .is_ok(),
                    false => false,
                };
                order
                    .lock()
                    .unwrap()
                    .push(if waited { "declared, after the scan began" } else { "declared" });
                Ok(Box::new(crate::access::EmptyWorld { not_read: None }))
            };
            let planned =
                crate::engine::reconcile::plan("inv.yaml", &desired, false, &u, &limits, &read);
            assert!(planned.failures.is_empty(), "{:?}", planned.failures);
            assert_eq!(planned.plan.targets.len(), 1);
            order.into_inner().unwrap()
        };
        assert_eq!(
            run(Limits::default()),
            ["scan", "declared, after the scan began"]
        );
        assert_eq!(run(Limits::serial()), ["declared", "scan"]);
    }
}
