//! `provision model pull`.

use std::path::PathBuf;

use clap::Args;

use super::{Bars, diagnose, token};
use crate::cli::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::hub::{self, NoProgress, PullRequest};
use crate::inventory::units::Size;
use crate::printer::Printer;

#[derive(Debug, Args)]
pub struct PullArgs {
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

/// Runs the verb.
pub fn run(a: &PullArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
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
