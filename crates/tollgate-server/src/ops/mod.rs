//! The operations of SPEC §8, apart from any transport: the HTTP/JSON
//! handlers ([`crate::http::routes`]) and the gRPC methods
//! ([`crate::grpc::api`]) both call these, so both answer with the same
//! outcome, the same refusal ([`ApiError`], mapped once in
//! [`crate::outcome`]) and the same metrics and logs.
//!
//! Every operation takes the verified user (never a field the client
//! chose) and the request as plain data, validates every field first (a
//! refusal for bad input changes nothing), then decides. The request and
//! answer types are those of the JSON bodies; the gRPC messages of
//! `proto/tollgate/v1/tollgate.proto` carry the same fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::limiter::ModelRef;
use tollgate_core::money::TokenSplit;
use tollgate_core::session::{SessionAdmit, SessionLease, check_ttl, session_key};
use tollgate_core::store::Release;
use tollgate_core::{Decision, ForUser, Id, Limit, ReplicaPermit, ReservationId, Reserve, Store};
use tollgate_provider::{Feedback, PermitRequest};
use utoipa::ToSchema;

use crate::identity::Identity;
use crate::outcome::ApiError;
use crate::state::App;

/// Session lease TTL when admitting a run (`POST /v1/runs`, `AdmitRun`)
/// names a session without one, and the longest accepted, ms (the rules
/// of `tollgate_core::session`).
pub use tollgate_core::session::{DEFAULT_SESSION_TTL_MS, MAX_SESSION_TTL_MS};
/// Largest token count accepted in a request (2^53: exact everywhere).
pub const MAX_TOKENS: u64 = 1 << 53;
/// Longest id accepted (invocation, session, holder, reservation,
/// provider, model, tenant), characters: the one id rule of core.
pub use tollgate_core::id::MAX_ID_LEN as MAX_ID;

mod wire;
pub use wire::*;

/// A request's place under the replica's in-flight cap (SPEC §1), shared by
/// HTTP and gRPC: taken with [`enter`], freed when dropped. It keeps
/// `tollgate_requests_in_flight` current.
#[must_use = "the place is freed as soon as this is dropped"]
#[clippy::has_significant_drop]
pub struct InFlight<'a, S: Store + Clone> {
    app: &'a App<S>,
    _permit: ReplicaPermit,
}

/// Takes a place under the replica's in-flight cap, or refuses with
/// [`ApiError::Overloaded`] at once (never waits).
///
/// # Errors
///
/// [`ApiError::Overloaded`]: the replica is at its cap.
pub fn enter<S: Store + Clone>(app: &App<S>) -> Result<InFlight<'_, S>, ApiError> {
    let permit = app.gate().try_acquire().map_err(|_| ApiError::Overloaded)?;
    app.metrics()
        .requests_in_flight
        .set(app.gate().in_flight() as i64);
    Ok(InFlight {
        app,
        _permit: permit,
    })
}

impl<S: Store + Clone> Drop for InFlight<'_, S> {
    fn drop(&mut self) {
        // The permit is still held here (fields drop after this body).
        self.app
            .metrics()
            .requests_in_flight
            .set(self.app.gate().in_flight().saturating_sub(1) as i64);
    }
}

/// A place for one more `wait=true` request of `user` (SPEC §8: at most
/// `[limits] max_waits_per_user` of one user, `max_waiting` of all), held
/// while it waits.
///
/// # Errors
///
/// [`ApiError::TooManyWaits`]: nothing is decided.
fn wait_place<S: Store + Clone>(
    app: &App<S>,
    user: &str,
) -> Result<crate::edge::WaitPlace, ApiError> {
    app.waits().enter(user).map_err(|e| {
        tracing::info!(user, "wait=true refused: {e}");
        ApiError::TooManyWaits(e)
    })
}

/// The verified user of a request with `headers` (HTTP headers, or gRPC
/// metadata as headers): `authorization: Bearer <JWT>`, or the trusted
/// header when that mode is on.
///
/// # Errors
///
/// [`ApiError::Unauthorized`]: no verified identity.
pub fn verify_caller<S: Store + Clone>(
    app: &App<S>,
    headers: &axum::http::HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<Identity, ApiError> {
    app.verifier()
        .identify(headers, peer)
        .map_err(|e| ApiError::Unauthorized(e.message()))
}

/// `v` as an id, checked once here by the one id rule
/// ([`tollgate_core::id`]): non-empty, at most [`MAX_ID`] characters, no
/// control characters. Every id of a request is made one where the request
/// enters, and travels as an [`Id`] from there.
///
/// # Errors
///
/// [`ApiError::Invalid`] naming `field`.
pub fn id<'a>(field: &str, v: &'a str) -> Result<Id<'a>, ApiError> {
    Id::new(v).map_err(|e| ApiError::invalid(field, e.to_string()))
}

fn optional_id<'a>(field: &str, v: Option<&'a str>) -> Result<Option<Id<'a>>, ApiError> {
    v.map(|v| id(field, v)).transpose()
}

/// The first step of every session lease operation (an admission naming
/// a session, an acquire, a renew, a release): counts session
/// `session_id` among `user`'s live sessions (SPEC §4) for a lease of
/// `ttl_ms` (0: a release) and answers the session's store key. `create`
/// for an acquire, which past the plan's `max_sessions` is refused
/// (`sessions`); not for a renew or release, which only extend a claim
/// that exists. Always before the session step: the count may then only
/// over-estimate the user's session records.
async fn counted_session<S: Store + Clone>(
    app: &App<S>,
    user: &ForUser<'_, '_, S>,
    session_id: Id<'_>,
    ttl_ms: u64,
    create: bool,
) -> Result<String, ApiError> {
    let decision = user.claim_session(session_id, ttl_ms, create).await?;
    observe(app, "session", user, &decision);
    match decision {
        Decision::Allowed { .. } => Ok(session_key(&user.id(), &session_id)),
        Decision::Denied(d) => Err(ApiError::denied_at(d, app.limiter().clock().now_ms())),
    }
}

fn tokens(field: &str, v: u64) -> Result<u64, ApiError> {
    if v > MAX_TOKENS {
        return Err(ApiError::invalid(
            field,
            format!("must be at most {MAX_TOKENS}"),
        ));
    }
    Ok(v)
}

/// The token split of a reserve or settle (each part at most 2^53), if any
/// part is given: it prices the call for cost budgets.
fn split(
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
) -> Result<Option<TokenSplit>, ApiError> {
    if input.is_none() && output.is_none() && cached.is_none() {
        return Ok(None);
    }
    Ok(Some(TokenSplit::new(
        tokens("input_tokens", input.unwrap_or(0))?,
        tokens("output_tokens", output.unwrap_or(0))?,
        tokens("cached_input_tokens", cached.unwrap_or(0))?,
    )))
}

fn optional_tokens(field: &str, v: Option<u64>) -> Result<Option<u64>, ApiError> {
    v.map(|v| tokens(field, v)).transpose()
}

/// Longest reservation id, bytes: `f<tag>.<call>.<invocation_id>`, a
/// fallback tag (`f` and 8 hex digits, and a dot), a u64 (at most 20
/// digits), a dot and an id of at most [`MAX_ID`] characters of at most 4
/// bytes each.
const MAX_RESERVATION_ID: usize = 4 * MAX_ID + 31;

/// The reservation id `v` names; its run id is checked by the limiter's
/// settle or refund (once).
fn reservation(v: &str) -> Result<ReservationId, ApiError> {
    if v.len() > MAX_RESERVATION_ID {
        return Err(ApiError::invalid(
            "reservation_id",
            format!("must be at most {MAX_RESERVATION_ID} bytes"),
        ));
    }
    v.parse()
        .map_err(|e: tollgate_core::store::MalformedReservationId| {
            ApiError::invalid("reservation_id", e.to_string())
        })
}

/// Counts a decision: by operation, refusing limit, outcome and the plan
/// that decided it (never the user), and logs refusals with the user id
/// (logs may carry it).
fn observe<S: Store + Clone, T: tollgate_core::decision::Waited>(
    app: &App<S>,
    op: &'static str,
    user: &ForUser<'_, '_, S>,
    decision: &Decision<T>,
) {
    let denial = decision.denial();
    let observed = crate::observe::Observed {
        op,
        limit: denial.map_or("none", |d| d.limit().as_str()),
        outcome: decision.outcome().as_str(),
        plan: &user.plan().name,
        user: Some(user.id().as_str()),
        wait_ms: match decision {
            Decision::Allowed { grant, .. } => grant.wait_ms(),
            Decision::Denied(_) => 0,
        },
        retry_after_ms: denial.and_then(tollgate_core::Denial::retry_after_ms),
    };
    crate::observe::decision(app, &observed, crate::audit::current().as_ref());
    if let Some(d) = denial {
        let (user, outcome, limit, plan) = (
            user.id().as_str(),
            observed.outcome,
            observed.limit,
            &observed.plan,
        );
        tracing::info!(user, op, outcome, limit, plan = %plan, "{d}");
    }
}

/// Admits a turn of run `req.invocation_id` for `user` (turn rate and
/// concurrency, SPEC §3), holding the session lease of `req.session_id`
/// for it when one is named (released again if the turn is refused).
///
/// # Errors
///
/// `turn_rate` / `concurrency` / `sessions` ([`ApiError::Denied`]), `session_busy`,
/// invalid input, a store fault.
pub async fn admit_run<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    req: AdmitRequest,
) -> Result<Shadowed<AdmitResponse>, ApiError> {
    let invocation_id = id("invocation_id", &req.invocation_id)?;
    // Checked even when no session is named: a field out of its range is
    // refused wherever it appears.
    let ttl = check_ttl(
        "session_ttl_ms",
        req.session_ttl_ms.unwrap_or(DEFAULT_SESSION_TTL_MS),
    )?;
    let session_id = optional_id("session_id", req.session_id.as_deref())?;
    // The plans in force as the turn is admitted, read once, before
    // anything is taken: the session count, the decision, the answer and
    // the metrics all follow them, whatever a reload does meanwhile.
    let u = app.limiter().user(user)?;
    let plan = u.plan();
    let key = match session_id {
        Some(sid) => Some(counted_session(app, &u, sid, ttl, true).await?),
        None => None,
    };
    let lease = key.as_deref().map(|key| SessionLease { key, ttl_ms: ttl });
    let decision = match u.admit_turn_in_session(invocation_id, lease).await? {
        SessionAdmit::Decided(d) => d,
        SessionAdmit::Busy { retry_after_ms } => {
            return Err(ApiError::SessionBusy { retry_after_ms });
        }
    };
    observe(app, "admit", &u, &decision);
    match decision {
        Decision::Allowed {
            grant,
            shadow_denied,
        } => {
            // Only a real lease is counted; a turn only shadow mode let
            // through holds none.
            if shadow_denied.is_none() {
                let (user, inv, exp, now) = (
                    user.as_str(),
                    invocation_id.as_str(),
                    grant.run.expires_at_ms,
                    app.clock().now_ms(),
                );
                if grant.run.refreshed {
                    app.runs().renewed(user, inv, exp, now);
                } else {
                    app.runs().started(user, inv, exp, now);
                }
            }
            app.metrics()
                .sync_reclaimed(app.limiter().reclaimed_leases());
            Ok(Shadowed {
                value: AdmitResponse {
                    lease_expires_at_ms: grant.run.expires_at_ms,
                    lease_ttl_ms: plan.lease_ttl_ms,
                    estimate_tokens: plan.estimate_tokens,
                    max_wait_ms: plan.max_wait_ms,
                    max_llm_calls: plan.max_llm_calls,
                    session: grant.session.map(Into::into),
                },
                shadow_denied: shadow_denied.map(|d| d.limit()),
            })
        }
        Decision::Denied(d) => Err(ApiError::denied_at(d, app.limiter().clock().now_ms())),
    }
}

/// Releases run `invocation_id` of `user` (idempotent: `released` is
/// `false` when it held nothing), and the session lease of `session_id`
/// the run holds, if named.
///
/// # Errors
///
/// Invalid input, a store fault.
pub async fn release_run<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    invocation_id: &str,
    session_id: Option<&str>,
) -> Result<ReleasedResponse, ApiError> {
    // Validate everything before acting: bad input must change nothing.
    let invocation_id = id("invocation_id", invocation_id)?;
    let session_id = optional_id("session_id", session_id)?;
    let outcome = app.limiter().release_run(user, invocation_id).await?;
    // Even when the store held nothing (it expired, or fail-open admitted it
    // locally) or the release is pending: the run is over either way.
    app.runs()
        .ended(&user, &invocation_id, app.clock().now_ms());
    if let Some(sid) = session_id {
        let u = app.limiter().user(user)?;
        let key = counted_session(app, &u, sid, 0, false).await?;
        app.limiter().release_session(&key, &invocation_id).await?;
    }
    Ok(ReleasedResponse {
        released: outcome.released(),
        pending: outcome == Release::Pending,
    })
}

/// Renews the run lease of `invocation_id`.
///
/// # Errors
///
/// `lease_lost`, invalid input, a store fault.
pub async fn renew_run<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    invocation_id: &str,
) -> Result<RenewResponse, ApiError> {
    let invocation_id = id("invocation_id", invocation_id)?;
    let now = app.clock().now_ms();
    match app.limiter().renew_run(user, invocation_id).await? {
        Some(exp) => {
            app.runs().renewed(&user, &invocation_id, exp, now);
            Ok(RenewResponse {
                lease_expires_at_ms: exp,
            })
        }
        None => {
            app.runs().ended(&user, &invocation_id, now);
            Err(ApiError::LeaseLost)
        }
    }
}

/// Reserves `req.estimate` tokens for a model call of run
/// `req.invocation_id` (SPEC §2), waiting server-side first when
/// `req.wait`. If this future is dropped while it waits (the client went
/// away), the limiter refunds the reservation.
///
/// # Errors
///
/// `token_rate`, `max_llm_calls` ([`ApiError::Denied`]),
/// `exceeds_capacity`, invalid input, a store fault.
pub async fn reserve_tokens<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    req: ReserveRequest,
) -> Result<Shadowed<ReserveResponse>, ApiError> {
    let invocation_id = id("invocation_id", &req.invocation_id)?;
    let request_id = optional_id("request_id", req.request_id.as_deref())?;
    let estimate = tokens("estimate", req.estimate)?;
    let split = split(req.input_tokens, req.output_tokens, req.cached_input_tokens)?;
    // "provider:model", as [prices] names it; anything else names no price
    // (the plan's default_price applies).
    let model = optional_id("model", req.model.as_deref())?.and_then(ModelRef::parse);
    let call = Reserve {
        invocation_id,
        estimate,
        request_id,
        wait: req.wait,
        model,
        split,
    };
    let _waiting = if req.wait {
        Some(wait_place(app, &user)?)
    } else {
        None
    };
    // One snapshot of the user's plans: the decision, the charge and the
    // metrics follow it, whatever a reload does meanwhile.
    let u = app.limiter().user(user)?;
    let decision = u.reserve(call).await?;
    observe(app, "reserve", &u, &decision);
    match decision {
        Decision::Allowed {
            grant,
            shadow_denied,
        } => {
            let waited = grant.wait_ms + grant.waited_ms;
            app.metrics().wait.observe(waited as f64 / 1_000.0);
            Ok(Shadowed {
                value: ReserveResponse {
                    reservation_id: grant.id.to_string(),
                    wait_ms: grant.wait_ms,
                },
                shadow_denied: shadow_denied.map(|d| d.limit()),
            })
        }
        Decision::Denied(d) => Err(ApiError::denied_at(d, app.limiter().clock().now_ms())),
    }
}

/// Settles a reservation at the tokens the call really used (a repeat
/// changes nothing).
///
/// # Errors
///
/// `unknown_reservation`, invalid input, a store fault.
pub async fn settle<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    req: SettleRequest,
) -> Result<BalanceResponse, ApiError> {
    let id = reservation(&req.reservation_id)?;
    let actual = tokens("actual", req.actual)?;
    let split = split(req.input_tokens, req.output_tokens, req.cached_input_tokens)?;
    let s = app.limiter().settle_split(user, &id, actual, split).await?;
    Ok(s.into())
}

/// Refunds a reservation whose call never happened (a repeat changes
/// nothing).
///
/// # Errors
///
/// `unknown_reservation`, invalid input, a store fault.
pub async fn refund<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    req: RefundRequest,
) -> Result<BalanceResponse, ApiError> {
    let id = reservation(&req.reservation_id)?;
    let s = app.limiter().refund(user, &id).await?;
    Ok(s.into())
}

/// A session lease request's session and holder (each made an id) and
/// its TTL.
fn lease_request<'a>(
    session_id: &'a str,
    req: &'a SessionLeaseRequest,
) -> Result<(Id<'a>, Id<'a>, u64), ApiError> {
    let session_id = id("session_id", session_id)?;
    let holder = id("holder", &req.holder)?;
    let ttl = check_ttl("ttl_ms", req.ttl_ms)?;
    Ok((session_id, holder, ttl))
}

/// Acquires the session lease of `session_id` for `req.holder` (SPEC §4),
/// with a new fence.
///
/// # Errors
///
/// `sessions` (the user is at `max_sessions`), `session_busy` (with the
/// holder's remaining TTL), invalid input, a
/// store fault (session leases always fail closed).
pub async fn acquire_session_lease<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    session_id: &str,
    req: SessionLeaseRequest,
) -> Result<SessionLeaseBody, ApiError> {
    let (sid, holder, ttl) = lease_request(session_id, &req)?;
    let key = counted_session(app, &app.limiter().user(user)?, sid, ttl, true).await?;
    match app.limiter().acquire_session(&key, &holder, ttl).await? {
        SessionAcquire::Acquired(g) => Ok(g.into()),
        SessionAcquire::Busy { retry_after_ms } => Err(ApiError::SessionBusy { retry_after_ms }),
    }
}

/// Renews the session lease of `session_id` that `req.holder` holds.
///
/// # Errors
///
/// `not_holder`, invalid input, a store fault.
pub async fn renew_session_lease<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    session_id: &str,
    req: SessionLeaseRequest,
) -> Result<SessionLeaseBody, ApiError> {
    let (sid, holder, ttl) = lease_request(session_id, &req)?;
    let key = counted_session(app, &app.limiter().user(user)?, sid, ttl, false).await?;
    match app.limiter().renew_session(&key, &holder, ttl).await? {
        Some(g) => Ok(g.into()),
        None => Err(ApiError::NotHolder),
    }
}

/// Releases the session lease of `session_id` that `holder` holds.
///
/// # Errors
///
/// `not_holder`, invalid input, a store fault.
pub async fn release_session_lease<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    session_id: &str,
    holder: &str,
) -> Result<ReleasedResponse, ApiError> {
    let session_id = id("session_id", session_id)?;
    let holder = id("holder", holder)?;
    let key = counted_session(app, &app.limiter().user(user)?, session_id, 0, false).await?;
    if app.limiter().release_session(&key, &holder).await? {
        Ok(ReleasedResponse {
            released: true,
            pending: false,
        })
    } else {
        Err(ApiError::NotHolder)
    }
}

/// Checks that `req.fence` is the latest fence of `session_id` (before a
/// fenced write).
///
/// # Errors
///
/// `stale_fence` (with the latest fence), invalid input, a store fault.
pub async fn check_fence<S: Store + Clone>(
    app: &App<S>,
    user: Id<'_>,
    session_id: &str,
    req: FenceRequest,
) -> Result<FenceResponse, ApiError> {
    let session_id = id("session_id", session_id)?;
    let check = app
        .limiter()
        .check_fence(&session_key(&user, &session_id), req.fence)
        .await?;
    if check.current {
        Ok(FenceResponse { current: true })
    } else {
        app.metrics().fence_rejected.inc();
        Err(ApiError::StaleFence {
            latest: check.latest,
        })
    }
}

/// Asks for a permit to call `provider` (SPEC §5), waiting server-side
/// first when `req.wait`.
///
/// # Errors
///
/// `provider_rate` / `provider_cooldown` ([`ApiError::ProviderDenied`]),
/// `exceeds_capacity`, `provider_exhausted`, `unknown_provider`, invalid
/// input, a store fault.
pub async fn provider_permit<S: Store + Clone>(
    app: &App<S>,
    caller: &Identity,
    provider: &str,
    req: PermitBody,
) -> Result<PermitResponse, ApiError> {
    let user = caller.user.as_str();
    let provider = id("provider", provider)?.as_str();
    let model = id("model", &req.model)?.as_str();
    let body_tenant = optional_id("tenant", req.tenant.as_deref())?;
    // With `tenant_claim`, the tenant is the verified one; a body naming
    // another would spend another tenant's share.
    let tenant = if app.verifier().verifies_tenant() {
        if body_tenant.is_some() && req.tenant != caller.tenant {
            return Err(ApiError::Forbidden(
                "the tenant is taken from your credentials; send none, or your own".to_owned(),
            ));
        }
        optional_id("tenant", caller.tenant.as_deref())?.map(Id::as_str)
    } else {
        body_tenant.map(Id::as_str)
    };
    let permit = PermitRequest {
        provider,
        model,
        tenant,
        tokens: tokens("tokens", req.tokens)?,
        input_tokens: optional_tokens("input_tokens", req.input_tokens)?,
        output_tokens: optional_tokens("output_tokens", req.output_tokens)?,
        max_wait_ms: req.max_wait_ms,
    };
    // Taken before the permit, so a refusal takes nothing.
    let waiting = if req.wait {
        Some(wait_place(app, user)?)
    } else {
        None
    };
    let governor = app.providers();
    let clock = governor.clock();
    // The tenant's label for the per-tenant series (keys with tenants only;
    // a bounded set: the configured tenants, and `other`).
    let tenant_label = governor.book().get(provider, model).and_then(|p| {
        if p.tenants.is_empty() {
            None
        } else {
            Some(match tenant {
                Some(t) if p.tenants.contains_key(t) => t.to_owned(),
                _ => "other".to_owned(),
            })
        }
    });
    let tenant_label = tenant_label.as_deref();
    let count = |outcome| {
        app.metrics()
            .provider_permit(provider, &req.model, tenant_label, outcome, clock.now_ms());
    };
    let decision = match governor.permit(permit).await {
        Ok(d) => d,
        Err(e) => {
            let err = crate::outcome::from_provider(e, clock.now_ms());
            if let ApiError::ProviderExhausted { reason, .. } = &err {
                // A configured key (exhaustion is only recorded for those).
                count("refused");
                tracing::info!(
                    user,
                    provider,
                    model = req.model,
                    reason,
                    "provider permit refused: quota exhausted"
                );
            }
            return Err(err);
        }
    };
    match decision {
        Decision::Allowed { grant, .. } => {
            let outcome = if grant.wait_ms > 0 {
                "waited"
            } else {
                "granted"
            };
            count(outcome);
            app.metrics()
                .provider_rate(provider, &req.model, grant.effective_permille);
            let wait_ms = if req.wait && grant.wait_ms > 0 {
                let _waiting = waiting;
                // A client that disconnects drops this future: the wait is
                // abandoned, and the permit (a provider call that never
                // happens) stays charged: nothing to refund.
                let deadline = clock.now_ms().saturating_add(grant.wait_ms);
                clock.sleep_until(deadline).await;
                0
            } else {
                grant.wait_ms
            };
            Ok(PermitResponse {
                wait_ms,
                effective_permille: grant.effective_permille,
            })
        }
        Decision::Denied(d) => {
            count("refused");
            if d.limit() == tollgate_core::Limit::Cooldown {
                let until = clock
                    .now_ms()
                    .saturating_add(d.retry_after_ms().unwrap_or(0));
                app.metrics().provider_cooldown(provider, &req.model, until);
            }
            tracing::info!(
                user,
                provider,
                model = req.model,
                limit = crate::outcome::provider_limit_code(d.limit()),
                "provider permit refused: {d}"
            );
            Err(ApiError::ProviderDenied(d))
        }
    }
}

/// Reports the provider's answer to a call: a 429 extends the provider
/// key's cooldown and lowers its effective rate; a per-day or billing
/// exhaustion makes permits fail fast.
///
/// # Errors
///
/// `forbidden` without the feedback scope, `unknown_provider`, invalid
/// input, a store fault.
pub async fn provider_feedback<S: Store + Clone>(
    app: &App<S>,
    caller: &Identity,
    provider: &str,
    req: FeedbackBody,
) -> Result<FeedbackResponse, ApiError> {
    let user = caller.user.as_str();
    // A provider's answer changes the rate of the whole fleet: only the
    // services that call providers (a credential with the feedback scope)
    // may report one.
    if !caller.feedback {
        return Err(ApiError::Forbidden(format!(
            "reporting provider answers needs the `{}` scope",
            app.verifier().feedback_scope()
        )));
    }
    let provider = id("provider", provider)?.as_str();
    id("model", &req.model)?;
    let status = match u16::try_from(req.status) {
        Ok(s) if (100..=599).contains(&s) => s,
        _ => {
            return Err(ApiError::invalid(
                "status",
                "must be an HTTP status, 100 to 599",
            ));
        }
    };
    let headers: Vec<(&str, &str)> = req
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let governor = app.providers();
    let out = governor
        .feedback(provider, &req.model, status, &headers, req.body.as_deref())
        .await
        .map_err(|e| crate::outcome::from_provider(e, governor.clock().now_ms()))?;
    let class = out.feedback.class();
    app.metrics().provider_response(provider, &req.model, class);
    if let Some(p) = out.effective_permille {
        app.metrics().provider_rate(provider, &req.model, p);
    }
    if let Some(until) = out.cooldown_until_ms {
        app.metrics().provider_cooldown(provider, &req.model, until);
    }
    let reason = match &out.feedback {
        Feedback::Exhausted { reason, .. } => Some(reason.clone()),
        _ => None,
    };
    if class != "success" {
        tracing::info!(
            user,
            provider,
            model = req.model,
            status,
            class,
            cooldown_until_ms = out.cooldown_until_ms,
            "provider answer reported"
        );
    }
    Ok(FeedbackResponse {
        class,
        retryable: out.feedback.is_retryable(),
        retry_after_ms: out.feedback.retry_after_ms(),
        cooldown_until_ms: out.cooldown_until_ms,
        effective_permille: out.effective_permille,
        reason,
    })
}
