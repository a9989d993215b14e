//! Lines in a container's Proxmox config that only `root@pam` may set (API tokens get
//! 403): `devN:` device passthrough and raw `lxc.*` keys. Written over SSH to the node.

use serde::{Deserialize, Serialize};

use super::{Delta, Resource};
use crate::agent::steps::Step;
use crate::engine::facts::{Facts, NotRead, Probe};
use crate::plan::{Action, Attribute, Change};

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
}

impl PveLinesSpec {
    /// The lines as `(key, value)`.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.lines
            .iter()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }
}

/// `devN` keys: owned by device passthrough, so ones not wanted are removed.
fn is_dev_key(k: &str) -> bool {
    k.strip_prefix("dev")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

impl Resource for PveLinesSpec {
    fn kind(&self) -> &'static str {
        "pve_lines"
    }

    fn name(&self) -> String {
        format!("{} {}", self.vmid, self.label)
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::PveContainer { vmid: self.vmid }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts
            .pve_container(&self.probes()[0])?
            .map(|f| f.config.clone())
            .unwrap_or_default();
        let want = self.pairs();
        let mut d = Delta::new(Action::Update);
        for (k, v) in &want {
            if !found.iter().any(|(fk, fv)| fk == k && fv == v) {
                let have = (!k.starts_with("lxc."))
                    .then(|| found.iter().find(|(fk, _)| fk == k).map(|(_, v)| v.clone()))
                    .flatten();
                d = d.attr(Attribute::change(k, have, Some(v.clone())));
            }
        }
        let wanted_dev = want.iter().any(|(k, _)| is_dev_key(k));
        for (k, v) in &found {
            if wanted_dev && is_dev_key(k) && !want.iter().any(|(wk, _)| wk == k) {
                d = d.attr(Attribute::change(k, Some(v.clone()), None));
            }
        }
        if d.attributes.is_empty() {
            return Ok(None);
        }
        if d.attributes.len() == want.len() && d.attributes.iter().all(|a| a.before.is_none()) {
            d.action = Action::Create;
        }
        Ok(Some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, String> {
        Err("root-only Proxmox config edits over SSH to the node are not built yet".into())
    }
}
