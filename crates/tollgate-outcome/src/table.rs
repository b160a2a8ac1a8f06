//! The rows: [`ApiError::row`] and the HTTP answer built from a row.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::Serialize;
use tollgate_core::gate::OVERLOADED_RETRY_MS;
use tollgate_core::{Denial, Limit};

use crate::{ApiError, TooManyWaits, provider_limit_code};

/// The body of every refusal (SPEC §8), serialized in this field order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// A stable code: `turn_rate`, `concurrency`, `token_rate`,
    /// `max_llm_calls`, `budget_exhausted`, `exceeds_capacity`,
    /// `session_busy`, `lease_lost`,
    /// `not_holder`, `stale_fence`, `unknown_reservation`, `provider_rate`,
    /// `provider_cooldown`, `provider_exhausted`, `unknown_provider`,
    /// `sessions`, `invalid_request`, `unauthorized`, `forbidden`,
    /// `store_unavailable`, `store_full`, `overloaded`, `too_many_waits`,
    /// `request_timeout`, `not_found`, `internal`.
    pub error: &'static str,
    /// The limit that refused, for limit errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<&'static str>,
    /// When to retry, ms (retryable refusals). For `provider_exhausted`,
    /// which is not retryable: how long this replica keeps failing fast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `budget_exhausted`: when the spent budget's window ends and it
    /// is whole again, ms since the Unix epoch on the server's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
    /// The offending field, for `invalid_request`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The latest fence, for `stale_fence`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest_fence: Option<u64>,
    /// A sentence for people.
    pub message: String,
}

/// How a refusal may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Not as it is (or not before something changes).
    No,
    /// A retryable limit, after this many ms: `Retry-After` and
    /// `RateLimit-Remaining` / `RateLimit-Reset`.
    Limit(u64),
    /// Retryable after this many ms, but not a limit on the client (the
    /// replica at its cap, a full store): `Retry-After` only.
    Backoff(u64),
}

impl Retry {
    /// The hint, ms, if the refusal is retryable.
    pub fn after_ms(self) -> Option<u64> {
        match self {
            Retry::No => None,
            Retry::Limit(ms) | Retry::Backoff(ms) => Some(ms),
        }
    }
}

/// One row of the table: what a refusal is over HTTP. The sidecar's gRPC
/// column reads the same row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The HTTP status.
    pub status: StatusCode,
    /// The retry hint (headers; gRPC `RetryInfo`).
    pub retry: Retry,
    /// The JSON body.
    pub body: ErrorBody,
}

fn body(error: &'static str, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        error,
        limit: None,
        retry_after_ms: None,
        resets_at_ms: None,
        field: None,
        latest_fence: None,
        message: message.into(),
    }
}

impl Row {
    fn new(status: StatusCode, body: ErrorBody) -> Self {
        Self {
            status,
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

    /// Retryable, but not a limit on the client: the hint goes in the body
    /// and `Retry-After`.
    fn backoff(mut self, retry_after_ms: u64) -> Self {
        self.body.retry_after_ms = Some(retry_after_ms);
        self.retry = Retry::Backoff(retry_after_ms);
        self
    }

    /// The retry headers: `Retry-After` (whole seconds, rounded up, at
    /// least 1), and for a limit `RateLimit-Remaining: 0` and
    /// `RateLimit-Reset` (the same seconds).
    pub fn headers(&self) -> HeaderMap {
        const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
        const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
        let mut headers = HeaderMap::new();
        if let Some(ms) = self.retry.after_ms() {
            let secs = HeaderValue::from(ms.div_ceil(1_000).max(1));
            headers.insert(RETRY_AFTER, secs.clone());
            if let Retry::Limit(_) = self.retry {
                headers.insert(RATELIMIT_REMAINING, HeaderValue::from(0u64));
                headers.insert(RATELIMIT_RESET, secs);
            }
        }
        headers
    }

    /// The whole HTTP answer: status, retry headers, `Content-Type:
    /// application/json` and the JSON body.
    pub fn into_response(self) -> Response<Vec<u8>> {
        let mut headers = self.headers();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // An `ErrorBody` is strings and integers: serializing cannot fail.
        let json = serde_json::to_vec(&self.body)
            .unwrap_or_else(|_| br#"{"error":"internal","message":"internal error"}"#.to_vec());
        let mut res = Response::new(json);
        *res.status_mut() = self.status;
        *res.headers_mut() = headers;
        res
    }
}

fn secs(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

impl ApiError {
    /// The HTTP answer of this outcome ([`Row::into_response`] of its
    /// [`row`](ApiError::row)).
    pub fn http_response(&self) -> Response<Vec<u8>> {
        self.row().into_response()
    }

    /// The table (SPEC §8): HTTP status, retry hint and body of every
    /// outcome. Store fault details stay out of it.
    pub fn row(&self) -> Row {
        use StatusCode as H;
        match self {
            ApiError::Denied(d) => denied(*d),
            ApiError::BudgetExhausted {
                limit,
                retry_after_ms,
                resets_at_ms,
            } => {
                let mut row = budget_row(*limit, *retry_after_ms);
                row.body.resets_at_ms = Some(*resets_at_ms);
                row
            }
            ApiError::ProviderDenied(d) => provider_denied(*d),
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
                Row::new(H::FORBIDDEN, b)
            }
            ApiError::UnknownProvider { provider, model } => Row::new(
                H::NOT_FOUND,
                body(
                    "unknown_provider",
                    format!("no limits are configured for provider {provider:?} model {model:?}"),
                ),
            ),
            // A conflict worth retrying once the holder is done, with the
            // holder's remaining TTL as the hint.
            ApiError::SessionBusy { retry_after_ms } => Row::new(
                H::CONFLICT,
                body("session_busy", "a turn is already running in this session"),
            )
            .limited(*retry_after_ms),
            ApiError::LeaseLost => Row::new(
                H::NOT_FOUND,
                body("lease_lost", "the run lease is gone (expired or released)"),
            ),
            ApiError::NotHolder => Row::new(
                H::NOT_FOUND,
                body("not_holder", "this holder does not hold the session lease"),
            ),
            // The writer must stop, not retry.
            ApiError::StaleFence { latest } => {
                let mut b = body(
                    "stale_fence",
                    "another turn has taken this session over; stop writing",
                );
                b.latest_fence = Some(*latest);
                Row::new(H::CONFLICT, b)
            }
            ApiError::UnknownReservation => Row::new(
                H::NOT_FOUND,
                body("unknown_reservation", "no such reservation for this user"),
            ),
            ApiError::NotFound(m) => Row::new(H::NOT_FOUND, body("not_found", m.clone())),
            ApiError::Invalid { field, message } => {
                let mut b = body("invalid_request", message.clone());
                b.field = Some(field.clone());
                Row::new(H::BAD_REQUEST, b)
            }
            ApiError::Unauthorized(m) => Row::new(H::UNAUTHORIZED, body("unauthorized", m.clone())),
            ApiError::Forbidden(m) => Row::new(H::FORBIDDEN, body("forbidden", m.clone())),
            ApiError::StoreUnavailable(_) => Row::new(
                H::SERVICE_UNAVAILABLE,
                body(
                    "store_unavailable",
                    "the limit store is unreachable; retry shortly",
                ),
            ),
            // Retryable, but not an outage: the store answered, and a full
            // store needs its state to expire first. The hint is a backoff,
            // not a limit of the client's.
            ApiError::StoreFull(_) => Row::new(
                H::SERVICE_UNAVAILABLE,
                body(
                    "store_full",
                    "the limit store is full; existing runs and sessions still work, retry new ones shortly",
                ),
            )
            .backoff(OVERLOADED_RETRY_MS),
            ApiError::Overloaded => Row::new(
                H::TOO_MANY_REQUESTS,
                body(
                    "overloaded",
                    "this replica is at its in-flight cap; retry in 1 s",
                ),
            )
            .backoff(OVERLOADED_RETRY_MS),
            // Retryable, but not a limit on the client: the bound frees as
            // the waiting requests end. wait=false needs no place.
            ApiError::TooManyWaits(which) => {
                let who = match which {
                    TooManyWaits::User(_) => "",
                    TooManyWaits::Replica(_) => " (all users)",
                };
                Row::new(
                    H::TOO_MANY_REQUESTS,
                    body(
                        "too_many_waits",
                        format!(
                            "{which}{who}: retry in 1 s, or send wait=false and wait out wait_ms yourself"
                        ),
                    ),
                )
                .backoff(OVERLOADED_RETRY_MS)
            }
            ApiError::RequestTimeout { timeout_ms } => Row::new(
                H::REQUEST_TIMEOUT,
                body(
                    "request_timeout",
                    format!("the request body did not arrive within {timeout_ms} ms"),
                ),
            ),
            ApiError::Internal(_) => Row::new(
                H::INTERNAL_SERVER_ERROR,
                body("internal", "internal error"),
            ),
        }
    }
}

/// The rows of a user's limits.
fn denied(d: Denial) -> Row {
    use StatusCode as H;
    match d {
        Denial::Limited {
            limit,
            retry_after_ms,
        } if budget_period(limit).is_some() => budget_row(limit, retry_after_ms),
        Denial::Limited {
            limit,
            retry_after_ms,
        } => {
            let s = secs(retry_after_ms);
            let msg = match limit {
                Limit::TurnRate => format!("too many turns: retry in {s} s"),
                Limit::Concurrency => {
                    format!("too many runs at once: finish one or retry in {s} s")
                }
                Limit::TokenRate => format!("token rate exceeded: retry in {s} s"),
                Limit::Sessions => {
                    format!("too many live sessions: reuse one, or retry a new one in {s} s")
                }
                _ => d.to_string(),
            };
            let mut b = body(limit.as_str(), msg);
            b.limit = Some(limit.as_str());
            Row::new(H::TOO_MANY_REQUESTS, b).limited(retry_after_ms)
        }
        Denial::ExceedsCapacity {
            limit,
            cost,
            max_cost,
        } => {
            let message = match budget_period(limit) {
                Some(period) => format!(
                    "this call's charge of {cost} can never fit the {period} budget of \
                     {max_cost} (tokens, or micro-units of the currency for a cost budget)"
                ),
                None => {
                    format!("an estimate of {cost} tokens can never be granted: at most {max_cost}")
                }
            };
            let mut b = body("exceeds_capacity", message);
            b.limit = Some(limit.as_str());
            Row::new(H::BAD_REQUEST, b)
        }
        // Not retryable: the run must stop.
        Denial::CapReached { limit, cap } => {
            let mut b = body(
                limit.as_str(),
                format!("this run reached its cap of {cap} model calls; it must stop"),
            );
            b.limit = Some(limit.as_str());
            Row::new(H::TOO_MANY_REQUESTS, b)
        }
        _ => Row::new(H::TOO_MANY_REQUESTS, body("limited", d.to_string())),
    }
}

/// `daily`, `weekly` or `monthly` for a budget limit.
fn budget_period(limit: Limit) -> Option<&'static str> {
    match limit {
        Limit::BudgetDaily => Some("daily"),
        Limit::BudgetWeekly => Some("weekly"),
        Limit::BudgetMonthly => Some("monthly"),
        _ => None,
    }
}

/// A duration for people: `45 s`, `12 min`, `15 h 30 min`, `3 days 2 h`.
fn human(ms: u64) -> String {
    let s = ms.div_ceil(1_000);
    let (d, h, m) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s} s"),
        (0, 0, m) => format!("{} min", m + u64::from(!s.is_multiple_of(60))),
        (0, h, 0) => format!("{h} h"),
        (0, h, m) => format!("{h} h {m} min"),
        (1, 0, _) => "1 day".to_owned(),
        (1, h, _) => format!("1 day {h} h"),
        (d, 0, _) => format!("{d} days"),
        (d, h, _) => format!("{d} days {h} h"),
    }
}

/// A spent budget: 429 `budget_exhausted`, retryable when its window ends.
fn budget_row(limit: Limit, retry_after_ms: u64) -> Row {
    let period = budget_period(limit).unwrap_or("spend");
    let mut b = body(
        "budget_exhausted",
        format!(
            "your {period} budget is spent: model calls are refused until it resets in {}",
            human(retry_after_ms)
        ),
    );
    b.limit = Some(limit.as_str());
    Row::new(StatusCode::TOO_MANY_REQUESTS, b).limited(retry_after_ms)
}

/// The rows of a provider key's limits.
fn provider_denied(d: Denial) -> Row {
    use StatusCode as H;
    match d {
        Denial::Limited {
            limit,
            retry_after_ms,
        } => {
            let code = provider_limit_code(limit);
            let s = secs(retry_after_ms);
            let msg = match limit {
                Limit::Cooldown => {
                    format!("the provider is cooling down after a 429: retry in {s} s")
                }
                _ => format!("provider rate exceeded: retry in {s} s"),
            };
            let mut b = body(code, msg);
            b.limit = Some(code);
            Row::new(H::TOO_MANY_REQUESTS, b).limited(retry_after_ms)
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
            Row::new(H::BAD_REQUEST, b)
        }
        _ => Row::new(H::TOO_MANY_REQUESTS, body("provider_rate", d.to_string())),
    }
}
