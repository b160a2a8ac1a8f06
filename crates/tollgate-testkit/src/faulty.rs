//! A store decorator for fault and interleaving tests: it fails its
//! `k`th call (counting every call from 1) — the call never made (the store
//! unreachable), or, with `lost_reply`, made and its answer lost (a timeout
//! after the store acted) — or runs other work just before it (another
//! replica acting, a config reload landing mid-request). Every other call
//! goes to the wrapped store as it is.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tollgate_core::aimd::AimdParams;
use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::store::{
    AppendOutcome, BucketTake, Claim, ClaimRequest, CooldownCheck, FenceCheck, MultiTake,
    ProviderCleared, ReconcileRequest, Reconciled, Release, ReserveOutcome, ReserveRequest,
    SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete, SettleOutcome,
    SettleRequest, TakeOutcome, TakeRequest, TopUser, TurnOutcome, TurnRequest, UserState,
};
use tollgate_core::{BucketSpec, Store, StoreError, StoreErrorKind};

/// Work run just before the chosen call (another replica acting, a
/// reload).
pub type Hook = Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The decorator over store `S` (clones share the call count).
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    at: usize,
    lost_reply: bool,
    before: Option<Hook>,
    calls: Arc<AtomicUsize>,
    fired: Arc<AtomicBool>,
}

impl<S: Store> Faulty<S> {
    /// A store whose `at`th call fails: not made, or with `lost_reply`
    /// made and its answer lost.
    pub fn new(inner: S, at: usize, lost_reply: bool) -> Self {
        Self {
            inner,
            at,
            lost_reply,
            before: None,
            calls: Arc::default(),
            fired: Arc::default(),
        }
    }

    /// A store that fails nothing but runs `hook` just before its
    /// `at`th call, then makes the call.
    pub fn interleaved(inner: S, at: usize, hook: Hook) -> Self {
        Self {
            before: Some(hook),
            ..Self::new(inner, at, false)
        }
    }

    /// Whether the fault was injected (the store got `at` calls).
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    async fn call<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n != self.at {
            return op.await;
        }
        self.fired.store(true, Ordering::SeqCst);
        if let Some(hook) = &self.before {
            hook().await;
            return op.await;
        }
        if !self.lost_reply {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "injected: connection refused",
            ));
        }
        let _ = op.await;
        Err(StoreError::new(
            StoreErrorKind::Timeout,
            "injected: the answer was lost",
        ))
    }
}

impl<S: Store> Store for Faulty<S> {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        self.call(self.inner.admit_turn(req)).await
    }
    async fn release_run(&self, user: &str, inv: &str) -> Result<Release, StoreError> {
        self.call(self.inner.release_run(user, inv)).await
    }
    async fn renew_run(
        &self,
        user: &str,
        inv: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.call(self.inner.renew_run(user, inv, ttl_ms)).await
    }
    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        self.call(self.inner.reserve_tokens(req)).await
    }
    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        self.call(self.inner.settle(req)).await
    }
    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        self.call(self.inner.take_many(takes, cooldown)).await
    }
    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        self.call(self.inner.take_one(req)).await
    }
    async fn extend_cooldown(&self, key: &str, until_ms: u64) -> Result<u64, StoreError> {
        self.call(self.inner.extend_cooldown(key, until_ms)).await
    }
    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        self.call(self.inner.aimd(key, params, throttled)).await
    }
    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        self.call(self.inner.clear_provider(cooldown, aimd, params))
            .await
    }
    async fn claim_session(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.call(self.inner.claim_session(req)).await
    }
    async fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, StoreError> {
        self.call(self.inner.session_acquire(session, holder, ttl_ms))
            .await
    }
    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        self.call(self.inner.session_renew(session, holder, ttl_ms))
            .await
    }
    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        self.call(self.inner.session_release(session, holder)).await
    }
    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        self.call(self.inner.fence_check(session, fence)).await
    }
    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        self.call(self.inner.append_fenced(session, fence, record))
            .await
    }
    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.call(self.inner.read_records(session, from, limit))
            .await
    }
    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        self.call(self.inner.delete_records(session)).await
    }
    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        self.call(self.inner.user_state(user, turns, tokens)).await
    }
    async fn budget_spent(
        &self,
        user: &str,
        checks: &[tollgate_core::spend::BudgetCheck],
        adjust: Option<(
            tollgate_core::calendar::Period,
            tollgate_core::spend::BudgetAdjust,
        )>,
    ) -> Result<Vec<tollgate_core::spend::SpentNow>, StoreError> {
        self.call(self.inner.budget_spent(user, checks, adjust))
            .await
    }
    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        self.call(self.inner.top_users(n)).await
    }
    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        self.call(self.inner.reset_user(user)).await
    }
    async fn reconcile(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, StoreError> {
        self.call(self.inner.reconcile(req)).await
    }
    async fn session_create(&self, req: SessionCreate<'_>) -> Result<SessionCreated, StoreError> {
        self.call(self.inner.session_create(req)).await
    }
    async fn session_append(&self, req: SessionAppend<'_>) -> Result<SessionAppended, StoreError> {
        self.call(self.inner.session_append(req)).await
    }
    async fn session_delete(&self, req: SessionDelete<'_>) -> Result<u64, StoreError> {
        self.call(self.inner.session_delete(req)).await
    }
}
