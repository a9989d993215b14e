//! A non-secret setting written in the inventory or taken from the environment at run time:
//! `url: https://10.1.2.6:8006` or `url: { env: PVE_URL }` (what `eval "$(scripts/lab up)"`
//! exports), so one inventory serves a lab and a real node.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::text::{EnvName, Text};

/// A value, or the environment variable that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    /// Written in the inventory.
    Value(Text),
    /// Read from this environment variable when provision runs.
    Env(EnvName),
}

/// A setting whose variable is not set.
#[derive(Debug, thiserror::Error)]
#[error(
    "environment variable `{0}` is not set\nhint: export it, e.g. with `eval \"$(scripts/lab up)\"` for the lab"
)]
pub struct SettingMissing(pub String);

impl Setting {
    /// The literal value, when written in the inventory.
    pub fn literal(&self) -> Option<&str> {
        match self {
            Setting::Value(t) => Some(t.as_str()),
            Setting::Env(_) => None,
        }
    }

    /// The value now.
    pub fn resolve(&self) -> Result<String, SettingMissing> {
        match self {
            Setting::Value(t) => Ok(t.to_string()),
            Setting::Env(name) => match std::env::var(name.as_str()) {
                Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
                _ => Err(SettingMissing(name.to_string())),
            },
        }
    }

    /// For messages: the value, or `env NAME`.
    pub fn describe(&self) -> String {
        match self {
            Setting::Value(t) => t.to_string(),
            Setting::Env(name) => format!("env {name}"),
        }
    }
}

impl<'de> Deserialize<'de> for Setting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Setting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or `{ env: VAR }`")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Setting, E> {
                Text::parse(s).map(Setting::Value).map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Setting, A::Error> {
                let key: Option<String> = map.next_key()?;
                if key.as_deref() != Some("env") {
                    return Err(de::Error::custom(
                        "expected `{ env: VAR }`\nhint: write the value itself, or `{ env: VAR }` to read it from the environment",
                    ));
                }
                let name: EnvName = map.next_value()?;
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom("`{ env: VAR }` takes only `env`"));
                }
                Ok(Setting::Env(name))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Setting {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Setting")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A value, or `{ env: VAR }` to read it from the environment at run time.",
            "oneOf": [
                {"type": "string"},
                {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"], "additionalProperties": false}
            ]
        })
    }
}
