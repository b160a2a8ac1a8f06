//! OpenAI's conventions: `x-ratelimit-*` headers with Go-style durations,
//! error bodies `{"error": {"type", "code", "message"}}` (rules on
//! [`classify`](super::classify)).

use serde_json::Value;

use super::hints::parse_go_duration_ms;
use super::{
    Feedback, Headers, ProviderKind, RateLimitWindow, ThrottleScope, WindowNames, error_object,
    is_client_error, parse_count, parse_rate_limit_headers, reason, scope_from_message, str_field,
};

/// (limit, remaining, reset) of the requests window.
pub(super) const OPENAI_REQUESTS: WindowNames = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];

/// (limit, remaining, reset) of the tokens window.
pub(super) const OPENAI_TOKENS: WindowNames = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

/// One window of OpenAI-style headers; resets are Go durations.
pub(super) fn openai_window(h: Headers<'_, '_>, names: &WindowNames) -> RateLimitWindow {
    RateLimitWindow {
        limit: h.get(names[0]).and_then(parse_count),
        remaining: h.get(names[1]).and_then(parse_count),
        reset_after_ms: h.get(names[2]).and_then(parse_go_duration_ms),
    }
}

/// An OpenAI `error.type`/`error.code` that means money or quota, not rate.
fn openai_billing(s: &str) -> bool {
    let s = s.to_ascii_lowercase();
    ["quota", "billing", "credit", "spend_limit", "usage_limit"]
        .iter()
        .any(|w| s.contains(w))
}

/// The OpenAI rules, `None` where the status rules apply.
pub(super) fn openai(
    status: u16,
    h: Headers<'_, '_>,
    json: Option<&Value>,
    now_ms: u64,
) -> Option<Feedback> {
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
