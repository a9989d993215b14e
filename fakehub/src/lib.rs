//! A local Hugging Face hub for tests and benchmarks: the endpoints `huggingface_hub` and
//! provision use (revision, paginated tree, resolve with a redirect to a second "CDN" port,
//! `Range` with 206, gated repos, `X-Error-Code` errors) over generated, deterministic files,
//! with faults on request (reset mid-file, wrong bytes, 5xx, slow, ranges ignored).
//!
//! ```no_run
//! let hub = fakehub::FakeHub::start(fakehub::Config {
//!     repos: vec![fakehub::RepoSpec::synthetic("org/model", 2, 10 << 20)],
//!     ..fakehub::Config::default()
//! })
//! .unwrap();
//! println!("{}", hub.endpoint());
//! ```

mod body;
mod content;
mod server;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use content::{FileSpec, RepoSpec, bytes, fill, git_blob_sha1, seed};

/// How the fake hub is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the hub listens; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Where the CDN listens (LFS files are redirected there); `None`: the hub's IP, any port.
    pub cdn_listen: Option<SocketAddr>,
    /// Redirect LFS downloads to the CDN (as the real hub does); when false the hub serves them.
    pub cdn: bool,
    /// The repositories served.
    pub repos: Vec<RepoSpec>,
    /// The token gated repos accept.
    pub token: Option<String>,
    /// Tree entries per page.
    pub page_size: usize,
    /// Where sha256 of large generated files are cached across runs.
    pub hash_cache: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            cdn_listen: None,
            cdn: true,
            repos: Vec::new(),
            token: None,
            page_size: 1000,
            hash_cache: Some(PathBuf::from("/var/cache/provision-fakehub")),
        }
    }
}

/// A fault injected into downloads of file content (not into API calls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// The file path inside the repo it applies to; any file when `None`.
    #[serde(default)]
    pub path: Option<String>,
    /// What goes wrong.
    #[serde(flatten)]
    pub kind: FaultKind,
    /// How many responses it affects; every one when `None`.
    #[serde(default)]
    pub times: Option<u32>,
}

/// The kinds of fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// The connection is dropped after `after` bytes of the response body.
    Reset {
        /// Body bytes sent before the reset.
        after: u64,
    },
    /// After `after` bytes of the response body nothing more is sent; the connection
    /// stays open (a stalled download).
    Stall {
        /// Body bytes sent before the stall.
        after: u64,
    },
    /// Nothing from file offset `offset` on is ever sent: a response covering it stalls
    /// there, one starting past it stalls at once, the connection held open (a server
    /// that hangs on a file, so that a retry makes no progress either).
    StallFrom {
        /// The file offset.
        offset: u64,
    },
    /// The byte at file offset `offset` is flipped when a response covers it.
    Corrupt {
        /// The file offset.
        offset: u64,
    },
    /// The response is this status (500, 503...) with no content.
    Status {
        /// The HTTP status.
        code: u16,
    },
    /// The body is sent at this rate.
    Slow {
        /// Bytes per second, per response.
        bytes_per_sec: u64,
    },
    /// A `Range` request is answered 200 with the whole file.
    IgnoreRange,
}

impl Fault {
    /// A fault on one file (or every file when `path` is empty), `times` times.
    pub fn new(path: &str, kind: FaultKind, times: Option<u32>) -> Fault {
        Fault {
            path: (!path.is_empty()).then(|| path.to_string()),
            kind,
            times,
        }
    }
}

/// What the hub has served since start (or the last reset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `GET /api/models/{repo}/revision/{rev}` requests.
    pub revision_requests: u64,
    /// `GET /api/models/{repo}/tree/...` requests (one per page).
    pub tree_requests: u64,
    /// `HEAD` on resolve URLs.
    pub resolve_head: u64,
    /// `GET` on resolve URLs.
    pub resolve_get: u64,
    /// Requests for file content (hub or CDN), ranged or not.
    pub content_requests: u64,
    /// Of those, the ones with a `Range` header.
    pub range_requests: u64,
    /// File content bytes sent, all files.
    pub bytes_served: u64,
    /// File content bytes sent, by `repo/path`.
    pub bytes_by_file: BTreeMap<String, u64>,
    /// CDN requests that carried an `Authorization` header (refused with 400).
    pub auth_on_cdn: u64,
}

/// A running fake hub; stops when dropped.
pub struct FakeHub {
    endpoint: String,
    cdn: String,
    state: Arc<server::State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeHub {
    /// Binds both ports, computes the hashes it lists, and starts serving in the background.
    pub fn start(config: Config) -> std::io::Result<FakeHub> {
        let hub = TcpListener::bind(config.listen)?;
        let cdn_addr = config
            .cdn_listen
            .unwrap_or_else(|| SocketAddr::new(config.listen.ip(), 0));
        let cdn = TcpListener::bind(cdn_addr)?;
        let endpoint = format!("http://{}", display_addr(hub.local_addr()?));
        let cdn_url = format!("http://{}", display_addr(cdn.local_addr()?));
        let repos = server::prepare(&config.repos, config.hash_cache.as_deref());
        let state = Arc::new(server::State {
            repos,
            token: config.token.clone(),
            page_size: config.page_size.max(1),
            endpoint: endpoint.clone(),
            cdn: config.cdn.then(|| cdn_url.clone()),
            faults: Mutex::new(Vec::new()),
            stats: Arc::new(Mutex::new(Stats::default())),
        });
        hub.set_nonblocking(true)?;
        cdn.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fake-hub")
            .enable_all()
            .build()?;
        {
            let _guard = runtime.enter();
            let hub = tokio::net::TcpListener::from_std(hub)?;
            let cdn = tokio::net::TcpListener::from_std(cdn)?;
            runtime.spawn(server::serve(hub, state.clone(), server::Port::Hub));
            runtime.spawn(server::serve(cdn, state.clone(), server::Port::Cdn));
        }
        Ok(FakeHub {
            endpoint,
            cdn: cdn_url,
            state,
            runtime: Some(runtime),
        })
    }

    /// The hub's base URL, e.g. `http://127.0.0.1:41234`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The CDN's base URL.
    pub fn cdn(&self) -> &str {
        &self.cdn
    }

    /// The commit a repo's branches resolve to.
    pub fn commit(&self, repo: &str) -> Option<String> {
        self.state.repo(repo).map(|r| r.commit.clone())
    }

    /// The sha256 the tree lists for a file.
    pub fn sha256(&self, repo: &str, path: &str) -> Option<String> {
        let r = self.state.repo(repo)?;
        let i = r.spec.files.iter().position(|f| f.path == path)?;
        Some(r.hashes[i].sha256.clone())
    }

    /// Adds a fault.
    pub fn add_fault(&self, fault: Fault) {
        self.state.faults.lock().expect("faults").push(fault);
    }

    /// Removes all faults.
    pub fn clear_faults(&self) {
        self.state.faults.lock().expect("faults").clear();
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        self.state.stats.lock().expect("stats").clone()
    }

    /// Zeroes the statistics.
    pub fn reset_stats(&self) {
        *self.state.stats.lock().expect("stats") = Stats::default();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn display_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// Parses a size: `123`, `10KiB`, `64MiB`, `1GiB`, `1.5GiB`, `2GB`.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    Some((n * mult as f64) as u64)
}
