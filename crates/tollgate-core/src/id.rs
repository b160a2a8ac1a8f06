//! The one rule for ids (SPEC §6): user ids, invocation ids, session ids,
//! holders, request ids, tenants, provider and model names as the sidecar
//! reads them. An id is 1 to [`MAX_ID_LEN`] characters (Unicode scalar
//! values, as JSON Schema's `maxLength` counts them) with no control
//! character. Ids end up in store keys, metrics and logs.
//!
//! An id is checked once, where a request enters — the sidecar's
//! operations, its identity checks, the adk crate, the tower layer — and
//! travels as an [`Id`] (borrowed) or [`IdBuf`] (owned) from there: the
//! [`Limiter`](crate::Limiter) takes either ([`IntoId`]) and checks only a
//! plain `&str`.
//!
//! Provider keys in the config file (`"provider:model"`) keep their own,
//! documented rule (docs/config.md).

use std::fmt;
use std::ops::Deref;

/// Longest accepted id, characters (at most 4 bytes of UTF-8 each).
pub const MAX_ID_LEN: usize = 512;

macro_rules! id_character {
    () => {
        r"[^\u0000-\u001f\u007f-\u009f]"
    };
}

/// One character of an id as a regular expression: anything but a control
/// character (Unicode category Cc, what [`char::is_control`] tests).
pub const ID_CHARACTER: &str = id_character!();

/// The id rule's characters as a JSON Schema `pattern` (the length is
/// `minLength` 1 and `maxLength` [`MAX_ID_LEN`]).
pub const ID_PATTERN: &str = concat!("^", id_character!(), "+$");

/// Why an id is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The id is the empty string.
    #[error("must not be empty")]
    Empty,
    /// The id is longer than [`MAX_ID_LEN`] characters.
    #[error("must be at most {MAX_ID_LEN} characters")]
    TooLong,
    /// The id contains a control character (a newline, NUL, …).
    #[error("must not contain control characters")]
    Control,
}

/// Checks an id: non-empty, at most [`MAX_ID_LEN`] characters, no control
/// characters. Prefer [`Id::new`], which keeps the answer.
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
/// assert_eq!(check_id(&"é".repeat(512)), Ok(()));
/// assert_eq!(check_id(&"é".repeat(513)), Err(IdError::TooLong));
/// ```
pub fn check_id(v: &str) -> Result<(), IdError> {
    if v.is_empty() {
        return Err(IdError::Empty);
    }
    // Bytes bound characters from above: most ids are decided here.
    if v.len() > MAX_ID_LEN && v.chars().count() > MAX_ID_LEN {
        return Err(IdError::TooLong);
    }
    if v.chars().any(char::is_control) {
        return Err(IdError::Control);
    }
    Ok(())
}

/// An id that passed [`check_id`], borrowed: built once where a request
/// enters, then passed down without another check.
///
/// ```
/// use tollgate_core::id::Id;
/// let user = Id::new("u42").unwrap();
/// assert_eq!(user.as_str(), "u42");
/// assert!(Id::new("").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id<'a>(&'a str);

impl<'a> Id<'a> {
    /// `v` as an id.
    ///
    /// # Errors
    ///
    /// The first rule of [`check_id`] it breaks.
    pub fn new(v: &'a str) -> Result<Self, IdError> {
        check_id(v)?;
        Ok(Self(v))
    }

    /// The id's text.
    pub fn as_str(self) -> &'a str {
        self.0
    }

    /// The two non-empty halves of `provider:model` (split at the first
    /// colon), each an id by construction; `None`: no colon, or an empty
    /// half.
    pub fn split_model(self) -> Option<(Id<'a>, Id<'a>)> {
        let (p, m) = self.0.split_once(':')?;
        (!p.is_empty() && !m.is_empty()).then_some((Id(p), Id(m)))
    }
}

impl Deref for Id<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for Id<'_> {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl fmt::Display for Id<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl PartialEq<str> for Id<'_> {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Id<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// An id that passed [`check_id`], owned (a verified user's id, kept for
/// the request).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdBuf(Box<str>);

impl IdBuf {
    /// `v` as an id.
    ///
    /// # Errors
    ///
    /// The first rule of [`check_id`] it breaks.
    pub fn new(v: impl Into<String>) -> Result<Self, IdError> {
        let v = v.into();
        check_id(&v)?;
        Ok(Self(v.into_boxed_str()))
    }

    /// The id, borrowed.
    pub fn as_id(&self) -> Id<'_> {
        Id(&self.0)
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<Id<'_>> for IdBuf {
    fn from(id: Id<'_>) -> Self {
        Self(id.0.into())
    }
}

impl From<IdBuf> for String {
    fn from(id: IdBuf) -> Self {
        id.0.into()
    }
}

impl Deref for IdBuf {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for IdBuf {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for IdBuf {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for IdBuf {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Id<'_> {}
    impl Sealed for &super::IdBuf {}
    impl Sealed for &str {}
    impl Sealed for &&str {}
    impl Sealed for &String {}
}

/// What the [`Limiter`](crate::Limiter) takes where an id goes: an [`Id`]
/// or `&IdBuf` (checked already, passed through) or a `&str` (checked
/// here).
pub trait IntoId<'a>: sealed::Sealed {
    /// The id.
    ///
    /// # Errors
    ///
    /// A `&str` that breaks the rule of [`check_id`].
    fn into_id(self) -> Result<Id<'a>, IdError>;
}

impl<'a> IntoId<'a> for Id<'a> {
    fn into_id(self) -> Result<Id<'a>, IdError> {
        Ok(self)
    }
}

impl<'a> IntoId<'a> for &'a IdBuf {
    fn into_id(self) -> Result<Id<'a>, IdError> {
        Ok(self.as_id())
    }
}

impl<'a> IntoId<'a> for &'a str {
    fn into_id(self) -> Result<Id<'a>, IdError> {
        Id::new(self)
    }
}

impl<'a> IntoId<'a> for &'a String {
    fn into_id(self) -> Result<Id<'a>, IdError> {
        Id::new(self)
    }
}

impl<'a> IntoId<'a> for &&'a str {
    fn into_id(self) -> Result<Id<'a>, IdError> {
        Id::new(self)
    }
}
