//! A running container that apply reboots (new root-only lines, or changes Proxmox keeps
//! pending until a restart, with `restart: allowed`) takes its guest's services down and
//! brings them up again at its boot. What the boot brings up is not taken on trust: the
//! plan gives the guest every service with a health gate that has no change of its own, as
//! a wait for it to come back ready (restarted only if it hangs, crashes or misses its
//! deadline), and marks the guest as coming back from that reboot, so apply reconnects
//! to it once it has booted instead of using the connection the reboot cut.

use super::DesiredTarget;
use crate::plan::{Action, Attribute, Target, TargetPlan};
use crate::resources::container::RestartPolicy;
use crate::resources::op::bare_change;
use crate::resources::{ResourceSpec, Typed};

/// Whether `p`, a container's plan, reboots it while it runs: its lines change (or go)
/// and `restart` allows it, or its config changes wait for a restart that is allowed
/// (typed by the container's diff). A container created, replaced or started from
/// stopped is booted, not rebooted: its guest is planned from that.
pub fn reboots(p: &TargetPlan, restart: RestartPolicy) -> bool {
    if !matches!(p.target, Target::Container { .. }) {
        return false;
    }
    let mut lines = false;
    for c in &p.changes {
        match (&c.spec, &c.typed) {
            (ResourceSpec::Container(_), _)
                if matches!(c.action, Action::Create | Action::Replace) =>
            {
                return false;
            }
            (ResourceSpec::Container(_), Some(Typed::Container { start: true, .. })) => {
                return false;
            }
            (ResourceSpec::Container(_), Some(Typed::Container { reboot: true, .. })) => {
                lines = lines || restart == RestartPolicy::Allowed;
            }
            (spec, _)
                if matches!(spec, ResourceSpec::PveLines(_))
                    || super::removal::removes_lines(spec) =>
            {
                lines = lines || restart == RestartPolicy::Allowed;
            }
            _ => {}
        }
    }
    lines
}

/// Marks the guest of every container that `plans` reboot as coming back from that reboot
/// and adds, for each of its services with a health gate and no change of its own, a wait
/// for it to be ready again after the boot.
pub fn gate_after_reboots(desired: &[DesiredTarget], plans: &mut [TargetPlan]) {
    let rebooted: Vec<(String, u64)> = plans
        .iter()
        .filter_map(|p| {
            let Target::Container { name, vmid, .. } = &p.target else {
                return None;
            };
            let restart = desired
                .iter()
                .find(|d| d.target == p.target)?
                .resources
                .iter()
                .find_map(|r| match &r.spec {
                    ResourceSpec::Container(c) => Some(c.restart),
                    _ => None,
                })?;
            reboots(p, restart).then(|| (name.clone(), *vmid))
        })
        .collect();
    for p in plans.iter_mut() {
        let Target::Guest { name, .. } = &p.target else {
            continue;
        };
        let Some((_, vmid)) = rebooted.iter().find(|(n, _)| n == name) else {
            continue;
        };
        if p.not_read.is_some() {
            continue;
        }
        let Some(d) = desired.iter().find(|d| d.target == p.target) else {
            continue;
        };
        p.after_reboot = Some(*vmid);
        for r in &d.resources {
            let ResourceSpec::Service(svc) = &r.spec else {
                continue;
            };
            let address = d.address(&r.spec);
            let Some(gate) = svc.gate() else {
                continue;
            };
            if p.changes.iter().any(|c| c.address == address) {
                continue;
            }
            p.unchanged = p.unchanged.saturating_sub(1);
            let mut c = bare_change(&p.target.names().0, r.spec.clone(), Action::Update);
            c.role = r.role.clone();
            c.attributes = vec![Attribute::change(
                "state",
                Some("active (running)".into()),
                Some(format!("ready again after CT {vmid}'s reboot")),
            )];
            c.reasons = vec![
                format!(
                    "CT {vmid} reboots (above), which restarts {}: apply waits for it to come back after the boot (a load in progress is not thrown away) and restarts it only if it hangs, crashes or misses its deadline",
                    svc.unit
                ),
                gate,
            ];
            c.typed = Some(Typed::Service {
                restart: true,
                wait_first: true,
            });
            c.address = address;
            p.changes.push(c);
        }
    }
}
