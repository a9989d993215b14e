//! Proxmox's own formats: container configs, property strings, UPIDs, tags, permissions.

pub mod config;
pub mod options;
pub mod perms;
pub mod propstr;
pub mod upid;
