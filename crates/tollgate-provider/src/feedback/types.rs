//! The public types of the feedback: which provider, which rate, what the
//! headers said and what the answer means.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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
    pub(super) fn exhausted_scope(&self) -> ThrottleScope {
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
        /// [`classify`](super::classify)).
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
