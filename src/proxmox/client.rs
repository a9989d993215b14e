//! One node's API as provision uses it: the shared [`pve::Client`] with provision's retry
//! policy, credentials and trust from the inventory, every call named in its errors, `/version`
//! read once, and a count of the calls made (the no-op check's budget is 5 per container).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pve::{Auth, Client, RetryPolicy, Trust};
use serde_json::Value;

use super::error::ProxmoxError;
use crate::inventory::node::Api;
use crate::inventory::secret::{Secret, resolve_local};

/// How provision logs in to a node.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// `USER@REALM!TOKENID=SECRET`.
    Token(Secret),
    /// A user's password, traded for a ticket (root@pam may do what tokens may not).
    Password {
        /// `root@pam`.
        user: String,
        /// The password.
        password: Secret,
    },
}

/// Everything needed to reach one node's API, resolved from the inventory and environment.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// The node's inventory name, for messages.
    pub label: String,
    /// `https://host:8006/api2/json`.
    pub base: String,
    /// The node's name in Proxmox.
    pub node: String,
    /// Credentials.
    pub credentials: Credentials,
    /// How the certificate is trusted.
    pub trust: Trust,
}

impl ApiSettings {
    /// Resolves a node's `api:` section now. `insecure` trusts any certificate (only when the
    /// user asked for it). A password wins over a token: it can do everything a token can.
    pub fn from_inventory(
        label: &str,
        api: &Api,
        base_dir: &Path,
        insecure: bool,
    ) -> Result<ApiSettings, ProxmoxError> {
        let bad = |message: String| ProxmoxError::Settings {
            node: label.to_string(),
            message,
        };
        let url = api.url.resolve().map_err(|e| bad(e.to_string()))?;
        if !url.starts_with("https://") {
            return Err(bad(format!(
                "the API URL `{url}` is not https\nhint: Proxmox serves its API over HTTPS on port 8006"
            )));
        }
        let base = if url.trim_end_matches('/').ends_with("/api2/json") {
            url.trim_end_matches('/').to_string()
        } else {
            format!("{}/api2/json", url.trim_end_matches('/'))
        };
        let credentials = match (&api.password, &api.token) {
            (Some(p), _) => Credentials::Password {
                user: api.user.to_string(),
                password: p.resolve(base_dir).map_err(|e| bad(e.to_string()))?,
            },
            (None, Some(t)) => {
                Credentials::Token(t.resolve(base_dir).map_err(|e| bad(e.to_string()))?)
            }
            (None, None) => return Err(bad("no `token` or `password` to log in with".into())),
        };
        let trust = if insecure {
            Trust::Insecure
        } else if let Some(fp) = &api.tls.fingerprint {
            let fp = fp.resolve().map_err(|e| bad(e.to_string()))?;
            if pve::tls::normalize_fingerprint(&fp).is_none() {
                return Err(bad(format!(
                    "`{fp}` is not a SHA-256 fingerprint\nhint: 32 hex bytes as `pvenode cert info` prints them"
                )));
            }
            Trust::Pin(fp)
        } else if let Some(ca) = &api.tls.ca_file {
            let path = resolve_local(ca, base_dir);
            let pem = std::fs::read(&path)
                .map_err(|e| bad(format!("cannot read the CA file {}: {e}", path.display())))?;
            Trust::CaPem(pem)
        } else {
            return Err(bad(
                "no way to trust its certificate\nhint: add `tls: { fingerprint: ... }` or `tls: { ca_file: ... }`".into(),
            ));
        };
        Ok(ApiSettings {
            label: label.to_string(),
            base,
            node: api.node.to_string(),
            credentials,
            trust,
        })
    }
}

/// A node's Proxmox VE release, from `GET /version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PveVersion {
    /// `9.1.3`.
    pub version: String,
    /// `(9, 1)`.
    pub major_minor: (u32, u32),
}

impl PveVersion {
    /// Parses `8.4.1` (and `8.4-1`).
    pub fn parse(version: &str) -> PveVersion {
        let mut parts = version
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let major = parts.next().unwrap_or(0);
        let minor = parts.next().unwrap_or(0);
        PveVersion {
            version: version.to_string(),
            major_minor: (major, minor),
        }
    }

    /// `devN` passthrough entries exist from 8.1 on.
    pub fn has_dev_passthrough(&self) -> bool {
        self.major_minor >= (8, 1)
    }
}

/// A connected node, for reading only: [`ApiReader::get`] is the one call it can send, so
/// `plan` and `check`, which hold nothing else, cannot reach a PUT, POST or DELETE.
pub struct ApiReader {
    /// The node's inventory name.
    pub label: String,
    /// The node's name in Proxmox.
    pub node: String,
    /// Whether the client logged in as a user (ticket) rather than with a token.
    pub ticket: bool,
    client: Client,
    version: OnceLock<PveVersion>,
    /// Held while the version is first read, so reads at once ask for it once.
    reading_version: Mutex<()>,
    calls: AtomicUsize,
}

/// A connected node that can also change it (`apply`): [`NodeApi::call`] sends any method.
/// It reads as an [`ApiReader`] (`Deref`), and hands out a reader of the same connection.
pub struct NodeApi {
    read: Arc<ApiReader>,
}

impl std::ops::Deref for NodeApi {
    type Target = ApiReader;

    fn deref(&self) -> &ApiReader {
        &self.read
    }
}

impl AsRef<ApiReader> for NodeApi {
    fn as_ref(&self) -> &ApiReader {
        &self.read
    }
}

impl AsRef<ApiReader> for ApiReader {
    fn as_ref(&self) -> &ApiReader {
        self
    }
}

impl NodeApi {
    /// Connects (logging in when the credentials are a password).
    pub fn connect(settings: &ApiSettings) -> Result<NodeApi, ProxmoxError> {
        Ok(NodeApi {
            read: Arc::new(ApiReader::connect(settings)?),
        })
    }

    /// Calls the API (`path` below `/api2/json`) with any method. Reads and digest-guarded
    /// writes are retried on transient failures; nothing else is.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, ProxmoxError> {
        self.read.send(method, path, params)
    }

    /// The read-only side of this connection (same login, same call count).
    pub fn reader(&self) -> Arc<ApiReader> {
        self.read.clone()
    }
}

impl ApiReader {
    /// Connects (logging in when the credentials are a password), for reading only.
    pub fn connect(settings: &ApiSettings) -> Result<ApiReader, ProxmoxError> {
        crate::timing::time("api: client setup, login", || Self::connect_now(settings))
    }

    fn connect_now(settings: &ApiSettings) -> Result<ApiReader, ProxmoxError> {
        let err = |call: &str, e| ProxmoxError::from_api(&settings.label, call, e);
        let (client, ticket) = match &settings.credentials {
            Credentials::Token(t) => (
                Client::with_timeout(
                    &settings.base,
                    settings.trust.clone(),
                    Auth::Token(t.expose().to_string()),
                    Duration::from_secs(60),
                )
                .map_err(|e| err("setup", e))?,
                false,
            ),
            Credentials::Password { user, password } => (
                Client::login(
                    &settings.base,
                    settings.trust.clone(),
                    user,
                    password.expose(),
                )
                .map_err(|e| err("POST /access/ticket", e))?,
                true,
            ),
        };
        Ok(ApiReader {
            label: settings.label.clone(),
            node: settings.node.clone(),
            ticket,
            client: client.with_retry(RetryPolicy::STANDARD),
            version: OnceLock::new(),
            reading_version: Mutex::new(()),
            calls: AtomicUsize::new(usize::from(ticket)),
        })
    }

    /// `GET path` (below `/api2/json`), retried on transient failures.
    pub fn get(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, ProxmoxError> {
        self.send("GET", path, params)
    }

    /// Any method: private, so only [`NodeApi::call`] and [`ApiReader::get`] reach it.
    fn send(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<Value, ProxmoxError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        crate::timing::time("api: calls (TLS on a first)", || {
            self.client.call(method, path, params)
        })
        .map_err(|e| ProxmoxError::from_api(&self.label, &format!("{method} {path}"), e))
    }

    /// `/nodes/{node}` + `rest`.
    pub fn node_path(&self, rest: &str) -> String {
        format!("/nodes/{}{rest}", self.node)
    }

    /// The node's release, read once.
    pub fn version(&self) -> Result<PveVersion, ProxmoxError> {
        if let Some(v) = self.version.get() {
            return Ok(v.clone());
        }
        let _first = self
            .reading_version
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(v) = self.version.get() {
            return Ok(v.clone());
        }
        let data = self.get("/version", &[])?;
        let v = PveVersion::parse(data["version"].as_str().unwrap_or(""));
        Ok(self.version.get_or_init(|| v).clone())
    }

    /// Whose rules apply on this node (`pve::Version`): its release when already read, else
    /// PVE 9's (no call is made for it).
    pub fn rules(&self) -> pve::Version {
        self.version
            .get()
            .map_or(pve::Version::Pve9, |v| pve::Version::of_release(&v.version))
    }

    /// How many calls this connection has made.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::PveVersion;

    #[test]
    fn dev_passthrough_needs_8_1() {
        assert!(!PveVersion::parse("8.0.4").has_dev_passthrough());
        assert!(PveVersion::parse("8.1.3").has_dev_passthrough());
        assert!(PveVersion::parse("9.1.3").has_dev_passthrough());
    }
}
