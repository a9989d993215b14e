//! Proxmox VE through its HTTP API: the client (token or root@pam ticket, TLS pinned or
//! CA-verified, retries only where safe), tasks followed to their end, and containers read
//! and changed. Formats and the client itself are the `pve` crate's, shared with the lab.

pub mod client;
pub mod cluster;
pub mod container;
pub mod error;
pub mod storage;
pub mod tasks;

pub use client::{ApiReader, ApiSettings, NodeApi};
pub use error::ProxmoxError;
