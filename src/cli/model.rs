//! `provision model pull|verify|status`: the model store's engine, by hand (pre-seeding a
//! store, audits).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::hub::{self, Event, HubError, NoProgress, ProgressSink, PullRequest};
use crate::inventory::secret::Secret;
use crate::inventory::units::Size;
use crate::printer::Printer;

/// Arguments of `provision model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Download a model from a Hugging Face hub, verifying every file (exit 0 done and
    /// verified, 1 error).
    Pull(PullArgs),
    /// Verify a model folder against its verification record (exit 0 verified, 2 mismatch or
    /// missing files, 1 error).
    Verify(VerifyArgs),
    /// Metadata-only state of a model folder, no hashing (exit 0 verified, 2 not).
    Status(StatusArgs),
}

#[derive(Debug, Args)]
struct PullArgs {
    /// The repo: `org/name`, or `org/name@REVISION` (a branch, tag or commit; `main` when
    /// left out).
    #[arg(value_name = "REPO[@REVISION]")]
    repo: String,
    /// The model folder.
    dest: PathBuf,
    /// The hub's URL (a mirror).
    #[arg(long, env = "HF_ENDPOINT", default_value = hub::DEFAULT_ENDPOINT)]
    endpoint: String,
    /// Environment variable holding a token, for gated or private repos.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Only files matching this glob (repeatable; `*` matches `/` too).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Leave out files matching this glob (repeatable).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Connections in flight, all files together.
    #[arg(long, default_value_t = hub::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Range size: larger files are fetched in parallel ranges of this size.
    #[arg(long, default_value = "64M", value_parser = Size::parse)]
    chunk_size: Size,
    /// Re-hash files already in place instead of trusting the verification record.
    #[arg(long)]
    verify_full: bool,
    /// Print the report as JSON (no progress bars).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// The model folder.
    dest: PathBuf,
    /// Re-hash every file (otherwise only files whose size, mtime or inode changed).
    #[arg(long)]
    full: bool,
    /// Files hashed at once (all cores when 0).
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The model folder.
    dest: PathBuf,
    /// The commit expected.
    #[arg(long)]
    commit: Option<String>,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `provision model`.
pub fn run(args: &ModelArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    match &args.command {
        ModelCommand::Pull(a) => pull(a, printer),
        ModelCommand::Verify(a) => verify(a, printer),
        ModelCommand::Status(a) => status(a, printer),
    }
}

/// A [`HubError`] as a diagnostic with its hints.
fn diagnose(err: HubError) -> anyhow::Error {
    let mut d = Diagnostic::new(err.to_string());
    if let HubError::Gated {
        message: Some(m), ..
    } = &err
    {
        d = d.cause(format!("the hub says: {m}"));
    }
    for h in err.hints() {
        d = d.hint(h);
    }
    anyhow::Error::new(d)
}

fn token(var: &str) -> anyhow::Result<Secret> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(Secret::new(v.trim().to_string())),
        _ => Err(anyhow::Error::new(
            Diagnostic::new(format!("environment variable `{var}` is not set")).hint(format!(
                "export {var}=hf_... first (its value is never printed)"
            )),
        )),
    }
}

fn pull(a: &PullArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let (repo, revision) = match a.repo.split_once('@') {
        Some((r, rev)) if !rev.is_empty() => (r, rev),
        _ => (a.repo.as_str(), "main"),
    };
    if repo.is_empty() || repo.starts_with('/') || repo.ends_with('/') {
        return Err(anyhow::Error::new(
            Diagnostic::new(format!("`{}` is not a repo name", a.repo))
                .hint("write it as org/name or org/name@revision"),
        ));
    }
    let mut req = PullRequest::new(repo, revision, &a.dest);
    req.endpoint = a.endpoint.clone();
    req.include = a.include.clone();
    req.exclude = a.exclude.clone();
    req.concurrency = a.concurrency;
    req.chunk_size = a.chunk_size.bytes();
    req.verify_full = a.verify_full;
    req.token = a.token_env.as_deref().map(token).transpose()?;
    let report = if printer.progress() && !a.json {
        let bars = Bars::new();
        let r = hub::pull(&req, &bars);
        bars.clear();
        r
    } else {
        hub::pull(&req, &NoProgress)
    }
    .map_err(diagnose)?;
    if a.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&report)?));
        return Ok(ExitStatus::Success);
    }
    let fetched = if report.bytes_fetched > 0 {
        let rate = report.bytes_fetched as f64 / report.duration_s.max(1e-3);
        format!(
            "{} fetched in {:.1} s ({}/s)",
            hub::error::size(report.bytes_fetched),
            report.duration_s,
            hub::error::size(rate as u64)
        )
    } else {
        "nothing to fetch".to_string()
    };
    let mut text = format!(
        "Pulled {}@{} (commit {}) into {}\n  {} files, {}: {} fetched, {} already verified, {} found in place; {fetched}\n",
        report.repo,
        report.revision,
        report.commit,
        report.dest.display(),
        report.files,
        hub::error::size(report.bytes_total),
        report.files_fetched,
        report.files_kept,
        report.files_adopted,
    );
    if report.bytes_resumed > 0 {
        text += &format!(
            "  resumed {} from an earlier run\n",
            hub::error::size(report.bytes_resumed)
        );
    }
    for f in &report.files_refetched {
        text += &format!("  {f}: checksum mismatch, fetched again\n");
    }
    text += "  every file verified by its checksum\n";
    printer.result(&text);
    Ok(ExitStatus::Success)
}

fn verify(a: &VerifyArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let report = hub::verify(&a.dest, a.full, a.jobs, &NoProgress).map_err(diagnose)?;
    if a.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&report)?));
    } else {
        let how = if report.full {
            "every file hashed".to_string()
        } else {
            format!("metadata, {} files hashed", report.hashed_files)
        };
        let mut text = format!(
            "{} {} at {} in {}: {} files, {} ({how}) in {:.2} s\n",
            if report.ok() { "Verified" } else { "FAILED" },
            report.repo,
            report.commit,
            a.dest.display(),
            report.files,
            hub::error::size(report.bytes),
            report.duration_s,
        );
        for p in &report.problems {
            text += &match p {
                hub::Problem::Incomplete => "  incomplete: the last pull did not finish\n".into(),
                hub::Problem::Missing { path } => format!("  missing: {path}\n"),
                hub::Problem::SizeChanged {
                    path,
                    expected,
                    actual,
                } => format!("  size changed: {path}: {actual} bytes, expected {expected}\n"),
                hub::Problem::Mismatch {
                    path,
                    expected,
                    actual,
                } => format!("  checksum mismatch: {path}: sha256 {actual}, expected {expected}\n"),
            };
        }
        printer.result(&text);
    }
    if report.ok() {
        return Ok(ExitStatus::Success);
    }
    printer
        .status("hint: `provision model pull` repairs it: the files found wrong left the record");
    Ok(ExitStatus::Changes)
}

fn status(a: &StatusArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let st = hub::status(&a.dest, a.commit.as_deref()).map_err(diagnose)?;
    if a.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&st)?));
    } else {
        let state = serde_json::to_value(st.state)?;
        printer.result(&format!(
            "{}: {} ({} files, {}{})\n",
            a.dest.display(),
            state.as_str().unwrap_or("?"),
            st.files,
            hub::error::size(st.bytes),
            st.commit
                .as_deref()
                .map(|c| format!(", commit {c}"))
                .unwrap_or_default(),
        ));
        for c in &st.changed {
            printer.result(&format!("  changed or missing: {c}\n"));
        }
    }
    Ok(if st.state == hub::StoreState::Verified {
        ExitStatus::Success
    } else {
        ExitStatus::Changes
    })
}

/// Progress bars on stderr: one overall with throughput and ETA, one per large file.
struct Bars {
    multi: MultiProgress,
    total: Mutex<Option<ProgressBar>>,
    files: Mutex<HashMap<String, ProgressBar>>,
}

impl Bars {
    fn new() -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            total: Mutex::new(None),
            files: Mutex::new(HashMap::new()),
        }
    }

    fn clear(&self) {
        if let Some(b) = self.total.lock().expect("bars").take() {
            b.finish_and_clear();
        }
        for (_, b) in self.files.lock().expect("bars").drain() {
            b.finish_and_clear();
        }
        let _ = self.multi.clear();
    }

    fn bar(&self, len: u64, prefix: String) -> ProgressBar {
        let style = ProgressStyle::with_template(
            "{prefix:>32!} [{wide_bar}] {binary_bytes:>10}/{binary_total_bytes:<10} {binary_bytes_per_sec:>12} eta {eta}",
        )
        .expect("template")
        .progress_chars("=> ");
        let b = self
            .multi
            .add(ProgressBar::new(len).with_style(style).with_prefix(prefix));
        b.enable_steady_tick(Duration::from_millis(200));
        b
    }
}

/// Files below this get no bar of their own (they would only flicker).
const FILE_BAR_MIN: u64 = 8 << 20;

impl ProgressSink for Bars {
    fn event(&self, event: &Event<'_>) {
        match event {
            Event::Planned { bytes_to_fetch, .. } if *bytes_to_fetch > 0 => {
                *self.total.lock().expect("bars") = Some(self.bar(*bytes_to_fetch, "total".into()));
            }
            Event::Checking { files, bytes } => {
                *self.total.lock().expect("bars") =
                    Some(self.bar(*bytes, format!("hashing {files} files")));
            }
            Event::Hashed { bytes, .. } => {
                if let Some(t) = &*self.total.lock().expect("bars") {
                    t.inc(*bytes);
                }
            }
            Event::FileStarted {
                path,
                size,
                resumed,
            } if *size >= FILE_BAR_MIN => {
                let name = path.rsplit('/').next().unwrap_or(path).to_string();
                let b = self.bar(*size, name);
                b.set_position(*resumed);
                self.files.lock().expect("bars").insert(path.to_string(), b);
            }
            Event::Bytes { path, bytes } => {
                if let Some(t) = &*self.total.lock().expect("bars") {
                    t.inc(*bytes);
                }
                if let Some(b) = self.files.lock().expect("bars").get(*path) {
                    b.inc(*bytes);
                }
            }
            Event::FileDone { path, .. } => {
                if let Some(b) = self.files.lock().expect("bars").remove(*path) {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
            }
            Event::Retry { path, reason } => {
                let _ = self.multi.println(format!("retry {path}: {reason}"));
            }
            _ => {}
        }
    }
}
