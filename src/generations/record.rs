//! The record of generations on a target: every switch and every health gate, in order.
//! Pure data and choices here; reading and writing it on the target is `target.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the health gate said of a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Switched to, not gated yet (an apply still running, or killed before its gate).
    Pending,
    /// Every service on it passed its gate.
    Passed,
    /// A service on it failed its gate (and its fallbacks): the previous came back.
    Failed,
    /// Found in place (a real folder at the stable path) and served from: kept as is.
    Adopted,
}

impl Gate {
    /// Whether a rollback may go back to it.
    pub fn good(self) -> bool {
        matches!(self, Gate::Passed | Gate::Adopted)
    }
}

/// One generation: the folders the stable paths point at, the units gated on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// 1, 2, ... on this target.
    pub number: u64,
    /// When it was switched to (RFC 3339, UTC).
    pub at: String,
    /// Stable path -> the folder it points at.
    pub links: BTreeMap<String, String>,
    /// Unit name -> the unit file that passed (or failed) the gate on it.
    #[serde(default)]
    pub units: BTreeMap<String, String>,
    /// The gate's verdict.
    pub gate: Gate,
    /// What changed from the one before, in words.
    #[serde(default)]
    pub changed: Vec<String>,
    /// Why it failed, or what a rollback did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every generation on a target, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Oldest first.
    pub generations: Vec<Generation>,
}

impl Record {
    /// The newest generation whose links are `links` (what the target runs on now).
    pub fn current(&self, links: &BTreeMap<String, String>) -> Option<&Generation> {
        self.generations.iter().rev().find(|g| &g.links == links)
    }

    /// The newest generation that passed its gate (or was adopted) other than what runs
    /// now (`links` with `unit`'s file `unit_file`): where a failed gate or `rollback` goes.
    pub fn previous_good(
        &self,
        links: &BTreeMap<String, String>,
        unit: &str,
        unit_file: &str,
    ) -> Option<&Generation> {
        self.generations.iter().rev().find(|g| {
            g.gate.good()
                && (&g.links != links || g.units.get(unit).is_some_and(|u| u != unit_file))
        })
    }

    /// Appends a generation after the newest, numbered next; what changed is worked out
    /// from the newest.
    pub fn push(
        &mut self,
        at: String,
        links: BTreeMap<String, String>,
        units: BTreeMap<String, String>,
        gate: Gate,
    ) -> &mut Generation {
        let last = self.generations.last();
        let changed = last.map_or_else(
            || vec!["first generation".to_string()],
            |l| changes(l, &links, &units),
        );
        let number = last.map_or(1, |l| l.number + 1);
        self.generations.push(Generation {
            number,
            at,
            links,
            units,
            gate,
            changed,
            note: None,
        });
        self.generations.last_mut().expect("just pushed")
    }

    /// The folders a switch to `current` deletes: those [`Record::prune`] drops, and those
    /// of `folders` (what the generations folders hold) that are generations of a stable
    /// path of `current` no kept generation names: built but never switched to (an apply
    /// killed or failed before its switch). An adopted folder outside the record is never
    /// one of them (the seeds' venv is only ever moved).
    pub fn prune_with(
        &mut self,
        current: &BTreeMap<String, String>,
        keep: usize,
        folders: &[String],
    ) -> Vec<String> {
        let mut gone = self.prune(current, keep);
        let needed: std::collections::BTreeSet<&String> = self
            .generations
            .iter()
            .flat_map(|g| g.links.values())
            .chain(current.values())
            .collect();
        let unswitched: Vec<String> = folders
            .iter()
            .filter(|f| !needed.contains(f) && current.keys().any(|s| built_for(f, s)))
            .cloned()
            .collect();
        gone.extend(unswitched);
        gone.sort();
        gone.dedup();
        gone
    }

    /// The folders no longer needed: those of generations other than what runs now
    /// (`current` links) and the newest good ones before it, `keep` in all; the
    /// generations dropped from the record with them. A folder still named by a kept
    /// generation stays.
    pub fn prune(&mut self, current: &BTreeMap<String, String>, keep: usize) -> Vec<String> {
        let mut kept_good = 0;
        let mut keep_numbers = Vec::new();
        for g in self.generations.iter().rev() {
            let runs = &g.links == current;
            if runs || (g.gate.good() && kept_good + 1 < keep) {
                if g.gate.good() && !runs {
                    kept_good += 1;
                }
                keep_numbers.push(g.number);
            }
        }
        let needed: std::collections::BTreeSet<&String> = self
            .generations
            .iter()
            .filter(|g| keep_numbers.contains(&g.number))
            .flat_map(|g| g.links.values())
            .chain(current.values())
            .collect();
        let mut drop: Vec<String> = self
            .generations
            .iter()
            .filter(|g| !keep_numbers.contains(&g.number))
            .flat_map(|g| g.links.values())
            .filter(|d| !needed.contains(d))
            .cloned()
            .collect();
        drop.sort();
        drop.dedup();
        self.generations
            .retain(|g| keep_numbers.contains(&g.number));
        drop
    }
}

/// Whether `dir` is a built generation of `stable` (`<its folder>/ml-env-<12 hex digits>`
/// for `/root/ml-env`), not an adopted one, nor one of another stable path.
pub fn built_for(dir: &str, stable: &str) -> bool {
    let prefix = super::generation_dir(stable, "");
    dir.strip_prefix(&prefix)
        .is_some_and(|id| id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What differs from `before` to (`links`, `units`), in words.
pub fn changes(
    before: &Generation,
    links: &BTreeMap<String, String>,
    units: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (stable, dir) in links {
        match before.links.get(stable) {
            Some(old) if old == dir => {}
            Some(old) => out.push(format!(
                "{stable}: {} -> {}",
                super::short(old),
                super::short(dir)
            )),
            None => out.push(format!("{stable}: -> {}", super::short(dir))),
        }
    }
    for (unit, content) in units {
        if before.units.get(unit).is_some_and(|old| old != content) {
            out.push(format!("{unit}: unit file changed"));
        }
    }
    if out.is_empty() {
        out.push("nothing (the same generation again)".into());
    }
    out
}

/// `provision history`'s lines for `record`, newest last; `now` marks the one running.
pub fn history_lines(record: &Record, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let current = record.current(now).map(|g| g.number);
    for g in &record.generations {
        let when = &g.at;
        let gate = match g.gate {
            Gate::Pending => "not gated yet",
            Gate::Passed => "gate passed",
            Gate::Failed => "gate FAILED",
            Gate::Adopted => "adopted (was serving)",
        };
        let mark = if Some(g.number) == current { "*" } else { " " };
        let dirs: Vec<&str> = g.links.values().map(|d| super::short(d)).collect();
        out.push(format!(
            "{mark} {:>3}  {when}  {gate:<22}  {}",
            g.number,
            dirs.join(" ")
        ));
        out.push(format!("         changed: {}", g.changed.join("; ")));
        if let Some(note) = &g.note {
            out.push(format!("         {note}"));
        }
    }
    out
}

/// `provision history`'s lines for the folders built but never switched to (not in the
/// record), which the next switch prunes.
pub fn unswitched_lines(
    record: &Record,
    now: &BTreeMap<String, String>,
    folders: &[String],
) -> Vec<String> {
    let named: std::collections::BTreeSet<&String> = record
        .generations
        .iter()
        .flat_map(|g| g.links.values())
        .chain(now.values())
        .collect();
    folders
        .iter()
        .filter(|f| !named.contains(f) && now.keys().any(|s| built_for(f, s)))
        .map(|d| {
            format!(
                "  -       built, never switched to (the next switch prunes it): {}",
                super::short(d)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("/root/ml-env".to_string(), format!("/root/.g/ml-env-{v}"))])
    }

    #[test]
    fn a_failed_gate_goes_back_to_the_newest_good_one_and_prune_keeps_two() {
        let mut r = Record::default();
        let unit = |c: &str| BTreeMap::from([("s.service".to_string(), c.to_string())]);
        r.push("t1".into(), links("a"), BTreeMap::new(), Gate::Adopted);
        r.push("t2".into(), links("b"), unit("u1"), Gate::Passed);
        r.push("t3".into(), links("c"), unit("u1"), Gate::Failed);
        assert_eq!(
            r.generations[2].changed,
            vec!["/root/ml-env: ml-env-b -> ml-env-c"]
        );
        let back = r.previous_good(&links("c"), "s.service", "u1").unwrap();
        assert_eq!(back.number, 2);
        // Running b: the one before it is a (adopted, it served).
        assert_eq!(
            r.previous_good(&links("b"), "s.service", "u1")
                .unwrap()
                .number,
            1
        );
        // The same links with another unit file: back to b's unit.
        assert_eq!(
            r.previous_good(&links("b"), "s.service", "u2")
                .unwrap()
                .number,
            2
        );
        r.push("t4".into(), links("d"), unit("u1"), Gate::Passed);
        r.push("t5".into(), links("e"), unit("u1"), Gate::Passed);
        let gone = r.prune(&links("e"), 2);
        // e runs, d is the previous good one; a, b and the failed c go.
        assert_eq!(
            gone,
            vec![
                "/root/.g/ml-env-a",
                "/root/.g/ml-env-b",
                "/root/.g/ml-env-c"
            ]
        );
        let left: Vec<u64> = r.generations.iter().map(|g| g.number).collect();
        assert_eq!(left, vec![4, 5]);
        // A folder built but never switched to goes with them; an adopted one, another
        // stable path's, or what runs do not.
        let mut r2 = r.clone();
        let built = |d: &str| format!("/root/.provision-generations/ml-env-{d}");
        let cur = BTreeMap::from([("/root/ml-env".to_string(), built("eeeeeeeeeeee"))]);
        r2.generations[1].links = cur.clone();
        let folders = [
            built("eeeeeeeeeeee"),
            built("0123456789ab"),
            "/root/.provision-generations/ml-env-adopted-20261201T000000Z".to_string(),
            "/root/.provision-generations/ml-env-b-0123456789ab".to_string(),
        ];
        assert_eq!(
            r2.prune_with(&cur, 2, &folders),
            vec![built("0123456789ab")]
        );
        let lines = history_lines(&r, &links("e"));
        assert!(lines.iter().any(|l| l.starts_with("*   5")), "{lines:?}");
    }
}
