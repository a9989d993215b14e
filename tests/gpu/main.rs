//! GPU facts, checks, passthrough and the NCCL preflight, from captured machine outputs
//! and a fake node (`support/gpunode.rs`). One binary for the area.

#[path = "../support/cli.rs"]
mod cli_support;
#[path = "../support/gpunode.rs"]
mod gpunode;
#[path = "../support/guard.rs"]
mod guard;

mod checks;
mod cli;
mod facts;
mod nccl;
mod parse;
mod passthrough;
