//! Why planning or applying against real targets failed. The engine's own refusals are
//! [`Diagnostic`]s (causes and hints kept as data); what a target answered keeps its own
//! typed error, so a caller can still tell, say, a wait for a left-over run from a failure.

use crate::access::AccessError;
use crate::diagnostic::Diagnostic;
use crate::resources::wire::NotRead;

/// The error of the caller's own code that opens a target's reader or writer (its SSH
/// settings, its node's API login). The engine only carries it back; the caller can
/// downcast it to the type it put in.
pub type OpenError = Box<dyn std::error::Error + Send + Sync>;

/// Why `plan` or `apply` failed, for one target or for the run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The caller could not open a target.
    #[error(transparent)]
    Open(OpenError),
    /// Reading or changing a target failed.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// An answer the diff needs was not in what the target sent back.
    #[error(transparent)]
    NotRead(#[from] NotRead),
    /// The target was not reached at all, and why (another target failed first).
    #[error("not read ({0})")]
    NotReached(String),
    /// A refusal or a failure the engine found, with its causes and hints.
    #[error(transparent)]
    Refused(Box<Diagnostic>),
}

impl From<Diagnostic> for EngineError {
    fn from(d: Diagnostic) -> Self {
        EngineError::Refused(Box::new(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_opening_error_keeps_its_chain_and_its_type() {
        let e = EngineError::Open(Box::new(Outer(std::io::Error::other("inner"))));
        assert_eq!(one_line(&e), "outer: inner");
        let EngineError::Open(b) = e else {
            unreachable!()
        };
        assert!(
            b.downcast::<Outer>().is_ok(),
            "the caller gets its own type back"
        );
        let e = EngineError::NotReached("guest.a failed".into());
        assert_eq!(one_line(&e), "not read (guest.a failed)");
    }
}
