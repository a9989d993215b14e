//! provision: builds and keeps a GPU LLM server on Proxmox VE exactly as declared.
//!
//! Data flows one way: [`inventory`] (typed YAML) → desired resources per target
//! ([`compile`], using its `render` for templates and roles) → actual state read in
//! batches → [`plan::Plan`] (a value) → apply executes exactly that plan → verify.

pub mod access;
pub mod agent;
#[cfg(feature = "cli")]
pub mod cli;
pub mod compile;
pub mod diagnostic;
pub mod engine;
pub mod generations;
pub mod gpu;
pub mod health;
pub mod hub;
pub mod inventory;
pub mod machine;
pub mod node;
pub mod openpgp;
pub mod plan;
pub mod printer;
pub mod progress;
pub mod proxmox;
pub mod resources;
#[cfg(feature = "cli")]
pub mod session;
pub mod timing;
pub mod transport;
