//! GPU facts on the node and checks in the guest (NVIDIA), and the NCCL preflight.
//!
//! Everything here reads through a [`Transport`](crate::transport::Transport), so the same
//! code runs locally (`provision gpu …` on a GPU machine), over SSH on the Proxmox node and
//! inside the guest. Each reader batches its commands into one round trip ([`probe`]) and
//! hands the raw text to pure parsers ([`parse`]) that the tests feed real outputs to.

pub mod checks;
pub mod facts;
pub mod nccl;
pub mod nccl_report;
pub mod parse;
pub mod probe;

pub use checks::{CheckReport, CheckStatus, GuestExpectations, run_guest_checks};
pub use facts::{FactSources, NodeFacts, gather_node_facts};
pub use nccl::{NcclOptions, NcclOutcome, NcclRun, run_preflight};

/// Parses a GPU named on the command line: an index (`0`) or a UUID (`GPU-…`).
pub fn parse_gpu_selector(
    s: &str,
) -> Result<crate::inventory::container::GpuSelector, crate::inventory::text::ValueError> {
    crate::inventory::container::GpuSelector::parse(s)
}
