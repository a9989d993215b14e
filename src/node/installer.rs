//! A guest whose apply needs its node first: NVIDIA's `.run` is fetched by the node (the
//! agent's one download, run on the node, into the node's cache, sha256 checked before it
//! is kept) and pushed into the container with `pct push`; then the guest's own steps run,
//! the userspace install checking the pushed file's sha256 again. A real GPU container may
//! not reach NVIDIA's download server; the node is where the driver's files belong.

use std::sync::Arc;
use std::time::Instant;

use crate::access::{AccessError, NodeOp, Op, OpOutcome, TargetReader, TargetWriter};
use crate::resources::gpu_userspace;
use crate::resources::wire::{Facts, Probe, Step};
use crate::transport::Transport;
use crate::transport::pct::PctTransport;

/// The node side of a guest's apply: its agent on the node and `pct push` into `vmid`.
pub struct NodeSide {
    /// The agent on the node, over the node's SSH as root.
    pub agent: Box<dyn TargetWriter>,
    /// The node's SSH as root, for `pct push`.
    pub node: Arc<dyn Transport>,
    /// The guest's container.
    pub vmid: u32,
}

/// A guest's writer that runs the node's steps ([`NodeOp::PushInstaller`]) on the node
/// and every other operation in the guest, in order.
pub struct GuestWithNode {
    guest: Box<dyn TargetWriter>,
    node: Option<NodeSide>,
}

impl GuestWithNode {
    /// `guest` for the guest's steps; `node` for node steps (none: they are refused).
    pub fn new(guest: Box<dyn TargetWriter>, node: Option<NodeSide>) -> Self {
        GuestWithNode { guest, node }
    }
}

impl NodeSide {
    /// Fetches the installer into the node's cache, then pushes it into the container.
    fn push_installer(
        &self,
        address: &str,
        url: &str,
        sha256: &str,
    ) -> Result<Vec<OpOutcome>, AccessError> {
        let started = Instant::now();
        let fetch = Op::Guest(Step::FetchInstaller(
            crate::resources::gpu_userspace::FetchInstallerStep {
                url: url.to_string(),
                sha256: sha256.to_string(),
            },
        ));
        let mut outcomes = self.agent.run(std::slice::from_ref(&fetch))?;
        if outcomes.len() != 1 || outcomes[0].error.is_some() {
            return Ok(outcomes);
        }
        let mut outcome = outcomes.remove(0);
        let cached = gpu_userspace::node_cached_path(url, sha256);
        let path = gpu_userspace::cached_path(url);
        PctTransport::new(self.node.clone(), self.vmid)
            .push_file(&cached, &path, 0o700)
            .map_err(|e| AccessError::Node {
                address: address.to_string(),
                source: Box::new(crate::node::NodeError::from(e)),
            })?;
        outcome.description = format!(
            "{}, then pct push {cached} to {path} in CT {}",
            outcome.description, self.vmid
        );
        outcome.millis = started.elapsed().as_millis() as u64;
        Ok(vec![outcome])
    }
}

impl TargetReader for GuestWithNode {
    fn describe(&self) -> String {
        self.guest.describe()
    }

    fn read(&self, probes: &[Probe]) -> Result<Facts, AccessError> {
        self.guest.read(probes)
    }

    fn not_read(&self) -> Option<String> {
        self.guest.not_read()
    }
}

impl TargetWriter for GuestWithNode {
    /// Node steps on the node, runs of other operations in the guest, in order; the first
    /// failure stops it.
    fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
        let mut results = Vec::new();
        let mut rest = ops;
        while !rest.is_empty() {
            let guest = rest
                .iter()
                .position(|op| matches!(op, Op::Node(_)))
                .unwrap_or(rest.len());
            if guest > 0 {
                let done = self.guest.run(&rest[..guest])?;
                let stop = done.len() < guest || done.iter().any(|o| o.error.is_some());
                results.extend(done);
                if stop {
                    return Ok(results);
                }
                rest = &rest[guest..];
                continue;
            }
            let op = &rest[0];
            let (
                Some(node),
                Op::Node(NodeOp::PushInstaller {
                    address,
                    url,
                    sha256,
                }),
            ) = (&self.node, op)
            else {
                return Err(AccessError::Unsupported {
                    target: self.guest.describe(),
                    what: op.describe(),
                });
            };
            let done = node.push_installer(address, url, sha256)?;
            let failed = done.iter().any(|o| o.error.is_some());
            results.extend(done);
            if failed {
                return Ok(results);
            }
            rest = &rest[1..];
        }
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::transport::{ExecOutput, TransportError};

    /// Records what it was asked to run; the fetch fails when `fail` is set.
    struct Recorder {
        log: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl TargetReader for Recorder {
        fn describe(&self) -> String {
            "recorder".into()
        }
        fn read(&self, _probes: &[Probe]) -> Result<Facts, AccessError> {
            unreachable!("not read here")
        }
    }

    impl TargetWriter for Recorder {
        fn run(&self, ops: &[Op]) -> Result<Vec<OpOutcome>, AccessError> {
            Ok(ops
                .iter()
                .map(|op| {
                    self.log.lock().unwrap().push(op.describe());
                    OpOutcome {
                        description: op.describe(),
                        error: self.fail.then(|| "refused".to_string()),
                        hints: Vec::new(),
                        detail: None,
                        millis: 0,
                    }
                })
                .collect())
        }
    }

    impl Transport for Recorder {
        fn exec(&self, command: &str, _: &[u8], _: Duration) -> Result<ExecOutput, TransportError> {
            self.log.lock().unwrap().push(command.to_string());
            Ok(ExecOutput {
                status: Some(0),
                stdout: Vec::new(),
                stderr: Vec::new(),
            })
        }
        fn describe(&self) -> String {
            "node".into()
        }
    }

    fn writer(log: &Arc<Mutex<Vec<String>>>, fail_fetch: bool) -> GuestWithNode {
        let rec = |fail| Recorder {
            log: log.clone(),
            fail,
        };
        GuestWithNode::new(
            Box::new(rec(false)),
            Some(NodeSide {
                agent: Box::new(rec(fail_fetch)),
                node: Arc::new(rec(false)),
                vmid: 9268,
            }),
        )
    }

    fn ops() -> Vec<Op> {
        let url = "http://m/NVIDIA-Linux-x86_64-580.159.04.run";
        vec![
            Op::Node(NodeOp::PushInstaller {
                address: "guest.g/gpu_userspace:nvidia".into(),
                url: url.into(),
                sha256: "AB".repeat(32),
            }),
            Op::Guest(Step::InstallUserspace(
                crate::resources::gpu_userspace::InstallUserspaceStep {
                    url: url.into(),
                    sha256: "ab".into(),
                    version: "580.159.04".into(),
                },
            )),
        ]
    }

    #[test]
    fn the_node_fetches_and_pushes_before_the_guest_installs_one_outcome_per_op() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let out = writer(&log, false).run(&ops()).unwrap();
        assert_eq!(out.len(), 2);
        let log = log.lock().unwrap();
        assert!(log[0].starts_with("fetch http://m/"), "{log:?}");
        assert!(
            log[1].contains(&format!(
                "pct push 9268 /var/cache/provision/nvidia/{}/NVIDIA-Linux-x86_64-580.159.04.run /var/cache/provision/nvidia/NVIDIA-Linux-x86_64-580.159.04.run.provision-push",
                "ab".repeat(32)
            )),
            "{log:?}"
        );
        assert!(log[2].starts_with("install NVIDIA userspace"), "{log:?}");
    }

    #[test]
    fn a_refused_fetch_pushes_nothing_and_runs_nothing_in_the_guest() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let out = writer(&log, true).run(&ops()).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].error.is_some());
        assert_eq!(log.lock().unwrap().len(), 1, "only the fetch ran");
    }
}
