//! APT repositories a container installs from: the one-line form as written, or a keyed
//! repository (deb822 `.sources` with `Signed-By:` its own keyring, the key fetched from a
//! URL or read from a local file and pinned by fingerprint).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::spanned::Sp;
use super::text::{LocalPath, Name, Text};

/// An APT repository of the container.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AptSource {
    /// Its name: the file is `/etc/apt/sources.list.d/<name>.sources` (keyed) or
    /// `<name>.list` (a one-line `line:`), the keyring `/etc/apt/keyrings/<name>.gpg`.
    pub name: Sp<Name>,
    /// A one-line entry as written, e.g. `deb [trusted=yes] http://10.0.0.1/debian ./`;
    /// instead of `uri`/`suites`/`key`.
    pub line: Option<Sp<Text>>,
    /// The repository's URI (deb822 `URIs:`).
    pub uri: Option<Sp<Text>>,
    /// Suites; a flat repository (NVIDIA's) has the one suite `/`.
    #[serde(default)]
    pub suites: Vec<Sp<Text>>,
    /// Components (none for a flat repository).
    #[serde(default)]
    pub components: Vec<Sp<Text>>,
    /// The key that signs the repository: apt trusts it for this repository only.
    pub key: Option<AptKey>,
    /// Trust the repository without checking signatures (`Trusted: yes`): only when
    /// written here, never by default.
    #[serde(default)]
    pub trusted: Sp<bool>,
}

/// An APT repository without a name of its own (a role's default, overridable).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AptRepository {
    /// The repository's URI (deb822 `URIs:`), e.g. a local mirror.
    pub uri: Sp<Text>,
    /// Suites; a flat repository (NVIDIA's) has the one suite `/`.
    pub suites: Vec<Sp<Text>>,
    /// Components (none for a flat repository).
    #[serde(default)]
    pub components: Vec<Sp<Text>>,
    /// The key that signs the repository.
    pub key: Option<AptKey>,
    /// Trust the repository without checking signatures (`Trusted: yes`).
    #[serde(default)]
    pub trusted: Sp<bool>,
}

/// A repository signing key, pinned by fingerprint: a key that does not have it is
/// refused before anything is written.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AptKey {
    /// Where the container fetches it (armored or binary), e.g. NVIDIA's `3bf863cc.pub`.
    pub url: Option<Sp<Text>>,
    /// A key file on this machine, relative to the inventory (sent with the apply).
    pub file: Option<Sp<LocalPath>>,
    /// The primary key's full fingerprint (40 hex digits; spaces allowed), as
    /// `gpg --show-keys --with-colons` prints it in `fpr`.
    pub fingerprint: Sp<Text>,
}

impl AptSource {
    /// The keyed (deb822) form, when written with `uri:`.
    pub fn repository(&self) -> Option<AptRepository> {
        Some(AptRepository {
            uri: self.uri.clone()?,
            suites: self.suites.clone(),
            components: self.components.clone(),
            key: self.key.clone(),
            trusted: self.trusted.clone(),
        })
    }
}
