//! The one rule for ids (SPEC §6): user ids, invocation ids, session ids,
//! holders, request ids, tenants, provider and model names as the sidecar
//! reads them. Every entry point checks ids with [`check_id`] — the
//! [`Limiter`](crate::Limiter) (so the tower layer and the adk crate), the
//! sidecar's operations and its identity checks — so an id accepted by one
//! is accepted by all. Ids end up in store keys, metrics and logs.
//!
//! Provider keys in the config file (`"provider:model"`) keep their own,
//! documented rule (docs/config.md).

/// Longest accepted id, bytes.
pub const MAX_ID_LEN: usize = 512;

/// Why an id is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The id is the empty string.
    #[error("must not be empty")]
    Empty,
    /// The id is longer than [`MAX_ID_LEN`] bytes.
    #[error("must be at most {MAX_ID_LEN} bytes")]
    TooLong,
    /// The id contains a control character (a newline, NUL, …).
    #[error("must not contain control characters")]
    Control,
}

/// Checks an id: non-empty, at most [`MAX_ID_LEN`] bytes, no control
/// characters.
///
/// # Errors
///
/// The first rule the id breaks.
///
/// ```
/// use tollgate_core::id::{IdError, check_id};
/// assert_eq!(check_id("u42"), Ok(()));
/// assert_eq!(check_id(""), Err(IdError::Empty));
/// assert_eq!(check_id("a\nb"), Err(IdError::Control));
/// ```
pub fn check_id(v: &str) -> Result<(), IdError> {
    if v.is_empty() {
        return Err(IdError::Empty);
    }
    if v.len() > MAX_ID_LEN {
        return Err(IdError::TooLong);
    }
    if v.chars().any(char::is_control) {
        return Err(IdError::Control);
    }
    Ok(())
}
