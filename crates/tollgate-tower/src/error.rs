//! The layer's answers to refusals: the sidecar's own table
//! (`tollgate-outcome`, SPEC §8), so a client sees the same refusal whether
//! the limit was checked by this layer or by `tollgate serve`: the body is
//! `{error, limit?, retry_after_ms?, field?, message}` as JSON, and a
//! retryable 429 carries `Retry-After` (whole seconds, rounded up) and
//! `RateLimit-Remaining` / `RateLimit-Reset`.

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use tollgate_outcome::ApiError;

/// The refusal of a request without a verified user.
pub(crate) fn unauthorized() -> ApiError {
    ApiError::Unauthorized("no verified identity on this request".to_owned())
}

/// The response for this refusal. Details of store faults go to the log,
/// never to the client.
pub(crate) fn respond(e: ApiError) -> Response<Full<Bytes>> {
    match &e {
        ApiError::StoreUnavailable(detail) => {
            tracing::warn!(error = %detail, "turn-rate pre-check: store unavailable");
        }
        ApiError::StoreFull(detail) => {
            tracing::warn!(error = %detail, "turn-rate pre-check: store full");
        }
        ApiError::Internal(detail) => {
            tracing::error!(error = %detail, "turn-rate pre-check: internal error");
        }
        _ => {}
    }
    e.http_response().map(|json| Full::new(Bytes::from(json)))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, StatusCode};
    use tollgate_core::{Denial, Limit, LimiterError, StoreError, StoreErrorKind};

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
        let (status, headers, v) = json(respond(ApiError::Denied(Denial::Limited {
            limit: Limit::TurnRate,
            retry_after_ms: 2_001,
        })));
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
        let (status, _, v) = json(respond(ApiError::from(LimiterError::Store(transient))));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["error"], "store_unavailable");

        let bug = StoreError::new(StoreErrorKind::Protocol, "secret detail");
        let (status, _, v) = json(respond(ApiError::from(LimiterError::Store(bug))));
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(v["error"], "internal");
        assert!(!v.to_string().contains("secret"), "no detail leaks");

        let nobody = LimiterError::UnknownUser { user: "u".into() };
        let (status, _, v) = json(respond(ApiError::from(nobody)));
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(v["error"], "unauthorized");

        let (status, headers, v) = json(respond(ApiError::Denied(Denial::CapReached {
            limit: Limit::MaxLlmCalls,
            cap: 500,
        })));
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(headers.get("retry-after").is_none(), "not retryable");
        assert_eq!(v["error"], "max_llm_calls");
    }
}
