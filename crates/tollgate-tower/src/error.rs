//! Why a request was refused at the edge, and the one table from refusals to
//! HTTP responses (STYLE §1.7).
//!
//! Status codes, error codes, headers and messages are those of the
//! sidecar's wire contract (SPEC §8, `tollgate-server`'s `outcome.rs`), so a
//! client sees the same refusal whether the limit was checked by this layer
//! or by `tollgate serve`: the body is `{error, limit?, retry_after_ms?,
//! field?, message}` as JSON, and a retryable 429 carries `Retry-After`
//! (whole seconds, rounded up) and `RateLimit-Remaining` / `RateLimit-Reset`.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;
use tollgate_core::{Denial, Limit, LimiterError};

/// Why the layer answered instead of the inner service.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Rejection {
    /// The identity extractor found no verified user.
    #[error("no verified identity")]
    Unauthorized,
    /// A limit refused the turn.
    #[error("{0}")]
    Denied(Denial),
    /// The limiter could not decide (store fault, no plan, bad user id).
    #[error(transparent)]
    Limiter(#[from] LimiterError),
}

/// The body of every refusal (SPEC §8), fields in the sidecar's order.
#[derive(Debug, Serialize)]
struct ErrorBody {
    error: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'static str>,
    message: String,
}

fn body(error: &'static str, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        error,
        limit: None,
        retry_after_ms: None,
        field: None,
        message: message.into(),
    }
}

const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// `Retry-After` (whole seconds, rounded up, at least 1) and `RateLimit-*`.
fn retry_headers(headers: &mut HeaderMap, retry_after_ms: u64) {
    let secs = HeaderValue::from(retry_after_ms.div_ceil(1_000).max(1));
    headers.insert(RETRY_AFTER, secs.clone());
    headers.insert(RATELIMIT_REMAINING, HeaderValue::from(0u64));
    headers.insert(RATELIMIT_RESET, secs);
}

fn denied(d: Denial, headers: &mut HeaderMap) -> (StatusCode, ErrorBody) {
    match d {
        Denial::Limited {
            limit,
            retry_after_ms,
        } => {
            retry_headers(headers, retry_after_ms);
            let secs = retry_after_ms.div_ceil(1_000);
            let message = match limit {
                Limit::TurnRate => format!("too many turns: retry in {secs} s"),
                Limit::Concurrency => {
                    format!("too many runs at once: finish one or retry in {secs} s")
                }
                Limit::TokenRate => format!("token rate exceeded: retry in {secs} s"),
                _ => d.to_string(),
            };
            let mut b = body(limit.as_str(), message);
            b.limit = Some(limit.as_str());
            b.retry_after_ms = Some(retry_after_ms);
            (StatusCode::TOO_MANY_REQUESTS, b)
        }
        Denial::ExceedsCapacity {
            limit,
            cost,
            max_cost,
        } => {
            let mut b = body(
                "exceeds_capacity",
                format!("an estimate of {cost} tokens can never be granted: at most {max_cost}"),
            );
            b.limit = Some(limit.as_str());
            (StatusCode::BAD_REQUEST, b)
        }
        Denial::CapReached { limit, cap } => {
            let mut b = body(
                limit.as_str(),
                format!("this run reached its cap of {cap} model calls; it must stop"),
            );
            b.limit = Some(limit.as_str());
            (StatusCode::TOO_MANY_REQUESTS, b)
        }
        _ => (
            StatusCode::TOO_MANY_REQUESTS,
            body("limited", d.to_string()),
        ),
    }
}

impl Rejection {
    /// The response for this refusal. Details of faults go to the log, never
    /// to the client.
    pub(crate) fn into_response(self) -> Response<Full<Bytes>> {
        let mut headers = HeaderMap::new();
        let (status, b) = match self {
            Rejection::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                body("unauthorized", "no verified identity on this request"),
            ),
            Rejection::Denied(d) => denied(d, &mut headers),
            Rejection::Limiter(LimiterError::Store(e)) if e.is_transient() => {
                tracing::warn!(error = %e, "turn-rate pre-check: store unavailable");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    body(
                        "store_unavailable",
                        "the limit store is unreachable; retry shortly",
                    ),
                )
            }
            Rejection::Limiter(LimiterError::UnknownUser { .. }) => (
                StatusCode::UNAUTHORIZED,
                body("unauthorized", "this user has no plan"),
            ),
            Rejection::Limiter(LimiterError::InvalidRequest { field, message }) => {
                let mut b = body("invalid_request", message);
                b.field = Some(field);
                (StatusCode::BAD_REQUEST, b)
            }
            Rejection::Limiter(e) => {
                tracing::error!(error = %e, "turn-rate pre-check: internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    body("internal", "internal error"),
                )
            }
        };
        let json = serde_json::to_vec(&b)
            .unwrap_or_else(|_| br#"{"error":"internal","message":"internal error"}"#.to_vec());
        let mut res = Response::new(Full::new(Bytes::from(json)));
        *res.status_mut() = status;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        *res.headers_mut() = headers;
        res
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::{StoreError, StoreErrorKind};

    use super::*;

    fn json(res: Response<Full<Bytes>>) -> (StatusCode, HeaderMap, serde_json::Value) {
        let (parts, body) = res.into_parts();
        // `Full` yields its one chunk synchronously; read it without a runtime.
        let mut body = std::pin::pin!(body);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let bytes = match http_body::Body::poll_frame(body.as_mut(), &mut cx) {
            std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
            _ => Bytes::new(),
        };
        let v = serde_json::from_slice(&bytes).expect("JSON body");
        (parts.status, parts.headers, v)
    }

    #[test]
    fn turn_rate_denial_matches_the_wire_contract() {
        let (status, headers, v) = json(
            Rejection::Denied(Denial::Limited {
                limit: Limit::TurnRate,
                retry_after_ms: 2_001,
            })
            .into_response(),
        );
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers["retry-after"], "3");
        assert_eq!(headers["ratelimit-remaining"], "0");
        assert_eq!(headers["ratelimit-reset"], "3");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(
            v,
            serde_json::json!({
                "error": "turn_rate", "limit": "turn_rate", "retry_after_ms": 2_001,
                "message": "too many turns: retry in 3 s"
            })
        );
    }

    #[test]
    fn faults_map_to_their_rows() {
        let transient = StoreError::new(StoreErrorKind::Timeout, "slow");
        let (status, _, v) = json(Rejection::from(LimiterError::Store(transient)).into_response());
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["error"], "store_unavailable");

        let bug = StoreError::new(StoreErrorKind::Protocol, "secret detail");
        let (status, _, v) = json(Rejection::from(LimiterError::Store(bug)).into_response());
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(v["error"], "internal");
        assert!(!v.to_string().contains("secret"), "no detail leaks");

        let nobody = LimiterError::UnknownUser { user: "u".into() };
        let (status, _, v) = json(Rejection::from(nobody).into_response());
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(v["error"], "unauthorized");

        let (status, headers, v) = json(
            Rejection::Denied(Denial::CapReached {
                limit: Limit::MaxLlmCalls,
                cap: 500,
            })
            .into_response(),
        );
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(headers.get("retry-after").is_none(), "not retryable");
        assert_eq!(v["error"], "max_llm_calls");
    }
}
