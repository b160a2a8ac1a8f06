//! # tollgate-core
//!
//! Admission control for LLM agent platforms. An agent *turn* can make fifty
//! model calls and hold memory for seconds, so tollgate limits what matters,
//! per verified user: a turn rate (deny now, with a retry hint), a token rate
//! (reserve an estimate before a model call, wait up to a limit or refuse,
//! settle with the real usage after) and concurrent-run leases; per session,
//! a lease with a fencing number; per replica, an in-flight cap.
//!
//! Everything is built on one primitive, the token bucket with debt in exact
//! integer arithmetic ([`bucket`]), and pure lease transitions ([`lease`]).
//! A [`Store`] applies them atomically ([`MemoryStore`] here; Redis in
//! `tollgate-redis`), and the [`Limiter`] resolves each user's [`Plan`]
//! once per request ([`Limiter::user`] → [`ForUser`], one snapshot of the
//! plans); ids are checked once, as an [`Id`] ([`id`]). [`session`] owns
//! session keys, lease TTLs and turns held inside a session lease.
//! [`Failover`](failover::Failover) applies the failure policy of SPEC §6
//! (fail closed, or fail open on a local store with scaled rates) to any
//! store. Time always comes from an injected [`Clock`]. Spend budgets are
//! plan data ([`budget`], with exact prices in [`money`] and calendar
//! windows in [`calendar`]) that the stores check and charge with the token
//! take ([`spend`]).
//!
//! ```
//! use tollgate_core::{FakeClock, Limiter, MemoryStore, PlansConfig};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let cfg: PlansConfig = serde_json::from_str(r#"{
//!   "default_plan": "support",
//!   "plans": { "support": {
//!     "turns":  { "amount": 20,    "period_ms": 60000, "burst": 5 },
//!     "tokens": { "amount": 60000, "period_ms": 60000 },
//!     "concurrent_runs": 2, "max_wait_ms": 2000 } }
//! }"#).unwrap();
//! let clock = FakeClock::new(0);
//! let limiter = Limiter::new(MemoryStore::new(clock.clone()), clock, cfg.validate().unwrap());
//! let turn = limiter.admit_turn("u42", "inv-1").await.unwrap();
//! assert!(turn.is_allowed());
//! let call = limiter.reserve_tokens("u42", "inv-1", 6_000).await.unwrap();
//! let id = call.grant().unwrap().id.clone();
//! limiter.settle("u42", &id, 4_500).await.unwrap();
//! assert!(limiter.release_run("u42", "inv-1").await.unwrap().released());
//! # });
//! ```

pub mod aimd;
pub mod bucket;
pub mod budget;
pub mod calendar;
pub mod clock;
pub mod decision;
pub mod error;
pub mod failover;
pub mod fair;
pub mod gate;
pub mod id;
pub mod lease;
pub mod limiter;
pub mod money;
pub mod plan;
mod refusals;
pub mod reserve;
pub mod session;
pub mod spend;
pub mod store;
pub mod take;

pub use bucket::{BucketSpec, BucketState};
pub use clock::{Clock, FakeClock, MonotonicClock, SystemClock};
pub use decision::{Decision, Denial, Limit, Outcome};
pub use error::{LimiterError, StoreError, StoreErrorKind};
pub use gate::{Overloaded, ReplicaGate, ReplicaPermit};
pub use id::{Id, IdBuf, IntoId};
pub use limiter::{ForUser, Limiter, Reservation, Reserve, RunLease, SessionsHeld, Settled, Taken};
pub use plan::{Plan, PlanBook, PlanConfig, PlanOverride, PlansConfig, RateConfig};
pub use store::memory::MemoryStore;
pub use store::{ReservationId, Store};
