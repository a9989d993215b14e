//! An APT repository as deb822 `.sources` with `Signed-By:` its own keyring: the key is
//! fetched (by the target, from its URL) or sent (from a file on the workstation), refused
//! unless its fingerprint is the pinned one, and written as a keyring holding that key
//! alone, before the `.sources` file and before any apt transaction. apt's own gpgv then
//! verifies the repository's `InRelease` against it: a repository signed by another key
//! fails `apt-get update` as it does by hand.

use crate::resources::op::{Allowed, Op, guest};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::file::FileSpec;
use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError, Typed};
use crate::machine::HostError;
use crate::openpgp;
use crate::plan::{Action, Attribute, Change};

/// NVIDIA's CUDA repository signing key (`cudatools <cudatools@nvidia.com>`, the
/// `3bf863cc.pub` NVIDIA publishes in each repository since its 2022 key rotation).
pub const NVIDIA_KEY_FINGERPRINT: &str = "EB693B3035CD5710E231E123A4B469963BF863CC";

/// NVIDIA's CUDA repository for a distribution (`ubuntu2404`), x86_64.
pub fn nvidia_cuda_uri(distribution: &str) -> String {
    format!("https://developer.download.nvidia.com/compute/cuda/repos/{distribution}/x86_64/")
}

/// A repository signing key pinned by fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptKeySpec {
    /// Fetched by the target from here.
    #[serde(default)]
    pub url: Option<String>,
    /// Or read from this file on the workstation at apply time (absolute).
    #[serde(default)]
    pub file: Option<String>,
    /// The primary key's fingerprint, upper-case hex.
    pub fingerprint: String,
}

/// A keyed (or, only when written, trusted) APT repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptSourceSpec {
    /// The source's name: `/etc/apt/sources.list.d/<name>.sources`.
    pub name: String,
    /// `URIs:`.
    pub uris: Vec<String>,
    /// `Suites:`.
    pub suites: Vec<String>,
    /// `Components:` (none for a flat repository).
    #[serde(default)]
    pub components: Vec<String>,
    /// The signing key; `None` leaves apt's system keyrings in charge.
    #[serde(default)]
    pub key: Option<AptKeySpec>,
    /// `Trusted: yes`, only as the inventory writes it.
    #[serde(default)]
    pub trusted: bool,
}

impl AptSourceSpec {
    /// NVIDIA's CUDA repository for `distribution`, keyed by NVIDIA's signing key.
    pub fn nvidia_cuda(distribution: &str) -> Self {
        let uri = nvidia_cuda_uri(distribution);
        AptSourceSpec {
            name: "cuda".into(),
            uris: vec![uri.clone()],
            suites: vec!["/".into()],
            components: Vec::new(),
            key: Some(AptKeySpec {
                url: Some(format!("{uri}3bf863cc.pub")),
                file: None,
                fingerprint: NVIDIA_KEY_FINGERPRINT.into(),
            }),
            trusted: false,
        }
    }

    /// Where the `.sources` file goes.
    pub fn path(&self) -> String {
        format!("/etc/apt/sources.list.d/{}.sources", self.name)
    }

    /// Where the key goes.
    pub fn keyring(&self) -> String {
        format!("/etc/apt/keyrings/{}.gpg", self.name)
    }

    /// The `.sources` file.
    pub fn file(&self) -> FileSpec {
        let mut text = String::from("# Managed by provision.\nTypes: deb\n");
        text.push_str(&format!("URIs: {}\n", self.uris.join(" ")));
        text.push_str(&format!("Suites: {}\n", self.suites.join(" ")));
        if !self.components.is_empty() {
            text.push_str(&format!("Components: {}\n", self.components.join(" ")));
        }
        if self.key.is_some() {
            text.push_str(&format!("Signed-By: {}\n", self.keyring()));
        }
        if self.trusted {
            text.push_str("Trusted: yes\n");
        }
        FileSpec {
            path: self.path(),
            content: text,
            owner: "root".into(),
            group: "root".into(),
            mode: 0o644,
        }
    }

    fn key_probe(&self) -> Probe {
        Probe::AptKey(AptKeyProbe {
            path: self.keyring(),
        })
    }
}

impl Resource for AptSourceSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "apt_source"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        let mut p = self.file().probes();
        if self.key.is_some() {
            p.push(self.key_probe());
        }
        p
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let file = self.file().diff(facts)?;
        let key = match &self.key {
            Some(k) => {
                let found = facts.apt_key(&self.key_probe())?;
                let have = found.map(|f| f.join(" "));
                let pin = openpgp::normalize(&k.fingerprint);
                (found.map(Vec::as_slice) != Some(std::slice::from_ref(&pin))).then(|| {
                    let from = k.url.as_deref().or(k.file.as_deref()).unwrap_or("?");
                    Attribute::change(
                        "signed-by",
                        have,
                        Some(format!("{} (key {pin} from {from})", self.keyring())),
                    )
                })
            }
            None => None,
        };
        let Some(mut d) = file.or_else(|| key.as_ref().map(|_| Delta::new(Action::Update))) else {
            return Ok(None);
        };
        if d.action == Action::Replace {
            d.action = Action::Update;
        }
        d.attributes.retain(|a| a.name == "sha256");
        if key.is_some() {
            d.typed = Some(Typed::AptKey);
        }
        d.attributes.extend(key);
        Ok(Some(d))
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        let mut steps = Vec::new();
        if let Some(k) = &self.key
            && change.typed == Some(Typed::AptKey)
        {
            let text = match &k.file {
                Some(f) => Some(std::fs::read(f).map_err(|e| {
                    StepsError::Refused(format!(
                        "cannot read the key of APT source `{}` ({f}): {e}",
                        self.name
                    ))
                })?),
                None => None,
            };
            steps.push(Step::AptKey(AptKeyStep {
                source: self.name.clone(),
                path: self.keyring(),
                url: k.url.clone(),
                key: text
                    .map(|t| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, t)),
                fingerprint: k.fingerprint.clone(),
            }));
        }
        let file = self.file();
        steps.push(Step::WriteFile(crate::resources::file::WriteFileStep {
            path: file.path,
            content: file.content,
            owner: file.owner,
            group: file.group,
            mode: file.mode,
        }));
        guest(steps)
    }
}

/// The fingerprints of the keys in the keyring at `path` (`None`: no file; empty: a file
/// that holds no readable key).
pub fn read_keyring(path: &Path) -> Result<Option<Vec<String>>, HostError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(
            openpgp::keys(&bytes)
                .map(|k| k.into_iter().map(|k| k.fingerprint).collect())
                .unwrap_or_default(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HostError::io("read", path)(e)),
    }
}

/// On the target: gets the key (from `url`, or the bytes sent as base64 `key`), keeps the
/// one whose fingerprint is `fingerprint` and refuses when none is, and writes it alone as
/// the keyring at `path`, read back.
pub fn install_key(
    source: &str,
    path: &str,
    url: Option<&str>,
    key: Option<&str>,
    fingerprint: &str,
) -> Result<(), HostError> {
    let fingerprint = openpgp::normalize(fingerprint);
    let fingerprint = fingerprint.as_str();
    let from = url.unwrap_or("the inventory's key file");
    let what = format!("the key of APT source `{source}` ({from})");
    let bad = |detail: String| HostError::Unexpected {
        what: what.clone(),
        detail,
    };
    let bytes = match (url, key) {
        (_, Some(b64)) => base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64)
            .map_err(|e| bad(format!("not base64: {e}")))?,
        (Some(url), None) => {
            let client = crate::health::http::HttpClient::new(std::time::Duration::from_secs(60))
                .map_err(|e| bad(e.to_string()))?;
            let (status, body) = client.get_bytes(url).map_err(|e| bad(e.to_string()))?;
            if status != 200 {
                return Err(bad(format!("GET {url} answered HTTP {status}")));
            }
            body
        }
        (None, None) => return Err(bad("neither a URL nor a key file".into())),
    };
    let keys = openpgp::keys(&bytes).map_err(|e| bad(e.to_string()))?;
    let Some(wanted) = keys.iter().find(|k| k.fingerprint == fingerprint) else {
        let found: Vec<&str> = keys.iter().map(|k| k.fingerprint.as_str()).collect();
        return Err(bad(format!(
            "it has fingerprint {}, the inventory pins {fingerprint}: nothing was written (check the pin against the repository owner's published fingerprint)",
            found.join(", ")
        )));
    };
    let dir = Path::new(path).parent().unwrap_or(Path::new("/"));
    crate::resources::directory::mkdir(dir, "root", "root", 0o755)?;
    crate::machine::write_file_atomic(Path::new(path), &wanted.bytes, "root", "root", 0o644)?;
    match read_keyring(Path::new(path))? {
        Some(f) if f == [fingerprint] => Ok(()),
        other => Err(bad(format!(
            "{path} reads back as keys {other:?}, not {fingerprint}"
        ))),
    }
}

/// Probe: the fingerprints of the keys in an APT keyring.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AptKeyProbe {
    /// The keyring file.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for AptKeyProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::AptKey(read_keyring(
            std::path::Path::new(&self.path),
        )?))
    }
}

/// Step: write an APT repository's signing key, refused unless it has the pinned fingerprint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AptKeyStep {
    /// The source's name, for messages.
    pub source: String,
    /// The keyring file.
    pub path: String,
    /// Where the target fetches the key.
    pub url: Option<String>,
    /// Or the key itself (base64), read on the workstation.
    pub key: Option<String>,
    /// The pinned fingerprint.
    pub fingerprint: String,
}

impl crate::resources::wire::AgentStep for AptKeyStep {
    fn describe(&self) -> String {
        format!("write key {} to {}", self.fingerprint, self.path)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        install_key(
            &self.source,
            &self.path,
            self.url.as_deref(),
            self.key.as_deref(),
            &self.fingerprint,
        )?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sources_file_is_deb822_with_signed_by_and_trusted_only_when_asked() {
        let mut s = AptSourceSpec {
            name: "cuda".into(),
            uris: vec![nvidia_cuda_uri("ubuntu2404")],
            suites: vec!["/".into()],
            components: vec![],
            key: Some(AptKeySpec {
                url: Some(format!("{}3bf863cc.pub", nvidia_cuda_uri("ubuntu2404"))),
                file: None,
                fingerprint: NVIDIA_KEY_FINGERPRINT.into(),
            }),
            trusted: false,
        };
        assert_eq!(
            s.file().content,
            "# Managed by provision.\nTypes: deb\nURIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/\nSuites: /\nSigned-By: /etc/apt/keyrings/cuda.gpg\n"
        );
        assert!(!s.file().content.contains("Trusted"));
        s.trusted = true;
        assert!(s.file().content.ends_with("Trusted: yes\n"));
    }
}
