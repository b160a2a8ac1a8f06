//! Google Gemini's conventions (Google AI and Vertex AI):
//! `google.rpc.Status` error bodies with `QuotaFailure` and `RetryInfo`
//! details (rules on [`classify`](super::classify)).

use std::borrow::Cow;

use serde_json::Value;

use super::hints::{NS_PER_S, decimal_ns, ns_to_ms_ceil};
use super::{Feedback, Headers, ThrottleScope, error_object, is_client_error, reason, str_field};

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

/// The Gemini rules, `None` where the status rules apply.
pub(super) fn gemini(
    status: u16,
    h: Headers<'_, '_>,
    json: Option<&Value>,
    now_ms: u64,
) -> Option<Feedback> {
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

/// A string's text, or a number's as written.
fn text_of(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// A `google.protobuf.Duration` in JSON: `"37s"`, `"1.5s"`, `"0.250s"`, or
/// the object form `{"seconds": 37, "nanos": 500000000}`; ms, rounded up.
pub(super) fn parse_proto_duration_ms(v: &Value) -> Option<u64> {
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
