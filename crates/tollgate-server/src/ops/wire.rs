//! The sidecar's request and response bodies (SPEC §8), shared by HTTP and gRPC, and how their integer fields are read.

use super::*;

/// A JSON integer for a `u64` field. JSON Schema's `integer` (the
/// OpenAPI document's type of these fields) is any number with a zero
/// fraction, so `5.0` and `5e3` are 5 and 5,000, as a generated client may
/// send them; a fraction, a negative number or one past `u64::MAX` is
/// refused (400 naming the field).
fn integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    use serde::de::{Error, Unexpected, Visitor};

    struct NonNegativeInteger;

    impl Visitor<'_> for NonNegativeInteger {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a non-negative integer")
        }

        fn visit_u64<E: Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }

        fn visit_i64<E: Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }

        fn visit_f64<E: Error>(self, v: f64) -> Result<u64, E> {
            // 2^64, the first f64 past u64::MAX; below it an integral f64
            // converts exactly.
            const PAST_U64: f64 = 18_446_744_073_709_551_616.0;
            if v.fract() == 0.0 && (0.0..PAST_U64).contains(&v) {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Ok(v as u64)
            } else {
                Err(E::invalid_value(Unexpected::Float(v), &self))
            }
        }
    }

    d.deserialize_any(NonNegativeInteger)
}

/// [`integer`] for an optional field (`null` or absent: `None`).
fn optional_integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Integer(#[serde(deserialize_with = "integer")] u64);
    Ok(Option::<Integer>::deserialize(d)?.map(|Integer(v)| v))
}

// The request and answer types below are the JSON bodies of the HTTP API
// (their docs are its OpenAPI schemas, so they speak HTTP); the gRPC
// messages carry the same fields under the same names.

/// `POST /v1/runs`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AdmitRequest {
    /// The run (ADK invocation id); retrying with it is idempotent.
    #[schema(format = "id")]
    pub invocation_id: String,
    /// The conversation, to hold its session lease for the turn.
    #[serde(default)]
    #[schema(format = "id")]
    pub session_id: Option<String>,
    /// Session lease TTL, ms (default 30,000; at most 3,600,000).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 1, maximum = 3600000)]
    pub session_ttl_ms: Option<u64>,
}

/// A session lease.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionLeaseBody {
    /// The fencing number: session writes must carry it.
    pub fence: u64,
    /// Lease expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

impl From<SessionGrant> for SessionLeaseBody {
    fn from(g: SessionGrant) -> Self {
        Self {
            fence: g.fence,
            expires_at_ms: g.expires_at_ms,
        }
    }
}

/// The answer to `POST /v1/runs`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdmitResponse {
    /// Run lease expiry, ms since the Unix epoch; renew every ttl/3.
    pub lease_expires_at_ms: u64,
    /// The plan's `lease_ttl_ms`: the run lease's TTL, so a client renews
    /// every third of it.
    pub lease_ttl_ms: u64,
    /// The plan's `estimate_tokens`: what a model call of this user is
    /// estimated at before anything is known about it.
    pub estimate_tokens: u64,
    /// The plan's `max_wait_ms`: the longest wait a token reservation is
    /// granted with.
    pub max_wait_ms: u64,
    /// The plan's `max_llm_calls`: reservations one run may make.
    pub max_llm_calls: u64,
    /// The session lease, when a session was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionLeaseBody>,
}

/// `{released}`, with `pending: true` for a release accepted while the
/// shared store is unreachable.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleasedResponse {
    /// `false`: it held nothing (not an error), or the release is pending.
    pub released: bool,
    /// `true`: the shared store is unreachable; the release was accepted
    /// into this replica's journal and is applied when the store answers
    /// again (SPEC §6). Omitted when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// The answer to a run renewal.
#[derive(Debug, Serialize, ToSchema)]
pub struct RenewResponse {
    /// New run lease expiry, ms since the Unix epoch.
    pub lease_expires_at_ms: u64,
}

/// `POST /v1/tokens/reserve`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ReserveRequest {
    /// The run making the model call.
    #[schema(format = "id")]
    pub invocation_id: String,
    /// Estimated tokens of the call, at least 1.
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    pub estimate: u64,
    /// `true`: the server waits before answering (`wait_ms` is then 0).
    #[serde(default)]
    pub wait: bool,
    /// The client's id for this request, unique within the run: a retry
    /// with the same id (while the run's record is kept, 1 h) answers the
    /// first grant (the same `reservation_id`) instead of charging again.
    #[serde(default)]
    #[schema(format = "id")]
    pub request_id: Option<String>,
    /// The model called, as `"provider:model"` (the key of its `[prices]`
    /// entry): prices the call for the plan's cost budgets. Absent, or
    /// naming no `[prices]` entry: the plan's `default_price`.
    #[serde(default)]
    #[schema(format = "id")]
    pub model: Option<String>,
    /// Of the estimate, input tokens that are not read from the provider's
    /// prompt cache. With `output_tokens` and `cached_input_tokens` (each
    /// 0 when absent) it prices the call for the plan's cost budgets, each
    /// part at its own price; with none of the three, `estimate` is priced
    /// at the higher of the input and output prices. Token budgets and the
    /// token rate count `estimate`. At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub input_tokens: Option<u64>,
    /// Of the estimate, output tokens (see `input_tokens`). At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub output_tokens: Option<u64>,
    /// Of the estimate, input tokens read from the prompt cache (see
    /// `input_tokens`). At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub cached_input_tokens: Option<u64>,
}

/// The answer to a reservation.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReserveResponse {
    /// Names it for settle and refund.
    pub reservation_id: String,
    /// Wait this long before the model call, ms (0 when `wait` was true).
    pub wait_ms: u64,
}

/// `POST /v1/tokens/settle`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SettleRequest {
    /// The reservation.
    #[schema(format = "reservation-id")]
    pub reservation_id: String,
    /// Tokens the call really used.
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub actual: u64,
    /// Of the usage, input tokens that are not read from the provider's
    /// prompt cache. With `output_tokens` and `cached_input_tokens` (each
    /// 0 when absent) it prices the call for the plan's cost budgets, each
    /// part at its own price; with none of the three, `actual` is priced
    /// at the higher of the input and output prices. Token budgets and the
    /// token rate count `actual`. At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub input_tokens: Option<u64>,
    /// Of the usage, output tokens (see `input_tokens`). At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub output_tokens: Option<u64>,
    /// Of the usage, input tokens read from the prompt cache (see
    /// `input_tokens`). At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub cached_input_tokens: Option<u64>,
}

/// `POST /v1/tokens/refund`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct RefundRequest {
    /// The reservation.
    #[schema(format = "reservation-id")]
    pub reservation_id: String,
}

/// The answer to a settle or refund.
#[derive(Debug, Serialize, ToSchema)]
pub struct BalanceResponse {
    /// The user's tokens now (negative: debt). A repeat changes nothing.
    /// Omitted while `pending` (not known yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<i64>,
    /// `true`: the shared store is unreachable; the close was accepted
    /// into this replica's journal and is applied when the store answers
    /// again (SPEC §6). Omitted when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

impl From<tollgate_core::Settled> for BalanceResponse {
    fn from(s: tollgate_core::Settled) -> Self {
        Self {
            balance: (!s.pending).then_some(s.balance),
            pending: s.pending,
        }
    }
}

/// `POST /v1/sessions/{session_id}/lease` and `…/lease/renew`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SessionLeaseRequest {
    /// The holder's token (e.g. the invocation id).
    #[schema(format = "id")]
    pub holder: String,
    /// Lease TTL, ms (1 ..= 3,600,000).
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 3600000)]
    pub ttl_ms: u64,
}

/// `POST /v1/sessions/{session_id}/fence`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct FenceRequest {
    /// The fence the writer holds.
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 0, maximum = 18_446_744_073_709_551_615_u64)]
    pub fence: u64,
}

/// The answer to a fence check.
#[derive(Debug, Serialize, ToSchema)]
pub struct FenceResponse {
    /// Always `true` on 200 (a stale fence is a 409).
    pub current: bool,
}

/// `POST /v1/providers/{provider}/permits`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PermitBody {
    /// The model, e.g. `gpt-4o`: with the provider in the path, the
    /// provider key `[providers."<provider>:<model>"]` of the config.
    #[schema(format = "id")]
    pub model: String,
    /// The tenant whose share applies (`[providers.….tenants.<name>]`); an
    /// unconfigured tenant, or none, uses the pool alone.
    #[serde(default)]
    #[schema(format = "id")]
    pub tenant: Option<String>,
    /// Estimated tokens of the call, input and output (0 when unknown):
    /// charged to the key's `tokens` rate. At most 2^53.
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub tokens: u64,
    /// Estimated input tokens (default `tokens`): charged to
    /// `input_tokens`. At most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub input_tokens: Option<u64>,
    /// Estimated output tokens (default 0): charged to `output_tokens`. At
    /// most 2^53.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_992_u64)]
    pub output_tokens: Option<u64>,
    /// What is left of the call's one deadline, ms: the permit's wait must
    /// fit it as well as the key's `max_wait_ms` (policy `block`).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0, maximum = 18_446_744_073_709_551_615_u64)]
    pub max_wait_ms: Option<u64>,
    /// `true`: the server waits before answering (`wait_ms` is then 0).
    #[serde(default)]
    pub wait: bool,
}

/// The answer to a provider permit.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermitResponse {
    /// Wait this long before calling the provider, ms (0 when `wait` was
    /// true: the server already waited).
    pub wait_ms: u64,
    /// The provider key's effective rate (AIMD), permille of the configured
    /// rate.
    pub effective_permille: u32,
}

/// `POST /v1/providers/{provider}/feedback`: the provider's answer to a
/// call.
#[derive(Debug, Deserialize, ToSchema)]
pub struct FeedbackBody {
    /// The model called.
    #[schema(format = "id")]
    pub model: String,
    /// The provider's HTTP status (100 ..= 599).
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 100, maximum = 599)]
    pub status: u64,
    /// The provider's response headers, name → value (names in any case;
    /// `{}` when there are none). Rate-limit and `Retry-After` headers are
    /// read.
    pub headers: BTreeMap<String, String>,
    /// The provider's response body, if the client has it (error bodies are
    /// read for quota, billing and retry details).
    #[serde(default)]
    pub body: Option<String>,
}

/// What the provider's answer said and changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct FeedbackResponse {
    /// `success`, `throttled` (a per-minute 429), `exhausted` (per-day or
    /// billing: permits now fail with 403 `provider_exhausted`),
    /// `server_error` (retry with backoff) or `client_error` (do not retry).
    pub class: &'static str,
    /// Whether the same call may be retried (`throttled`, `server_error`).
    pub retryable: bool,
    /// The provider's retry hint, ms, if it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The provider key's cooldown end (ms, the server's clock), when this
    /// answer set or extended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate after this answer, permille, when it changed it
    /// (a 429).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_permille: Option<u32>,
    /// For `exhausted`: the cause and the provider's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A successful answer, and the limit that would have refused it had its
/// plan not been in shadow mode (HTTP: the `x-tollgate-shadow-denied`
/// header; gRPC: the same response metadata).
#[derive(Debug)]
pub struct Shadowed<T> {
    /// The answer.
    pub value: T,
    /// The limit shadow mode overrode, if any.
    pub shadow_denied: Option<Limit>,
}
