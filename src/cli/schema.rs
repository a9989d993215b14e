//! `provision schema`: the inventory's JSON Schema, for editors.

use clap::Args;

use super::ExitStatus;
use crate::printer::Printer;

/// Arguments of `provision schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {}

/// Prints the schema. Point editors at it with
/// `# yaml-language-server: $schema=<path or URL of the saved schema>`.
pub fn run(_args: &SchemaArgs, printer: &Printer) -> anyhow::Result<ExitStatus> {
    let schema = crate::inventory::json_schema();
    printer.result(&format!("{}\n", serde_json::to_string_pretty(&schema)?));
    Ok(ExitStatus::Success)
}
