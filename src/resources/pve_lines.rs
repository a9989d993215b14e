//! Lines in a container's Proxmox config that only `root@pam` may set (API tokens get
//! 403): `devN:` device passthrough and raw `lxc.*` keys. Written over SSH to the node.

use super::op::{Allowed, ApiOp, NodeOp, Op};
use serde::{Deserialize, Serialize};

use super::container::PveContainerFact;
use super::managed::{Entry, Removal};
use super::wire::{Facts, NotRead, Probe};
use super::{Delta, Resource, StepsError};
use crate::plan::{Action, Attribute, Change};

/// The prefix of a description line recording one config line provision wrote for a
/// label: `provision: line=<label> <key>: <value>`. The record lives in the container's
/// description (Proxmox keeps it as `#` comment lines on top of `lxc/<vmid>.conf`), so it
/// is written in the same locked file write as the raw lines, travels with the config
/// (a backup, a move to another node) and is read with the config, no extra round trip.
pub const RECORD_PREFIX: &str = "provision: line=";

/// Proxmox's limit on a container's description (`maxLength` of `description` in the
/// config API's schema): the record must fit in it.
pub const MAX_DESCRIPTION: usize = 8192;

/// The lines the description records, per label, in order: `(label, lines)`.
pub fn recorded(description: Option<&str>) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for l in description.unwrap_or_default().lines() {
        let Some((label, line)) = l
            .strip_prefix(RECORD_PREFIX)
            .and_then(|r| r.split_once(' '))
        else {
            continue;
        };
        match out.iter_mut().find(|(have, _)| have == label) {
            Some((_, lines)) => lines.push(line.trim().to_string()),
            None => out.push((label.to_string(), vec![line.trim().to_string()])),
        }
    }
    out
}

/// `description` with the record of `label` made `lines` (none: the label's record is
/// dropped); the other lines, the user's and the marker, as they were. An empty result is
/// no description.
pub fn with_record(description: Option<&str>, label: &str, lines: &[(String, String)]) -> String {
    let own = format!("{RECORD_PREFIX}{label} ");
    let mut out: String = description
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with(&own))
        .map(|l| format!("{l}\n"))
        .collect();
    for (k, v) in lines {
        out.push_str(&format!("{own}{k}: {v}\n"));
    }
    out
}

/// The lines of a container as they stand once it restarts: the current ones, less those
/// queued for deletion, with the values queued in `[pve:pending]` (a `pct set` on a running
/// container) in their place.
pub fn found_lines(fact: Option<&PveContainerFact>) -> Vec<(String, String)> {
    let Some(f) = fact else {
        return Vec::new();
    };
    let mut found: Vec<(String, String)> = f
        .config
        .iter()
        .filter(|(k, _)| !f.pending_delete.contains(k))
        .cloned()
        .collect();
    for (k, v) in &f.pending {
        found.retain(|(fk, _)| fk != k);
        found.push((k.clone(), v.clone()));
    }
    found
}

/// A recorded line as found now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedLine {
    /// There as provision wrote it: removed with its role.
    AsWritten(String, String),
    /// Changed by hand since (the same key, device or mount, another value): kept.
    Changed {
        /// As recorded.
        written: String,
        /// As found.
        found: String,
    },
    /// No longer there.
    Gone,
}

/// What became of each line `recorded` for a label in `found`.
pub fn recorded_state(recorded: &[String], found: &[(String, String)]) -> Vec<RecordedLine> {
    recorded
        .iter()
        .map(|line| {
            let Some((k, v)) = line.split_once(':').map(|(k, v)| (k.trim(), v.trim())) else {
                return RecordedLine::Gone;
            };
            if found.iter().any(|(fk, fv)| fk == k && same_line(k, v, fv)) {
                return RecordedLine::AsWritten(k.to_string(), v.to_string());
            }
            let same_thing = |fk: &str, fv: &str| {
                fk == k
                    && (!k.starts_with("lxc.")
                        || lxc_subject(k, v).is_some() && lxc_subject(fk, fv) == lxc_subject(k, v))
            };
            match found.iter().find(|(fk, fv)| same_thing(fk, fv)) {
                Some((fk, fv)) => RecordedLine::Changed {
                    written: line.clone(),
                    found: format!("{fk}: {fv}"),
                },
                None => RecordedLine::Gone,
            }
        })
        .collect()
}

/// Config lines a role owns in one container's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PveLinesSpec {
    /// vmid.
    pub vmid: u64,
    /// What the lines are for, e.g. `gpu-passthrough`.
    pub label: String,
    /// `key: value` lines, in order.
    pub lines: Vec<String>,
    /// Which found lines these lines own (so ones no longer wanted are removed, and a
    /// stale one is drift), from the node's live facts; `None` offline: then only `devN`
    /// entries are owned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<LineOwner>,
    /// The lines of a role no longer declared, as recorded and found unchanged: the only
    /// lines these (no lines wanted) own, so exactly they are removed and the record of
    /// the label dropped; empty for declared lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retire: Vec<(String, String)>,
}

/// What GPU passthrough owns in a config, from the node's live facts: NVIDIA device nodes
/// passed through (under `root`), and `c N:* rwm` rules for a major that is NVIDIA's now or
/// that no driver on the node has any more (left from an older driver); other rules are
/// the user's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineOwner {
    /// The prefix of the node's `/dev` (empty on real nodes).
    pub root: String,
    /// NVIDIA's character majors now (`/proc/devices`).
    pub nvidia_majors: Vec<u32>,
    /// Every character major the node has now.
    pub char_majors: Vec<u32>,
}

impl LineOwner {
    /// The NVIDIA device (`/dev/nvidia1`) a `devN` or `lxc.mount.entry` value passes
    /// through, if it is one.
    pub fn nvidia_path<'a>(&self, key: &str, value: &'a str) -> Option<&'a str> {
        let first = if is_dev_key(key) {
            value.split(',').next()?
        } else if key == "lxc.mount.entry" {
            value.split_whitespace().next()?
        } else {
            return None;
        };
        let path = first.strip_prefix(self.root.as_str())?;
        path.starts_with("/dev/nvidia").then_some(path)
    }

    /// Whether passthrough owns the line `key: value`.
    pub fn owns(&self, key: &str, value: &str) -> bool {
        if self.nvidia_path(key, value).is_some() {
            return true;
        }
        if !is_allow_key(key) {
            return false;
        }
        allow_major(value)
            .is_some_and(|m| self.nvidia_majors.contains(&m) || !self.char_majors.contains(&m))
    }
}

/// `c N:* rwm`-shaped device rules: the major, for the shape passthrough writes.
pub fn allow_major(value: &str) -> Option<u32> {
    let rest = value.trim().strip_prefix("c ")?;
    let (major, tail) = rest.split_once(':')?;
    (tail.trim() == "* rwm").then(|| major.trim().parse().ok())?
}

/// A device cgroup rule's key (cgroup v2 or v1).
pub fn is_allow_key(k: &str) -> bool {
    matches!(k, "lxc.cgroup2.devices.allow" | "lxc.cgroup.devices.allow")
}

impl PveLinesSpec {
    /// Whether these are GPU passthrough lines: made from the node's live GPU facts, which
    /// say what they own (`owner`, set by `node::gpu::NodeGpus::localize`). The one typed
    /// mark the GPU checks and the node's GPU reads go by.
    pub fn passthrough(&self) -> bool {
        self.owner.is_some()
    }

    /// Whether a found line is one of these lines' kind, so that one not wanted is
    /// removed: what [`LineOwner`] owns, `devN` entries passing through a device these
    /// lines pass through (other options) or, offline, an NVIDIA device, and a raw `lxc.*`
    /// line that sets what one of these lines sets, differently (the line edited behind
    /// provision's back: it is replaced, not kept beside the wanted one). Any other `devN`
    /// (`/dev/fuse`, `/dev/net/tun`, ...) or `lxc.*` line is the user's and stays.
    pub fn owns(&self, key: &str, value: &str) -> bool {
        if !self.retire.is_empty() {
            return self
                .retire
                .iter()
                .any(|(k, v)| k == key && same_line(k, v, value));
        }
        if self.owner.as_ref().is_some_and(|o| o.owns(key, value)) {
            return true;
        }
        if !is_dev_key(key) {
            let subject = lxc_subject(key, value);
            return subject.is_some()
                && self
                    .pairs()
                    .iter()
                    .any(|(wk, wv)| wk == key && lxc_subject(wk, wv) == subject);
        }
        let path = dev_path(value);
        path.starts_with("/dev/nvidia") && self.owner.is_none()
            || self
                .pairs()
                .iter()
                .any(|(k, v)| is_dev_key(k) && dev_path(v) == path)
    }

    /// The lines as `(key, value)`.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.lines
            .iter()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }
}

/// Whether a found line `key: have` is the wanted `key: want`: raw `lxc.*` lines exactly,
/// options as Proxmox normalises them (an `mpN` written by `pct set` reads back in its own
/// form), so a converged config shows no drift.
pub fn same_line(key: &str, want: &str, have: &str) -> bool {
    if key.starts_with("lxc.") {
        want == have
    } else {
        pve::normalize::same(key, want, Some(have))
    }
}

/// What a raw `lxc.*` line sets, so that two lines setting the same thing are known as
/// one edited: for keys LXC takes many times, the device of a device rule (`c 10:200`),
/// the target of a mount entry, the variable of an environment line; for keys LXC takes
/// once (a profile, a cgroup limit, a sysctl), the key. `None` for lines that cannot be
/// told apart that way (hooks, includes, id maps, ...): only an exact line matches them.
pub fn lxc_subject(key: &str, value: &str) -> Option<String> {
    let single = |k: &str| {
        matches!(
            k,
            "lxc.apparmor.profile"
                | "lxc.apparmor.allow_nesting"
                | "lxc.apparmor.allow_incomplete"
                | "lxc.seccomp.profile"
                | "lxc.tty.max"
                | "lxc.pty.max"
                | "lxc.autodev"
                | "lxc.init.cmd"
                | "lxc.signal.halt"
                | "lxc.signal.stop"
                | "lxc.signal.reboot"
        ) || ["lxc.sysctl.", "lxc.prlimit.", "lxc.proc."]
            .iter()
            .any(|p| k.starts_with(p))
    };
    if is_allow_key(key) || matches!(key, "lxc.cgroup2.devices.deny" | "lxc.cgroup.devices.deny") {
        // `TYPE MAJOR:MINOR ACCESS`, or `a` for every device.
        let mut words = value.split_whitespace();
        let kind = words.next()?;
        return Some(match words.next() {
            Some(dev) => format!("{kind} {dev}"),
            None => kind.to_string(),
        });
    }
    match key {
        "lxc.mount.entry" => value.split_whitespace().nth(1).map(str::to_string),
        "lxc.environment" => value
            .split_once('=')
            .map(|(name, _)| name.trim().to_string()),
        _ if key.starts_with("lxc.cgroup2.") || key.starts_with("lxc.cgroup.") => {
            Some(String::new())
        }
        _ if single(key) => Some(String::new()),
        _ => None,
    }
}

/// `devN` keys (device passthrough, Proxmox VE 8.1 and later).
pub fn is_dev_key(k: &str) -> bool {
    k.strip_prefix("dev")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The device a `devN` value passes through (`/dev/nvidia0,mode=0666` -> `/dev/nvidia0`;
/// `path=` spelled out or not).
fn dev_path(value: &str) -> &str {
    let first = value.split(',').next().unwrap_or_default().trim();
    first.strip_prefix("path=").unwrap_or(first)
}

/// Whether a found `devN` line (key, wanted value, found value) holds a wanted one.
type LineMatch = dyn Fn(&str, &str, &str) -> bool;

/// Proxmox's limit on `devN` entries per container (`dev0` to `dev255`).
const MAX_DEVS: usize = 256;

/// `wanted` with each `devN` key placed so that it never takes a `devN` the user has for
/// something else: a device already passed through under some `devK` keeps `K`; otherwise
/// it takes its own key when that is free or holds a line `owns` claims, else the lowest
/// such index. Roles number their entries from `dev0`, and a user's own `dev0:
/// /dev/fuse` must not be overwritten by them. The same placement is made by the plan
/// and, against the config read just before the write, by the node step.
pub fn place_devs(
    wanted: &[(String, String)],
    found: &[(String, String)],
    owns: &dyn Fn(&str, &str) -> bool,
) -> Vec<(String, String)> {
    let mut placed: Vec<Option<String>> = vec![None; wanted.len()];
    let mut taken: Vec<String> = Vec::new();
    // Already there under whatever index: as wanted, then the same device with other
    // options (changed in place).
    let exact: &LineMatch = &|fk, v, fv| same_line(fk, v, fv);
    let device: &LineMatch = &|_, v, fv| dev_path(v) == dev_path(fv);
    for same in [exact, device] {
        for (i, (k, v)) in wanted.iter().enumerate() {
            if !is_dev_key(k) || placed[i].is_some() {
                continue;
            }
            if let Some((fk, _)) = found
                .iter()
                .find(|(fk, fv)| is_dev_key(fk) && !taken.contains(fk) && same(fk, v, fv))
            {
                taken.push(fk.clone());
                placed[i] = Some(fk.clone());
            }
        }
    }
    let free = |key: &str, taken: &[String]| {
        !taken.iter().any(|t| t == key)
            && found
                .iter()
                .filter(|(fk, _)| fk == key)
                .all(|(fk, fv)| owns(fk, fv))
    };
    for (i, (k, _)) in wanted.iter().enumerate() {
        if !is_dev_key(k) || placed[i].is_some() {
            continue;
        }
        let key = if free(k, &taken) {
            Some(k.clone())
        } else {
            (0..MAX_DEVS)
                .map(|n| format!("dev{n}"))
                .find(|key| free(key, &taken))
        };
        // No free index at all: keep the role's key, so the plan shows the clash.
        let key = key.unwrap_or_else(|| k.clone());
        taken.push(key.clone());
        placed[i] = Some(key);
    }
    wanted
        .iter()
        .zip(placed)
        .map(|((k, v), p)| (p.unwrap_or_else(|| k.clone()), v.clone()))
        .collect()
}

impl Resource for PveLinesSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Container
    }

    fn kind(&self) -> &'static str {
        "pve_lines"
    }

    fn name(&self) -> String {
        format!("{} {}", self.vmid, self.label)
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::PveContainer(
            crate::resources::container::PveContainerProbe { vmid: self.vmid },
        )]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        // Options queued in `[pve:pending]` (a `pct set` on a running container) count as
        // done: they take effect at the next start, as the container's own options do.
        let found = found_lines(facts.pve_container(&self.probes()[0])?);
        let want = place_devs(&self.pairs(), &found, &|k, v| self.owns(k, v));
        let mut d = Delta::new(Action::Update);
        for (k, v) in &want {
            if !found.iter().any(|(fk, fv)| fk == k && same_line(k, v, fv)) {
                let have = (!k.starts_with("lxc."))
                    .then(|| found.iter().find(|(fk, _)| fk == k).map(|(_, v)| v.clone()))
                    .flatten();
                d = d.attr(Attribute::change(k, have, Some(v.clone())));
            }
        }
        for (k, v) in &found {
            let wanted = if k.starts_with("lxc.") {
                want.iter().any(|(wk, wv)| wk == k && wv == v)
            } else {
                want.iter().any(|(wk, _)| wk == k)
            };
            if !wanted && self.owns(k, v) {
                // A line passthrough owns that is not wanted: left from another GPU
                // selection or a driver whose majors moved.
                d = d.attr(Attribute::change(k, Some(v.clone()), None));
            }
        }
        if d.attributes.is_empty() {
            return Ok(None);
        }
        if d.attributes.len() == want.len() && d.attributes.iter().all(|a| a.before.is_none()) {
            d.action = Action::Create;
        }
        d = d.reason(
            "node step, root only: written over the node's SSH as root (`pct set --digest` for options such as devN and bind mounts, the locked atomic edit of lxc/<vmid>.conf for lxc.* lines), read back; applied before the container starts, or at a reboot with `restart: allowed`",
        );
        Ok(Some(d))
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        // Root-only: over the node's SSH as root. The lines take effect at a start, so the
        // container starts after them (create stopped -> lines -> start), or reboots.
        Ok(vec![
            Op::Node(NodeOp::Lines {
                address: change.address.clone(),
                spec: self.clone(),
            }),
            Op::Api(ApiOp::Start {
                vmid: self.vmid,
                reboot: true,
            }),
        ])
    }
}

/// The recorded lines of a removal of [`Entry::PveLines`] as found in the container.
fn removal_state(r: &Removal, facts: &Facts) -> Result<Vec<RecordedLine>, NotRead> {
    let Entry::PveLines { lines, .. } = &r.entry else {
        return Ok(Vec::new());
    };
    let found = found_lines(facts.pve_container(&r.probes()[0])?);
    Ok(recorded_state(lines, &found))
}

/// A role's lines no longer declared: a `-` change for each line provision recorded that
/// is still there as written; lines it did not write are never touched, and a recorded
/// line changed since is kept (named by [`removal_warnings`]).
pub fn removal_diff(r: &Removal, facts: &Facts) -> Result<Option<Delta>, NotRead> {
    let Entry::PveLines { label, .. } = &r.entry else {
        return Ok(None);
    };
    let mut d = Delta::new(Action::Delete);
    for line in removal_state(r, facts)? {
        if let RecordedLine::AsWritten(k, v) = line {
            d = d.attr(Attribute::change(&k, Some(v), None));
        }
    }
    if d.attributes.is_empty() {
        return Ok(None);
    }
    Ok(Some(d.reason("no longer declared").reason(format!(
        "the lines provision wrote for `{label}` (recorded in the container's description), still as written: removed over the node's SSH as root, with the record; lines it did not write stay; they take effect at the next start, or at a reboot with `restart: allowed`"
    ))))
}

/// The recorded lines of a role no longer declared that were changed by hand since: kept.
pub fn removal_warnings(r: &Removal, facts: &Facts) -> Vec<String> {
    let Entry::PveLines { vmid, label, .. } = &r.entry else {
        return Vec::new();
    };
    removal_state(r, facts)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| match l {
            RecordedLine::Changed { written, found } => Some(format!(
                "CT {vmid}: `{found}` was `{written}` when provision wrote it for `{label}`, no longer declared: changed since, kept"
            )),
            _ => None,
        })
        .collect()
}

/// The node step removing exactly the recorded lines found as written (and the label's
/// record), then the start that makes it take effect.
pub fn removal_ops(r: &Removal, change: &Change, allowed: &Allowed) -> Result<Vec<Op>, StepsError> {
    let Entry::PveLines { vmid, label, .. } = &r.entry else {
        return Ok(Vec::new());
    };
    let retire = change
        .attributes
        .iter()
        .filter_map(|a| a.before.clone().map(|v| (a.name.clone(), v)))
        .collect();
    PveLinesSpec {
        vmid: *vmid,
        label: label.clone(),
        lines: Vec::new(),
        owner: None,
        retire,
    }
    .ops(change, allowed)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::resources::container::PveContainerFact;
    use crate::resources::wire::Fact;

    fn facts(config: &[(&str, &str)], pending_delete: &[&str]) -> Facts {
        let fact = PveContainerFact {
            config: config
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pending_delete: pending_delete.iter().map(|k| k.to_string()).collect(),
            running: true,
            ..Default::default()
        };
        Facts::Read(HashMap::from([(
            Probe::PveContainer(crate::resources::container::PveContainerProbe { vmid: 1 }),
            Fact::PveContainer(Some(fact)),
        )]))
    }

    #[test]
    fn stale_owned_lines_are_drift_and_pending_deletes_count_as_done() {
        let spec = PveLinesSpec {
            vmid: 1,
            label: "gpu-passthrough".into(),
            lines: vec!["lxc.cgroup2.devices.allow: c 238:* rwm".into()],
            owner: Some(LineOwner {
                root: String::new(),
                nvidia_majors: vec![195, 238],
                char_majors: vec![1, 195, 238],
            }),
            retire: Vec::new(),
        };
        let allow = "lxc.cgroup2.devices.allow";
        // 509: no driver has it any more; 1: the user's rule, kept.
        let d = spec
            .diff(&facts(&[(allow, "c 509:* rwm"), (allow, "c 1:* rwm")], &[]))
            .unwrap()
            .unwrap();
        let names: Vec<(&str, Option<&str>)> = d
            .attributes
            .iter()
            .map(|a| (a.name.as_str(), a.after.as_deref()))
            .collect();
        assert_eq!(
            names,
            vec![(allow, Some("c 238:* rwm")), (allow, None)],
            "{d:?}"
        );
        assert_eq!(d.attributes[1].before.as_deref(), Some("c 509:* rwm"));
        let converged = facts(
            &[(allow, "c 238:* rwm"), ("dev0", "/dev/nvidia0")],
            &["dev0"],
        );
        let mut with_dev = spec.clone();
        with_dev.lines.push("dev1: /dev/nvidia1".into());
        // dev0 is owned (an NVIDIA node) but queued for deletion: only dev1 is missing.
        let d = with_dev.diff(&converged).unwrap().unwrap();
        assert_eq!(d.attributes.len(), 1, "{d:?}");
        assert_eq!(d.attributes[0].name, "dev1");
        assert!(spec.diff(&converged).unwrap().is_none());
    }

    /// Each attribute of `d` as (name, before, after).
    fn changes(d: &Delta) -> Vec<(&str, Option<&str>, Option<&str>)> {
        d.attributes
            .iter()
            .map(|a| (a.name.as_str(), a.before.as_deref(), a.after.as_deref()))
            .collect()
    }

    fn lines(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_users_own_dev_entries_are_never_taken_or_removed() {
        let spec = PveLinesSpec {
            vmid: 1,
            label: "gpu-passthrough".into(),
            lines: vec!["dev0: /dev/nvidia0".into(), "dev1: /dev/nvidiactl".into()],
            owner: None,
            retire: Vec::new(),
        };
        // The user passes /dev/fuse as dev0 and /dev/net/tun as dev2.
        let user = [("dev0", "/dev/fuse"), ("dev2", "/dev/net/tun")];
        let d = spec.diff(&facts(&user, &[])).unwrap().unwrap();
        let got = changes(&d);
        assert_eq!(
            got,
            vec![
                ("dev1", None, Some("/dev/nvidia0")),
                ("dev3", None, Some("/dev/nvidiactl")),
            ],
            "{d:?}"
        );
        assert_eq!(d.action, Action::Create);
        // Converged where the plan placed them: no drift, and the user's lines stay.
        let converged = [
            ("dev0", "/dev/fuse"),
            ("dev1", "/dev/nvidia0"),
            ("dev2", "/dev/net/tun"),
            ("dev3", "/dev/nvidiactl"),
        ];
        assert!(spec.diff(&facts(&converged, &[])).unwrap().is_none());
        // The node step makes the same placement from the same config.
        let owns = |k: &str, v: &str| spec.owns(k, v);
        let edit =
            crate::resources::config_edit::ConfigEdit::toward(&spec.pairs(), &lines(&user), &owns);
        assert_eq!(
            edit.set,
            lines(&[("dev1", "/dev/nvidia0"), ("dev3", "/dev/nvidiactl")])
        );
        assert!(edit.delete.is_empty(), "{edit:?}");
        assert!(
            crate::resources::config_edit::ConfigEdit::toward(
                &spec.pairs(),
                &lines(&converged),
                &owns
            )
            .is_empty()
        );
    }

    #[test]
    fn passthrough_entries_keep_their_index_and_stale_ones_go() {
        let spec = PveLinesSpec {
            vmid: 1,
            label: "gpu-passthrough".into(),
            lines: vec!["dev0: /dev/nvidia1,mode=0666".into()],
            owner: None,
            retire: Vec::new(),
        };
        // Already passed through as dev4: kept there. dev0, an NVIDIA node no longer
        // selected, is passthrough's own and goes.
        let found = [("dev0", "/dev/nvidia0"), ("dev4", "/dev/nvidia1,mode=0666")];
        let d = spec.diff(&facts(&found, &[])).unwrap().unwrap();
        assert_eq!(d.attributes.len(), 1, "{d:?}");
        assert_eq!(d.attributes[0].name, "dev0");
        assert_eq!(d.attributes[0].after, None);
        // Other options on the same device: changed in place, at its index.
        let found = [("dev4", "/dev/nvidia1"), ("dev0", "/dev/fuse")];
        let d = spec.diff(&facts(&found, &[])).unwrap().unwrap();
        let got: Vec<(&str, Option<&str>)> = d
            .attributes
            .iter()
            .map(|a| (a.name.as_str(), a.before.as_deref()))
            .collect();
        assert_eq!(got, vec![("dev4", Some("/dev/nvidia1"))], "{d:?}");
    }

    #[test]
    fn an_edited_raw_line_of_a_role_is_replaced_and_other_lines_are_the_users() {
        // A role of the user's (no GPU facts): a TUN device and its mount.
        let spec = PveLinesSpec {
            vmid: 1,
            label: "tun".into(),
            lines: vec![
                "lxc.cgroup2.devices.allow: c 10:200 rwm".into(),
                "lxc.mount.entry: /dev/net dev/net none bind,create=dir".into(),
                "lxc.apparmor.profile: unconfined".into(),
            ],
            owner: None,
            retire: Vec::new(),
        };
        let allow = "lxc.cgroup2.devices.allow";
        let mount = "lxc.mount.entry";
        // The rule edited (`m` dropped), the mount made read-only, the profile changed;
        // a rule for another device and another mount are the user's.
        let d = spec
            .diff(&facts(
                &[
                    (allow, "c 10:200 rw"),
                    (allow, "c 10:229 rwm"),
                    (mount, "/dev/net dev/net none bind,ro,create=dir"),
                    (mount, "/srv/data srv/data none bind,create=dir"),
                    ("lxc.apparmor.profile", "generated"),
                ],
                &[],
            ))
            .unwrap()
            .unwrap();
        let got = changes(&d);
        assert_eq!(
            got,
            vec![
                (allow, None, Some("c 10:200 rwm")),
                (mount, None, Some("/dev/net dev/net none bind,create=dir")),
                ("lxc.apparmor.profile", None, Some("unconfined")),
                (allow, Some("c 10:200 rw"), None),
                (
                    mount,
                    Some("/dev/net dev/net none bind,ro,create=dir"),
                    None
                ),
                ("lxc.apparmor.profile", Some("generated"), None),
            ],
            "{d:?}"
        );
        assert!(!spec.owns(allow, "c 10:229 rwm"));
        assert!(!spec.owns(mount, "/srv/data srv/data none bind,create=dir"));
        // Lines nobody can tell apart stay the user's.
        assert!(!spec.owns("lxc.hook.pre-start", "/usr/local/bin/x"));
    }

    #[test]
    fn the_record_rides_in_the_description_beside_the_users_lines() {
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        let users = "Managed by provision.\nmy notes\n";
        let d = with_record(
            Some(users),
            "tun",
            &[
                pair("dev3", "/dev/net/tun"),
                pair("lxc.apparmor.profile", "unconfined"),
            ],
        );
        assert_eq!(
            d,
            "Managed by provision.\nmy notes\nprovision: line=tun dev3: /dev/net/tun\nprovision: line=tun lxc.apparmor.profile: unconfined\n"
        );
        let d = with_record(Some(&d), "gpu", &[pair("dev0", "/dev/nvidia0")]);
        assert_eq!(
            recorded(Some(&d)),
            vec![
                (
                    "tun".to_string(),
                    vec![
                        "dev3: /dev/net/tun".to_string(),
                        "lxc.apparmor.profile: unconfined".to_string()
                    ]
                ),
                ("gpu".to_string(), vec!["dev0: /dev/nvidia0".to_string()]),
            ]
        );
        // Rewritten in place, then dropped: the user's lines as they were.
        let d = with_record(Some(&d), "tun", &[]);
        assert_eq!(with_record(Some(&d), "gpu", &[]), users);
        assert!(recorded(Some(users)).is_empty());
        assert!(recorded(None).is_empty());
    }

    #[test]
    fn only_recorded_lines_still_as_written_are_retired() {
        let recorded = vec![
            "dev0: /dev/nvidia0".to_string(),
            "lxc.mount.entry: /dev/net dev/net none bind,create=dir".to_string(),
            "lxc.apparmor.profile: unconfined".to_string(),
        ];
        let found = lines(&[
            ("dev0", "/dev/nvidia0"),
            // Made read-only by hand since.
            (
                "lxc.mount.entry",
                "/dev/net dev/net none bind,ro,create=dir",
            ),
            // The user's own, never recorded.
            ("dev1", "/dev/fuse"),
            ("lxc.prlimit.nofile", "4096"),
        ]);
        assert_eq!(
            recorded_state(&recorded, &found),
            vec![
                RecordedLine::AsWritten("dev0".into(), "/dev/nvidia0".into()),
                RecordedLine::Changed {
                    written: recorded[1].clone(),
                    found: "lxc.mount.entry: /dev/net dev/net none bind,ro,create=dir".into()
                },
                RecordedLine::Gone,
            ]
        );
        let spec = PveLinesSpec {
            vmid: 1,
            label: "tun".into(),
            lines: Vec::new(),
            owner: None,
            retire: lines(&[("dev0", "/dev/nvidia0")]),
        };
        let edit =
            crate::resources::config_edit::ConfigEdit::toward(&[], &found, &|k, v| spec.owns(k, v));
        assert_eq!(edit.delete, ["dev0"]);
        assert!(
            edit.remove_lxc.is_empty() && edit.set.is_empty(),
            "{edit:?}"
        );
    }
}
