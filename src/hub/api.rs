//! The hub's HTTP protocol as `huggingface_hub` speaks it: revision to commit, the paginated
//! tree, and file downloads through `/resolve/` with redirects followed by hand, so the
//! `Authorization` header never leaves the hub's origin (scheme, host and port).

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, LOCATION, RANGE};
use reqwest::{Response, StatusCode, Url};
use serde::Deserialize;

use super::HubError;
use crate::inventory::secret::Secret;

/// How many redirects one download may follow.
const MAX_REDIRECTS: usize = 10;

/// One file of the repo at a commit, as the tree lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path inside the repo.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// sha256 of the content, for LFS files.
    pub sha256: Option<String>,
    /// git blob sha1: of the content for files in git, of the pointer for LFS files.
    pub git_oid: String,
}

impl RemoteFile {
    /// Files in git (not LFS) are checked by their git blob sha1.
    pub fn is_lfs(&self) -> bool {
        self.sha256.is_some()
    }
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: String,
    #[serde(default)]
    lfs: Option<TreeLfs>,
}

#[derive(Deserialize)]
struct TreeLfs {
    oid: String,
    size: u64,
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: Option<String>,
}

/// A client for one repo on one hub.
#[derive(Clone)]
pub(crate) struct HubClient {
    http: reqwest::Client,
    endpoint: Url,
    repo: String,
    token: Option<Secret>,
}

/// Installs rustls' ring provider once; a second call (or one from elsewhere) is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A URL fit for messages: no query string, since signed CDN URLs carry credentials there.
pub(crate) fn shown(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

impl HubClient {
    /// A client for `repo` on the hub at `endpoint`, sending `token` only to that origin.
    pub fn new(endpoint: &str, repo: &str, token: Option<Secret>) -> Result<Self, HubError> {
        install_crypto_provider();
        let endpoint = Url::parse(endpoint.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| HubError::BadEndpoint(endpoint.to_string()))?;
        let http = build_http()?;
        Ok(HubClient {
            http,
            endpoint,
            repo: repo.to_string(),
            token,
        })
    }

    /// The same client with its own connection pool, for a worker thread with its own
    /// runtime (pooled connections belong to the runtime that opened them).
    pub fn fresh(&self) -> Result<Self, HubError> {
        Ok(HubClient {
            http: build_http()?,
            ..self.clone()
        })
    }

    fn url(&self, path: &str) -> Url {
        let base = self.endpoint.as_str().trim_end_matches('/');
        Url::parse(&format!("{base}{path}")).expect("endpoint joins a path")
    }

    /// Sends a GET, with the token only while on the hub's origin.
    async fn get(&self, url: &Url, range: Option<(u64, u64)>) -> Result<Response, HubError> {
        let mut req = self.http.get(url.clone());
        if let Some((a, b)) = range {
            req = req.header(RANGE, format!("bytes={a}-{b}"));
        }
        if let Some(t) = &self.token
            && url.origin() == self.endpoint.origin()
        {
            req = req.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
        }
        req.send().await.map_err(|e| HubError::Network {
            url: shown(url),
            reason: error_chain(&e),
        })
    }

    /// The commit a branch, tag or commit names.
    pub async fn revision(&self, revision: &str) -> Result<String, HubError> {
        let url = self.url(&format!(
            "/api/models/{}/revision/{}",
            self.repo,
            encode(revision, true)
        ));
        let resp = self.get(&url, None).await?;
        let resp = self.check(resp, Some(revision), None).await?;
        let info: RevisionInfo = resp.json().await.map_err(|e| HubError::BadResponse {
            url: shown(&url),
            reason: error_chain(&e),
        })?;
        info.sha.ok_or_else(|| HubError::BadResponse {
            url: shown(&url),
            reason: "no `sha` in the answer".into(),
        })
    }

    /// Every file at `commit`, following `Link: rel="next"` pages.
    pub async fn tree(&self, commit: &str) -> Result<Vec<RemoteFile>, HubError> {
        let mut next = Some(self.url(&format!(
            "/api/models/{}/tree/{}?recursive=true",
            self.repo,
            encode(commit, true)
        )));
        let mut files = Vec::new();
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > 100_000 {
                return Err(HubError::BadResponse {
                    url: shown(&url),
                    reason: "the tree does not end".into(),
                });
            }
            let resp = self.get(&url, None).await?;
            let resp = self.check(resp, Some(commit), None).await?;
            next = next_link(resp.headers(), &url);
            let entries: Vec<TreeEntry> = resp.json().await.map_err(|e| HubError::BadResponse {
                url: shown(&url),
                reason: error_chain(&e),
            })?;
            for e in entries.into_iter().filter(|e| e.kind == "file") {
                files.push(RemoteFile {
                    size: e.lfs.as_ref().map_or(e.size, |l| l.size),
                    sha256: e.lfs.map(|l| l.oid.to_ascii_lowercase()),
                    git_oid: e.oid,
                    path: e.path,
                });
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// The resolve URL of a file at a commit.
    pub fn resolve_url(&self, commit: &str, path: &str) -> Url {
        self.url(&format!(
            "/{}/resolve/{}/{}",
            self.repo,
            encode(commit, true),
            encode(path, false)
        ))
    }

    /// Starts a download of `path` (a byte range when given), following redirects from
    /// `start` (the resolve URL, or a location learned earlier). Returns the response and the
    /// URL that answered, to reuse for the file's other ranges.
    pub async fn download(
        &self,
        start: &Url,
        commit: &str,
        path: &str,
        range: Option<(u64, u64)>,
    ) -> Result<(Response, Url), HubError> {
        let mut url = start.clone();
        for _ in 0..MAX_REDIRECTS {
            let resp = self.get(&url, range).await?;
            if resp.status().is_redirection() {
                let target = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|l| url.join(l).ok())
                    .ok_or_else(|| HubError::BadResponse {
                        url: shown(&url),
                        reason: format!("{} without a usable Location", resp.status()),
                    })?;
                url = target;
                continue;
            }
            let resp = self.check(resp, Some(commit), Some(path)).await?;
            return Ok((resp, url));
        }
        Err(HubError::BadResponse {
            url: shown(start),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// Turns an error answer into a [`HubError`] using `X-Error-Code`, as `huggingface_hub`'s
    /// `hf_raise_for_status` does.
    async fn check(
        &self,
        resp: Response,
        revision: Option<&str>,
        path: Option<&str>,
    ) -> Result<Response, HubError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = header("X-Error-Code");
        let message = header("X-Error-Message");
        let url = shown(resp.url());
        let repo = self.repo.clone();
        let token_given = self.token.is_some();
        Err(match code.as_deref() {
            Some("GatedRepo") => HubError::Gated {
                repo,
                token_given,
                message,
            },
            Some("RepoNotFound") => HubError::RepoNotFound {
                repo,
                endpoint: self.endpoint.to_string(),
                token_given,
            },
            Some("RevisionNotFound") => HubError::RevisionNotFound {
                repo,
                revision: revision.unwrap_or("?").to_string(),
            },
            Some("EntryNotFound") => HubError::EntryNotFound {
                repo,
                path: path.unwrap_or("?").to_string(),
                revision: revision.unwrap_or("?").to_string(),
            },
            _ if status == StatusCode::UNAUTHORIZED && token_given => HubError::TokenRejected {
                endpoint: self.endpoint.to_string(),
            },
            _ => HubError::Http {
                status: status.as_u16(),
                url,
                message: message.unwrap_or_default(),
            },
        })
    }
}

fn build_http() -> Result<reqwest::Client, HubError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(20))
        .read_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .user_agent(concat!("provision/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| HubError::Client(client_error(&e)))
}

/// Why an HTTP client could not be made, with its cause: on a target without the system's
/// CA certificates reqwest says only "builder error", for an `http://` URL too (measured in
/// a bare Ubuntu 24.04 rootfs on the lent H200).
pub(crate) fn client_error(e: &reqwest::Error) -> String {
    format!(
        "cannot make an HTTP client ({}): install the CA certificates (`ca-certificates`) on this machine",
        error_chain(e)
    )
}

/// The `rel="next"` target of a `Link` header, resolved against the page's URL.
fn next_link(headers: &HeaderMap, base: &Url) -> Option<Url> {
    for value in headers.get_all("link") {
        let text = value.to_str().ok()?;
        for part in text.split(',') {
            let mut pieces = part.split(';');
            let target = pieces.next()?.trim();
            let is_next = pieces.any(|p| {
                let p = p.trim().replace(' ', "");
                p == "rel=\"next\"" || p == "rel=next"
            });
            if is_next {
                let target = target.trim_start_matches('<').trim_end_matches('>');
                return base.join(target).ok();
            }
        }
    }
    None
}

/// Percent-encodes a path; `/` is kept unless `all` (revisions like `refs/pr/1` are one
/// segment).
fn encode(s: &str, all: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (b == b'/' && !all);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An error and its sources in one line (reqwest's own message alone says little).
pub(crate) fn error_chain(e: &reqwest::Error) -> String {
    let mut text = crate::diagnostic::one_line(e);
    // reqwest puts the URL in its message; the query of a signed URL must not be shown.
    if let Some(url) = e.url()
        && url.query().is_some()
    {
        text = text.replace(url.as_str(), &shown(url));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_revisions_as_one_segment() {
        assert_eq!(encode("refs/pr/1", true), "refs%2Fpr%2F1");
        assert_eq!(encode("a b/c.bin", false), "a%20b/c.bin");
    }

    #[test]
    fn finds_next_link() {
        let mut h = HeaderMap::new();
        h.insert(
            "link",
            "<https://hub.example/api/x?cursor=abc>; rel=\"next\""
                .parse()
                .unwrap(),
        );
        let base = Url::parse("https://hub.example/api/x").unwrap();
        assert_eq!(
            next_link(&h, &base).unwrap().as_str(),
            "https://hub.example/api/x?cursor=abc"
        );
    }
}
