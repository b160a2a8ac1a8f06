//! # tollgate-outcome
//!
//! The one table from tollgate's refusals and errors to answers (SPEC §8):
//! for each [`ApiError`], the HTTP status, the stable error code, the
//! message, the body fields (`limit`, `retry_after_ms`, `field`,
//! `latest_fence`) and the retry headers. The sidecar (`tollgate serve`)
//! answers with it over HTTP and adds its gRPC column (code and
//! `google.rpc` details) keyed off the same rows; the `tollgate-tower`
//! layer answers with it directly, so a client sees the same refusal
//! whichever of them checked the limit.
//!
//! | `error` | HTTP | retry hint |
//! |---|---|---|
//! | `turn_rate`, `concurrency`, `token_rate`, `sessions` | 429 | yes |
//! | `provider_rate`, `provider_cooldown` | 429 | yes |
//! | `overloaded` (replica in-flight cap) | 429 | 1,000 ms, a backoff |
//! | `too_many_waits` (`wait=true` bounds, `[limits]`) | 429 | 1,000 ms, a backoff |
//! | `request_timeout` (body not read within `body_timeout_ms`) | 408 | no |
//! | `max_llm_calls` | 429 | no: the run must stop |
//! | `provider_exhausted` | 403 | no (`retry_after_ms`: how long it fails fast) |
//! | `exceeds_capacity` | 400 | no: never fits the configured limits |
//! | `session_busy` | 409 | yes (the holder's remaining TTL) |
//! | `stale_fence` | 409 | no: the writer must stop (`latest_fence`) |
//! | `lease_lost`, `not_holder`, `unknown_reservation`, `unknown_provider`, `not_found` | 404 | no |
//! | `invalid_request` | 400 (`field` names the field) | no |
//! | `unauthorized` | 401 | no |
//! | `forbidden` (the credential lacks a privilege) | 403 | no |
//! | `store_unavailable` (fail_closed) | 503 | no |
//! | `store_full` (the store at its size bound) | 503 | 1,000 ms, a backoff |
//! | `internal` | 500 | no |
//!
//! A retry hint is `retry_after_ms` in the body and `Retry-After` (whole
//! seconds, rounded up, at least 1); a limit's hint also carries
//! `RateLimit-Remaining: 0` and `RateLimit-Reset` ([`Retry::Limit`]), a
//! backoff does not ([`Retry::Backoff`]). [`ApiError::row`] is the table;
//! [`ApiError::http_response`] the whole HTTP answer. Store fault details
//! ([`ApiError::is_fault`]) never reach the client: the transports log them.

mod table;
#[cfg(test)]
mod tests;

use tollgate_core::{Denial, Limit, LimiterError, StoreError};

pub use table::{ErrorBody, Retry, Row};

/// Why a request did not succeed: each variant is a row of the table
/// ([`ApiError::row`]).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A limit refused.
    #[error("{0}")]
    Denied(Denial),
    /// A user's spend budget is spent (a [`Denial::Limited`] of a budget
    /// limit, with the instant its window ends).
    #[error("the {limit} is spent until {resets_at_ms}")]
    BudgetExhausted {
        /// `budget_daily`, `budget_weekly` or `budget_monthly`.
        limit: Limit,
        /// Until its window ends, ms.
        retry_after_ms: u64,
        /// When its window ends, ms since the Unix epoch.
        resets_at_ms: u64,
    },
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
    /// No such route, or an endpoint that is switched off.
    #[error("not found: {0}")]
    NotFound(String),
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
    TooManyWaits(TooManyWaits),
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

/// A `wait=true` request refused before anything was decided: its user,
/// or the replica, already has as many waiting as allowed (the sidecar's
/// wait gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TooManyWaits {
    /// The user has `max_waits_per_user` waiting.
    #[error("this user already has {0} wait=true requests waiting")]
    User(usize),
    /// The replica holds `max_waiting` waiting.
    #[error("this replica already holds {0} waiting requests")]
    Replica(usize),
}

impl ApiError {
    /// The refusal of a limit decided at `now_ms` (the clock the decision
    /// was made on): a spent budget carries the instant its window ends
    /// ([`ApiError::BudgetExhausted`]); any other is [`ApiError::Denied`].
    pub fn denied_at(d: Denial, now_ms: u64) -> Self {
        match d {
            Denial::Limited {
                limit: limit @ (Limit::BudgetDaily | Limit::BudgetWeekly | Limit::BudgetMonthly),
                retry_after_ms,
            } => ApiError::BudgetExhausted {
                limit,
                retry_after_ms,
                resets_at_ms: now_ms.saturating_add(retry_after_ms),
            },
            d => ApiError::Denied(d),
        }
    }

    /// An invalid-field error.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Whether this is a store fault (an outage, a full store, or a fault
    /// that is not one: a bug or misconfiguration), whose details are
    /// logged, never sent, and which the sidecar counts in
    /// `tollgate_store_errors_total`.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            ApiError::StoreUnavailable(_) | ApiError::StoreFull(_) | ApiError::Internal(_)
        )
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

/// The wire name of a provider refusal's limit: `provider_rate` (a
/// provider key's rate or tenant share) or `provider_cooldown`.
pub fn provider_limit_code(l: Limit) -> &'static str {
    match l {
        Limit::Cooldown => "provider_cooldown",
        _ => "provider_rate",
    }
}
