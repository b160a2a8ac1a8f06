//! Classification of one provider answer into [`Feedback`] (SPEC §5).
//!
//! Everything here is pure: no clock (the time comes in as `now_ms`), no
//! I/O. Error bodies up to 256 KiB are read with serde_json (whose recursion
//! limit keeps a hostile body from exhausting the stack); larger ones are
//! not parsed and the status rules apply.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest body read as JSON, in bytes. Provider error bodies are a few
/// hundred bytes; anything larger is not parsed and the status rules apply.
const MAX_BODY_BYTES: usize = 256 * 1024;

/// The most characters of the provider's message kept in an
/// [`Feedback::Exhausted`] reason.
const MAX_REASON_CHARS: usize = 200;

const NS_PER_MS: u128 = 1_000_000;
const NS_PER_S: u128 = 1_000_000_000;

// ---------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------

/// Which provider's conventions to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ProviderKind {
    /// OpenAI: `x-ratelimit-*` headers with Go-style durations, error bodies
    /// `{"error": {"type", "code", "message"}}`.
    OpenAi,
    /// Anthropic: `anthropic-ratelimit-*` headers with RFC 3339 resets,
    /// error bodies `{"type": "error", "error": {"type", "message"}}`, 529
    /// when overloaded.
    Anthropic,
    /// Google Gemini (Google AI and Vertex AI): `google.rpc.Status` error
    /// bodies with `QuotaFailure` and `RetryInfo` details.
    Gemini,
    /// Any other provider: the status and `Retry-After` only (plus the
    /// OpenAI-style `x-ratelimit-*` headers on success, which many
    /// OpenAI-compatible APIs send).
    Generic,
}

impl ProviderKind {
    /// Every kind, in a stable order.
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::OpenAi,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
        ProviderKind::Generic,
    ];

    /// The stable lowercase name: `openai`, `anthropic`, `gemini`, `generic`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Generic => "generic",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProviderKind {
    type Err = UnknownProviderKind;

    /// Parses the name given by [`ProviderKind::as_str`], ignoring ASCII case
    /// and surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        ProviderKind::ALL
            .into_iter()
            .find(|kind| kind.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownProviderKind { name: s.to_owned() })
    }
}

/// A provider kind name that is not one of [`ProviderKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider kind {name:?} (expected openai, anthropic, gemini or generic)")]
pub struct UnknownProviderKind {
    name: String,
}

impl UnknownProviderKind {
    /// The name that was given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Which rate a [`Feedback::Throttled`] answer ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ThrottleScope {
    /// Requests per minute.
    Requests,
    /// Tokens per minute (input and output together, or the provider does
    /// not say which).
    Tokens,
    /// Input (prompt) tokens per minute.
    InputTokens,
    /// Output (completion) tokens per minute.
    OutputTokens,
    /// The answer does not say.
    Unknown,
}

impl ThrottleScope {
    /// The stable snake_case name: `requests`, `tokens`, `input_tokens`,
    /// `output_tokens`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ThrottleScope::Requests => "requests",
            ThrottleScope::Tokens => "tokens",
            ThrottleScope::InputTokens => "input_tokens",
            ThrottleScope::OutputTokens => "output_tokens",
            ThrottleScope::Unknown => "unknown",
        }
    }

    /// Whether this is a token rate (total, input or output).
    pub fn is_tokens(self) -> bool {
        matches!(
            self,
            ThrottleScope::Tokens | ThrottleScope::InputTokens | ThrottleScope::OutputTokens
        )
    }
}

impl fmt::Display for ThrottleScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rate window as the provider's headers described it. Every field is
/// `None` when its header is absent or malformed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitWindow {
    /// The window's limit (requests or tokens).
    pub limit: Option<u64>,
    /// What is left of it.
    pub remaining: Option<u64>,
    /// When the window is back to full, in ms from `now_ms` (0 when the
    /// provider's reset time is already past).
    pub reset_after_ms: Option<u64>,
}

impl RateLimitWindow {
    /// No header described this window.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset_after_ms.is_none()
    }

    /// The provider said nothing is left (`remaining == 0`).
    pub fn is_exhausted(&self) -> bool {
        self.remaining == Some(0)
    }
}

/// What a provider's rate-limit headers said, per rate.
///
/// OpenAI (and [`ProviderKind::Generic`]) fill `requests` and `tokens` from
/// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`; Anthropic fills
/// all four from `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`;
/// Gemini sends no such headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitHeaders {
    /// Requests per minute.
    pub requests: RateLimitWindow,
    /// Tokens per minute (OpenAI: all tokens; Anthropic: the most
    /// restrictive token limit).
    pub tokens: RateLimitWindow,
    /// Input tokens per minute (Anthropic).
    pub input_tokens: RateLimitWindow,
    /// Output tokens per minute (Anthropic).
    pub output_tokens: RateLimitWindow,
}

impl RateLimitHeaders {
    /// No rate-limit header was understood.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
            && self.tokens.is_empty()
            && self.input_tokens.is_empty()
            && self.output_tokens.is_empty()
    }

    /// The window of one scope (`None` for [`ThrottleScope::Unknown`]).
    pub fn window(&self, scope: ThrottleScope) -> Option<&RateLimitWindow> {
        match scope {
            ThrottleScope::Requests => Some(&self.requests),
            ThrottleScope::Tokens => Some(&self.tokens),
            ThrottleScope::InputTokens => Some(&self.input_tokens),
            ThrottleScope::OutputTokens => Some(&self.output_tokens),
            ThrottleScope::Unknown => None,
        }
    }

    /// The exhausted window (`remaining == 0`) that resets last, as a scope;
    /// on a tie the more specific one (input, output, requests, then
    /// tokens); [`ThrottleScope::Unknown`] if none is exhausted.
    fn exhausted_scope(&self) -> ThrottleScope {
        let mut best: Option<(ThrottleScope, u64)> = None;
        for scope in [
            ThrottleScope::InputTokens,
            ThrottleScope::OutputTokens,
            ThrottleScope::Requests,
            ThrottleScope::Tokens,
        ] {
            let Some(w) = self.window(scope) else {
                continue;
            };
            if !w.is_exhausted() {
                continue;
            }
            let reset = w.reset_after_ms.unwrap_or(0);
            if best.is_none_or(|(_, r)| reset > r) {
                best = Some((scope, reset));
            }
        }
        best.map_or(ThrottleScope::Unknown, |(scope, _)| scope)
    }
}

/// What a provider's answer says about the quota.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feedback {
    /// The call went through (2xx).
    Success {
        /// What the rate-limit headers said (remaining, limit and reset for
        /// requests and tokens), where present.
        limits: RateLimitHeaders,
    },
    /// A per-minute throttle (a 429 that will pass): back off, and cool the
    /// provider key down for the hint.
    Throttled {
        /// The provider's hint, ms from `now_ms`, if it gave one.
        retry_after_ms: Option<u64>,
        /// Which rate ran out.
        scope: ThrottleScope,
    },
    /// The quota is exhausted for longer than a minute (a per-day quota,
    /// billing, credits, a spend cap): fail fast with `provider_exhausted`,
    /// do not retry.
    Exhausted {
        /// A stable snake_case cause (`insufficient_quota`, `per_day_limit`,
        /// `billing_error`, …), then `": "` and the provider's own message
        /// (cut to 200 characters) when it gave one.
        reason: String,
        /// The provider's hint, ms from `now_ms`, if its `retry-after-ms`
        /// or `Retry-After` header gave one (only those headers: see
        /// [`classify`]).
        retry_after_ms: Option<u64>,
    },
    /// The provider failed or is overloaded (5xx, 408, Anthropic 529):
    /// retry with backoff.
    ServerError {
        /// The provider's hint, ms from `now_ms`, if it gave one.
        retry_after_ms: Option<u64>,
    },
    /// Another client error (a 4xx other than the above, or a status that is
    /// neither success nor error): not a quota matter, do not retry.
    ClientError,
}

impl Feedback {
    /// The stable snake_case name for metrics and the wire: `success`,
    /// `throttled`, `exhausted`, `server_error`, `client_error`.
    pub fn class(&self) -> &'static str {
        match self {
            Feedback::Success { .. } => "success",
            Feedback::Throttled { .. } => "throttled",
            Feedback::Exhausted { .. } => "exhausted",
            Feedback::ServerError { .. } => "server_error",
            Feedback::ClientError => "client_error",
        }
    }

    /// The provider's retry hint, ms from `now_ms` (throttled answers,
    /// server errors and exhaustions).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Feedback::Throttled { retry_after_ms, .. }
            | Feedback::Exhausted { retry_after_ms, .. }
            | Feedback::ServerError { retry_after_ms } => *retry_after_ms,
            _ => None,
        }
    }

    /// The same answer with its retry hint cut to at most `max_ms` (the
    /// governor's clamp: no hint from outside is taken unbounded).
    pub fn with_hint_at_most(mut self, max_ms: u64) -> Self {
        match &mut self {
            Feedback::Throttled { retry_after_ms, .. }
            | Feedback::Exhausted { retry_after_ms, .. }
            | Feedback::ServerError { retry_after_ms } => {
                if let Some(h) = retry_after_ms {
                    *h = (*h).min(max_ms);
                }
            }
            Feedback::Success { .. } | Feedback::ClientError => {}
        }
        self
    }

    /// Whether the same call may be retried later (throttled and server
    /// errors).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Feedback::Throttled { .. } | Feedback::ServerError { .. }
        )
    }

    /// The rate-limit headers of a success.
    pub fn limits(&self) -> Option<&RateLimitHeaders> {
        match self {
            Feedback::Success { limits } => Some(limits),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------

/// Classifies one provider answer.
///
/// `headers` are (name, value) pairs, names in any case (the first of
/// repeated names counts); `body` is the response body if the caller has it;
/// `now_ms` is the caller's clock (Unix ms), against which HTTP-dates and
/// RFC 3339 reset times are made relative. A retry hint is always ms from
/// `now_ms`, rounded up, and 0 for a time already past.
///
/// # Rules for every kind
///
/// - 2xx: [`Feedback::Success`] with [`parse_rate_limit_headers`].
/// - 429: [`Feedback::Throttled`], hint from `retry-after-ms` (ms), else
///   `Retry-After` ([`parse_retry_after`]), scope unknown.
/// - 402 Payment Required: [`Feedback::Exhausted`] (`payment_required`).
/// - 408, 5xx (including 529): [`Feedback::ServerError`], hint as for 429.
/// - Any other status: [`Feedback::ClientError`].
///
/// An [`Feedback::Exhausted`] answer's hint is read from the
/// `retry-after-ms` and `Retry-After` headers only: the other hints
/// providers put in such answers (OpenAI's "Please try again in 8.64s" of a
/// per-day limit, Gemini's `RetryInfo` beside a per-day `QuotaFailure`)
/// speak of when one more call would fit the window, not of when the quota
/// is back, so they are not read. Without a hint the governor holds the
/// exhaustion for [`EXHAUSTED_HOLD_MS`](super::EXHAUSTED_HOLD_MS).
///
/// The provider rules below come first; the body is read only for non-2xx
/// answers, only if it is at most 256 KiB and JSON in the provider's shape
/// (a Vertex-style array `[{"error": …}]` is read as its first element).
///
/// # OpenAI
///
/// - Any 4xx whose `error.type` or `error.code` speaks of quota, billing,
///   credit, a spend limit or a usage limit (`insufficient_quota`,
///   `credit_balance_exhausted`, `organization_spend_limit_exceeded`,
///   `project_spend_limit_exceeded`, `organization_usage_limit_exceeded`,
///   `billing_hard_limit_reached`, `billing_not_active`): Exhausted, the
///   cause being the code (else the type).
/// - 429 whose message says "per day" (RPD, TPD): Exhausted
///   (`per_day_limit`), even though OpenAI's message may suggest a retry in
///   minutes: the window is a day.
/// - Other 429: Throttled. Scope from `error.type` (`requests`, `tokens`),
///   else the message ("requests per min (RPM)", "tokens per min (TPM)"),
///   else the `x-ratelimit-remaining-*` header that is 0. Hint from
///   `retry-after-ms`/`retry-after`, else `x-ratelimit-reset-requests` or
///   `-tokens` for the scope (the larger of the two when the scope is
///   unknown), else the message's "Please try again in 1.5s".
///
/// # Anthropic
///
/// - `error.type == "billing_error"` (documented as 402), any status:
///   Exhausted (`billing_error`).
/// - A 4xx with `error.details.error_code` naming a spend limit
///   (`enforced_spend_limit_reached`, a 429 without `retry-after`):
///   Exhausted, the cause being that code.
/// - A 4xx other than 429 whose message speaks of the credit balance ("Your
///   credit balance is too low…") or of usage or spend limits ("You have
///   reached your specified API usage limits…"): Exhausted (`credit_balance`
///   or `spend_limit`). Chosen over [`Feedback::ClientError`] because no
///   call on that key can pass until someone acts, so the whole provider key
///   must fail fast, not just this call.
/// - Other 429 (`rate_limit_error`, acceleration limits included):
///   Throttled. Scope: the `anthropic-ratelimit-*-remaining` header that is
///   0 (if several, the one that resets last), else the message ("input
///   tokens per minute", …), else unknown. Hint: `retry-after-ms`/
///   `retry-after`, else that window's reset − `now_ms`.
/// - `overloaded_error` or `api_error` (529, 500): ServerError.
///
/// # Gemini
///
/// - 429 (or `status: "RESOURCE_EXHAUSTED"` on a 4xx) with `QuotaFailure`
///   violations: Exhausted if a violation is per day (`quotaId` containing
///   `PerDay`, or `quotaMetric` containing `per_day`; `per_day_quota`) or
///   has `quotaValue` "0" (the model has no quota in this tier; retries
///   cannot pass: `zero_quota`). Otherwise Throttled with scope input,
///   output or all tokens if any violation's id or metric speaks of tokens,
///   else requests.
/// - 429 without violations: Throttled, scope unknown, unless the message
///   names a per-day quota ("Quota exceeded for
///   aiplatform.googleapis.com/generate_content_requests_per_day…"):
///   Exhausted (`per_day_quota`). Talk of "quota", "plan" and "billing"
///   ("You exceeded your current quota, please check your plan and billing
///   details") is not read: Gemini says it for per-minute throttles too.
/// - Hint, for 429 and 5xx: `RetryInfo.retryDelay` (`"37s"`, `"1.5s"`, or
///   `{"seconds", "nanos"}`), else the `Retry-After` headers.
/// - 5xx (`UNAVAILABLE`, `INTERNAL`, `DEADLINE_EXCEEDED`): ServerError.
///
/// # Generic
///
/// The rules for every kind; the body is not read.
pub fn classify(
    kind: ProviderKind,
    status: u16,
    headers: &[(&str, &str)],
    body: Option<&str>,
    now_ms: u64,
) -> Feedback {
    let h = Headers(headers);
    if (200..300).contains(&status) {
        return Feedback::Success {
            limits: parse_rate_limit_headers(kind, headers, now_ms),
        };
    }
    let json = match kind {
        ProviderKind::Generic => None,
        _ => body
            .filter(|b| b.len() <= MAX_BODY_BYTES)
            .and_then(|b| serde_json::from_str::<Value>(b).ok()),
    };
    let json = json.as_ref();
    let specific = match kind {
        ProviderKind::OpenAi => openai(status, h, json, now_ms),
        ProviderKind::Anthropic => anthropic(status, h, json, now_ms),
        ProviderKind::Gemini => gemini(status, h, json, now_ms),
        ProviderKind::Generic => None,
    };
    specific.unwrap_or_else(|| by_status(status, h, now_ms))
}

/// The rate-limit headers of an answer (any status), per the provider's
/// conventions; see [`RateLimitHeaders`]. Malformed values are `None`.
/// OpenAI resets are Go-style durations (`"1s"`, `"6m0s"`, `"20ms"`);
/// Anthropic resets are RFC 3339 times, made relative to `now_ms`.
pub fn parse_rate_limit_headers(
    kind: ProviderKind,
    headers: &[(&str, &str)],
    now_ms: u64,
) -> RateLimitHeaders {
    let h = Headers(headers);
    match kind {
        ProviderKind::OpenAi | ProviderKind::Generic => RateLimitHeaders {
            requests: openai_window(h, &OPENAI_REQUESTS),
            tokens: openai_window(h, &OPENAI_TOKENS),
            ..RateLimitHeaders::default()
        },
        ProviderKind::Anthropic => RateLimitHeaders {
            requests: anthropic_window(h, &ANTHROPIC_REQUESTS, now_ms),
            tokens: anthropic_window(h, &ANTHROPIC_TOKENS, now_ms),
            input_tokens: anthropic_window(h, &ANTHROPIC_INPUT_TOKENS, now_ms),
            output_tokens: anthropic_window(h, &ANTHROPIC_OUTPUT_TOKENS, now_ms),
        },
        ProviderKind::Gemini => RateLimitHeaders::default(),
    }
}

/// Parses a `Retry-After` value into ms from `now_ms`: delay seconds
/// (`"30"`, or a decimal such as `"1.5"`, rounded up to the ms) or an
/// HTTP-date (IMF-fixdate `"Wed, 21 Oct 2015 07:28:00 GMT"`, and the
/// obsolete RFC 850 and asctime forms) made relative to `now_ms` (`Some(0)`
/// if already past). Anything else, negative numbers included, is `None`.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    match v.bytes().next()? {
        b'0'..=b'9' | b'.' => decimal_ns(v, NS_PER_S).map(ns_to_ms_ceil),
        _ => parse_http_date_ms(v).map(|at| relative_ms(at, now_ms)),
    }
}

/// Header lookup by case-insensitive name; values trimmed.
#[derive(Clone, Copy)]
struct Headers<'a, 'b>(&'a [(&'b str, &'b str)]);

impl<'b> Headers<'_, 'b> {
    fn get(self, name: &str) -> Option<&'b str> {
        self.0
            .iter()
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    /// `retry-after-ms`, else `retry-after`.
    fn retry_hint(self, now_ms: u64) -> Option<u64> {
        self.get("retry-after-ms")
            .and_then(|v| decimal_ns(v, NS_PER_MS))
            .map(ns_to_ms_ceil)
            .or_else(|| {
                self.get("retry-after")
                    .and_then(|v| parse_retry_after(v, now_ms))
            })
    }
}

/// (limit, remaining, reset) header names of one window.
type WindowNames = [&'static str; 3];

const OPENAI_REQUESTS: WindowNames = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];
const OPENAI_TOKENS: WindowNames = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];
const ANTHROPIC_REQUESTS: WindowNames = [
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
];
const ANTHROPIC_TOKENS: WindowNames = [
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
];
const ANTHROPIC_INPUT_TOKENS: WindowNames = [
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];
const ANTHROPIC_OUTPUT_TOKENS: WindowNames = [
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

fn openai_window(h: Headers<'_, '_>, names: &WindowNames) -> RateLimitWindow {
    RateLimitWindow {
        limit: h.get(names[0]).and_then(parse_count),
        remaining: h.get(names[1]).and_then(parse_count),
        reset_after_ms: h.get(names[2]).and_then(parse_go_duration_ms),
    }
}

fn anthropic_window(h: Headers<'_, '_>, names: &WindowNames, now_ms: u64) -> RateLimitWindow {
    RateLimitWindow {
        limit: h.get(names[0]).and_then(parse_count),
        remaining: h.get(names[1]).and_then(parse_count),
        reset_after_ms: h
            .get(names[2])
            .and_then(parse_rfc3339_ms)
            .map(|at| relative_ms(at, now_ms)),
    }
}

/// A non-negative integer header value.
fn parse_count(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The rules for every kind.
fn by_status(status: u16, h: Headers<'_, '_>, now_ms: u64) -> Feedback {
    match status {
        429 => Feedback::Throttled {
            retry_after_ms: h.retry_hint(now_ms),
            scope: ThrottleScope::Unknown,
        },
        402 => Feedback::Exhausted {
            reason: "payment_required".to_owned(),
            retry_after_ms: h.retry_hint(now_ms),
        },
        408 | 500..=599 => Feedback::ServerError {
            retry_after_ms: h.retry_hint(now_ms),
        },
        _ => Feedback::ClientError,
    }
}

fn is_client_error(status: u16) -> bool {
    (400..500).contains(&status)
}

/// `cause`, then the provider's message cut to [`MAX_REASON_CHARS`].
fn reason(cause: &str, message: &str) -> String {
    let message = message.trim();
    if message.is_empty() {
        return cause.to_owned();
    }
    let mut out = String::with_capacity(cause.len() + 2 + message.len().min(4 * MAX_REASON_CHARS));
    out.push_str(cause);
    out.push_str(": ");
    match message.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => {
            out.push_str(&message[..cut]);
            out.push('…');
        }
        None => out.push_str(message),
    }
    out
}

/// The `error` object of a provider error body: `{"error": {…}}`, or the
/// first element of a `[{"error": {…}}]` array (Vertex AI).
fn error_object(json: Option<&Value>) -> Option<&Value> {
    let json = json?;
    let top = match json {
        Value::Array(items) => items.first()?,
        other => other,
    };
    top.get("error").filter(|e| matches!(e, Value::Object(_)))
}

/// A string field of an object, `""` if absent or not a string.
fn str_field<'j>(obj: Option<&'j Value>, key: &str) -> &'j str {
    obj.and_then(|o| o.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The scope a rate-limit message names ("… tokens per min (TPM)", "… of
/// 50,000 input tokens per minute"). `lower` is the lowercased message.
fn scope_from_message(lower: &str) -> Option<ThrottleScope> {
    if lower.contains("input tokens per min") {
        Some(ThrottleScope::InputTokens)
    } else if lower.contains("output tokens per min") {
        Some(ThrottleScope::OutputTokens)
    } else if lower.contains("requests per min") || lower.contains("(rpm)") {
        Some(ThrottleScope::Requests)
    } else if lower.contains("tokens per min") || lower.contains("(tpm)") {
        Some(ThrottleScope::Tokens)
    } else {
        None
    }
}

// --- OpenAI ----------------------------------------------------------------

/// An OpenAI `error.type`/`error.code` that means money or quota, not rate.
fn openai_billing(s: &str) -> bool {
    let s = s.to_ascii_lowercase();
    ["quota", "billing", "credit", "spend_limit", "usage_limit"]
        .iter()
        .any(|w| s.contains(w))
}

fn openai(status: u16, h: Headers<'_, '_>, json: Option<&Value>, now_ms: u64) -> Option<Feedback> {
    let err = error_object(json);
    let etype = str_field(err, "type");
    let code = str_field(err, "code");
    let message = str_field(err, "message");
    if is_client_error(status) && (openai_billing(code) || openai_billing(etype)) {
        let cause = if openai_billing(code) { code } else { etype };
        return Some(Feedback::Exhausted {
            reason: reason(cause, message),
            retry_after_ms: h.retry_hint(now_ms),
        });
    }
    if status != 429 {
        return None;
    }
    let lower = message.to_ascii_lowercase();
    if lower.contains("per day") || lower.contains("(rpd)") || lower.contains("(tpd)") {
        return Some(Feedback::Exhausted {
            reason: reason("per_day_limit", message),
            retry_after_ms: h.retry_hint(now_ms),
        });
    }
    let limits = parse_rate_limit_headers(ProviderKind::OpenAi, h.0, now_ms);
    let scope = match etype {
        "requests" => ThrottleScope::Requests,
        "tokens" => ThrottleScope::Tokens,
        _ => scope_from_message(&lower).unwrap_or_else(|| limits.exhausted_scope()),
    };
    let reset = match scope {
        ThrottleScope::Requests => limits.requests.reset_after_ms,
        ThrottleScope::Tokens => limits.tokens.reset_after_ms,
        _ => limits
            .requests
            .reset_after_ms
            .max(limits.tokens.reset_after_ms),
    };
    let retry_after_ms = h
        .retry_hint(now_ms)
        .or(reset)
        .or_else(|| try_again_in(message));
    Some(Feedback::Throttled {
        retry_after_ms,
        scope,
    })
}

/// The duration in OpenAI's "Please try again in 1.5s." (Go syntax).
fn try_again_in(message: &str) -> Option<u64> {
    const NEEDLE: &str = "try again in ";
    // ASCII lowercasing keeps byte offsets.
    let at = message.to_ascii_lowercase().find(NEEDLE)? + NEEDLE.len();
    let word = message.get(at..)?.split_whitespace().next()?;
    parse_go_duration_ms(word.trim_end_matches(['.', ',', ';']))
}

// --- Anthropic ---------------------------------------------------------------

fn anthropic(
    status: u16,
    h: Headers<'_, '_>,
    json: Option<&Value>,
    now_ms: u64,
) -> Option<Feedback> {
    let err = error_object(json);
    let etype = str_field(err, "type");
    let message = str_field(err, "message");
    let error_code = str_field(err.and_then(|e| e.get("details")), "error_code");
    if etype == "billing_error" {
        return Some(Feedback::Exhausted {
            reason: reason("billing_error", message),
            retry_after_ms: h.retry_hint(now_ms),
        });
    }
    let lower = message.to_ascii_lowercase();
    if is_client_error(status) {
        if error_code.to_ascii_lowercase().contains("spend_limit") {
            return Some(Feedback::Exhausted {
                reason: reason(error_code, message),
                retry_after_ms: h.retry_hint(now_ms),
            });
        }
        if status != 429 {
            if lower.contains("credit balance") {
                return Some(Feedback::Exhausted {
                    reason: reason("credit_balance", message),
                    retry_after_ms: h.retry_hint(now_ms),
                });
            }
            if lower.contains("usage limit") || lower.contains("spend limit") {
                return Some(Feedback::Exhausted {
                    reason: reason("spend_limit", message),
                    retry_after_ms: h.retry_hint(now_ms),
                });
            }
        }
    }
    if status == 429 {
        let limits = parse_rate_limit_headers(ProviderKind::Anthropic, h.0, now_ms);
        let scope = match limits.exhausted_scope() {
            ThrottleScope::Unknown => scope_from_message(&lower).unwrap_or(ThrottleScope::Unknown),
            scope => scope,
        };
        let retry_after_ms = h
            .retry_hint(now_ms)
            .or_else(|| limits.window(scope).and_then(|w| w.reset_after_ms));
        return Some(Feedback::Throttled {
            retry_after_ms,
            scope,
        });
    }
    if matches!(etype, "overloaded_error" | "api_error") {
        return Some(Feedback::ServerError {
            retry_after_ms: h.retry_hint(now_ms),
        });
    }
    None
}

// --- Gemini ------------------------------------------------------------------

/// The details of one `@type` (matched on its suffix, e.g.
/// `google.rpc.RetryInfo`).
fn gemini_details<'j>(
    err: &'j Value,
    type_suffix: &'j str,
) -> impl Iterator<Item = &'j Value> + 'j {
    err.get("details")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(move |d| str_field(Some(*d), "@type").ends_with(type_suffix))
}

fn gemini(status: u16, h: Headers<'_, '_>, json: Option<&Value>, now_ms: u64) -> Option<Feedback> {
    let err = error_object(json)?;
    let retry_after_ms = gemini_details(err, "google.rpc.RetryInfo")
        .find_map(|d| d.get("retryDelay").and_then(parse_proto_duration_ms))
        .or_else(|| h.retry_hint(now_ms));
    let resource_exhausted = str_field(Some(err), "status") == "RESOURCE_EXHAUSTED";
    if status == 429 || (resource_exhausted && is_client_error(status)) {
        let mut any = false;
        let mut tokens: Option<ThrottleScope> = None;
        let violations = gemini_details(err, "google.rpc.QuotaFailure").flat_map(|d| {
            d.get("violations")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice)
        });
        for v in violations {
            any = true;
            let id = str_field(Some(v), "quotaId");
            let metric = str_field(Some(v), "quotaMetric");
            let name = if id.is_empty() { metric } else { id };
            let (id_l, metric_l) = (id.to_ascii_lowercase(), metric.to_ascii_lowercase());
            if id_l.contains("perday") || metric_l.contains("per_day") {
                return Some(Feedback::Exhausted {
                    reason: reason("per_day_quota", name),
                    retry_after_ms: h.retry_hint(now_ms),
                });
            }
            let value = v.get("quotaValue").and_then(text_of);
            if value.is_some_and(|q| q.trim() == "0") {
                return Some(Feedback::Exhausted {
                    reason: reason("zero_quota", name),
                    retry_after_ms: h.retry_hint(now_ms),
                });
            }
            let both = format!("{id_l} {metric_l}");
            if both.contains("token") {
                let scope = if both.contains("input") {
                    ThrottleScope::InputTokens
                } else if both.contains("output") {
                    ThrottleScope::OutputTokens
                } else {
                    ThrottleScope::Tokens
                };
                tokens.get_or_insert(scope);
            }
        }
        if !any {
            let message = str_field(Some(err), "message");
            let lower = message.to_ascii_lowercase();
            if ["per_day", "perday", "per day"]
                .iter()
                .any(|w| lower.contains(w))
            {
                return Some(Feedback::Exhausted {
                    reason: reason("per_day_quota", message),
                    retry_after_ms: h.retry_hint(now_ms),
                });
            }
        }
        let scope = match (tokens, any) {
            (Some(scope), _) => scope,
            (None, true) => ThrottleScope::Requests,
            (None, false) => ThrottleScope::Unknown,
        };
        return Some(Feedback::Throttled {
            retry_after_ms,
            scope,
        });
    }
    if (500..600).contains(&status) {
        return Some(Feedback::ServerError { retry_after_ms });
    }
    None
}

/// A `google.protobuf.Duration` in JSON: `"37s"`, `"1.5s"`, `"0.250s"`, or
/// the object form `{"seconds": 37, "nanos": 500000000}`; ms, rounded up.
/// A string's text, or a number's as written.
fn text_of(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

fn parse_proto_duration_ms(v: &Value) -> Option<u64> {
    if let Some(s) = v.as_str() {
        let s = s.trim();
        return decimal_ns(s.strip_suffix('s')?, NS_PER_S).map(ns_to_ms_ceil);
    }
    let int = |key: &str| -> Option<u128> {
        match v.get(key) {
            None => Some(0),
            Some(x) => {
                let text = text_of(x)?;
                let text = text.trim();
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                text.parse().ok()
            }
        }
    };
    if v.get("seconds").is_none() && v.get("nanos").is_none() {
        return None;
    }
    let ns = int("seconds")?
        .saturating_mul(NS_PER_S)
        .saturating_add(int("nanos")?);
    Some(ns_to_ms_ceil(ns))
}

// ---------------------------------------------------------------------------
// Durations and dates, by hand
// ---------------------------------------------------------------------------

/// `int[.frac]` times `scale` ns, in ns. At least one digit; no sign, no
/// exponent. Saturates instead of overflowing; digits past the 18th of the
/// fraction are ignored.
fn decimal_ns(s: &str, scale: u128) -> Option<u128> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut whole: u128 = 0;
    for b in int.bytes() {
        whole = whole
            .saturating_mul(10)
            .saturating_add(u128::from(b - b'0'));
    }
    let frac = &frac[..frac.len().min(18)];
    let mut num: u128 = 0;
    let mut den: u128 = 1;
    for b in frac.bytes() {
        num = num * 10 + u128::from(b - b'0');
        den *= 10;
    }
    // num < 10^18 and scale <= 3.6e12, so num * scale fits in a u128.
    Some(
        whole
            .saturating_mul(scale)
            .saturating_add((num * scale).div_ceil(den)),
    )
}

fn ns_to_ms_ceil(ns: u128) -> u64 {
    u64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(u64::MAX)
}

/// `at_ms − now_ms`, 0 if already past.
fn relative_ms(at_ms: i64, now_ms: u64) -> u64 {
    let now = i128::from(now_ms);
    u64::try_from((i128::from(at_ms) - now).max(0)).unwrap_or(u64::MAX)
}

/// A Go `time.Duration` string (`"1s"`, `"6m0s"`, `"1m30.5s"`, `"20ms"`,
/// `"1h2m3.5s"`, `"0"`), in ms rounded up. Units `ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`; a leading `+` is allowed; negative or malformed is `None`.
fn parse_go_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => NS_PER_MS,
            "s" => NS_PER_S,
            "m" => 60 * NS_PER_S,
            "h" => 3_600 * NS_PER_S,
            _ => return None,
        };
        total = total.saturating_add(decimal_ns(num, scale)?);
        rest = next;
    }
    Some(ns_to_ms_ceil(total))
}

const MS_PER_DAY: i64 = 86_400_000;

/// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 0,
    }
}

/// Unix ms of a UTC date and time, `None` if any field is out of range
/// (a leap second `:60` is accepted and lands on the next second).
fn civil_ms(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Option<i64> {
    if !(1..=12).contains(&mo) || d == 0 || d > days_in_month(y, mo) || h > 23 || mi > 59 || s > 60
    {
        return None;
    }
    let secs = i64::from(h) * 3_600 + i64::from(mi) * 60 + i64::from(s);
    Some(days_from_civil(y, mo, d) * MS_PER_DAY + secs * 1_000)
}

/// A run of `min..=max` ASCII digits.
fn digits(s: &str, min: usize, max: usize) -> Option<u32> {
    if s.len() < min || s.len() > max || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(name))
        .map(|i| i as u32 + 1)
}

/// `HH:MM:SS`.
fn clock_time(s: &str) -> Option<(u32, u32, u32)> {
    let mut parts = s.split(':');
    let h = digits(parts.next()?, 1, 2)?;
    let m = digits(parts.next()?, 2, 2)?;
    let sec = digits(parts.next()?, 2, 2)?;
    if parts.next().is_some() {
        return None;
    }
    Some((h, m, sec))
}

/// An HTTP-date (RFC 9110 §5.6.7), as Unix ms: IMF-fixdate
/// `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT`
/// (two-digit years below 70 are 20xx) or asctime
/// `Sun Nov  6 08:49:37 1994`. The weekday is not checked against the date.
fn parse_http_date_ms(s: &str) -> Option<i64> {
    let mut tokens = [""; 6];
    let mut n = 0;
    for t in s.split_ascii_whitespace() {
        *tokens.get_mut(n)? = t;
        n += 1;
    }
    let gmt = |z: &str| z.eq_ignore_ascii_case("GMT") || z.eq_ignore_ascii_case("UTC");
    let weekday = |w: &str| w.len() >= 3 && w.bytes().all(|b| b.is_ascii_alphabetic());
    let (y, mo, d, time) = match &tokens[..n] {
        [wd, day, mon, year, time, zone] => {
            if !(wd.strip_suffix(',').is_some_and(weekday) && gmt(zone)) {
                return None;
            }
            let y = i64::from(digits(year, 4, 4)?);
            (y, month_number(mon)?, digits(day, 1, 2)?, *time)
        }
        [wd, date, time, zone] => {
            if !(wd.strip_suffix(',').is_some_and(weekday) && gmt(zone)) {
                return None;
            }
            let mut parts = date.split('-');
            let d = digits(parts.next()?, 1, 2)?;
            let mo = month_number(parts.next()?)?;
            let yy = parts.next()?;
            if parts.next().is_some() {
                return None;
            }
            let y = match yy.len() {
                2 => {
                    let yy = i64::from(digits(yy, 2, 2)?);
                    if yy < 70 { 2000 + yy } else { 1900 + yy }
                }
                _ => i64::from(digits(yy, 4, 4)?),
            };
            (y, mo, d, *time)
        }
        [wd, mon, day, time, year] => {
            if !weekday(wd) {
                return None;
            }
            let y = i64::from(digits(year, 4, 4)?);
            (y, month_number(mon)?, digits(day, 1, 2)?, *time)
        }
        _ => return None,
    };
    let (h, mi, sec) = clock_time(time)?;
    civil_ms(y, mo, d, h, mi, sec)
}

/// An RFC 3339 date-time (`2024-05-01T12:00:30Z`,
/// `2024-05-01T12:00:30.250+02:00`), as Unix ms; fractional seconds are
/// rounded up to the ms. The offset is required (`Z`, `+HH:MM`, or
/// `+HHMM`).
fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    let sep = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let y = i64::from(digits(s.get(0..4)?, 4, 4)?);
    let mo = digits(s.get(5..7)?, 2, 2)?;
    let d = digits(s.get(8..10)?, 2, 2)?;
    let h = digits(s.get(11..13)?, 2, 2)?;
    let mi = digits(s.get(14..16)?, 2, 2)?;
    let sec = digits(s.get(17..19)?, 2, 2)?;
    let mut rest = s.get(19..)?;
    let mut frac_ms: i64 = 0;
    if let Some(after_dot) = rest.strip_prefix('.') {
        let len = after_dot
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after_dot.len());
        if len == 0 {
            return None;
        }
        let frac = &after_dot[..len];
        let ns = decimal_ns(&format!("0.{frac}"), NS_PER_S)?;
        frac_ms = i64::try_from(ns_to_ms_ceil(ns)).ok()?;
        rest = &after_dot[len..];
    }
    let offset_min: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let off = &rest[1..];
            let (oh, om) = match off.len() {
                5 if off.as_bytes()[2] == b':' => (off.get(0..2)?, off.get(3..5)?),
                4 => (off.get(0..2)?, off.get(2..4)?),
                _ => return None,
            };
            let (oh, om) = (digits(oh, 2, 2)?, digits(om, 2, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            sign * i64::from(oh * 60 + om)
        }
    };
    let local = civil_ms(y, mo, d, h, mi, sec)?;
    Some(local + frac_ms - offset_min * 60_000)
}

// ---------------------------------------------------------------------------
// Unit tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    // 2024-05-01T12:00:00Z
    const NOW: u64 = 1_714_564_800_000;

    #[test]
    fn provider_kind_names_round_trip() {
        for kind in ProviderKind::ALL {
            assert_eq!(kind.as_str().parse::<ProviderKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(" OpenAI ".parse::<ProviderKind>(), Ok(ProviderKind::OpenAi));
        let err = "azure".parse::<ProviderKind>().unwrap_err();
        assert_eq!(err.name(), "azure");
        assert!(err.to_string().contains("azure"), "{err}");
        let json = serde_json::to_string(&ProviderKind::OpenAi).unwrap();
        assert_eq!(json, r#""openai""#);
        assert_eq!(
            serde_json::from_str::<ProviderKind>(r#""gemini""#).unwrap(),
            ProviderKind::Gemini
        );
    }

    #[test]
    fn class_names_are_stable() {
        let all = [
            (
                Feedback::Success {
                    limits: RateLimitHeaders::default(),
                },
                "success",
            ),
            (
                Feedback::Throttled {
                    retry_after_ms: Some(5),
                    scope: ThrottleScope::Tokens,
                },
                "throttled",
            ),
            (
                Feedback::Exhausted {
                    reason: "x".into(),
                    retry_after_ms: None,
                },
                "exhausted",
            ),
            (
                Feedback::ServerError {
                    retry_after_ms: Some(7),
                },
                "server_error",
            ),
            (Feedback::ClientError, "client_error"),
        ];
        for (fb, class) in &all {
            assert_eq!(fb.class(), *class);
        }
        assert_eq!(all[1].0.retry_after_ms(), Some(5));
        assert_eq!(all[3].0.retry_after_ms(), Some(7));
        assert_eq!(all[0].0.retry_after_ms(), None);
        assert!(all[1].0.is_retryable() && all[3].0.is_retryable());
        assert!(!all[2].0.is_retryable() && !all[4].0.is_retryable());
        assert!(all[0].0.limits().is_some() && all[1].0.limits().is_none());
        assert_eq!(ThrottleScope::InputTokens.to_string(), "input_tokens");
        assert!(ThrottleScope::OutputTokens.is_tokens() && !ThrottleScope::Requests.is_tokens());
    }

    #[test]
    fn retry_after_seconds_and_decimals() {
        assert_eq!(parse_retry_after("30", NOW), Some(30_000));
        assert_eq!(parse_retry_after(" 0 ", NOW), Some(0));
        assert_eq!(parse_retry_after("1.5", NOW), Some(1_500));
        assert_eq!(parse_retry_after("0.0001", NOW), Some(1)); // rounded up
        assert_eq!(parse_retry_after(".5", NOW), Some(500));
        assert_eq!(parse_retry_after("2.", NOW), Some(2_000));
        assert_eq!(
            parse_retry_after("99999999999999999999999999999999999999999", NOW),
            Some(u64::MAX)
        );
    }

    #[test]
    fn retry_after_malformed_is_none() {
        for bad in [
            "",
            "   ",
            "-1",
            "+5",
            "1e3",
            "1.2.3",
            ".",
            "30s",
            "abc",
            "NaN",
            "inf",
            "١٢",
            "3 0",
            "Wed, 21 Oct 2015 07:28:00",
            "Wed, 32 Oct 2015 07:28:00 GMT",
            "Wed, 21 Foo 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 24:00:00 GMT",
            "Wed, 21 Oct 2015 07:28:00 PST",
            "Wed 21 Oct 2015 07:28:00 GMT",
            "Thu, 29 Feb 2015 00:00:00 GMT",
            "Wed, 21 Oct 15 07:28:00 GMT",
            "Wed, 21 Oct 2015 07:28 GMT",
            "Wed, 21 Oct 2015 07:28:00 GMT extra",
        ] {
            assert_eq!(parse_retry_after(bad, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_http_dates() {
        let at = 1_445_412_480_000; // Wed, 21 Oct 2015 07:28:00 GMT
        let now = at - 30_000;
        assert_eq!(
            parse_http_date_ms("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(at as i64)
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(30_000)
        );
        assert_eq!(
            parse_retry_after("wed, 21 oct 2015 07:28:00 gmt", now),
            Some(30_000)
        );
        // Past dates: no wait.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", at + 5_000),
            Some(0)
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", NOW),
            Some(0)
        );
        // The obsolete forms (RFC 9110 §5.6.7).
        assert_eq!(
            parse_http_date_ms("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777_000)
        );
        assert_eq!(
            parse_http_date_ms("Sun Nov  6 08:49:37 1994"),
            Some(784_111_777_000)
        );
        assert_eq!(
            parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777_000)
        );
        // Leap day, century rules.
        assert_eq!(
            parse_http_date_ms("Tue, 29 Feb 2000 23:59:59 GMT"),
            Some(951_868_799_000)
        );
        assert_eq!(parse_http_date_ms("Mon, 29 Feb 2100 00:00:00 GMT"), None);
        assert_eq!(
            parse_http_date_ms("Mon, 01 Mar 2100 00:00:00 GMT"),
            Some(4_107_542_400_000)
        );
    }

    #[test]
    fn civil_arithmetic_matches_known_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(
            days_from_civil(2024, 5, 1) * MS_PER_DAY + 12 * 3_600_000,
            NOW as i64
        );
        // Every day from 1960 to 2100 follows the one before.
        let mut expected = days_from_civil(1960, 1, 1);
        for y in 1960..2100 {
            for m in 1..=12 {
                for d in 1..=days_in_month(y, m) {
                    assert_eq!(days_from_civil(y, m, d), expected, "{y}-{m}-{d}");
                    expected += 1;
                }
            }
        }
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("1m30.5s", 90_500),
            ("20ms", 20),
            ("1.002s", 1_002),
            ("7m12s", 432_000),
            ("2h0m0s", 7_200_000),
            ("1h2m3.5s", 3_723_500),
            ("0", 0),
            ("0s", 0),
            ("+3s", 3_000),
            ("500us", 1),
            ("500µs", 1),
            ("1500000ns", 2),
            (" 59.56s ", 59_560),
        ];
        for (s, ms) in cases {
            assert_eq!(parse_go_duration_ms(s), Some(ms), "{s:?}");
        }
        for bad in [
            "", "s", "1", "-1s", "1x", "1S", "1.2.3s", "ms", "1s2", "1 s", "1d", "m1", "..s",
        ] {
            assert_eq!(parse_go_duration_ms(bad), None, "{bad:?}");
        }
        let huge = format!("{}h", "9".repeat(60));
        assert_eq!(parse_go_duration_ms(&huge), Some(u64::MAX));
    }

    #[test]
    fn rfc3339_times() {
        let at = NOW as i64 + 30_000;
        assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30Z"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01t12:00:30z"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01 12:00:30Z"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30+00:00"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01T14:00:30+02:00"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01T07:00:30-0500"), Some(at));
        assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30.250Z"), Some(at + 250));
        assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30.5Z"), Some(at + 500));
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T12:00:30.000000001Z"),
            Some(at + 1)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-05-01T12:00:30.999999Z"),
            Some(at + 1_000)
        );
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:30",
            "2024-05-01T12:00:30.Z",
            "2024-13-01T12:00:30Z",
            "2024-02-30T12:00:30Z",
            "2024-05-01T25:00:30Z",
            "2024-05-01T12:00:30+24:00",
            "2024-05-01T12:00:30+2:00",
            "2024-05-01T12:00:30ZZ",
            "2024/05/01T12:00:30Z",
            "2024-05-01T12:00:3éZ",
            "é024-05-01T12:00:30Z",
            "1714564830",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn header_names_are_case_insensitive() {
        let headers = [
            ("RETRY-AFTER", " 7 "),
            ("X-RateLimit-Remaining-Requests", "0"),
            ("x-ratelimit-reset-REQUESTS", "1s"),
        ];
        let fb = classify(ProviderKind::OpenAi, 429, &headers, None, NOW);
        assert_eq!(
            fb,
            Feedback::Throttled {
                retry_after_ms: Some(7_000),
                scope: ThrottleScope::Requests
            }
        );
        let limits = parse_rate_limit_headers(ProviderKind::OpenAi, &headers, NOW);
        assert_eq!(limits.requests.remaining, Some(0));
        assert_eq!(limits.requests.reset_after_ms, Some(1_000));
        assert!(limits.tokens.is_empty());
        // retry-after-ms wins over retry-after.
        let headers = [("Retry-After-Ms", "1234.5"), ("Retry-After", "9")];
        assert_eq!(
            classify(ProviderKind::Generic, 429, &headers, None, NOW).retry_after_ms(),
            Some(1_235)
        );
    }

    #[test]
    fn status_rules_for_every_kind() {
        for kind in ProviderKind::ALL {
            let c = |status: u16| classify(kind, status, &[], None, NOW);
            assert_eq!(c(200).class(), "success", "{kind}");
            assert_eq!(c(204).class(), "success", "{kind}");
            assert_eq!(
                c(429),
                Feedback::Throttled {
                    retry_after_ms: None,
                    scope: ThrottleScope::Unknown
                },
                "{kind}"
            );
            for s in [408, 500, 502, 503, 504, 529, 599] {
                assert_eq!(
                    c(s),
                    Feedback::ServerError {
                        retry_after_ms: None
                    },
                    "{kind} {s}"
                );
            }
            for s in [
                0,
                100,
                301,
                400,
                401,
                403,
                404,
                409,
                413,
                422,
                600,
                u16::MAX,
            ] {
                assert_eq!(c(s), Feedback::ClientError, "{kind} {s}");
            }
            assert_eq!(c(402).class(), "exhausted", "{kind}");
        }
    }

    #[test]
    fn unknown_or_hostile_bodies_fall_back_to_status() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let huge = format!(
            r#"{{"error":{{"type":"insufficient_quota","message":"{}"}}}}"#,
            "x".repeat(MAX_BODY_BYTES)
        );
        let bodies = [
            "",
            "not json",
            "<html>429 Too Many Requests</html>",
            "{",
            r#"{"error": "rate limited"}"#,
            r#"{"error": {"type": 42}}"#,
            r#"{"error": {"type": "insufficient_quota"} trailing"#,
            r#"["#,
            r#"[]"#,
            r#""\ud800""#,
            "\u{0}\u{ffff}",
            &deep,
            &huge,
        ];
        for kind in ProviderKind::ALL {
            for body in bodies {
                assert_eq!(
                    classify(kind, 429, &[("retry-after", "3")], Some(body), NOW),
                    Feedback::Throttled {
                        retry_after_ms: Some(3_000),
                        scope: ThrottleScope::Unknown
                    },
                    "{kind} {:?}",
                    body.get(..40)
                );
                assert_eq!(
                    classify(kind, 400, &[], Some(body), NOW),
                    Feedback::ClientError
                );
            }
        }
    }

    #[test]
    fn proto_durations() {
        let d = |s: &str| parse_proto_duration_ms(&serde_json::from_str(s).unwrap());
        assert_eq!(d(r#""37s""#), Some(37_000));
        assert_eq!(d(r#""1.5s""#), Some(1_500));
        assert_eq!(d(r#""0.250s""#), Some(250));
        assert_eq!(d(r#""0.000000001s""#), Some(1));
        assert_eq!(d(r#"{"seconds": 2, "nanos": 500000000}"#), Some(2_500));
        assert_eq!(d(r#"{"seconds": "3"}"#), Some(3_000));
        for bad in [
            r#""37""#,
            r#""-1s""#,
            r#""s""#,
            r#""1m""#,
            "37",
            "{}",
            r#"{"seconds": -1}"#,
            "null",
        ] {
            assert_eq!(d(bad), None, "{bad}");
        }
    }

    #[test]
    fn reasons_are_cut_on_char_boundaries() {
        assert_eq!(reason("x", "  "), "x");
        assert_eq!(reason("x", "hello"), "x: hello");
        let long = "é".repeat(300);
        let r = reason("cause", &long);
        assert_eq!(r.chars().count(), "cause: ".len() + MAX_REASON_CHARS + 1);
        assert!(r.ends_with('…'));
    }

    #[test]
    fn openai_scope_from_remaining_headers_and_message_hint() {
        // No body: the exhausted window names the scope, its reset is the hint.
        let headers = [
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(
            classify(ProviderKind::OpenAi, 429, &headers, None, NOW),
            Feedback::Throttled {
                retry_after_ms: Some(360_000),
                scope: ThrottleScope::Tokens
            }
        );
        // Nothing but the message's "try again in".
        let body = r#"{"error":{"message":"Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29000, Requested 1500. Please try again in 2.004s. Visit https://platform.openai.com/account/rate-limits.","type":"","code":"rate_limit_exceeded"}}"#;
        assert_eq!(
            classify(ProviderKind::OpenAi, 429, &[], Some(body), NOW),
            Feedback::Throttled {
                retry_after_ms: Some(2_004),
                scope: ThrottleScope::Tokens
            }
        );
        // Unknown scope: the larger reset.
        let headers = [
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "250ms"),
        ];
        assert_eq!(
            classify(ProviderKind::OpenAi, 429, &headers, None, NOW).retry_after_ms(),
            Some(1_000)
        );
    }

    #[test]
    fn anthropic_ties_and_fallbacks() {
        // Two exhausted windows: the one that resets last.
        let headers = [
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:05Z"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2024-05-01T12:00:20Z",
            ),
        ];
        assert_eq!(
            classify(ProviderKind::Anthropic, 429, &headers, None, NOW),
            Feedback::Throttled {
                retry_after_ms: Some(20_000),
                scope: ThrottleScope::OutputTokens
            }
        );
        // A reset in the past is no wait.
        let headers = [
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2024-05-01T11:59:00Z"),
        ];
        assert_eq!(
            classify(ProviderKind::Anthropic, 429, &headers, None, NOW).retry_after_ms(),
            Some(0)
        );
        // No headers: the message names the scope.
        let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 8,000 output tokens per minute."}}"#;
        assert_eq!(
            classify(ProviderKind::Anthropic, 429, &[], Some(body), NOW),
            Feedback::Throttled {
                retry_after_ms: None,
                scope: ThrottleScope::OutputTokens
            }
        );
        // A 500 api_error with a hint.
        let body =
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
        assert_eq!(
            classify(
                ProviderKind::Anthropic,
                500,
                &[("retry-after", "4")],
                Some(body),
                NOW
            ),
            Feedback::ServerError {
                retry_after_ms: Some(4_000)
            }
        );
    }

    #[test]
    fn exhausted_hints_come_from_the_retry_headers_only() {
        // OpenAI's per-day limit says "try again in 8.64s": when one more
        // request would fit the day, not when the quota is back. Not read.
        let rpd = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini on requests per day (RPD): Limit 10000, Used 10000, Requested 1. Please try again in 8.64s.","type":"requests","code":"rate_limit_exceeded"}}"#;
        let fb = classify(ProviderKind::OpenAi, 429, &[], Some(rpd), NOW);
        assert_eq!((fb.class(), fb.retry_after_ms()), ("exhausted", None));
        // A Retry-After header is.
        let headers = [("retry-after", "3600")];
        let fb = classify(ProviderKind::OpenAi, 429, &headers, Some(rpd), NOW);
        assert_eq!(fb.retry_after_ms(), Some(3_600_000));
        assert!(!fb.is_retryable(), "an exhaustion is never retried");
        // Gemini's RetryInfo beside a per-day violation is not read either.
        let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
              {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}]}}"#;
        let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
        assert_eq!((fb.class(), fb.retry_after_ms()), ("exhausted", None));
        let fb = classify(
            ProviderKind::Gemini,
            429,
            &[("retry-after-ms", "1500")],
            Some(body),
            NOW,
        );
        assert_eq!(fb.retry_after_ms(), Some(1_500));
        // Every kind: a 402 with a hint.
        let fb = classify(
            ProviderKind::Generic,
            402,
            &[("Retry-After", "999999999")],
            None,
            NOW,
        );
        assert_eq!(
            fb,
            Feedback::Exhausted {
                reason: "payment_required".into(),
                retry_after_ms: Some(999_999_999_000)
            }
        );
    }

    #[test]
    fn hints_are_cut_to_a_maximum() {
        let throttled = |h| Feedback::Throttled {
            retry_after_ms: h,
            scope: ThrottleScope::Requests,
        };
        assert_eq!(
            throttled(Some(999_999_999_000)).with_hint_at_most(300_000),
            throttled(Some(300_000))
        );
        assert_eq!(
            throttled(Some(2_000)).with_hint_at_most(300_000),
            throttled(Some(2_000))
        );
        assert_eq!(throttled(None).with_hint_at_most(1), throttled(None));
        let exhausted = Feedback::Exhausted {
            reason: "r".into(),
            retry_after_ms: Some(86_400_000),
        };
        assert_eq!(
            exhausted.with_hint_at_most(60_000).retry_after_ms(),
            Some(60_000)
        );
        let server = Feedback::ServerError {
            retry_after_ms: Some(10),
        };
        assert_eq!(
            server.clone().with_hint_at_most(5),
            Feedback::ServerError {
                retry_after_ms: Some(5)
            }
        );
        assert_eq!(
            Feedback::ClientError.with_hint_at_most(0),
            Feedback::ClientError
        );
    }

    #[test]
    fn gemini_variants() {
        // Token and request violations together: tokens.
        let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
              {"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"},
              {"quotaMetric":"generativelanguage.googleapis.com/generate_content_paid_tier_output_token_count","quotaId":"GenerateContentOutputTokensPerModelPerMinute"}]},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":"12","nanos":1}}]}}"#;
        assert_eq!(
            classify(ProviderKind::Gemini, 429, &[], Some(body), NOW),
            Feedback::Throttled {
                retry_after_ms: Some(12_001),
                scope: ThrottleScope::OutputTokens
            }
        );
        // A zero quota can never pass.
        let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
              {"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_input_token_count","quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier","quotaValue":"0"}]}]}}"#;
        let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
        assert_eq!(fb.class(), "exhausted");
        assert!(
            matches!(&fb, Feedback::Exhausted { reason, .. } if reason.starts_with("zero_quota: GenerateContentInputTokens")),
            "{fb:?}"
        );
        // No details, but the message names a per-day quota (Vertex AI).
        let body = r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model with base model: gemini-pro."}}]"#;
        let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
        assert!(
            matches!(&fb, Feedback::Exhausted { reason, .. } if reason.starts_with("per_day_quota: Quota exceeded")),
            "{fb:?}"
        );
        // The same per minute is a throttle.
        let body = body.replace("per_day", "per_minute");
        assert_eq!(
            classify(ProviderKind::Gemini, 429, &[], Some(&body), NOW),
            Feedback::Throttled {
                retry_after_ms: None,
                scope: ThrottleScope::Unknown
            }
        );
        // RetryInfo on a 503.
        let body = r#"{"error":{"code":503,"status":"UNAVAILABLE","message":"The model is overloaded.","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"5s"}]}}"#;
        assert_eq!(
            classify(ProviderKind::Gemini, 503, &[], Some(body), NOW),
            Feedback::ServerError {
                retry_after_ms: Some(5_000)
            }
        );
        // A malformed retryDelay is no hint.
        let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"}]}}"#;
        assert_eq!(
            classify(ProviderKind::Gemini, 429, &[], Some(body), NOW),
            Feedback::Throttled {
                retry_after_ms: None,
                scope: ThrottleScope::Unknown
            }
        );
    }
}
