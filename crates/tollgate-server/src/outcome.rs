//! The one table from outcomes to responses (SPEC §8), for both
//! transports: the HTTP status, headers and body `{error, limit?,
//! retry_after_ms?, message}`, and the gRPC status with its metadata and
//! `google.rpc` details. Handlers and gRPC methods return [`ApiError`];
//! nothing else builds an error response.
//!
//! | `error` | HTTP | gRPC | retry hint |
//! |---|---|---|---|
//! | `turn_rate`, `concurrency`, `token_rate`, `sessions` | 429 | `RESOURCE_EXHAUSTED` | yes |
//! | `provider_rate`, `provider_cooldown` | 429 | `RESOURCE_EXHAUSTED` | yes |
//! | `overloaded` (replica in-flight cap) | 429 | `RESOURCE_EXHAUSTED` | 1,000 ms |
//! | `too_many_waits` (`wait=true` bounds, `[limits]`) | 429 | `RESOURCE_EXHAUSTED` | 1,000 ms |
//! | `request_timeout` (body not read within `body_timeout_ms`) | 408 | `DEADLINE_EXCEEDED` | no |
//! | `max_llm_calls` | 429 | `RESOURCE_EXHAUSTED` | no: the run must stop |
//! | `provider_exhausted` | 403 | `RESOURCE_EXHAUSTED` | no (`retry_after_ms`: how long it fails fast) |
//! | `exceeds_capacity` | 400 | `FAILED_PRECONDITION` | no: never fits the configured limits |
//! | `session_busy` | 409 | `ABORTED` | yes (the holder's remaining TTL) |
//! | `stale_fence` | 409 | `FAILED_PRECONDITION` | no: the writer must stop |
//! | `lease_lost`, `not_holder`, `unknown_reservation`, `unknown_provider` | 404 | `NOT_FOUND` | no |
//! | `invalid_request` | 400 | `INVALID_ARGUMENT` (+ `BadRequest` naming the field) | no |
//! | `unauthorized` | 401 | `UNAUTHENTICATED` | no |
//! | `forbidden` (the credential lacks a privilege) | 403 | `PERMISSION_DENIED` | no |
//! | `store_unavailable` (fail_closed) | 503 | `UNAVAILABLE` | no |
//! | `store_full` (the store at its size bound) | 503 | `RESOURCE_EXHAUSTED` | 1,000 ms |
//! | `internal` | 500 | `INTERNAL` | no |
//!
//! A retry hint is, over HTTP, `Retry-After` (whole seconds, rounded up)
//! with `RateLimit-*` for limits and `retry_after_ms` in the body; over
//! gRPC, the `retry-after-ms` metadata and a `google.rpc.RetryInfo`
//! detail (see [`ApiError::to_status`]).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_core::gate::OVERLOADED_RETRY_MS;
use tollgate_core::{Clock, Denial, Limit, LimiterError, MonotonicClock, StoreError};
use tollgate_provider::ProviderError;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic_types::{ErrorDetails, StatusExt};

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
    /// Verified, but the credential does not allow this (a fleet-wide write
    /// without its scope, another tenant's share).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The store failed (fail closed).
    #[error("store unavailable: {0}")]
    StoreUnavailable(String),
    /// The store is at its size bound (`[store] max_entries`, Redis
    /// `maxmemory`): a request that needs a new key is refused; existing
    /// state still works.
    #[error("store full: {0}")]
    StoreFull(String),
    /// This replica is at its in-flight cap.
    #[error("overloaded")]
    Overloaded,
    /// A `wait=true` request past the bound of its user or of the replica
    /// (`[limits] max_waits_per_user`, `max_waiting`); nothing was decided.
    #[error("too many waiting requests: {0}")]
    TooManyWaits(crate::edge::TooManyWaits),
    /// The request's body did not arrive within `[limits] body_timeout_ms`.
    #[error("request body timed out")]
    RequestTimeout {
        /// The body timeout, ms.
        timeout_ms: u64,
    },
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
        if e.is_full() {
            ApiError::StoreFull(e.to_string())
        } else if e.is_transient() {
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
    /// `sessions`, `invalid_request`, `unauthorized`, `forbidden`,
    /// `store_unavailable`, `store_full`, `overloaded`, `too_many_waits`,
    /// `request_timeout`, `internal`.
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

/// How a refusal may be retried.
#[derive(Debug, Clone, Copy)]
enum Retry {
    /// Not as it is (or not before something changes).
    No,
    /// A retryable limit, after this many ms. HTTP: `Retry-After` and
    /// `RateLimit-*`; gRPC: `RetryInfo` and `retry-after-ms`.
    Limit(u64),
    /// Retryable after this many ms, but not a limit on the client (the
    /// replica is at its cap). HTTP: `Retry-After` only; gRPC: as
    /// [`Retry::Limit`].
    Backoff(u64),
}

/// One row of the table: what a refusal is on each transport.
struct Row {
    http: StatusCode,
    grpc: tonic::Code,
    retry: Retry,
    body: ErrorBody,
}

impl Row {
    fn new(http: StatusCode, grpc: tonic::Code, body: ErrorBody) -> Self {
        Self {
            http,
            grpc,
            retry: Retry::No,
            body,
        }
    }

    /// A retryable limit: the hint goes in the body and the headers.
    fn limited(mut self, retry_after_ms: u64) -> Self {
        self.body.retry_after_ms = Some(retry_after_ms);
        self.retry = Retry::Limit(retry_after_ms);
        self
    }
}

impl ApiError {
    /// Whether this is a store fault (an outage, or a fault that is not
    /// one: a bug or misconfiguration), counted in
    /// `tollgate_store_errors_total`.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            ApiError::StoreUnavailable(_) | ApiError::StoreFull(_) | ApiError::Internal(_)
        )
    }

    /// The table (SPEC §8): HTTP status, gRPC code, retry hint and body of
    /// every outcome. Store faults are logged here, with their details
    /// (which never reach the client).
    fn row(&self) -> Row {
        use StatusCode as H;
        use tonic::Code as G;
        match self {
            ApiError::Denied(d) => match *d {
                Denial::Limited {
                    limit,
                    retry_after_ms,
                } => {
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
                        Limit::Sessions => format!(
                            "too many live sessions: reuse one, or retry a new one in {} s",
                            retry_after_ms.div_ceil(1_000)
                        ),
                        _ => d.to_string(),
                    };
                    let mut b = body(limit_code(limit), msg);
                    b.limit = Some(limit_code(limit));
                    Row::new(H::TOO_MANY_REQUESTS, G::ResourceExhausted, b).limited(retry_after_ms)
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
                    Row::new(H::BAD_REQUEST, G::FailedPrecondition, b)
                }
                // Not retryable: the run must stop.
                Denial::CapReached { limit, cap } => {
                    let mut b = body(
                        limit_code(limit),
                        format!("this run reached its cap of {cap} model calls; it must stop"),
                    );
                    b.limit = Some(limit_code(limit));
                    Row::new(H::TOO_MANY_REQUESTS, G::ResourceExhausted, b)
                }
                _ => Row::new(
                    H::TOO_MANY_REQUESTS,
                    G::ResourceExhausted,
                    body("limited", d.to_string()),
                ),
            },
            ApiError::ProviderDenied(d) => match *d {
                Denial::Limited {
                    limit,
                    retry_after_ms,
                } => {
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
                    Row::new(H::TOO_MANY_REQUESTS, G::ResourceExhausted, b).limited(retry_after_ms)
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
                    Row::new(H::BAD_REQUEST, G::FailedPrecondition, b)
                }
                _ => Row::new(
                    H::TOO_MANY_REQUESTS,
                    G::ResourceExhausted,
                    body("provider_rate", d.to_string()),
                ),
            },
            // Not retryable, so no `Retry-After` (SPEC §8 gives it to
            // retryable 429s) and no `RetryInfo`: the body's
            // `retry_after_ms` only says how long this replica keeps
            // failing fast. gRPC: RESOURCE_EXHAUSTED (a quota is used up),
            // not PERMISSION_DENIED, which gRPC reserves for refusals that
            // are not about an exhausted resource.
            ApiError::ProviderExhausted {
                reason,
                retry_after_ms,
            } => {
                let mut b = body(
                    "provider_exhausted",
                    format!("provider quota exhausted ({reason}); do not retry"),
                );
                b.retry_after_ms = Some(*retry_after_ms);
                Row::new(H::FORBIDDEN, G::ResourceExhausted, b)
            }
            ApiError::UnknownProvider { provider, model } => Row::new(
                H::NOT_FOUND,
                G::NotFound,
                body(
                    "unknown_provider",
                    format!("no limits are configured for provider {provider:?} model {model:?}"),
                ),
            ),
            // A conflict worth retrying once the holder is done: gRPC
            // ABORTED, with the holder's remaining TTL as the hint.
            ApiError::SessionBusy { retry_after_ms } => Row::new(
                H::CONFLICT,
                G::Aborted,
                body("session_busy", "a turn is already running in this session"),
            )
            .limited(*retry_after_ms),
            ApiError::LeaseLost => Row::new(
                H::NOT_FOUND,
                G::NotFound,
                body("lease_lost", "the run lease is gone (expired or released)"),
            ),
            ApiError::NotHolder => Row::new(
                H::NOT_FOUND,
                G::NotFound,
                body("not_holder", "this holder does not hold the session lease"),
            ),
            // The writer must stop, not retry: gRPC FAILED_PRECONDITION.
            ApiError::StaleFence { latest } => {
                let mut b = body(
                    "stale_fence",
                    "another turn has taken this session over; stop writing",
                );
                b.latest_fence = Some(*latest);
                Row::new(H::CONFLICT, G::FailedPrecondition, b)
            }
            ApiError::UnknownReservation => Row::new(
                H::NOT_FOUND,
                G::NotFound,
                body("unknown_reservation", "no such reservation for this user"),
            ),
            ApiError::Invalid { field, message } => {
                let mut b = body("invalid_request", message.clone());
                b.field = Some(field.clone());
                Row::new(H::BAD_REQUEST, G::InvalidArgument, b)
            }
            ApiError::Unauthorized(m) => Row::new(
                H::UNAUTHORIZED,
                G::Unauthenticated,
                body("unauthorized", m.clone()),
            ),
            ApiError::Forbidden(m) => Row::new(
                H::FORBIDDEN,
                G::PermissionDenied,
                body("forbidden", m.clone()),
            ),
            ApiError::StoreUnavailable(detail) => {
                if let Some(suppressed) = UNAVAILABLE_LOG.admit(log_now_ms()) {
                    tracing::warn!(error = %detail, suppressed, "store unavailable");
                }
                Row::new(
                    H::SERVICE_UNAVAILABLE,
                    G::Unavailable,
                    body(
                        "store_unavailable",
                        "the limit store is unreachable; retry shortly",
                    ),
                )
            }
            // Retryable, but not an outage: the store answered. gRPC
            // RESOURCE_EXHAUSTED (a resource is used up), not UNAVAILABLE:
            // a client's retry policy retries UNAVAILABLE at once, and
            // Envoy-style callers treat it as the store being down, while
            // a full store needs its state to expire first. The hint is a
            // backoff, not a limit of the client's.
            ApiError::StoreFull(detail) => {
                if let Some(suppressed) = FULL_LOG.admit(log_now_ms()) {
                    tracing::warn!(error = %detail, suppressed, "store full");
                }
                let mut b = body(
                    "store_full",
                    "the limit store is full; existing runs and sessions still work, retry new ones shortly",
                );
                b.retry_after_ms = Some(OVERLOADED_RETRY_MS);
                Row {
                    retry: Retry::Backoff(OVERLOADED_RETRY_MS),
                    ..Row::new(H::SERVICE_UNAVAILABLE, G::ResourceExhausted, b)
                }
            }
            ApiError::Overloaded => {
                let mut b = body(
                    "overloaded",
                    "this replica is at its in-flight cap; retry in 1 s",
                );
                b.retry_after_ms = Some(OVERLOADED_RETRY_MS);
                Row {
                    retry: Retry::Backoff(OVERLOADED_RETRY_MS),
                    ..Row::new(H::TOO_MANY_REQUESTS, G::ResourceExhausted, b)
                }
            }
            // Retryable, but not a limit on the client: the bound frees as
            // the waiting requests end. wait=false needs no place.
            ApiError::TooManyWaits(which) => {
                let who = match which {
                    crate::edge::TooManyWaits::User(_) => "",
                    crate::edge::TooManyWaits::Replica(_) => " (all users)",
                };
                let mut b = body(
                    "too_many_waits",
                    format!(
                        "{which}{who}: retry in 1 s, or send wait=false and wait out wait_ms yourself"
                    ),
                );
                b.retry_after_ms = Some(OVERLOADED_RETRY_MS);
                Row {
                    retry: Retry::Backoff(OVERLOADED_RETRY_MS),
                    ..Row::new(H::TOO_MANY_REQUESTS, G::ResourceExhausted, b)
                }
            }
            ApiError::RequestTimeout { timeout_ms } => Row::new(
                H::REQUEST_TIMEOUT,
                G::DeadlineExceeded,
                body(
                    "request_timeout",
                    format!("the request body did not arrive within {timeout_ms} ms"),
                ),
            ),
            ApiError::Internal(detail) => {
                if let Some(suppressed) = INTERNAL_LOG.admit(log_now_ms()) {
                    tracing::error!(error = %detail, suppressed, "internal error");
                }
                Row::new(
                    H::INTERNAL_SERVER_ERROR,
                    G::Internal,
                    body("internal", "internal error"),
                )
            }
        }
    }

    /// The gRPC status of this outcome (the same row as the HTTP
    /// response): its code, the body's message, metadata
    /// `x-tollgate-error: <code>`, `x-tollgate-limit: <limit>` (limit
    /// refusals) and `retry-after-ms: <ms>` (retryable refusals), and the
    /// details `google.rpc.ErrorInfo` (reason: the code; domain
    /// `tollgate`; metadata: the body's `limit`, `retry_after_ms`,
    /// `field` and `latest_fence` when set), `google.rpc.RetryInfo`
    /// (retryable refusals) and `google.rpc.BadRequest` (invalid input,
    /// naming the field).
    pub fn to_status(&self) -> tonic::Status {
        let Row {
            grpc, retry, body, ..
        } = self.row();
        let mut metadata = MetadataMap::new();
        metadata.insert("x-tollgate-error", MetadataValue::from_static(body.error));
        if let Some(limit) = body.limit {
            metadata.insert("x-tollgate-limit", MetadataValue::from_static(limit));
        }
        let mut details = ErrorDetails::new();
        if let Retry::Limit(ms) | Retry::Backoff(ms) = retry {
            metadata.insert("retry-after-ms", MetadataValue::from(ms));
            details.set_retry_info(Some(Duration::from_millis(ms)));
        }
        let mut info = HashMap::new();
        if let Some(limit) = body.limit {
            info.insert("limit".to_owned(), limit.to_owned());
        }
        if let Some(ms) = body.retry_after_ms {
            info.insert("retry_after_ms".to_owned(), ms.to_string());
        }
        if let Some(fence) = body.latest_fence {
            info.insert("latest_fence".to_owned(), fence.to_string());
        }
        if let Some(field) = &body.field {
            info.insert("field".to_owned(), field.clone());
            details.add_bad_request_violation(field.clone(), body.message.clone());
        }
        details.set_error_info(body.error, ERROR_DOMAIN, info);
        tonic::Status::with_error_details_and_metadata(grpc, body.message, details, metadata)
    }
}

/// How often each kind of store fault is logged at most: an outage fails
/// every request, and one line per request would flood the log (and cost
/// the replica time when it can least afford it).
pub const FAULT_LOG_EVERY_MS: u64 = 1_000;

/// At most one log line per [`FAULT_LOG_EVERY_MS`] for one kind of fault;
/// the line carries how many were suppressed since the one before.
#[derive(Debug)]
pub struct LogLimiter {
    /// When the next line may be written (ms on [`log_now_ms`]'s clock).
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimiter {
    /// A limiter that lets the first line through.
    pub const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// At `now_ms`: `Some(n)` when a line is due (`n` lines were
    /// suppressed since the last one), `None` when this one is suppressed
    /// (and counted). One caller wins a due slot when several race.
    pub fn admit(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(FAULT_LOG_EVERY_MS),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

static UNAVAILABLE_LOG: LogLimiter = LogLimiter::new();
static FULL_LOG: LogLimiter = LogLimiter::new();
static INTERNAL_LOG: LogLimiter = LogLimiter::new();

/// The fault logs' clock: monotonic, so a wall-clock step back never
/// silences them.
fn log_now_ms() -> u64 {
    static CLOCK: OnceLock<MonotonicClock> = OnceLock::new();
    CLOCK.get_or_init(MonotonicClock::new).now_ms()
}

/// The `domain` of every `google.rpc.ErrorInfo` tollgate sends.
pub const ERROR_DOMAIN: &str = "tollgate";

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        e.to_status()
    }
}

/// `Retry-After` (whole seconds, rounded up).
fn retry_after(headers: &mut HeaderMap, retry_after_ms: u64) -> HeaderValue {
    let secs = retry_after_ms.div_ceil(1_000).max(1);
    let v = HeaderValue::from(secs);
    headers.insert("retry-after", v.clone());
    v
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let Row {
            http, retry, body, ..
        } = self.row();
        let mut headers = HeaderMap::new();
        match retry {
            Retry::No => {}
            Retry::Limit(ms) => {
                let v = retry_after(&mut headers, ms);
                headers.insert("ratelimit-remaining", HeaderValue::from(0u64));
                headers.insert("ratelimit-reset", v);
            }
            Retry::Backoff(ms) => {
                retry_after(&mut headers, ms);
            }
        }
        let mut resp = (http, headers, Json(body)).into_response();
        if self.is_fault() {
            resp.extensions_mut().insert(StoreFault);
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_logs_are_at_most_one_line_a_second_with_the_suppressed_count() {
        let log = LogLimiter::new();
        assert_eq!(log.admit(5_000), Some(0), "the first line is written");
        // 989 requests in the next second: none logged, all counted.
        for ms in 0..989 {
            assert_eq!(log.admit(5_000 + ms), None);
        }
        assert_eq!(log.admit(5_999), None);
        assert_eq!(
            log.admit(6_000),
            Some(990),
            "a second later: one line, with what it suppressed"
        );
        assert_eq!(log.admit(6_500), None);
        // A quiet spell: the next fault is logged at once, counting the one
        // suppressed before it.
        assert_eq!(log.admit(60_000), Some(1));
        assert_eq!(log.admit(60_001), None);
    }

    #[test]
    fn each_kind_of_fault_has_its_own_limit() {
        let (a, b) = (LogLimiter::new(), LogLimiter::new());
        assert_eq!(a.admit(1_000), Some(0));
        assert_eq!(b.admit(1_000), Some(0), "another kind is not silenced");
        assert_eq!(a.admit(1_001), None);
    }
}
