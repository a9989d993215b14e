//! Model downloads against the fake hub (`fakehub/`): the library, the CLI, and the real
//! huggingface_hub client reading what provision wrote. One binary for the area.

#[path = "../support/cli.rs"]
mod cli_support;
#[path = "../support/hub.rs"]
mod hub_support;

mod cli;
mod pull;
mod python;
