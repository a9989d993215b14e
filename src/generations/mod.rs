//! Generations of what a service runs: the ml-env's venv and the SGLang checkout are built
//! each at a path of their own, beside what runs, and the stable paths the unit names
//! (`/root/ml-env`, `/root/sglang-main`) are symlinks switched to them by one rename once
//! they are built. A venv is not relocatable (its scripts name their interpreter, an
//! editable install names its checkout), so a generation is never moved: it is built where
//! it stays. What each switch and each health gate did is kept in one record on the target
//! (`RECORD`), which `history` shows, the deploy rolls back by and `rollback` goes back by.
//!
//! [`paths`] is the one function that says where a generation of an ml-env lives.

pub mod record;
pub mod target;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::inventory::software::MlEnv;

/// The record of generations on a target (its own file, beside the agent's other state).
pub const RECORD: &str = "/var/lib/provision/generations.json";

/// The folder, beside a stable path, that holds its generations.
pub const GENERATIONS_DIR: &str = ".provision-generations";

/// How many gated generations are kept besides the current one's (two by default: the
/// current and the previous).
pub const KEEP: usize = 2;

/// Where one generation of an ml-env lives, and the links that make it current.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationPaths {
    /// The venv's own folder (the venv resources build here).
    pub venv: String,
    /// The SGLang checkout's own folder, when SGLang comes from git.
    pub checkout: Option<String>,
    /// Stable path -> this generation's folder for it.
    pub links: BTreeMap<String, String>,
}

/// The generation of `env`'s venv and checkout: each at a folder named by a digest of
/// everything that goes into building it, beside its stable path. A checkout depends only
/// on its repository and commit, so a package change reuses it (a venv names its editable
/// checkout, so the venv's digest covers the checkout's too).
pub fn paths(env: &MlEnv) -> GenerationPaths {
    let stable_venv = env.path.to_string();
    let mut links = BTreeMap::new();
    let checkout = env.sglang.as_ref().map(|s| {
        let stable = s.path.to_string();
        let id = digest(&[s.repo.as_str(), s.revision.as_str()]);
        let dir = generation_dir(&stable, &id);
        links.insert(stable, dir.clone());
        dir
    });
    let index = env.index.as_ref();
    let inputs = serde_json::json!({
        // A venv pip made is remade by uv, and the other way round: a new generation, so
        // the running one is never rebuilt in place.
        "installer": env.installer(),
        "python": env.python.to_string(),
        "packages": env.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "index_url": index.and_then(|i| i.url.as_ref()).map(|u| u.to_string()),
        "extra_index_urls": index.map(|i| i.extra_urls.iter().map(|u| u.to_string()).collect::<Vec<_>>()),
        "wheelhouse": index.and_then(|i| i.wheelhouse.as_ref()).map(|w| w.to_string()),
        "find_links": index.map(|i| i.find_links.iter().map(|u| u.to_string()).collect::<Vec<_>>()),
        "sglang": env.sglang.as_ref().map(|s| serde_json::json!({
            "checkout": checkout,
            "subdirectory": s.subdirectory.to_string(),
            "extras": s.extras.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        })),
    });
    let venv = generation_dir(&stable_venv, &digest(&[&inputs.to_string()]));
    links.insert(stable_venv, venv.clone());
    GenerationPaths {
        venv,
        checkout,
        links,
    }
}

/// `/root/ml-env` + `3f2a...` -> `/root/.provision-generations/ml-env-3f2a...`: beside the
/// stable path, so a switch and an adoption are renames within one file system.
pub fn generation_dir(stable: &str, id: &str) -> String {
    let trimmed = stable.trim_end_matches('/');
    let (parent, base) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    format!("{parent}/{GENERATIONS_DIR}/{base}-{id}")
}

/// The short name of a generation's folder (`ml-env-3f2a...`), for people.
pub fn short(dir: &str) -> &str {
    dir.rsplit('/').next().unwrap_or(dir)
}

/// A unit file a switch writes: the unit a generation runs is that generation's, so it is
/// written by the switch itself ([`target::switch`]), not before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFile {
    /// Absolute path (`/etc/systemd/system/NAME.service`).
    pub path: String,
    /// The unit as the inventory declares it (naming the stable paths).
    pub content: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Permission bits.
    pub mode: u32,
}

/// What a pinned unit says first, so a person reading it knows why it names folders.
pub const PINNED_MARK: &str = "# provision: pinned to its generation's folders while a switch runs (the next apply rewrites it)\n";

/// `unit` with every stable path of `links` replaced by the folder it is to point at, so
/// the unit names one generation by itself, whatever the stable paths point at: what is on
/// disk while a switch moves the links. A built generation's venv names its own folders,
/// so a pinned unit of one starts exactly that generation.
pub fn pin(unit: &str, links: &BTreeMap<String, String>) -> String {
    let mut out = String::from(PINNED_MARK);
    for line in unit.lines().filter(|l| *l != PINNED_MARK.trim_end()) {
        let mut line = line.to_string();
        // Longest first: `/root/ml-env` must not eat `/root/ml-env2`'s prefix either way.
        let mut stables: Vec<(&String, &String)> = links.iter().collect();
        stables.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        for (stable, dir) in stables {
            line = replace_path(&line, stable.trim_end_matches('/'), dir);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `text` with the path `from` replaced by `to` where it is a whole path or a path's
/// leading folders (`/root/ml-env`, `/root/ml-env/bin/python3`), not part of a longer name.
fn replace_path(text: &str, from: &str, to: &str) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/');
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + from.len()..].chars().next();
        let whole =
            before.is_none_or(|c| !is_name(c)) && after.is_none_or(|c| c == '/' || !is_name(c));
        out.push_str(&rest[..at]);
        out.push_str(if whole { to } else { from });
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())[..12].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(yaml: &str) -> MlEnv {
        crate::inventory::load::parse_yaml(std::path::Path::new("t.yaml"), yaml).unwrap()
    }

    #[test]
    fn a_pinned_unit_names_the_generation_folders_and_nothing_else() {
        let links = BTreeMap::from([
            ("/root/ml-env".to_string(), "/root/.g/ml-env-b".to_string()),
            (
                "/root/sglang-main".to_string(),
                "/root/.g/sglang-main-b".to_string(),
            ),
        ]);
        let unit = "[Service]\nExecStart=/root/ml-env/bin/python3 -m sglang.launch_server --model-path /root/ml-env2/x\nWorkingDirectory=/root/sglang-main\nEnvironment=\"PATH=/root/ml-env/bin:/usr/bin\" /root/ml-envx=1\n";
        let pinned = pin(unit, &links);
        assert!(pinned.starts_with(PINNED_MARK), "{pinned}");
        assert!(
            pinned.contains("ExecStart=/root/.g/ml-env-b/bin/python3 -m sglang.launch_server --model-path /root/ml-env2/x\n"),
            "{pinned}"
        );
        assert!(
            pinned.contains("WorkingDirectory=/root/.g/sglang-main-b\n"),
            "{pinned}"
        );
        assert!(
            pinned.contains("PATH=/root/.g/ml-env-b/bin:/usr/bin\" /root/ml-envx=1"),
            "{pinned}"
        );
    }

    #[test]
    fn a_package_change_is_a_new_venv_beside_the_same_checkout() {
        let base = "path: /root/ml-env\npython: \"3.11\"\nsglang: { repo: https://g/s.git, revision: aaaa, path: /root/sglang-main }\n";
        let a = paths(&env(&format!("{base}packages: [\"torch==2.9.1\"]\n")));
        let b = paths(&env(&format!("{base}packages: [\"torch==2.10.0\"]\n")));
        assert_ne!(a.venv, b.venv);
        assert_eq!(a.checkout, b.checkout);
        assert!(
            a.venv.starts_with("/root/.provision-generations/ml-env-"),
            "{a:?}"
        );
        assert_eq!(a.links["/root/ml-env"], a.venv);
        assert_eq!(
            a.links["/root/sglang-main"],
            a.checkout.clone().unwrap(),
            "{a:?}"
        );
        // The same inputs are the same generation: nothing is built again.
        assert_eq!(
            a,
            paths(&env(&format!("{base}packages: [\"torch==2.9.1\"]\n")))
        );
        let c = paths(&env(&base.replace("aaaa", "bbbb")));
        assert_ne!(c.checkout, a.checkout);
    }
}
