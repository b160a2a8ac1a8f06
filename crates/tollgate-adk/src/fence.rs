//! The fence a turn holds on its session, carried to the session service.
//!
//! adk-session's `append_event` carries no fence, so the fence travels
//! beside the call: while a turn's event stream is polled, the
//! [`TurnExecutor`](crate::TurnExecutor) sets the turn's [`TurnFence`] as a
//! task-local value, and [`FencedSessionService`](crate::FencedSessionService)
//! reads it for every append. A value per turn (not per session) means two
//! turns of one session in one process never share a fence: a holder whose
//! lease was taken over keeps appending with its old, now stale, number and
//! is rejected by the store.

use std::future::Future;
use std::sync::Arc;

use tollgate_core::session::SessionKey;

tokio::task_local! {
    static CURRENT: Arc<TurnFence>;
}

/// The session lease a turn holds: the store key of its session, the
/// fencing number its lease was granted and, when its session lives in
/// PostgreSQL, the database fence it took there (docs/spec.md §4,
/// *Sessions in PostgreSQL*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFence {
    /// The session's key in the store ([`session_key`]).
    pub session_key: String,
    /// The fencing number the turn's lease was granted (the lease store's;
    /// what [`FencedSessionService`](crate::FencedSessionService) checks).
    pub fence: u64,
    /// The database fence the turn took in PostgreSQL (what the
    /// PostgreSQL session service checks); `None` when the session does
    /// not live there.
    pub db: Option<DbFence>,
}

/// A session's database fence: the number (from 1) and the token
/// PostgreSQL drew with it. A writer holds one; a write is accepted only
/// while the session's fence row holds both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbFence {
    /// The number, from 1.
    pub number: i64,
    /// The token drawn with it.
    pub token: uuid::Uuid,
}

/// The store key of an adk session: its app, user and session id, joined
/// unambiguously, so two users' sessions with the same id never share a
/// lease or a history. It is core's session key of (user, session)
/// ([`SessionKey`], the key scheme every session lease uses, version 1)
/// scoped to the app's group `adk:{app}`:
/// `@{len}:adk:{app}/s1:{len(user)}:{user}/{session}`, so the session, its
/// lease and the app's and user's shared state are written in one store
/// step (see [`FencedSessionService`](crate::FencedSessionService)).
pub fn session_key(app: &str, user: &str, session: &str) -> String {
    SessionKey::scoped(&crate::sessions::app_group(app), user, session).to_string()
}

/// Runs `future` with `fence` as the current turn's fence: appends it makes
/// through a [`FencedSessionService`](crate::FencedSessionService) carry it.
/// For hosts that hold a session lease without the
/// [`TurnExecutor`](crate::TurnExecutor).
pub async fn with_fence<F: Future>(fence: TurnFence, future: F) -> F::Output {
    CURRENT.scope(Arc::new(fence), future).await
}

/// The current turn's fence, if a turn is being polled.
pub(crate) fn current_fence() -> Option<Arc<TurnFence>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// Calls `f` (one poll) with `fence` as the current turn's fence.
pub(crate) fn poll_with_fence<T>(fence: &Arc<TurnFence>, f: impl FnOnce() -> T) -> T {
    CURRENT.sync_scope(Arc::clone(fence), f)
}
