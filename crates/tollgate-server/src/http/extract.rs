//! Extractors that turn every malformed input into a 400 naming the field,
//! and a missing or invalid identity into a 401.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tollgate_core::Store;

use crate::identity::Identity;
use crate::outcome::{ApiError, HttpError};
use crate::state::App;

/// The verified user of the request.
pub(crate) struct User(pub(crate) tollgate_core::IdBuf);

impl<S: Store + Clone> FromRequestParts<App<S>> for User {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, HttpError> {
        Caller::from_request_parts(parts, app)
            .await
            .map(|c| User(c.0.user))
    }
}

/// The verified identity of the request, with what its credential allows.
pub(crate) struct Caller(pub(crate) Identity);

/// The identity the `/v1` routes' admission verified (a request
/// extension), so the extractors do not verify it again.
#[derive(Clone)]
pub(crate) struct Verified(pub(crate) Identity);

impl<S: Store + Clone> FromRequestParts<App<S>> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, HttpError> {
        // Taken, not cloned: each handler extracts the caller once (a
        // second extractor would verify the headers again).
        if let Some(Verified(identity)) = parts.extensions.remove::<Verified>() {
            return Ok(Caller(identity));
        }
        // The connection's peer (served with connect info); unknown in
        // tests that call the router without a socket.
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        crate::ops::verify_caller(app, &parts.headers, peer)
            .map(Caller)
            .map_err(HttpError)
    }
}

/// A JSON body; a parse error names the offending field.
pub(crate) struct Body<T>(pub(crate) T);

impl<S, T> FromRequest<App<S>> for Body<T>
where
    S: Store + Clone,
    T: DeserializeOwned,
{
    type Rejection = HttpError;

    async fn from_request(req: Request, app: &App<S>) -> Result<Self, HttpError> {
        let bytes = Bytes::from_request(req, app)
            .await
            .map_err(|e| ApiError::invalid("body", e.body_text()))?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("body", "a JSON object is required").into());
        }
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = clean(&inner);
            ApiError::invalid(field_of(&path, &message), message)
        })?;
        // Nothing but whitespace may follow the object.
        de.end().map_err(|e| ApiError::invalid("body", clean(&e)))?;
        Ok(Body(value))
    }
}

/// The field a deserialization error is about: its path, or for a missing
/// field (reported at the enclosing object) that field under the path.
fn field_of(path: &str, message: &str) -> String {
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    match (path, missing) {
        (".", Some(name)) => name.to_owned(),
        (_, Some(name)) => format!("{path}.{name}"),
        (".", None) => "body".to_owned(),
        (_, None) => path.to_owned(),
    }
}

/// serde_json's message without its "at line 1 column 5" suffix.
fn clean(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}
