//! Admin endpoints, behind `admin_token` (compared in constant time). Off
//! (404) when no token is configured.
//!
//! Users (`/admin/users/…`, `/admin/top`), the config (`/admin/reload`) and
//! provider keys (`/admin/providers/…`: what the providers' answers set —
//! the shared cooldown and effective rate, this replica's exhaustion hold —
//! and clearing it after a bad hint).

use std::collections::HashMap;

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
use tollgate_core::calendar::Period;
use tollgate_core::limiter::BudgetStatus;
use tollgate_core::money;
use tollgate_core::spend::{BudgetAdjust, BudgetUnit};
use tollgate_provider::{ExhaustionHold, ProviderStatus};

use crate::ops;
use crate::outcome::{ApiError, HttpError};
use crate::state::App;

/// Proof that the request carries the admin token.
pub struct Admin;

impl<S: Store + Clone> FromRequestParts<App<S>> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, Response> {
        let Some(token) = app.admin_token() else {
            return Err(HttpError(ApiError::NotFound(
                "admin endpoints are off (no admin_token)".to_owned(),
            ))
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
            Err(HttpError(ApiError::Unauthorized(
                "admin endpoints need the admin token".to_owned(),
            ))
            .into_response())
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
    /// The plan's spend budgets now (empty: none).
    pub budgets: Vec<BudgetView>,
}

/// One budget in [`UserView`].
#[derive(Debug, Serialize)]
pub struct BudgetView {
    /// `daily`, `weekly` or `monthly`.
    pub window: &'static str,
    /// `tokens`, or `micros` (micro-units of `currency`).
    pub unit: &'static str,
    /// The config's currency, for a `micros` budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The most the user may spend per window, as the plan says.
    pub limit: u64,
    /// Top-ups granted for the current window (its limit is `limit +
    /// granted`).
    pub granted: u64,
    /// Spent in the current window.
    pub spent: u64,
    /// When the current window ends, ms since the Unix epoch.
    pub resets_at_ms: u64,
}

fn path_id<'a>(v: &'a str, field: &str) -> Result<tollgate_core::Id<'a>, ApiError> {
    ops::id(field, v)
}

async fn user<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path(id): Path<String>,
) -> Result<Json<UserView>, HttpError> {
    let u = app.limiter().user(path_id(&id, "user")?)?;
    let plan = u.plan();
    let st = app.store().user_state(&id, plan.turns, plan.tokens).await?;
    let budgets = budget_views(&app, u.budgets().await?);
    Ok(Json(UserView {
        user: id.clone(),
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
        budgets,
    }))
}

fn budget_views<S: Store + Clone>(app: &App<S>, budgets: Vec<BudgetStatus>) -> Vec<BudgetView> {
    let currency = app.limiter().plans().currency().map(str::to_owned);
    budgets
        .into_iter()
        .map(|b| {
            let cost = b.unit == BudgetUnit::Cost;
            BudgetView {
                window: b.period.as_str(),
                unit: if cost { "micros" } else { "tokens" },
                currency: if cost { currency.clone() } else { None },
                limit: b.limit,
                granted: b.granted,
                spent: b.spent,
                resets_at_ms: b.resets_at_ms,
            }
        })
        .collect()
}

/// The window named in a budget route.
fn window(w: &str) -> Result<Period, ApiError> {
    Period::ALL
        .into_iter()
        .find(|p| p.as_str() == w)
        .ok_or_else(|| {
            ApiError::invalid(
                "window",
                format!("must be daily, weekly or monthly (got {w:?})"),
            )
        })
}

/// `POST /admin/users/{id}/budgets/{window}/reset`: the user's current
/// window of that budget starts afresh (nothing spent, no top-up).
async fn budget_reset<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((id, w)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let user = path_id(&id, "user")?;
    let period = window(&w)?;
    let after = app
        .limiter()
        .adjust_budget(user, period, BudgetAdjust::Reset)
        .await?;
    tracing::info!(user = %id, window = %period, "admin: budget window reset");
    Ok(Json(
        serde_json::json!({ "budgets": budget_views(&app, after) }),
    ))
}

/// The body of a top-up: an amount in the budget's unit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopUp {
    /// For a token budget.
    #[serde(default)]
    tokens: Option<u64>,
    /// For a cost budget: a decimal string in the config's currency.
    #[serde(default)]
    cost: Option<String>,
    /// The top-up's id: a repeat of one applied within a day is not
    /// applied again.
    #[serde(default)]
    request_id: Option<String>,
}

/// `POST /admin/users/{id}/budgets/{window}/top_up` with `{"tokens": N}`
/// or `{"cost": "5.00"}`: the user's current window of that budget may
/// spend that much more; the top-up ends with the window.
async fn budget_top_up<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((id, w)): Path<(String, String)>,
    body: Result<Json<TopUp>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let user = path_id(&id, "user")?;
    let period = window(&w)?;
    let Json(body) = body.map_err(|e| ApiError::invalid("body", e.body_text()))?;
    // One snapshot: the unit read and the top-up on the same plan.
    let u = app.limiter().user(user)?;
    let unit = u
        .budgets()
        .await?
        .into_iter()
        .find(|b| b.period == period)
        .map(|b| b.unit);
    let amount = match (unit, body.tokens, body.cost.as_deref()) {
        (Some(BudgetUnit::Tokens), Some(n), None) => n,
        (Some(BudgetUnit::Cost), None, Some(c)) => {
            money::parse_micros(c).map_err(|e| ApiError::invalid("cost", e.to_string()))?
        }
        (Some(BudgetUnit::Tokens), ..) => {
            return Err(ApiError::invalid(
                "tokens",
                "the budget counts tokens: give exactly {\"tokens\": N}",
            )
            .into());
        }
        (Some(BudgetUnit::Cost), ..) => {
            return Err(ApiError::invalid(
                "cost",
                "the budget counts money: give exactly {\"cost\": \"5.00\"}",
            )
            .into());
        }
        // No such budget: the limiter names it.
        (None, ..) => 0,
    };
    let request_id = body.request_id.as_deref();
    let after = u
        .adjust_budget(period, BudgetAdjust::TopUp { amount, request_id })
        .await?;
    tracing::info!(user = %id, window = %period, amount, request_id, "admin: budget window topped up");
    Ok(Json(
        serde_json::json!({ "budgets": budget_views(&app, after) }),
    ))
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
) -> Result<Json<serde_json::Value>, HttpError> {
    let Query(q) = q.map_err(|e| ApiError::invalid("n", e.body_text()))?;
    let n = q.n.unwrap_or(10).min(1_000);
    let users = app.store().top_users(n).await?;
    Ok(Json(serde_json::json!({ "users": users })))
}

async fn reset<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, HttpError> {
    path_id(&id, "user")?;
    let reset = app.store().reset_user(&id).await?;
    // This replica's kept refusals of the user end with it (SPEC §3).
    app.limiter().forget_refusals(&id);
    tracing::info!(user = %id, reset, "admin: buckets reset");
    Ok(Json(serde_json::json!({ "reset": reset })))
}

async fn release<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((id, inv)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, HttpError> {
    path_id(&id, "user")?;
    path_id(&inv, "invocation_id")?;
    let outcome = app.store().release_run(&id, &inv).await?;
    app.runs().ended(&id, &inv, app.clock().now_ms());
    let (released, pending) = (
        outcome.released(),
        outcome == tollgate_core::store::Release::Pending,
    );
    tracing::info!(user = %id, invocation_id = %inv, released, pending, "admin: lease force-released");
    Ok(Json(
        serde_json::json!({ "released": released, "pending": pending }),
    ))
}

/// This replica's exhaustion hold of a provider key, for people.
#[derive(Debug, Serialize)]
pub struct ExhaustedView {
    /// Until when permits fail fast on this replica, ms since the Unix
    /// epoch.
    pub until_ms: u64,
    /// How long that is from now, ms.
    pub remaining_ms: u64,
    /// What the provider said.
    pub reason: String,
}

impl ExhaustedView {
    fn new(hold: ExhaustionHold, now_ms: u64) -> Self {
        Self {
            until_ms: hold.until_ms,
            remaining_ms: hold.until_ms.saturating_sub(now_ms),
            reason: hold.reason,
        }
    }
}

/// `GET /admin/providers/{provider}/{model}` (and each row of
/// `GET /admin/providers`).
#[derive(Debug, Serialize)]
pub struct ProviderView {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// The end of the shared cooldown, ms since the Unix epoch (`null`:
    /// none).
    pub cooldown_until_ms: Option<u64>,
    /// How long the cooldown still runs, ms (0: none).
    pub cooldown_remaining_ms: u64,
    /// The effective rate after AIMD, permille of the configured rate.
    pub effective_permille: u32,
    /// This replica's exhaustion hold (`null`: none).
    pub exhausted: Option<ExhaustedView>,
    /// The key's configured tenants and, with fair sharing, those its
    /// state holds, by name.
    pub tenants: Vec<TenantView>,
}

/// A tenant of a provider key in [`ProviderView`].
#[derive(Debug, Serialize)]
pub struct TenantView {
    /// The tenant (`{others}`: unconfigured tenants past the key's 64;
    /// `{none}`: permits naming none).
    pub name: String,
    /// Its weight in fair sharing (`null`: not configured).
    pub weight: Option<u32>,
    /// Its ceiling, the fraction of the pool it may use (`null`: none).
    pub share: Option<f64>,
    /// Whether it asked within the key's `max_wait_ms` (fair sharing).
    pub active: bool,
    /// How far ahead of its weighted share it has booked, ms at the
    /// current sharing (0: not ahead).
    pub booked_ahead_ms: u64,
    /// A configured tenant's share of the key's permits granted on this
    /// replica in the last minute (`null`: none were granted, or a tenant
    /// not configured: those count together, as `other`).
    pub recent_share: Option<f64>,
}

impl ProviderView {
    fn new(st: ProviderStatus, now_ms: u64, recent: &HashMap<String, f64>) -> Self {
        Self {
            provider: st.provider.to_string(),
            model: st.model.to_string(),
            cooldown_until_ms: st.cooldown_until_ms,
            cooldown_remaining_ms: st.cooldown_remaining_ms,
            effective_permille: st.effective_permille,
            exhausted: st.exhausted.map(|h| ExhaustedView::new(h, now_ms)),
            tenants: st
                .tenants
                .into_iter()
                .map(|t| {
                    // Configured tenants only: the others count together.
                    let configured = t.weight.is_some() || t.share_permille.is_some();
                    let recent_share = (configured && !recent.is_empty())
                        .then(|| recent.get(&t.name).copied().unwrap_or(0.0));
                    TenantView {
                        name: t.name,
                        weight: t.weight,
                        share: t.share_permille.map(|s| f64::from(s) / 1_000.0),
                        active: t.active,
                        booked_ahead_ms: t.ahead_ms,
                        recent_share,
                    }
                })
                .collect(),
        }
    }
}

/// What `POST /admin/providers/{provider}/{model}/clear` cleared.
#[derive(Debug, Serialize)]
pub struct ClearedView {
    /// The end of the shared cooldown that was cleared (`null`: none was
    /// live).
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate before, permille (1000: AIMD was at full rate).
    pub effective_permille: u32,
    /// This replica's exhaustion hold that was cleared (`null`: none).
    pub exhausted: Option<ExhaustedView>,
}

async fn providers<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
) -> Result<Json<serde_json::Value>, HttpError> {
    let governor = app.providers();
    let now = || governor.clock().now_ms();
    let all = governor
        .statuses()
        .await
        .map_err(|e| crate::outcome::from_provider(e, now()))?;
    let now = now();
    let views: Vec<ProviderView> = all
        .into_iter()
        .map(|st| {
            let recent = app
                .metrics()
                .recent_tenant_shares(&st.provider, &st.model, now);
            ProviderView::new(st, now, &recent)
        })
        .collect();
    Ok(Json(serde_json::json!({ "providers": views })))
}

async fn provider<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((provider, model)): Path<(String, String)>,
) -> Result<Json<ProviderView>, HttpError> {
    path_id(&provider, "provider")?;
    path_id(&model, "model")?;
    let governor = app.providers();
    let st = governor
        .status(&provider, &model)
        .await
        .map_err(|e| crate::outcome::from_provider(e, governor.clock().now_ms()))?;
    let now = governor.clock().now_ms();
    let recent = app
        .metrics()
        .recent_tenant_shares(&st.provider, &st.model, now);
    Ok(Json(ProviderView::new(st, now, &recent)))
}

async fn clear_provider<S: Store + Clone>(
    _: Admin,
    State(app): State<App<S>>,
    Path((provider, model)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, HttpError> {
    path_id(&provider, "provider")?;
    path_id(&model, "model")?;
    let governor = app.providers();
    let out = governor
        .clear(&provider, &model)
        .await
        .map_err(|e| crate::outcome::from_provider(e, governor.clock().now_ms()))?;
    app.metrics()
        .provider_rate(&provider, &model, tollgate_core::aimd::FULL);
    app.metrics().provider_cooldown(&provider, &model, 0);
    tracing::info!(
        provider,
        model,
        cooldown_until_ms = out.cooldown_until_ms,
        effective_permille = out.effective_permille,
        exhausted = out.exhausted.as_ref().map(|h| h.reason.as_str()),
        "admin: provider key cleared (cooldown, AIMD, this replica's exhaustion)"
    );
    let now = governor.clock().now_ms();
    let cleared = ClearedView {
        cooldown_until_ms: out.cooldown_until_ms,
        effective_permille: out.effective_permille,
        exhausted: out.exhausted.map(|h| ExhaustedView::new(h, now)),
    };
    Ok(Json(serde_json::json!({
        "provider": provider,
        "model": model,
        "cleared": cleared,
    })))
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
            "/admin/users/{id}/budgets/{window}/reset",
            post(budget_reset::<S>),
        )
        .route(
            "/admin/users/{id}/budgets/{window}/top_up",
            post(budget_top_up::<S>),
        )
        .route(
            "/admin/users/{id}/leases/{invocation_id}",
            delete(release::<S>),
        )
        .route("/admin/top", get(top::<S>))
        .route("/admin/reload", post(reload::<S>))
        .route("/admin/providers", get(providers::<S>))
        .route("/admin/providers/{provider}/{model}", get(provider::<S>))
        .route(
            "/admin/providers/{provider}/{model}/clear",
            post(clear_provider::<S>),
        )
}
