//! Envoy's rate-limit service, `envoy.service.ratelimit.v3.RateLimitService`
//! (`ShouldRateLimit`), answered from tollgate's limits as `[rls]` maps them
//! ([`crate::rls`]), on a listener of its own (`rls_listen`): never on the
//! API's gRPC port.
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

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use parking_lot::RwLock;
use tollgate_core::bucket::Take;
use tollgate_core::store::{BucketRef, TakeRequest};
use tollgate_core::{BucketSpec, Decision, LimiterError, Outcome, ReplicaGate, Store, StoreError};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

pub use super::api::MAX_MESSAGE_BYTES;
use crate::metrics::DecisionLabels;
use crate::ops;
use crate::outcome::{ApiError, GrpcStatus};
use crate::rls::{KEY_METADATA, RlsKey, RlsRules, RlsServer, Target};
use crate::state::App;

/// Most descriptors one request may carry; more is `INVALID_ARGUMENT`.
pub const MAX_DESCRIPTORS: usize = 16;

/// Most entries one descriptor may carry; more is `INVALID_ARGUMENT`.
pub const MAX_ENTRIES: usize = 16;

/// The method's name in `tollgate_grpc_requests_total`.
const METHOD: &str = "ShouldRateLimit";

/// Envoy's rate-limit service over an [`App`]'s limiter and store.
/// Cloning shares it (its rules and its in-flight cap);
/// [`set_rules`](Self::set_rules) swaps the rules for every clone (a config
/// reload).
pub struct RlsService<S> {
    app: App<S>,
    rules: Arc<RwLock<Arc<RlsRules>>>,
    key: Option<RlsKey>,
    gate: ReplicaGate,
}

impl<S> Clone for RlsService<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            rules: self.rules.clone(),
            key: self.key.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<S> std::fmt::Debug for RlsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService")
            .field("rules", &*self.rules.read())
            .field("key", &self.key)
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

/// Refuses a call without the service's key (`x-tollgate-rls-key`) before
/// its message is read: `UNAUTHENTICATED`, counted in
/// `tollgate_grpc_requests_total`. With no key configured every call
/// passes.
pub struct KeyCheck<S> {
    app: App<S>,
    key: Option<RlsKey>,
}

impl<S> Clone for KeyCheck<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S> std::fmt::Debug for KeyCheck<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCheck")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone> Interceptor for KeyCheck<S> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(key) = &self.key else {
            return Ok(request);
        };
        match request.metadata().get(KEY_METADATA) {
            Some(v) if key.matches(v.as_bytes()) => {
                // Checked: the key goes no further than here.
                request.metadata_mut().remove(KEY_METADATA);
                Ok(request)
            }
            presented => {
                tracing::debug!(
                    key_sent = presented.is_some(),
                    "rate-limit service: call refused, no valid {KEY_METADATA}"
                );
                let status = ApiError::Unauthorized(format!(
                    "the rate-limit service needs the {KEY_METADATA} metadata"
                ))
                .to_status();
                self.app.metrics().grpc_request(METHOD, status.code());
                Err(status)
            }
        }
    }
}

/// The tonic server of [`RlsService`]: the key check, then messages of at
/// most [`MAX_MESSAGE_BYTES`].
pub type RlsGrpcServer<S> = InterceptedService<RateLimitServiceServer<RlsService<S>>, KeyCheck<S>>;

/// Checks the bounds of a request (descriptors, entries, ids) before
/// anything is decided.
///
/// # Errors
///
/// [`ApiError::Invalid`] naming the first field at fault: more than
/// [`MAX_DESCRIPTORS`] descriptors, a descriptor of more than
/// [`MAX_ENTRIES`] entries, an entry key that is not an id
/// ([`ops::check_id`]). Values are checked by [`values_are_ids`].
pub fn check_request(req: &RateLimitRequest) -> Result<(), ApiError> {
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(ApiError::invalid(
            "descriptors",
            format!(
                "at most {MAX_DESCRIPTORS} descriptors per request (got {})",
                req.descriptors.len()
            ),
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(ApiError::invalid(
                format!("descriptors[{i}].entries"),
                format!(
                    "at most {MAX_ENTRIES} entries per descriptor (got {})",
                    d.entries.len()
                ),
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            // The field is named only on a refusal: no allocation per entry
            // on the way through.
            if let Err(e) = ops::check_id("", &e.key) {
                let message = match e {
                    ApiError::Invalid { message, .. } => message,
                    _ => "is not a valid id".to_owned(),
                };
                return Err(ApiError::invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    message,
                ));
            }
        }
    }
    Ok(())
}

/// Whether every entry value of `req` is an id ([`ops::check_id`]): a
/// request with one that is not is refused as a whole, OVER_LIMIT.
pub fn values_are_ids(req: &RateLimitRequest) -> bool {
    req.descriptors
        .iter()
        .flat_map(|d| &d.entries)
        .all(|e| ops::check_id("", &e.value).is_ok())
}

/// Swaps the rules of the [`RlsService`] it came from and of all its
/// clones, without keeping the service alive: for a config reload hook.
#[derive(Clone)]
pub struct RulesHandle(Arc<RwLock<Arc<RlsRules>>>);

impl RulesHandle {
    /// Swaps in `rules`; requests in flight finish with the rules they
    /// started with.
    pub fn set(&self, rules: RlsRules) {
        *self.0.write() = Arc::new(rules);
    }
}

impl std::fmt::Debug for RulesHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RulesHandle").field(&*self.0.read()).finish()
    }
}

/// One descriptor's decision, before shadow mode rewrites it.
struct Verdict {
    /// Enforcement refuses it.
    over: bool,
    /// A plan in shadow mode let a refusal through.
    plan_shadow: bool,
    limit: Option<RateLimit>,
    remaining: u64,
    reset_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    /// Metrics labels.
    limit_label: &'static str,
    plan_label: Arc<str>,
}

impl Verdict {
    fn unmatched() -> Self {
        Self {
            over: false,
            plan_shadow: false,
            limit: None,
            remaining: 0,
            reset_ms: None,
            retry_after_ms: None,
            limit_label: "none",
            plan_label: "unmatched".into(),
        }
    }

    /// OVER_LIMIT with no limit to report (an unknown user, a bad value).
    fn refused(limit_label: &'static str, plan_label: &str) -> Self {
        Self {
            over: true,
            plan_label: plan_label.into(),
            limit_label,
            ..Self::unmatched()
        }
    }

    fn outcome(&self, shadow: bool) -> Outcome {
        match (self.over, shadow, self.plan_shadow) {
            (true, true, _) | (false, _, true) => Outcome::ShadowDenied,
            (true, false, _) => Outcome::Denied,
            (false, _, false) => Outcome::Allowed,
        }
    }
}

impl<S: Store + Clone> RlsService<S> {
    /// A service deciding with `app`'s limiter (the users' plans) and store
    /// (named buckets) as `rules` say, with no key and the default
    /// in-flight cap ([`RlsServer::default`]); see
    /// [`with_server`](Self::with_server).
    pub fn new(app: App<S>, rules: RlsRules) -> Self {
        Self {
            app,
            rules: Arc::new(RwLock::new(Arc::new(rules))),
            key: None,
            gate: ReplicaGate::new(RlsServer::default().max_in_flight),
        }
    }

    /// The same guarded as `server` says: its key (required of every call)
    /// and its in-flight cap (a fresh one, not shared with earlier clones).
    ///
    /// # Panics
    ///
    /// If `server.max_in_flight` exceeds tokio's semaphore limit (config
    /// validation keeps it at most [`crate::rls::MAX_MAX_IN_FLIGHT`]).
    #[track_caller]
    pub fn with_server(self, server: RlsServer) -> Self {
        Self {
            key: server.key,
            gate: ReplicaGate::new(server.max_in_flight),
            ..self
        }
    }

    /// The service's in-flight cap (every clone shares it).
    pub fn gate(&self) -> &ReplicaGate {
        &self.gate
    }

    /// Swaps in new rules for every clone; requests in flight finish with
    /// the rules they started with.
    pub fn set_rules(&self, rules: RlsRules) {
        self.rules_handle().set(rules);
    }

    /// A handle that swaps this service's rules (see [`RulesHandle`]).
    pub fn rules_handle(&self) -> RulesHandle {
        RulesHandle(self.rules.clone())
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RlsRules> {
        self.rules.read().clone()
    }

    /// The tonic service to add to a server: the key check ([`KeyCheck`]),
    /// then messages of at most [`MAX_MESSAGE_BYTES`], then
    /// [`decide`](Self::decide).
    pub fn into_server(self) -> RlsGrpcServer<S> {
        let check = KeyCheck {
            app: self.app.clone(),
            key: self.key.clone(),
        };
        InterceptedService::new(
            RateLimitServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES),
            check,
        )
    }

    /// Answers one `ShouldRateLimit` request once its key was checked (the
    /// transport-free core of the service): its bounds
    /// ([`check_request`]), a place under the in-flight cap, then each
    /// descriptor.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` past the bounds (nothing decided),
    /// `RESOURCE_EXHAUSTED` over the in-flight cap, `UNAVAILABLE` when the
    /// store cannot be reached, `INTERNAL` on another store fault.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        check_request(req).map_err(|e| e.to_status())?;
        let _place = self.gate.try_acquire().map_err(|_| {
            tracing::debug!("rate-limit service: at its in-flight cap");
            ApiError::Overloaded.to_status()
        })?;
        let rules = self.rules();
        let mut verdicts = Vec::with_capacity(req.descriptors.len());
        if !values_are_ids(req) {
            tracing::debug!("rate-limit service: a descriptor value is not an id; refused");
            for _ in &req.descriptors {
                let v = Verdict::refused("invalid_value", "invalid");
                self.count(&v, false);
                verdicts.push(v);
            }
            return Ok(respond(&rules, &verdicts));
        }
        for d in &req.descriptors {
            let v = if req.domain == rules.domain() {
                self.judge(&rules, d, req.hits_addend).await?
            } else {
                Verdict::unmatched()
            };
            self.count(&v, rules.shadow());
            verdicts.push(v);
        }
        Ok(respond(&rules, &verdicts))
    }

    fn count(&self, v: &Verdict, shadow: bool) {
        self.app
            .metrics()
            .decisions
            .get_or_create(&DecisionLabels {
                op: "rls",
                limit: v.limit_label,
                outcome: v.outcome(shadow).as_str(),
                plan: Arc::clone(&v.plan_label),
            })
            .inc();
    }

    fn store_failed(&self, e: &StoreError) -> Status {
        self.app.metrics().store_errors.inc();
        if e.is_transient() {
            // The failover logs the outage once; each refused call is a metric.
            tracing::debug!(error = %e, "rate-limit service: store unavailable");
            Status::unavailable("tollgate: store unavailable")
        } else if e.is_full() {
            // As the API's `store_full`; Envoy's failure_mode_deny decides.
            tracing::warn!(error = %e, "rate-limit service: store full");
            Status::resource_exhausted("tollgate: store full")
        } else {
            tracing::warn!(error = %e, "rate-limit service: store fault");
            Status::internal("tollgate: store error")
        }
    }

    async fn judge(
        &self,
        rules: &RlsRules,
        d: &RateLimitDescriptor,
        request_hits: u32,
    ) -> Result<Verdict, Status> {
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let Some(m) = rules.find(&entries) else {
            return Ok(Verdict::unmatched());
        };
        let cost = if d.is_negative_hits {
            0
        } else {
            d.hits_addend
                .map_or(u64::from(request_hits.max(1)), |h| h.value)
        };
        let name = m.rule.name();
        match (m.rule.target(), m.bucket_key) {
            (Target::UserTurns, _) => self.judge_turns(m.value, cost, name).await,
            (Target::Bucket(spec), Some(key)) => {
                let out = self
                    .app
                    .store()
                    .take_one(TakeRequest {
                        bucket: BucketRef::Named(&key),
                        spec,
                        cost,
                    })
                    .await
                    .map_err(|e| self.store_failed(&e))?;
                let limit = Some(rate_limit(&spec, name));
                let (over, remaining, reset_ms, retry_after_ms) = match out.take {
                    Take::Granted { .. } => (false, out.remaining, Some(out.full_in_ms), None),
                    Take::Refused { retry_after_ms } => {
                        (true, 0, Some(retry_after_ms), Some(retry_after_ms))
                    }
                    Take::ExceedsCapacity => (true, 0, None, None),
                };
                Ok(Verdict {
                    over,
                    plan_shadow: false,
                    limit,
                    remaining,
                    reset_ms,
                    retry_after_ms,
                    limit_label: "bucket",
                    plan_label: name.clone(),
                })
            }
            (Target::Bucket(_), None) => Ok(Verdict::unmatched()),
        }
    }

    async fn judge_turns(&self, user: &str, cost: u64, name: &Arc<str>) -> Result<Verdict, Status> {
        let limiter = self.app.limiter();
        let plan = match limiter.plan_for(user) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "rate-limit service: no plan for this user id");
                return Ok(Verdict::refused("turn_rate", "unknown"));
            }
        };
        let limit = Some(rate_limit(&plan.turns, name));
        let plan_label = plan.name.clone();
        let v = match limiter.take_turns(user, cost).await {
            Ok(Decision::Allowed {
                grant,
                shadow_denied,
            }) => Verdict {
                over: false,
                plan_shadow: shadow_denied.is_some(),
                limit,
                remaining: grant.remaining,
                reset_ms: Some(grant.full_in_ms),
                retry_after_ms: None,
                limit_label: "turn_rate",
                plan_label,
            },
            Ok(Decision::Denied(denial)) => Verdict {
                over: true,
                plan_shadow: false,
                limit,
                remaining: 0,
                reset_ms: denial.retry_after_ms(),
                retry_after_ms: denial.retry_after_ms(),
                limit_label: "turn_rate",
                plan_label,
            },
            Err(LimiterError::Store(e)) => return Err(self.store_failed(&e)),
            Err(e) => {
                tracing::debug!(error = %e, "rate-limit service: turns not taken");
                Verdict::refused("turn_rate", &plan_label)
            }
        };
        Ok(v)
    }
}

#[tonic::async_trait]
impl<S: Store + Clone> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let answer = self.decide(request.get_ref()).await;
        let code = answer
            .as_ref()
            .map_or_else(Status::code, |_| tonic::Code::Ok);
        self.app.metrics().grpc_request(METHOD, code);
        answer.map(Response::new)
    }
}

fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Envoy's units, ms each.
const UNITS: [(u64, Unit); 4] = [
    (1_000, Unit::Second),
    (60_000, Unit::Minute),
    (3_600_000, Unit::Hour),
    (86_400_000, Unit::Day),
];

/// A rate as requests per Envoy unit: the period's own unit when it is
/// one; else the smallest unit the rate fills a whole number of times (10
/// per 30 s is 20 per MINUTE); else the unit nearest the period, the count
/// rounded (at least 1).
pub fn per_unit(spec: &BucketSpec) -> (u32, Unit) {
    let (amount, period) = (u128::from(spec.amount()), u128::from(spec.period_ms()));
    if let Some((_, unit)) = UNITS.iter().find(|(ms, _)| u128::from(*ms) == period)
        && amount <= u128::from(u32::MAX)
    {
        return (amount as u32, *unit);
    }
    for (ms, unit) in UNITS {
        let scaled = amount * u128::from(ms);
        if scaled % period == 0 && scaled / period <= u128::from(u32::MAX) {
            return (clamp_u32((scaled / period) as u64), unit);
        }
    }
    let (ms, unit) = UNITS
        .into_iter()
        .min_by(|(a, _), (b, _)| {
            let da = (*a as f64 / period as f64).ln().abs();
            let db = (*b as f64 / period as f64).ln().abs();
            da.total_cmp(&db)
        })
        .unwrap_or(UNITS[0]);
    let n = (amount * u128::from(ms) + period / 2) / period;
    (clamp_u32(n.max(1).min(u128::from(u32::MAX)) as u64), unit)
}

fn rate_limit(spec: &BucketSpec, name: &str) -> RateLimit {
    let (requests_per_unit, unit) = per_unit(spec);
    RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

fn window_secs(unit: i32) -> u64 {
    UNITS
        .iter()
        .find(|(_, u)| *u as i32 == unit)
        .map_or(0, |(ms, _)| ms / 1_000)
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

/// The response for `verdicts`, one status each, under `rules`' shadow
/// and header settings.
fn respond(rules: &RlsRules, verdicts: &[Verdict]) -> RateLimitResponse {
    let shadow = rules.shadow();
    let over = !shadow && verdicts.iter().any(|v| v.over);
    let statuses: Vec<DescriptorStatus> = verdicts
        .iter()
        .map(|v| DescriptorStatus {
            code: if v.over && !shadow {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: v.limit.clone(),
            limit_remaining: clamp_u32(v.remaining),
            duration_until_reset: v.reset_ms.map(duration),
            quota: None,
        })
        .collect();
    let mut headers = Vec::new();
    if rules.rate_limit_headers() && !shadow {
        headers.extend(rate_limit_headers(verdicts));
    }
    if over
        && let Some(ms) = verdicts
            .iter()
            .filter(|v| v.over)
            .filter_map(|v| v.retry_after_ms)
            .max()
    {
        headers.push(header("retry-after", ms.div_ceil(1_000).max(1).to_string()));
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// `x-ratelimit-*` as Envoy's `DRAFT_VERSION_03` writes them: the limit,
/// remaining and reset of the descriptor with the least remaining (the first
/// on ties), and every limit's quota policy (`, 20;w=60;name="user_id"`).
fn rate_limit_headers(verdicts: &[Verdict]) -> Vec<HeaderValue> {
    let limited: Vec<(&Verdict, &RateLimit)> = verdicts
        .iter()
        .filter_map(|v| v.limit.as_ref().map(|l| (v, l)))
        .collect();
    let Some(&(least, least_limit)) = limited.iter().min_by_key(|(v, _)| clamp_u32(v.remaining))
    else {
        return Vec::new();
    };
    let mut limit = least_limit.requests_per_unit.to_string();
    for (_, l) in &limited {
        let w = window_secs(l.unit);
        if w > 0 {
            limit.push_str(&format!(", {};w={w}", l.requests_per_unit));
            if !l.name.is_empty() {
                limit.push_str(&format!(";name=\"{}\"", l.name));
            }
        }
    }
    vec![
        header("x-ratelimit-limit", limit),
        header(
            "x-ratelimit-remaining",
            clamp_u32(least.remaining).to_string(),
        ),
        header(
            "x-ratelimit-reset",
            least.reset_ms.unwrap_or(0).div_ceil(1_000).to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(amount: u64, period_ms: u64) -> BucketSpec {
        BucketSpec::new(amount, period_ms, amount).unwrap()
    }

    #[test]
    fn rates_map_to_envoy_units() {
        assert_eq!(per_unit(&spec(20, 60_000)), (20, Unit::Minute));
        assert_eq!(per_unit(&spec(5, 1_000)), (5, Unit::Second));
        assert_eq!(per_unit(&spec(1_000, 86_400_000)), (1_000, Unit::Day));
        // Exact in a larger unit.
        assert_eq!(per_unit(&spec(10, 30_000)), (20, Unit::Minute));
        assert_eq!(per_unit(&spec(1, 2_000)), (30, Unit::Minute));
        assert_eq!(per_unit(&spec(5, 100)), (50, Unit::Second));
        assert_eq!(per_unit(&spec(60, 3_600_000)), (60, Unit::Hour));
        // Not exact anywhere: the nearest unit, rounded, at least 1.
        assert_eq!(per_unit(&spec(3, 7)), (429, Unit::Second));
        assert_eq!(per_unit(&spec(1, 7 * 86_400_000)), (1, Unit::Day));
        assert_eq!(per_unit(&spec(7, 7_000_000)), (4, Unit::Hour));
    }

    #[test]
    fn durations_split_ms() {
        assert_eq!(
            duration(2_500),
            Duration {
                seconds: 2,
                nanos: 500_000_000
            }
        );
    }

    #[test]
    fn shadow_outcomes() {
        let mut v = Verdict::unmatched();
        assert_eq!(v.outcome(false), Outcome::Allowed);
        assert_eq!(v.outcome(true), Outcome::Allowed);
        v.over = true;
        assert_eq!(v.outcome(false), Outcome::Denied);
        assert_eq!(v.outcome(true), Outcome::ShadowDenied);
        v.over = false;
        v.plan_shadow = true;
        assert_eq!(v.outcome(false), Outcome::ShadowDenied);
    }
}
