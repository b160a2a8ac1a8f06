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
//! [`MAX_MESSAGE_BYTES`]: crate::grpc::api::MAX_MESSAGE_BYTES
//! [`ops::check_id`]: crate::ops::check_id
//!
//! # Configuration
//!
//! ```toml
//! rls_listen = "10.0.0.5:8789"  # its own port, never the API's grpc_listen
//!
//! [rls]
//! key_file = "rls.key"       # Envoy sends it as `x-tollgate-rls-key` metadata
//! max_in_flight = 1024       # calls answered at once; past it RESOURCE_EXHAUSTED
//! domain = "agents"          # Envoy's `domain`; other domains are answered OK
//! shadow = false             # true: answer OK while counting
//!
//! # The user's turn bucket (the plan's `turns`), shared with turn admission.
//! [[rls.descriptors]]
//! key = "user_id"
//! limit = "user_turns"
//!
//! # A named bucket with its own rate, one for the value "search".
//! [[rls.descriptors]]
//! key = "generic_key"
//! value = "search"
//! rate = { amount = 100, period_ms = 1000, burst = 200 }
//!
//! # One bucket per client address.
//! [[rls.descriptors]]
//! key = "remote_address"
//! rate = { amount = 10, period_ms = 1000 }
//!
//! # Per user, on the chat route only: descriptors of exactly these two
//! # entries, `generic_key = "chat"` and any `user_id`.
//! [[rls.descriptors]]
//! key = "user_id"
//! with = { generic_key = "chat" }
//! rate = { amount = 30, period_ms = 60000, burst = 10 }
//! ```
//!
//! # Matching
//!
//! Each descriptor of a request is matched on its own against the rules in
//! order; the first that matches decides, and a descriptor no rule matches
//! is answered OK with no limit (Envoy's semantics). A rule matches a
//! descriptor whose entries are exactly the rule's `key` and the keys of its
//! `with` table, in any order: the `with` entries with exactly the values
//! given, and the `key` entry with any value (or only `value`, when set).
//! Matching the whole descriptor, not a subset of it, keeps
//! `[generic_key=chat, user_id=u1]` and `[user_id=u1]` different limits, as
//! Envoy's reference service does. A rule that an earlier rule always wins
//! over is a config error.
//!
//! # Limits
//!
//! - `limit = "user_turns"`: the `key` entry's value is the user id, and
//!   the user's plan's turn bucket (`turns`) pays `hits_addend` turns: the
//!   same bucket turn admission (`POST /v1/runs`) takes from, so Envoy and
//!   the sidecar share one budget. The plan's `shadow` applies.
//! - `rate = { amount, period_ms, burst }`: a named bucket of its own,
//!   one per distinct descriptor (its entries' values), keyed
//!   `{rls:<domain>:<entries>}` in the store (one hash tag, so one Redis
//!   Cluster slot per bucket).
//!
//! Only a user id from a trusted source may reach a `user_turns` rule:
//! Envoy must set the header (or metadata) it reads from a verified
//! identity, such as `jwt_authn`'s `claim_to_headers`; see docs/envoy.md.
//!
//! # The listener
//!
//! Envoy is a peer the operator names; nobody else may spend a user's
//! turns. The service therefore has a listener of its own (`rls_listen`),
//! and with a `key` (or `key_file`) every call must carry it in the
//! `x-tollgate-rls-key` metadata ([`KEY_METADATA`]), compared in constant
//! time. A listener on an address other than loopback needs a key (config
//! validation refuses it otherwise). `max_in_flight` caps the calls it
//! answers at once.
//!
//! # Guards
//!
//! Checked in this order, each before anything is taken:
//!
//! 1. **The key.** With `[rls] key` (or `key_file`) set, a call whose
//!    `x-tollgate-rls-key` metadata is missing or is not the key (compared
//!    in constant time) is `UNAUTHENTICATED`, before its message is read.
//! 2. **The message**: at most [`MAX_MESSAGE_BYTES`] (64 KiB) decoded
//!    (larger: tonic's `OUT_OF_RANGE`), at most [`MAX_DESCRIPTORS`]
//!    descriptors of at most [`MAX_ENTRIES`] entries each, and every entry's
//!    key an id (1–512 bytes, no control characters, [`ops::check_id`]);
//!    otherwise `INVALID_ARGUMENT` naming the field
//!    (`descriptors[i].entries[j].key`) and nothing is decided. These come
//!    from Envoy's route config. Entry *values* may come from a client
//!    (a request header), so one that is not an id fails safe instead: the
//!    whole request is `OVER_LIMIT`, every descriptor refused and nothing
//!    taken (an error would let Envoy's default `failure_mode_deny: false`
//!    pass the request unlimited).
//! 3. **The in-flight cap** (`[rls] max_in_flight`, its own, not the
//!    API's): past it `RESOURCE_EXHAUSTED` (`overloaded`, retry after 1 s)
//!    at once. Envoy's ratelimit filter treats every status other than OK
//!    as a failed call, so `failure_mode_deny` decides the request as for
//!    an outage; the code differs from the store outage's `UNAVAILABLE` so
//!    the two are told apart in `tollgate_grpc_requests_total`, and it is
//!    the code tollgate's own API answers for `overloaded`.
//!
//! # Answers
//!
//! - Each descriptor of the request is matched to the first rule of its
//!   shape and charged its own cost: the descriptor's `hits_addend` if set
//!   (0 takes nothing and reports the bucket), else the request's
//!   `hits_addend`, where 0 (unset) means 1. A descriptor with
//!   `is_negative_hits` is answered as a cost of 0: tollgate gives turns and
//!   bucket tokens back only through settle and refund.
//! - Descriptors are decided one after another, each in one atomic store
//!   step, as Envoy's reference service does: a request that one
//!   descriptor refuses is still counted by the others that granted it. A
//!   refusing descriptor itself takes nothing (SPEC §2).
//! - A descriptor no rule matches, and every descriptor of a request for
//!   another domain, is answered OK with no limit (Envoy's semantics: no
//!   limit is configured for it).
//! - Per descriptor: `code`, `current_limit` (the rate as requests per
//!   SECOND, MINUTE, HOUR or DAY: the period when it is one of those, else
//!   the smallest unit the rate fills a whole number of times, else the
//!   nearest unit, rounded), `limit_remaining` (whole tokens left; 0 when
//!   over the limit) and `duration_until_reset` (until the bucket is full
//!   again; when over the limit, until the same hit would fit: the exact
//!   retry hint).
//! - The overall code is OVER_LIMIT when any descriptor is. Response headers
//!   (`response_headers_to_add`, which Envoy adds to the response it sends):
//!   `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` of the
//!   descriptor with the least remaining, written as Envoy's
//!   `DRAFT_VERSION_03` writes them (reset in whole seconds, rounded up),
//!   unless `rate_limit_headers = false`; and `retry-after` (whole seconds,
//!   rounded up: the largest hint of the refusing descriptors) on OVER_LIMIT.
//! - A `user_turns` descriptor whose user has no plan (and there is no
//!   default plan) is OVER_LIMIT with no limit and no hint: the sidecar
//!   refuses such users too (401).
//! - Shadow (`[rls] shadow = true`): every descriptor is decided and counted
//!   as usual, a would-be refusal takes nothing and is counted
//!   `shadow_denied`, and the answer is OK with no rate-limit headers (the
//!   statuses still carry the counts). A plan in shadow mode does the same
//!   for its users' turns.
//! - A store that cannot be reached answers `UNAVAILABLE` (another store
//!   fault `INTERNAL`), so Envoy's `failure_mode_deny` decides: allow
//!   (the default) or deny with 500. Under `fail_open` the store decides
//!   locally instead. No detail of the fault reaches Envoy; it is logged.
//!
//! Every decision is counted in `tollgate_decisions` with `op="rls"`:
//! `limit` is `turn_rate`, `bucket` or `none` (unmatched), `plan` the
//! user's plan, the bucket rule's name, `unknown` (no plan) or `unmatched`.

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
    MAX_DESCRIPTORS, MAX_ENTRIES, RlsService, RulesHandle, check_request, values_are_ids,
};
