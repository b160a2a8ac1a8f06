//! The failure policy of SPEC §6: when the shared store fails, fail closed
//! (a typed `Unavailable` error) or fail open (decide from a local
//! in-memory store whose rates are scaled by `fallback_share`), and lose
//! nothing either way.
//!
//! - **Breaker.** A circuit breaker (`breaker.rs`) decides when the store is
//!   failing: K transient faults in a row, or a failure ratio over a window
//!   ([`BreakerConfig`]). While it is open nothing is sent to the store;
//!   after `open_ms` one probe at a time asks it again. One slow call does
//!   not send a replica's every user to the policy. Transient faults are
//!   the store unreachable, slow, busy (`BUSY`) or out of memory (`OOM`).
//! - **Closes are journalled.** A settle, refund or release of something the
//!   shared store issued is never answered by the local store: while the
//!   shared store fails it is kept in a bounded per-replica journal (by
//!   count, and by age: [`RESERVATION_RETENTION_MS`]) and answered
//!   [`SettleOutcome::Pending`] / [`Release::Pending`]; a full journal is a
//!   [`StoreErrorKind::Full`] error (retry). The journal is replayed when the
//!   store answers again; each close is idempotent by id, so replay is
//!   harmless. A renew is not a close: while the store fails, a lease the
//!   local store does not hold cannot be renewed (an `Unavailable` error).
//! - **Fallback decisions are reconciled.** Ids the local store issues name
//!   this replica ([`ReservationId::fallback`]), so they never collide with
//!   the shared store's. What it charged per user (turns taken, tokens net
//!   of settles and refunds) is owed to the shared store and charged there
//!   ([`Store::reconcile`]) when it answers again, so a user who spent
//!   during an outage does not find a fresh bucket. A call that failed
//!   after it was sent may have run on the shared store: every reserve
//!   carries a request id, and reconciliation refunds a reserve the store
//!   did run (or marks its id so a late copy takes nothing), and charges
//!   no turn for an admission whose lease the store holds. A reserve
//!   refused after it was sent (fail-closed, under an id this replica
//!   generated) is checked the same way, so a refusal costs nothing.
//!   Reconciliation itself is charged once: a user's charges go as a
//!   numbered batch ([`ReconcileRequest::batch`]), a batch whose answer was
//!   lost is retried as it is, and the store applies each batch once.
//!
//! Session leases and fenced appends (the grouped session writes
//! included: [`Store::session_create`], [`Store::session_append`],
//! [`Store::session_delete`]) always fail closed: two holders must never
//! both believe they hold a session. So does clearing a provider
//! key's cooldown and AIMD state (an operator's write,
//! [`Store::clear_provider`]): cleared only in the local store, the fleet's
//! shared state would be untouched while the operator was told it was
//! cleared. When the shared store has cleared it, this replica's fallback
//! state for the key is cleared too. Session claims
//! ([`Store::claim_session`]) fail closed with the sessions they count. A
//! permanent fault (bad credentials, a failing script) is passed through,
//! never hidden by a fallback. Provider buckets the local store takes from
//! under fail-open are not reconciled (they are fleet-wide, not a user's).
//!
//! The journal and the owed charges are in memory: a replica that crashes
//! during an outage loses them (SPEC §6).
//!
//! [`RESERVATION_RETENTION_MS`]: crate::store::RESERVATION_RETENTION_MS
//! [`SettleOutcome::Pending`]: crate::store::SettleOutcome::Pending
//! [`Release::Pending`]: crate::store::Release::Pending
//! [`ReconcileRequest::batch`]: crate::store::ReconcileRequest::batch

mod breaker;
mod journal;
mod reconcile;
mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::store::ReservationId;
use crate::{Clock, MemoryStore, Store, StoreError, StoreErrorKind};

pub use breaker::{BreakerConfig, BreakerState};
pub(crate) use store::{scale_checks, scale_spec, scale_turn};

use breaker::{Breaker, Pass, Transition};
use journal::Journal;
use reconcile::Owed;

/// What to do while the shared store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Refuse to decide: every operation fails with a transient
    /// `Unavailable` error (the sidecar answers 503). Closes are still
    /// journalled.
    FailClosed,
    /// Decide from a local in-memory store, with every rate, burst and
    /// concurrency cap scaled by `fallback_share` (set 1/N for N replicas so
    /// the fleet does not get N times the limit). Must be in (0, 1].
    FailOpen {
        /// This replica's share of each limit while the store is down.
        fallback_share: f64,
    },
}

/// A `fallback_share` outside (0, 1].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("fallback_share must be in (0, 1], got {0}")]
pub struct InvalidShare(pub f64);

/// One decision taken while the shared store was unreachable, for metrics.
#[derive(Debug, Clone, Copy)]
pub struct FallbackEvent<'a> {
    /// The operation (`admit_turn`, `reserve_tokens`, …).
    pub op: &'static str,
    /// `true`: decided by the local store (fail open); `false`: refused
    /// (fail closed, or an operation that always fails closed).
    pub local: bool,
    /// The fault that sent it here; `None` when the store was not asked
    /// (the breaker is open).
    pub cause: Option<&'a StoreError>,
}

/// Default most closes the journal holds.
pub const DEFAULT_JOURNAL_CAPACITY: usize = 100_000;

/// The journal now: how many closes wait and since when.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Closes waiting to be applied.
    pub depth: usize,
    /// When the oldest was accepted, ms on the failover's clock (0: empty).
    pub oldest_at_ms: u64,
    /// Most closes it holds.
    pub capacity: usize,
    /// Closes dropped unapplied because they outlived the reservation
    /// retention, since start.
    pub expired: u64,
}

/// What one [`Failover::recover`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Users whose owed charges were reconciled.
    pub users: usize,
    /// Turns charged to the shared store.
    pub turns: u64,
    /// Tokens charged to the shared store (net).
    pub tokens: i64,
    /// Ambiguous reserves the shared store had run, refunded there.
    pub refunded: u32,
    /// Journalled closes applied.
    pub replayed: usize,
    /// Closes still waiting (the store failed again meanwhile).
    pub remaining: usize,
}

type Hook = Arc<dyn Fn(FallbackEvent<'_>) + Send + Sync>;
type FullHook = Arc<dyn Fn(&'static str) + Send + Sync>;
type TransitionHook = Arc<dyn Fn(BreakerState, BreakerState) + Send + Sync>;

/// A [`Store`] that applies a [`FailurePolicy`] to another one.
#[derive(Clone)]
pub struct Failover<S> {
    primary: S,
    inner: Arc<Inner>,
}

struct Inner {
    fallback: MemoryStore,
    clock: Arc<dyn Clock>,
    policy: FailurePolicy,
    breaker: Breaker,
    tag: u32,
    journal_capacity: usize,
    journal: Mutex<Journal>,
    owed: Mutex<HashMap<String, Owed>>,
    dirty: AtomicBool,
    /// Whether the journal may hold an abandoned admission's release
    /// (set when one is journalled, cleared when a look finds none): until
    /// it does, an admission need not look.
    abandoned: AtomicBool,
    /// Decisions the local store made ([`Store::fallback_decisions`]).
    local_decisions: AtomicU64,
    /// Whether the local store has decided anything yet: until it has,
    /// releases, renewals and request-id repeats need not ask it (the
    /// common path stays one store call).
    local_used: AtomicBool,
    recovering: AtomicBool,
    recovery: tokio::sync::Mutex<()>,
    next_request: AtomicU64,
    next_batch: AtomicU64,
    hook: Option<Hook>,
    on_full: Arc<std::sync::OnceLock<FullHook>>,
    on_transition: Option<TransitionHook>,
}

impl<S> std::fmt::Debug for Failover<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field("policy", &self.inner.policy)
            .field("breaker", &self.inner.breaker.state())
            .field("tag", &format_args!("{:08x}", self.inner.tag))
            .finish_non_exhaustive()
    }
}

/// An attempt on the shared store.
enum Attempt<T> {
    /// It answered (a value, or a permanent error that no policy hides).
    Done(Result<T, StoreError>),
    /// It failed transiently (`Some`: the fault; the call may have run) or
    /// was not asked (`None`: the breaker is open).
    Failed(Option<StoreError>),
}

/// A process-unique tag for this replica's fallback ids: the clock and the
/// process id through std's randomly keyed hasher.
fn replica_tag(now: u64) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now);
    h.write_u32(std::process::id());
    h.finish() as u32
}

impl<S: Store + Clone> Failover<S> {
    /// Applies `policy` to `primary`; `clock` times the breaker and drives
    /// the local store.
    ///
    /// # Errors
    ///
    /// A fail-open share outside (0, 1].
    pub fn new(primary: S, policy: FailurePolicy, clock: impl Clock) -> Result<Self, InvalidShare> {
        if let FailurePolicy::FailOpen { fallback_share } = policy
            && !(fallback_share > 0.0 && fallback_share <= 1.0)
        {
            return Err(InvalidShare(fallback_share));
        }
        let clock: Arc<dyn Clock> = Arc::new(clock);
        Ok(Self {
            primary,
            inner: Arc::new(Inner {
                fallback: MemoryStore::new(clock.clone()),
                tag: replica_tag(clock.now_ms()),
                clock,
                policy,
                breaker: Breaker::new(BreakerConfig::default()),
                journal_capacity: DEFAULT_JOURNAL_CAPACITY,
                journal: Mutex::default(),
                owed: Mutex::default(),
                dirty: AtomicBool::new(false),
                abandoned: AtomicBool::new(false),
                local_decisions: AtomicU64::new(0),
                local_used: AtomicBool::new(false),
                recovering: AtomicBool::new(false),
                recovery: tokio::sync::Mutex::new(()),
                next_request: AtomicU64::new(0),
                next_batch: AtomicU64::new(1),
                hook: None,
                on_full: Arc::default(),
                on_transition: None,
            }),
        })
    }

    /// The same store, calling `hook` for every decision taken while the
    /// shared store was unreachable (the server counts them).
    pub fn with_hook(self, hook: impl Fn(FallbackEvent<'_>) + Send + Sync + 'static) -> Self {
        self.rebuild(|i| i.hook = Some(Arc::new(hook)))
    }

    /// The same store, calling `hook(from, to)` at every breaker transition
    /// (each is also logged).
    pub fn on_transition(
        self,
        hook: impl Fn(BreakerState, BreakerState) + Send + Sync + 'static,
    ) -> Self {
        self.rebuild(|i| i.on_transition = Some(Arc::new(hook)))
    }

    /// The same store with another breaker.
    pub fn with_breaker(self, config: BreakerConfig) -> Self {
        self.rebuild(|i| i.breaker = Breaker::new(config))
    }

    /// The same store with the breaker open for `ms` after it trips.
    pub fn with_probe_interval_ms(self, ms: u64) -> Self {
        let config = BreakerConfig {
            open_ms: ms,
            ..self.inner.breaker.config()
        };
        self.with_breaker(config)
    }

    /// The same store with a journal of at most `n` closes (at least 1).
    pub fn with_journal_capacity(self, n: usize) -> Self {
        self.rebuild(|i| i.journal_capacity = n.max(1))
    }

    /// Rebuilds before first use (builder methods): the state is fresh.
    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Self {
        let i = &self.inner;
        let mut inner = Inner {
            fallback: i.fallback.clone(),
            clock: i.clock.clone(),
            policy: i.policy,
            breaker: Breaker::new(i.breaker.config()),
            tag: i.tag,
            journal_capacity: i.journal_capacity,
            journal: Mutex::default(),
            owed: Mutex::default(),
            dirty: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            local_decisions: AtomicU64::new(0),
            local_used: AtomicBool::new(false),
            recovering: AtomicBool::new(false),
            recovery: tokio::sync::Mutex::new(()),
            next_request: AtomicU64::new(0),
            next_batch: AtomicU64::new(1),
            hook: i.hook.clone(),
            on_full: i.on_full.clone(),
            on_transition: i.on_transition.clone(),
        };
        f(&mut inner);
        Self {
            primary: self.primary,
            inner: Arc::new(inner),
        }
    }

    /// Calls `hook` with the operation's name each time an operation is
    /// refused because a store is full: the shared one
    /// ([`StoreErrorKind::Full`], Redis out of memory), the local one
    /// deciding under fail-open ([`MemoryStore::on_full`]), or the journal.
    /// Set once.
    pub fn on_full(&self, hook: impl Fn(&'static str) + Send + Sync + 'static) {
        let hook: FullHook = Arc::new(hook);
        let local = hook.clone();
        self.inner.fallback.on_full(move |op| local(op));
        let _ = self.inner.on_full.set(hook);
    }

    fn count_full(&self, op: &'static str) {
        if let Some(hook) = self.inner.on_full.get() {
            hook(op);
        }
    }

    /// The wrapped store.
    pub fn primary(&self) -> &S {
        &self.primary
    }

    /// The local store that decides under fail-open (the server counts its
    /// refusals when it is full, [`MemoryStore::on_full`]).
    pub fn fallback(&self) -> &MemoryStore {
        &self.inner.fallback
    }

    /// This replica's tag in the ids its local store issues.
    pub fn tag(&self) -> u32 {
        self.inner.tag
    }

    /// Whether the shared store is considered failing now (the breaker is
    /// not closed).
    pub fn is_down(&self) -> bool {
        self.inner.breaker.state() != BreakerState::Closed
    }

    /// The breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// The journal of closes waiting for the shared store.
    pub fn journal_stats(&self) -> JournalStats {
        let j = self.inner.journal.lock();
        JournalStats {
            depth: j.entries.len(),
            oldest_at_ms: j.entries.front().map_or(0, |(at, _)| *at),
            capacity: self.inner.journal_capacity,
            expired: j.expired,
        }
    }

    /// Users with charges owed to the shared store.
    pub fn owed_users(&self) -> usize {
        self.inner
            .owed
            .lock()
            .values()
            .filter(|o| !o.is_settled())
            .count()
    }

    fn transition(&self, t: Option<Transition>, op: &'static str, e: Option<&StoreError>) {
        let Some((from, to)) = t else { return };
        match to {
            BreakerState::Open => tracing::warn!(
                op,
                error = e.map(|e| e.to_string()),
                from = from.as_str(),
                policy = ?self.inner.policy,
                "shared store failing: breaker open, applying the failure policy"
            ),
            BreakerState::HalfOpen => {
                tracing::info!(op, "breaker half-open: probing the shared store");
            }
            BreakerState::Closed => {
                tracing::warn!(op, "shared store answers again: breaker closed");
            }
        }
        if let Some(h) = &self.inner.on_transition {
            h(from, to);
        }
    }

    fn event(&self, op: &'static str, local: bool, cause: Option<&StoreError>) {
        tracing::debug!(op, local, "decision taken without the shared store");
        if let Some(h) = &self.inner.hook {
            h(FallbackEvent { op, local, cause });
        }
    }

    fn share(&self) -> Option<f64> {
        match self.inner.policy {
            FailurePolicy::FailOpen { fallback_share } => Some(fallback_share),
            FailurePolicy::FailClosed => None,
        }
    }

    fn closed(op: &'static str, cause: Option<StoreError>) -> StoreError {
        cause.unwrap_or_else(|| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("store unavailable ({op}): the shared store is failing (breaker open)"),
            )
        })
    }

    /// Sends `call` to the shared store if the breaker lets it, and tells
    /// the breaker how it went; after an answer, starts the recovery of
    /// what waits for the store, if anything does.
    async fn attempt<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Attempt<T> {
        let a = self.attempt_only(op, call).await;
        if matches!(a, Attempt::Done(_)) {
            self.recover_if_dirty();
        }
        a
    }

    fn recover_if_dirty(&self) {
        if self.inner.dirty.load(Ordering::Relaxed) {
            self.spawn_recovery();
        }
    }

    /// [`attempt`](Self::attempt) without starting the recovery.
    async fn attempt_only<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Attempt<T> {
        let clock = &*self.inner.clock;
        let (pass, t) = self.inner.breaker.pass(clock);
        self.transition(t, op, None);
        if pass == Pass::Skip {
            return Attempt::Failed(None);
        }
        match call.await {
            Err(e) if e.is_transient() || e.is_full() => {
                if e.is_full() {
                    self.count_full(op);
                }
                let t = self.inner.breaker.failure(clock, pass);
                self.transition(t, op, Some(&e));
                Attempt::Failed(Some(e))
            }
            other => {
                let t = self.inner.breaker.success(clock, pass);
                self.transition(t, op, None);
                Attempt::Done(other)
            }
        }
    }

    /// Runs `op` on the primary; on a transient fault (or while the breaker
    /// is open) answers from `local` under fail-open, or fails closed.
    /// The second value: `Some(ambiguous)` when the local store decided
    /// (`true`: the primary failed after the call was sent, so it may have
    /// run there).
    async fn decide<'a, T, P, L>(
        &'a self,
        name: &'static str,
        primary: P,
        local: impl FnOnce(&'a MemoryStore, f64) -> L,
    ) -> Result<(T, Option<bool>), StoreError>
    where
        P: Future<Output = Result<T, StoreError>>,
        L: Future<Output = Result<T, StoreError>>,
    {
        let attempt = self.attempt(name, primary).await;
        self.decide_after(name, attempt, local).await
    }

    /// [`decide`](Self::decide) once the shared store was tried.
    async fn decide_after<'a, T, L>(
        &'a self,
        name: &'static str,
        attempt: Attempt<T>,
        local: impl FnOnce(&'a MemoryStore, f64) -> L,
    ) -> Result<(T, Option<bool>), StoreError>
    where
        L: Future<Output = Result<T, StoreError>>,
    {
        let cause = match attempt {
            Attempt::Done(r) => return r.map(|v| (v, None)),
            Attempt::Failed(cause) => cause,
        };
        match self.share() {
            Some(share) => {
                self.event(name, true, cause.as_ref());
                self.inner.local_used.store(true, Ordering::Relaxed);
                self.inner.local_decisions.fetch_add(1, Ordering::Relaxed);
                let v = local(&self.inner.fallback, share).await?;
                Ok((v, Some(cause.is_some())))
            }
            None => {
                self.event(name, false, cause.as_ref());
                Err(Self::closed(name, cause))
            }
        }
    }

    /// [`decide_after`](Self::decide_after) for a request that names
    /// spend budgets whose plan keeps them from the fallback (`closed`):
    /// never decided by the fallback, whose fresh local windows would
    /// forget what the user spent, so it fails closed whatever the policy
    /// (SPEC §6).
    async fn decide_budgeted<'a, T, L>(
        &'a self,
        name: &'static str,
        attempt: Attempt<T>,
        closed: bool,
        local: impl FnOnce(&'a MemoryStore, f64) -> L,
    ) -> Result<(T, Option<bool>), StoreError>
    where
        L: Future<Output = Result<T, StoreError>>,
    {
        match attempt {
            Attempt::Failed(cause) if closed => {
                self.event(name, false, cause.as_ref());
                Err(Self::closed(name, cause))
            }
            attempt => self.decide_after(name, attempt, local).await,
        }
    }

    async fn decide_value<'a, T, P, L>(
        &'a self,
        name: &'static str,
        primary: P,
        local: impl FnOnce(&'a MemoryStore, f64) -> L,
    ) -> Result<T, StoreError>
    where
        P: Future<Output = Result<T, StoreError>>,
        L: Future<Output = Result<T, StoreError>>,
    {
        self.decide(name, primary, local).await.map(|(v, _)| v)
    }

    /// Runs an operation that always fails closed (sessions).
    async fn closed_only<T>(
        &self,
        name: &'static str,
        primary: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.attempt(name, primary).await {
            Attempt::Done(r) => r,
            Attempt::Failed(cause) => {
                self.event(name, false, cause.as_ref());
                Err(Self::closed(name, cause))
            }
        }
    }

    fn local_used(&self) -> bool {
        self.inner.local_used.load(Ordering::Relaxed)
    }

    fn request_id(&self) -> String {
        let n = self.inner.next_request.fetch_add(1, Ordering::Relaxed);
        format!("~{:08x}.{n:x}", self.inner.tag)
    }

    fn local_id(&self, mut id: ReservationId) -> ReservationId {
        id.fallback = Some(self.inner.tag);
        id
    }
}
