//! Proxmox VE in one place, for provision and for the lab that stands in for a node:
//! container configs and their sections, property strings, option types and what Proxmox
//! rewrites in them, UPIDs, the root@pam-only rules, errors as a node reports them, and the
//! one API client (TLS pinned as Proxmox's own client pins) both use.
//!
//! Where PVE 8 and PVE 9 differ, [`Version`] selects the rules. What Proxmox's own code
//! answers is pinned in `tests/fixtures/oracle/` and asserted by `tests/oracle.rs`; the
//! differences kept on purpose are listed there and in `docs/lab.md`.

pub mod client;
pub mod config;
pub mod error;
pub mod formats;
mod lxc_keys;
pub mod normalize;
pub mod options;
pub mod perms;
pub mod propstr;
pub mod tls;
pub mod upid;
pub mod version;

pub use client::{Auth, Client, RetryPolicy};
pub use error::{ApiError, ApiResult};
pub use tls::{Trust, fingerprint};
pub use version::Version;
