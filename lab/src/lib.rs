//! A Proxmox VE node simulator whose containers are real LXC containers.
//!
//! `pve-lab serve` answers the Proxmox API on 127.0.0.1:8006; `pve-lab up` starts it with a
//! lab bridge, a node sshd with `pct` on its PATH, and a static mirror for containers.
//! [`testkit`] gives other crates' tests real containers through the same API.

pub mod client;
/// Proxmox's formats and errors live in the `pve` crate, shared with provision.
pub use ::pve;
pub use ::pve::error;
pub mod control;
pub mod gpu;
pub mod node;
pub mod paths;
pub mod pct;
pub mod server;
pub mod testkit;
