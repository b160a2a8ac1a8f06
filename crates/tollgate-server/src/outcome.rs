//! The one table from outcomes to HTTP responses (SPEC §8): status, error
//! code, headers and the body `{error, limit?, retry_after_ms?, message}`.
//! Handlers return [`ApiError`]; nothing else builds an error response.

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_core::provider::ProviderError;
use tollgate_core::{Denial, Limit, LimiterError, StoreError};

/// Why a request did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A limit refused.
    #[error("{0}")]
    Denied(Denial),
    /// Another turn holds the session.
    #[error("a turn is already running in this session")]
    SessionBusy {
        /// Remaining TTL of the holder's lease, ms.
        retry_after_ms: u64,
    },
    /// The run lease is gone (expired or released).
    #[error("the run lease is gone")]
    LeaseLost,
    /// The caller does not hold this session lease.
    #[error("not the holder of this session lease")]
    NotHolder,
    /// The fence is not the session's latest.
    #[error("stale fence")]
    StaleFence {
        /// The latest issued fence.
        latest: u64,
    },
    /// No such reservation for this user.
    #[error("unknown reservation")]
    UnknownReservation,
    /// A provider key's limits refused a permit: its rate
    /// ([`Limit::Bucket`], `provider_rate`), its cooldown after a 429
    /// ([`Limit::Cooldown`], `provider_cooldown`), or a cost it can never
    /// grant ([`Denial::ExceedsCapacity`]).
    #[error("provider permit refused: {0}")]
    ProviderDenied(Denial),
    /// The provider reported its quota exhausted (per day, billing): fail
    /// fast, do not retry.
    #[error("provider quota exhausted: {reason}")]
    ProviderExhausted {
        /// What the provider said.
        reason: String,
        /// How long this replica keeps failing fast, ms.
        retry_after_ms: u64,
    },
    /// No limits are configured for this (provider, model).
    #[error("no limits configured for provider {provider:?} model {model:?}")]
    UnknownProvider {
        /// The provider.
        provider: String,
        /// The model.
        model: String,
    },
    /// The request is malformed.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// The field (a JSON path, a path parameter or `body`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No verified identity.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The store failed (fail closed).
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    /// This replica is at its in-flight cap.
    #[error("overloaded")]
    Overloaded,
    /// A store fault that is not an outage (a bug or misconfiguration).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// An invalid-field error.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_transient() {
            ApiError::StoreUnavailable(e.to_string())
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl From<LimiterError> for ApiError {
    fn from(e: LimiterError) -> Self {
        match e {
            LimiterError::Store(s) => s.into(),
            LimiterError::InvalidRequest { field, message } => ApiError::invalid(field, message),
            LimiterError::UnknownReservation(_) => ApiError::UnknownReservation,
            LimiterError::UnknownUser { .. } => {
                ApiError::Unauthorized("this user has no plan".to_owned())
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl ApiError {
    /// The row of a provider governor error, `now_ms` being the governor's
    /// clock (an exhaustion's hint is the time left until it ends).
    pub fn from_provider(e: ProviderError, now_ms: u64) -> Self {
        match e {
            ProviderError::Unknown { provider, model } => {
                ApiError::UnknownProvider { provider, model }
            }
            ProviderError::Exhausted { reason, until_ms } => ApiError::ProviderExhausted {
                reason,
                retry_after_ms: until_ms.saturating_sub(now_ms).max(1),
            },
            ProviderError::Store(s) => s.into(),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// The wire name of a provider refusal's limit: `provider_rate` (a
/// provider key's rate or tenant share) or `provider_cooldown`.
pub fn provider_limit_code(l: Limit) -> &'static str {
    match l {
        Limit::Cooldown => "provider_cooldown",
        _ => "provider_rate",
    }
}

/// A response extension marking a store fault, so the metrics layer can
/// count it (details go to the logs, never to the client).
#[derive(Debug, Clone, Copy)]
pub struct StoreFault;

/// The body of every refusal.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable code: `turn_rate`, `concurrency`, `token_rate`,
    /// `max_llm_calls`, `exceeds_capacity`, `session_busy`, `lease_lost`,
    /// `not_holder`, `stale_fence`, `unknown_reservation`, `provider_rate`,
    /// `provider_cooldown`, `provider_exhausted`, `unknown_provider`,
    /// `invalid_request`, `unauthorized`, `store_unavailable`, `overloaded`,
    /// `internal`.
    pub error: &'static str,
    /// The limit that refused, for limit errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<&'static str>,
    /// When to retry, ms (retryable refusals). For `provider_exhausted`,
    /// which is not retryable: how long this replica keeps failing fast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The offending field, for `invalid_request`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The latest fence, for `stale_fence`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest_fence: Option<u64>,
    /// A sentence for people.
    pub message: String,
}

fn limit_code(l: Limit) -> &'static str {
    l.as_str()
}

fn body(error: &'static str, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        error,
        limit: None,
        retry_after_ms: None,
        field: None,
        latest_fence: None,
        message: message.into(),
    }
}

/// `Retry-After` (whole seconds, rounded up) and `RateLimit-*` headers.
fn retry_headers(headers: &mut HeaderMap, retry_after_ms: u64) {
    let secs = retry_after_ms.div_ceil(1_000).max(1);
    let v = HeaderValue::from(secs);
    headers.insert("retry-after", v.clone());
    headers.insert("ratelimit-remaining", HeaderValue::from(0u64));
    headers.insert("ratelimit-reset", v);
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        let (status, b) = match &self {
            ApiError::Denied(d) => match *d {
                Denial::Limited {
                    limit,
                    retry_after_ms,
                } => {
                    retry_headers(&mut headers, retry_after_ms);
                    let msg = match limit {
                        Limit::TurnRate => format!(
                            "too many turns: retry in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                        Limit::Concurrency => format!(
                            "too many runs at once: finish one or retry in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                        Limit::TokenRate => format!(
                            "token rate exceeded: retry in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                        _ => d.to_string(),
                    };
                    let mut b = body(limit_code(limit), msg);
                    b.limit = Some(limit_code(limit));
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
                        format!(
                            "an estimate of {cost} tokens can never be granted: at most {max_cost}"
                        ),
                    );
                    b.limit = Some(limit_code(limit));
                    (StatusCode::BAD_REQUEST, b)
                }
                Denial::CapReached { limit, cap } => {
                    let mut b = body(
                        limit_code(limit),
                        format!("this run reached its cap of {cap} model calls; it must stop"),
                    );
                    b.limit = Some(limit_code(limit));
                    (StatusCode::TOO_MANY_REQUESTS, b)
                }
                _ => (
                    StatusCode::TOO_MANY_REQUESTS,
                    body("limited", d.to_string()),
                ),
            },
            ApiError::ProviderDenied(d) => match *d {
                Denial::Limited {
                    limit,
                    retry_after_ms,
                } => {
                    retry_headers(&mut headers, retry_after_ms);
                    let code = provider_limit_code(limit);
                    let msg = match limit {
                        Limit::Cooldown => format!(
                            "the provider is cooling down after a 429: retry in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                        _ => format!(
                            "provider rate exceeded: retry in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                    };
                    let mut b = body(code, msg);
                    b.limit = Some(code);
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
                        format!(
                            "a call costing {cost} can never be granted by this provider key's limits: at most {max_cost}"
                        ),
                    );
                    b.limit = Some(provider_limit_code(limit));
                    (StatusCode::BAD_REQUEST, b)
                }
                _ => (
                    StatusCode::TOO_MANY_REQUESTS,
                    body("provider_rate", d.to_string()),
                ),
            },
            // Not retryable, so no `Retry-After` (SPEC §8 gives it to
            // retryable 429s): the body's `retry_after_ms` only says how
            // long this replica keeps failing fast.
            ApiError::ProviderExhausted {
                reason,
                retry_after_ms,
            } => {
                let mut b = body(
                    "provider_exhausted",
                    format!("provider quota exhausted ({reason}); do not retry"),
                );
                b.retry_after_ms = Some(*retry_after_ms);
                (StatusCode::FORBIDDEN, b)
            }
            ApiError::UnknownProvider { provider, model } => (
                StatusCode::NOT_FOUND,
                body(
                    "unknown_provider",
                    format!("no limits are configured for provider {provider:?} model {model:?}"),
                ),
            ),
            ApiError::SessionBusy { retry_after_ms } => {
                retry_headers(&mut headers, *retry_after_ms);
                let mut b = body("session_busy", "a turn is already running in this session");
                b.retry_after_ms = Some(*retry_after_ms);
                (StatusCode::CONFLICT, b)
            }
            ApiError::LeaseLost => (
                StatusCode::NOT_FOUND,
                body("lease_lost", "the run lease is gone (expired or released)"),
            ),
            ApiError::NotHolder => (
                StatusCode::NOT_FOUND,
                body("not_holder", "this holder does not hold the session lease"),
            ),
            ApiError::StaleFence { latest } => {
                let mut b = body(
                    "stale_fence",
                    "another turn has taken this session over; stop writing",
                );
                b.latest_fence = Some(*latest);
                (StatusCode::CONFLICT, b)
            }
            ApiError::UnknownReservation => (
                StatusCode::NOT_FOUND,
                body("unknown_reservation", "no such reservation for this user"),
            ),
            ApiError::Invalid { field, message } => {
                let mut b = body("invalid_request", message.clone());
                b.field = Some(field.clone());
                (StatusCode::BAD_REQUEST, b)
            }
            ApiError::Unauthorized(m) => {
                (StatusCode::UNAUTHORIZED, body("unauthorized", m.clone()))
            }
            ApiError::StoreUnavailable(detail) => {
                tracing::warn!(error = %detail, "store unavailable");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    body(
                        "store_unavailable",
                        "the limit store is unreachable; retry shortly",
                    ),
                )
            }
            ApiError::Overloaded => {
                headers.insert("retry-after", HeaderValue::from(1u64));
                let mut b = body(
                    "overloaded",
                    "this replica is at its in-flight cap; retry in 1 s",
                );
                b.retry_after_ms = Some(1_000);
                (StatusCode::TOO_MANY_REQUESTS, b)
            }
            ApiError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    body("internal", "internal error"),
                )
            }
        };
        let fault = matches!(self, ApiError::StoreUnavailable(_) | ApiError::Internal(_));
        let mut resp = (status, headers, Json(b)).into_response();
        if fault {
            resp.extensions_mut().insert(StoreFault);
        }
        resp
    }
}
