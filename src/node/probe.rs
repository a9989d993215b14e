//! The node's SSH as `plan` and `check` reach it: a fixed set of reads, each one command
//! that only looks (the GPU facts' `cat`/`ls`/`stat`, `test -d`, one `pct exec` that opens
//! a container's device nodes read-only and asks `nvidia-smi` for the driver). The
//! transport is private: holding a [`NodeProbe`] gives no way to run anything else as
//! root. `apply`'s node steps use the transport itself (`node::target`).

use std::sync::Arc;
use std::time::Duration;

use super::NodeError;
use super::gpu::{self, NodeGpus};
use super::gpu_check::{self, Expected, GpuView};
use crate::transport::{Transport, shell_quote};

/// Read-only access to a node over its SSH.
pub struct NodeProbe {
    node: Arc<dyn Transport>,
}

impl NodeProbe {
    /// Reads over `node` (the node's SSH as root), never writing.
    pub fn new(node: Arc<dyn Transport>) -> Self {
        NodeProbe { node }
    }

    /// The node's GPU facts (driver, GPUs and minors, majors), in one round trip, under
    /// `root` (the lab's stand-in `/dev` and `/proc`; empty on real nodes).
    pub fn gpus(&self, root: &str) -> Result<NodeGpus, NodeError> {
        gpu::read(self.node.as_ref(), root)
    }

    /// What running container `vmid` sees of its GPUs, compared with `want`.
    pub fn container_gpus(
        &self,
        vmid: u64,
        gpus: &NodeGpus,
        want: &[Expected],
    ) -> Result<GpuView, NodeError> {
        gpu_check::check(self.node.clone(), vmid, gpus, want)
    }

    /// What running container `vmid` shows of its GPUs, before anything is expected of
    /// it (see [`gpu_check::Seen`]), also under each of `roots`.
    pub fn container_seen(
        &self,
        vmid: u64,
        roots: &[String],
    ) -> Result<gpu_check::Seen, NodeError> {
        gpu_check::read(self.node.clone(), vmid, roots, &[])
    }

    /// Those of `dirs` that are not directories on the node, in one round trip.
    pub fn missing_dirs(&self, dirs: &[&str]) -> Result<Vec<String>, NodeError> {
        let script: String = dirs
            .iter()
            .map(|d| {
                let q = shell_quote(d);
                format!("[ -d {q} ] || echo {q}; ")
            })
            .collect();
        let out = self.node.exec(&script, &[], Duration::from_secs(30))?;
        if !out.success() {
            return Err(NodeError::Command {
                what: "checking host directories".into(),
                target: self.node.describe(),
                status: out.status,
                stderr: super::tail(&out.stderr_text()),
            });
        }
        Ok(out.stdout_text().lines().map(str::to_string).collect())
    }
}
