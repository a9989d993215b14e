//! `provision model verify`.

use std::path::PathBuf;

use clap::Args;

use super::diagnose;
use crate::cli::ExitStatus;
use crate::hub::{self, NoProgress};
use crate::printer::Printer;

#[derive(Debug, Args)]
pub struct VerifyArgs {
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

/// Runs the verb.
pub fn run(a: &VerifyArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
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
