//! The tests that need no lab and no network: the CLI offline, validation, the node's plan
//! without a node, `systemd-analyze verify` of rendered units, the agent's ELF headers.
//! One binary (one link of the crate) for all of them.

mod agent_elf;
mod cli;
#[path = "../support/cli.rs"]
mod cli_support;
mod engine;
mod imports;
mod node_plan;
mod systemd_verify;
mod validation;
