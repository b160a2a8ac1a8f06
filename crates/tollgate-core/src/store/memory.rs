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
//! (leases), [`RESERVATION_RETENTION_MS`] after a run's last model call, and
//! session retention for sessions. An expired entry reads as missing at once;
//! its memory is returned by a sweep of its shard that runs inline on a write
//! when the shard has doubled since the last sweep or a minute has passed,
//! or on demand through [`MemoryStore::purge_expired`].
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

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::{Mutex, MutexGuard};

use super::MAX_TRACKED_RUNS;
use super::grouped::check_group;
use super::{
    AppendOutcome, BucketRef, BucketTake, CLAIM_SLACK_MS, Claim, ClaimRequest, CooldownCheck,
    DEFAULT_SESSION_GRACE_MS, DEFAULT_SESSION_RETENTION_MS, FenceCheck, MultiTake, ProviderCleared,
    RESERVATION_RETENTION_MS, ReconcileRequest, Reconciled, Release, ReservationId, ReserveOutcome,
    ReserveRequest, SettleOutcome, SettleRequest, Store, TakeOutcome, TakeRequest, TopUser,
    TurnOutcome, TurnRequest, UserState,
};
use super::{
    LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
use crate::aimd::{AimdParams, AimdState};
use crate::bucket::{self, BucketSpec, BucketState, EXPIRY_GRACE_MS, MAX_SCALED, Take};
use crate::clock::Clock;
use crate::decision::{Denial, Limit};
use crate::error::{StoreError, StoreErrorKind};
use crate::lease::{self, LeaseSet, SessionAcquire, SessionGrant, SessionLease};

const SHARDS: usize = 64;

const SWEEP_EVERY_MS: u64 = 60_000;
const MIN_SWEEP_LEN: usize = 1_024;
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

/// The entry bound, shared by the three tables.
struct EntryCap {
    max: usize,
    count: AtomicUsize,
}

impl EntryCap {
    /// Takes room for one more entry, if there is any.
    fn try_add(&self) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn add(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    fn sub(&self, n: usize) {
        if n > 0 {
            self.count.fetch_sub(n, Ordering::AcqRel);
        }
    }

    fn has_room(&self, n: usize) -> bool {
        self.count.load(Ordering::Acquire).saturating_add(n) <= self.max
    }
}

/// An operation needed a new entry and the store is at its bound.
#[derive(Debug)]
struct Full;

trait Expiring: Default {
    /// After this time (ms) the entry is as good as missing.
    fn expires_at(&self) -> u64;

    /// Makes an expired entry as good as new before an operation uses it.
    fn reset(&mut self) {
        *self = Self::default();
    }
}

#[repr(align(128))]
struct Padded<T>(T);

struct Shard<V> {
    table: HashTable<(Box<str>, V)>,
    sweep_len: usize,
    next_sweep_at: u64,
}

struct Shards<V> {
    hasher: DefaultHashBuilder,
    cap: Arc<EntryCap>,
    shards: Box<[Padded<Mutex<Shard<V>>>]>,
}

impl<V: Expiring> Shards<V> {
    fn new(cap: Arc<EntryCap>) -> Self {
        Self {
            hasher: DefaultHashBuilder::default(),
            cap,
            shards: (0..SHARDS)
                .map(|_| {
                    Padded(Mutex::new(Shard {
                        table: HashTable::new(),
                        sweep_len: MIN_SWEEP_LEN,
                        next_sweep_at: 0,
                    }))
                })
                .collect(),
        }
    }

    fn locate(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, ((hash >> 40) as usize) % SHARDS)
    }

    /// Runs `f` on the live entry of `key` (a default one if missing or
    /// expired). Entries left expired by `f` are removed. A missing key is
    /// added only if `f` leaves it live and there is room: else [`Full`],
    /// and nothing changed.
    fn with<R>(&self, key: &str, now: u64, f: impl FnOnce(&mut V) -> R) -> Result<R, Full> {
        let (hash, i) = self.locate(key);
        let mut shard = self.shards[i].0.lock();
        let r = shard.with(&self.hasher, &self.cap, true, hash, key, now, f);
        shard.maybe_sweep(&self.hasher, &self.cap, now);
        r
    }

    /// Reads the live entry of `key`, if any, without creating one.
    fn read<R>(&self, key: &str, now: u64, f: impl FnOnce(Option<&V>) -> R) -> R {
        let (hash, i) = self.locate(key);
        let shard = self.shards[i].0.lock();
        let entry = shard
            .table
            .find(hash, |(k, _)| &**k == key)
            .map(|(_, v)| v)
            .filter(|v| v.expires_at() > now);
        f(entry)
    }

    /// Locks the shards of `keys` in index order (no deadlock), for one
    /// atomic step over several keys. Each key is hashed once.
    fn lock_many<'a, 'k>(&'a self, keys: &[&'k str]) -> Multi<'a, 'k, V> {
        let located: Vec<(&'k str, u64, usize)> = keys
            .iter()
            .map(|k| {
                let (h, i) = self.locate(k);
                (*k, h, i)
            })
            .collect();
        let mut idx: Vec<usize> = located.iter().map(|l| l.2).collect();
        idx.sort_unstable();
        idx.dedup();
        let guards = idx.iter().map(|&i| (i, self.shards[i].0.lock())).collect();
        Multi {
            hasher: &self.hasher,
            cap: &self.cap,
            located,
            guards,
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().table.len()).sum()
    }

    fn purge(&self, now: u64) {
        for s in self.shards.iter() {
            s.0.lock().sweep(&self.hasher, &self.cap, now);
        }
    }

    fn for_each_live(&self, now: u64, mut f: impl FnMut(&str, &V)) {
        for s in self.shards.iter() {
            let shard = s.0.lock();
            for (k, v) in shard.table.iter() {
                if v.expires_at() > now {
                    f(k, v);
                }
            }
        }
    }
}

impl<V: Expiring> Shard<V> {
    /// As [`Shards::with`]. With `check`, a new key needs room under `cap`
    /// (a multi-key step checks for room first and passes `false`).
    #[allow(clippy::too_many_arguments)]
    fn with<R>(
        &mut self,
        hasher: &DefaultHashBuilder,
        cap: &EntryCap,
        check: bool,
        hash: u64,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, Full> {
        let eq = |(k, _): &(Box<str>, V)| &**k == key;
        match self.table.entry(hash, eq, |(k, _)| hasher.hash_one(&**k)) {
            hashbrown::hash_table::Entry::Occupied(mut occupied) => {
                let v = &mut occupied.get_mut().1;
                if v.expires_at() <= now {
                    v.reset();
                }
                let r = f(v);
                if v.expires_at() <= now {
                    occupied.remove();
                    cap.sub(1);
                }
                Ok(r)
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                // Decide on a fresh entry first: one left expired (a read,
                // a refusal) is never stored, so it needs no room.
                let mut v = V::default();
                let r = f(&mut v);
                if v.expires_at() > now {
                    if check {
                        if !cap.try_add() {
                            return Err(Full);
                        }
                    } else {
                        cap.add();
                    }
                    vacant.insert((key.into(), v));
                }
                Ok(r)
            }
        }
    }

    fn maybe_sweep(&mut self, hasher: &DefaultHashBuilder, cap: &EntryCap, now: u64) {
        if self.table.len() > self.sweep_len || now >= self.next_sweep_at {
            self.sweep(hasher, cap, now);
        }
    }

    fn sweep(&mut self, hasher: &DefaultHashBuilder, cap: &EntryCap, now: u64) {
        let before = self.table.len();
        self.table.retain(|(_, v)| v.expires_at() > now);
        cap.sub(before - self.table.len());
        // Rehashing moves entries: it must be given their real hashes.
        self.table
            .shrink_to(self.table.len() * 2, |(k, _)| hasher.hash_one(&**k));
        self.sweep_len = (self.table.len() * 2).max(MIN_SWEEP_LEN);
        self.next_sweep_at = now.saturating_add(SWEEP_EVERY_MS);
    }
}

struct Multi<'a, 'k, V> {
    hasher: &'a DefaultHashBuilder,
    cap: &'a EntryCap,
    located: Vec<(&'k str, u64, usize)>,
    guards: Vec<(usize, MutexGuard<'a, Shard<V>>)>,
}

impl<V: Expiring> Multi<'_, '_, V> {
    fn guard(&mut self, i: usize) -> &mut Shard<V> {
        self.guards
            .iter_mut()
            .find(|(j, _)| *j == i)
            .map(|(_, g)| &mut **g)
            .expect("lock_many locked every key's shard")
    }

    /// [`Full`] unless there is room for every key not held now (each
    /// counted once).
    fn check_room(&mut self, now: u64) -> Result<(), Full> {
        self.check_room_of(now, 0..self.located.len())
    }

    /// [`Full`] unless there is room for every key at the positions
    /// `new` names (given to `lock_many`) that is not held now, each
    /// counted once: for a step that creates only some of its keys.
    fn check_room_of(
        &mut self,
        now: u64,
        new: impl IntoIterator<Item = usize>,
    ) -> Result<(), Full> {
        let mut missing: Vec<&str> = Vec::new();
        for n in new {
            let (key, hash, i) = self.located[n];
            let held = self
                .guard(i)
                .table
                .find(hash, |(k, _)| &**k == key)
                .is_some_and(|(_, v)| v.expires_at() > now);
            if !held && !missing.contains(&key) {
                missing.push(key);
            }
        }
        if self.cap.has_room(missing.len()) {
            Ok(())
        } else {
            Err(Full)
        }
    }

    /// Runs `f` on the entry of the `n`th key given to `lock_many` (room
    /// for a new key was checked by [`check_room`](Self::check_room), so
    /// this never answers [`Full`]).
    fn with<R>(&mut self, n: usize, now: u64, f: impl FnOnce(&mut V) -> R) -> Result<R, Full> {
        let (key, hash, i) = self.located[n];
        let (hasher, cap) = (self.hasher, self.cap);
        self.guard(i).with(hasher, cap, false, hash, key, now, f)
    }
}

// ----- entries ---------------------------------------------------------------

/// All of one user's state. Kept small for idle users: the turn bucket and
/// leases inline, everything about model calls boxed (a user who only made
/// turns pays one pointer for it).
#[derive(Default)]
struct UserEntry {
    turns: Option<(BucketState, u64)>,
    leases: LeaseSet,
    calls: Option<Box<CallState>>,
    claims: Option<Box<Claims>>,
}

/// A user's session claims ([`Store::claim_session`]): session id → the
/// claim's end.
///
/// Until `first_end` every claim is live, so an operation (a refused one
/// above all) needs no scan of the claims.
#[derive(Default)]
struct Claims {
    ends: hashbrown::HashMap<Box<str>, u64>,
    /// The earliest end.
    first_end: u64,
    /// The latest end (the entry's expiry).
    last_end: u64,
}

impl Claims {
    fn recompute(&mut self) {
        self.first_end = self.ends.values().min().copied().unwrap_or(0);
        self.last_end = self.ends.values().max().copied().unwrap_or(0);
    }
}

#[derive(Default)]
struct CallState {
    tokens: Option<(BucketState, u64)>,
    invocations: Vec<Invocation>,
    usage: Usage,
    /// The last reconciliation batch applied from each replica (tag,
    /// batch), at most [`MAX_RECONCILING_REPLICAS`], the least recent
    /// forgotten first.
    reconciled: Vec<(u32, u64)>,
}

/// Replicas whose last reconciliation batch a user's state remembers.
const MAX_RECONCILING_REPLICAS: usize = 64;

struct Invocation {
    id: Box<str>,
    /// Model calls counted so far; reservation numbers are 1..=calls.
    calls: u64,
    /// Open reservations: (call, estimate charged). Closed ones are the
    /// numbers up to `calls` that are not here.
    open: Vec<(u64, u64)>,
    /// Request ids of granted reserves: (id, call, when its wait ends).
    /// Call 0 marks an id superseded by reconciliation.
    requests: Vec<(Box<str>, u64, u64)>,
    expires_at: u64,
}

impl Invocation {
    fn request(&self, id: &str) -> Option<(u64, u64)> {
        self.requests
            .iter()
            .find(|(r, _, _)| &**r == id)
            .map(|(_, call, ready)| (*call, *ready))
    }
}

/// Tokens charged per minute, two windows, for the sliding-minute estimate.
#[derive(Default, Clone, Copy)]
struct Usage {
    minute: u64,
    current: i64,
    previous: i64,
}

impl Usage {
    fn roll(&mut self, now: u64) {
        let m = now / 60_000;
        if m == self.minute {
            return;
        }
        self.previous = if m == self.minute + 1 {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.minute = m;
    }

    fn add(&mut self, now: u64, tokens: i64) {
        self.roll(now);
        self.current = self.current.saturating_add(tokens);
    }

    /// Tokens over the last 60 s: this minute plus the overlapping share of
    /// the previous one.
    fn last_minute(&self, now: u64) -> i64 {
        let mut u = *self;
        u.roll(now);
        super::sliding_minute(u.current, u.previous, now)
    }

    fn expires_at(&self) -> u64 {
        if self.current == 0 && self.previous == 0 {
            0
        } else {
            (self.minute + 2).saturating_mul(60_000)
        }
    }
}

impl Expiring for UserEntry {
    /// Keeps the (expired) leases so the operation that purges them counts
    /// them as reclaimed, as the Redis scripts do.
    fn reset(&mut self) {
        self.turns = None;
        self.calls = None;
        self.claims = None;
    }

    fn expires_at(&self) -> u64 {
        let calls = self.calls.as_ref().map_or(0, |c| {
            slot_expiry(&c.tokens)
                .max(
                    c.invocations
                        .iter()
                        .map(|i| i.expires_at)
                        .max()
                        .unwrap_or(0),
                )
                .max(c.usage.expires_at())
        });
        slot_expiry(&self.turns)
            .max(self.leases.expires_at().unwrap_or(0))
            .max(calls)
            .max(self.claims.as_ref().map_or(0, |c| c.last_end))
    }
}

fn slot_expiry(s: &Option<(BucketState, u64)>) -> u64 {
    s.map_or(0, |(_, e)| e)
}

fn live(slot: Option<(BucketState, u64)>, now: u64) -> Option<BucketState> {
    slot.filter(|(_, exp)| *exp > now).map(|(s, _)| s)
}

impl UserEntry {
    /// The model-call state, created on first use.
    fn calls(&mut self) -> &mut CallState {
        self.calls.get_or_insert_with(Box::default)
    }

    fn tokens(&self) -> Option<(BucketState, u64)> {
        self.calls.as_ref().and_then(|c| c.tokens)
    }
}

impl CallState {
    fn invocation(&mut self, now: u64, id: &str) -> Option<&mut Invocation> {
        self.invocations.retain(|i| i.expires_at > now);
        self.invocations.iter_mut().find(|i| &*i.id == id)
    }
}

/// The answer a repeated request id gets: the first grant, with what is
/// left of its wait, or [`ReserveOutcome::Superseded`].
fn repeat(invocation_id: &str, call: u64, ready_at: u64, now: u64) -> ReserveOutcome {
    if call == 0 {
        return ReserveOutcome::Superseded;
    }
    ReserveOutcome::Granted {
        reservation: ReservationId::new(invocation_id, call),
        wait_ms: ready_at.saturating_sub(now),
    }
}

#[derive(Default)]
struct SessionEntry {
    lease: SessionLease,
    records: Vec<Box<[u8]>>,
    /// The ids of the events appended by [`Store::session_append`], kept
    /// with the records.
    ids: hashbrown::HashSet<Box<str>>,
    expires_at: u64,
}

impl Expiring for SessionEntry {
    fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

#[derive(Default)]
enum KeyEntry {
    #[default]
    Empty,
    Bucket(BucketState, u64),
    Cooldown(u64),
    Aimd(AimdState, u64),
}

impl Expiring for KeyEntry {
    fn expires_at(&self) -> u64 {
        match *self {
            KeyEntry::Empty => 0,
            KeyEntry::Bucket(_, e) | KeyEntry::Aimd(_, e) => e,
            // Kept a grace period past its end, like Redis keeps the key
            // (by real time) while a stepped-back clock may still see it.
            KeyEntry::Cooldown(until) => until.saturating_add(EXPIRY_GRACE_MS),
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

    /// What a repeat of reserve request `request_id` of run
    /// `invocation_id` answers, if this store granted it (or marked it
    /// superseded): the first grant with what is left of its wait. A read:
    /// nothing changes.
    pub fn repeat_of(
        &self,
        user: &str,
        invocation_id: &str,
        request_id: &str,
    ) -> Option<ReserveOutcome> {
        let now = self.now();
        self.inner.users.read(user, now, |u| {
            let inv = u?
                .calls
                .as_deref()?
                .invocations
                .iter()
                .find(|i| &*i.id == invocation_id && i.expires_at > now)?;
            let (call, ready) = inv.request(request_id)?;
            Some(repeat(invocation_id, call, ready, now))
        })
    }

    fn admit(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, Full> {
        let now = self.now();
        self.inner.users.with(req.user, now, |u| {
            let t = lease::admit_turn(
                &req.params,
                live(u.turns, now),
                &mut u.leases,
                now,
                req.invocation_id,
            );
            if let Some(b) = t.bucket {
                u.turns = Some(b);
            }
            TurnOutcome {
                admit: t.outcome,
                reclaimed: t.reclaimed as u32,
            }
        })
    }

    fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, Full> {
        let now = self.now();
        self.inner.users.with(req.user, now, |u| {
            let c = u.calls();
            let inv = c.invocation(now, req.invocation_id);
            if let (Some(rid), Some(inv)) = (req.request_id, &inv)
                && let Some((call, ready)) = inv.request(rid)
            {
                return repeat(req.invocation_id, call, ready, now);
            }
            let calls = inv.map_or(0, |i| i.calls);
            let cap = Denial::CapReached {
                limit: Limit::MaxLlmCalls,
                cap: req.max_llm_calls,
            };
            if calls >= req.max_llm_calls && !req.shadow {
                return ReserveOutcome::Denied {
                    denial: cap,
                    shadow_reservation: None,
                };
            }
            let t = bucket::take(
                &req.tokens,
                live(c.tokens, now),
                now,
                req.estimate,
                req.max_wait_ms,
            );
            let denial = match t.outcome {
                _ if calls >= req.max_llm_calls => Some(cap),
                Take::Granted { .. } => None,
                Take::Refused { retry_after_ms } => Some(Denial::Limited {
                    limit: Limit::TokenRate,
                    retry_after_ms,
                }),
                Take::ExceedsCapacity => Some(Denial::ExceedsCapacity {
                    limit: Limit::TokenRate,
                    cost: req.estimate,
                    max_cost: req.tokens.max_cost(req.max_wait_ms),
                }),
            };
            let reservation = |c: &mut CallState, charged| {
                ReservationId::new(
                    req.invocation_id,
                    c.record_call(now, req.invocation_id, charged),
                )
            };
            match (denial, t.outcome) {
                (None, Take::Granted { wait_ms }) => {
                    c.tokens = Some((t.state, t.expires_at));
                    c.usage.add(now, req.estimate as i64);
                    let reservation = reservation(c, req.estimate);
                    if let Some(rid) = req.request_id
                        && let Some(inv) = c.invocation(now, req.invocation_id)
                    {
                        inv.requests.push((
                            rid.into(),
                            reservation.call,
                            now.saturating_add(wait_ms),
                        ));
                    }
                    ReserveOutcome::Granted {
                        reservation,
                        wait_ms,
                    }
                }
                (denial, _) => {
                    // Take nothing: keep only the refilled level.
                    let r = bucket::adjust(&req.tokens, live(c.tokens, now), now, 0);
                    c.tokens = Some((r.state, r.expires_at));
                    ReserveOutcome::Denied {
                        denial: denial.unwrap_or(cap),
                        shadow_reservation: req.shadow.then(|| reservation(c, 0)),
                    }
                }
            }
        })
    }

    fn settle_now(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, Full> {
        let now = self.now();
        let spec = req.tokens;
        let balance =
            |c: &CallState| spec.unscale(bucket::refill(&spec, live(c.tokens, now), now).level);
        self.inner.users.with(req.user, now, |u| {
            let r = req.reservation;
            let Some(c) = u.calls.as_deref_mut() else {
                return SettleOutcome::Unknown;
            };
            let Some(inv) = c.invocation(now, &r.invocation_id) else {
                return SettleOutcome::Unknown;
            };
            if r.call == 0 || r.call > inv.calls {
                return SettleOutcome::Unknown;
            }
            let Some(pos) = inv.open.iter().position(|(n, _)| *n == r.call) else {
                return SettleOutcome::AlreadyClosed {
                    balance: balance(c),
                };
            };
            let (_, estimate) = inv.open.swap_remove(pos);
            if inv.open.is_empty() {
                inv.open = Vec::new();
            }
            inv.expires_at = now.saturating_add(RESERVATION_RETENTION_MS);
            let delta = match req.actual {
                // Counts past 2^53 cannot be kept exactly (see SettleRequest).
                Some(actual) => i128::from(actual.min(MAX_SCALED as u64)) - i128::from(estimate),
                None => -i128::from(estimate),
            };
            let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
            let a = bucket::adjust(&spec, live(c.tokens, now), now, delta);
            c.tokens = Some((a.state, a.expires_at));
            c.usage.add(now, delta);
            SettleOutcome::Applied {
                balance: spec.unscale(a.state.level),
            }
        })
    }

    fn take_many_now(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, Full> {
        let now = self.now();
        if let ([t], None) = (takes, cooldown) {
            // One bucket: a single probe under a single lock.
            return self.inner.keys.with(t.key, now, |e| {
                let state = match *e {
                    KeyEntry::Bucket(s, exp) if exp > now => Some(s),
                    _ => None,
                };
                let tr = bucket::take(&t.spec, state, now, t.cost, t.max_wait_ms);
                *e = KeyEntry::Bucket(tr.state, tr.expires_at);
                match tr.outcome {
                    Take::Granted { wait_ms } => MultiTake::Granted { wait_ms },
                    Take::Refused { retry_after_ms } => MultiTake::Refused {
                        index: Some(0),
                        retry_after_ms,
                    },
                    Take::ExceedsCapacity => MultiTake::ExceedsCapacity { index: 0 },
                }
            });
        }
        let mut keys: Vec<&str> = takes.iter().map(|t| t.key).collect();
        if let Some(c) = cooldown {
            keys.push(c.key);
        }
        let mut locked = self.inner.keys.lock_many(&keys);
        // Room for every new key first: a refusal must change nothing.
        locked.check_room(now)?;
        let states: Vec<Option<BucketState>> = (0..takes.len())
            .map(|n| {
                locked.with(n, now, |e| match *e {
                    KeyEntry::Bucket(s, exp) if exp > now => Some(s),
                    _ => None,
                })
            })
            .collect::<Result<_, Full>>()?;
        // A key named twice is taken twice, in order: each take starts from
        // the state the previous take of that key left.
        let mut transitions: Vec<bucket::Transition<Take>> = Vec::with_capacity(takes.len());
        for (i, t) in takes.iter().enumerate() {
            let before = takes[..i]
                .iter()
                .rposition(|p| p.key == t.key)
                .map_or(states[i], |j| Some(transitions[j].state));
            transitions.push(bucket::take(&t.spec, before, now, t.cost, t.max_wait_ms));
        }
        let mut wait = 0u64;
        let mut refused: Option<(Option<usize>, u64)> = None;
        let mut exceeds = None;
        for (i, t) in transitions.iter().enumerate() {
            match t.outcome {
                Take::Granted { wait_ms } => wait = wait.max(wait_ms),
                Take::Refused { retry_after_ms } => {
                    if refused.is_none_or(|(_, r)| retry_after_ms > r) {
                        refused = Some((Some(i), retry_after_ms));
                    }
                }
                Take::ExceedsCapacity => {
                    exceeds.get_or_insert(i);
                }
            }
        }
        if let Some(c) = cooldown {
            let until = locked.with(takes.len(), now, |e| match *e {
                KeyEntry::Cooldown(u) => u,
                _ => 0,
            })?;
            let remaining = until.saturating_sub(now);
            if remaining > c.max_wait_ms {
                let hint = remaining - c.max_wait_ms;
                if refused.is_none_or(|(_, r)| hint > r) {
                    refused = Some((None, hint));
                }
            } else {
                wait = wait.max(remaining);
            }
        }
        let granted = exceeds.is_none() && refused.is_none();
        for (n, ((t, s), tr)) in takes.iter().zip(&states).zip(&transitions).enumerate() {
            let (state, exp) = if granted {
                (tr.state, tr.expires_at)
            } else {
                let r = bucket::refill(&t.spec, *s, now);
                (r, bucket::expires_at(&t.spec, r.level, now))
            };
            locked.with(n, now, |e| *e = KeyEntry::Bucket(state, exp))?;
        }
        Ok(if let Some(index) = exceeds {
            MultiTake::ExceedsCapacity { index }
        } else if let Some((index, retry_after_ms)) = refused {
            MultiTake::Refused {
                index,
                retry_after_ms,
            }
        } else {
            MultiTake::Granted { wait_ms: wait }
        })
    }

    fn take_one_now(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, Full> {
        let now = self.now();
        let spec = req.spec;
        match req.bucket {
            BucketRef::Turns(user) => self.inner.users.with(user, now, |u| {
                let before = live(u.turns, now);
                let t = bucket::take(&spec, before, now, req.cost, 0);
                // A refusal takes nothing: keep only the refilled level of a
                // bucket that exists (as turn admission does).
                if matches!(t.outcome, Take::Granted { .. }) || before.is_some() {
                    u.turns = Some((t.state, t.expires_at));
                }
                TakeOutcome::new(t.outcome, &spec, t.state.level)
            }),
            BucketRef::Named(key) => self.inner.keys.with(key, now, |e| {
                let state = match *e {
                    KeyEntry::Bucket(s, exp) if exp > now => Some(s),
                    _ => None,
                };
                let t = bucket::take(&spec, state, now, req.cost, 0);
                if matches!(t.outcome, Take::Granted { .. }) || state.is_some() {
                    *e = KeyEntry::Bucket(t.state, t.expires_at);
                }
                TakeOutcome::new(t.outcome, &spec, t.state.level)
            }),
        }
    }

    /// Runs `f` on a session's entry, then keeps the session (SPEC §4): one
    /// with records for the retention past now, one without until its
    /// lease's end (or now, if later) plus the grace; never less than it
    /// was kept before, nor less than its lease.
    fn session<R>(
        &self,
        session: &str,
        f: impl FnOnce(&mut SessionEntry, u64) -> R,
    ) -> Result<R, Full> {
        let now = self.now();
        let retention = self.inner.session_retention_ms;
        let grace = self.inner.session_grace_ms;
        self.inner.sessions.with(session, now, |s| {
            let r = f(s, now);
            keep_session(s, now, retention, grace);
            r
        })
    }

    fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, Full> {
        let now = self.now();
        let hold = crate::bucket::clamp_ttl(req.lease_ttl_ms)
            .saturating_add(self.inner.session_grace_ms)
            .saturating_add(CLAIM_SLACK_MS);
        let until = now.saturating_add(hold);
        self.inner.users.with(req.user, now, |u| {
            let c = u.claims.get_or_insert_with(Box::default);
            if !c.ends.is_empty() && c.first_end <= now {
                c.ends.retain(|_, end| *end > now);
                c.recompute();
            }
            let held = u32::try_from(c.ends.len()).unwrap_or(u32::MAX);
            let out = if let Some(end) = c.ends.get_mut(req.session) {
                if until > *end {
                    let was_first = *end == c.first_end;
                    *end = until;
                    c.last_end = c.last_end.max(until);
                    if was_first {
                        c.recompute();
                    }
                }
                Claim::Claimed { sessions: held }
            } else if !req.create {
                Claim::Unclaimed { sessions: held }
            } else if held >= req.max_sessions {
                let first = if c.ends.is_empty() {
                    until
                } else {
                    c.first_end
                };
                Claim::Full {
                    retry_after_ms: first.saturating_sub(now).max(1),
                }
            } else {
                if c.ends.is_empty() {
                    c.first_end = until;
                }
                c.ends.insert(req.session.into(), until);
                c.first_end = c.first_end.min(until);
                c.last_end = c.last_end.max(until);
                Claim::Claimed { sessions: held + 1 }
            };
            if c.ends.is_empty() {
                u.claims = None;
            }
            out
        })
    }
}

impl CallState {
    /// The record of run `invocation_id`, made if there is none (at most
    /// [`MAX_TRACKED_RUNS`] per user: the least recently active is dropped
    /// for a new one); its retention restarts.
    fn run_record(&mut self, now: u64, invocation_id: &str) -> &mut Invocation {
        let expires_at = now.saturating_add(RESERVATION_RETENTION_MS);
        self.invocations.retain(|i| i.expires_at > now);
        let pos = self
            .invocations
            .iter()
            .position(|i| &*i.id == invocation_id);
        let inv = match pos {
            Some(p) => &mut self.invocations[p],
            None => {
                if self.invocations.len() >= MAX_TRACKED_RUNS
                    && let Some(oldest) = self
                        .invocations
                        .iter()
                        .enumerate()
                        .min_by(|(_, a), (_, b)| (a.expires_at, &a.id).cmp(&(b.expires_at, &b.id)))
                        .map(|(i, _)| i)
                {
                    self.invocations.swap_remove(oldest);
                }
                // Most users run one invocation at a time: the first
                // allocation holds exactly one; growth after is amortized.
                if self.invocations.capacity() == 0 {
                    self.invocations.reserve_exact(1);
                }
                self.invocations.push(Invocation {
                    id: invocation_id.into(),
                    calls: 0,
                    open: Vec::new(),
                    requests: Vec::new(),
                    expires_at,
                });
                self.invocations.last_mut().expect("just pushed")
            }
        };
        inv.expires_at = expires_at;
        inv
    }

    /// Counts a model call of `invocation_id` and records its reservation as
    /// open with the estimate it charged (0 for a shadow reservation, which
    /// took nothing: its settle charges the actual usage, its refund changes
    /// nothing). Answers the call's number.
    fn record_call(&mut self, now: u64, invocation_id: &str, charged: u64) -> u64 {
        let inv = self.run_record(now, invocation_id);
        inv.calls += 1;
        if inv.open.capacity() == 0 {
            inv.open.reserve_exact(1);
        }
        inv.open.push((inv.calls, charged));
        inv.calls
    }
}

impl Store for MemoryStore {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        self.room("admit_turn", || self.admit(req))
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<Release, StoreError> {
        let now = self.now();
        self.room("release_run", || {
            self.inner.users.with(user, now, |u| {
                if u.leases.release(now, invocation_id) {
                    Release::Released
                } else {
                    Release::NotHeld
                }
            })
        })
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let now = self.now();
        self.room("renew_run", || {
            self.inner
                .users
                .with(user, now, |u| u.leases.renew(now, invocation_id, ttl_ms))
        })
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

    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        self.room("take_one", || self.take_one_now(req))
    }

    async fn extend_cooldown(&self, key: &str, until_ms: u64) -> Result<u64, StoreError> {
        let now = self.now();
        self.room("extend_cooldown", || {
            self.inner.keys.with(key, now, |e| {
                // As the Redis script: a cooldown that has passed counts as none.
                let current = match *e {
                    KeyEntry::Cooldown(u) if u > now => u,
                    _ => 0,
                };
                let until = current.max(until_ms.min(MAX_SCALED as u64));
                *e = if until > now {
                    KeyEntry::Cooldown(until)
                } else {
                    KeyEntry::Empty
                };
                until
            })
        })
    }

    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        let now = self.now();
        let p = params.clamped();
        self.room("aimd", || {
            self.inner.keys.with(key, now, |e| {
                let state = match *e {
                    KeyEntry::Aimd(s, exp) if exp > now => s,
                    _ => AimdState::FULL_RATE,
                };
                if !throttled {
                    return state.effective(now, &p);
                }
                let next = state.throttled(now, &p);
                // Back at the configured rate, the state can be forgotten (after
                // a grace period, for a clock that steps back).
                let until = next
                    .full_at(&p)
                    .unwrap_or(now)
                    .max(now.saturating_add(1))
                    .saturating_add(EXPIRY_GRACE_MS);
                *e = KeyEntry::Aimd(next, until);
                next.effective(now, &p)
            })
        })
    }

    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        let now = self.now();
        let p = params.clamped();
        // Both keys under their locks at once: one step, as the Redis script.
        let mut locked = self.inner.keys.lock_many(&[cooldown, aimd]);
        let cooldown_until_ms = locked
            .with(0, now, |e| {
                let until = match *e {
                    KeyEntry::Cooldown(u) if u > now => Some(u),
                    _ => None,
                };
                *e = KeyEntry::Empty;
                until
            })
            .map_err(|Full| self.full("clear_provider"))?;
        let effective_permille = locked
            .with(1, now, |e| {
                let state = match *e {
                    KeyEntry::Aimd(s, exp) if exp > now => s,
                    _ => AimdState::FULL_RATE,
                };
                *e = KeyEntry::Empty;
                state.effective(now, &p)
            })
            .map_err(|Full| self.full("clear_provider"))?;
        Ok(ProviderCleared {
            cooldown_until_ms,
            effective_permille,
        })
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
            self.session(session, |s, now| s.lease.acquire(now, holder, ttl_ms))
        })
    }

    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        self.room("session_renew", || {
            self.session(session, |s, now| s.lease.renew(now, holder, ttl_ms))
        })
    }

    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        self.room("session_release", || {
            self.session(session, |s, now| s.lease.release(now, holder))
        })
    }

    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        let now = self.now();
        Ok(self.inner.sessions.read(session, now, |s| {
            let latest = s.map_or(0, |s| s.lease.fence);
            FenceCheck {
                current: latest != 0 && latest == fence,
                latest,
            }
        }))
    }

    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        self.room("append_fenced", || {
            self.session(session, |s, _| {
                if !s.lease.fence_is_current(fence) {
                    return AppendOutcome::Stale {
                        latest: s.lease.fence,
                    };
                }
                s.records.push(record.into());
                AppendOutcome::Appended {
                    index: s.records.len() as u64 - 1,
                }
            })
        })
    }

    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let now = self.now();
        Ok(self.inner.sessions.read(session, now, |s| {
            s.map(|s| {
                s.records
                    .iter()
                    .skip(usize::try_from(from).unwrap_or(usize::MAX))
                    .take(limit)
                    .map(|r| r.to_vec())
                    .collect()
            })
            .unwrap_or_default()
        }))
    }

    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        self.room("delete_records", || {
            self.session(session, |s, _| {
                let n = s.records.len() as u64;
                s.records = Vec::new();
                s.ids = hashbrown::HashSet::new();
                n
            })
        })
    }

    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        let now = self.now();
        Ok(self.inner.users.read(user, now, |u| {
            let level = |spec: &BucketSpec, s: Option<(BucketState, u64)>| {
                spec.unscale(bucket::refill(spec, s.and_then(|s| live(Some(s), now)), now).level)
            };
            match u {
                None => UserState {
                    turns_available: turns.capacity() as i64,
                    tokens_available: tokens.capacity() as i64,
                    ..UserState::default()
                },
                Some(u) => UserState {
                    turns_available: level(&turns, u.turns),
                    tokens_available: level(&tokens, u.tokens()),
                    leases: u
                        .leases
                        .iter()
                        .filter(|(_, exp)| *exp > now)
                        .map(|(id, exp)| (id.to_owned(), exp))
                        .collect(),
                    tokens_last_minute: u.calls.as_ref().map_or(0, |c| c.usage.last_minute(now)),
                },
            }
        }))
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        let now = self.now();
        let mut all: Vec<TopUser> = Vec::new();
        self.inner.users.for_each_live(now, |user, u| {
            let tokens = u.calls.as_ref().map_or(0, |c| c.usage.last_minute(now));
            if tokens > 0 {
                all.push(TopUser {
                    user: user.to_owned(),
                    tokens_last_minute: tokens,
                });
            }
        });
        Ok(super::rank_top(all, n))
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        let now = self.now();
        self.room("reset_user", || {
            self.inner.users.with(user, now, |u| {
                let had = live(u.turns, now).is_some() || live(u.tokens(), now).is_some();
                u.turns = None;
                if let Some(c) = u.calls.as_deref_mut() {
                    c.tokens = None;
                }
                had
            })
        })
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

impl MemoryStore {
    fn reconcile_now(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, Full> {
        let now = self.now();
        self.inner.users.with(req.user, now, |u| {
            let c = u.calls();
            match c.reconciled.iter().position(|(r, _)| *r == req.replica) {
                Some(i) if c.reconciled[i].1 >= req.batch => return Reconciled::default(),
                Some(i) => {
                    c.reconciled.remove(i);
                }
                None if c.reconciled.len() >= MAX_RECONCILING_REPLICAS => {
                    c.reconciled.remove(0);
                }
                None => {}
            }
            c.reconciled.push((req.replica, req.batch));
            let mut refunded = 0u32;
            let mut given_back: i64 = 0;
            if !req.ambiguous_reserves.is_empty() {
                let c = u.calls();
                for &(inv_id, rid) in req.ambiguous_reserves {
                    let inv = c.run_record(now, inv_id);
                    match inv.requests.iter().position(|(r, _, _)| &**r == rid) {
                        Some(i) => {
                            let call = inv.requests[i].1;
                            if let Some(pos) = inv.open.iter().position(|(n, _)| *n == call) {
                                let (_, charged) = inv.open.swap_remove(pos);
                                given_back = given_back.saturating_add(charged as i64);
                                refunded += 1;
                            }
                            inv.requests[i].1 = 0;
                        }
                        None => inv.requests.push((rid.into(), 0, 0)),
                    }
                }
            }
            let held_here = req
                .ambiguous_admissions
                .iter()
                .filter(|id| u.leases.iter().any(|(l, exp)| l == **id && exp > now))
                .count() as u64;
            let turns = req.turns_taken.saturating_sub(held_here);
            if turns > 0 {
                let delta = i64::try_from(turns).unwrap_or(i64::MAX);
                let a = bucket::adjust(&req.turns, live(u.turns, now), now, delta);
                u.turns = Some((a.state, a.expires_at));
            }
            let tokens = req.tokens_net.saturating_sub(given_back);
            if tokens != 0 {
                let c = u.calls();
                let a = bucket::adjust(&req.tokens, live(c.tokens, now), now, tokens);
                c.tokens = Some((a.state, a.expires_at));
                c.usage.add(now, tokens);
            }
            Reconciled {
                turns,
                tokens,
                refunded,
            }
        })
    }
}

/// Keeps a session after an operation on it (SPEC §4): one with records for
/// the retention past now, one without until its lease's end (or now, if
/// later) plus the grace; never less than it was kept before, nor less
/// than its lease. A session with neither records nor a fence is left to
/// expire at once.
fn keep_session(s: &mut SessionEntry, now: u64, retention: u64, grace: u64) {
    if s.lease.fence > 0 || !s.records.is_empty() {
        let lease_end = s.lease.holder.as_ref().map_or(0, |(_, exp)| *exp);
        let keep = if s.records.is_empty() {
            lease_end.max(now).saturating_add(grace)
        } else {
            now.saturating_add(retention)
        };
        s.expires_at = keep.max(s.expires_at).max(lease_end);
    }
}

// ----- grouped session writes ------------------------------------------------

impl MemoryStore {
    /// Locks the shards of a grouped write's session (position 0) and its
    /// logs (positions 1…): the whole write is one critical section.
    fn lock_group<'a, 'k>(
        &'a self,
        session: &'k str,
        logs: &[LogWrite<'k>],
    ) -> Multi<'a, 'k, SessionEntry> {
        let keys: Vec<&'k str> = std::iter::once(session)
            .chain(logs.iter().map(|l| l.log))
            .collect();
        self.inner.sessions.lock_many(&keys)
    }

    /// Room for the keys a grouped write adds: the session if `session`,
    /// and each log it appends a record to.
    fn group_room(
        locked: &mut Multi<'_, '_, SessionEntry>,
        now: u64,
        session: bool,
        logs: &[LogWrite<'_>],
    ) -> Result<(), Full> {
        let new: Vec<usize> = session
            .then_some(0)
            .into_iter()
            .chain(
                logs.iter()
                    .enumerate()
                    .filter(|(_, l)| l.record.is_some())
                    .map(|(i, _)| i + 1),
            )
            .collect();
        locked.check_room_of(now, new.iter().copied())
    }

    /// Runs `f` on the `n`th entry of a locked group, then keeps it.
    fn group_entry<R>(
        &self,
        locked: &mut Multi<'_, '_, SessionEntry>,
        n: usize,
        now: u64,
        f: impl FnOnce(&mut SessionEntry) -> R,
    ) -> Result<R, Full> {
        let (retention, grace) = (self.inner.session_retention_ms, self.inner.session_grace_ms);
        locked.with(n, now, |s| {
            let r = f(s);
            keep_session(s, now, retention, grace);
            r
        })
    }

    /// Writes every log of a locked group (room was checked).
    fn write_logs(
        &self,
        locked: &mut Multi<'_, '_, SessionEntry>,
        now: u64,
        logs: &[LogWrite<'_>],
    ) -> Result<(), Full> {
        for (i, l) in logs.iter().enumerate() {
            self.group_entry(locked, i + 1, now, |s| {
                if let Some(record) = l.record {
                    s.records.push(record.into());
                }
            })?;
        }
        Ok(())
    }

    fn create_now(&self, req: SessionCreate<'_>) -> Result<SessionCreated, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let refusal = self.group_entry(&mut locked, 0, now, |s| match &s.lease.holder {
            Some((_, exp)) if *exp > now => Some(SessionCreated::Busy {
                retry_after_ms: (exp - now).max(1),
            }),
            _ if !s.records.is_empty() => Some(SessionCreated::Exists),
            _ => None,
        })?;
        if let Some(refusal) = refusal {
            return Ok(refusal);
        }
        Self::group_room(&mut locked, now, true, req.logs)?;
        let fence = self.group_entry(&mut locked, 0, now, |s| {
            s.lease.fence += 1;
            s.lease.holder = None;
            s.records.push(req.record.into());
            s.lease.fence
        })?;
        self.write_logs(&mut locked, now, req.logs)?;
        Ok(SessionCreated::Created { fence })
    }

    fn append_now(&self, req: SessionAppend<'_>) -> Result<SessionAppended, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let id = req.id.filter(|id| !id.is_empty());
        let refusal = self.group_entry(&mut locked, 0, now, |s| {
            if !s.lease.fence_is_current(req.fence) {
                Some(SessionAppended::Stale {
                    latest: s.lease.fence,
                })
            } else if s.records.is_empty() {
                Some(SessionAppended::Missing)
            } else if id.is_some_and(|id| s.ids.contains(id)) {
                Some(SessionAppended::Repeated)
            } else {
                None
            }
        })?;
        if let Some(refusal) = refusal {
            return Ok(refusal);
        }
        Self::group_room(&mut locked, now, false, req.logs)?;
        let index = self.group_entry(&mut locked, 0, now, |s| {
            s.records.push(req.record.into());
            if let Some(id) = id {
                s.ids.insert(id.into());
            }
            s.records.len() as u64 - 1
        })?;
        self.write_logs(&mut locked, now, req.logs)?;
        Ok(SessionAppended::Appended { index })
    }

    fn delete_now(&self, req: SessionDelete<'_>) -> Result<u64, Full> {
        let mut locked = self.lock_group(req.session, req.logs);
        let now = self.now();
        let held = locked.with(0, now, |s| s.records.len() as u64)?;
        if held > 0 {
            Self::group_room(&mut locked, now, false, req.logs)?;
        }
        let deleted = self.group_entry(&mut locked, 0, now, |s| {
            s.records = Vec::new();
            s.ids = hashbrown::HashSet::new();
            held
        })?;
        if deleted > 0 {
            self.write_logs(&mut locked, now, req.logs)?;
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeClock;
    use crate::lease::{Admit, TurnParams};

    fn params() -> TurnParams {
        TurnParams {
            turns: BucketSpec::new(20, 60_000, 5).unwrap(),
            max_runs: 2,
            lease_ttl_ms: 120_000,
            concurrency_retry_ms: 1_000,
        }
    }

    fn admit(store: &MemoryStore, user: &str, inv: &str) -> Admit {
        store
            .admit(TurnRequest {
                user,
                invocation_id: inv,
                params: params(),
            })
            .expect("room")
            .admit
    }

    #[test]
    fn idle_users_expire_and_are_swept() {
        let clock = FakeClock::new(1_000_000);
        let store = MemoryStore::new(clock.clone());
        for i in 0..5_000 {
            let user = format!("u{i}");
            assert!(matches!(admit(&store, &user, "r"), Admit::Admitted { .. }));
            assert!(store.release_run(&user, "r").into_inner_ready().released());
        }
        assert_eq!(store.stats().users, 5_000);
        // The turn bucket is full again after 3 s, plus the 60 s grace.
        clock.advance(63_000);
        store.purge_expired();
        assert_eq!(store.stats().users, 0);
    }

    #[test]
    fn a_write_sweeps_its_shard_after_a_minute() {
        let clock = FakeClock::new(1_000_000);
        let store = MemoryStore::new(clock.clone());
        for i in 0..2_000 {
            admit(&store, &format!("u{i}"), "r");
        }
        // Leases keep the entries for 120 s.
        clock.advance(119_999);
        store.purge_expired();
        assert_eq!(store.stats().users, 2_000);
        clock.advance(61_000);
        // One write per shard triggers the minute sweep there.
        for i in 0..2_000 {
            admit(&store, &format!("v{i}"), "r");
        }
        assert_eq!(store.stats().users, 2_000, "old users swept, new kept");
    }

    #[test]
    fn live_entries_survive_a_shrinking_sweep() {
        let clock = FakeClock::new(1_000_000);
        let store = MemoryStore::new(clock.clone());
        for i in 0..20_000 {
            let user = format!("idle{i}");
            admit(&store, &user, "r");
            store.release_run(&user, "r").into_inner_ready();
        }
        clock.advance(30_000);
        let mut p = params();
        p.max_runs = 1;
        for i in 0..64 {
            let req = TurnRequest {
                user: &format!("busy{i}"),
                invocation_id: "r",
                params: p,
            };
            assert!(matches!(
                store.admit(req).expect("room").admit,
                Admit::Admitted { .. }
            ));
        }
        // The idle users expire (3 s + 60 s grace); the sweep shrinks the
        // tables and must keep every busy user findable.
        clock.advance(70_000);
        store.purge_expired();
        assert_eq!(store.stats().users, 64);
        for i in 0..64 {
            let req = TurnRequest {
                user: &format!("busy{i}"),
                invocation_id: "other",
                params: p,
            };
            assert!(
                matches!(store.admit(req).expect("room").admit, Admit::Denied(_)),
                "busy{i} still holds its only slot"
            );
        }
        assert_eq!(store.stats().users, 64);
    }

    #[test]
    fn reads_do_not_create_entries() {
        let clock = FakeClock::new(1_000);
        let store = MemoryStore::new(clock);
        assert!(
            !store
                .release_run("ghost", "r")
                .into_inner_ready()
                .released()
        );
        assert_eq!(store.renew_run("ghost", "r", 10).into_inner_ready(), None);
        let spec = BucketSpec::new(1, 1, 1).unwrap();
        let st = store.user_state("ghost", spec, spec).into_inner_ready();
        assert_eq!(st.tokens_available, 1);
        assert_eq!(store.session_renew("s", "h", 10).into_inner_ready(), None);
        assert_eq!(
            store.stats(),
            MemoryStats {
                users: 0,
                sessions: 0,
                keys: 0
            }
        );
    }

    #[test]
    fn sessions_are_kept_for_their_retention() {
        let clock = FakeClock::new(1_000);
        let store = MemoryStore::with_session_retention(clock.clone(), 10_000);
        let g = store.session_acquire("s", "h", 100).into_inner_ready();
        assert!(matches!(
            g,
            SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
        ));
        // A record: the retention applies (without one, the grace would,
        // here cut to the retention).
        assert!(matches!(
            store.append_fenced("s", 1, b"r").into_inner_ready(),
            AppendOutcome::Appended { index: 0 }
        ));
        // Kept for the retention past the append (11,000), and never less
        // than the lease's end plus the grace the acquire gave it (11,100).
        clock.advance(10_099);
        assert_eq!(store.fence_check("s", 1).into_inner_ready().latest, 1);
        clock.advance(1);
        assert_eq!(store.fence_check("s", 1).into_inner_ready().latest, 0);
        store.purge_expired();
        assert_eq!(store.stats().sessions, 0);
    }

    fn small(clock: &FakeClock, max_entries: usize) -> MemoryStore {
        MemoryStore::with_config(
            clock.clone(),
            MemoryConfig {
                max_entries,
                ..MemoryConfig::default()
            },
        )
    }

    fn turn(store: &MemoryStore, user: &str, inv: &str) -> Result<Admit, StoreError> {
        store
            .admit_turn(TurnRequest {
                user,
                invocation_id: inv,
                params: params(),
            })
            .into_result_ready()
            .map(|o| o.admit)
    }

    #[test]
    fn past_max_entries_new_keys_are_refused_and_existing_ones_work() {
        let clock = FakeClock::new(1_000_000);
        let store = small(&clock, 3);
        let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = refused.clone();
        store.on_full(move |_op| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        for u in ["a", "b", "c"] {
            assert!(matches!(turn(&store, u, "r1"), Ok(Admit::Admitted { .. })));
        }
        let e = turn(&store, "d", "r1").unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Full);
        assert!(!e.is_transient(), "a full store is not an outage");
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        assert_eq!(store.stats().total(), 3, "the refusal stored nothing");
        // Existing users keep working: a second run, renewals.
        assert!(matches!(
            turn(&store, "a", "r2"),
            Ok(Admit::Admitted { .. })
        ));
        assert!(
            store
                .renew_run("b", "r1", 1_000)
                .into_inner_ready()
                .is_some()
        );
        assert!(
            store
                .renew_run("c", "r1", 120_000)
                .into_inner_ready()
                .is_some()
        );
        // An operation that stores nothing needs no room.
        assert!(!store.release_run("d", "r1").into_inner_ready().released());
        assert_eq!(store.session_renew("s", "h", 10).into_inner_ready(), None);
        // A multi-key take with a new key changes nothing.
        let spec = BucketSpec::new(10, 1_000, 10).unwrap();
        let take = |key| BucketTake {
            key,
            spec,
            cost: 1,
            max_wait_ms: 0,
        };
        let e = store
            .take_many(&[take("k1"), take("k2")], None)
            .into_result_ready()
            .unwrap_err();
        assert!(e.is_full());
        assert_eq!(store.stats().keys, 0);
        // Live leases are never evicted: they expire (120 s) and make room.
        clock.advance(119_999);
        assert!(turn(&store, "d", "r1").is_err(), "all leases still live");
        clock.advance(2_000);
        assert!(matches!(
            turn(&store, "d", "r1"),
            Ok(Admit::Admitted { .. })
        ));
    }

    #[test]
    fn the_bound_counts_every_table_and_sweeps_follow_it() {
        let clock = FakeClock::new(1_000_000);
        let store = small(&clock, 2);
        assert!(matches!(
            store.session_acquire("s1", "h", 1_000).into_result_ready(),
            Ok(SessionAcquire::Acquired(_))
        ));
        let spec = BucketSpec::new(10, 1_000, 10).unwrap();
        let take = TakeRequest {
            bucket: BucketRef::Named("k"),
            spec,
            cost: 1,
        };
        assert!(store.take_one(take).into_result_ready().is_ok());
        assert!(
            store
                .session_acquire("s2", "h", 1_000)
                .into_result_ready()
                .unwrap_err()
                .is_full()
        );
        // The bucket is full again after 100 ms (+ 60 s grace), the session
        // 1 s + 10 min later; at the bound a write sweeps its shard.
        clock.advance(61_000);
        store.purge_expired();
        assert_eq!(store.stats().total(), 1);
        assert!(
            store
                .session_acquire("s2", "h", 1_000)
                .into_result_ready()
                .is_ok()
        );
    }

    #[test]
    fn a_grouped_write_needs_room_for_every_key_it_adds_and_only_those() {
        use crate::store::grouped::grouped_name;
        let clock = FakeClock::new(1_000_000);
        let store = small(&clock, 2);
        let (sess, log, other) = (
            grouped_name("g", "s"),
            grouped_name("g", "log"),
            grouped_name("g", "other"),
        );
        let write = |log, record| LogWrite { log, record };
        // Room for the session and one log: created.
        let create = SessionCreate {
            session: &sess,
            record: b"r0",
            logs: &[write(&log, Some(b"l")), write(&other, None)],
        };
        assert_eq!(
            store.session_create(create).into_inner_ready(),
            SessionCreated::Created { fence: 1 }
        );
        assert_eq!(store.stats().sessions, 2, "a refreshed log is not created");
        // At the bound, an append that only refreshes a missing log works…
        let append = |id, logs| SessionAppend {
            session: &sess,
            fence: 1,
            id: Some(id),
            record: b"e",
            logs,
        };
        let refresh = [write(&other, None)];
        assert_eq!(
            store
                .session_append(append("e1", &refresh))
                .into_inner_ready(),
            SessionAppended::Appended { index: 1 }
        );
        // …one that would add it is refused, and writes nothing at all.
        let add = [write(&log, Some(b"l2")), write(&other, Some(b"o"))];
        let e = store
            .session_append(append("e2", &add))
            .into_result_ready()
            .unwrap_err();
        assert!(e.is_full());
        let read = |name| store.read_records(name, 0, 10).into_inner_ready();
        assert_eq!(read(&sess).len(), 2);
        assert_eq!(read(&log), vec![b"l".to_vec()]);
        // A refused write needs no room: the repeated id is answered.
        assert_eq!(
            store.session_append(append("e1", &add)).into_inner_ready(),
            SessionAppended::Repeated
        );
    }

    trait ReadyExt: Future + Sized {
        fn into_result_ready(self) -> Self::Output {
            let mut fut = std::pin::pin!(self);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match fut.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(out) => out,
                std::task::Poll::Pending => panic!("MemoryStore futures are ready"),
            }
        }

        fn into_inner_ready(self) -> <Self::Output as Unwrap>::T
        where
            Self::Output: Unwrap,
        {
            let mut fut = std::pin::pin!(self);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match fut.as_mut().poll(&mut cx) {
                std::task::Poll::Ready(out) => out.unwrap_ok(),
                std::task::Poll::Pending => panic!("MemoryStore futures are ready"),
            }
        }
    }
    impl<F: Future> ReadyExt for F {}

    trait Unwrap {
        type T;
        fn unwrap_ok(self) -> Self::T;
    }
    impl<T> Unwrap for Result<T, StoreError> {
        type T = T;
        fn unwrap_ok(self) -> T {
            self.expect("MemoryStore never fails")
        }
    }
}
