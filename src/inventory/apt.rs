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

/// NVIDIA's name for the distribution a Proxmox template name says
/// (`ubuntu-24.04-standard_...` is `ubuntu2404`, `debian-12-...` is `debian12`), for
/// the releases NVIDIA signs with its CUDA repository key
/// (`resources::apt_source::NVIDIA_KEY_FINGERPRINT`).
pub fn nvidia_distribution(template: &str) -> Option<&'static str> {
    let file = template.rsplit('/').next().unwrap_or(template);
    [
        ("ubuntu-20.04", "ubuntu2004"),
        ("ubuntu-22.04", "ubuntu2204"),
        ("ubuntu-24.04", "ubuntu2404"),
        ("debian-12", "debian12"),
    ]
    .into_iter()
    .find_map(|(prefix, d)| file.starts_with(prefix).then_some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_names_give_nvidias_distribution() {
        assert_eq!(
            nvidia_distribution("local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"),
            Some("ubuntu2404")
        );
        assert_eq!(
            nvidia_distribution("local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"),
            Some("debian12")
        );
        assert_eq!(
            nvidia_distribution("local:vztmpl/alpine-3.20-default.tar.xz"),
            None
        );
    }
}
