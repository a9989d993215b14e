//! What the commands that reach real targets share: choosing targets (`--target`) and the
//! flags a session is opened with (`crate::session` connects and reads).

use std::path::PathBuf;

use clap::Args;
use clap::builder::TypedValueParser;

use super::from_session;
use crate::engine::DesiredTarget;
use crate::engine::schedule::{self, Limits};
use crate::session::Settings;
use crate::session::plan::{self, ReadOptions};

/// Flags for commands that read or change targets.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Only these targets: `node.NAME` (the node itself: model storage, templates, NVIDIA),
    /// `guest.NAME` (inside the container), `container.NAME` (its Proxmox config), or a
    /// container's NAME for both. Repeatable.
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
    /// Delete the model folders provision downloaded that the inventory no longer declares
    /// (without it they are only named, with their size: data is never deleted by omission).
    #[arg(long)]
    pub prune_models: bool,
    /// Stop and destroy the containers provision created that the inventory no longer
    /// declares (without it they are named; apply refuses while one runs). Bind-mounted
    /// host paths are kept; a container provision did not create is never touched.
    #[arg(long)]
    pub allow_destroy: bool,
    /// When a model to be downloaded fits only once the folder a running service holds is
    /// deleted (with --prune-models), stop that service first: it is down until the new
    /// model is verified and it is deployed again.
    #[arg(long)]
    pub allow_downtime: bool,
    /// Trust any TLS certificate of the nodes' APIs instead of the inventory's `tls:`
    /// (warned about on every run).
    #[arg(long)]
    pub insecure: bool,
    /// How many targets are read or changed at once (containers on different nodes,
    /// guests of different containers); 1 works through them one by one.
    #[arg(long, value_name = "N", default_value_t = schedule::DEFAULT_PARALLELISM,
          value_parser = clap::value_parser!(u16).range(1..=256).map(usize::from))]
    pub parallelism: usize,
    /// How many containers of one Proxmox node are read or changed at once (the node
    /// serializes config locks and storage tasks anyway).
    #[arg(long, value_name = "N", default_value_t = schedule::DEFAULT_PER_NODE,
          value_parser = clap::value_parser!(u16).range(1..=64).map(usize::from))]
    pub per_node: usize,
    /// Stop starting targets after the first one fails (those running finish); without
    /// it every target is tried and the summary covers all.
    #[arg(long)]
    pub fail_fast: bool,
    /// Plan moving a container found on another node of its cluster than declared back to
    /// its declared node. Not built yet: refused with a message saying so.
    #[arg(long)]
    pub migrate: bool,
}

impl TargetArgs {
    /// The concurrency these flags ask for.
    pub fn limits(&self) -> Limits {
        Limits {
            parallelism: self.parallelism,
            per_node: self.per_node,
            fail_fast: self.fail_fast,
        }
    }

    /// What these flags say about reading a plan.
    pub fn read_options(&self) -> ReadOptions {
        ReadOptions {
            targets: self.targets.clone(),
            verify_full: self.verify_full,
            prune_models: self.prune_models,
            allow_destroy: self.allow_destroy,
            allow_downtime: self.allow_downtime,
            migrate: self.migrate,
            limits: self.limits(),
        }
    }

    /// What these flags say about reaching targets, for a session.
    pub fn settings(&self) -> Settings {
        Settings {
            known_hosts: self.known_hosts.clone(),
            accept_new_host_keys: self.accept_new_host_keys,
            verify_full: self.verify_full,
            insecure: self.insecure,
        }
    }
}

/// The desired targets `--target` selects (all without it); an unknown name is an error.
pub fn select(
    desired: Vec<DesiredTarget>,
    args: &TargetArgs,
) -> anyhow::Result<Vec<DesiredTarget>> {
    plan::select(desired, &args.targets).map_err(from_session)
}
