//! Guests that start from nothing: the guest of a container that this plan creates or
//! replaces is whatever the template holds, not what is inside the container today. Its
//! plan is made against the empty world (every resource to create), and applying a saved
//! plan does not try to read it again: the container's own read already says whether the
//! container is still absent, or still the one to replace.

use super::{DesiredTarget, diff_target};
use crate::plan::{Action, ReadStamp, Target, TargetPlan};
use crate::resources::ResourceSpec;
use crate::resources::wire::Facts;

/// Whether guest target `guest` belongs to a container that `plans` create or replace.
pub fn starts_empty<'p>(guest: &Target, plans: impl IntoIterator<Item = &'p TargetPlan>) -> bool {
    let Target::Guest { name, .. } = guest else {
        return false;
    };
    plans.into_iter().any(|p| {
        matches!(&p.target, Target::Container { name: n, .. } if n == name)
            && p.changes.iter().any(|c| {
                matches!(c.spec, ResourceSpec::Container(_))
                    && matches!(c.action, Action::Create | Action::Replace)
            })
    })
}

/// Whether `stamp` records the empty world: what a guest planned as new was read as.
pub fn read_empty(stamp: &ReadStamp) -> bool {
    Facts::Empty
        .digest(&stamp.probes)
        .is_ok_and(|d| d == stamp.digest)
}

/// Plans again, against the empty world, the guest of every container that `plans`
/// replace: the guest read over SSH is the one the replace destroys, so a plan made from
/// it would only carry the differences and leave the new guest half-built. A container
/// being created has its guest planned as new already (nothing answered).
pub fn replan_replaced_guests(desired: &[DesiredTarget], plans: &mut [TargetPlan]) {
    let replaced: Vec<String> = plans
        .iter()
        .filter(|p| {
            p.changes.iter().any(|c| {
                matches!(c.spec, ResourceSpec::Container(_)) && c.action == Action::Replace
            })
        })
        .map(|p| p.target.names().1)
        .collect();
    for p in plans.iter_mut() {
        let Target::Guest { name, .. } = &p.target else {
            continue;
        };
        if !replaced.contains(name) {
            continue;
        }
        let Some(d) = desired.iter().find(|d| d.target == p.target) else {
            continue;
        };
        let verify_full = p.read.as_ref().is_some_and(|r| r.verify_full);
        let probes = d.probes();
        let mut fresh = diff_target(d, &Facts::Empty).expect(EMPTY_ANSWERS);
        fresh.manages = super::removal::record(d, &Facts::Empty);
        fresh.read = Some(ReadStamp {
            digest: Facts::Empty.digest(&probes).expect(EMPTY_ANSWERS),
            probes,
            verify_full,
            prune_models: false,
        });
        fresh.replanned = Some(format!(
            "container.{name} is replaced, so its guest is planned as new (everything is built again on the new container)"
        ));
        *p = fresh;
    }
}

const EMPTY_ANSWERS: &str = "the empty world answers every probe";
