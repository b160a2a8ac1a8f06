//! The service: [`RlsService`] answers `ShouldRateLimit` (the guards,
//! then each descriptor matched to its rule and decided by the limiter).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use parking_lot::RwLock;
use tollgate_core::{Decision, Id, LimiterError, Outcome, ReplicaGate, Store, StoreError, Taken};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::listener::{KeyCheck, RlsGrpcServer, RlsKey, RlsServer};
use super::response::{rate_limit, respond};
use super::rules::{RlsRules, Target};
use crate::grpc::api::MAX_MESSAGE_BYTES;
use crate::outcome::{ApiError, GrpcStatus};
use crate::state::App;

/// Most descriptors one request may carry; more is `INVALID_ARGUMENT`.
pub const MAX_DESCRIPTORS: usize = 16;

/// Most entries one descriptor may carry; more is `INVALID_ARGUMENT`.
pub const MAX_ENTRIES: usize = 16;

/// The method's name in `tollgate_grpc_requests_total`.
pub(super) const METHOD: &str = "ShouldRateLimit";

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

/// Checks the bounds of a request (descriptors, entries, ids) before
/// anything is decided.
///
/// # Errors
///
/// [`ApiError::Invalid`] naming the first field at fault: more than
/// [`MAX_DESCRIPTORS`] descriptors, a descriptor of more than
/// [`MAX_ENTRIES`] entries, an entry key that is not an id
/// ([`tollgate_core::id`]). Values are checked by [`entry_ids`].
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
            if let Err(e) = Id::new(&e.key) {
                return Err(ApiError::invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    e.to_string(),
                ));
            }
        }
    }
    Ok(())
}

/// Each descriptor's entries (key, value) of `req` with every value made
/// an id ([`Id`]), checked once here before anything is decided; `None`:
/// a value is no id, and the request is refused as a whole, OVER_LIMIT.
pub fn entry_ids(req: &RateLimitRequest) -> Option<Vec<Vec<(&str, Id<'_>)>>> {
    req.descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| Some((e.key.as_str(), Id::new(&e.value).ok()?)))
                .collect()
        })
        .collect()
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
pub(super) struct Verdict {
    /// Enforcement refuses it.
    pub(super) over: bool,
    /// A plan in shadow mode let a refusal through.
    pub(super) plan_shadow: bool,
    pub(super) limit: Option<RateLimit>,
    pub(super) remaining: u64,
    pub(super) reset_ms: Option<u64>,
    pub(super) retry_after_ms: Option<u64>,
    /// Metrics labels.
    limit_label: &'static str,
    plan_label: Arc<str>,
    /// The user whose turns it took (a `user_turns` rule), for the audit
    /// log and spans.
    user: Option<Arc<str>>,
}

impl Verdict {
    pub(super) fn unmatched() -> Self {
        Self {
            over: false,
            plan_shadow: false,
            limit: None,
            remaining: 0,
            reset_ms: None,
            retry_after_ms: None,
            limit_label: "none",
            plan_label: "unmatched".into(),
            user: None,
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

    /// The decision as the limiter answered it: refused (remaining 0,
    /// reset and retry at the hint, if any) or granted (reset when the
    /// bucket is full again), the refusal a plan's shadow mode let through
    /// kept as `plan_shadow`.
    fn decided(
        decision: Decision<Taken>,
        limit: RateLimit,
        limit_label: &'static str,
        plan_label: Arc<str>,
    ) -> Self {
        let limit = Some(limit);
        match decision {
            Decision::Allowed {
                grant,
                shadow_denied,
            } => Self {
                over: false,
                plan_shadow: shadow_denied.is_some(),
                limit,
                remaining: grant.remaining,
                reset_ms: Some(grant.full_in_ms),
                retry_after_ms: None,
                limit_label,
                plan_label,
                user: None,
            },
            Decision::Denied(denial) => Self {
                over: true,
                plan_shadow: false,
                limit,
                remaining: 0,
                reset_ms: denial.retry_after_ms(),
                retry_after_ms: denial.retry_after_ms(),
                limit_label,
                plan_label,
                user: None,
            },
        }
    }

    pub(super) fn outcome(&self, shadow: bool) -> Outcome {
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
    /// validation keeps it at most [`MAX_MAX_IN_FLIGHT`](super::MAX_MAX_IN_FLIGHT)).
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
    pub async fn decide(
        &self,
        req: &RateLimitRequest,
        ctx: &crate::audit::RequestContext,
    ) -> Result<RateLimitResponse, Status> {
        check_request(req).map_err(|e| e.to_status())?;
        let _place = self.gate.try_acquire().map_err(|_| {
            tracing::debug!("rate-limit service: at its in-flight cap");
            ApiError::Overloaded.to_status()
        })?;
        let rules = self.rules();
        let mut verdicts = Vec::with_capacity(req.descriptors.len());
        let Some(descriptors) = entry_ids(req) else {
            tracing::debug!("rate-limit service: a descriptor value is not an id; refused");
            for _ in &req.descriptors {
                let v = Verdict::refused("invalid_value", "invalid");
                self.observe(&v, false, ctx);
                verdicts.push(v);
            }
            return Ok(respond(&rules, &verdicts));
        };
        for (d, entries) in req.descriptors.iter().zip(&descriptors) {
            let v = if req.domain == rules.domain() {
                self.judge(&rules, d, entries, req.hits_addend).await?
            } else {
                Verdict::unmatched()
            };
            self.observe(&v, rules.shadow(), ctx);
            verdicts.push(v);
        }
        Ok(respond(&rules, &verdicts))
    }

    /// Counts the verdict, and traces and audits it when those are on
    /// ([`crate::observe`]: the user for a `user_turns` rule, none for a
    /// bucket, whose rule name is the plan field).
    fn observe(&self, v: &Verdict, shadow: bool, ctx: &crate::audit::RequestContext) {
        crate::observe::decision(
            &self.app,
            &crate::observe::Observed {
                op: "rls",
                limit: v.limit_label,
                outcome: v.outcome(shadow).as_str(),
                plan: &v.plan_label,
                user: v.user.as_deref(),
                wait_ms: 0,
                retry_after_ms: v.retry_after_ms,
            },
            Some(ctx),
        );
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
        entries: &[(&str, Id<'_>)],
        request_hits: u32,
    ) -> Result<Verdict, Status> {
        let Some(m) = rules.find(entries) else {
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
                let decision = self
                    .app
                    .limiter()
                    .take_bucket(&key, spec, cost)
                    .await
                    .map_err(|e| self.store_failed(&e))?;
                Ok(Verdict::decided(
                    decision,
                    rate_limit(&spec, name),
                    "bucket",
                    name.clone(),
                ))
            }
            (Target::Bucket(_), None) => Ok(Verdict::unmatched()),
        }
    }

    async fn judge_turns(
        &self,
        user: Id<'_>,
        cost: u64,
        name: &Arc<str>,
    ) -> Result<Verdict, Status> {
        // One snapshot of the user's plan: the decision, the answer's
        // limit and the metrics' plan follow one config.
        let u = match self.app.limiter().user(user) {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "rate-limit service: no plan for this user id");
                return Ok(Verdict::refused("turn_rate", "unknown"));
            }
        };
        let limit = rate_limit(&u.plan().turns, name);
        let plan_label = u.plan().name.clone();
        let v = match u.take_turns(cost).await {
            Ok(decision) => Verdict::decided(decision, limit, "turn_rate", plan_label),
            Err(LimiterError::Store(e)) => return Err(self.store_failed(&e)),
            Err(e) => {
                tracing::debug!(error = %e, "rate-limit service: turns not taken");
                Verdict::refused("turn_rate", &plan_label)
            }
        };
        Ok(Verdict {
            user: Some(user.as_str().into()),
            ..v
        })
    }
}

#[tonic::async_trait]
impl<S: Store + Clone> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // A refusal's audit line and a decision's span need the caller's
        // trace (Envoy forwards it when its tracing is on); neither is
        // built when both are off.
        let ctx = if self.app.telemetry().is_some() || self.app.audit().is_some() {
            crate::audit::from_headers(
                &request.metadata().clone().into_headers(),
                self.app.clock().now_ms(),
            )
        } else {
            crate::audit::RequestContext::default()
        };
        let answer = self.decide(request.get_ref(), &ctx).await;
        let code = answer
            .as_ref()
            .map_or_else(Status::code, |_| tonic::Code::Ok);
        self.app.metrics().grpc_request(METHOD, code);
        answer.map(Response::new)
    }
}
