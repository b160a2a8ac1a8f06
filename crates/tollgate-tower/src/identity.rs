//! Who is asking: the pluggable [`IdentityExtractor`].
//!
//! The layer never decides who a request belongs to by itself. SPEC §6: the
//! user id comes from a verified token or a trusted upstream, never from a
//! field the client chose. An extractor reads that verified identity from the
//! request: a header an upstream verifier set ([`HeaderIdentity`]), a request
//! extension an authentication layer inserted before this one, or anything a
//! closure can compute.

use http::{HeaderName, Request};

/// Reads the verified user id of a request.
///
/// Answering `None` (or an empty id) means the request has no verified
/// identity: the layer answers 401 `{"error":"unauthorized", …}` and the inner
/// service is not called.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<String>`, so an
/// extractor can be written inline:
///
/// ```
/// use tollgate_tower::IdentityExtractor;
///
/// /// Set by an authentication layer that runs before the turn-rate layer.
/// #[derive(Clone)]
/// struct Verified(String);
///
/// fn from_extension(req: &http::Request<()>) -> Option<String> {
///     req.extensions().get::<Verified>().map(|v| v.0.clone())
/// }
///
/// let mut req = http::Request::new(());
/// assert_eq!(from_extension.user(&req), None);
/// req.extensions_mut().insert(Verified("u42".into()));
/// assert_eq!(from_extension.user(&req).as_deref(), Some("u42"));
/// ```
pub trait IdentityExtractor<B>: Clone + Send + Sync + 'static {
    /// The verified user id of `req`, or `None` if it has none.
    fn user(&self, req: &Request<B>) -> Option<String>;
}

impl<B, F> IdentityExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn user(&self, req: &Request<B>) -> Option<String> {
        self(req)
    }
}

/// The user id from a header that a trusted upstream (an API gateway, an
/// authenticating proxy) sets after verifying the caller.
///
/// Only use this behind an upstream that removes or overwrites the header on
/// every request it forwards; otherwise a client can name any user.
///
/// A request without the header, with an empty or non-UTF-8 value, or with
/// the header more than once (ambiguous: a client value may have slipped
/// through next to the upstream's) has no identity.
///
/// ```
/// use tollgate_tower::{HeaderIdentity, IdentityExtractor};
///
/// let identity = HeaderIdentity::from_static("x-user");
/// let req = http::Request::builder().header("x-user", "u42").body(()).unwrap();
/// assert_eq!(identity.user(&req).as_deref(), Some("u42"));
/// ```
#[derive(Debug, Clone)]
pub struct HeaderIdentity {
    name: HeaderName,
}

impl HeaderIdentity {
    /// Reads the user id from the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// Reads the user id from the header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lowercase header name (as
    /// [`HeaderName::from_static`]).
    #[track_caller]
    pub fn from_static(name: &'static str) -> Self {
        Self::new(HeaderName::from_static(name))
    }

    /// The header read.
    pub fn header_name(&self) -> &HeaderName {
        &self.name
    }
}

impl<B> IdentityExtractor<B> for HeaderIdentity {
    fn user(&self, req: &Request<B>) -> Option<String> {
        let mut values = req.headers().get_all(&self.name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let user = value.to_str().ok()?.trim();
        (!user.is_empty()).then(|| user.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(values: &[&str]) -> Request<()> {
        let mut b = Request::builder();
        for v in values {
            b = b.header("x-user", *v);
        }
        b.body(()).expect("valid request")
    }

    #[test]
    fn header_identity_reads_one_non_empty_value() {
        let id = HeaderIdentity::from_static("x-user");
        assert_eq!(id.user(&req(&["u42"])).as_deref(), Some("u42"));
        assert_eq!(id.user(&req(&[" u42 "])).as_deref(), Some("u42"));
        assert_eq!(id.user(&req(&[])), None);
        assert_eq!(id.user(&req(&[""])), None);
        assert_eq!(id.user(&req(&["  "])), None);
        assert_eq!(id.user(&req(&["u1", "u2"])), None, "ambiguous");
        let mut r = req(&[]);
        r.headers_mut().insert(
            "x-user",
            http::HeaderValue::from_bytes(b"\xffu").expect("opaque value"),
        );
        assert_eq!(id.user(&r), None, "not UTF-8");
    }

    #[test]
    fn closures_are_extractors() {
        let fixed = |_: &Request<()>| Some("u1".to_owned());
        assert_eq!(fixed.user(&req(&[])).as_deref(), Some("u1"));
    }
}
