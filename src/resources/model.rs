//! A Hugging Face model in a folder, downloaded on the target and verified.

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::inventory::secret::SecretRef;
use crate::plan::{Action, Attribute, Change};

/// A model's desired state. The token is a reference (`env HF_TOKEN`), never a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `org/name`.
    pub repo: String,
    /// Branch, tag or commit as declared.
    pub revision: String,
    /// Include globs.
    #[serde(default)]
    pub include: Vec<String>,
    /// Exclude globs.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The model's folder.
    pub path: String,
    /// The hub's URL.
    pub endpoint: String,
    /// Where the token comes from, if the repository is gated (a reference, not a value).
    #[serde(default)]
    pub token: Option<SecretRef>,
}

/// Whether `revision` names a commit (40 hex digits) rather than a branch or tag.
fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())
}

impl Resource for ModelSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "model"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        // The record, then what a download needs beside it: the bytes already in the folder
        // and the free space where it is (the plan's fit check, `engine::fit`).
        vec![
            Probe::Model(ModelProbe {
                path: self.path.clone(),
            }),
            Probe::FolderSize(super::managed::FolderSizeProbe {
                path: self.path.clone(),
            }),
            Probe::FreeSpace(FreeSpaceProbe {
                path: self.path.clone(),
            }),
        ]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let Some(found) = facts.model(&self.probes()[0])? else {
            let mut d = Delta::new(Action::Create)
                .attr(Attribute::new(
                    "repo",
                    format!("{}@{}", self.repo, self.revision),
                ))
                .attr(Attribute::new("from", self.endpoint.clone()));
            if !self.include.is_empty() {
                d = d.attr(Attribute::new("include", self.include.join(" ")));
            }
            if !self.exclude.is_empty() {
                d = d.attr(Attribute::new("exclude", self.exclude.join(" ")));
            }
            if let Some(token) = &self.token {
                d = d.attr(Attribute::new(
                    "token",
                    format!("from {}", token.describe()),
                ));
            }
            if matches!(facts, Facts::Empty) {
                d = d.reason(
                    "size not known offline: the hub and the target's free space are read online",
                );
            }
            return Ok(Some(d.reason(
                "downloaded on the target, every file verified by sha256",
            )));
        };
        let mut d = Delta::new(Action::Update);
        if found.repo != self.repo {
            d = d.attr(Attribute::change(
                "repo",
                Some(found.repo.clone()),
                Some(self.repo.clone()),
            ));
        }
        // A branch or tag is satisfied by the commit it was verified at; a commit must match.
        if is_commit(&self.revision) && !found.commit.eq_ignore_ascii_case(&self.revision) {
            d = d.attr(Attribute::change(
                "commit",
                Some(found.commit.clone()),
                Some(self.revision.clone()),
            ));
        }
        if !found.intact {
            let before = if found.changed.is_empty() {
                "an unfinished pull".to_string()
            } else {
                format!("{} changed since verified", found.changed.len())
            };
            d = d.attr(Attribute::change(
                "files",
                Some(before),
                Some("verified".into()),
            ));
            for f in found.changed.iter().take(5) {
                d = d.reason(f.clone());
            }
        }
        if let Some(token) = self.token.as_ref().filter(|_| !d.attributes.is_empty()) {
            d = d.attr(Attribute::new(
                "token",
                format!("from {}", token.describe()),
            ));
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        // A download the plan found does not fit (`engine::fit`).
        if let Some(super::Typed::Conflict { why }) = &change.typed {
            return Err(StepsError::Refused(why.clone()));
        }
        // A model that drifted since it was verified is re-hashed in full, so a changed
        // byte that kept size and mtime is found and fetched again.
        let verify_full = change.action != crate::plan::Action::Create;
        guest(vec![Step::ModelPull(Box::new(self.pull(verify_full)?))])
    }
}

impl ModelSpec {
    /// The download of this model. The token is read here, on the workstation, and travels
    /// to the agent on stdin (or goes to the hub from here, for the plan's listing).
    pub fn pull(
        &self,
        verify_full: bool,
    ) -> Result<ModelPull, crate::inventory::secret::SecretError> {
        let token = match &self.token {
            Some(r) => Some(r.resolve(std::path::Path::new("/"))?),
            None => None,
        };
        Ok(ModelPull {
            endpoint: self.endpoint.clone(),
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            dest: self.path.clone(),
            token,
            verify_full,
            before_weights: false,
        })
    }
}

/// A model folder's verification record, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFact {
    /// Repository recorded.
    pub repo: String,
    /// Commit recorded.
    pub commit: String,
    /// Whether every recorded file still matches its size, mtime and inode.
    pub intact: bool,
    /// Files that no longer match.
    pub changed: Vec<String>,
}

/// The filesystem that holds a model folder, as a download needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeSpace {
    /// The nearest existing folder of the model's path (where the filesystem was asked).
    pub dir: String,
    /// Bytes available there.
    pub free: u64,
    /// The filesystem's id: folders with the same one share `free`.
    pub fsid: u64,
}

/// The free space where `path` is or would be created (agent side).
pub fn free_space(path: &Path) -> Result<FreeSpace, crate::hub::HubError> {
    let (dir, free, fsid) =
        crate::hub::space::filesystem(path).map_err(|source| crate::hub::HubError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(FreeSpace {
        dir: dir.display().to_string(),
        free,
        fsid,
    })
}

/// Probe: the free bytes of the filesystem that holds a path (or would: its nearest
/// existing folder), for a model download planned there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FreeSpaceProbe {
    /// The model's folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for FreeSpaceProbe {
    fn answer(
        &self,
        _verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        Ok(crate::resources::wire::Fact::FreeSpace(Some(free_space(
            Path::new(&self.path),
        )?)))
    }
}

/// A model folder's verification record, summarised for the planner: metadata only
/// (size, mtime, inode per file), or every file re-hashed with `full`.
pub fn read(path: &Path, full: bool) -> Result<Option<ModelFact>, crate::hub::HubError> {
    use crate::hub::{Problem, StoreState};
    let status = crate::hub::status(path, None)?;
    if status.state == StoreState::NoRecord {
        if !path.exists() {
            return Ok(None);
        }
        // Files without a record are unverified: the pull adopts those that hash right.
        return Ok(Some(ModelFact {
            repo: String::new(),
            commit: String::new(),
            intact: false,
            changed: vec!["(no verification record)".into()],
        }));
    }
    let mut fact = ModelFact {
        repo: status.repo.clone().unwrap_or_default(),
        commit: status.commit.clone().unwrap_or_default(),
        intact: status.state == StoreState::Verified,
        changed: status
            .changed
            .iter()
            .map(|p| format!("{p} changed since it was verified"))
            .collect(),
    };
    if full && fact.intact {
        let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Read-only: a probe reports, and only apply's pull records what it found.
        let report = crate::hub::inspect(path, true, jobs, &crate::hub::NoProgress)?;
        if !report.problems.is_empty() {
            fact.intact = false;
            fact.changed = report
                .problems
                .iter()
                .map(|p| match p {
                    Problem::Incomplete => "the last pull did not finish".to_string(),
                    Problem::Missing { path } => format!("{path} is missing"),
                    Problem::SizeChanged { path, .. } => format!("{path} changed size"),
                    Problem::Mismatch { path, .. } => {
                        format!("{path} no longer matches its sha256")
                    }
                })
                .collect();
        }
    }
    Ok(Some(fact))
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
    /// Only the files that are not weights ([`WEIGHT_GLOBS`]), the record left
    /// unfinished: what a service's preflight reads (`config.json`, the tokenizer), fetched
    /// before hours go into the shards.
    #[serde(default)]
    pub before_weights: bool,
}

/// The weight files' globs, left out of a [`ModelPull::before_weights`] pass: the formats
/// `huggingface_hub` repositories hold their tensors in.
pub const WEIGHT_GLOBS: &[&str] = &[
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.npz",
];

impl ModelPull {
    /// The first of two passes of this pull: every file but the weights.
    pub fn small_files(&self) -> ModelPull {
        ModelPull {
            before_weights: true,
            ..self.clone()
        }
    }
}

impl ModelPull {
    /// The hub's request for this download (its files, its folder, its token).
    pub fn request(&self) -> crate::hub::PullRequest {
        let mut req =
            crate::hub::PullRequest::new(&self.repo, &self.revision, Path::new(&self.dest));
        req.endpoint = self.endpoint.clone();
        req.include = self.include.clone();
        req.exclude = self.exclude.clone();
        req.token = self.token.clone();
        req.verify_full = self.verify_full;
        req
    }

    /// Runs the download on this machine.
    pub fn run(&self) -> Result<crate::hub::PullReport, super::wire::StepError> {
        let mut req = self.request();
        if self.before_weights {
            req.exclude
                .extend(WEIGHT_GLOBS.iter().map(|g| (*g).to_string()));
            req.first_pass = true;
        }
        crate::hub::pull(&req, &Reporter::default()).map_err(|e| super::wire::StepError {
            message: e.to_string(),
            hints: e.hints(),
        })
    }
}

/// Turns a pull's events into [`crate::progress::Progress`] reports: each file's bytes at
/// most once a second, with the pull's total, its rate over the last seconds and an ETA.
#[derive(Default)]
struct Reporter(std::sync::Mutex<Tally>);

#[derive(Default)]
struct Tally {
    total: u64,
    done: u64,
    /// Per file: (bytes on disk, size, when last reported).
    files: std::collections::HashMap<String, (u64, u64, Option<std::time::Instant>)>,
    /// The start of the rate's window and `done` then.
    window: Option<(std::time::Instant, u64)>,
    rate: u64,
}

impl crate::hub::ProgressSink for Reporter {
    fn event(&self, event: &crate::hub::PullEvent<'_>) {
        use crate::hub::PullEvent;
        use crate::progress::{Progress, line, report};
        use std::time::{Duration, Instant};
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            PullEvent::Planned {
                bytes_total,
                bytes_to_fetch,
                files_to_fetch,
                ..
            } => {
                t.total = *bytes_total;
                t.done = bytes_total.saturating_sub(*bytes_to_fetch);
                t.window = Some((Instant::now(), t.done));
                line(&format!(
                    "{files_to_fetch} file(s) to fetch, {bytes_to_fetch} of {bytes_total} bytes"
                ));
            }
            PullEvent::Checking { files, bytes } => {
                line(&format!(
                    "checking {files} file(s) already there ({bytes} bytes)"
                ));
            }
            PullEvent::Hashed { path, .. } => report(Progress::Checked {
                file: path.to_string(),
            }),
            PullEvent::Retry { path, reason } => line(&format!("retry {path}: {reason}")),
            PullEvent::FileStarted {
                path,
                size,
                resumed,
            } => {
                t.files.insert(path.to_string(), (*resumed, *size, None));
            }
            PullEvent::Bytes { path, bytes } => {
                t.done += bytes;
                let now = Instant::now();
                if let Some((since, at)) = t.window {
                    let secs = now.duration_since(since).as_secs_f64();
                    if secs >= 1.0 {
                        t.rate = ((t.done - at) as f64 / secs) as u64;
                    }
                    // A window of a few seconds: the rate follows the link, not the past.
                    if secs >= 5.0 {
                        t.window = Some((now, t.done));
                    }
                }
                let (done, total, rate) = (t.done, t.total, t.rate);
                let Some(f) = t.files.get_mut(*path) else {
                    return;
                };
                f.0 += bytes;
                if f.2
                    .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
                {
                    return;
                }
                f.2 = Some(now);
                report(Progress::Bytes {
                    file: path.to_string(),
                    file_done: f.0,
                    file_size: f.1,
                    done,
                    total,
                    rate,
                    eta_secs: (rate > 0).then(|| total.saturating_sub(done) / rate),
                });
            }
            PullEvent::FileDone { path, size } => {
                t.files.remove(*path);
                let (done, total, rate) = (t.done, t.total, t.rate);
                report(Progress::Bytes {
                    file: path.to_string(),
                    file_done: *size,
                    file_size: *size,
                    done,
                    total,
                    rate,
                    eta_secs: (rate > 0).then(|| total.saturating_sub(done) / rate),
                });
            }
            PullEvent::Resolved { .. } => {}
        }
    }
}

/// How long a download may go without a byte before it counts as stalled, unless
/// `PROVISION_DOWNLOAD_STALL_SECS` says otherwise.
pub const DOWNLOAD_STALL: std::time::Duration = std::time::Duration::from_secs(10 * 60);

fn download_stall() -> std::time::Duration {
    std::env::var("PROVISION_DOWNLOAD_STALL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(DOWNLOAD_STALL, std::time::Duration::from_secs)
}

/// Probe: a model folder's verification record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ModelProbe {
    /// The model's folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for ModelProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Model(read(
            std::path::Path::new(&self.path),
            verify_full,
        )?))
    }
}

impl crate::resources::wire::AgentStep for ModelPull {
    fn describe(&self) -> String {
        if self.before_weights {
            format!(
                "download {}@{}'s small files (all but the weights) into {}, for the preflight",
                self.repo, self.revision, self.dest
            )
        } else {
            format!(
                "download {}@{} into {}",
                self.repo, self.revision, self.dest
            )
        }
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        ModelPull::run(self).map(|r| serde_json::to_value(r).ok())
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Stall(download_stall())
    }
}
