//! # tollgate-tower
//!
//! A [`tower`] layer that pre-checks each verified user's **turn rate** at the
//! edge of a Rust HTTP service (axum, hyper, tonic), with the same plans,
//! store and refusals as `tollgate serve` (SPEC §3, §8).
//!
//! For every request, [`TurnRate`]:
//!
//! 1. asks the [`IdentityExtractor`] for the verified user. None → **401**
//!    `{"error":"unauthorized","message":…}`; the inner service is not called.
//! 2. admits a turn for that user with [`Limiter::admit_turn`] under a fresh,
//!    unique invocation id, and releases that run lease at once: the request
//!    is charged one turn from the user's turn bucket, is refused while the
//!    user is at its concurrent-run cap, and holds no lease afterwards.
//! 3. **Denied** → **429** with `Retry-After` (whole seconds, rounded up),
//!    `RateLimit-Remaining: 0`, `RateLimit-Reset` and the SPEC §8 body
//!    `{"error":"turn_rate","limit":"turn_rate","retry_after_ms":2000,"message":…}`
//!    (`concurrency` likewise). The inner service is not called.
//! 4. **Store unavailable** → **503** `{"error":"store_unavailable",…}`
//!    (fail closed; the detail goes to the log). A user without a plan is
//!    401, an unusable user id 400 `invalid_request`, and a non-transient
//!    store fault 500 `internal`, exactly as the sidecar answers them.
//!    The layer never panics on a request and never fails it with an error.
//! 5. **Allowed** → calls the inner service with a [`TurnChecked`] request
//!    extension. If the plan is in shadow mode and enforcement would have
//!    refused, the response carries [`SHADOW_DENIED_HEADER`]
//!    (`x-tollgate-shadow-denied: turn_rate`).
//!
//! The layer charges the turn. A service behind it that also admits its run
//! through the same limiter ([`Limiter::admit_turn`] or the sidecar's
//! `POST /v1/runs`) charges the turn bucket a second time; use one or the
//! other for a given request.
//!
//! ## Design
//!
//! * **Admit + release, nothing added to core.** Turn admission is atomic
//!   over the turn bucket and the lease set (SPEC §3), so a pre-check is an
//!   admission whose lease is given back straight away: two store operations,
//!   the same numbers as the sidecar, and concurrency refusals for free. The
//!   invocation id is a per-process random salt plus a counter, so it never
//!   collides with another request's live lease (which would be refreshed
//!   instead of charged). If the release fails, the lease expires after the
//!   plan's `lease_ttl_ms` and the request still goes through.
//! * **Readiness.** `poll_ready` delegates to the inner service; the limiter
//!   is async and is consulted inside the [`ResponseFuture`]. See
//!   [`TurnRate`].
//! * **Response body.** The layer answers `Response<`[`ResponseBody<B>`]`>`,
//!   an [`http_body_util::Either`] of the inner body `B` and the refusal's
//!   `Full<Bytes>`. It needs nothing of `B` beyond what the caller's server
//!   needs already, and axum's `Router::layer` accepts it as is.
//! * **Errors.** The service's error type is the inner service's: every
//!   refusal, store faults included, is a response, mapped once in one table
//!   that mirrors the sidecar's (STYLE §1.7). With axum, whose inner
//!   services are infallible, no `HandleErrorLayer` is needed.
//! * **Time.** All time comes from the limiter's (store's) clock; the layer
//!   reads none.
//! * **Fail open.** The layer fails closed. For SPEC §6 `fail_open`, give it
//!   a limiter over a store that falls back to a local one.
//!
//! ## Example
//!
//! An axum app whose identity comes from an `x-user` header that a trusted,
//! authenticating proxy sets (see [`HeaderIdentity`]):
//!
//! ```rust
//! use std::sync::Arc;
//!
//! use axum::{Router, body::Body, routing::post};
//! use http::{Request, StatusCode};
//! use tollgate_core::{Limiter, MemoryStore, PlansConfig, SystemClock};
//! use tollgate_tower::{HeaderIdentity, TurnRateLayer};
//! use tower::ServiceExt;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let plans: PlansConfig = serde_json::from_str(r#"{
//!   "default_plan": "support",
//!   "plans": { "support": {
//!     "turns":  { "amount": 20,    "period_ms": 60000, "burst": 5 },
//!     "tokens": { "amount": 60000, "period_ms": 60000 },
//!     "concurrent_runs": 2, "max_wait_ms": 2000 } }
//! }"#)?;
//! let limiter = Arc::new(Limiter::new(
//!     MemoryStore::new(SystemClock),
//!     SystemClock,
//!     plans.validate()?,
//! ));
//!
//! let app = Router::new()
//!     .route("/chat", post(|| async { "a turn" }))
//!     .layer(TurnRateLayer::new(limiter, HeaderIdentity::from_static("x-user")));
//!
//! let turn = || Request::post("/chat").header("x-user", "u42").body(Body::empty());
//! for _ in 0..5 {
//!     assert_eq!(app.clone().oneshot(turn()?).await?.status(), StatusCode::OK);
//! }
//! let refused = app.clone().oneshot(turn()?).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(refused.headers().contains_key("retry-after"));
//!
//! let anonymous = Request::post("/chat").body(Body::empty())?;
//! assert_eq!(app.oneshot(anonymous).await?.status(), StatusCode::UNAUTHORIZED);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! `examples/axum.rs` is the same app as a server.
//!
//! [`tower`]: https://docs.rs/tower/0.5
//! [`Limiter::admit_turn`]: tollgate_core::Limiter::admit_turn

mod error;
mod future;
mod identity;
mod layer;
mod service;

pub use future::{ResponseBody, ResponseFuture};
pub use identity::{HeaderIdentity, IdentityExtractor};
pub use layer::TurnRateLayer;
pub use service::{SHADOW_DENIED_HEADER, TurnChecked, TurnRate};
