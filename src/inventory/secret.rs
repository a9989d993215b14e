//! Secrets (API tokens, Hugging Face tokens) are referenced, never written in the inventory:
//! `token: { env: PVE_TOKEN }` or `token: { file: ~/.config/provision/pve-token }`.
//! Their values live in [`Secret`], which never prints itself.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::text::{EnvName, LocalPath, ValueError};

/// The start of the error for a secret written inline; the loader also hides the source
/// line of such an error, since that line holds the secret.
pub const INLINE_SECRET_ERROR: &str = "secrets must not be written in the inventory";

/// Where a secret's value is found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretRef {
    /// An environment variable of the process running provision.
    Env(EnvName),
    /// A file (first line, trimmed), relative to the inventory file's folder or from `~/`.
    File(LocalPath),
}

/// A secret value. Never printed: `Debug` and `Display` show `<redacted>`. It serializes
/// as its value only to travel to the agent on stdin (never on a command line).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The value, for the one place that must send it (an HTTP header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why a secret could not be read. Never contains the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The variable is not set or empty.
    #[error("environment variable `{0}` is not set")]
    EnvMissing(String),
    /// The file could not be read.
    #[error("cannot read secret file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("secret file {0} is empty")]
    Empty(PathBuf),
}

impl SecretRef {
    /// Where the value is, for messages (`env PVE_TOKEN`, `file ~/.pve-token`).
    pub fn describe(&self) -> String {
        match self {
            SecretRef::Env(name) => format!("env {name}"),
            SecretRef::File(path) => format!("file {path}"),
        }
    }

    /// Reads the value now; relative files are taken from `base_dir`.
    pub fn resolve(&self, base_dir: &Path) -> Result<Secret, SecretError> {
        match self {
            SecretRef::Env(name) => match std::env::var(name.as_str()) {
                Ok(v) if !v.trim().is_empty() => Ok(Secret(v.trim().to_string())),
                _ => Err(SecretError::EnvMissing(name.to_string())),
            },
            SecretRef::File(path) => {
                let full = resolve_local(path, base_dir);
                let text = std::fs::read_to_string(&full).map_err(|source| SecretError::File {
                    path: full.clone(),
                    source,
                })?;
                let first = text.lines().next().unwrap_or("").trim();
                if first.is_empty() {
                    return Err(SecretError::Empty(full));
                }
                Ok(Secret(first.to_string()))
            }
        }
    }
}

/// Resolves a [`LocalPath`]: `~/x` from `$HOME`, relative paths from `base_dir`.
pub fn resolve_local(path: &LocalPath, base_dir: &Path) -> PathBuf {
    let s = path.as_str();
    if let Some(rest) = s.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    let p = Path::new(s);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    }
}

impl<'de> Deserialize<'de> for SecretRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SecretRef;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a reference `{ env: VAR }` or `{ file: PATH }`")
            }
            // Any scalar here is a secret written inline. The message must not repeat it.
            fn visit_str<E: de::Error>(self, _: &str) -> Result<SecretRef, E> {
                Err(E::custom(ValueError::new(INLINE_SECRET_ERROR).hint("reference it instead: `{ env: PVE_TOKEN }` or `{ file: ~/.config/provision/token }`")))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<SecretRef, E> {
                self.visit_str("")
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<SecretRef, E> {
                self.visit_str("")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SecretRef, A::Error> {
                let key: String = map.next_key()?.ok_or_else(|| {
                    de::Error::custom(
                        ValueError::new("empty secret reference")
                            .hint("write `{ env: VAR }` or `{ file: PATH }`"),
                    )
                })?;
                let value = match key.as_str() {
                    "env" => SecretRef::Env(map.next_value()?),
                    "file" => SecretRef::File(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(
                            ValueError::new(format!("unknown secret source `{other}`"))
                                .hint("use `env` or `file`"),
                        ));
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom(
                        ValueError::new("a secret reference names exactly one source")
                            .hint("keep either `env` or `file`"),
                    ));
                }
                Ok(value)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for SecretRef {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("SecretRef")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Where a secret is read from at run time; never the secret itself.",
            "oneOf": [
                {"type": "object", "properties": {"env": {"type": "string", "description": "An environment variable."}}, "required": ["env"], "additionalProperties": false},
                {"type": "object", "properties": {"file": {"type": "string", "description": "A file whose first line is the secret (relative to the inventory, or ~/)."}}, "required": ["file"], "additionalProperties": false}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints() {
        let s = Secret::new("root@pam!ci=abcdef".into());
        assert_eq!(format!("{s} {s:?}"), "<redacted> <redacted>");
    }

    #[test]
    fn resolves_env_and_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "s3cret\n").unwrap();
        let r = SecretRef::File(LocalPath::parse("tok").unwrap());
        assert_eq!(r.resolve(dir.path()).unwrap().expose(), "s3cret");
        let r = SecretRef::Env(EnvName::parse("PROVISION_TEST_UNSET_VAR").unwrap());
        assert!(matches!(
            r.resolve(dir.path()),
            Err(SecretError::EnvMissing(_))
        ));
    }
}
