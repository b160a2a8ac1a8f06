//! The failure policy of SPEC §6: when the shared store is unreachable,
//! fail closed (a typed `Unavailable` error) or fail open (decide from a
//! local in-memory store whose rates are scaled by `fallback_share`) until it
//! answers again.
//!
//! Session leases and fenced appends (the grouped session writes
//! included: [`Store::session_create`], [`Store::session_append`],
//! [`Store::session_delete`]) always fail closed: two holders must never
//! both believe they hold a session. So does clearing a provider
//! key's cooldown and AIMD state (an operator's write,
//! [`Store::clear_provider`]): cleared only in the local store, the fleet's
//! shared state would be untouched while the operator was told it was
//! cleared; an error tells them to try again. When the shared store has
//! cleared it, this replica's fallback state for the key is cleared too, so
//! a later outage does not bring the old cooldown back. Only transient faults (the store
//! unreachable or slow) trigger the policy; a permanent one (bad credentials,
//! a failing script) is passed through, never hidden by a fallback. So is a
//! full store ([`StoreErrorKind::Full`]: Redis at `maxmemory`, or the local
//! store at its entry bound under fail-open): the store answered, so it is
//! not marked down and nothing is decided locally instead. Session claims
//! ([`Store::claim_session`]) fail closed with the sessions they count.
//!
//! After a fault the store is not asked again for `probe_interval_ms`
//! (default 1 s): decisions meanwhile come from the policy at once instead of
//! each waiting out a timeout. The first operation after that probes it, and
//! recovery needs no restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tollgate_core::aimd::AimdParams;
use tollgate_core::lease::{SessionAcquire, SessionGrant, TurnParams};
use tollgate_core::store::{
    AppendOutcome, BucketTake, Claim, ClaimRequest, CooldownCheck, FenceCheck, MultiTake,
    ProviderCleared, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest, TakeOutcome,
    TakeRequest, TopUser, TurnOutcome, TurnRequest, UserState,
};
use tollgate_core::store::{
    SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
use tollgate_core::{BucketSpec, Clock, MemoryStore, Store, StoreError, StoreErrorKind};

/// What to do while the shared store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Refuse to decide: every operation fails with a transient
    /// `Unavailable` error (the sidecar answers 503).
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
    /// (it failed less than `probe_interval_ms` ago).
    pub cause: Option<&'a StoreError>,
}

type Hook = Arc<dyn Fn(FallbackEvent<'_>) + Send + Sync>;

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
    probe_interval_ms: u64,
    down_until: AtomicU64,
    down: AtomicBool,
    hook: Option<Hook>,
    on_full: Arc<std::sync::OnceLock<FullHook>>,
}

type FullHook = Arc<dyn Fn(&'static str) + Send + Sync>;

impl<S> std::fmt::Debug for Failover<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field("policy", &self.inner.policy)
            .field("down", &self.inner.down.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

enum Route {
    Primary,
    /// The store failed less than a probe interval ago: skip it.
    Skip,
}

impl<S: Store> Failover<S> {
    /// Applies `policy` to `primary`; `clock` times the probe interval and
    /// drives the local store.
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
                clock,
                policy,
                probe_interval_ms: 1_000,
                down_until: AtomicU64::new(0),
                down: AtomicBool::new(false),
                hook: None,
                on_full: Arc::default(),
            }),
        })
    }

    /// The same store, calling `hook` for every decision taken while the
    /// shared store was unreachable (the server counts them).
    pub fn with_hook(self, hook: impl Fn(FallbackEvent<'_>) + Send + Sync + 'static) -> Self {
        self.rebuild(|i| i.hook = Some(Arc::new(hook)))
    }

    /// The same store with another probe interval (ms).
    pub fn with_probe_interval_ms(self, ms: u64) -> Self {
        self.rebuild(|i| i.probe_interval_ms = ms)
    }

    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Self {
        let i = &self.inner;
        let mut inner = Inner {
            fallback: i.fallback.clone(),
            clock: i.clock.clone(),
            policy: i.policy,
            probe_interval_ms: i.probe_interval_ms,
            down_until: AtomicU64::new(i.down_until.load(Ordering::Relaxed)),
            down: AtomicBool::new(i.down.load(Ordering::Relaxed)),
            hook: i.hook.clone(),
            on_full: i.on_full.clone(),
        };
        f(&mut inner);
        Self {
            primary: self.primary,
            inner: Arc::new(inner),
        }
    }

    /// Calls `hook` with the operation's name each time an operation is
    /// refused because a store is full: the shared one
    /// ([`StoreErrorKind::Full`], Redis out of memory) or the local one
    /// deciding under fail-open ([`MemoryStore::on_full`]). Set once.
    pub fn on_full(&self, hook: impl Fn(&'static str) + Send + Sync + 'static) {
        let hook: FullHook = Arc::new(hook);
        let local = hook.clone();
        self.inner.fallback.on_full(move |op| local(op));
        let _ = self.inner.on_full.set(hook);
    }

    fn count_full(&self, op: &'static str, e: &StoreError) {
        if e.is_full()
            && let Some(hook) = self.inner.on_full.get()
        {
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

    /// Whether the shared store is considered down now.
    pub fn is_down(&self) -> bool {
        self.inner.down.load(Ordering::Relaxed)
    }

    fn route(&self) -> Route {
        let until = self.inner.down_until.load(Ordering::Relaxed);
        if until != 0 && self.inner.clock.now_ms() < until {
            Route::Skip
        } else {
            Route::Primary
        }
    }

    fn mark_down(&self, op: &'static str, e: &StoreError) {
        let until = self
            .inner
            .clock
            .now_ms()
            .saturating_add(self.inner.probe_interval_ms);
        self.inner.down_until.store(until, Ordering::Relaxed);
        if !self.inner.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(op, error = %e, policy = ?self.inner.policy, "shared store unreachable; applying the failure policy");
        }
    }

    fn mark_up(&self) {
        if self.inner.down.swap(false, Ordering::Relaxed) {
            self.inner.down_until.store(0, Ordering::Relaxed);
            tracing::warn!("shared store answers again; decisions come from it");
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
                format!("store unavailable ({op}): it failed moments ago"),
            )
        })
    }

    /// Runs `op` on the primary; on a transient fault (or while it is
    /// considered down) answers from `local` under fail-open, or fails
    /// closed.
    async fn decide<'a, T, P, L>(
        &'a self,
        name: &'static str,
        primary: P,
        local: impl FnOnce(&'a MemoryStore, f64) -> L,
    ) -> Result<T, StoreError>
    where
        P: Future<Output = Result<T, StoreError>>,
        L: Future<Output = Result<T, StoreError>>,
    {
        let cause = match self.route() {
            Route::Primary => match primary.await {
                Ok(v) => {
                    self.mark_up();
                    return Ok(v);
                }
                Err(e) if e.is_transient() => {
                    self.mark_down(name, &e);
                    Some(e)
                }
                Err(e) => {
                    self.count_full(name, &e);
                    return Err(e);
                }
            },
            Route::Skip => None,
        };
        match self.share() {
            Some(share) => {
                self.event(name, true, cause.as_ref());
                local(&self.inner.fallback, share).await
            }
            None => {
                self.event(name, false, cause.as_ref());
                Err(Self::closed(name, cause))
            }
        }
    }

    /// Runs an operation that always fails closed (sessions).
    async fn closed_only<T>(
        &self,
        name: &'static str,
        primary: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match primary.await {
            Ok(v) => {
                self.mark_up();
                Ok(v)
            }
            Err(e) => {
                if e.is_transient() {
                    self.mark_down(name, &e);
                    self.event(name, false, Some(&e));
                }
                self.count_full(name, &e);
                Err(e)
            }
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

impl<S: Store> Store for Failover<S> {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        self.decide("admit_turn", self.primary.admit_turn(req), |m, share| {
            m.admit_turn(TurnRequest {
                params: scale_turn(&req.params, share),
                ..req
            })
        })
        .await
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<bool, StoreError> {
        self.decide(
            "release_run",
            self.primary.release_run(user, invocation_id),
            |m, _| m.release_run(user, invocation_id),
        )
        .await
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let clock = self.inner.clock.clone();
        self.decide(
            "renew_run",
            self.primary.renew_run(user, invocation_id, ttl_ms),
            |m, _| async move {
                // A lease taken in the shared store is unknown here: do not
                // end the run over an outage; answer it renewed.
                let local = m.renew_run(user, invocation_id, ttl_ms).await?;
                Ok(local.or(Some(clock.now_ms().saturating_add(ttl_ms))))
            },
        )
        .await
    }

    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        self.decide(
            "reserve_tokens",
            self.primary.reserve_tokens(req),
            |m, share| {
                m.reserve_tokens(ReserveRequest {
                    tokens: scale_spec(&req.tokens, share),
                    ..req
                })
            },
        )
        .await
    }

    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        self.decide("settle", self.primary.settle(req), |m, share| {
            m.settle(SettleRequest {
                tokens: scale_spec(&req.tokens, share),
                ..req
            })
        })
        .await
    }

    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        self.decide(
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
        self.decide("take_one", self.primary.take_one(req), |m, share| {
            m.take_one(TakeRequest {
                spec: scale_spec(&req.spec, share),
                ..req
            })
        })
        .await
    }

    async fn extend_cooldown(&self, key: &str, until_ms: u64) -> Result<u64, StoreError> {
        self.decide(
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
        self.decide("aimd", self.primary.aimd(key, params, throttled), |m, _| {
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
        self.decide(
            "user_state",
            self.primary.user_state(user, turns, tokens),
            |m, share| m.user_state(user, scale_spec(&turns, share), scale_spec(&tokens, share)),
        )
        .await
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        self.decide("top_users", self.primary.top_users(n), |m, _| {
            m.top_users(n)
        })
        .await
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        self.decide("reset_user", self.primary.reset_user(user), |m, _| {
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
