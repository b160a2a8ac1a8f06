//! [`TurnExecutor`]: a turn's replica permit, session lease and run lease
//! around `Runner::run`, held while it runs and freed exactly once.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use adk_core::{AdkError, Content, Event, EventStream, RunConfig, SessionId, UserId};
use adk_runner::Runner;
use futures::Stream;
use tollgate_core::session::{
    DEFAULT_SESSION_TTL_MS, SessionAdmit, SessionLease, renew_every_ms, renewable_ttl,
};
use tollgate_core::{
    Clock, Decision, Denial, Id, Limiter, LimiterError, Overloaded, ReplicaGate, ReplicaPermit,
    Store,
};

use crate::fence::{TurnFence, poll_with_fence, session_key};

/// Why a turn was not started. Every variant says whether and when a retry
/// can help ([`retry_after_ms`](Self::retry_after_ms)).
#[derive(Debug)]
#[non_exhaustive]
pub enum TurnError {
    /// This replica is at its in-flight cap; retry in 1 s (here or on
    /// another replica). HTTP: 429 `overloaded` with `Retry-After: 1`.
    Overloaded(Overloaded),
    /// Another turn of this session is running. HTTP: 409 `session_busy`.
    SessionBusy {
        /// The other turn's remaining session lease, ms.
        retry_after_ms: u64,
    },
    /// The user's turn rate or concurrent runs refused the turn (SPEC §3).
    Denied(Denial),
    /// The limiter failed: the store is unreachable (under `fail_closed`),
    /// the user has no plan, or an id is invalid.
    Limiter(LimiterError),
    /// The runner could not start the invocation.
    Runner(AdkError),
    /// The session database could not issue the turn's database fence
    /// (sessions in PostgreSQL: `TurnExecutor::with_postgres_sessions`,
    /// `postgres` feature);
    /// retryable when the database was unreachable.
    SessionStore(AdkError),
}

impl TurnError {
    /// When retrying can succeed, in ms; `None` if it cannot help (or, for
    /// a limiter or runner failure, is not known to).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            TurnError::Overloaded(o) => Some(o.retry_after_ms()),
            TurnError::SessionBusy { retry_after_ms } => Some(*retry_after_ms),
            TurnError::Denied(d) => d.retry_after_ms(),
            TurnError::Limiter(_) | TurnError::Runner(_) | TurnError::SessionStore(_) => None,
        }
    }

    /// Whether the same turn can be retried later.
    pub fn is_retryable(&self) -> bool {
        match self {
            TurnError::Limiter(e) => e.is_transient(),
            TurnError::SessionStore(e) => e.category == adk_core::ErrorCategory::Unavailable,
            _ => self.retry_after_ms().is_some(),
        }
    }
}

impl fmt::Display for TurnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TurnError::Overloaded(_) => f.write_str("this replica is at its in-flight cap"),
            TurnError::SessionBusy { retry_after_ms } => write!(
                f,
                "a turn is already running in this session (retry in {retry_after_ms} ms)"
            ),
            TurnError::Denied(d) => write!(f, "turn denied: {d}"),
            TurnError::Limiter(e) => write!(f, "turn not admitted: {e}"),
            TurnError::Runner(e) => write!(f, "turn not started: {e}"),
            TurnError::SessionStore(e) => write!(f, "turn not started: no database fence: {e}"),
        }
    }
}

impl std::error::Error for TurnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TurnError::Limiter(e) => Some(e),
            TurnError::Runner(e) | TurnError::SessionStore(e) => Some(e),
            _ => None,
        }
    }
}

/// Runs adk turns under tollgate's per-replica, per-session and per-user
/// limits (SPEC §3–4).
///
/// [`execute`](Self::execute) takes, in this order: a place in the
/// replica's [`ReplicaGate`] (never waits: [`TurnError::Overloaded`] when
/// full), the session lease (holder: the invocation id;
/// [`TurnError::SessionBusy`] when another turn holds it), then the turn
/// admission (turn bucket and run lease; [`TurnError::Denied`], after which
/// the session lease is released at once). Each failed attempt gives its
/// place back, so every retried call holds exactly one place at a time.
///
/// The returned [`TurnStream`] is the runner's event stream. While it is
/// polled, the turn's fence is the current one for
/// [`FencedSessionService`](crate::FencedSessionService) appends (see
/// [`TurnFence`]); a task renews the session lease and the run lease every
/// third of the shorter TTL, on the limiter's clock. When the stream ends,
/// fails or is dropped, the place, the session lease and the run lease are
/// freed exactly once — a client that disconnects frees its slot at once
/// instead of after the TTL. Renewal and release on drop run on spawned
/// tasks: a tokio runtime must be running.
///
/// The session must exist before its turn starts (adk's runner would
/// otherwise try to create it while the turn holds its lease, and a
/// [`FencedSessionService`](crate::FencedSessionService) refuses that as
/// busy).
///
/// The identity is the `user_id` passed to `execute`, which the host must
/// take from a verified principal. With this executor the runner does not
/// need the [`AdmissionPlugin`](crate::AdmissionPlugin) (if it has it, the
/// plugin's admission of the same invocation is an idempotent refresh).
pub struct TurnExecutor<S> {
    runner: Arc<Runner>,
    limiter: Arc<Limiter<S>>,
    gate: ReplicaGate,
    session_ttl_ms: u64,
    #[cfg(feature = "postgres")]
    postgres: Option<Arc<crate::postgres::PgSessionService>>,
}

impl<S> fmt::Debug for TurnExecutor<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnExecutor")
            .field("gate", &self.gate)
            .field("session_ttl_ms", &self.session_ttl_ms)
            .finish_non_exhaustive()
    }
}

impl<S: Store> TurnExecutor<S> {
    /// Runs turns of `runner`, admitted by `limiter`, at most as many at
    /// once on this replica as `gate` allows; session leases last
    /// [`DEFAULT_SESSION_TTL_MS`] (30 s, renewed every 10 s while the turn
    /// runs).
    pub fn new(runner: Arc<Runner>, limiter: Arc<Limiter<S>>, gate: ReplicaGate) -> Self {
        Self {
            runner,
            limiter,
            gate,
            session_ttl_ms: DEFAULT_SESSION_TTL_MS,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// Takes each turn's database fence from `sessions` (sessions in
    /// PostgreSQL, docs/spec.md §4): after the session lease and the
    /// admission, the turn takes the session's next database fence, which
    /// its appends then carry ([`TurnFence::db`]); the runner must keep its
    /// sessions in the same service. If the database cannot issue it, the
    /// turn is not started ([`TurnError::SessionStore`]) and its leases
    /// are released.
    #[cfg(feature = "postgres")]
    pub fn with_postgres_sessions(
        mut self,
        sessions: Arc<crate::postgres::PgSessionService>,
    ) -> Self {
        self.postgres = Some(sessions);
        self
    }

    /// Sets the session lease TTL (at least 3 ms, so it can be renewed
    /// every third of it: [`renewable_ttl`]).
    pub fn with_session_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.session_ttl_ms = renewable_ttl(ttl_ms);
        self
    }

    /// The replica gate (its `in_flight()` is the autoscaling signal).
    pub fn gate(&self) -> &ReplicaGate {
        &self.gate
    }

    /// The runner.
    pub fn runner(&self) -> &Arc<Runner> {
        &self.runner
    }

    /// Starts a turn: `content` from `user_id` in `session_id` (which must
    /// exist), with the runner's run config.
    ///
    /// # Errors
    ///
    /// [`TurnError`]: overloaded, session busy, denied, limiter or runner
    /// failure. Nothing is held after an error.
    pub async fn execute(
        &self,
        user_id: UserId,
        session_id: SessionId,
        content: Content,
    ) -> Result<TurnStream<S>, TurnError> {
        self.execute_with_config(user_id, session_id, content, None)
            .await
    }

    /// [`execute`](Self::execute) with a per-turn run config.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub async fn execute_with_config(
        &self,
        user_id: UserId,
        session_id: SessionId,
        content: Content,
        run_config: Option<RunConfig>,
    ) -> Result<TurnStream<S>, TurnError> {
        let permit = self.gate.try_acquire().map_err(TurnError::Overloaded)?;
        let user = user_id.to_string();
        let key = session_key(self.runner.app_name(), &user, session_id.as_ref());
        #[cfg(feature = "postgres")]
        let db_session = session_id.to_string();
        // One snapshot of the user's plan for the admission and the
        // renewal period.
        let for_user = self.limiter.user(&user).map_err(TurnError::Limiter)?;
        let lease_ttl_ms = for_user.plan().lease_ttl_ms;
        // Registered, not run: nothing happens until the stream is polled.
        let invocation = self
            .runner
            .start_with_config(user_id, session_id, content, run_config)
            .await
            .map_err(TurnError::Runner)?;
        let invocation_id = invocation.invocation_id().to_string();

        let lease = SessionLease {
            key: &key,
            ttl_ms: self.session_ttl_ms,
        };
        let admitted = for_user
            .admit_turn_in_session(
                Id::new(&invocation_id).map_err(|e| {
                    TurnError::Limiter(LimiterError::invalid("invocation_id", e.to_string()))
                })?,
                Some(lease),
            )
            .await
            .map_err(TurnError::Limiter)?;
        drop(for_user);
        let turn = match admitted {
            SessionAdmit::Busy { retry_after_ms } => {
                return Err(TurnError::SessionBusy { retry_after_ms });
            }
            SessionAdmit::Decided(Decision::Denied(denial)) => {
                return Err(TurnError::Denied(denial));
            }
            SessionAdmit::Decided(Decision::Allowed {
                grant,
                shadow_denied,
            }) => {
                if let Some(denial) = shadow_denied {
                    tracing::info!(user, invocation = invocation_id, %denial, "turn allowed by shadow mode");
                }
                grant
            }
        };
        let Some(session) = turn.session else {
            unreachable!("a turn admitted in a named session holds its lease");
        };

        #[cfg(feature = "postgres")]
        let db_names = (user.clone(), db_session);
        let held = Held {
            limiter: Arc::clone(&self.limiter),
            user,
            invocation_id,
            session_key: key.clone(),
            session_ttl_ms: self.session_ttl_ms,
        };
        let period = renew_every_ms(self.session_ttl_ms.min(lease_ttl_ms));
        let renewal = spawn_renewal(held.clone(), Arc::clone(self.limiter.clock()), period);
        #[allow(unused_mut)] // without the postgres feature
        let mut stream = TurnStream {
            inner: invocation.into_events(),
            fence: Arc::new(TurnFence {
                session_key: key,
                fence: session.fence,
                db: None,
            }),
            guard: Some(Guard {
                held,
                permit,
                renewal,
            }),
            releasing: None,
            done: false,
        };
        #[cfg(feature = "postgres")]
        if let Some(sessions) = &self.postgres {
            // On an error the stream is dropped unpolled: its leases are
            // released.
            let db = sessions
                .take_fence(self.runner.app_name(), &db_names.0, &db_names.1)
                .await
                .map_err(TurnError::SessionStore)?;
            stream.fence = Arc::new(TurnFence {
                db: Some(db),
                ..(*stream.fence).clone()
            });
        }
        Ok(stream)
    }
}

/// What a running turn holds in the store.
struct Held<S> {
    limiter: Arc<Limiter<S>>,
    user: String,
    invocation_id: String,
    session_key: String,
    session_ttl_ms: u64,
}

impl<S> Clone for Held<S> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            user: self.user.clone(),
            invocation_id: self.invocation_id.clone(),
            session_key: self.session_key.clone(),
            session_ttl_ms: self.session_ttl_ms,
        }
    }
}

impl<S: Store> Held<S> {
    /// Renews both leases; answers whether both are still held.
    async fn renew(&self) -> bool {
        let session = self
            .limiter
            .renew_session(&self.session_key, &self.invocation_id, self.session_ttl_ms)
            .await;
        let session_held = match session {
            Ok(Some(_)) => true,
            Ok(None) => {
                tracing::warn!(
                    session = self.session_key,
                    invocation = self.invocation_id,
                    "session lease lost: another turn may hold the session; this turn's appends will be rejected"
                );
                false
            }
            Err(error) => {
                tracing::warn!(session = self.session_key, %error, "session lease renewal failed; retrying at the next period");
                true
            }
        };
        let run_held = match self
            .limiter
            .renew_run(&self.user, &self.invocation_id)
            .await
        {
            Ok(Some(_)) => true,
            Ok(None) => {
                tracing::warn!(
                    user = self.user,
                    invocation = self.invocation_id,
                    "run lease lost"
                );
                false
            }
            Err(error) => {
                tracing::warn!(user = self.user, %error, "run lease renewal failed; retrying at the next period");
                true
            }
        };
        session_held && run_held
    }

    /// Releases both leases (each a no-op if already gone).
    async fn release(self) {
        if let Err(error) = self
            .limiter
            .release_session(&self.session_key, &self.invocation_id)
            .await
        {
            tracing::warn!(session = self.session_key, %error, "session lease not released; it expires by its TTL");
        }
        if let Err(error) = self
            .limiter
            .release_run(&self.user, &self.invocation_id)
            .await
        {
            tracing::warn!(user = self.user, invocation = self.invocation_id, %error, "run lease not released; it expires by its TTL");
        }
    }
}

/// Renews the leases every `period_ms` on `clock` until aborted or lost.
fn spawn_renewal<S: Store>(
    held: Held<S>,
    clock: Arc<dyn Clock>,
    period_ms: u64,
) -> Option<tokio::task::JoinHandle<()>> {
    let handle = match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle,
        Err(_) => {
            tracing::warn!("no tokio runtime: a turn's leases are not renewed");
            return None;
        }
    };
    Some(handle.spawn(async move {
        loop {
            let next = clock.now_ms().saturating_add(period_ms);
            clock.sleep_until(next).await;
            if !held.renew().await {
                return;
            }
        }
    }))
}

/// Everything a turn holds until it ends.
struct Guard<S> {
    held: Held<S>,
    permit: ReplicaPermit,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl<S: Store> Guard<S> {
    /// Stops renewing, frees the place, and answers the release of the
    /// leases to run.
    fn release(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        if let Some(renewal) = &self.renewal {
            renewal.abort();
        }
        drop(self.permit);
        Box::pin(self.held.release())
    }
}

/// The event stream of a turn started by [`TurnExecutor::execute`]. It
/// holds the turn's place, session lease and run lease until it ends or is
/// dropped.
pub struct TurnStream<S: Store> {
    inner: EventStream,
    fence: Arc<TurnFence>,
    guard: Option<Guard<S>>,
    releasing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    done: bool,
}

impl<S: Store> fmt::Debug for TurnStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnStream")
            .field("fence", &self.fence)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<S: Store> TurnStream<S> {
    /// The turn's invocation id (the run lease and session lease holder).
    pub fn invocation_id(&self) -> Option<&str> {
        self.guard.as_ref().map(|g| g.held.invocation_id.as_str())
    }

    /// The fence the turn holds on its session.
    pub fn fence(&self) -> &TurnFence {
        &self.fence
    }
}

impl<S: Store> Stream for TurnStream<S> {
    type Item = adk_core::Result<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(releasing) = &mut this.releasing {
                std::task::ready!(releasing.as_mut().poll(cx));
                this.releasing = None;
                return Poll::Ready(None);
            }
            if this.done {
                return Poll::Ready(None);
            }
            let fence = &this.fence;
            let inner = &mut this.inner;
            match std::task::ready!(poll_with_fence(fence, || inner.as_mut().poll_next(cx))) {
                Some(item) => return Poll::Ready(Some(item)),
                None => {
                    this.done = true;
                    if let Some(guard) = this.guard.take() {
                        this.releasing = Some(guard.release());
                    }
                }
            }
        }
    }
}

impl<S: Store> Drop for TurnStream<S> {
    fn drop(&mut self) {
        let pending = match (self.guard.take(), self.releasing.take()) {
            (Some(guard), _) => guard.release(),
            (None, Some(releasing)) => releasing,
            (None, None) => return,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(pending);
            }
            Err(_) => {
                tracing::warn!("no tokio runtime: a dropped turn's leases expire by their TTL")
            }
        }
    }
}
