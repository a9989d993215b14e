//! The transports on this machine: SSH against a real OpenSSH server of the test's own
//! (`support/sshd.rs`), and the agent through the local transport. One binary for the area.

#[path = "../support/guard.rs"]
mod guard;
#[path = "../support/sshd.rs"]
mod sshd;

mod agent_local;
mod ssh;
