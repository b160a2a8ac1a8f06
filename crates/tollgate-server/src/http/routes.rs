//! Handlers for every operation of SPEC §8, the router, and the OpenAPI
//! document generated from the same types. Each handler extracts the
//! verified user and the request, and calls the operation in
//! [`crate::ops`] (shared with the gRPC API).

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue};
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
use crate::ops::{self, Shadowed};
pub use crate::ops::{
    AdmitRequest, AdmitResponse, BalanceResponse, DEFAULT_SESSION_TTL_MS, FeedbackBody,
    FeedbackResponse, FenceRequest, FenceResponse, MAX_SESSION_TTL_MS, MAX_TOKENS, PermitBody,
    PermitResponse, RefundRequest, ReleasedResponse, RenewResponse, ReserveRequest,
    ReserveResponse, SessionLeaseBody, SessionLeaseRequest, SettleRequest,
};
use crate::outcome::{ApiError, ErrorBody, HttpError, StoreFault};
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

type ApiResult<T> = Result<Json<T>, HttpError>;

/// A path parameter naming `field` (the operation makes it an id).
fn path_id(
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    field: &str,
) -> Result<String, ApiError> {
    let Path(v) = p.map_err(|e| ApiError::invalid(field, e.body_text()))?;
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
    responses(
        (status = 200, body = AdmitResponse, description = "admitted (a retry with the same invocation id refreshes and charges nothing)",
            headers(("x-tollgate-shadow-denied" = String, description = "the limit that would have refused, had the plan not been in shadow mode")),
            links(
                ("renew" = (operation_id = "renew_run", parameters(("invocation_id" = "$request.body#/invocation_id")),
                    description = "renew the run lease")),
                ("release" = (operation_id = "release_run", parameters(("invocation_id" = "$request.body#/invocation_id")),
                    description = "release the run")),
                ("reserve" = (operation_id = "reserve", request_body = json!({"invocation_id": "$request.body#/invocation_id"}),
                    description = "reserve tokens for a model call of the run")),
            )),
        (status = 429, body = ErrorBody, description = "turn_rate, concurrency, or sessions: a new session past max_sessions (Retry-After)"),
        (status = 409, body = ErrorBody, description = "session_busy: another holder has the session (Retry-After)"),
    ))]
async fn admit_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<AdmitRequest>,
) -> Result<Response, HttpError> {
    Ok(shadowed(ops::admit_run(&app, user.as_id(), req).await?))
}

#[utoipa::path(delete, path = "/v1/runs/{invocation_id}",
    params(("invocation_id" = String, Path, description = "the run", format = "id"), ("session_id" = Option<String>, Query, description = "also release this session's lease held by the run", format = "id")),
    responses((status = 200, body = ReleasedResponse, description = "`released: false`: the run held nothing (not an error)")))]
async fn release_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    inv: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<ReleaseQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<ReleasedResponse> {
    let inv = path_id(inv, "invocation_id")?;
    let Query(q) = q.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let out = ops::release_run(&app, user.as_id(), &inv, q.session_id.as_deref()).await?;
    Ok(Json(out))
}

#[utoipa::path(post, path = "/v1/runs/{invocation_id}/renew",
    params(("invocation_id" = String, Path, description = "the run", format = "id")),
    responses((status = 200, body = RenewResponse, description = "renewed"), (status = 404, body = ErrorBody, description = "lease_lost: the run lease expired or was released")))]
async fn renew_run<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    inv: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> ApiResult<RenewResponse> {
    let inv = path_id(inv, "invocation_id")?;
    Ok(Json(ops::renew_run(&app, user.as_id(), &inv).await?))
}

#[utoipa::path(post, path = "/v1/tokens/reserve", request_body = ReserveRequest,
    responses(
        (status = 200, body = ReserveResponse, description = "reserved",
            headers(("x-tollgate-shadow-denied" = String, description = "the limit that would have refused, had the plan not been in shadow mode")),
            links(
                ("settle" = (operation_id = "settle", request_body = json!({"reservation_id": "$response.body#/reservation_id"}),
                    description = "settle the reservation at the tokens used")),
                ("refund" = (operation_id = "refund", request_body = json!({"reservation_id": "$response.body#/reservation_id"}),
                    description = "refund the reservation")),
            )),
        (status = 429, body = ErrorBody, description = "token_rate (Retry-After) or max_llm_calls (not retryable: no Retry-After)"),
        (status = 400, body = ErrorBody, description = "exceeds_capacity: the estimate can never fit the plan (`limit: token_rate`); or invalid_request"),
    ))]
async fn reserve<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<ReserveRequest>,
) -> Result<Response, HttpError> {
    // With wait=true, a client that disconnects drops this future; the
    // limiter then refunds the reservation it was waiting on.
    Ok(shadowed(
        ops::reserve_tokens(&app, user.as_id(), req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tokens/settle", request_body = SettleRequest,
    responses((status = 200, body = BalanceResponse, description = "settled (a repeat changes nothing)"), (status = 404, body = ErrorBody, description = "unknown_reservation"),
        (status = 400, body = ErrorBody, description = "invalid_request, e.g. an `actual` beyond what the plan's bucket holds exactly (2^53 / period)")))]
async fn settle<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<SettleRequest>,
) -> ApiResult<BalanceResponse> {
    Ok(Json(ops::settle(&app, user.as_id(), req).await?))
}

#[utoipa::path(post, path = "/v1/tokens/refund", request_body = RefundRequest,
    responses((status = 200, body = BalanceResponse, description = "refunded (a repeat changes nothing)"), (status = 404, body = ErrorBody, description = "unknown_reservation")))]
async fn refund<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    Body(req): Body<RefundRequest>,
) -> ApiResult<BalanceResponse> {
    Ok(Json(ops::refund(&app, user.as_id(), req).await?))
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/lease", request_body = SessionLeaseRequest,
    params(("session_id" = String, Path, description = "the conversation", format = "id")),
    responses(
        (status = 200, body = SessionLeaseBody, description = "acquired, with a new fence",
            links(
                ("renew" = (operation_id = "session_renew", parameters(("session_id" = "$request.path.session_id")),
                    request_body = json!({"holder": "$request.body#/holder"}), description = "renew the lease")),
                ("release" = (operation_id = "session_release", parameters(("session_id" = "$request.path.session_id"), ("holder" = "$request.body#/holder")),
                    description = "release the lease")),
                ("fence" = (operation_id = "fence_check", parameters(("session_id" = "$request.path.session_id")),
                    request_body = json!({"fence": "$response.body#/fence"}), description = "check the fence before a write")),
            )),
        (status = 409, body = ErrorBody, description = "session_busy: another holder has the session, with retry_after_ms (Retry-After)"),
        (status = 429, body = ErrorBody, description = "sessions: a new session past max_sessions (Retry-After)"),
    ))]
async fn session_acquire<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<SessionLeaseRequest>,
) -> ApiResult<SessionLeaseBody> {
    let sid = path_id(sid, "session_id")?;
    Ok(Json(
        ops::acquire_session_lease(&app, user.as_id(), &sid, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/lease/renew", request_body = SessionLeaseRequest,
    params(("session_id" = String, Path, description = "the conversation", format = "id")),
    responses((status = 200, body = SessionLeaseBody, description = "renewed"), (status = 404, body = ErrorBody, description = "not_holder: this holder does not hold the lease")))]
async fn session_renew<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<SessionLeaseRequest>,
) -> ApiResult<SessionLeaseBody> {
    let sid = path_id(sid, "session_id")?;
    Ok(Json(
        ops::renew_session_lease(&app, user.as_id(), &sid, req).await?,
    ))
}

#[utoipa::path(delete, path = "/v1/sessions/{session_id}/lease",
    params(("session_id" = String, Path, description = "the conversation", format = "id"), ("holder" = String, Query, description = "the holder's token", format = "id")),
    responses((status = 200, body = ReleasedResponse, description = "released (`released` is always true)"), (status = 404, body = ErrorBody, description = "not_holder: this holder does not hold the lease")))]
async fn session_release<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<HolderQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<ReleasedResponse> {
    let sid = path_id(sid, "session_id")?;
    let Query(q) = q.map_err(|e| ApiError::invalid("holder", e.body_text()))?;
    Ok(Json(
        ops::release_session_lease(&app, user.as_id(), &sid, &q.holder).await?,
    ))
}

#[utoipa::path(post, path = "/v1/sessions/{session_id}/fence", request_body = FenceRequest,
    params(("session_id" = String, Path, description = "the conversation", format = "id")),
    responses((status = 200, body = FenceResponse, description = "the fence is the latest"), (status = 409, body = ErrorBody, description = "stale_fence, with latest_fence: the writer must stop")))]
async fn fence_check<S: Store + Clone>(
    State(app): State<App<S>>,
    User(user): User,
    sid: Result<Path<String>, axum::extract::rejection::PathRejection>,
    Body(req): Body<FenceRequest>,
) -> ApiResult<FenceResponse> {
    let sid = path_id(sid, "session_id")?;
    Ok(Json(ops::check_fence(&app, user.as_id(), &sid, req).await?))
}

#[utoipa::path(post, path = "/v1/providers/{provider}/permits", request_body = PermitBody,
    params(("provider" = String, Path, description = "the provider, e.g. openai", format = "id")),
    responses((status = 200, body = PermitResponse, description = "permitted"),
              (status = 429, body = ErrorBody, description = "provider_rate or provider_cooldown (Retry-After)"),
              (status = 403, body = ErrorBody, description = "provider_exhausted: per-day or billing quota; not retryable (no Retry-After); or forbidden: a tenant other than the verified one"),
              (status = 404, body = ErrorBody, description = "unknown_provider: no limits configured for this provider and model"),
              (status = 400, body = ErrorBody, description = "exceeds_capacity: the call can never fit the key's limits; or invalid_request")))]
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
    params(("provider" = String, Path, description = "the provider, e.g. openai", format = "id")),
    responses((status = 200, body = FeedbackResponse, description = "classified and applied"),
              (status = 403, body = ErrorBody, description = "forbidden: the credential lacks the feedback scope"),
              (status = 404, body = ErrorBody, description = "unknown_provider: no limits configured for this provider and model")))]
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

#[utoipa::path(get, path = "/healthz", responses((status = 200, body = HealthResponse, description = "the process serves")))]
async fn healthz() -> Json<HealthResponse> {
    Json(HealthResponse { status: "ok" })
}

#[utoipa::path(get, path = "/readyz", responses((status = 200, body = HealthResponse, description = "ready"),
    (status = 503, body = ErrorBody, description = "store_unavailable: the store is down under fail_closed")))]
async fn readyz<S: Store + Clone>(
    State(app): State<App<S>>,
) -> Result<Json<HealthResponse>, HttpError> {
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
    app.metrics()
        .sync_local_refusals(app.limiter().refusals_answered_locally());
    app.runs().sync(app.clock().now_ms());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics().encode(),
    )
        .into_response()
}

async fn openapi() -> Json<serde_json::Value> {
    Json(openapi_document())
}

/// The document `GET /openapi.json` serves: [`ApiDoc`] as JSON, with its
/// links' fields in the OpenAPI spelling (`operationId`, `operationRef`,
/// `requestBody`), which utoipa 5's `Link` serializes in snake case.
pub fn openapi_document() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    let operations = doc
        .get_mut("paths")
        .and_then(serde_json::Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for op in operations {
        let links = op
            .get_mut("responses")
            .and_then(serde_json::Value::as_object_mut)
            .into_iter()
            .flat_map(|r| r.values_mut())
            .filter_map(|r| r.get_mut("links"))
            .filter_map(serde_json::Value::as_object_mut)
            .flat_map(|links| links.values_mut())
            .filter_map(serde_json::Value::as_object_mut);
        for link in links {
            for (from, to) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(v) = link.remove(from) {
                    link.insert(to.to_owned(), v);
                }
            }
        }
    }
    state_ids(&mut doc);
    doc
}

/// States every id of the document once, from the one id rule of core
/// (`tollgate_core::id`): a string schema the handlers and bodies mark
/// `format: "id"` gets `minLength` 1, `maxLength` [`ops::MAX_ID`] (in
/// characters, as tollgate counts them) and the no-control-character
/// `pattern`; one marked `format: "reservation-id"` gets the reservation
/// id's shape around an id. The marks are removed.
fn state_ids(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(o) => {
            let format = o.get("format").and_then(Value::as_str);
            if format == Some("id") {
                o.remove("format");
                o.insert("minLength".to_owned(), Value::from(1));
                o.insert("maxLength".to_owned(), Value::from(ops::MAX_ID));
                o.insert(
                    "pattern".to_owned(),
                    Value::from(tollgate_core::id::ID_PATTERN),
                );
            } else if format == Some("reservation-id") {
                o.remove("format");
                // `f<tag>.` (10), a call number of up to 19 digits, a dot and
                // an id, in characters.
                o.insert("minLength".to_owned(), Value::from(3));
                o.insert("maxLength".to_owned(), Value::from(ops::MAX_ID + 30));
                o.insert(
                    "pattern".to_owned(),
                    Value::from(format!(
                        r"^(f[0-9a-f]{{8}}\.)?[1-9][0-9]{{0,18}}\.{}{{1,{}}}$",
                        tollgate_core::id::ID_CHARACTER,
                        ops::MAX_ID
                    )),
                );
            }
            o.values_mut().for_each(state_ids);
        }
        Value::Array(a) => a.iter_mut().for_each(state_ids),
        _ => {}
    }
}

async fn not_found() -> HttpError {
    HttpError(ApiError::NotFound("no such route".to_owned()))
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
        Err(e) => return HttpError(e).into_response(),
    }
    let timeout = app.edge().body_timeout;
    let bytes =
        match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                return HttpError(ApiError::invalid(
                    "body",
                    format!("cannot read the body: {e}"),
                ))
                .into_response();
            }
            Err(_elapsed) => {
                let mut resp = HttpError(ApiError::RequestTimeout {
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                })
                .into_response();
                // The rest of the body is never read: the connection ends.
                resp.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
                return resp;
            }
        };
    let place = match ops::enter(&app) {
        Ok(place) => place,
        Err(overloaded) => return HttpError(overloaded).into_response(),
    };
    let request = Request::from_parts(parts, axum::body::Body::from(bytes));
    // The caller's trace and the start, for a decision's audit line and
    // span; nothing is read when both are off.
    let resp = if app.audit().is_some() || app.telemetry().is_some() {
        let context = crate::audit::from_headers(request.headers(), app.clock().now_ms());
        crate::audit::REQUEST
            .scope(context, next.run(request))
            .await
    } else {
        next.run(request).await
    };
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
    components(schemas(ErrorBody)),
    modifiers(&V1Contract)
)]
pub struct ApiDoc;

/// What every `/v1` operation shares, added to each so that no route can
/// forget it (SPEC §8): the bearer credential; 400 `invalid_request`
/// (a body that is not JSON or is over 64 KiB, a path parameter or query),
/// 401, 429 `overloaded` (the replica's in-flight cap), 500 `internal` and
/// 503 `store_unavailable`, each with [`ErrorBody`]; and the retry headers
/// of every 429 and 409.
struct V1Contract;

/// The security scheme's name in the document.
const BEARER: &str = "bearer";

impl utoipa::Modify for V1Contract {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            Http, HttpAuthScheme, SecurityRequirement, SecurityScheme,
        };

        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                BEARER,
                SecurityScheme::Http(
                    Http::builder()
                        .scheme(HttpAuthScheme::Bearer)
                        .bearer_format("JWT")
                        .description(Some(
                            "the user's JWT (or, in trusted_header mode, the trusted header from a trusted proxy)",
                        ))
                        .build(),
                ),
            );
        for (path, item) in doc.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for op in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
                let responses = &mut op.responses.responses;
                for (status, text) in COMMON_V1_RESPONSES {
                    add_error_response(responses, status, text);
                }
                for status in ["409", "429"] {
                    if let Some(utoipa::openapi::RefOr::T(r)) = responses.get_mut(status) {
                        add_retry_headers(r);
                    }
                }
            }
        }
    }
}

/// The refusals every `/v1` operation can answer, whatever its own.
const COMMON_V1_RESPONSES: [(&str, &str); 6] = [
    (
        "400",
        "invalid_request: `field` names the JSON path, path parameter or query out of its schema, or `body` for a body that is not a JSON object or is over 64 KiB",
    ),
    (
        "401",
        "unauthorized: no verified identity, or a user no plan covers",
    ),
    (
        "408",
        "request_timeout: the body did not arrive within the body timeout; the connection is closed",
    ),
    (
        "429",
        "overloaded: the replica is at its in-flight cap (`retry_after_ms: 1000`, Retry-After: 1); or too_many_waits: a `wait=true` request past the per-user or total bound of waiting requests (Retry-After: 1)",
    ),
    (
        "500",
        "internal: a store fault that is not transient (a bug or misconfiguration); never client input",
    ),
    (
        "503",
        "store_unavailable: the store is unreachable under fail_closed; or store_full: the memory store is at its entry cap (Retry-After: 1)",
    ),
];

/// Adds an [`ErrorBody`] response for `status`, or appends `text` to the
/// description of the one the operation declares itself.
fn add_error_response(
    responses: &mut std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::Response>,
    >,
    status: &str,
    text: &str,
) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    match responses.get_mut(status) {
        Some(RefOr::T(r)) => {
            if !r.description.is_empty() {
                r.description.push_str("; or ");
            }
            r.description.push_str(text);
        }
        Some(RefOr::Ref(_)) => {}
        None => {
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build();
            responses.insert(
                status.to_owned(),
                RefOr::T(
                    ResponseBuilder::new()
                        .description(text)
                        .content("application/json", content)
                        .build(),
                ),
            );
        }
    }
}

/// `Retry-After` and `RateLimit-*` on a retryable refusal (SPEC §8).
fn add_retry_headers(r: &mut utoipa::openapi::Response) {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let integer = |min: u64| {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(min as usize))
            .build()
    };
    for (name, min, text) in [
        (
            "Retry-After",
            1,
            "seconds to wait, rounded up, at least 1 (retryable refusals; absent on those that are not: max_llm_calls, exceeds_capacity, stale_fence)",
        ),
        (
            "RateLimit-Remaining",
            0,
            "0 (with Retry-After, on a limit's refusal; not on overloaded)",
        ),
        (
            "RateLimit-Reset",
            1,
            "seconds until a retry can succeed, the same as Retry-After",
        ),
    ] {
        r.headers.insert(
            name.to_owned(),
            HeaderBuilder::new()
                .schema(integer(min))
                .description(Some(text))
                .build(),
        );
    }
}

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
