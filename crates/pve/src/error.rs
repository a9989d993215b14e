//! Errors as a Proxmox node reports them: an HTTP status, a message and per-parameter errors.

use std::collections::BTreeMap;
use std::fmt;

/// An error answered to an API client (or printed by `pct`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code (400, 401, 403, 500, 596, ...).
    pub status: u16,
    /// First line of the message, as in the HTTP reason phrase; no trailing newline.
    pub message: String,
    /// Per-parameter errors (`errors` in the JSON body), as for 400 responses.
    pub errors: BTreeMap<String, String>,
}

/// Result of an API operation.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with a status and message.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError {
            status,
            message: message.trim_end().to_string(),
            errors: BTreeMap::new(),
        }
    }

    /// What `die "...\n"` in a Proxmox API method becomes: a 500.
    pub fn die(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }

    /// 400 `Parameter verification failed.` with the given parameter errors.
    pub fn params(errors: BTreeMap<String, String>) -> Self {
        ApiError {
            status: 400,
            message: "Parameter verification failed.".into(),
            errors,
        }
    }

    /// 400 for one parameter.
    pub fn param(key: &str, msg: impl Into<String>) -> Self {
        Self::params(BTreeMap::from([(key.to_string(), msg.into())]))
    }

    /// 403 `Permission check failed (what)`, as `raise_perm_exc`.
    pub fn perm(what: Option<&str>) -> Self {
        match what {
            Some(w) => Self::new(403, format!("Permission check failed ({w})")),
            None => Self::new(403, "Permission check failed"),
        }
    }

    /// 401 with the given reason.
    pub fn unauthorized(msg: &str) -> Self {
        Self::new(401, msg)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        for (k, v) in &self.errors {
            write!(f, "\n{k}: {v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl From<std::io::Error> for ApiError {
    fn from(e: std::io::Error) -> Self {
        ApiError::die(e.to_string())
    }
}

/// A value Proxmox would refuse, worded as Proxmox words it (`invalid format - ...`,
/// `type check ('integer') failed - ...`), so the lab can answer with the same text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<Invalid> for String {
    fn from(e: Invalid) -> String {
        e.0
    }
}
