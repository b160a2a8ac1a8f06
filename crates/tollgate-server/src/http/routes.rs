//! Handlers for every operation of SPEC §8, the router, and the OpenAPI
//! document generated from the same types. Each handler extracts the
//! verified user and the request, and calls the operation in
//! [`crate::ops`] (shared with the gRPC API).

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::{Deserialize, Serialize};
use tollgate_core::Store;
use utoipa::{OpenApi, ToSchema};

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::header::CONNECTION;

use super::extract::{Body, Caller, User, Verified};
use crate::ops::{self, Shadowed, check_id};
pub use crate::ops::{
    AdmitRequest, AdmitResponse, BalanceResponse, DEFAULT_SESSION_TTL_MS, FeedbackBody,
    FeedbackResponse, FenceRequest, FenceResponse, MAX_SESSION_TTL_MS, MAX_TOKENS, PermitBody,
    PermitResponse, RefundRequest, ReleasedResponse, RenewResponse, ReserveRequest,
    ReserveResponse, SessionLeaseBody, SessionLeaseRequest, SettleRequest,
};
use crate::outcome::{ApiError, ErrorBody, StoreFault};
use crate::state::App;

/// `DELETE /v1/runs/{invocation_id}` options.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ReleaseQuery {
    /// Also release the session lease this run holds.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// `DELETE /v1/sessions/{session_id}/lease?holder=…`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct HolderQuery {
    /// The holder's token.
    pub holder: String,
}

/// `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthResponse {
    /// `ok`, or what is wrong.
    pub status: &'static str,
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// A path parameter, checked as an id naming `field`.
fn path_id(
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    field: &str,
) -> Result<String, ApiError> {
    let Path(v) = p.map_err(|e| ApiError::invalid(field, e.body_text()))?;
    check_id(field, &v)?;
    Ok(v)
}

/// A JSON answer, with `x-tollgate-shadow-denied: <limit>` when shadow mode
/// overrode a refusal.
fn shadowed<T: Serialize>(out: Shadowed<T>) -> Response {
    let mut headers = HeaderMap::new();
    if let Some(limit) = out.shadow_denied
        && let Ok(v) = HeaderValue::from_str(limit.as_str())
    {
        headers.insert("x-tollgate-shadow-denied", v);
    }
    (headers, Json(out.value)).into_response()
}

#[utoipa::path(post, path = "/v1/runs", request_body = AdmitRequest,
    responses((status = 200, body = AdmitResponse), (status = 429, body = ErrorBody, description = "turn_rate, concurrency, or sessions (a new session past max_sessions)"),
              (status = 409, body = ErrorBody, description = "session_busy"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn admit_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<AdmitRequest>,
) -> Result<Response, ApiError> {
    Ok(shadowed(ops::admit_run(&app, &user, req).await?))
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
    let out = ops::release_run(&app, &user, &inv, q.session_id.as_deref()).await?;
    Ok(Json(out))
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
    Ok(Json(ops::renew_run(&app, &user, &inv).await?))
}

#[utoipa::path(post, path = "/v1/tokens/reserve", request_body = ReserveRequest,
    responses((status = 200, body = ReserveResponse), (status = 429, body = ErrorBody, description = "token_rate (Retry-After) or max_llm_calls (not retryable)"),
              (status = 400, body = ErrorBody, description = "exceeds_capacity or invalid_request"), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn reserve<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<ReserveRequest>,
) -> Result<Response, ApiError> {
    // With wait=true, a client that disconnects drops this future; the
    // limiter then refunds the reservation it was waiting on.
    Ok(shadowed(ops::reserve_tokens(&app, &user, req).await?))
}

#[utoipa::path(post, path = "/v1/tokens/settle", request_body = SettleRequest,
    responses((status = 200, body = BalanceResponse), (status = 404, body = ErrorBody, description = "unknown_reservation"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn settle<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<SettleRequest>,
) -> ApiResult<BalanceResponse> {
    Ok(Json(ops::settle(&app, &user, req).await?))
}

#[utoipa::path(post, path = "/v1/tokens/refund", request_body = RefundRequest,
    responses((status = 200, body = BalanceResponse), (status = 404, body = ErrorBody, description = "unknown_reservation"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn refund<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<RefundRequest>,
) -> ApiResult<BalanceResponse> {
    Ok(Json(ops::refund(&app, &user, req).await?))
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/lease", request_body = SessionLeaseRequest,
    params(("session_id" = String, Path, description = "the conversation")),
    responses((status = 200, body = SessionLeaseBody), (status = 409, body = ErrorBody, description = "session_busy, with retry_after_ms"), (status = 429, body = ErrorBody, description = "sessions: a new session past max_sessions (Retry-After)"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn session_acquire<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<SessionLeaseRequest>,
) -> ApiResult<SessionLeaseBody> {
    let sid = path_id(sid, "session_id")?;
    Ok(Json(
        ops::acquire_session_lease(&app, &user, &sid, req).await?,
    ))
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
    Ok(Json(
        ops::renew_session_lease(&app, &user, &sid, req).await?,
    ))
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
    Ok(Json(
        ops::release_session_lease(&app, &user, &sid, &q.holder).await?,
    ))
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
    Ok(Json(ops::check_fence(&app, &user, &sid, req).await?))
}

#[utoipa::path(post, path = "/v1/providers/{provider}/permits", request_body = PermitBody,
    params(("provider" = String, Path, description = "the provider, e.g. openai")),
    responses((status = 200, body = PermitResponse),
              (status = 429, body = ErrorBody, description = "provider_rate or provider_cooldown (Retry-After)"),
              (status = 403, body = ErrorBody, description = "provider_exhausted: per-day or billing quota; not retryable (no Retry-After); or forbidden: a tenant other than the verified one"),
              (status = 404, body = ErrorBody, description = "unknown_provider"),
              (status = 400, body = ErrorBody, description = "exceeds_capacity or invalid_request"), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn provider_permit<S: Store + Clone>(
    State(app): State<App<S>>,
    Caller(caller): Caller,
    provider: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<PermitBody>,
) -> ApiResult<PermitResponse> {
    let provider = path_id(provider, "provider")?;
    Ok(Json(
        ops::provider_permit(&app, &caller, &provider, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/providers/{provider}/feedback", request_body = FeedbackBody,
    params(("provider" = String, Path, description = "the provider, e.g. openai")),
    responses((status = 200, body = FeedbackResponse),
              (status = 403, body = ErrorBody, description = "forbidden: the credential lacks the feedback scope"),
              (status = 404, body = ErrorBody, description = "unknown_provider"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn provider_feedback<S: Store + Clone>(
    State(app): State<App<S>>,
    Caller(caller): Caller,
    provider: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<FeedbackBody>,
) -> ApiResult<FeedbackResponse> {
    let provider = path_id(provider, "provider")?;
    Ok(Json(
        ops::provider_feedback(&app, &caller, &provider, req).await?,
    ))
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

/// The largest `/v1` request body, bytes (larger: 400 naming `body`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Every `/v1` request passes here, the one place that admits it (SPEC §8):
/// 1. the identity, from the headers alone: none is 401 before anything
///    else is read;
/// 2. the whole body, within `[limits] body_timeout_ms` and 64 KiB: past
///    the time, 408 `request_timeout` and the connection closed; past the
///    size, 400 naming `body`;
/// 3. only then a place under the replica's in-flight cap around the
///    handler (full: 429 `overloaded` with `Retry-After: 1`).
///
/// So a body still arriving holds no place, whoever sends it. The handler's
/// extractors take the verified identity from the request's extensions.
async fn admit<S: Store + Clone>(State(app): State<App<S>>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    match ops::verify_caller(&app, &parts.headers, peer) {
        Ok(caller) => {
            parts.extensions.insert(Verified(caller));
        }
        Err(e) => return e.into_response(),
    }
    let timeout = app.edge().body_timeout;
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY_BYTES))
        .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            return ApiError::invalid("body", format!("cannot read the body: {e}")).into_response();
        }
        Err(_elapsed) => {
            let mut resp = ApiError::RequestTimeout {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }
            .into_response();
            // The rest of the body is never read: the connection ends.
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            return resp;
        }
    };
    let place = match ops::enter(&app) {
        Ok(place) => place,
        Err(overloaded) => return overloaded.into_response(),
    };
    let resp = next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await;
    if resp.extensions().get::<StoreFault>().is_some() {
        app.metrics().store_errors.inc();
    }
    drop(place);
    resp
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

/// The router of the whole API over `app`, the operator's routes
/// (`/metrics`, `/admin/*`) included: one port for everything.
pub fn router<S: Store + Clone>(app: App<S>) -> Router {
    finish(public_routes(&app).merge(operator_routes::<S>()), app)
}

/// The public port's router when the operator's routes have their own
/// port (`admin_listen`): the API, health, readiness and `/openapi.json`.
pub fn public_router<S: Store + Clone>(app: App<S>) -> Router {
    finish(public_routes(&app), app)
}

/// The operator's port (`admin_listen`): `/metrics` and `/admin/*`.
pub fn operator_router<S: Store + Clone>(app: App<S>) -> Router {
    finish(operator_routes::<S>(), app)
}

fn operator_routes<S: Store + Clone>() -> Router<App<S>> {
    Router::new()
        .route("/metrics", get(metrics_text::<S>))
        .merge(super::admin::router::<S>())
}

fn finish<S: Store + Clone>(routes: Router<App<S>>, app: App<S>) -> Router {
    routes
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

fn public_routes<S: Store + Clone>(app: &App<S>) -> Router<App<S>> {
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
        .layer(middleware::from_fn_with_state(app.clone(), admit::<S>));
    Router::new()
        .merge(v1)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>))
        .route("/openapi.json", get(openapi))
}
