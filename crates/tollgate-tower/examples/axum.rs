//! An axum service whose turns are pre-checked by the tollgate turn-rate
//! layer, on the in-memory store and the wall clock.
//!
//! Identity comes from an `x-user` header that a **trusted upstream proxy**
//! sets after authenticating the caller (and strips from what clients send).
//! Without such a proxy in front, anyone could name any user: put a verifying
//! extractor (a JWT check, say) in its place.
//!
//! ```text
//! cargo run -p tollgate-tower --example axum            # listens on 127.0.0.1:3000
//! TOLLGATE_TOWER_ADDR=127.0.0.1:8080 cargo run -p tollgate-tower --example axum
//!
//! curl -i -X POST localhost:3000/chat -H 'x-user: u42'   # 200 five times, then 429
//! curl -i -X POST localhost:3000/chat                    # 401: no identity
//! ```
//!
//! Plan "support" (SPEC §7): 20 turns a minute with a burst of 5, at most 2
//! runs at once.

use std::error::Error;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::{Extension, Router};
use tollgate_core::{Limiter, MemoryStore, PlansConfig, SystemClock};
use tollgate_tower::{HeaderIdentity, TurnChecked, TurnRateLayer};

const PLANS: &str = r#"{
  "default_plan": "support",
  "plans": { "support": {
    "turns":  { "amount": 20,    "period_ms": 60000, "burst": 5 },
    "tokens": { "amount": 60000, "period_ms": 60000 },
    "concurrent_runs": 2, "max_wait_ms": 2000 } }
}"#;

/// The app: `/chat` costs a turn; `/healthz` is outside the layer.
fn app(limiter: Arc<Limiter<MemoryStore>>) -> Router {
    let turns = Router::new()
        .route("/chat", post(chat))
        .layer(TurnRateLayer::new(
            limiter,
            HeaderIdentity::from_static("x-user"),
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(turns)
}

/// A turn that got through; the layer tells the handler who it is for.
async fn chat(Extension(turn): Extension<TurnChecked>) -> String {
    format!("turn accepted for {}\n", turn.user)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let plans: PlansConfig = serde_json::from_str(PLANS)?;
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(SystemClock),
        SystemClock,
        plans.validate()?,
    ));
    let addr = std::env::var("TOLLGATE_TOWER_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(limiter))
        .with_graceful_shutdown(async {
            // If the signal handler cannot be installed, run until killed.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await?;
    Ok(())
}
