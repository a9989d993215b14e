//! `provision model status`.

use std::path::PathBuf;

use clap::Args;

use super::diagnose;
use crate::cli::ExitStatus;
use crate::hub::{self};
use crate::printer::Printer;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The model folder.
    dest: PathBuf,
    /// The commit expected.
    #[arg(long)]
    commit: Option<String>,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the verb.
pub fn run(a: &StatusArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
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
