//! Errors: something kept a decision from being made. Limits are not errors.

use std::error::Error as StdError;

use crate::plan::InvalidPlans;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What kind of store fault happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached or the connection dropped.
    Unavailable,
    /// The store did not answer in time.
    Timeout,
    /// The store answered something this client does not understand, or a
    /// script failed: a bug or a version mismatch, not worth retrying.
    Protocol,
    /// The store refused the credentials or the command (configuration).
    Refused,
    /// The store is at its size bound (the in-memory store's `max_entries`,
    /// Redis out of memory): a request that needs a new key is refused,
    /// one on existing state still works. Worth retrying later, but not an
    /// outage: the failure policy does not apply ([`StoreError::is_transient`]
    /// is `false`), so a full store never sends decisions to a fallback.
    Full,
}

/// A store fault: no decision could be made.
#[derive(Debug, thiserror::Error)]
#[error("store {kind:?}: {message}")]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl StoreError {
    /// A store error of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error with its underlying cause attached.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind of fault.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether retrying (or failing open) may help: the store was
    /// unreachable or slow, not confused.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        )
    }

    /// Whether the store refused to hold a new key because it is full
    /// ([`StoreErrorKind::Full`]).
    pub fn is_full(&self) -> bool {
        self.kind == StoreErrorKind::Full
    }
}

/// Why the limiter could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The user has no plan and there is no default plan.
    #[error("user {user:?} has no plan and no default plan is configured")]
    UnknownUser {
        /// The user id.
        user: String,
    },
    /// A request field is invalid (the caller's mistake).
    #[error("invalid {field}: {message}")]
    InvalidRequest {
        /// The field name.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// No such reservation for this user (never made, or expired).
    #[error("unknown reservation {0}")]
    UnknownReservation(String),
    /// The plans failed validation.
    #[error(transparent)]
    InvalidPlans(#[from] InvalidPlans),
}

impl LimiterError {
    /// [`LimiterError::InvalidRequest`]: `field` is invalid, for `message`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        LimiterError::InvalidRequest {
            field,
            message: message.into(),
        }
    }

    /// Whether the store failed transiently (fail-open may apply).
    pub fn is_transient(&self) -> bool {
        matches!(self, LimiterError::Store(e) if e.is_transient())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_classification_and_source_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = StoreError::new(StoreErrorKind::Unavailable, "redis down").with_source(io);
        assert!(e.is_transient());
        assert!(e.source().is_some());
        assert!(!StoreError::new(StoreErrorKind::Protocol, "bad script").is_transient());
        let l = LimiterError::from(StoreError::new(StoreErrorKind::Timeout, "slow"));
        assert!(l.is_transient());
        let full = StoreError::new(StoreErrorKind::Full, "full");
        assert!(
            full.is_full() && !full.is_transient(),
            "a full store is no outage"
        );
    }
}
