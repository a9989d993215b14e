//! A container provision created and that the inventory no longer declares.
//!
//! Found in the node's listing ([`crate::resources::wire::Probe::PveCreated`]): a container
//! whose description carries provision's marker naming its own vmid
//! ([`super::container::marker_created`]) and whose vmid no container of the inventory has.
//! It is a [`Removal`] of an [`Entry::Container`], planned as its own `container.<hostname>`
//! target: while it runs it is a `-` change that apply refuses without `--allow-destroy`
//! (it may hold the GPUs or the address a declared container needs); stopped, it is only
//! named, and kept. With `--allow-destroy` it is stopped and destroyed through the node's
//! API; bind-mounted host paths are never deleted (Proxmox's destroy leaves them alone).
//! A container provision did not create is never named.

use super::container::{PveContainerFact, marker_created};
use super::managed::{Entry, Removal};
use super::wire::{Facts, NotRead};
use super::{Delta, Resource};
use crate::plan::{Action, Attribute};

/// The host paths bind-mounted into `found` (`mpN: /host/path,mp=...`), with their key:
/// data destroy never touches.
pub fn bind_mounts(found: &PveContainerFact) -> Vec<String> {
    found
        .config
        .iter()
        .filter(|(k, _)| pve::options::indexed(k, "mp"))
        .filter_map(|(k, v)| {
            let volume = v.split(',').next().unwrap_or("");
            volume.starts_with('/').then(|| format!("{volume} ({k})"))
        })
        .collect()
}

/// What the plan says about a kept container no longer declared.
pub fn kept_note(entry: &Entry, binds: &[String]) -> String {
    let Entry::Container {
        vmid,
        node,
        hostname,
        created,
        owner,
    } = entry
    else {
        return String::new();
    };
    let data = match binds.is_empty() {
        true => "host bind-mounted data kept".to_string(),
        false => format!("host bind-mounted data kept: {}", binds.join(", ")),
    };
    format!(
        "container {vmid} `{hostname}` on node {node}, created by provision from {owner} on {created}, is no longer declared: kept; `--allow-destroy` destroys it ({data})"
    )
}

fn found<'a>(r: &Removal, facts: &'a Facts) -> Result<Option<&'a PveContainerFact>, NotRead> {
    let Entry::Container { vmid, owner, .. } = &r.entry else {
        return Ok(None);
    };
    // Gone, or no longer provision's (its marker was taken away): nothing to say.
    Ok(facts
        .pve_container(&r.probes()[0])?
        .filter(|f| marker_created(f, *vmid, owner).is_some()))
}

/// The removal's change: destroy with `--allow-destroy`; without it, a `-` change that
/// apply refuses while the container runs, and nothing while it is stopped.
pub fn diff(r: &Removal, facts: &Facts) -> Result<Option<Delta>, NotRead> {
    let Some(f) = found(r, facts)? else {
        return Ok(None);
    };
    if !r.prune && !f.running {
        return Ok(None);
    }
    let status = if f.running { "running" } else { "stopped" };
    let mut d = Delta::new(Action::Delete)
        .attr(Attribute::change(
            "status",
            Some(status.into()),
            Some("destroyed".into()),
        ))
        .reason("created by provision, no longer declared");
    d = match r.prune {
        true => d.reason(
            "destroyed (--allow-destroy): stopped, then its own volumes removed; bind-mounted host paths are kept",
        ),
        false => d.reason(
            "it runs: apply refuses to go on without --allow-destroy (nothing is changed); stop it to keep it",
        ),
    };
    Ok(Some(d))
}

/// The kept note, while the container is kept (no `--allow-destroy`).
pub fn warnings(r: &Removal, facts: &Facts) -> Vec<String> {
    match (r.prune, found(r, facts)) {
        (false, Ok(Some(f))) => vec![kept_note(&r.entry, &bind_mounts(f))],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::container::marker_description;
    use crate::resources::wire::{Fact, Probe};

    fn fact(description: &str, running: bool) -> PveContainerFact {
        PveContainerFact {
            config: vec![
                ("description".into(), description.into()),
                ("hostname".into(), "llm-old".into()),
                ("mp0".into(), "/srv/models,mp=/models".into()),
                (
                    "mp1".into(),
                    "local:9266/vm-9266-disk-1.raw,mp=/data".into(),
                ),
            ],
            pending: Default::default(),
            pending_delete: Vec::new(),
            digest: "d".into(),
            running,
            misplaced: None,
        }
    }

    fn removal(prune: bool) -> Removal {
        Removal {
            entry: Entry::Container {
                vmid: 9266,
                node: "pve1".into(),
                hostname: "llm-old".into(),
                created: "2026-01-01T00:00:00Z".into(),
                owner: "/inv.yaml".into(),
            },
            prune,
            absent: false,
        }
    }

    fn facts(f: PveContainerFact) -> Facts {
        Facts::Read(
            [(
                Probe::PveContainer(crate::resources::container::PveContainerProbe { vmid: 9266 }),
                Fact::PveContainer(Some(f)),
            )]
            .into(),
        )
    }

    #[test]
    fn a_running_one_is_a_change_a_stopped_one_is_named_and_a_copy_is_not_ours() {
        let ours = marker_description("t", 9266, "2026-01-01T00:00:00Z", "/inv.yaml");
        let running = facts(fact(&ours, true));
        let d = diff(&removal(false), &running).unwrap().unwrap();
        assert_eq!(d.action, Action::Delete);
        assert_eq!(
            warnings(&removal(false), &running),
            [
                "container 9266 `llm-old` on node pve1, created by provision from /inv.yaml on 2026-01-01T00:00:00Z, is no longer declared: kept; `--allow-destroy` destroys it (host bind-mounted data kept: /srv/models (mp0))"
            ]
        );
        let stopped = facts(fact(&ours, false));
        assert_eq!(diff(&removal(false), &stopped).unwrap(), None);
        assert_eq!(warnings(&removal(false), &stopped).len(), 1);
        assert!(diff(&removal(true), &stopped).unwrap().is_some());
        assert!(warnings(&removal(true), &stopped).is_empty());
        // A clone carries the description of the container it was copied from.
        let copy = marker_description("t", 129, "2026-01-01T00:00:00Z", "/inv.yaml");
        let copied = facts(fact(&copy, true));
        assert_eq!(diff(&removal(true), &copied).unwrap(), None);
        assert!(warnings(&removal(false), &copied).is_empty());
        // Another inventory's container on the same node is not this one's.
        let theirs = marker_description("t", 9266, "2026-01-01T00:00:00Z", "/other.yaml");
        assert_eq!(
            diff(&removal(true), &facts(fact(&theirs, true))).unwrap(),
            None
        );
    }
}
