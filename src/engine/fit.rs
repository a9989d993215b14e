//! The plan's fit check: a model to be downloaded is fetched beside what stays (the model it
//! replaces still serves until the switch, the last step), so before anything changes the
//! plan knows the bytes still to fetch (the hub's listing minus what is in the folder) and
//! the free space of the filesystem that holds the folder (the agent's statvfs, read with
//! the other probes). What does not fit is a conflict apply refuses, with the numbers and
//! the ways on: `--prune-models` when the folders no longer declared free enough, or
//! `--allow-downtime` when only stopping the service that holds a folder frees it (a
//! deleted folder a server still has open frees nothing until it stops).

use std::collections::BTreeMap;

use super::DesiredTarget;
use crate::hub::error::size;
use crate::plan::{Change, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::managed::{Entry, Removal};
use crate::resources::model::{FreeSpace, ModelSpec};
use crate::resources::wire::{Fact, Facts, NotRead, Probe};

/// The flags that open ways on when a download does not fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ways {
    /// `--prune-models`: the folders no longer declared are deleted (before the download).
    pub prune_models: bool,
    /// `--allow-downtime`: a service holding a folder to be deleted is stopped first.
    pub allow_downtime: bool,
}

/// One model folder no longer declared, as the check counts it.
struct Gone {
    path: String,
    bytes: u64,
    prune: bool,
    /// The running units whose loaded `ExecStart` names the folder.
    held_by: Vec<String>,
}

/// Checks `plan`'s model downloads against the free space read in `facts`: a download that
/// does not fit gets a conflict (apply refuses it, `check` reports it); one that fits only
/// with the services holding a deleted folder stopped first (`--allow-downtime`) gets those
/// stops in front of the plan. `listed` is the hub's byte count of a model's selection.
pub fn check(
    d: &DesiredTarget,
    facts: &Facts,
    plan: &mut TargetPlan,
    ways: Ways,
    listed: &dyn Fn(&ModelSpec) -> Result<u64, String>,
) -> Result<(), NotRead> {
    let Facts::Read(map) = facts else {
        return Ok(());
    };
    // Per filesystem: its free space and the downloads' (change index, bytes to fetch).
    let mut need: BTreeMap<u64, (FreeSpace, Vec<(usize, u64)>)> = BTreeMap::new();
    for (i, c) in plan.changes.iter_mut().enumerate() {
        let ResourceSpec::Model(m) = &c.spec else {
            continue;
        };
        let (fs, fetch) = match to_fetch(m, facts, listed)? {
            None => continue,
            Some((_, Err(why))) => {
                c.warnings
                    .push(format!("size not known (the hub's listing: {why})"));
                continue;
            }
            Some((fs, Ok(fetch))) => (fs, fetch),
        };
        c.reasons.push(format!(
            "{} to fetch, {} free on {}",
            size(fetch),
            size(fs.free),
            fs.dir
        ));
        need.entry(fs.fsid)
            .or_insert_with(|| (fs.clone(), Vec::new()))
            .1
            .push((i, fetch));
    }
    if need.is_empty() {
        return Ok(());
    }
    // The folders no longer declared, by filesystem.
    let mut gone: BTreeMap<u64, Vec<Gone>> = BTreeMap::new();
    for r in &d.resources {
        let ResourceSpec::Removed(
            removal @ Removal {
                entry: Entry::Model { path, .. },
                ..
            },
        ) = &r.spec
        else {
            continue;
        };
        let Some(bytes) = removal.model_bytes(facts)? else {
            continue;
        };
        let Some(fs) =
            facts.free_space(&Probe::FreeSpace(crate::resources::model::FreeSpaceProbe {
                path: path.clone(),
            }))?
        else {
            continue;
        };
        // Held: a running unit's `ExecStart` names it (it may not have opened its files
        // yet), or the kernel says a process has a file under it open or mapped.
        let mut held_by = holders(map, path);
        let open = facts.holders(&Probe::Holders(crate::resources::holders::HoldersProbe {
            path: path.clone(),
        }))?;
        held_by.extend(open.into_iter().flatten().cloned());
        held_by.sort();
        held_by.dedup();
        gone.entry(fs.fsid).or_default().push(Gone {
            path: path.clone(),
            bytes,
            prune: removal.prune,
            held_by,
        });
    }
    // The services `--allow-downtime` may stop: this inventory's, declared or on their way
    // out (the units the read asked about).
    let ours: Vec<&str> = map
        .keys()
        .filter_map(|p| match p {
            Probe::Unit(crate::resources::service::UnitProbe { name }) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let stoppable = |g: &Gone| g.held_by.iter().all(|h| ours.contains(&h.as_str()));
    let mut stops: Vec<String> = Vec::new();
    for (fsid, (fs, downloads)) in need {
        let fetch: u64 = downloads.iter().map(|(_, b)| b).sum();
        if fetch <= fs.free {
            continue;
        }
        let gone = gone.remove(&fsid).unwrap_or_default();
        let sum = |f: &dyn Fn(&Gone) -> bool| -> u64 {
            gone.iter().filter(|g| f(g)).map(|g| g.bytes).sum()
        };
        let free_now = fs.free + sum(&|g| g.prune && g.held_by.is_empty());
        let with_prune = fs.free + sum(&|g| g.held_by.is_empty());
        let with_stop = fs.free + sum(&|g| g.prune && stoppable(g));
        let with_both = fs.free + sum(&|g| stoppable(g));
        let with_all = fs.free + sum(&|_| true);
        if fetch <= free_now {
            continue;
        }
        if ways.allow_downtime && fetch <= with_stop {
            for g in gone.iter().filter(|g| g.prune && stoppable(g)) {
                for u in &g.held_by {
                    if !stops.contains(u) {
                        stops.push(u.clone());
                    }
                }
            }
            continue;
        }
        let names = |f: &dyn Fn(&Gone) -> bool| -> String {
            let list: Vec<String> = gone
                .iter()
                .filter(|g| f(g))
                .map(|g| format!("{} ({})", g.path, size(g.bytes)))
                .collect();
            list.join(", ")
        };
        let mut why = format!(
            "does not fit: needs {}, {} free on {}",
            size(fetch),
            size(fs.free),
            fs.dir
        );
        if !ways.prune_models && fetch <= with_prune {
            why.push_str(&format!(
                "; pass --prune-models: it deletes the model folders no longer declared ({}) before the download",
                names(&|g| g.held_by.is_empty())
            ));
        } else if fetch <= with_both {
            let mut units: Vec<&str> = gone
                .iter()
                .flat_map(|g| g.held_by.iter().map(String::as_str))
                .collect();
            units.sort_unstable();
            units.dedup();
            why.push_str(&format!(
                "; {} holds {}: pass --allow-downtime{} to stop it first, delete the folder, download, then start it (the service is down meanwhile)",
                units.join(", "),
                names(&|g| !g.held_by.is_empty()),
                if ways.prune_models { "" } else { " --prune-models" },
            ));
        } else if fetch <= with_all {
            let others: Vec<String> = gone
                .iter()
                .filter(|g| !stoppable(g))
                .map(|g| format!("{} holds {}", g.held_by.join(", "), g.path))
                .collect();
            why.push_str(&format!(
                "; {}, which this inventory does not manage: stop it, then plan again",
                others.join("; ")
            ));
        } else {
            why.push_str(&format!(
                "; even the model folders no longer declared free only {}: free space there or select fewer files (include/exclude)",
                size(with_both - fs.free)
            ));
        }
        for (i, _) in downloads {
            let c = &mut plan.changes[i];
            c.warnings.push(format!("refused: {why}"));
            c.typed = Some(crate::resources::Typed::Conflict { why: why.clone() });
        }
    }
    if stops.is_empty() {
        return Ok(());
    }
    // The services that hold a folder to be deleted stop before anything else: stop ->
    // removals -> download -> deploy -> gate.
    let mut front: Vec<Change> = Vec::new();
    for unit in stops {
        let stop = DesiredTarget {
            target: d.target.clone(),
            resources: vec![super::Desired {
                spec: ResourceSpec::Removed(Removal {
                    entry: Entry::Service { unit: unit.clone() },
                    prune: false,
                    absent: false,
                }),
                role: None,
            }],
        };
        for mut c in super::diff_target(&stop, facts)?.changes {
            // A declared service is only stopped here: its deploy later starts it again.
            c.reasons = vec![format!(
                "--allow-downtime: stopped first, so the folder it holds frees its space; {unit} is down until it is deployed again and passes its gate"
            )];
            if plan.changes.iter().all(|p| p.address != c.address) {
                front.push(c);
            } else {
                c.warnings
                    .push(format!("{unit} is down from here until its deploy below"));
                front.push(c);
            }
        }
    }
    plan.changes.splice(0..0, front);
    Ok(())
}

/// A download's filesystem (as read) and the bytes still to fetch there, or why the hub
/// could not be listed.
type ToFetch = (FreeSpace, Result<u64, String>);

/// Where a download of `m` goes and the bytes still to fetch there (the hub's listing minus
/// what the folder holds); `None` when the facts carry no free space (offline).
fn to_fetch(
    m: &ModelSpec,
    facts: &Facts,
    listed: &dyn Fn(&ModelSpec) -> Result<u64, String>,
) -> Result<Option<ToFetch>, NotRead> {
    let Some(fs) =
        facts.free_space(&Probe::FreeSpace(crate::resources::model::FreeSpaceProbe {
            path: m.path.clone(),
        }))?
    else {
        return Ok(None);
    };
    let have = facts
        .folder_size(&Probe::FolderSize(
            crate::resources::managed::FolderSizeProbe {
                path: m.path.clone(),
            },
        ))?
        .copied()
        .unwrap_or(0);
    Ok(Some((
        fs.clone(),
        listed(m).map(|total| total.saturating_sub(have)),
    )))
}

/// A saved plan's apply, on the target read again: whether the plan's downloads still fit
/// (free bytes are left out of the read digest, as they move with any write). The folders
/// the plan deletes count as freed; a download the plan already refused is not counted.
/// `Some(why)` when one no longer does: the saved plan is refused before anything runs.
pub fn still_fits(
    plan: &TargetPlan,
    facts: &Facts,
    listed: &dyn Fn(&ModelSpec) -> Result<u64, String>,
) -> Result<Option<String>, NotRead> {
    let mut need: BTreeMap<u64, (FreeSpace, u64, Vec<String>)> = BTreeMap::new();
    let mut freed: BTreeMap<u64, u64> = BTreeMap::new();
    for c in &plan.changes {
        match &c.spec {
            ResourceSpec::Model(m)
                if !matches!(c.typed, Some(crate::resources::Typed::Conflict { .. })) =>
            {
                if let Some((fs, Ok(fetch))) = to_fetch(m, facts, listed)? {
                    let n = need.entry(fs.fsid).or_insert((fs, 0, Vec::new()));
                    n.1 += fetch;
                    n.2.push(m.path.clone());
                }
            }
            ResourceSpec::Removed(
                removal @ Removal {
                    entry: Entry::Model { path, .. },
                    ..
                },
            ) => {
                let fs = facts.free_space(&Probe::FreeSpace(
                    crate::resources::model::FreeSpaceProbe { path: path.clone() },
                ))?;
                if let (Some(fs), Some(bytes)) = (fs, removal.model_bytes(facts)?) {
                    *freed.entry(fs.fsid).or_default() += bytes;
                }
            }
            _ => {}
        }
    }
    for (fsid, (fs, fetch, paths)) in need {
        let room = fs.free + freed.get(&fsid).copied().unwrap_or(0);
        if fetch > room {
            return Ok(Some(format!(
                "{} no longer fit{}: needs {}, {} free on {} now",
                paths.join(", "),
                if paths.len() == 1 { "s" } else { "" },
                size(fetch),
                size(fs.free),
                fs.dir
            )));
        }
    }
    Ok(None)
}

/// The bytes of `m`'s selection as the hub lists it: one listing per model, read from the
/// workstation (the token resolved here and sent only to the hub's origin; never shown).
pub fn listed(m: &ModelSpec) -> Result<u64, String> {
    let pull = m.pull(false).map_err(|e| e.to_string())?;
    crate::hub::listed_bytes(&pull.request()).map_err(|e| e.to_string())
}

/// The running units whose loaded `ExecStart` names `path`.
fn holders(map: &std::collections::HashMap<Probe, Fact>, path: &str) -> Vec<String> {
    let mut units: Vec<String> = map
        .iter()
        .filter_map(|(p, f)| match (p, f) {
            (Probe::Unit(crate::resources::service::UnitProbe { name }), Fact::Unit(Some(u))) => {
                let prop = |k: &str| u.properties.get(k).map_or("", String::as_str);
                let running = !matches!(prop("ActiveState"), "inactive" | "failed" | "");
                (running && names_path(prop("ExecStart"), path)).then(|| name.clone())
            }
            _ => None,
        })
        .collect();
    units.sort();
    units.dedup();
    units
}

/// Whether an `ExecStart` line names `path` (itself or a file under it).
fn names_path(exec: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    exec.match_indices(path).any(|(i, _)| {
        let after = exec[i + path.len()..].chars().next();
        matches!(after, None | Some('/' | ' ' | ';' | '"' | '\'' | ']'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Action, Target};
    use crate::resources::service::UnitFact;

    fn model(path: &str) -> ModelSpec {
        ModelSpec {
            repo: "o/b".into(),
            revision: "main".into(),
            include: Vec::new(),
            exclude: Vec::new(),
            path: path.into(),
            endpoint: "http://127.0.0.1:1".into(),
            token: None,
        }
    }

    fn target(resources: Vec<ResourceSpec>) -> DesiredTarget {
        DesiredTarget {
            target: Target::Guest {
                name: "t".into(),
                address: "root@h:22".into(),
            },
            resources: resources
                .into_iter()
                .map(|spec| super::super::Desired { spec, role: None })
                .collect(),
        }
    }

    fn gone(path: &str, prune: bool) -> ResourceSpec {
        ResourceSpec::Removed(Removal {
            entry: Entry::Model {
                path: path.into(),
                repo: "o/a".into(),
            },
            prune,
            absent: false,
        })
    }

    /// B (1000 bytes to fetch) next to A (600 bytes, no longer declared) with 500 free;
    /// A held by `llm.service` when `held`.
    fn facts(held: bool) -> Facts {
        facts_open(held, &[])
    }

    /// As [`facts`], with the kernel's holders of A's files (`open`).
    fn facts_open(held: bool, open: &[&str]) -> Facts {
        let fs = |free| {
            Fact::FreeSpace(Some(FreeSpace {
                dir: "/shared".into(),
                free,
                fsid: 7,
            }))
        };
        let unit = UnitFact {
            properties: [
                ("ActiveState".to_string(), "active".to_string()),
                (
                    "ExecStart".to_string(),
                    match held {
                        true => "{ path=/srv/server ; argv[]=/srv/server --model /shared/a ; }",
                        false => "{ path=/srv/server ; argv[]=/srv/server --model /shared/c ; }",
                    }
                    .to_string(),
                ),
                ("UnitFileState".to_string(), "enabled".to_string()),
            ]
            .into(),
            process: None,
        };
        Facts::Read(
            [
                (
                    Probe::Model(crate::resources::model::ModelProbe {
                        path: "/shared/b".into(),
                    }),
                    Fact::Model(None),
                ),
                (
                    Probe::FreeSpace(crate::resources::model::FreeSpaceProbe {
                        path: "/shared/b".into(),
                    }),
                    fs(500),
                ),
                (
                    Probe::FreeSpace(crate::resources::model::FreeSpaceProbe {
                        path: "/shared/a".into(),
                    }),
                    fs(500),
                ),
                (
                    Probe::FolderSize(crate::resources::managed::FolderSizeProbe {
                        path: "/shared/b".into(),
                    }),
                    Fact::FolderSize(None),
                ),
                (
                    Probe::FolderSize(crate::resources::managed::FolderSizeProbe {
                        path: "/shared/a".into(),
                    }),
                    Fact::FolderSize(Some(600)),
                ),
                (
                    Probe::Unit(crate::resources::service::UnitProbe {
                        name: "llm.service".into(),
                    }),
                    Fact::Unit(Some(unit)),
                ),
                (
                    Probe::Holders(crate::resources::holders::HoldersProbe {
                        path: "/shared/a".into(),
                    }),
                    Fact::Holders(Some(open.iter().map(|h| h.to_string()).collect())),
                ),
            ]
            .into(),
        )
    }

    fn planned(d: &DesiredTarget, facts: &Facts, ways: Ways) -> TargetPlan {
        let mut plan = super::super::diff_target(d, facts).unwrap();
        check(d, facts, &mut plan, ways, &|_| Ok(1000)).unwrap();
        plan
    }

    fn conflict(plan: &TargetPlan) -> Option<String> {
        plan.changes.iter().find_map(|c| match &c.typed {
            Some(crate::resources::Typed::Conflict { why }) => Some(why.clone()),
            _ => None,
        })
    }

    #[test]
    fn a_download_that_does_not_fit_names_the_numbers_and_prune_models() {
        let d = target(vec![
            gone("/shared/a", false),
            ResourceSpec::Model(model("/shared/b")),
        ]);
        let why = conflict(&planned(&d, &facts(false), Ways::default())).unwrap();
        assert!(why.contains("needs 1000 B, 500 B free on /shared"), "{why}");
        assert!(why.contains("--prune-models"), "{why}");
        assert!(!why.contains("--allow-downtime"), "{why}");
        let d = target(vec![
            gone("/shared/a", true),
            ResourceSpec::Model(model("/shared/b")),
        ]);
        let plan = planned(
            &d,
            &facts(false),
            Ways {
                prune_models: true,
                allow_downtime: false,
            },
        );
        assert_eq!(conflict(&plan), None);
        // The removal comes before the download.
        assert_eq!(plan.changes[0].action, Action::Delete);
        assert_eq!(plan.changes[1].kind, "model");
    }

    #[test]
    fn a_folder_a_running_service_holds_frees_space_only_with_allow_downtime() {
        let d = target(vec![
            gone("/shared/a", true),
            ResourceSpec::Model(model("/shared/b")),
        ]);
        let ways = Ways {
            prune_models: true,
            allow_downtime: false,
        };
        let why = conflict(&planned(&d, &facts(true), ways)).unwrap();
        assert!(why.contains("llm.service holds /shared/a"), "{why}");
        assert!(
            why.contains("pass --allow-downtime to stop it first"),
            "{why}"
        );
        let plan = planned(
            &d,
            &facts(true),
            Ways {
                allow_downtime: true,
                ..ways
            },
        );
        assert_eq!(conflict(&plan), None);
        let order: Vec<&str> = plan.changes.iter().map(|c| c.address.as_str()).collect();
        assert_eq!(
            order,
            [
                "guest.t/service:llm.service",
                "guest.t/model:/shared/a",
                "guest.t/model:/shared/b"
            ]
        );
    }

    #[test]
    fn a_folder_held_open_counts_as_held_whatever_exec_start_names() {
        let d = target(vec![
            gone("/shared/a", true),
            ResourceSpec::Model(model("/shared/b")),
        ]);
        let prune = Ways {
            prune_models: true,
            allow_downtime: false,
        };
        let both = Ways {
            allow_downtime: true,
            ..prune
        };
        // llm.service's ExecStart names another folder, but the kernel says it has A's
        // files open: deleting A frees nothing while it runs.
        let held = facts_open(false, &["llm.service"]);
        let why = conflict(&planned(&d, &held, prune)).unwrap();
        assert!(why.contains("llm.service holds /shared/a"), "{why}");
        let plan = planned(&d, &held, both);
        assert_eq!(conflict(&plan), None);
        assert_eq!(plan.changes[0].address, "guest.t/service:llm.service");
        // A process outside any service: --allow-downtime cannot stop it.
        let stray = facts_open(false, &["process python3"]);
        let why = conflict(&planned(&d, &stray, both)).unwrap();
        assert!(
            why.contains("process python3 holds /shared/a, which this inventory does not manage"),
            "{why}"
        );
        assert!(!why.contains("pass --allow-downtime"), "{why}");
    }

    #[test]
    fn a_saved_plan_is_checked_against_the_free_space_read_again() {
        let d = target(vec![
            gone("/shared/a", true),
            ResourceSpec::Model(model("/shared/b")),
        ]);
        let ways = Ways {
            prune_models: true,
            allow_downtime: false,
        };
        // Made with 500 free and A's 600 to be deleted: B's 1000 fit.
        let plan = planned(&d, &facts(false), ways);
        assert_eq!(conflict(&plan), None);
        assert_eq!(
            still_fits(&plan, &facts(false), &|_| Ok(1000)).unwrap(),
            None
        );
        // Read again with the free space gone to something else meanwhile.
        let Facts::Read(mut map) = facts(false) else {
            unreachable!()
        };
        for (p, f) in map.iter_mut() {
            if matches!(p, Probe::FreeSpace(_)) {
                *f = Fact::FreeSpace(Some(FreeSpace {
                    dir: "/shared".into(),
                    free: 300,
                    fsid: 7,
                }));
            }
        }
        let why = still_fits(&plan, &Facts::Read(map), &|_| Ok(1000))
            .unwrap()
            .unwrap();
        assert_eq!(
            why,
            "/shared/b no longer fits: needs 1000 B, 300 B free on /shared now"
        );
    }

    #[test]
    fn what_fits_or_is_offline_is_left_alone() {
        let d = target(vec![ResourceSpec::Model(model("/shared/b"))]);
        let mut plan = super::super::diff_target(&d, &facts(false)).unwrap();
        check(&d, &facts(false), &mut plan, Ways::default(), &|_| Ok(400)).unwrap();
        assert_eq!(conflict(&plan), None);
        assert!(
            plan.changes[0]
                .reasons
                .iter()
                .any(|r| r == "400 B to fetch, 500 B free on /shared")
        );
        let mut offline = super::super::diff_target(&d, &Facts::Empty).unwrap();
        check(&d, &Facts::Empty, &mut offline, Ways::default(), &|_| {
            Ok(1000)
        })
        .unwrap();
        assert_eq!(conflict(&offline), None);
        assert!(
            offline.changes[0]
                .reasons
                .iter()
                .any(|r| r.starts_with("size not known offline"))
        );
    }

    #[test]
    fn an_exec_start_names_a_folder_not_a_longer_one() {
        assert!(names_path("argv[]=/s --model /shared/a ;", "/shared/a"));
        assert!(names_path("argv[]=/s --model=/shared/a/ ;", "/shared/a"));
        assert!(!names_path("argv[]=/s --model /shared/ab ;", "/shared/a"));
    }
}
