//! What can go wrong in the model store, with a hint for each: what the user can do.
//! Messages never contain a token, and URLs are shown without their query (signed CDN URLs
//! carry credentials there).

use std::path::PathBuf;

/// An error of the model store.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The repo needs a token (or a token whose account accepted the terms).
    #[error("{repo} is gated: downloading it needs a token of an account that accepted its terms")]
    Gated {
        /// The repo.
        repo: String,
        /// Whether a token was sent.
        token_given: bool,
        /// The hub's own words.
        message: Option<String>,
    },
    /// No such repo (or private and no/wrong token).
    #[error("repository {repo} not found at {endpoint}")]
    RepoNotFound {
        /// The repo.
        repo: String,
        /// The hub.
        endpoint: String,
        /// Whether a token was sent.
        token_given: bool,
    },
    /// The branch, tag or commit does not exist.
    #[error("revision `{revision}` not found in {repo}")]
    RevisionNotFound {
        /// The repo.
        repo: String,
        /// The revision asked for.
        revision: String,
    },
    /// A file listed in the tree is not there to download.
    #[error("file `{path}` not found in {repo} at {revision}")]
    EntryNotFound {
        /// The repo.
        repo: String,
        /// The file.
        path: String,
        /// The commit.
        revision: String,
    },
    /// The hub refused the token.
    #[error("the hub at {endpoint} refused the token")]
    TokenRejected {
        /// The hub.
        endpoint: String,
    },
    /// Any other HTTP error.
    #[error("{url} answered HTTP {status}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Http {
        /// The status.
        status: u16,
        /// The URL, without query.
        url: String,
        /// `X-Error-Message`, if any.
        message: String,
    },
    /// The connection failed.
    #[error("cannot download from {url}: {reason}")]
    Network {
        /// The URL, without query.
        url: String,
        /// Why.
        reason: String,
    },
    /// The body ended early.
    #[error("{url} sent {got} of {expected} bytes")]
    Truncated {
        /// The URL, without query.
        url: String,
        /// Bytes received.
        got: u64,
        /// Bytes announced.
        expected: u64,
    },
    /// An answer that does not follow the protocol.
    #[error("unexpected answer from {url}: {reason}")]
    BadResponse {
        /// The URL, without query.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// A file's checksum was wrong twice.
    #[error("{path} failed verification twice: sha256 expected {expected}, got {actual}")]
    Mismatch {
        /// The file.
        path: String,
        /// The hub's checksum.
        expected: String,
        /// What arrived.
        actual: String,
    },
    /// Not enough free space for what is still to fetch.
    #[error("not enough space in {}: {} still to download, {} free", dir.display(), size(*need), size(*free))]
    NoSpace {
        /// The folder checked.
        dir: PathBuf,
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        free: u64,
    },
    /// Include/exclude left no file.
    #[error("no file of {repo} at {commit} matches the include/exclude globs")]
    NothingSelected {
        /// The repo.
        repo: String,
        /// The commit.
        commit: String,
    },
    /// A glob that does not parse.
    #[error("invalid glob `{glob}`: {reason}")]
    BadGlob {
        /// The glob.
        glob: String,
        /// Why.
        reason: String,
    },
    /// A repo path that would leave the model folder.
    #[error("the repo lists a file path that leaves the model folder: `{0}`")]
    UnsafePath(String),
    /// The endpoint is not an http(s) URL.
    #[error("invalid endpoint `{0}`: expected an http:// or https:// URL")]
    BadEndpoint(String),
    /// An option out of range.
    #[error("{0}")]
    BadOption(String),
    /// The HTTP client or runtime could not be built.
    #[error("cannot start the HTTP client: {0}")]
    Client(String),
    /// A filesystem error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The verification record cannot be read.
    #[error("cannot read the verification record {}: {reason}", path.display())]
    BadRecord {
        /// The record.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No verification record: the folder was never pulled by provision.
    #[error("{} has no verification record ({})", dest.display(), super::RECORD_FILE)]
    NoRecord {
        /// The model folder.
        dest: PathBuf,
    },
}

impl HubError {
    /// What the user can do about it.
    pub fn hints(&self) -> Vec<String> {
        match self {
            HubError::Gated {
                token_given: false, ..
            } => vec![
                "set a token: --token-env HF_TOKEN (in the inventory: `token: { env: HF_TOKEN }`)"
                    .into(),
            ],
            HubError::Gated { repo, .. } => vec![format!(
                "accept the terms on the model's page with the token's account ({repo}), then retry"
            )],
            HubError::RepoNotFound {
                token_given: false, ..
            } => vec![
                "check the name; a private repo also needs a token: --token-env HF_TOKEN".into(),
            ],
            HubError::RepoNotFound { .. } => {
                vec!["check the name, and that the token's account can see the repo".into()]
            }
            HubError::RevisionNotFound { .. } => {
                vec!["use a branch, a tag or a full commit id of the repo (REPO@REVISION)".into()]
            }
            HubError::TokenRejected { .. } => {
                vec!["the token is wrong or expired: create a new read token".into()]
            }
            HubError::Network { .. } | HubError::Truncated { .. } => {
                vec!["run the pull again: it resumes from what is already downloaded".into()]
            }
            HubError::Mismatch { .. } => vec![
                "the hub or a proxy in between serves wrong bytes; check --endpoint, then retry"
                    .into(),
            ],
            HubError::NoSpace { .. } => {
                vec!["free space there, or pull a subset with --include/--exclude".into()]
            }
            HubError::NothingSelected { .. } => {
                vec!["`*` matches `/` too; `dir/` selects a folder".into()]
            }
            HubError::NoRecord { .. } => {
                vec!["pull it first: provision model pull REPO DEST".into()]
            }
            _ => Vec::new(),
        }
    }
}

/// A byte count for people: `1.5 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
