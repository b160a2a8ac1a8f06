//! Handlers for every operation of SPEC §8, the router, and the OpenAPI
//! document generated from the same types.

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::{Deserialize, Serialize};
use tollgate_core::lease::SessionAcquire;
use tollgate_core::provider::{Feedback, PermitRequest};
use tollgate_core::{Decision, Denial, ReservationId, Store};
use utoipa::{OpenApi, ToSchema};

use super::extract::{Body, MAX_ID, User, check_id};
use crate::metrics::DecisionLabels;
use crate::outcome::{ApiError, ErrorBody, StoreFault};
use crate::state::App;

/// Session lease TTL when `POST /v1/runs` names a session without one, ms.
pub const DEFAULT_SESSION_TTL_MS: u64 = 30_000;
/// Longest session lease TTL accepted, ms (1 hour; renew to keep it longer).
pub const MAX_SESSION_TTL_MS: u64 = 3_600_000;
/// Largest token count accepted in a body (2^53: exact everywhere).
pub const MAX_TOKENS: u64 = 1 << 53;

/// `POST /v1/runs`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AdmitRequest {
    /// The run (ADK invocation id); retrying with it is idempotent.
    pub invocation_id: String,
    /// The conversation, to hold its session lease for the turn.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Session lease TTL, ms (default 30,000; at most 3,600,000).
    #[serde(default)]
    pub session_ttl_ms: Option<u64>,
}

/// A session lease.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionLeaseBody {
    /// The fencing number: session writes must carry it.
    pub fence: u64,
    /// Lease expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// The answer to `POST /v1/runs`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdmitResponse {
    /// Run lease expiry, ms since the Unix epoch; renew every ttl/3.
    pub lease_expires_at_ms: u64,
    /// The session lease, when a session was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionLeaseBody>,
}

/// `{released}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleasedResponse {
    /// `false`: it held nothing (not an error).
    pub released: bool,
}

/// `DELETE /v1/runs/{invocation_id}` options.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ReleaseQuery {
    /// Also release the session lease this run holds.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// The answer to a run renewal.
#[derive(Debug, Serialize, ToSchema)]
pub struct RenewResponse {
    /// New run lease expiry, ms since the Unix epoch.
    pub lease_expires_at_ms: u64,
}

/// `POST /v1/tokens/reserve`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ReserveRequest {
    /// The run making the model call.
    pub invocation_id: String,
    /// Estimated tokens of the call.
    pub estimate: u64,
    /// `true`: the server waits before answering (`wait_ms` is then 0).
    #[serde(default)]
    pub wait: bool,
}

/// The answer to a reservation.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReserveResponse {
    /// Names it for settle and refund.
    pub reservation_id: String,
    /// Wait this long before the model call, ms (0 when `wait` was true).
    pub wait_ms: u64,
}

/// `POST /v1/tokens/settle`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SettleRequest {
    /// The reservation.
    pub reservation_id: String,
    /// Tokens the call really used.
    pub actual: u64,
}

/// `POST /v1/tokens/refund`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct RefundRequest {
    /// The reservation.
    pub reservation_id: String,
}

/// The answer to a settle or refund.
#[derive(Debug, Serialize, ToSchema)]
pub struct BalanceResponse {
    /// The user's tokens now (negative: debt). A repeat changes nothing.
    pub balance: i64,
}

/// `POST /v1/sessions/{session_id}/lease` and `…/lease/renew`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SessionLeaseRequest {
    /// The holder's token (e.g. the invocation id).
    pub holder: String,
    /// Lease TTL, ms (1 ..= 3,600,000).
    pub ttl_ms: u64,
}

/// `DELETE /v1/sessions/{session_id}/lease?holder=…`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct HolderQuery {
    /// The holder's token.
    pub holder: String,
}

/// `POST /v1/sessions/{session_id}/fence`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct FenceRequest {
    /// The fence the writer holds.
    pub fence: u64,
}

/// The answer to a fence check.
#[derive(Debug, Serialize, ToSchema)]
pub struct FenceResponse {
    /// Always `true` on 200 (a stale fence is a 409).
    pub current: bool,
}

/// `POST /v1/providers/{provider}/permits`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PermitBody {
    /// The model, e.g. `gpt-4o`: with the provider in the path, the
    /// provider key `[providers."<provider>:<model>"]` of the config.
    pub model: String,
    /// The tenant whose share applies (`[providers.….tenants.<name>]`); an
    /// unconfigured tenant, or none, uses the pool alone.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Estimated tokens of the call, input and output (0 when unknown):
    /// charged to the key's `tokens` rate. At most 2^53.
    pub tokens: u64,
    /// Estimated input tokens (default `tokens`): charged to
    /// `input_tokens`. At most 2^53.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    /// Estimated output tokens (default 0): charged to `output_tokens`. At
    /// most 2^53.
    #[serde(default)]
    pub output_tokens: Option<u64>,
    /// What is left of the call's one deadline, ms: the permit's wait must
    /// fit it as well as the key's `max_wait_ms` (policy `block`).
    #[serde(default)]
    pub max_wait_ms: Option<u64>,
    /// `true`: the server waits before answering (`wait_ms` is then 0).
    #[serde(default)]
    pub wait: bool,
}

/// The answer to a provider permit.
#[derive(Debug, Serialize, ToSchema)]
pub struct PermitResponse {
    /// Wait this long before calling the provider, ms (0 when `wait` was
    /// true: the server already waited).
    pub wait_ms: u64,
    /// The provider key's effective rate (AIMD), permille of the configured
    /// rate.
    pub effective_permille: u32,
}

/// `POST /v1/providers/{provider}/feedback`: the provider's answer to a
/// call.
#[derive(Debug, Deserialize, ToSchema)]
pub struct FeedbackBody {
    /// The model called.
    pub model: String,
    /// The provider's HTTP status (100 ..= 599).
    pub status: u64,
    /// The provider's response headers, name → value (names in any case;
    /// `{}` when there are none). Rate-limit and `Retry-After` headers are
    /// read.
    pub headers: BTreeMap<String, String>,
    /// The provider's response body, if the client has it (error bodies are
    /// read for quota, billing and retry details).
    #[serde(default)]
    pub body: Option<String>,
}

/// What the provider's answer said and changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct FeedbackResponse {
    /// `success`, `throttled` (a per-minute 429), `exhausted` (per-day or
    /// billing: permits now fail with 403 `provider_exhausted`),
    /// `server_error` (retry with backoff) or `client_error` (do not retry).
    pub class: &'static str,
    /// Whether the same call may be retried (`throttled`, `server_error`).
    pub retryable: bool,
    /// The provider's retry hint, ms, if it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The provider key's cooldown end (ms, the server's clock), when this
    /// answer set or extended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate after this answer, permille, when it changed it
    /// (a 429).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_permille: Option<u32>,
    /// For `exhausted`: the cause and the provider's message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthResponse {
    /// `ok`, or what is wrong.
    pub status: &'static str,
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn session_key(user: &str, session: &str) -> String {
    // Namespaced by the verified user, unambiguously (length prefix).
    format!("{}:{user}/{session}", user.len())
}

fn path_id(
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    field: &str,
) -> Result<String, ApiError> {
    let Path(v) = p.map_err(|e| ApiError::invalid(field, e.body_text()))?;
    check_id(field, &v)?;
    Ok(v)
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

fn session_ttl(field: &str, v: u64) -> Result<u64, ApiError> {
    if v == 0 || v > MAX_SESSION_TTL_MS {
        return Err(ApiError::invalid(
            field,
            format!("must be between 1 and {MAX_SESSION_TTL_MS} ms"),
        ));
    }
    Ok(v)
}

/// Counts a decision: by operation, refusing limit, outcome and plan (never
/// the user), and logs refusals with the user id (logs may carry it).
fn observe<S: Store + Clone, T: tollgate_core::decision::Waited>(
    app: &App<S>,
    op: &'static str,
    user: &str,
    decision: &Decision<T>,
) {
    let plan = app
        .limiter()
        .plan_for(user)
        .map(|p| p.name.to_string())
        .unwrap_or_default();
    let denial = decision.denial();
    let labels = DecisionLabels {
        op,
        limit: denial.map_or("none", |d| d.limit().as_str()),
        outcome: decision.outcome().as_str(),
        plan,
    };
    app.metrics().decisions.get_or_create(&labels).inc();
    if let Some(d) = denial {
        tracing::info!(user, op, outcome = labels.outcome, limit = labels.limit, plan = %labels.plan, "{d}");
    }
}

fn shadow_header(headers: &mut HeaderMap, shadow: Option<&Denial>) {
    if let Some(d) = shadow
        && let Ok(v) = HeaderValue::from_str(d.limit().as_str())
    {
        headers.insert("x-tollgate-shadow-denied", v);
    }
}

#[utoipa::path(post, path = "/v1/runs", request_body = AdmitRequest,
    responses((status = 200, body = AdmitResponse), (status = 429, body = ErrorBody, description = "turn_rate or concurrency"),
              (status = 409, body = ErrorBody, description = "session_busy"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn admit_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<AdmitRequest>,
) -> Result<Response, ApiError> {
    check_id("invocation_id", &req.invocation_id)?;
    let session = match &req.session_id {
        Some(sid) => {
            check_id("session_id", sid)?;
            let ttl = session_ttl(
                "session_ttl_ms",
                req.session_ttl_ms.unwrap_or(DEFAULT_SESSION_TTL_MS),
            )?;
            let key = session_key(&user, sid);
            match app
                .store()
                .session_acquire(&key, &req.invocation_id, ttl)
                .await?
            {
                SessionAcquire::Acquired(g) => Some((key, g)),
                SessionAcquire::Busy { retry_after_ms } => {
                    return Err(ApiError::SessionBusy { retry_after_ms });
                }
            }
        }
        None => None,
    };
    let release_session = |app: App<S>, key: String, holder: String| async move {
        if let Err(e) = app.store().session_release(&key, &holder).await {
            tracing::warn!(error = %e, "session lease not released after a denied turn");
        }
    };
    let decision = match app.limiter().admit_turn(&user, &req.invocation_id).await {
        Ok(d) => d,
        Err(e) => {
            if let Some((key, _)) = session {
                release_session(app.clone(), key, req.invocation_id.clone()).await;
            }
            return Err(e.into());
        }
    };
    observe(&app, "admit", &user, &decision);
    match decision {
        Decision::Allowed {
            grant,
            shadow_denied,
        } => {
            if !grant.refreshed && shadow_denied.is_none() {
                app.metrics().turn_started();
            }
            app.metrics()
                .sync_reclaimed(app.limiter().reclaimed_leases());
            let mut headers = HeaderMap::new();
            shadow_header(&mut headers, shadow_denied.as_ref());
            let body = AdmitResponse {
                lease_expires_at_ms: grant.expires_at_ms,
                session: session.map(|(_, g)| SessionLeaseBody {
                    fence: g.fence,
                    expires_at_ms: g.expires_at_ms,
                }),
            };
            Ok((headers, Json(body)).into_response())
        }
        Decision::Denied(d) => {
            if let Some((key, _)) = session {
                release_session(app.clone(), key, req.invocation_id.clone()).await;
            }
            Err(ApiError::Denied(d))
        }
    }
}

#[utoipa::path(delete, path = "/v1/runs/{invocation_id}",
    params(("invocation_id" = String, Path, description = "the run"), ("session_id" = Option<String>, Query, description = "also release this session's lease held by the run")),
    responses((status = 200, body = ReleasedResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn release_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    inv: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<ReleaseQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<ReleasedResponse> {
    let inv = path_id(inv, "invocation_id")?;
    let Query(q) = q.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    // Validate everything before acting: a 400 must change nothing.
    if let Some(sid) = &q.session_id {
        check_id("session_id", sid)?;
    }
    let released = app.limiter().release_run(&user, &inv).await?;
    if released {
        app.metrics().turn_ended();
    }
    if let Some(sid) = q.session_id {
        app.store()
            .session_release(&session_key(&user, &sid), &inv)
            .await?;
    }
    Ok(Json(ReleasedResponse { released }))
}

#[utoipa::path(post, path = "/v1/runs/{invocation_id}/renew",
    params(("invocation_id" = String, Path, description = "the run")),
    responses((status = 200, body = RenewResponse), (status = 404, body = ErrorBody, description = "lease_lost"), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn renew_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    inv: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> ApiResult<RenewResponse> {
    let inv = path_id(inv, "invocation_id")?;
    match app.limiter().renew_run(&user, &inv).await? {
        Some(exp) => Ok(Json(RenewResponse {
            lease_expires_at_ms: exp,
        })),
        None => Err(ApiError::LeaseLost),
    }
}

#[utoipa::path(post, path = "/v1/tokens/reserve", request_body = ReserveRequest,
    responses((status = 200, body = ReserveResponse), (status = 429, body = ErrorBody, description = "token_rate (Retry-After) or max_llm_calls (not retryable)"),
              (status = 400, body = ErrorBody, description = "exceeds_capacity or invalid_request"), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn reserve<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<ReserveRequest>,
) -> Result<Response, ApiError> {
    check_id("invocation_id", &req.invocation_id)?;
    let estimate = tokens("estimate", req.estimate)?;
    // With wait=true, a client that disconnects drops this future; the
    // limiter then refunds the reservation it was waiting on.
    let decision = if req.wait {
        app.limiter()
            .reserve_tokens_and_wait(&user, &req.invocation_id, estimate)
            .await?
    } else {
        app.limiter()
            .reserve_tokens(&user, &req.invocation_id, estimate)
            .await?
    };
    observe(&app, "reserve", &user, &decision);
    match decision {
        Decision::Allowed {
            grant,
            shadow_denied,
        } => {
            let waited = grant.wait_ms + grant.waited_ms;
            app.metrics().wait.observe(waited as f64 / 1_000.0);
            let mut headers = HeaderMap::new();
            shadow_header(&mut headers, shadow_denied.as_ref());
            let body = ReserveResponse {
                reservation_id: grant.id.to_string(),
                wait_ms: grant.wait_ms,
            };
            Ok((headers, Json(body)).into_response())
        }
        Decision::Denied(d) => Err(ApiError::Denied(d)),
    }
}

/// Longest reservation id: `<call>.<invocation_id>`, a u64 (at most 20
/// digits), a dot and an id of at most [`MAX_ID`] bytes.
const MAX_RESERVATION_ID: usize = MAX_ID + 21;

fn reservation(v: &str) -> Result<ReservationId, ApiError> {
    if v.len() > MAX_RESERVATION_ID {
        return Err(ApiError::invalid(
            "reservation_id",
            format!("must be at most {MAX_RESERVATION_ID} bytes"),
        ));
    }
    let id: ReservationId =
        v.parse()
            .map_err(|e: tollgate_core::store::MalformedReservationId| {
                ApiError::invalid("reservation_id", e.to_string())
            })?;
    check_id("reservation_id", &id.invocation_id)?;
    Ok(id)
}

#[utoipa::path(post, path = "/v1/tokens/settle", request_body = SettleRequest,
    responses((status = 200, body = BalanceResponse), (status = 404, body = ErrorBody, description = "unknown_reservation"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn settle<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<SettleRequest>,
) -> ApiResult<BalanceResponse> {
    let id = reservation(&req.reservation_id)?;
    let actual = tokens("actual", req.actual)?;
    let s = app.limiter().settle(&user, &id, actual).await?;
    Ok(Json(BalanceResponse { balance: s.balance }))
}

#[utoipa::path(post, path = "/v1/tokens/refund", request_body = RefundRequest,
    responses((status = 200, body = BalanceResponse), (status = 404, body = ErrorBody, description = "unknown_reservation"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn refund<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<RefundRequest>,
) -> ApiResult<BalanceResponse> {
    let id = reservation(&req.reservation_id)?;
    let s = app.limiter().refund(&user, &id).await?;
    Ok(Json(BalanceResponse { balance: s.balance }))
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/lease", request_body = SessionLeaseRequest,
    params(("session_id" = String, Path, description = "the conversation")),
    responses((status = 200, body = SessionLeaseBody), (status = 409, body = ErrorBody, description = "session_busy, with retry_after_ms"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn session_acquire<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<SessionLeaseRequest>,
) -> ApiResult<SessionLeaseBody> {
    let sid = path_id(sid, "session_id")?;
    check_id("holder", &req.holder)?;
    let ttl = session_ttl("ttl_ms", req.ttl_ms)?;
    match app
        .store()
        .session_acquire(&session_key(&user, &sid), &req.holder, ttl)
        .await?
    {
        SessionAcquire::Acquired(g) => Ok(Json(SessionLeaseBody {
            fence: g.fence,
            expires_at_ms: g.expires_at_ms,
        })),
        SessionAcquire::Busy { retry_after_ms } => Err(ApiError::SessionBusy { retry_after_ms }),
    }
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/lease/renew", request_body = SessionLeaseRequest,
    params(("session_id" = String, Path, description = "the conversation")),
    responses((status = 200, body = SessionLeaseBody), (status = 404, body = ErrorBody, description = "not_holder"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn session_renew<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<SessionLeaseRequest>,
) -> ApiResult<SessionLeaseBody> {
    let sid = path_id(sid, "session_id")?;
    check_id("holder", &req.holder)?;
    let ttl = session_ttl("ttl_ms", req.ttl_ms)?;
    match app
        .store()
        .session_renew(&session_key(&user, &sid), &req.holder, ttl)
        .await?
    {
        Some(g) => Ok(Json(SessionLeaseBody {
            fence: g.fence,
            expires_at_ms: g.expires_at_ms,
        })),
        None => Err(ApiError::NotHolder),
    }
}

#[utoipa::path(delete, path = "/v1/sessions/{session_id}/lease",
    params(("session_id" = String, Path, description = "the conversation"), ("holder" = String, Query, description = "the holder's token")),
    responses((status = 200, body = ReleasedResponse), (status = 404, body = ErrorBody, description = "not_holder"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn session_release<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<HolderQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<ReleasedResponse> {
    let sid = path_id(sid, "session_id")?;
    let Query(q) = q.map_err(|e| ApiError::invalid("holder", e.body_text()))?;
    check_id("holder", &q.holder)?;
    if app
        .store()
        .session_release(&session_key(&user, &sid), &q.holder)
        .await?
    {
        Ok(Json(ReleasedResponse { released: true }))
    } else {
        Err(ApiError::NotHolder)
    }
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/fence", request_body = FenceRequest,
    params(("session_id" = String, Path, description = "the conversation")),
    responses((status = 200, body = FenceResponse), (status = 409, body = ErrorBody, description = "stale_fence"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn fence_check<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<FenceRequest>,
) -> ApiResult<FenceResponse> {
    let sid = path_id(sid, "session_id")?;
    let check = app
        .store()
        .fence_check(&session_key(&user, &sid), req.fence)
        .await?;
    if check.current {
        Ok(Json(FenceResponse { current: true }))
    } else {
        app.metrics().fence_rejected.inc();
        Err(ApiError::StaleFence {
            latest: check.latest,
        })
    }
}

fn optional_tokens(field: &str, v: Option<u64>) -> Result<Option<u64>, ApiError> {
    v.map(|v| tokens(field, v)).transpose()
}

#[utoipa::path(post, path = "/v1/providers/{provider}/permits", request_body = PermitBody,
    params(("provider" = String, Path, description = "the provider, e.g. openai")),
    responses((status = 200, body = PermitResponse),
              (status = 429, body = ErrorBody, description = "provider_rate or provider_cooldown (Retry-After)"),
              (status = 403, body = ErrorBody, description = "provider_exhausted: per-day or billing quota; not retryable (no Retry-After)"),
              (status = 404, body = ErrorBody, description = "unknown_provider"),
              (status = 400, body = ErrorBody, description = "exceeds_capacity or invalid_request"), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn provider_permit<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    provider: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<PermitBody>,
) -> ApiResult<PermitResponse> {
    let provider = path_id(provider, "provider")?;
    check_id("model", &req.model)?;
    if let Some(t) = &req.tenant {
        check_id("tenant", t)?;
    }
    let permit = PermitRequest {
        provider: &provider,
        model: &req.model,
        tenant: req.tenant.as_deref(),
        tokens: tokens("tokens", req.tokens)?,
        input_tokens: optional_tokens("input_tokens", req.input_tokens)?,
        output_tokens: optional_tokens("output_tokens", req.output_tokens)?,
        max_wait_ms: req.max_wait_ms,
    };
    let governor = app.providers();
    let clock = governor.clock();
    let decision = match governor.permit(permit).await {
        Ok(d) => d,
        Err(e) => {
            let err = ApiError::from_provider(e, clock.now_ms());
            if let ApiError::ProviderExhausted { reason, .. } = &err {
                // A configured key (exhaustion is only recorded for those).
                app.metrics()
                    .provider_permit(&provider, &req.model, "refused");
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
            app.metrics()
                .provider_permit(&provider, &req.model, outcome);
            app.metrics()
                .provider_rate(&provider, &req.model, grant.effective_permille);
            let wait_ms = if req.wait && grant.wait_ms > 0 {
                // A client that disconnects drops this future: the wait is
                // abandoned, and the permit (a provider call that never
                // happens) stays charged: nothing to refund.
                let deadline = clock.now_ms().saturating_add(grant.wait_ms);
                clock.sleep_until(deadline).await;
                0
            } else {
                grant.wait_ms
            };
            Ok(Json(PermitResponse {
                wait_ms,
                effective_permille: grant.effective_permille,
            }))
        }
        Decision::Denied(d) => {
            app.metrics()
                .provider_permit(&provider, &req.model, "refused");
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

#[utoipa::path(post, path = "/v1/providers/{provider}/feedback", request_body = FeedbackBody,
    params(("provider" = String, Path, description = "the provider, e.g. openai")),
    responses((status = 200, body = FeedbackResponse),
              (status = 404, body = ErrorBody, description = "unknown_provider"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn provider_feedback<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    provider: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<FeedbackBody>,
) -> ApiResult<FeedbackResponse> {
    let provider = path_id(provider, "provider")?;
    check_id("model", &req.model)?;
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
        .feedback(&provider, &req.model, status, &headers, req.body.as_deref())
        .await
        .map_err(|e| ApiError::from_provider(e, governor.clock().now_ms()))?;
    let class = out.feedback.class();
    app.metrics()
        .provider_response(&provider, &req.model, class);
    if let Some(p) = out.effective_permille {
        app.metrics().provider_rate(&provider, &req.model, p);
    }
    let reason = match &out.feedback {
        Feedback::Exhausted { reason } => Some(reason.clone()),
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
    Ok(Json(FeedbackResponse {
        class,
        retryable: out.feedback.is_retryable(),
        retry_after_ms: out.feedback.retry_after_ms(),
        cooldown_until_ms: out.cooldown_until_ms,
        effective_permille: out.effective_permille,
        reason,
    }))
}

#[utoipa::path(get, path = "/healthz", responses((status = 200, body = HealthResponse)))]
async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse { status: "ok" })
}

#[utoipa::path(get, path = "/readyz", responses((status = 200, body = HealthResponse), (status = 503, body = ErrorBody)))]
async fn readyz<S: Store + Clone>(
    State(app): State<App<S>>,
) -> Result<Json<HealthResponse>, ApiError> {
    // A read through the store as a limit decision would make it: 503 when
    // the store is unreachable under fail_closed; under fail_open the
    // replica can still decide (locally), so it stays ready.
    let spec =
        tollgate_core::BucketSpec::new(1, 1, 1).map_err(|e| ApiError::Internal(e.to_string()))?;
    app.store()
        .user_state("tollgate:readyz", spec, spec)
        .await?;
    Ok(Json(HealthResponse { status: "ok" }))
}

async fn metrics_text<S: Store + Clone>(State(app): State<App<S>>) -> Response {
    app.metrics()
        .sync_reclaimed(app.limiter().reclaimed_leases());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics().encode(),
    )
        .into_response()
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({"error": "not_found", "message": "no such route"})),
    )
}

/// The replica's in-flight cap: over it, 429 `overloaded` with `Retry-After: 1`.
async fn in_flight<S: Store + Clone>(
    State(app): State<App<S>>,
    req: Request,
    next: Next,
) -> Response {
    match app.gate().try_acquire() {
        Ok(_permit) => {
            app.metrics()
                .requests_in_flight
                .set(app.gate().in_flight() as i64);
            let resp = next.run(req).await;
            if resp.extensions().get::<StoreFault>().is_some() {
                app.metrics().store_errors.inc();
            }
            app.metrics()
                .requests_in_flight
                .set(app.gate().in_flight().saturating_sub(1) as i64);
            resp
        }
        Err(_) => ApiError::Overloaded.into_response(),
    }
}

/// The OpenAPI 3 document of this API, generated from the handlers' types.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tollgate",
        description = "Admission control for LLM agent platforms: the sidecar's HTTP/JSON API (SPEC §8). Every request but /healthz, /readyz and /openapi.json needs `Authorization: Bearer <JWT>` (or the trusted header when that mode is on)."
    ),
    paths(
        admit_run,
        release_run,
        renew_run,
        reserve,
        settle,
        refund,
        session_acquire,
        session_renew,
        session_release,
        fence_check,
        provider_permit,
        provider_feedback,
        healthz,
        readyz
    ),
    components(schemas(ErrorBody))
)]
pub struct ApiDoc;

/// The routes, as (method, path) pairs: the router and the OpenAPI test
/// both use this list.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/runs"),
    ("delete", "/v1/runs/{invocation_id}"),
    ("post", "/v1/runs/{invocation_id}/renew"),
    ("post", "/v1/tokens/reserve"),
    ("post", "/v1/tokens/settle"),
    ("post", "/v1/tokens/refund"),
    ("post", "/v1/sessions/{session_id}/lease"),
    ("post", "/v1/sessions/{session_id}/lease/renew"),
    ("delete", "/v1/sessions/{session_id}/lease"),
    ("post", "/v1/sessions/{session_id}/fence"),
    ("post", "/v1/providers/{provider}/permits"),
    ("post", "/v1/providers/{provider}/feedback"),
    ("get", "/healthz"),
    ("get", "/readyz"),
];

/// The router of the whole API over `app`.
pub fn router<S: Store + Clone>(app: App<S>) -> Router {
    let v1 = Router::new()
        .route("/v1/runs", post(admit_run::<S>))
        .route("/v1/runs/{invocation_id}", delete(release_run::<S>))
        .route("/v1/runs/{invocation_id}/renew", post(renew_run::<S>))
        .route("/v1/tokens/reserve", post(reserve::<S>))
        .route("/v1/tokens/settle", post(settle::<S>))
        .route("/v1/tokens/refund", post(refund::<S>))
        .route(
            "/v1/sessions/{session_id}/lease",
            post(session_acquire::<S>).delete(session_release::<S>),
        )
        .route(
            "/v1/sessions/{session_id}/lease/renew",
            post(session_renew::<S>),
        )
        .route("/v1/sessions/{session_id}/fence", post(fence_check::<S>))
        .route(
            "/v1/providers/{provider}/permits",
            post(provider_permit::<S>),
        )
        .route(
            "/v1/providers/{provider}/feedback",
            post(provider_feedback::<S>),
        )
        .layer(middleware::from_fn_with_state(app.clone(), in_flight::<S>));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics_text::<S>))
        .merge(super::admin::router::<S>())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(app)
}
