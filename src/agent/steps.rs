//! The write side, run on the target: each [`Step`] changes one thing and checks it
//! landed. Files are written atomically (temp file in the same folder, fsync, rename,
//! fsync of the folder) and read back; a failed step stops the run, and a re-run picks
//! up from what is already in place.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One change to make on the target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Write a file atomically and verify it by reading it back.
    WriteFile {
        /// Absolute path.
        path: String,
        /// Content.
        content: String,
        /// Owner name.
        owner: String,
        /// Group name.
        group: String,
        /// Permission bits.
        mode: u32,
    },
    /// Make a directory (and its parents) with owner and mode.
    Mkdir {
        /// Absolute path.
        path: String,
        /// Owner name.
        owner: String,
        /// Group name.
        group: String,
        /// Permission bits.
        mode: u32,
    },
    /// Install Debian packages in one non-interactive transaction.
    AptInstall {
        /// `name` or `name=version`.
        packages: Vec<String>,
    },
    /// Make a venv (removing a wrong one first when `replace`).
    CreateVenv {
        /// The venv's folder.
        path: String,
        /// `MAJOR.MINOR`.
        python: String,
        /// Remove what is there first.
        replace: bool,
    },
    /// `pip install` into a venv.
    PipInstall {
        /// The venv's folder.
        venv: String,
        /// Requirements (`name==version`) or, with `editable`, the one source folder.
        requirements: Vec<String>,
        /// Install the (single) requirement as an editable source folder.
        editable: bool,
        /// `--index-url`.
        index_url: Option<String>,
        /// `--extra-index-url`s.
        extra_index_urls: Vec<String>,
        /// `--no-index --find-links` folder.
        wheelhouse: Option<String>,
    },
    /// Download a model next to its storage, every file verified.
    ModelPull(Box<ModelPull>),
    /// Check a service's new argv before anything of it is written or restarted.
    Preflight(Box<crate::resources::service::ServiceSpec>),
    /// Deploy a service: load, prove loaded, enable, (re)start, health gate, keep or roll
    /// back.
    DeployService(Box<super::deploy::Deploy>),
    /// Check out a commit of a repository (cloning first if needed), discarding local
    /// changes.
    GitCheckout {
        /// Repository URL.
        repo: String,
        /// Commit.
        revision: String,
        /// The checkout's folder.
        path: String,
    },
}

impl Step {
    /// A short description for progress lines.
    pub fn describe(&self) -> String {
        match self {
            Step::WriteFile { path, .. } => format!("write {path}"),
            Step::Mkdir { path, .. } => format!("mkdir {path}"),
            Step::AptInstall { packages } => format!("apt-get install {}", packages.join(" ")),
            Step::CreateVenv { path, python, .. } => format!("python{python} -m venv {path}"),
            Step::PipInstall {
                venv,
                requirements,
                editable,
                ..
            } => format!(
                "pip install{} {} into {venv}",
                if *editable { " -e" } else { "" },
                requirements.join(" ")
            ),
            Step::GitCheckout { path, revision, .. } => {
                format!("git checkout {revision} in {path}")
            }
            Step::Preflight(s) => format!("preflight {}", s.unit),
            Step::ModelPull(m) => format!("download {}@{} into {}", m.repo, m.revision, m.dest),
            Step::DeployService(d) => format!(
                "deploy {}{}",
                d.service.unit,
                if d.restart && d.service.readiness.is_some() {
                    " and wait until it is ready"
                } else {
                    ""
                }
            ),
        }
    }

    /// Runs the step; some steps report details (a service's verdict).
    pub fn run(&self) -> Result<Option<serde_json::Value>, StepError> {
        let done = match self {
            Step::DeployService(d) => {
                return Ok(serde_json::to_value(super::deploy::deploy(d)?).ok());
            }
            Step::Preflight(s) => {
                return Ok(serde_json::to_value(super::preflight::preflight(s)?).ok());
            }
            Step::ModelPull(m) => {
                return m
                    .run()
                    .map(|r| serde_json::to_value(r).ok())
                    .map_err(StepError::Failed);
            }
            Step::WriteFile {
                path,
                content,
                owner,
                group,
                mode,
            } => write_file_atomic(Path::new(path), content.as_bytes(), owner, group, *mode),
            Step::Mkdir {
                path,
                owner,
                group,
                mode,
            } => mkdir(Path::new(path), owner, group, *mode),
            Step::AptInstall { packages } => apt_install(packages),
            Step::CreateVenv {
                path,
                python,
                replace,
            } => create_venv(path, python, *replace),
            Step::PipInstall {
                venv,
                requirements,
                editable,
                index_url,
                extra_index_urls,
                wheelhouse,
            } => {
                let mut args: Vec<String> = vec![
                    "install".into(),
                    "--no-input".into(),
                    "--disable-pip-version-check".into(),
                    "--no-warn-script-location".into(),
                ];
                match (wheelhouse, index_url) {
                    (Some(w), _) => {
                        args.extend(["--no-index".into(), "--find-links".into(), w.clone()]);
                    }
                    (None, Some(u)) => args.extend(["--index-url".into(), u.clone()]),
                    (None, None) => {}
                }
                for u in extra_index_urls {
                    args.extend(["--extra-index-url".into(), u.clone()]);
                }
                if *editable {
                    args.push("-e".into());
                }
                args.extend(requirements.iter().cloned());
                run(&format!("{venv}/bin/pip"), &args, &[])
            }
            Step::GitCheckout {
                repo,
                revision,
                path,
            } => git_checkout(repo, revision, path),
        };
        done.map(|()| None).map_err(StepError::Failed)
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A service's deploy.
    #[error(transparent)]
    Deploy(#[from] super::deploy::DeployError),
    /// A service's preflight.
    #[error(transparent)]
    Preflight(#[from] super::preflight::PreflightError),
    /// Any other step, in the words of the code that ran it.
    #[error("{0}")]
    Failed(String),
}

/// A model download (the model store's engine, run on the target).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPull {
    /// The hub.
    pub endpoint: String,
    /// `org/name`.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
    /// Include globs.
    pub include: Vec<String>,
    /// Exclude globs.
    pub exclude: Vec<String>,
    /// The model's folder.
    pub dest: String,
    /// The token for gated repositories (redacted in `Debug`).
    pub token: Option<crate::inventory::secret::Secret>,
    /// Re-hash files already in place instead of trusting the record.
    pub verify_full: bool,
}

impl ModelPull {
    fn run(&self) -> Result<crate::hub::PullReport, String> {
        let mut req =
            crate::hub::PullRequest::new(&self.repo, &self.revision, Path::new(&self.dest));
        req.endpoint = self.endpoint.clone();
        req.include = self.include.clone();
        req.exclude = self.exclude.clone();
        req.token = self.token.clone();
        req.verify_full = self.verify_full;
        crate::hub::pull(&req, &crate::hub::NoProgress).map_err(|e| {
            let hints = e.hints();
            let mut text = e.to_string();
            for h in hints {
                text += &format!("\nhint: {h}");
            }
            text
        })
    }
}

/// Runs a program, failing with its output's tail when it exits non-zero.
fn run(program: &str, args: &[String], env: &[(&str, &str)]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    if text.trim().is_empty() {
        text = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let tail: Vec<&str> = text
        .lines()
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(format!(
        "{program} {} exited with {}:\n{}",
        args.join(" "),
        out.status
            .code()
            .map_or("a signal".to_string(), |c| c.to_string()),
        tail.join("\n")
    ))
}

fn lookup_id(file: &str, name: &str) -> Result<u32, String> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    fs::read_to_string(file)
        .map_err(|e| format!("cannot read {file}: {e}"))?
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
        })
        .ok_or_else(|| {
            format!(
                "no such {}: {name}",
                if file.ends_with("passwd") {
                    "user"
                } else {
                    "group"
                }
            )
        })
}

fn set_owner_mode(path: &Path, owner: &str, group: &str, mode: u32) -> Result<(), String> {
    let uid = lookup_id("/etc/passwd", owner)?;
    let gid = lookup_id("/etc/group", group)?;
    chown(path, Some(uid), Some(gid))
        .map_err(|e| format!("cannot chown {}: {e}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}

/// Writes `bytes` to `path` atomically with owner and mode, then reads it back and
/// compares sha256: a write that did not land is an error, not a success.
pub fn write_file_atomic(
    path: &Path,
    bytes: &[u8],
    owner: &str,
    group: &str,
    mode: u32,
) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{} has no parent folder", path.display()))?;
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = dir.join(format!(".{name}.provision-{}", std::process::id()));
    let result = (|| {
        let mut f =
            fs::File::create(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
        f.write_all(bytes)
            .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        f.sync_all()
            .map_err(|e| format!("cannot sync {}: {e}", tmp.display()))?;
        drop(f);
        set_owner_mode(&tmp, owner, group, mode)?;
        fs::rename(&tmp, path)
            .map_err(|e| format!("cannot rename into {}: {e}", path.display()))?;
        // The rename is durable only once the folder is synced.
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    let back = fs::read(path).map_err(|e| format!("cannot read back {}: {e}", path.display()))?;
    let (want, got) = (Sha256::digest(bytes), Sha256::digest(&back));
    if want != got {
        return Err(format!(
            "{} reads back different from what was written (sha256 {} instead of {})",
            path.display(),
            hex::encode(got),
            hex::encode(want)
        ));
    }
    Ok(())
}

fn mkdir(path: &Path, owner: &str, group: &str, mode: u32) -> Result<(), String> {
    fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    set_owner_mode(path, owner, group, mode)
}

fn apt_install(packages: &[String]) -> Result<(), String> {
    let env = [
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("NEEDRESTART_MODE", "a"),
    ];
    let mut args: Vec<String> = [
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(packages.iter().cloned());
    // Try with the lists as they are first; refresh them only when that fails, so a
    // converged host does not hit its mirror on every apply.
    if run("apt-get", &args, &env).is_ok() {
        return Ok(());
    }
    run("apt-get", &["update".into(), "-q".into()], &env)?;
    run("apt-get", &args, &env)
}

fn create_venv(path: &str, python: &str, replace: bool) -> Result<(), String> {
    if replace && Path::new(path).exists() {
        fs::remove_dir_all(path).map_err(|e| format!("cannot remove the old venv {path}: {e}"))?;
    }
    run(
        &format!("python{python}"),
        &["-m".into(), "venv".into(), path.to_string()],
        &[],
    )
}

fn git_checkout(repo: &str, revision: &str, path: &str) -> Result<(), String> {
    let git = |args: &[&str]| -> Result<(), String> {
        let mut full = vec!["-C".to_string(), path.to_string()];
        full.extend(args.iter().map(|s| s.to_string()));
        run("git", &full, &[])
    };
    if !Path::new(path).join(".git").exists() {
        run(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/unit.service");
        write_file_atomic(&p, b"one\n", "root", "root", 0o644).unwrap();
        write_file_atomic(&p, b"two\n", "root", "root", 0o600).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        // No temp files left behind.
        assert_eq!(fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn unknown_owner_fails_before_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, "old").unwrap();
        let e = write_file_atomic(&p, b"new", "no-such-user-xyz", "root", 0o644).unwrap_err();
        assert!(e.contains("no such user"), "{e}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
