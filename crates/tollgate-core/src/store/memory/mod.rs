//! The in-memory store: one process, exact, concurrent, bounded.
//!
//! State is split over lock-striped shards keyed by a hash of the user (or
//! session, or bucket key), so a hot user serializes only its own shard.
//! All of one user's state lives in one entry, which makes turn admission a
//! single critical section. Every operation returns a ready future.
//!
//! # Memory
//!
//! Entries expire by SPEC §2 rule 6 (buckets), with their latest lease
//! (leases), [`RESERVATION_RETENTION_MS`](super::RESERVATION_RETENTION_MS)
//! after a run's last model call, and session retention for sessions. An
//! expired entry reads as missing at once; its memory is returned by a
//! sweep of its shard that runs inline on a write when the shard has
//! doubled since the last sweep or a minute has passed, or on demand
//! through [`MemoryStore::purge_expired`].
//!
//! The store holds at most [`MemoryConfig::max_entries`] entries in all
//! (users, sessions and named keys together; default
//! [`DEFAULT_MAX_ENTRIES`]). At the bound an operation that would add a key
//! first sweeps every shard for expired entries (at most once a second),
//! and if there is still no room it is refused with [`StoreErrorKind::Full`] and
//! changes nothing; operations on existing entries keep working, and
//! nothing is ever evicted to make room (a live lease stays live). The
//! bound is exact for single-key operations; a multi-key take checks for
//! room for all its new keys before it writes, so operations running at
//! the same instant on other shards may pass it by their own few keys.
//!
//! # Layout
//!
//! The rules are core's pure transitions ([`bucket`](crate::bucket),
//! [`lease`](crate::lease), [`reserve`](crate::reserve),
//! [`take`](crate::take), [`aimd`](crate::aimd)); this module only keeps
//! state and applies them under a lock: `shards.rs` holds the tables and
//! the entry bound, `users.rs` users' entries (turns, leases, model calls,
//! claims), `sessions.rs` session entries and grouped writes, `named.rs`
//! named buckets, cooldowns and AIMD states.

use crate::calendar::Period;
use crate::spend::{BudgetAdjust, BudgetCheck, Spend, SpentNow};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use self::named::KeyEntry;
use self::sessions::SessionEntry;
use self::shards::{EntryCap, Full, Shards};
use self::users::UserEntry;
use super::grouped::check_group;
use super::{
    AppendOutcome, BucketTake, Claim, ClaimRequest, CooldownCheck, DEFAULT_SESSION_GRACE_MS,
    DEFAULT_SESSION_RETENTION_MS, FairCheck, FenceCheck, MultiTake, ProviderCleared,
    ReconcileRequest, Reconciled, Release, ReserveOutcome, ReserveRequest, SessionAppend,
    SessionAppended, SessionCreate, SessionCreated, SessionDelete, SettleOutcome, SettleRequest,
    Store, TakeOutcome, TakeRequest, TopUser, TurnOutcome, TurnRequest, UserState,
};
use crate::aimd::AimdParams;
use crate::bucket::BucketSpec;
use crate::clock::Clock;
use crate::error::{StoreError, StoreErrorKind};
use crate::lease::{SessionAcquire, SessionGrant};

mod named;
mod sessions;
mod shards;
#[cfg(test)]
mod tests;
mod users;

/// At the entry bound, every shard is swept for room at most this often, ms.
const FULL_SWEEP_EVERY_MS: u64 = 1_000;

/// Default bound on the entries a [`MemoryStore`] holds
/// ([`MemoryConfig::max_entries`]): 1,000,000. An entry costs about 200
/// bytes plus its key (a user id, a session key, a bucket name) and what it
/// holds (a user's open runs and session claims, a session's records), so
/// with 36-byte ids this is some 250 MB; with 512-byte ids at most about
/// 1 GB.
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// Settings of a [`MemoryStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// How long a session with records (or that had records) is kept after
    /// its last operation, ms (default 7 days).
    pub session_retention_ms: u64,
    /// How long a session that holds no record is kept past its lease's
    /// end (or its last operation), ms (default 10 minutes; at most the
    /// retention).
    pub session_grace_ms: u64,
    /// Most entries held in all (default [`DEFAULT_MAX_ENTRIES`];
    /// `usize::MAX`: no bound).
    pub max_entries: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            session_retention_ms: DEFAULT_SESSION_RETENTION_MS,
            session_grace_ms: DEFAULT_SESSION_GRACE_MS,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

// ----- the store ---------------------------------------------------------------

/// The in-memory [`Store`]. Cloning shares the same state.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

type FullHook = Arc<dyn Fn(&'static str) + Send + Sync>;

struct Inner {
    clock: Arc<dyn Clock>,
    cap: Arc<EntryCap>,
    users: Shards<UserEntry>,
    sessions: Shards<SessionEntry>,
    keys: Shards<KeyEntry>,
    session_retention_ms: u64,
    session_grace_ms: u64,
    on_full: OnceLock<FullHook>,
    /// When the last sweep for room ran (at the bound), ms.
    last_full_sweep: AtomicU64,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

/// Entry counts of a [`MemoryStore`], including expired entries not yet swept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// User entries.
    pub users: usize,
    /// Session entries.
    pub sessions: usize,
    /// Named buckets and cooldowns.
    pub keys: usize,
}

impl MemoryStats {
    /// All entries: what [`MemoryConfig::max_entries`] bounds.
    pub fn total(&self) -> usize {
        self.users + self.sessions + self.keys
    }
}

impl MemoryStore {
    /// A store that reads time from `clock`, with the default settings
    /// ([`MemoryConfig::default`]: sessions kept 7 days, or 10 minutes
    /// past their lease without a record; at most 1,000,000 entries).
    pub fn new(clock: impl Clock) -> Self {
        Self::with_config(clock, MemoryConfig::default())
    }

    /// A store with a chosen session retention, ms (the other settings
    /// their defaults; the grace at most the retention).
    pub fn with_session_retention(clock: impl Clock, session_retention_ms: u64) -> Self {
        Self::with_config(
            clock,
            MemoryConfig {
                session_retention_ms,
                ..MemoryConfig::default()
            },
        )
    }

    /// A store with `config`.
    pub fn with_config(clock: impl Clock, config: MemoryConfig) -> Self {
        let cap = Arc::new(EntryCap {
            max: config.max_entries,
            count: AtomicUsize::new(0),
        });
        Self {
            inner: Arc::new(Inner {
                clock: Arc::new(clock),
                users: Shards::new(cap.clone()),
                sessions: Shards::new(cap.clone()),
                keys: Shards::new(cap.clone()),
                cap,
                session_retention_ms: config.session_retention_ms,
                session_grace_ms: config.session_grace_ms.min(config.session_retention_ms),
                on_full: OnceLock::new(),
                last_full_sweep: AtomicU64::new(0),
            }),
        }
    }

    /// Calls `hook` with the operation's name each time an operation is
    /// refused because the store is full (the server counts them). Set once:
    /// a second hook is ignored.
    pub fn on_full(&self, hook: impl Fn(&'static str) + Send + Sync + 'static) {
        let _ = self.inner.on_full.set(Arc::new(hook));
    }

    /// The bound on entries ([`MemoryConfig::max_entries`]).
    pub fn max_entries(&self) -> usize {
        self.inner.cap.max
    }

    fn full(&self, op: &'static str) -> StoreError {
        if let Some(hook) = self.inner.on_full.get() {
            hook(op);
        }
        StoreError::new(
            StoreErrorKind::Full,
            format!(
                "memory store full ({} entries): {op} needs a new entry",
                self.inner.cap.max
            ),
        )
    }

    /// Runs operation `op`; when it needs a new entry at the bound, sweeps
    /// every shard (at most once a second) and runs it once more, else
    /// answers its [`StoreErrorKind::Full`] error. A refused run changed
    /// nothing, so running it again is safe.
    fn room<R>(&self, op: &'static str, f: impl Fn() -> Result<R, Full>) -> Result<R, StoreError> {
        match f() {
            Ok(r) => Ok(r),
            Err(Full) => {
                let now = self.now();
                let last = self.inner.last_full_sweep.load(Ordering::Acquire);
                let due = last == 0 || now >= last.saturating_add(FULL_SWEEP_EVERY_MS);
                if due
                    && self
                        .inner
                        .last_full_sweep
                        .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.purge_expired();
                    if let Ok(r) = f() {
                        return Ok(r);
                    }
                }
                Err(self.full(op))
            }
        }
    }

    /// [`Store::take_many`] of the single take `take` and no cooldown,
    /// without a future: the memory store never waits on anything, so an
    /// in-process caller checking one key (as with governor's
    /// `check_key`) needs none. The same outcome, state and errors as
    /// `take_many(&[take], None)`.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::Full`] when the bucket is new and the store is at
    /// its entry bound.
    #[inline]
    pub fn take_single(&self, take: &BucketTake<'_>) -> Result<MultiTake, StoreError> {
        self.room("take_many", || self.take_single_now(take))
    }

    /// The store's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Drops every expired entry now and returns its memory.
    pub fn purge_expired(&self) {
        let now = self.now();
        self.inner.users.purge(now);
        self.inner.sessions.purge(now);
        self.inner.keys.purge(now);
    }

    /// How many entries are held (expired ones count until swept).
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            users: self.inner.users.len(),
            sessions: self.inner.sessions.len(),
            keys: self.inner.keys.len(),
        }
    }
}

impl Store for MemoryStore {
    fn call<O: super::Op>(
        &self,
        op: O,
    ) -> impl Future<Output = Result<O::Reply, StoreError>> + Send {
        op.apply(self)
    }
}

impl super::Backend for MemoryStore {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        self.room("admit_turn", || self.admit(req))
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<Release, StoreError> {
        self.room("release_run", || self.release_now(user, invocation_id))
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.room("renew_run", || self.renew_now(user, invocation_id, ttl_ms))
    }

    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        self.room("reserve_tokens", || self.reserve(req))
    }

    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        self.room("settle", || self.settle_now(req))
    }

    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        self.room("take_many", || self.take_many_now(takes, cooldown))
    }

    async fn take_many_fair(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
        fair: FairCheck<'_>,
    ) -> Result<MultiTake, StoreError> {
        self.room("take_many_fair", || {
            self.take_many_fair_now(takes, cooldown, fair)
        })
    }

    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        self.room("take_one", || self.take_one_now(req))
    }

    async fn extend_cooldown(
        &self,
        key: &str,
        for_ms: u64,
        max_ms: u64,
    ) -> Result<u64, StoreError> {
        self.room("extend_cooldown", || {
            self.extend_cooldown_now(key, for_ms, max_ms)
        })
    }

    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        self.room("aimd", || self.aimd_now(key, params, throttled))
    }

    async fn read_fair(&self, key: &str) -> Result<Option<crate::fair::FairState>, StoreError> {
        let now = self.now();
        Ok(self
            .inner
            .keys
            .read(key, now, |e| e.and_then(|e| e.fair(now))))
    }

    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        self.clear_provider_now(cooldown, aimd, params)
            .map_err(|Full| self.full("clear_provider"))
    }

    async fn claim_session(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.room("claim_session", || self.claim(req))
    }

    async fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, StoreError> {
        self.room("session_acquire", || {
            self.session_acquire_now(session, holder, ttl_ms)
        })
    }

    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        self.room("session_renew", || {
            self.session_renew_now(session, holder, ttl_ms)
        })
    }

    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        self.room("session_release", || {
            self.session_release_now(session, holder)
        })
    }

    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        Ok(self.fence_check_now(session, fence))
    }

    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        self.room("append_fenced", || {
            self.append_fenced_now(session, fence, record)
        })
    }

    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.read_records_now(session, from, limit))
    }

    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        self.room("delete_records", || self.delete_records_now(session))
    }

    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        Ok(self.user_state_now(user, turns, tokens))
    }

    async fn budget_spent(
        &self,
        user: &str,
        checks: &[BudgetCheck],
        adjust: Option<(Period, BudgetAdjust<'_>)>,
    ) -> Result<Vec<SpentNow>, StoreError> {
        let now = self.now();
        let read = |spend: Option<&Spend>| -> Vec<SpentNow> {
            checks
                .iter()
                .map(|c| spend.map_or(SpentNow::default(), |s| s.now(c, now)))
                .collect()
        };
        let Some((period, adjust)) = adjust else {
            return Ok(self
                .inner
                .users
                .read(user, now, |u| read(u.and_then(UserEntry::spend))));
        };
        let Some(check) = checks.iter().find(|c| c.period == period) else {
            return Ok(self
                .inner
                .users
                .read(user, now, |u| read(u.and_then(UserEntry::spend))));
        };
        self.room("budget_spent", || {
            self.adjust_budget_now(user, check, now, adjust, read)
        })
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        Ok(super::rank_top(self.top_users_now(), n))
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        self.room("reset_user", || self.reset_user_now(user))
    }

    async fn reconcile(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, StoreError> {
        self.room("reconcile", || self.reconcile_now(req))
    }

    async fn session_create(&self, req: SessionCreate<'_>) -> Result<SessionCreated, StoreError> {
        check_group(req.session, req.logs)?;
        self.room("session_create", || self.create_now(req))
    }

    async fn session_append(&self, req: SessionAppend<'_>) -> Result<SessionAppended, StoreError> {
        check_group(req.session, req.logs)?;
        self.room("session_append", || self.append_now(req))
    }

    async fn session_delete(&self, req: SessionDelete<'_>) -> Result<u64, StoreError> {
        check_group(req.session, req.logs)?;
        self.room("session_delete", || self.delete_now(req))
    }
}
