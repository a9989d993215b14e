//! A change of a container config's current section, as data: computed from the lines
//! found and the lines wanted (a pure function the `pve_lines` kind's diff uses too), made
//! to a parsed config, and verified on one read back. The node's locked write of the file
//! lives in `node::config_edit`, which carries this edit over node SSH.

use pve::config::CtConfig;
use serde::{Deserialize, Serialize};

use super::pve_lines::{place_devs, same_line};

/// A change of the current section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigEdit {
    /// Options to set (replacing a present value).
    pub set: Vec<(String, String)>,
    /// Options to remove.
    pub delete: Vec<String>,
    /// Raw `lxc.*` lines to add where absent, in order.
    pub add_lxc: Vec<(String, String)>,
    /// Raw `lxc.*` lines to remove.
    pub remove_lxc: Vec<(String, String)>,
    /// The description to write (empty: none), when it changes: it carries the record of
    /// the lines provision wrote ([`super::pve_lines::RECORD_PREFIX`]), written in the
    /// locked file write with the raw lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl ConfigEdit {
    /// The edit from `found` (a config's current lines) to `wanted`: wanted lines added
    /// (options set), and lines `owns` claims but `wanted` lacks removed (options deleted).
    /// Lines nobody claims are the user's and stay.
    pub fn toward(
        wanted: &[(String, String)],
        found: &[(String, String)],
        owns: &dyn Fn(&str, &str) -> bool,
    ) -> ConfigEdit {
        let mut edit = ConfigEdit::default();
        // `devN` keys placed as the plan placed them (never over the user's own entries).
        let wanted = &place_devs(wanted, found, owns);
        for (k, v) in wanted {
            if found.iter().any(|(fk, fv)| fk == k && same_line(k, v, fv)) {
                continue;
            }
            if k.starts_with("lxc.") {
                edit.add_lxc.push((k.clone(), v.clone()));
            } else {
                edit.set.push((k.clone(), v.clone()));
            }
        }
        for (k, v) in found {
            if wanted.iter().any(|(wk, wv)| wk == k && same_line(k, wv, v)) || !owns(k, v) {
                continue;
            }
            if k.starts_with("lxc.") {
                edit.remove_lxc.push((k.clone(), v.clone()));
            } else if !wanted.iter().any(|(wk, _)| wk == k) {
                edit.delete.push(k.clone());
            }
        }
        edit
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.delete.is_empty()
            && self.add_lxc.is_empty()
            && self.remove_lxc.is_empty()
            && self.description.is_none()
    }

    /// `conf` with the edit made to its current section; the pending and snapshot
    /// sections as they were.
    pub fn apply_to(&self, conf: &CtConfig) -> CtConfig {
        let mut out = conf.clone();
        let main = &mut out.main;
        for k in &self.delete {
            main.props.remove(k);
        }
        for (k, v) in &self.set {
            main.props.insert(k.clone(), v.clone());
        }
        main.lxc.retain(|l| !self.remove_lxc.contains(l));
        for l in &self.add_lxc {
            if !main.lxc.contains(l) {
                main.lxc.push(l.clone());
            }
        }
        match self.description.as_deref() {
            Some("") => {
                main.props.remove("description");
            }
            Some(d) => {
                main.props.insert("description".into(), d.to_string());
            }
            None => {}
        }
        out
    }

    /// Whether `conf` shows the edit made; what it shows otherwise.
    pub fn verify(&self, conf: &CtConfig) -> Result<(), NotShown> {
        let main = &conf.main;
        let mut wrong = Vec::new();
        for (k, v) in &self.set {
            if conf.get(k) != Some(v.as_str()) {
                wrong.push(format!("{k} is {:?}, not {v:?}", conf.get(k)));
            }
        }
        for k in &self.delete {
            if conf.get(k).is_some() {
                wrong.push(format!("{k} is still set"));
            }
        }
        for l in &self.add_lxc {
            if !main.lxc.contains(l) {
                wrong.push(format!("`{}: {}` is missing", l.0, l.1));
            }
        }
        for l in &self.remove_lxc {
            if main.lxc.contains(l) && !self.add_lxc.contains(l) {
                wrong.push(format!("`{}: {}` is still there", l.0, l.1));
            }
        }
        if let Some(d) = &self.description
            && conf.get("description").unwrap_or_default() != d.as_str()
        {
            wrong.push("the description (the record of lines written) is not as written".into());
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(NotShown(wrong))
        }
    }
}

/// What a config read back shows instead of an edit: one line per key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct NotShown(pub Vec<String>);

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = "#my ct\narch: amd64\nhostname: a\nmemory: 512\nlxc.apparmor.profile: unconfined\n\n[pve:pending]\nmemory: 1024\n\n[snap1]\narch: amd64\nhostname: a\n";

    #[test]
    fn edit_touches_only_the_current_section() {
        let edit = ConfigEdit {
            set: vec![("dev0".into(), "/dev/nvidia0".into())],
            delete: vec!["memory".into()],
            add_lxc: vec![("lxc.cgroup2.devices.allow".into(), "c 195:* rwm".into())],
            remove_lxc: vec![("lxc.apparmor.profile".into(), "unconfined".into())],
            description: None,
        };
        let before = CtConfig::parse(CONF).unwrap();
        let out = edit.apply_to(&before).to_raw();
        assert_eq!(
            out,
            "#my ct\narch: amd64\ndev0: /dev/nvidia0\nhostname: a\nlxc.cgroup2.devices.allow: c 195:* rwm\n\n[pve:pending]\nmemory: 1024\n\n[snap1]\narch: amd64\nhostname: a\n"
        );
        let after = CtConfig::parse(&out).unwrap();
        assert!(edit.verify(&after).is_ok());
        assert!(edit.verify(&before).is_err());
        assert_eq!(
            after.pending.props.get("memory").map(String::as_str),
            Some("1024")
        );
    }

    #[test]
    fn toward_adds_wanted_and_removes_only_owned_lines() {
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        let found = vec![
            pair("dev0", "/dev/a"),
            pair("dev1", "/dev/b"),
            pair("lxc.x", "1"),
            pair("lxc.y", "2"),
        ];
        let wanted = vec![pair("dev0", "/dev/a"), pair("lxc.z", "3")];
        let e = ConfigEdit::toward(&wanted, &found, &|k, _| k == "dev1" || k == "lxc.x");
        assert_eq!(e.add_lxc, vec![pair("lxc.z", "3")]);
        assert_eq!(e.remove_lxc, vec![pair("lxc.x", "1")]);
        assert_eq!(e.delete, vec!["dev1".to_string()]);
        assert!(e.set.is_empty());
    }
}
