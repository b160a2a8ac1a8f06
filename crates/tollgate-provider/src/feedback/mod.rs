//! Classification of one provider answer into [`Feedback`] (SPEC §5).
//!
//! Everything here is pure: no clock (the time comes in as `now_ms`), no
//! I/O. Error bodies up to 256 KiB are read with serde_json (whose recursion
//! limit keeps a hostile body from exhausting the stack); larger ones are
//! not parsed and the status rules apply.
//!
//! The public types are in `types.rs`; the rules of each provider in
//! `openai.rs`, `anthropic.rs` and `gemini.rs` (with the protobuf
//! durations of Gemini's `RetryInfo`); the hints' grammars (delay seconds,
//! HTTP-dates, RFC 3339 times, Go durations) in `hints.rs`.

mod anthropic;
mod gemini;
mod hints;
mod openai;
mod types;

#[cfg(test)]
mod tests;

use serde_json::Value;

pub use hints::parse_retry_after;
pub use types::{
    Feedback, ProviderKind, RateLimitHeaders, RateLimitWindow, ThrottleScope, UnknownProviderKind,
};

use anthropic::{
    ANTHROPIC_INPUT_TOKENS, ANTHROPIC_OUTPUT_TOKENS, ANTHROPIC_REQUESTS, ANTHROPIC_TOKENS,
    anthropic, anthropic_window,
};
use gemini::gemini;
use hints::{NS_PER_MS, decimal_ns, ns_to_ms_ceil};
use openai::{OPENAI_REQUESTS, OPENAI_TOKENS, openai, openai_window};

/// The largest body read as JSON, in bytes. Provider error bodies are a few
/// hundred bytes; anything larger is not parsed and the status rules apply.
const MAX_BODY_BYTES: usize = 256 * 1024;

/// The most characters of the provider's message kept in an
/// [`Feedback::Exhausted`] reason.
const MAX_REASON_CHARS: usize = 200;

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
