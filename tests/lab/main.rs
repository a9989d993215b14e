//! Everything that runs against real lab containers (`lab/`, `docs/lab.md`): guests,
//! containers through the API and the CLI, the node, models, services, rebuilds. One
//! binary (one link of the crate) for the area; needs the lab up and root.

#[path = "../support/cli.rs"]
mod cli_support;
#[path = "../support/guestlab.rs"]
mod guestlab;
#[path = "../support/hub.rs"]
mod hub_support;
#[path = "../support/lab.rs"]
mod lab_support;

mod apt;
mod first_apply;
mod generation;
mod guest;
mod lines;
mod many;
mod model;
mod model_switch;
mod node;
mod node_target;
mod other_guests;
mod pip;
mod proxmox;
mod pve_cli;
mod read_only;
mod rebuild;
mod remove;
mod service;
mod session;
mod stream;
mod undeclared;
mod uv;
