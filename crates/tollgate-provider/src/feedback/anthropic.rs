//! Anthropic's conventions: `anthropic-ratelimit-*` headers with RFC 3339
//! resets, error bodies `{"type": "error", "error": {"type", "message"}}`
//! (rules on [`classify`](super::classify)).

use serde_json::Value;

use super::hints::{parse_rfc3339_ms, relative_ms};
use super::{
    Feedback, Headers, ProviderKind, RateLimitWindow, ThrottleScope, WindowNames, error_object,
    is_client_error, parse_count, parse_rate_limit_headers, reason, scope_from_message, str_field,
};

/// (limit, remaining, reset) of the requests window.
pub(super) const ANTHROPIC_REQUESTS: WindowNames = [
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
];

/// (limit, remaining, reset) of the tokens window.
pub(super) const ANTHROPIC_TOKENS: WindowNames = [
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
];

/// (limit, remaining, reset) of the input tokens window.
pub(super) const ANTHROPIC_INPUT_TOKENS: WindowNames = [
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];

/// (limit, remaining, reset) of the output tokens window.
pub(super) const ANTHROPIC_OUTPUT_TOKENS: WindowNames = [
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

/// One window of Anthropic headers; resets are RFC 3339 times, made
/// relative to `now_ms`.
pub(super) fn anthropic_window(
    h: Headers<'_, '_>,
    names: &WindowNames,
    now_ms: u64,
) -> RateLimitWindow {
    RateLimitWindow {
        limit: h.get(names[0]).and_then(parse_count),
        remaining: h.get(names[1]).and_then(parse_count),
        reset_after_ms: h
            .get(names[2])
            .and_then(parse_rfc3339_ms)
            .map(|at| relative_ms(at, now_ms)),
    }
}

/// The Anthropic rules, `None` where the status rules apply.
pub(super) fn anthropic(
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
