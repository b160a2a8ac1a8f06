//! The failure policy of SPEC §6: when the shared store fails, fail closed
//! (a typed `Unavailable` error) or fail open (decide from a local
//! in-memory store whose rates are scaled by `fallback_share`), and lose
//! nothing either way.
//!
//! - **Breaker.** A [`Breaker`](crate::breaker) decides when the store is
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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tollgate_core::aimd::AimdParams;
use tollgate_core::lease::{Admit, SessionAcquire, SessionGrant, TurnParams};
use tollgate_core::store::{
    AppendOutcome, BucketRef, BucketTake, Claim, ClaimRequest, CooldownCheck, FenceCheck,
    MultiTake, ProviderCleared, RESERVATION_RETENTION_MS, ReconcileRequest, Reconciled, Release,
    ReservationId, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest, TakeOutcome,
    TakeRequest, TopUser, TurnOutcome, TurnRequest, UserState,
};
use tollgate_core::store::{
    SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
use tollgate_core::{BucketSpec, Clock, MemoryStore, Store, StoreError, StoreErrorKind};

use crate::breaker::{Breaker, BreakerConfig, BreakerState, Pass, Transition};

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

/// Most ambiguous calls remembered per user until reconciliation; past it
/// the oldest is forgotten (it may then be charged twice).
const MAX_AMBIGUOUS_PER_USER: usize = 1_024;

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

/// A close waiting for the shared store.
#[derive(Debug)]
enum Close {
    Settle {
        user: String,
        tokens: BucketSpec,
        reservation: ReservationId,
        actual: Option<u64>,
    },
    Release {
        user: String,
        invocation_id: String,
    },
}

#[derive(Debug, Default)]
struct Journal {
    entries: VecDeque<(u64, Close)>,
    expired: u64,
}

/// What the local store charged one user, owed to the shared store.
#[derive(Debug, Default)]
struct Owed {
    turns: Option<BucketSpec>,
    tokens: Option<BucketSpec>,
    turns_taken: u64,
    tokens_net: i64,
    ambiguous_reserves: VecDeque<(String, String)>,
    ambiguous_admissions: VecDeque<String>,
    /// Open local reservations: (invocation, call) → (estimate charged,
    /// when). Forgotten after the reservation retention, as the local
    /// store forgets them.
    open: HashMap<(String, u64), (u64, u64)>,
    /// Charges sent to the shared store whose answer never came: retried
    /// as they are, under their batch number, before anything newer (the
    /// store applies a batch once, so a lost answer charges once).
    inflight: Option<Batch>,
}

/// One reconciliation of one user's charges.
#[derive(Debug, Clone)]
struct Batch {
    number: u64,
    turns: BucketSpec,
    tokens: BucketSpec,
    turns_taken: u64,
    tokens_net: i64,
    reserves: Vec<(String, String)>,
    admissions: Vec<String>,
}

impl Owed {
    fn is_settled(&self) -> bool {
        self.turns_taken == 0
            && self.tokens_net == 0
            && self.ambiguous_reserves.is_empty()
            && self.ambiguous_admissions.is_empty()
            && self.inflight.is_none()
    }

    fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
        if q.len() >= MAX_AMBIGUOUS_PER_USER {
            q.pop_front();
        }
        q.push_back(v);
    }
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
    /// the breaker how it went.
    async fn attempt<T>(
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
                if self.inner.dirty.load(Ordering::Relaxed) {
                    self.spawn_recovery();
                }
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
                let v = local(&self.inner.fallback, share).await?;
                Ok((v, Some(cause.is_some())))
            }
            None => {
                self.event(name, false, cause.as_ref());
                Err(Self::closed(name, cause))
            }
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

    fn owe(&self, user: &str, f: impl FnOnce(&mut Owed)) {
        let mut owed = self.inner.owed.lock();
        let entry = match owed.get_mut(user) {
            Some(e) => e,
            None => owed.entry(user.to_owned()).or_default(),
        };
        f(entry);
        self.inner.dirty.store(true, Ordering::Relaxed);
    }

    /// Keeps a close for the shared store; `Err` when the journal is full.
    fn journal(&self, op: &'static str, close: Close) -> Result<(), StoreError> {
        let now = self.inner.clock.now_ms();
        let mut j = self.inner.journal.lock();
        Self::expire(&mut j, now);
        if j.entries.len() >= self.inner.journal_capacity {
            drop(j);
            self.count_full(op);
            return Err(StoreError::new(
                StoreErrorKind::Full,
                format!(
                    "close journal full ({} closes wait for the shared store): retry later",
                    self.inner.journal_capacity
                ),
            ));
        }
        j.entries.push_back((now, close));
        self.inner.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn expire(j: &mut Journal, now: u64) {
        while let Some((at, close)) = j.entries.front() {
            if now.saturating_sub(*at) < RESERVATION_RETENTION_MS {
                break;
            }
            tracing::warn!(
                ?close,
                "journalled close outlived the reservation retention: dropped"
            );
            j.entries.pop_front();
            j.expired += 1;
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

    fn spawn_recovery(&self) {
        if self.inner.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let this = self.clone();
                handle.spawn(async move {
                    let r = this.recover().await;
                    if r.users > 0 || r.replayed > 0 {
                        tracing::info!(
                            ?r,
                            "reconciled the fallback's decisions with the shared store"
                        );
                    }
                    this.inner.recovering.store(false, Ordering::Release);
                });
            }
            Err(_) => self.inner.recovering.store(false, Ordering::Release),
        }
    }

    /// Whether closes or charges wait for the shared store.
    pub fn needs_recovery(&self) -> bool {
        self.inner.dirty.load(Ordering::Relaxed)
    }

    /// Charges what the local store decided to the shared store
    /// ([`Store::reconcile`], first) and applies the journalled closes
    /// (then), as far as the shared store answers; what it does not is kept
    /// for the next call. Goes through the breaker like any operation (a
    /// call while it is open does nothing; one after `open_ms` probes).
    /// Runs by itself after an operation succeeds while anything waits;
    /// the server also calls it periodically so an idle replica recovers.
    pub async fn recover(&self) -> Recovery {
        let _one = self.inner.recovery.lock().await;
        let mut out = Recovery::default();
        self.inner.dirty.store(false, Ordering::Relaxed);
        self.forget_old();
        if !self.reconcile_owed(&mut out).await {
            self.inner.dirty.store(true, Ordering::Relaxed);
            out.remaining = self.inner.journal.lock().entries.len();
            return out;
        }
        self.replay(&mut out).await;
        out.remaining = self.inner.journal.lock().entries.len();
        if out.remaining > 0 {
            self.inner.dirty.store(true, Ordering::Relaxed);
        }
        out
    }

    /// Drops local reservations older than the retention (the local store
    /// has forgotten them too) and users who owe nothing.
    fn forget_old(&self) {
        let now = self.inner.clock.now_ms();
        let mut owed = self.inner.owed.lock();
        owed.retain(|_, o| {
            o.open
                .retain(|_, (_, at)| now.saturating_sub(*at) < RESERVATION_RETENTION_MS);
            !(o.is_settled() && o.open.is_empty())
        });
    }

    /// Answers `false` if the shared store failed (what is left is kept).
    async fn reconcile_owed(&self, out: &mut Recovery) -> bool {
        let users: Vec<String> = {
            let owed = self.inner.owed.lock();
            owed.iter()
                .filter(|(_, o)| !o.is_settled())
                .map(|(u, _)| u.clone())
                .collect()
        };
        for user in users {
            if !self.reconcile_user(&user, out).await {
                return false;
            }
        }
        true
    }

    /// Sends `user`'s batch the store has not answered yet, if any, then
    /// the charges since as a new one. `false` if the store failed.
    async fn reconcile_user(&self, user: &str, out: &mut Recovery) -> bool {
        loop {
            // The batch the store has not answered yet, or the user's
            // charges taken out as a new one (what arrives meanwhile adds
            // up in the entry, for the next batch).
            let (batch, resent) = {
                let mut owed = self.inner.owed.lock();
                let Some(o) = owed.get_mut(user) else {
                    return true;
                };
                match &o.inflight {
                    Some(b) => (b.clone(), true),
                    None if o.is_settled() => return true,
                    None => {
                        let Some(tokens) = o.tokens.or(o.turns) else {
                            return true;
                        };
                        let b = Batch {
                            number: self.inner.next_batch.fetch_add(1, Ordering::Relaxed),
                            turns: o.turns.unwrap_or(tokens),
                            tokens,
                            turns_taken: std::mem::take(&mut o.turns_taken),
                            tokens_net: std::mem::take(&mut o.tokens_net),
                            reserves: std::mem::take(&mut o.ambiguous_reserves).into(),
                            admissions: std::mem::take(&mut o.ambiguous_admissions).into(),
                        };
                        o.inflight = Some(b.clone());
                        (b, false)
                    }
                }
            };
            let reserve_refs: Vec<(&str, &str)> = batch
                .reserves
                .iter()
                .map(|(i, r)| (i.as_str(), r.as_str()))
                .collect();
            let admission_refs: Vec<&str> = batch.admissions.iter().map(String::as_str).collect();
            let req = ReconcileRequest {
                user,
                turns: batch.turns,
                tokens: batch.tokens,
                turns_taken: batch.turns_taken,
                tokens_net: batch.tokens_net,
                ambiguous_reserves: &reserve_refs,
                ambiguous_admissions: &admission_refs,
                replica: self.inner.tag,
                batch: batch.number,
            };
            match self.attempt("reconcile", self.primary.reconcile(req)).await {
                Attempt::Done(Ok(Reconciled {
                    turns,
                    tokens,
                    refunded,
                })) => {
                    out.users += 1;
                    out.turns += turns;
                    out.tokens = out.tokens.saturating_add(tokens);
                    out.refunded += refunded;
                    let mut owed = self.inner.owed.lock();
                    if let Some(o) = owed.get_mut(user) {
                        if o.inflight
                            .as_ref()
                            .is_some_and(|b| b.number == batch.number)
                        {
                            o.inflight = None;
                        }
                        if o.is_settled() && o.open.is_empty() {
                            owed.remove(user);
                        }
                    }
                }
                failed => {
                    // Kept as it is: it may have been applied (a timeout
                    // after it was sent), so it is retried as the same
                    // batch, never merged into a new one.
                    if let Attempt::Done(Err(e)) = &failed {
                        tracing::error!(user, error = %e, "reconciliation refused; charges kept");
                    }
                    return false;
                }
            }
            // A new batch took everything owed when it was sent (what came
            // since marked the store dirty); a batch sent again did not:
            // the charges made since it was first sent follow now.
            if !resent {
                return true;
            }
        }
    }

    async fn replay(&self, out: &mut Recovery) {
        loop {
            let next = {
                let mut j = self.inner.journal.lock();
                Self::expire(&mut j, self.inner.clock.now_ms());
                j.entries.pop_front()
            };
            let Some((at, close)) = next else { return };
            let done = match &close {
                Close::Settle {
                    user,
                    tokens,
                    reservation,
                    actual,
                } => {
                    let req = SettleRequest {
                        user,
                        tokens: *tokens,
                        reservation,
                        actual: *actual,
                    };
                    match self.attempt("settle", self.primary.settle(req)).await {
                        Attempt::Done(r) => {
                            if let Ok(SettleOutcome::Unknown) = r {
                                tracing::warn!(user, %reservation, "journalled close of a reservation the shared store no longer knows");
                            }
                            true
                        }
                        Attempt::Failed(_) => false,
                    }
                }
                Close::Release {
                    user,
                    invocation_id,
                } => matches!(
                    self.attempt("release_run", self.primary.release_run(user, invocation_id))
                        .await,
                    Attempt::Done(_)
                ),
            };
            if !done {
                self.inner.journal.lock().entries.push_front((at, close));
                return;
            }
            out.replayed += 1;
        }
    }
}

fn scale(v: u64, share: f64) -> u64 {
    ((v as f64 * share).floor() as u64).max(1)
}

/// `spec` with amount and capacity scaled by `share` (at least 1 each).
pub(crate) fn scale_spec(spec: &BucketSpec, share: f64) -> BucketSpec {
    if share >= 1.0 {
        return *spec;
    }
    BucketSpec::new(
        scale(spec.amount(), share),
        spec.period_ms(),
        scale(spec.capacity(), share),
    )
    .unwrap_or(*spec)
}

fn scale_turn(p: &TurnParams, share: f64) -> TurnParams {
    TurnParams {
        turns: scale_spec(&p.turns, share),
        max_runs: u32::try_from(scale(u64::from(p.max_runs), share)).unwrap_or(p.max_runs),
        ..*p
    }
}

impl<S: Store + Clone> Store for Failover<S> {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        let (out, local) = self
            .decide("admit_turn", self.primary.admit_turn(req), |m, share| {
                m.admit_turn(TurnRequest {
                    params: scale_turn(&req.params, share),
                    ..req
                })
            })
            .await?;
        if let Some(ambiguous) = local
            && let Admit::Admitted {
                refreshed: false, ..
            } = out.admit
        {
            self.owe(req.user, |o| {
                o.turns = Some(req.params.turns);
                o.turns_taken += 1;
                if ambiguous {
                    Owed::push_bounded(&mut o.ambiguous_admissions, req.invocation_id.to_owned());
                }
            });
        }
        Ok(out)
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<Release, StoreError> {
        let shared = match self
            .attempt("release_run", self.primary.release_run(user, invocation_id))
            .await
        {
            Attempt::Done(r) => Some(r?),
            Attempt::Failed(_) => None,
        };
        // A run admitted locally during an outage holds its lease here.
        let local = if self.local_used() {
            self.inner.fallback.release_run(user, invocation_id).await?
        } else {
            Release::NotHeld
        };
        match shared {
            Some(Release::Released) => Ok(Release::Released),
            Some(_) => Ok(local),
            None => {
                let journalled = self.journal(
                    "release_run",
                    Close::Release {
                        user: user.to_owned(),
                        invocation_id: invocation_id.to_owned(),
                    },
                );
                match (local, journalled) {
                    (Release::Released, _) => Ok(Release::Released),
                    (_, Ok(())) => Ok(Release::Pending),
                    (_, Err(e)) => Err(e),
                }
            }
        }
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let cause = match self
            .attempt(
                "renew_run",
                self.primary.renew_run(user, invocation_id, ttl_ms),
            )
            .await
        {
            Attempt::Done(Ok(Some(exp))) => return Ok(Some(exp)),
            Attempt::Done(Ok(None)) if self.local_used() => {
                // Maybe admitted locally during an outage.
                return self
                    .inner
                    .fallback
                    .renew_run(user, invocation_id, ttl_ms)
                    .await;
            }
            Attempt::Done(Ok(None)) => return Ok(None),
            Attempt::Done(Err(e)) => return Err(e),
            Attempt::Failed(cause) => cause,
        };
        // A lease the local store holds can be renewed here; one in the
        // shared store cannot: the client must not believe it holds a lease
        // that is expiring there.
        if self.local_used()
            && let Some(exp) = self
                .inner
                .fallback
                .renew_run(user, invocation_id, ttl_ms)
                .await?
        {
            self.event("renew_run", true, cause.as_ref());
            return Ok(Some(exp));
        }
        self.event("renew_run", false, cause.as_ref());
        Err(Self::closed("renew_run", cause))
    }

    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        // A retry of a request the local store answered during an outage
        // gets that answer again, wherever the shared store is now.
        if let Some(rid) = req.request_id
            && self.local_used()
            && let Some(out) = self
                .inner
                .fallback
                .repeat_of(req.user, req.invocation_id, rid)
        {
            return Ok(self.tag_outcome(out));
        }
        let generated;
        let own_id = req.request_id.is_none();
        let rid = match req.request_id {
            Some(r) => r,
            None => {
                generated = self.request_id();
                &generated
            }
        };
        let req = ReserveRequest {
            request_id: Some(rid),
            ..req
        };
        let attempt = self
            .attempt("reserve_tokens", self.primary.reserve_tokens(req))
            .await;
        let sent_and_failed = matches!(attempt, Attempt::Failed(Some(_)));
        let decided = self
            .decide_after("reserve_tokens", attempt, |m, share| {
                m.reserve_tokens(ReserveRequest {
                    tokens: scale_spec(&req.tokens, share),
                    ..req
                })
            })
            .await;
        let (out, local) = match decided {
            Ok(v) => v,
            Err(e) => {
                // Refused (fail_closed, or the local store failed) after
                // the call was sent: it may still run in the shared store
                // (queued behind a pause), charging a reservation the
                // caller never got. Reconciliation finds it by its id and
                // refunds it (or marks the id so a late copy takes
                // nothing). Only for an id this replica generated: a
                // caller's own id is the caller's to retry, and a retry
                // answers that grant.
                if sent_and_failed && own_id {
                    self.owe(req.user, |o| {
                        o.tokens = Some(req.tokens);
                        Owed::push_bounded(
                            &mut o.ambiguous_reserves,
                            (req.invocation_id.to_owned(), rid.to_owned()),
                        );
                    });
                }
                return Err(e);
            }
        };
        let Some(ambiguous) = local else {
            return Ok(out);
        };
        let charged = match &out {
            ReserveOutcome::Granted { reservation, .. } => Some((reservation.call, req.estimate)),
            ReserveOutcome::Denied {
                shadow_reservation: Some(r),
                ..
            } => Some((r.call, 0)),
            _ => None,
        };
        if charged.is_some() || ambiguous {
            let now = self.inner.clock.now_ms();
            self.owe(req.user, |o| {
                o.tokens = Some(req.tokens);
                if let Some((call, estimate)) = charged {
                    o.tokens_net = o.tokens_net.saturating_add(estimate as i64);
                    o.open
                        .insert((req.invocation_id.to_owned(), call), (estimate, now));
                }
                if ambiguous {
                    Owed::push_bounded(
                        &mut o.ambiguous_reserves,
                        (req.invocation_id.to_owned(), rid.to_owned()),
                    );
                }
            });
        }
        Ok(self.tag_outcome(out))
    }

    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        match req.reservation.fallback {
            Some(tag) if tag == self.inner.tag => return self.settle_local(req).await,
            // Issued by another replica's local store: unknown here.
            Some(_) => return Ok(SettleOutcome::Unknown),
            None => {}
        }
        match self.attempt("settle", self.primary.settle(req)).await {
            Attempt::Done(r) => r,
            Attempt::Failed(_) => {
                self.journal(
                    "settle",
                    Close::Settle {
                        user: req.user.to_owned(),
                        tokens: req.tokens,
                        reservation: req.reservation.clone(),
                        actual: req.actual,
                    },
                )?;
                Ok(SettleOutcome::Pending)
            }
        }
    }

    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        self.decide_value(
            "take_many",
            self.primary.take_many(takes, cooldown),
            |m, share| async move {
                let scaled: Vec<BucketTake<'_>> = takes
                    .iter()
                    .map(|t| BucketTake {
                        spec: scale_spec(&t.spec, share),
                        ..*t
                    })
                    .collect();
                m.take_many(&scaled, cooldown).await
            },
        )
        .await
    }

    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        let (out, local) = self
            .decide("take_one", self.primary.take_one(req), |m, share| {
                m.take_one(TakeRequest {
                    spec: scale_spec(&req.spec, share),
                    ..req
                })
            })
            .await?;
        // A user's turns taken locally are owed. An ambiguous take is not
        // (it has no id to check): it may be counted once too few, never
        // twice.
        if local == Some(false)
            && let BucketRef::Turns(user) = req.bucket
            && matches!(out.take, tollgate_core::bucket::Take::Granted { .. })
            && req.cost > 0
        {
            self.owe(user, |o| {
                o.turns = Some(req.spec);
                o.turns_taken = o.turns_taken.saturating_add(req.cost);
            });
        }
        Ok(out)
    }

    async fn extend_cooldown(&self, key: &str, until_ms: u64) -> Result<u64, StoreError> {
        self.decide_value(
            "extend_cooldown",
            self.primary.extend_cooldown(key, until_ms),
            |m, _| m.extend_cooldown(key, until_ms),
        )
        .await
    }

    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        self.decide_value("aimd", self.primary.aimd(key, params, throttled), |m, _| {
            m.aimd(key, params, throttled)
        })
        .await
    }

    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        let cleared = self
            .closed_only(
                "clear_provider",
                self.primary.clear_provider(cooldown, aimd, params),
            )
            .await?;
        self.inner
            .fallback
            .clear_provider(cooldown, aimd, params)
            .await?;
        Ok(cleared)
    }

    async fn claim_session(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.closed_only("claim_session", self.primary.claim_session(req))
            .await
    }

    async fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, StoreError> {
        self.closed_only(
            "session_acquire",
            self.primary.session_acquire(session, holder, ttl_ms),
        )
        .await
    }

    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        self.closed_only(
            "session_renew",
            self.primary.session_renew(session, holder, ttl_ms),
        )
        .await
    }

    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        self.closed_only(
            "session_release",
            self.primary.session_release(session, holder),
        )
        .await
    }

    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        self.closed_only("fence_check", self.primary.fence_check(session, fence))
            .await
    }

    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        self.closed_only(
            "append_fenced",
            self.primary.append_fenced(session, fence, record),
        )
        .await
    }

    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.closed_only(
            "read_records",
            self.primary.read_records(session, from, limit),
        )
        .await
    }

    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        self.closed_only("delete_records", self.primary.delete_records(session))
            .await
    }

    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        self.decide_value(
            "user_state",
            self.primary.user_state(user, turns, tokens),
            |m, share| m.user_state(user, scale_spec(&turns, share), scale_spec(&tokens, share)),
        )
        .await
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        self.decide_value("top_users", self.primary.top_users(n), |m, _| {
            m.top_users(n)
        })
        .await
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        self.decide_value("reset_user", self.primary.reset_user(user), |m, _| {
            m.reset_user(user)
        })
        .await
    }

    async fn session_create(&self, req: SessionCreate<'_>) -> Result<SessionCreated, StoreError> {
        self.closed_only("session_create", self.primary.session_create(req))
            .await
    }

    async fn session_append(&self, req: SessionAppend<'_>) -> Result<SessionAppended, StoreError> {
        self.closed_only("session_append", self.primary.session_append(req))
            .await
    }

    async fn session_delete(&self, req: SessionDelete<'_>) -> Result<u64, StoreError> {
        self.closed_only("session_delete", self.primary.session_delete(req))
            .await
    }

    async fn reconcile(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, StoreError> {
        self.closed_only("reconcile", self.primary.reconcile(req))
            .await
    }
}

impl<S: Store + Clone> Failover<S> {
    fn tag_outcome(&self, out: ReserveOutcome) -> ReserveOutcome {
        match out {
            ReserveOutcome::Granted {
                reservation,
                wait_ms,
            } => ReserveOutcome::Granted {
                reservation: self.local_id(reservation),
                wait_ms,
            },
            ReserveOutcome::Denied {
                denial,
                shadow_reservation,
            } => ReserveOutcome::Denied {
                denial,
                shadow_reservation: shadow_reservation.map(|r| self.local_id(r)),
            },
            other => other,
        }
    }

    /// Closes a reservation the local store issued, there (whatever the
    /// shared store's state), and owes the shared store its adjustment.
    async fn settle_local(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        let id = ReservationId {
            fallback: None,
            ..req.reservation.clone()
        };
        let share = self.share().unwrap_or(1.0);
        let out = self
            .inner
            .fallback
            .settle(SettleRequest {
                tokens: scale_spec(&req.tokens, share),
                reservation: &id,
                ..req
            })
            .await?;
        if let SettleOutcome::Applied { .. } = out {
            self.owe(req.user, |o| {
                o.tokens = Some(req.tokens);
                let (estimate, _) = o
                    .open
                    .remove(&(id.invocation_id.clone(), id.call))
                    .unwrap_or((0, 0));
                let delta = match req.actual {
                    Some(a) => i128::from(a) - i128::from(estimate),
                    None => -i128::from(estimate),
                };
                let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
                o.tokens_net = o.tokens_net.saturating_add(delta);
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_scale_rates_and_caps_down_to_one() {
        let spec = BucketSpec::new(600, 60_000, 60).unwrap();
        let half = scale_spec(&spec, 0.5);
        assert_eq!((half.amount(), half.capacity()), (300, 30));
        let tiny = scale_spec(&spec, 0.001);
        assert_eq!((tiny.amount(), tiny.capacity()), (1, 1));
        assert_eq!(scale_spec(&spec, 1.0), spec);
    }

    #[test]
    fn share_is_validated() {
        let clock = tollgate_core::FakeClock::new(0);
        let mem = MemoryStore::new(clock.clone());
        for bad in [0.0, -1.0, 1.5, f64::NAN] {
            let policy = FailurePolicy::FailOpen {
                fallback_share: bad,
            };
            assert!(Failover::new(mem.clone(), policy, clock.clone()).is_err());
        }
        assert!(Failover::new(mem, FailurePolicy::FailClosed, clock).is_ok());
    }
}
