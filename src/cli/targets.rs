//! What the commands that reach real targets share: choosing targets (`--target`) and
//! connecting to them.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::access::{TargetReader, TargetWriter};
use crate::agent::client::{AgentBinary, AgentReader, AgentWriter};
use crate::diagnostic::Diagnostic;
use crate::engine::DesiredTarget;
use crate::inventory::Loaded;
use crate::plan::Target;
use crate::transport::Transport;

/// Flags for commands that read or change targets.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Only these targets: `guest.NAME` (inside the container), `container.NAME` (its
    /// Proxmox config), or a container's NAME for both. Repeatable.
    #[arg(long = "target", value_name = "TARGET")]
    pub targets: Vec<String>,
    /// The SSH known_hosts file (default ~/.ssh/known_hosts).
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Add unknown SSH host keys to known_hosts (a changed key is still refused).
    #[arg(long)]
    pub accept_new_host_keys: bool,
    /// Re-hash every model file on the targets instead of trusting the verification
    /// records' size, mtime and inode (slow for large models; the routine check is
    /// metadata only).
    #[arg(long)]
    pub verify_full: bool,
}

/// The desired targets `--target` selects (all without it); an unknown name is an error.
pub fn select(
    desired: Vec<DesiredTarget>,
    args: &TargetArgs,
) -> anyhow::Result<Vec<DesiredTarget>> {
    if args.targets.is_empty() {
        return Ok(desired);
    }
    for wanted in &args.targets {
        let known = desired.iter().any(|d| {
            let (full, short) = d.target.names();
            *wanted == full || *wanted == short
        });
        if !known {
            let names: Vec<String> = desired.iter().map(|d| d.target.names().0).collect();
            return Err(
                Diagnostic::new(format!("no target `{wanted}` in the inventory"))
                    .hint(format!("targets: {}", names.join(", ")))
                    .into(),
            );
        }
    }
    Ok(desired
        .into_iter()
        .filter(|d| {
            let (full, short) = d.target.names();
            args.targets.iter().any(|w| *w == full || *w == short)
        })
        .collect())
}

/// Read access to a target (for `plan` and `check`).
pub fn connect_reader(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
    binary: &Arc<AgentBinary>,
) -> anyhow::Result<Box<dyn TargetReader>> {
    let transport = transport(loaded, target, args)?;
    Ok(Box::new(
        AgentReader::new(transport, binary.clone()).verify_full(args.verify_full),
    ))
}

/// Write access to a target (for `apply` only).
pub fn connect_writer(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
    binary: &Arc<AgentBinary>,
) -> anyhow::Result<Box<dyn TargetWriter>> {
    let transport = transport(loaded, target, args)?;
    Ok(Box::new(AgentWriter::new(transport, binary.clone())))
}

/// The transport to a target's agent.
fn transport(
    loaded: &Loaded,
    target: &Target,
    args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    match target {
        Target::Guest { name, .. } => crate::cli::ssh::guest_transport(loaded, name, args),
        Target::Container { name, .. } => Err(Diagnostic::new(format!(
            "cannot read container `{name}`'s Proxmox config: the Proxmox API client is not built yet"
        ))
        .hint(format!("limit this run to the inside of the container with `--target guest.{name}`"))
        .into()),
        Target::Node { node, .. } => Err(Diagnostic::new(format!(
            "cannot read node `{node}`: the Proxmox API client is not built yet"
        ))
        .into()),
    }
}
