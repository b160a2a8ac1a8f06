//! Admin endpoints, behind `admin_token` (compared in constant time). Off
//! (404) when no token is configured.

use axum::Json;
use axum::Router;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tollgate_core::Store;

use crate::ops::check_id;
use crate::outcome::ApiError;
use crate::state::App;

/// Proof that the request carries the admin token.
pub struct Admin;

impl<S: Store + Clone> FromRequestParts<App<S>> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, Response> {
        let Some(token) = app.admin_token() else {
            return Err((
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({"error": "not_found", "message": "admin endpoints are off (no admin_token)"})),
            )
                .into_response());
        };
        let given = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            Ok(Admin)
        } else {
            Err(
                ApiError::Unauthorized("admin endpoints need the admin token".to_owned())
                    .into_response(),
            )
        }
    }
}

/// A live lease, for people.
#[derive(Debug, Serialize)]
pub struct LeaseView {
    /// The run.
    pub invocation_id: String,
    /// Its expiry, ms since the Unix epoch.
    pub expires_at_ms: u64,
}

/// `GET /admin/users/{id}`.
#[derive(Debug, Serialize)]
pub struct UserView {
    /// The user.
    pub user: String,
    /// The user's effective plan.
    pub plan: String,
    /// Whole turns in the bucket now.
    pub turns_available: i64,
    /// Whole tokens in the bucket now (negative: debt).
    pub tokens_available: i64,
    /// Tokens charged over the last minute.
    pub tokens_last_minute: i64,
    /// Live run leases.
    pub leases: Vec<LeaseView>,
}

fn path_id(v: &str, field: &str) -> Result<(), ApiError> {
    check_id(field, v)
}

async fn user<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path(id): Path<String>,
) -> Result<Json<UserView>, ApiError> {
    path_id(&id, "user")?;
    let plan = app.limiter().plan_for(&id)?;
    let st = app.store().user_state(&id, plan.turns, plan.tokens).await?;
    Ok(Json(UserView {
        user: id,
        plan: plan.name.to_string(),
        turns_available: st.turns_available,
        tokens_available: st.tokens_available,
        tokens_last_minute: st.tokens_last_minute,
        leases: st
            .leases
            .into_iter()
            .map(|(invocation_id, expires_at_ms)| LeaseView {
                invocation_id,
                expires_at_ms,
            })
            .collect(),
    }))
}

#[derive(Debug, Deserialize)]
struct TopQuery {
    #[serde(default)]
    n: Option<usize>,
}

async fn top<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    q: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::invalid("n", e.body_text()))?;
    let n = q.n.unwrap_or(10).min(1_000);
    let users = app.store().top_users(n).await?;
    Ok(Json(serde_json::json!({ "users": users })))
}

async fn reset<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    path_id(&id, "user")?;
    let reset = app.store().reset_user(&id).await?;
    tracing::info!(user = %id, reset, "admin: buckets reset");
    Ok(Json(serde_json::json!({ "reset": reset })))
}

async fn release<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((id, inv)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    path_id(&id, "user")?;
    path_id(&inv, "invocation_id")?;
    let released = app.store().release_run(&id, &inv).await?;
    if released {
        app.metrics().turn_ended();
    }
    tracing::info!(user = %id, invocation_id = %inv, released, "admin: lease force-released");
    Ok(Json(serde_json::json!({ "released": released })))
}

async fn reload<S: Store + Clone>(_: Admin, State(app): State<App<S>>) -> Response {
    match app.reload().await {
        Ok(done) => Json(serde_json::json!({
            "reloaded": true,
            "needs_restart": done.needs_restart,
        }))
        .into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({
                "error": "invalid_config",
                "message": "the config was not reloaded; the old one keeps serving",
                "errors": e.errors.iter().map(|f| serde_json::json!({"path": f.path, "reason": f.reason})).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}

/// The admin routes.
pub fn router<S: Store + Clone>() -> Router<App<S>> {
    Router::new()
        .route("/admin/users/{id}", get(user::<S>))
        .route("/admin/users/{id}/reset", post(reset::<S>))
        .route(
            "/admin/users/{id}/leases/{invocation_id}",
            delete(release::<S>),
        )
        .route("/admin/top", get(top::<S>))
        .route("/admin/reload", post(reload::<S>))
}
