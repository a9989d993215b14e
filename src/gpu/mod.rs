//! GPU facts on the node and checks in the guest (NVIDIA), and the NCCL preflight.
//!
//! Everything here reads through a [`Transport`](crate::transport::Transport), so the same
//! code runs locally (`provision gpu …` on a GPU machine), over SSH on the Proxmox node and
//! inside the guest. Each reader batches its commands into one round trip ([`probe`]) and
//! hands the raw text to pure parsers ([`parse`]) that the tests feed real outputs to.

pub mod checks;
pub mod facts;
pub mod nccl;
pub mod parse;
pub mod probe;

pub use checks::{CheckReport, CheckStatus, GuestExpectations, run_guest_checks};
pub use facts::{FactSources, NodeFacts, gather_node_facts};
pub use nccl::{NcclOptions, NcclOutcome, NcclRun, run_preflight};

/// Parses a GPU named on the command line: an index (`0`) or a UUID (`GPU-…`).
pub fn parse_gpu_selector(s: &str) -> Result<crate::inventory::container::GpuSelector, String> {
    use crate::inventory::container::GpuSelector;
    let s = s.trim();
    if let Ok(i) = s.parse::<u32>() {
        return Ok(GpuSelector::Index(i));
    }
    let groups: Vec<&str> = s.strip_prefix("GPU-").unwrap_or("").split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        Ok(GpuSelector::Uuid(s.to_string()))
    } else {
        Err(format!(
            "`{s}` is neither a GPU index nor a GPU UUID (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`)"
        ))
    }
}
