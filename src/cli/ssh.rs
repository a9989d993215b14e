//! SSH connections to guests, from the inventory and the command line.

use std::sync::Arc;

use super::targets::TargetArgs;
use crate::diagnostic::Diagnostic;
use crate::inventory::Inventory;
use crate::transport::Transport;

/// An SSH transport to the inside of container `name`.
pub fn guest_transport(
    _inventory: &Inventory,
    name: &str,
    _args: &TargetArgs,
) -> anyhow::Result<Arc<dyn Transport>> {
    Err(Diagnostic::new(format!(
        "cannot reach guest `{name}`: the SSH transport is not built yet"
    ))
    .into())
}
