//! The inventory: what the user declares. Typed (every struct denies unknown fields),
//! parsed with positions kept ([`load`]), and validated in one place ([`validate`]).

pub mod apt;
pub mod container;
pub mod env;
pub mod load;
pub mod node;
pub mod node_setup;
pub mod secret;
pub mod service;
pub mod setting;
pub mod software;
pub mod spanned;
pub mod text;
pub mod units;
pub mod validate;

pub use container::Container;
pub use load::{Loaded, load};
pub use node::{Inventory, Node};
pub use service::Service;
pub use spanned::{Pos, Sp};

/// The JSON Schema of the inventory, for editors (`# yaml-language-server: $schema=...`).
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(Inventory);
    let mut schema = serde_json::to_value(schema).expect("a schema serializes");
    env::allow_env_references(&mut schema);
    schema
}
