//! The sidecar's side of the outcome table (SPEC §8). The table itself,
//! each refusal's HTTP status, code, message, body and retry headers, is
//! `tollgate-outcome` ([`ApiError::row`]); this module answers it over
//! axum ([`HttpError`]) and adds the gRPC column: the status code of each
//! row, its metadata and `google.rpc` details ([`GrpcStatus`]). It also
//! logs store faults (at most one line a second per kind) and marks their
//! responses for the metrics layer ([`StoreFault`]). Handlers and gRPC
//! methods return [`ApiError`]; nothing else builds an error response.
//!
//! | `error` | gRPC |
//! |---|---|
//! | `turn_rate`, `concurrency`, `token_rate`, `sessions`, `max_llm_calls` | `RESOURCE_EXHAUSTED` |
//! | `provider_rate`, `provider_cooldown`, `provider_exhausted` | `RESOURCE_EXHAUSTED` |
//! | `overloaded`, `too_many_waits`, `store_full` | `RESOURCE_EXHAUSTED` |
//! | `request_timeout` | `DEADLINE_EXCEEDED` |
//! | `exceeds_capacity`, `stale_fence` | `FAILED_PRECONDITION` |
//! | `session_busy` | `ABORTED` |
//! | `lease_lost`, `not_holder`, `unknown_reservation`, `unknown_provider`, `not_found` | `NOT_FOUND` |
//! | `invalid_request` | `INVALID_ARGUMENT` (+ `BadRequest` naming the field) |
//! | `unauthorized` | `UNAUTHENTICATED` |
//! | `forbidden` | `PERMISSION_DENIED` |
//! | `store_unavailable` | `UNAVAILABLE` |
//! | `internal` | `INTERNAL` |
//!
//! A retry hint is, over gRPC, the `retry-after-ms` metadata and a
//! `google.rpc.RetryInfo` detail (see [`GrpcStatus::to_status`]).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use tollgate_core::{Clock, Denial, LimiterError, MonotonicClock, StoreError};
pub use tollgate_outcome::{ApiError, ErrorBody, Row, provider_limit_code};
use tollgate_provider::ProviderError;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic_types::{ErrorDetails, StatusExt};

/// The row of a provider governor error, `now_ms` being the governor's
/// clock (an exhaustion's hint is the time left until it ends).
pub fn from_provider(e: ProviderError, now_ms: u64) -> ApiError {
    match e {
        ProviderError::Unknown { provider, model } => ApiError::UnknownProvider { provider, model },
        ProviderError::Exhausted { reason, until_ms } => ApiError::ProviderExhausted {
            reason,
            retry_after_ms: until_ms.saturating_sub(now_ms).max(1),
        },
        ProviderError::Store(s) => s.into(),
        other => ApiError::Internal(other.to_string()),
    }
}

/// A response extension marking a store fault, so the metrics layer can
/// count it (details go to the logs, never to the client).
#[derive(Debug, Clone, Copy)]
pub struct StoreFault;

/// The gRPC column: the status code of each row.
fn grpc_code(e: &ApiError) -> tonic::Code {
    use tonic::Code as G;
    match e {
        ApiError::Denied(d) | ApiError::ProviderDenied(d) => match d {
            // Never fits the configured limits.
            Denial::ExceedsCapacity { .. } => G::FailedPrecondition,
            _ => G::ResourceExhausted,
        },
        // A quota is used up: RESOURCE_EXHAUSTED, not PERMISSION_DENIED,
        // which gRPC reserves for refusals that are not about an exhausted
        // resource.
        ApiError::ProviderExhausted { .. } | ApiError::BudgetExhausted { .. } => {
            G::ResourceExhausted
        }
        ApiError::UnknownProvider { .. }
        | ApiError::LeaseLost
        | ApiError::NotHolder
        | ApiError::UnknownReservation
        | ApiError::NotFound(_) => G::NotFound,
        // A conflict worth retrying once the holder is done.
        ApiError::SessionBusy { .. } => G::Aborted,
        // The writer must stop, not retry.
        ApiError::StaleFence { .. } => G::FailedPrecondition,
        ApiError::Invalid { .. } => G::InvalidArgument,
        ApiError::Unauthorized(_) => G::Unauthenticated,
        ApiError::Forbidden(_) => G::PermissionDenied,
        ApiError::StoreUnavailable(_) => G::Unavailable,
        // Not UNAVAILABLE: a client's retry policy retries UNAVAILABLE at
        // once, and Envoy-style callers treat it as the store being down,
        // while a full store needs its state to expire first.
        ApiError::StoreFull(_) => G::ResourceExhausted,
        ApiError::Overloaded | ApiError::TooManyWaits(_) => G::ResourceExhausted,
        ApiError::RequestTimeout { .. } => G::DeadlineExceeded,
        ApiError::Internal(_) => G::Internal,
    }
}

/// Logs a store fault's details (which never reach the client), at most
/// one line per [`FAULT_LOG_EVERY_MS`] for each kind.
fn log_fault(e: &ApiError) {
    match e {
        ApiError::StoreUnavailable(detail) => {
            if let Some(suppressed) = UNAVAILABLE_LOG.admit(log_now_ms()) {
                tracing::warn!(error = %detail, suppressed, "store unavailable");
            }
        }
        ApiError::StoreFull(detail) => {
            if let Some(suppressed) = FULL_LOG.admit(log_now_ms()) {
                tracing::warn!(error = %detail, suppressed, "store full");
            }
        }
        ApiError::Internal(detail) => {
            if let Some(suppressed) = INTERNAL_LOG.admit(log_now_ms()) {
                tracing::error!(error = %detail, suppressed, "internal error");
            }
        }
        _ => {}
    }
}

/// The gRPC answer of an [`ApiError`].
pub trait GrpcStatus {
    /// The gRPC status of this outcome (the same row as the HTTP
    /// response): its code, the body's message, metadata
    /// `x-tollgate-error: <code>`, `x-tollgate-limit: <limit>` (limit
    /// refusals) and `retry-after-ms: <ms>` (retryable refusals), and the
    /// details `google.rpc.ErrorInfo` (reason: the code; domain
    /// `tollgate`; metadata: the body's `limit`, `retry_after_ms`,
    /// `field` and `latest_fence` when set), `google.rpc.RetryInfo`
    /// (retryable refusals) and `google.rpc.BadRequest` (invalid input,
    /// naming the field).
    fn to_status(&self) -> tonic::Status;
}

impl GrpcStatus for ApiError {
    fn to_status(&self) -> tonic::Status {
        log_fault(self);
        let Row { retry, body, .. } = self.row();
        let mut metadata = MetadataMap::new();
        metadata.insert("x-tollgate-error", MetadataValue::from_static(body.error));
        if let Some(limit) = body.limit {
            metadata.insert("x-tollgate-limit", MetadataValue::from_static(limit));
        }
        let mut details = ErrorDetails::new();
        if let Some(ms) = retry.after_ms() {
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
        if let Some(ms) = body.resets_at_ms {
            info.insert("resets_at_ms".to_owned(), ms.to_string());
        }
        if let Some(fence) = body.latest_fence {
            info.insert("latest_fence".to_owned(), fence.to_string());
        }
        if let Some(field) = &body.field {
            info.insert("field".to_owned(), field.clone());
            details.add_bad_request_violation(field.clone(), body.message.clone());
        }
        details.set_error_info(body.error, ERROR_DOMAIN, info);
        tonic::Status::with_error_details_and_metadata(
            grpc_code(self),
            body.message,
            details,
            metadata,
        )
    }
}

/// An [`ApiError`] answered over HTTP: the table's row as an axum
/// response, marked with [`StoreFault`] for a store fault. Handlers return
/// it; `?` converts an [`ApiError`].
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<StoreError> for HttpError {
    fn from(e: StoreError) -> Self {
        Self(e.into())
    }
}

impl From<LimiterError> for HttpError {
    fn from(e: LimiterError) -> Self {
        Self(e.into())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        log_fault(&self.0);
        let mut resp = self.0.http_response().map(axum::body::Body::from);
        if self.0.is_fault() {
            resp.extensions_mut().insert(StoreFault);
        }
        resp
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

    /// The gRPC column of a spent budget: RESOURCE_EXHAUSTED with RetryInfo
    /// to the window's end and the reset instant in ErrorInfo.
    #[test]
    fn a_spent_budget_is_resource_exhausted_with_its_reset() {
        let d = Denial::Limited {
            limit: tollgate_core::Limit::BudgetDaily,
            retry_after_ms: 54_000_000,
        };
        let st = ApiError::denied_at(d, 1_804_064_400_000).to_status();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        let md = |k: &str| {
            st.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(md("x-tollgate-error").as_deref(), Some("budget_exhausted"));
        assert_eq!(md("x-tollgate-limit").as_deref(), Some("budget_daily"));
        assert_eq!(md("retry-after-ms").as_deref(), Some("54000000"));
        let details = st.get_error_details();
        let info = details.error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "budget_exhausted");
        assert_eq!(info.metadata["resets_at_ms"], "1804118400000");
        assert_eq!(
            details.retry_info().and_then(|r| r.retry_delay),
            Some(Duration::from_secs(54_000))
        );
    }
}
