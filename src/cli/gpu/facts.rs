//! `provision gpu facts`: the node's GPU facts, read here.

use clap::Args;

use super::{Capture, save_raw};
use crate::cli::ExitStatus;
use crate::diagnostic::Diagnostic;
use crate::gpu::{self, FactSources, NodeFacts};
use crate::printer::Printer;
use crate::transport::local::LocalTransport;

/// Arguments of `provision gpu facts`.
#[derive(Debug, Args)]
pub struct FactsArgs {
    /// Print the facts as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    capture: Capture,
}

/// Runs the verb.
pub fn run(
    args: &FactsArgs,
    transport: &LocalTransport,
    printer: &Printer,
) -> anyhow::Result<ExitStatus> {
    let sources = FactSources {
        root: args.capture.root.clone(),
    };
    let (facts, raw) = gpu::facts::gather_node_facts_raw(transport, &sources)?;
    save_raw(args.capture.save_raw.as_deref(), &raw)?;
    if args.json {
        printer.result(&format!("{}\n", serde_json::to_string_pretty(&facts)?));
    } else {
        printer.result(&render_facts(&facts));
    }
    if facts.problems.is_empty() {
        return Ok(ExitStatus::Success);
    }
    for p in &facts.problems {
        printer.error(
            &Diagnostic::new(&p.message)
                .hint(&p.hint)
                .render(printer.color_err()),
        );
    }
    Ok(ExitStatus::Failure)
}

/// Node facts for people.
pub fn render_facts(facts: &NodeFacts) -> String {
    let mut out = String::new();
    match &facts.driver {
        Some(d) => {
            let kind = if d.open { "open" } else { "proprietary" };
            out += &format!("driver   {} ({kind} kernel module)\n", d.version);
        }
        None => out += "driver   none loaded\n",
    }
    for g in &facts.gpus {
        out += &format!(
            "GPU {:<4} {}  {}  {} MiB  {}  {}\n",
            g.info.index,
            g.info.uuid,
            g.info.name,
            g.info.memory_mib,
            g.info.pci_bus_id,
            g.device_path().unwrap_or_else(|| "no device node".into())
        );
    }
    let majors: Vec<String> = facts
        .majors
        .iter()
        .map(|m| format!("{} {}", m.name, m.major))
        .collect();
    out += &format!("majors   {}\n", or_none(&majors));
    let nodes: Vec<String> = facts
        .device_nodes
        .iter()
        .map(|n| format!("{} {}:{}", n.path, n.major, n.minor))
        .collect();
    out += &format!("nodes    {}\n", or_none(&nodes));
    out
}

fn or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}
