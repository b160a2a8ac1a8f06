//! # tollgate-provider
//!
//! Provider quota shaping (SPEC §5): per provider key (provider, model)
//! limits as data ([`ProvidersConfig`] → [`ProviderBook`]), fleet-wide
//! permits with tenant shares, a cooldown and AIMD ([`ProviderGovernor`]),
//! and what a provider's HTTP answer says about its quota ([`classify`]).
//! The retry helper ([`Retrier`]) is the one retry layer for provider calls.
//!
//! The fleet-wide state lives in a [`Store`](tollgate_core::Store) of
//! `tollgate-core` (its provider operations `take_many`, `extend_cooldown`,
//! `aimd` and `clear_provider`) and the AIMD arithmetic is core's pure
//! [`aimd`](tollgate_core::aimd) transition; this crate decides what to ask
//! the store, and keeps only the per-replica exhaustion holds itself.
//!
//! | file | what it holds |
//! |---|---|
//! | `config.rs` | `[providers]` rows, validated into a [`ProviderBook`] |
//! | `governor.rs` | [`ProviderGovernor`]: permits, feedback, status and clear |
//! | `feedback/` | [`classify`]: the status rules, one file per provider, the hints' grammars |
//! | `retry.rs` | [`Retrier`], [`RetryBudget`], [`backoff_ms`] |
//!
//! ## Feedback
//!
//! [`classify`] is a pure function of the provider's conventions
//! ([`ProviderKind`]), the answer's status, headers and body, and the time
//! `now_ms` (the caller's [`Clock`](tollgate_core::Clock)). It returns a
//! [`Feedback`] for the quota governor:
//!
//! | answer | [`Feedback`] | governor |
//! |---|---|---|
//! | 2xx | [`Success`](Feedback::Success), with the rate-limit headers | no 429: AIMD may increase |
//! | per-minute 429 | [`Throttled`](Feedback::Throttled), with the hint and the scope | cooldown `now + hint` (the hint at most the key's `max_cooldown_ms`), AIMD halves |
//! | per-day, billing or spend-cap refusal | [`Exhausted`](Feedback::Exhausted), with the hint of its retry headers | `provider_exhausted` on this replica for the hint or [`EXHAUSTED_HOLD_MS`], at most `max_exhausted_ms`; no retry |
//! | 5xx, 408, Anthropic 529 | [`ServerError`](Feedback::ServerError) | retry with backoff |
//! | any other 4xx | [`ClientError`](Feedback::ClientError) | not a quota matter, no retry |
//!
//! Header names are matched case-insensitively, and nothing the provider
//! sends can make it panic: a malformed hint is no hint, and a body that is
//! not the provider's error JSON falls back to the status rules. The provider
//! rules, and the choices made where the providers' documentation leaves
//! room, are listed on [`classify`].
//!
//! ```
//! use tollgate_provider::{Feedback, ProviderKind, classify};
//!
//! let body = r#"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
//!   "message": "You exceeded your current quota.",
//!   "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}}"#;
//! let feedback = classify(ProviderKind::Gemini, 429, &[], Some(body), 0);
//! assert_eq!(feedback.class(), "throttled");
//! assert_eq!(feedback.retry_after_ms(), Some(37_000));
//!
//! let headers = [("Retry-After", "2")];
//! let feedback = classify(ProviderKind::Generic, 503, &headers, None, 0);
//! assert_eq!(feedback, Feedback::ServerError { retry_after_ms: Some(2_000) });
//! ```

mod config;
mod feedback;
mod governor;
mod retry;

pub use config::{
    DEFAULT_MAX_COOLDOWN_MS, DEFAULT_MAX_EXHAUSTED_MS, DEFAULT_PROVIDER_MAX_WAIT_MS, FairShare,
    MAX_HINT_CAP_MS, Policy, Provider, ProviderBook, ProviderConfig, ProviderKeys, ProvidersConfig,
    Tenant, TenantConfig, validate_providers,
};
pub use feedback::{
    Feedback, ProviderKind, RateLimitHeaders, RateLimitWindow, ThrottleScope, UnknownProviderKind,
    classify, parse_rate_limit_headers, parse_retry_after,
};
pub use governor::{
    ClearOutcome, EXHAUSTED_HOLD_MS, ExhaustionHold, FeedbackOutcome, PermitRequest, ProviderError,
    ProviderGovernor, ProviderPermit, ProviderStatus, TenantStatus,
};
pub use retry::{
    AttemptError, BudgetSnapshot, GiveUpReason, RETRY_BUDGET_WINDOW_MS, Retrier, RetryBudget,
    RetryDecision, RetryError, RetryPolicy, backoff_ms,
};
