//! `provision model pull|verify|status`: the model store's engine, by hand (pre-seeding a
//! store, audits).

mod pull;
mod status;
mod verify;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::hub::{HubError, ProgressSink, PullEvent};
use crate::inventory::secret::Secret;
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
    Pull(pull::PullArgs),
    /// Verify a model folder against its verification record (exit 0 verified, 2 mismatch or
    /// missing files, 1 error).
    Verify(verify::VerifyArgs),
    /// Metadata-only state of a model folder, no hashing (exit 0 verified, 2 not).
    Status(status::StatusArgs),
}

/// Runs `provision model`.
pub fn run(args: &ModelArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    match &args.command {
        ModelCommand::Pull(a) => pull::run(a, printer),
        ModelCommand::Verify(a) => verify::run(a, printer),
        ModelCommand::Status(a) => status::run(a, printer),
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
    fn event(&self, event: &PullEvent<'_>) {
        match event {
            PullEvent::Planned { bytes_to_fetch, .. } if *bytes_to_fetch > 0 => {
                *self.total.lock().expect("bars") = Some(self.bar(*bytes_to_fetch, "total".into()));
            }
            PullEvent::Checking { files, bytes } => {
                *self.total.lock().expect("bars") =
                    Some(self.bar(*bytes, format!("hashing {files} files")));
            }
            PullEvent::Hashed { bytes, .. } => {
                if let Some(t) = &*self.total.lock().expect("bars") {
                    t.inc(*bytes);
                }
            }
            PullEvent::FileStarted {
                path,
                size,
                resumed,
            } if *size >= FILE_BAR_MIN => {
                let name = path.rsplit('/').next().unwrap_or(path).to_string();
                let b = self.bar(*size, name);
                b.set_position(*resumed);
                self.files.lock().expect("bars").insert(path.to_string(), b);
            }
            PullEvent::Bytes { path, bytes } => {
                if let Some(t) = &*self.total.lock().expect("bars") {
                    t.inc(*bytes);
                }
                if let Some(b) = self.files.lock().expect("bars").get(*path) {
                    b.inc(*bytes);
                }
            }
            PullEvent::FileDone { path, .. } => {
                if let Some(b) = self.files.lock().expect("bars").remove(*path) {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
            }
            PullEvent::Retry { path, reason } => {
                let _ = self.multi.println(format!("retry {path}: {reason}"));
            }
            _ => {}
        }
    }
}
