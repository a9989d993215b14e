//! A git checkout at a pinned commit.

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::machine::HostError;
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
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "git_checkout"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Git(GitProbe {
            path: self.path.clone(),
        })]
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

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::GitCheckout(GitCheckoutStep {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            path: self.path.clone(),
        })])
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

/// A git checkout (HEAD, origin, local changes to tracked files), with one git process:
/// `git status --porcelain=v2 --branch` says HEAD's commit and the changes together, and
/// origin's URL is read from the repository's own config file when git wrote it plainly
/// (`git config` answers otherwise). The check reads this on every run, and each git
/// process costs tens of milliseconds on a loaded target.
pub fn read(path: &Path) -> Result<Option<GitFact>, HostError> {
    if !path.join(".git").exists() || unfinished_clone(path) {
        return Ok(None);
    }
    let run = |args: &[&str]| -> Result<String, HostError> {
        let mut full = vec!["-C".to_string(), path.display().to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        crate::machine::output("git", &full, &[])
    };
    let status = run(&[
        "status",
        "--porcelain=v2",
        "--branch",
        "--untracked-files=no",
    ])?;
    let (head, dirty) = head_and_changes(&status).ok_or_else(|| HostError::Unexpected {
        what: format!("git status in {}", path.display()),
        detail: format!("no commit in its `# branch.oid` line:\n{status}"),
    })?;
    let origin = match std::fs::read_to_string(path.join(".git/config"))
        .ok()
        .and_then(|text| plain_origin(&text))
    {
        Some(origin) => origin,
        None => run(&["config", "--get", "remote.origin.url"])
            .ok()
            .map(|u| u.trim().to_string()),
    };
    Ok(Some(GitFact {
        head,
        origin,
        dirty,
    }))
}

/// HEAD's commit and whether a tracked file changed, from `git status --porcelain=v2
/// --branch`: the `# branch.oid` header, and any entry line at all.
fn head_and_changes(status: &str) -> Option<(String, bool)> {
    let head = status
        .lines()
        .find_map(|l| l.strip_prefix("# branch.oid "))
        .filter(|oid| oid.len() >= 40 && oid.bytes().all(|b| b.is_ascii_hexdigit()))?;
    let dirty = status.lines().any(|l| !l.is_empty() && !l.starts_with('#'));
    Some((head.to_string(), dirty))
}

/// `[remote "origin"]`'s `url` in a git config file as git writes it: `Some(None)` when
/// there is no such remote, `None` when the file asks for git's own reading (an include,
/// a quoted or escaped value, a continued line, a second url).
fn plain_origin(config: &str) -> Option<Option<String>> {
    let mut in_origin = false;
    let mut url = None;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let section = line.to_ascii_lowercase();
            if section.starts_with("[include") {
                return None;
            }
            in_origin = line
                .strip_prefix('[')
                .and_then(|l| l.strip_suffix(']'))
                .is_some_and(|s| {
                    s.split_once(char::is_whitespace)
                        .is_some_and(|(name, sub)| {
                            name.eq_ignore_ascii_case("remote") && sub.trim() == "\"origin\""
                        })
                });
            if !in_origin && line.contains(']') && !line.ends_with(']') {
                return None;
            }
            continue;
        }
        if !in_origin {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !key.trim().eq_ignore_ascii_case("url") {
            continue;
        }
        let value = value.trim();
        if url.is_some() || value.is_empty() || value.contains(['"', '\\', ';', '#']) {
            return None;
        }
        url = Some(value.to_string());
    }
    Some(url)
}

/// Whether `path` holds nothing but a `.git` in which HEAD is no commit: a clone that never
/// finished (made before clones went through a folder of their own, and killed mid-way).
/// Read as no checkout, and cloned anew.
fn unfinished_clone(path: &Path) -> bool {
    let only_git = std::fs::read_dir(path)
        .map(|d| d.flatten().all(|e| e.file_name() == ".git"))
        .unwrap_or(false);
    only_git
        && !Command::new("git")
            .arg("-C")
            .arg(path)
            .args(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Checks out a commit (cloning first if needed), discarding local changes. A clone is
/// made in a folder beside `path` and renamed into place, so a clone killed mid-way never
/// stands at `path`.
pub fn checkout(repo: &str, revision: &str, path: &str) -> Result<(), HostError> {
    let git = |args: &[&str]| -> Result<(), HostError> {
        let mut full = vec!["-C".to_string(), path.to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        crate::machine::run("git", &full, &[])
    };
    let io = |action, p: &str| {
        let path = Path::new(p).to_path_buf();
        move |source| HostError::Io {
            action,
            path,
            source,
        }
    };
    if unfinished_clone(Path::new(path)) {
        std::fs::remove_dir_all(path).map_err(io("remove the unfinished clone", path))?;
    }
    if !Path::new(path).join(".git").exists() {
        let tmp = format!("{path}.provision-clone");
        if Path::new(&tmp).exists() {
            std::fs::remove_dir_all(&tmp).map_err(io("remove", &tmp))?;
        }
        crate::machine::run(
            "git",
            &[
                "clone".into(),
                "--no-checkout".into(),
                repo.to_string(),
                tmp.clone(),
            ],
            &[],
        )?;
        // Over an empty folder too (rename(2) replaces one); one with files in it is the
        // user's: the rename fails and says so.
        std::fs::rename(&tmp, path).map_err(io("move the new clone into place at", path))?;
    }
    // A git killed with its apply leaves its lock files, and every later git refuses the
    // repository until they are gone. This step runs under the target's apply lock and the
    // checkout is the inventory's, so no other git of provision's works here now.
    for lock in ["index.lock", "HEAD.lock"] {
        let stale = Path::new(path).join(".git").join(lock);
        if stale.exists() {
            let shown = stale.display().to_string();
            std::fs::remove_file(&stale).map_err(io("remove the stale lock", &shown))?;
        }
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

/// Probe: a git checkout: HEAD commit, origin URL, local changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GitProbe {
    /// The checkout's folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for GitProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Git(read(
            std::path::Path::new(&self.path),
        )?))
    }
}

/// Step: check out a commit of a repository (cloning first if needed), discarding local changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GitCheckoutStep {
    /// Repository URL.
    pub repo: String,
    /// Commit.
    pub revision: String,
    /// The checkout's folder.
    pub path: String,
}

impl crate::resources::wire::AgentStep for GitCheckoutStep {
    fn describe(&self) -> String {
        format!("git checkout {} in {}", self.revision, self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        checkout(&self.repo, &self.revision, &self.path)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn status_v2_gives_head_and_changes_and_a_plain_config_its_origin() {
        let oid = "4f1c0a9e2b7d3c5f6a8e9d0b1c2a3f4e5d6c7b8a";
        let clean = format!("# branch.oid {oid}\n# branch.head (detached)\n");
        assert_eq!(head_and_changes(&clean), Some((oid.to_string(), false)));
        let dirty = format!("{clean}1 .M N... 100644 100644 100644 a b python/x.py\n");
        assert_eq!(head_and_changes(&dirty), Some((oid.to_string(), true)));
        assert_eq!(head_and_changes("# branch.oid (initial)\n"), None);
        let config = "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://github.com/sgl-project/sglang.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n";
        assert_eq!(
            plain_origin(config),
            Some(Some("https://github.com/sgl-project/sglang.git".into()))
        );
        assert_eq!(plain_origin("[core]\n\tbare = false\n"), Some(None));
        for unusual in [
            "[include]\n\tpath = other\n[remote \"origin\"]\n\turl = a\n",
            "[remote \"origin\"]\n\turl = \"a b\"\n",
            "[remote \"origin\"]\n\turl = a\n\turl = b\n",
            "[remote \"origin\"] url = a\n",
        ] {
            assert_eq!(plain_origin(unusual), None, "{unusual}");
        }
    }

    /// The one-process read says what git's own three commands say, on a real repository
    /// clean and changed, with origin written plainly and with a URL git quotes.
    #[test]
    fn the_read_agrees_with_git_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("co");
        std::fs::create_dir(&dir).unwrap();
        git(&dir, &["init", "-q", "-b", "main"]);
        std::fs::write(dir.join("a"), "a\n").unwrap();
        git(&dir, &["add", "a"]);
        git(&dir, &["commit", "-qm", "a"]);
        git(&dir, &["checkout", "-q", "--detach"]);
        assert_eq!(
            read(&dir).unwrap(),
            Some(GitFact {
                head: git(&dir, &["rev-parse", "HEAD"]),
                origin: None,
                dirty: false,
            })
        );
        for url in ["https://example.invalid/sglang.git", "/srv/my repo;v2#x"] {
            let _ = Command::new("git")
                .args(["-C", dir.to_str().unwrap(), "remote", "remove", "origin"])
                .output();
            git(&dir, &["remote", "add", "origin", url]);
            assert_eq!(git(&dir, &["config", "--get", "remote.origin.url"]), url);
            assert_eq!(read(&dir).unwrap().unwrap().origin.as_deref(), Some(url));
        }
        std::fs::write(dir.join("a"), "changed\n").unwrap();
        assert!(read(&dir).unwrap().unwrap().dirty);
        // An untracked file is no local change (as before: `--untracked-files=no`).
        git(&dir, &["checkout", "-q", "--", "a"]);
        std::fs::write(dir.join("new"), "x\n").unwrap();
        assert!(!read(&dir).unwrap().unwrap().dirty);
    }

    #[test]
    fn a_clone_killed_mid_way_reads_as_absent_and_is_cloned_again() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        git(&src, &["init", "-q", "-b", "main"]);
        std::fs::write(src.join("a"), "a\n").unwrap();
        git(&src, &["add", "a"]);
        git(&src, &["commit", "-qm", "a"]);
        let rev = git(&src, &["rev-parse", "HEAD"]);
        let repo = src.display().to_string();
        // What `git clone` leaves when killed before it fetched: `.git` and no commit (git
        // then says "not a git repository" or cannot resolve HEAD).
        for broken in ["no-head", "no-objects"] {
            let dst = tmp.path().join(broken);
            std::fs::create_dir(&dst).unwrap();
            git(&dst, &["init", "-q"]);
            if broken == "no-head" {
                std::fs::remove_file(dst.join(".git/HEAD")).unwrap();
            }
            assert_eq!(read(&dst).unwrap(), None, "{broken}");
            checkout(&repo, &rev, &dst.display().to_string()).unwrap();
            let fact = read(&dst).unwrap().expect("a checkout");
            assert_eq!(fact.head, rev);
            assert_eq!(std::fs::read_to_string(dst.join("a")).unwrap(), "a\n");
            assert!(
                !tmp.path()
                    .join(format!("{broken}.provision-clone"))
                    .exists()
            );
        }
        // A checkout killed mid-way leaves git's index lock: the next one goes on.
        let dst = tmp.path().join("no-head");
        std::fs::write(dst.join(".git/index.lock"), "").unwrap();
        std::fs::write(dst.join("a"), "changed\n").unwrap();
        checkout(&repo, &rev, &dst.display().to_string()).unwrap();
        assert_eq!(std::fs::read_to_string(dst.join("a")).unwrap(), "a\n");
        assert!(!dst.join(".git/index.lock").exists());
        // A folder with the user's files in it is never removed or cloned over.
        let user = tmp.path().join("user");
        std::fs::create_dir_all(user.join(".git")).unwrap();
        std::fs::write(user.join("notes"), "mine\n").unwrap();
        assert!(checkout(&repo, &rev, &user.display().to_string()).is_err());
        assert_eq!(
            std::fs::read_to_string(user.join("notes")).unwrap(),
            "mine\n"
        );
    }
}
