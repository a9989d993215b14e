//! The lab's own tests against its running server and real LXC containers: the API,
//! containers, the node's SSH, proxmoxer as an independent client. One binary.

mod common;

mod api;
mod containers;
mod node_ssh;
mod proxmoxer;
