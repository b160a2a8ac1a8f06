//! Envoy's rate-limit service (RLS v3,
//! `envoy.service.ratelimit.v3.RateLimitService`, `ShouldRateLimit`),
//! answered from tollgate's limits, on a listener of its own
//! (`rls_listen`): never on the API's gRPC port.
//!
//! - [`RlsConfig`] is the `[rls]` table, which maps the descriptors Envoy
//!   sends to tollgate limits, validated into [`RlsRules`] ([`validate_rls`],
//!   reloaded with the config) by `rules.rs`; and says how the listener is
//!   guarded, validated into [`RlsServer`] ([`validate_rls_server`], read at
//!   startup) by `listener.rs`, with the key check ([`KeyCheck`]).
//! - [`RlsService`] (`service.rs`) answers each call: the guards, then each
//!   descriptor matched to its rule and decided by the limiter
//!   ([`Limiter::take_turns`] for a user's turns, [`Limiter::take_bucket`]
//!   for a named bucket); `response.rs` writes the answer Envoy reads.
//!
//! [`Limiter::take_turns`]: tollgate_core::Limiter::take_turns
//! [`Limiter::take_bucket`]: tollgate_core::Limiter::take_bucket
//!
//! What operators configure and what Envoy gets back — the `[rls]` table
//! and its TOML, how descriptors match rules, the listener's key and
//! bounds, the order of the guards, the answers and their headers, shadow
//! mode, a store outage and the metrics — is docs/envoy.md; the behaviour
//! contract is SPEC §8. Each rule is documented again only where it is
//! enforced: [`check_request`] and [`entry_ids`] (the message's bounds and
//! ids), [`RlsRules::find`] (matching), [`KeyCheck`] (the key) and
//! [`per_unit`] (`current_limit`).

mod listener;
mod response;
mod rules;
mod service;
#[cfg(test)]
mod tests;

pub use listener::{
    DEFAULT_MAX_IN_FLIGHT, KEY_METADATA, KeyCheck, MAX_KEY_BYTES, MAX_MAX_IN_FLIGHT, MIN_KEY_BYTES,
    RlsGrpcServer, RlsKey, RlsServer, validate_rls_server,
};
pub use response::per_unit;
pub use rules::{
    DEFAULT_DOMAIN, MAX_CONFIG_STR, Matched, RlsConfig, RlsLimit, RlsRules, Rule, RuleConfig,
    Target, validate_rls,
};
pub use service::{
    MAX_DESCRIPTORS, MAX_ENTRIES, RlsService, RulesHandle, check_request, entry_ids,
};
