//! A git checkout at a pinned commit.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::host::HostError;
use crate::plan::{Action, Attribute, Change};

/// A checkout's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitCheckoutSpec {
    /// Repository URL.
    pub repo: String,
    /// The commit (40 hex).
    pub revision: String,
    /// The checkout's folder.
    pub path: String,
}

impl Resource for GitCheckoutSpec {
    fn kind(&self) -> &'static str {
        "git_checkout"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Git {
            path: self.path.clone(),
        }]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let Some(found) = facts.git(&self.probes()[0])? else {
            return Ok(Some(
                Delta::new(Action::Create)
                    .attr(Attribute::new("repo", self.repo.clone()))
                    .attr(Attribute::new("commit", self.revision.clone())),
            ));
        };
        let mut d = Delta::new(Action::Update);
        if found.head != self.revision {
            d = d.attr(Attribute::change(
                "commit",
                Some(found.head.clone()),
                Some(self.revision.clone()),
            ));
        }
        // A checkout whose origin points elsewhere fetches from elsewhere: the step resets it.
        if found.origin.as_deref() != Some(self.repo.as_str()) {
            d = d.attr(Attribute::change(
                "origin",
                found.origin.clone(),
                Some(self.repo.clone()),
            ));
        }
        if found.dirty {
            d = d.reason("the checkout has local changes; they will be discarded");
            if d.attributes.is_empty() {
                d = d.attr(Attribute::change(
                    "local changes",
                    Some("present".into()),
                    Some("none".into()),
                ));
            }
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn steps(&self, _: &Change) -> Result<Vec<Step>, StepsError> {
        Ok(vec![Step::GitCheckout {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            path: self.path.clone(),
        }])
    }
}

/// A git checkout as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitFact {
    /// HEAD's commit.
    pub head: String,
    /// `origin`'s URL.
    pub origin: Option<String>,
    /// Whether tracked files differ from HEAD.
    pub dirty: bool,
}

/// A git checkout through git itself (HEAD, origin, local changes to tracked files).
pub fn read(path: &Path) -> Result<Option<GitFact>, HostError> {
    if !path.join(".git").exists() {
        return Ok(None);
    }
    let run = |args: &[&str]| -> Result<String, HostError> {
        let mut full = vec!["-C".to_string(), path.display().to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        Ok(crate::host::output("git", &full, &[])?.trim().to_string())
    };
    let head = run(&["rev-parse", "HEAD"])?;
    let origin = run(&["config", "--get", "remote.origin.url"]).ok();
    let dirty = !run(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(Some(GitFact {
        head,
        origin,
        dirty,
    }))
}

/// Checks out a commit (cloning first if needed), discarding local changes.
pub fn checkout(repo: &str, revision: &str, path: &str) -> Result<(), HostError> {
    let git = |args: &[&str]| -> Result<(), HostError> {
        let mut full = vec!["-C".to_string(), path.to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        crate::host::run("git", &full, &[])
    };
    if !Path::new(path).join(".git").exists() {
        crate::host::run(
            "git",
            &[
                "clone".into(),
                "--no-checkout".into(),
                repo.to_string(),
                path.to_string(),
            ],
            &[],
        )?;
    }
    // A checkout whose origin was changed by hand fetches from the declared repository again.
    let origin = Command::new("git")
        .args(["-C", path, "config", "--get", "remote.origin.url"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match origin.as_deref() {
        Some(url) if url == repo => {}
        Some(_) => git(&["remote", "set-url", "origin", repo])?,
        None => git(&["remote", "add", "origin", repo])?,
    }
    let has_commit = Command::new("git")
        .args([
            "-C",
            path,
            "cat-file",
            "-e",
            &format!("{revision}^{{commit}}"),
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_commit {
        git(&["fetch", "--quiet", "origin"])?;
    }
    git(&["checkout", "--quiet", "--force", "--detach", revision])?;
    git(&["reset", "--quiet", "--hard", revision])
}
