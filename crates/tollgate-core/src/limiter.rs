//! The [`Limiter`]: plans resolved per user, decisions from the store.

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::bucket::{BucketSpec, MAX_SCALED, Take};
use crate::budget::{BudgetAmount, OnExhausted, OnOutage};
use crate::clock::Clock;
use crate::decision::{Decision, Denial, Limit, Waited};
use crate::error::{LimiterError, StoreError};
use crate::id::{Id, IntoId};
use crate::lease::{Admit, TurnParams};
use crate::money::TokenSplit;
use crate::plan::{Plan, PlanBook};
pub use crate::refusals::DEFAULT_REFUSAL_CACHE_ENTRIES;
use crate::refusals::{Bucket, Refusals};
use crate::spend::{BudgetAdjust, BudgetCheck, BudgetRequest, BudgetUnit, Crossed, SpentNow};
use crate::store::{
    BucketRef, Claim, ClaimRequest, Release, ReservationId, ReserveOutcome, ReserveRequest,
    SettleOutcome, SettleRequest, Store, TakeOutcome, TakeRequest, TurnRequest,
};

/// A granted run lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLease {
    /// Lease expiry, ms. A turn admitted only by shadow mode holds no lease;
    /// it gets `now + lease_ttl` here, and its renewals succeed the same way,
    /// so shadow mode never shows to the client.
    pub expires_at_ms: u64,
    /// The invocation already held a live lease: nothing was charged.
    pub refreshed: bool,
}

impl Waited for RunLease {
    fn wait_ms(&self) -> u64 {
        0
    }
}

/// A granted token reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Names it for settle and refund.
    pub id: ReservationId,
    /// How long the caller must still wait before the model call, ms.
    pub wait_ms: u64,
    /// How long the limiter already waited on the caller's behalf, ms.
    pub waited_ms: u64,
}

impl Waited for Reservation {
    fn wait_ms(&self) -> u64 {
        self.wait_ms + self.waited_ms
    }
}

/// What a single take from a bucket took, without a lease or a wait: turns
/// from a user's turn bucket ([`Limiter::take_turns`]) or tokens from a
/// named bucket ([`Limiter::take_bucket`]), and what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// How many were taken: the cost, or 0 when only shadow mode let the
    /// request through.
    pub taken: u64,
    /// Whole tokens (turns) left in the bucket now.
    pub remaining: u64,
    /// How long until the bucket is full again, ms.
    pub full_in_ms: u64,
}

impl Waited for Taken {
    fn wait_ms(&self) -> u64 {
        0
    }
}

/// A session counted among its user's live sessions
/// ([`Limiter::claim_session`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionsHeld {
    /// The user's live sessions now (claims, an over-estimate of records).
    pub sessions: u32,
    /// `false`: only an existing claim could be extended and there was none
    /// (the session does not exist, or predates the bound).
    pub claimed: bool,
}

impl Waited for SessionsHeld {
    fn wait_ms(&self) -> u64 {
        0
    }
}

/// The result of a settle or refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The user's token level after it, whole tokens (negative: debt); 0
    /// while `pending` (not known yet).
    pub balance: i64,
    /// `false`: the reservation was already closed and nothing changed (or
    /// the close is pending).
    pub applied: bool,
    /// `true`: accepted while the store of record is unreachable; it is
    /// applied when the store answers again (SPEC §6).
    pub pending: bool,
}

/// One token reservation to make ([`Limiter::reserve`]).
#[derive(Debug, Clone, Copy)]
pub struct Reserve<'a> {
    /// The run making the model call.
    pub invocation_id: Id<'a>,
    /// Estimated tokens.
    pub estimate: u64,
    /// The caller's id for this request, so a retry never charges twice
    /// ([`ReserveRequest::request_id`]).
    pub request_id: Option<Id<'a>>,
    /// Wait out the grant's wait here before answering
    /// ([`Limiter::reserve_tokens_and_wait`]).
    pub wait: bool,
    /// The model called, which prices the call for cost budgets (its
    /// `[prices]` entry, else the plan's `default_price`). `None`: the
    /// plan's default price.
    pub model: Option<ModelRef<'a>>,
    /// The estimate split into input, output and cached input tokens, each
    /// priced at its own price for cost budgets (token budgets count
    /// `estimate`). `None`: all of it at the higher of the input and output
    /// prices.
    pub split: Option<TokenSplit>,
}

/// One of a user's budgets now ([`Limiter::budgets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetStatus {
    /// The window length.
    pub period: crate::calendar::Period,
    /// What it counts.
    pub unit: BudgetUnit,
    /// The most the user may spend per window (tokens or micro-units), as
    /// the plan says.
    pub limit: u64,
    /// Top-ups granted for the current window (its limit is `limit +
    /// granted`).
    pub granted: u64,
    /// Spent in the current window.
    pub spent: u64,
    /// When the current window ends, ms since the Unix epoch.
    pub resets_at_ms: u64,
}

/// A user's spend in a budget window reached an alert threshold (`[budgets]
/// alert_percent`) for the first time in that window: what
/// [`Limiter::on_budget_alert`]'s observer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetAlert<'a> {
    /// The user.
    pub user: &'a str,
    /// Their plan's name.
    pub plan: &'a str,
    /// The budget's window length.
    pub period: crate::calendar::Period,
    /// The threshold reached, percent of the window's limit.
    pub percent: u8,
}

type AlertObserver = Box<dyn Fn(&BudgetAlert<'_>) + Send + Sync>;

/// A model a call goes to: the provider and the model, as `[prices]` keys
/// them (`"provider:model"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelRef<'a> {
    /// The provider (`"openai"`).
    pub provider: Id<'a>,
    /// The model (`"gpt-4o"`).
    pub model: Id<'a>,
}

impl<'a> ModelRef<'a> {
    /// The model a `"provider:model"` id names; `None`: it names none (no
    /// colon, or an empty half), so the plan's `default_price` applies.
    pub fn parse(model: Id<'a>) -> Option<Self> {
        model
            .split_model()
            .map(|(provider, model)| Self { provider, model })
    }
}

/// Admission decisions for users, on a [`Store`] and a [`Clock`].
///
/// Plans can be swapped atomically at any time with
/// [`set_plans`](Self::set_plans); a decision sees either the old or the new
/// plans, never a mix.
pub struct Limiter<S> {
    store: S,
    clock: Arc<dyn Clock>,
    plans: ArcSwap<PlanBook>,
    reclaimed: AtomicU64,
    alerts: std::sync::OnceLock<AlertObserver>,
    refusals: Refusals,
}

impl<S> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

/// `v` as an id: checked by the one id rule ([`crate::id`]) unless it is
/// one already, naming `field` in the error.
fn id<'a>(field: &'static str, v: impl IntoId<'a>) -> Result<Id<'a>, LimiterError> {
    v.into_id()
        .map_err(|e| LimiterError::invalid(field, e.to_string()))
}

fn check_estimate(estimate: u64) -> Result<(), LimiterError> {
    if estimate == 0 {
        return Err(LimiterError::invalid(
            "estimate",
            "must be at least 1: a reservation holds store state, and one of 0 tokens would hold it for free",
        ));
    }
    Ok(())
}

impl<S: Store> Limiter<S> {
    /// A limiter deciding with `plans` on `store`, waiting on `clock` (which
    /// should be the clock the store reads).
    pub fn new(store: S, clock: impl Clock, plans: PlanBook) -> Self {
        Self {
            store,
            clock: Arc::new(clock),
            plans: ArcSwap::from_pointee(plans),
            reclaimed: AtomicU64::new(0),
            alerts: std::sync::OnceLock::new(),
            refusals: Refusals::new(DEFAULT_REFUSAL_CACHE_ENTRIES),
        }
    }

    /// Keeps at most `entries` refusals to answer locally (SPEC §3; 0:
    /// none, every decision asks the store). The default is
    /// [`DEFAULT_REFUSAL_CACHE_ENTRIES`].
    #[must_use]
    pub fn with_refusal_cache(mut self, entries: usize) -> Self {
        self.refusals = Refusals::new(entries);
        self
    }

    /// Refusals this limiter answered without asking the store, because
    /// the store had just refused the same request until a time still
    /// ahead (SPEC §3; a metric).
    pub fn refusals_answered_locally(&self) -> u64 {
        self.refusals.answered()
    }

    /// Drops the refusals this limiter keeps for `user`'s turn bucket, so
    /// its next admission asks the store. Call it after resetting the
    /// user's buckets in the store ([`Store::reset_user`]), which knows
    /// nothing of this table (the sidecar's admin reset does).
    pub fn forget_refusals(&self, user: &str) {
        self.refusals.forget(Bucket::Turns, user);
    }

    /// Calls `observer` for every budget alert threshold a user's spend
    /// reaches (once per window: the store reports the charge that first
    /// brings a window's peak spend to it). Set once; a later call is
    /// ignored and answers `false`.
    pub fn on_budget_alert(
        &self,
        observer: impl Fn(&BudgetAlert<'_>) + Send + Sync + 'static,
    ) -> bool {
        self.alerts.set(Box::new(observer)).is_ok()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Run leases that expired without a release and were reclaimed by this
    /// limiter's admissions so far (a metric: leaked slots).
    pub fn reclaimed_leases(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// The plans in force.
    pub fn plans(&self) -> Arc<PlanBook> {
        self.plans.load_full()
    }

    /// Swaps in new plans atomically. Lowered capacities apply at the next
    /// refill (levels are capped there). A request already holding a
    /// [`ForUser`] finishes on the plans it took.
    ///
    /// The refusals kept to answer locally are dropped (SPEC §3).
    pub fn set_plans(&self, plans: PlanBook) {
        self.plans.store(Arc::new(plans));
        self.refusals.clear();
    }

    /// `user` with the plans in force now: the one snapshot a request
    /// decides with ([`ForUser`]). The plan book is read once, here.
    ///
    /// # Errors
    ///
    /// An invalid user id (field `user`); [`LimiterError::UnknownUser`]
    /// when the user has no plan and there is no default.
    pub fn user<'u>(&self, user: impl IntoId<'u>) -> Result<ForUser<'_, 'u, S>, LimiterError> {
        let user = id("user", user)?;
        // Before the plans: a refusal decided on plans a reload replaced
        // is not kept (the reload cleared the table after storing them).
        let epoch = self.refusals.epoch();
        let book = self.plans.load_full();
        let plan =
            book.resolve(user.as_str())
                .cloned()
                .ok_or_else(|| LimiterError::UnknownUser {
                    user: user.as_str().to_owned(),
                })?;
        Ok(ForUser {
            limiter: self,
            user,
            book,
            plan,
            epoch,
        })
    }

    /// The effective plan of `user` now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user).
    pub fn plan_for<'u>(&self, user: impl IntoId<'u>) -> Result<Arc<Plan>, LimiterError> {
        Ok(self.user(user)?.plan)
    }

    /// [`ForUser::admit_turn`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::admit_turn`].
    pub async fn admit_turn<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
    ) -> Result<Decision<RunLease>, LimiterError> {
        let invocation_id = id("invocation_id", invocation_id)?;
        self.user(user)?.admit_turn(invocation_id).await
    }

    /// [`ForUser::take_turns`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user), or a store fault.
    pub async fn take_turns<'u>(
        &self,
        user: impl IntoId<'u>,
        cost: u64,
    ) -> Result<Decision<Taken>, LimiterError> {
        self.user(user)?.take_turns(cost).await
    }

    /// Takes `cost` tokens from the named bucket `key` of rate `spec` (a
    /// bucket of its own, in the key space of `take_many`, not a user's:
    /// an Envoy rate-limit descriptor's), in one store step
    /// ([`Store::take_one`]), and answers the decision ([`Limit::Bucket`]).
    ///
    /// As [`ForUser::take_turns`]: a refusal takes nothing and carries the
    /// exact retry hint, a cost larger than the burst is
    /// [`Denial::ExceedsCapacity`], a cost of 0 takes nothing and reports
    /// the bucket. There is no plan, so no shadow mode: a caller with a
    /// shadow setting of its own applies it to the answer. A refusal is
    /// kept and the same take (key, spec, cost) answered here until its
    /// hint ends, without the store (SPEC §3).
    ///
    /// # Errors
    ///
    /// A store fault.
    ///
    /// [`Denial::ExceedsCapacity`]: crate::Denial::ExceedsCapacity
    pub async fn take_bucket(
        &self,
        key: &str,
        spec: BucketSpec,
        cost: u64,
    ) -> Result<Decision<Taken>, StoreError> {
        let epoch = self.refusals.epoch();
        if let Some(d) = self
            .refusals
            .check(Bucket::Named, &(key, spec), cost, self.clock.now_ms())
        {
            self.refusals.count_answered();
            return Ok(Decision::Denied(d));
        }
        let fallback = self.store.fallback_decisions();
        let out = self
            .store
            .take_one(TakeRequest {
                bucket: BucketRef::Named(key),
                spec,
                cost,
            })
            .await?;
        Ok(match taken(&out, cost, Limit::Bucket, &spec) {
            Ok(grant) => Decision::Allowed {
                grant,
                shadow_denied: None,
            },
            Err(denial) => {
                self.keep_refusal(Bucket::Named, &(key, spec), cost, &denial, epoch, fallback);
                Decision::Denied(denial)
            }
        })
    }

    /// Keeps a rate refusal (a `Limited` denial of the bucket's own limit)
    /// until its hint ends on this limiter's clock: read after the store
    /// answered, so never before the store's end. Not one a fallback
    /// decided (the store's count of them moved since `fallback`).
    fn keep_refusal<K: std::hash::Hash + ?Sized>(
        &self,
        bucket: Bucket,
        key: &K,
        cost: u64,
        d: &Denial,
        epoch: u64,
        fallback: u64,
    ) {
        if self.store.fallback_decisions() != fallback {
            return;
        }
        if let Denial::Limited {
            limit,
            retry_after_ms,
        } = *d
            && matches!(
                (bucket, limit),
                (Bucket::Turns, Limit::TurnRate) | (Bucket::Named, Limit::Bucket)
            )
        {
            let until = self.clock.now_ms().saturating_add(retry_after_ms);
            self.refusals.refused(bucket, key, cost, until, epoch);
        }
    }

    /// Releases the run lease of `invocation_id`. [`Release::NotHeld`]: it
    /// held none (a denied turn, a second release); not an error. No plan
    /// is needed.
    ///
    /// # Errors
    ///
    /// An invalid id, or a store fault.
    pub async fn release_run<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
    ) -> Result<Release, LimiterError> {
        let user = id("user", user)?;
        let invocation_id = id("invocation_id", invocation_id)?;
        Ok(self
            .store
            .release_run(user.as_str(), invocation_id.as_str())
            .await?)
    }

    /// [`ForUser::renew_run`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user), an invalid id, or a store fault.
    pub async fn renew_run<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
    ) -> Result<Option<u64>, LimiterError> {
        let invocation_id = id("invocation_id", invocation_id)?;
        self.user(user)?.renew_run(invocation_id).await
    }

    /// [`ForUser::claim_session`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user), an invalid id, or a store fault.
    pub async fn claim_session<'u>(
        &self,
        user: impl IntoId<'u>,
        session_id: impl IntoId<'u>,
        lease_ttl_ms: u64,
        create: bool,
    ) -> Result<Decision<SessionsHeld>, LimiterError> {
        let session_id = id("session_id", session_id)?;
        self.user(user)?
            .claim_session(session_id, lease_ttl_ms, create)
            .await
    }

    /// Reserves `estimate` tokens for a model call of `invocation_id` with
    /// `user`'s plan now, decide-only ([`ForUser::reserve`] without a
    /// request id, a model or a wait).
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::reserve`].
    pub async fn reserve_tokens<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
        estimate: u64,
    ) -> Result<Decision<Reservation>, LimiterError> {
        let call = Reserve {
            invocation_id: id("invocation_id", invocation_id)?,
            estimate,
            request_id: None,
            wait: false,
            model: None,
            split: None,
        };
        self.user(user)?.reserve_with(call).await
    }

    /// [`ForUser::reserve`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::reserve`].
    pub async fn reserve<'u>(
        &self,
        user: impl IntoId<'u>,
        call: Reserve<'_>,
    ) -> Result<Decision<Reservation>, LimiterError>
    where
        S: Clone,
    {
        self.user(user)?.reserve(call).await
    }

    /// Like [`reserve_tokens`](Self::reserve_tokens), but waits out the wait
    /// on the clock (no thread blocked) before answering, so the grant's
    /// `wait_ms` is 0 and `waited_ms` says how long it took.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped while waiting, the reservation is refunded
    /// (on a spawned task: a tokio runtime must be running).
    ///
    /// # Errors
    ///
    /// As [`reserve_tokens`](Self::reserve_tokens).
    pub async fn reserve_tokens_and_wait<'u>(
        &self,
        user: impl IntoId<'u>,
        invocation_id: impl IntoId<'u>,
        estimate: u64,
    ) -> Result<Decision<Reservation>, LimiterError>
    where
        S: Clone,
    {
        let call = Reserve {
            invocation_id: id("invocation_id", invocation_id)?,
            estimate,
            request_id: None,
            wait: true,
            model: None,
            split: None,
        };
        let user = self.user(user)?;
        // `reserve` with `wait`, without its layer: a waiter's memory is
        // this future's size for as long as it waits.
        user.reserve_and_wait(call).await
    }

    /// [`ForUser::settle`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::settle`].
    pub async fn settle<'u>(
        &self,
        user: impl IntoId<'u>,
        reservation: &ReservationId,
        actual: u64,
    ) -> Result<Settled, LimiterError> {
        self.user(user)?
            .close(reservation, Some(actual), None)
            .await
    }

    /// [`ForUser::settle_split`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`settle`](Self::settle).
    pub async fn settle_split<'u>(
        &self,
        user: impl IntoId<'u>,
        reservation: &ReservationId,
        actual: u64,
        split: Option<TokenSplit>,
    ) -> Result<Settled, LimiterError> {
        self.user(user)?
            .close(reservation, Some(actual), split)
            .await
    }

    /// [`ForUser::refund`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`settle`](Self::settle).
    pub async fn refund<'u>(
        &self,
        user: impl IntoId<'u>,
        reservation: &ReservationId,
    ) -> Result<Settled, LimiterError> {
        self.user(user)?.close(reservation, None, None).await
    }

    /// [`ForUser::budgets`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::budgets`].
    pub async fn budgets<'u>(
        &self,
        user: impl IntoId<'u>,
    ) -> Result<Vec<BudgetStatus>, LimiterError> {
        self.user(user)?.budgets().await
    }

    /// [`ForUser::adjust_budget`] with `user`'s plan now.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user) and [`ForUser::adjust_budget`].
    pub async fn adjust_budget<'u>(
        &self,
        user: impl IntoId<'u>,
        period: crate::calendar::Period,
        adjust: BudgetAdjust<'_>,
    ) -> Result<Vec<BudgetStatus>, LimiterError> {
        self.user(user)?.adjust_budget(period, adjust).await
    }
}

/// One request's view of one user: the user's id and the plans in force
/// when it was taken ([`Limiter::user`]) — the user's plan, and the prices,
/// the budgets' time zone and the alert thresholds of the same plan book.
///
/// Every decision made through it uses that one snapshot, so a reload
/// that lands while a request is under way changes nothing of it: the
/// decision, the charge, and what the caller answers and counts (from
/// [`plan`](Self::plan)) all follow one config. Take one per request; one
/// kept for long decides with old plans.
pub struct ForUser<'l, 'u, S> {
    limiter: &'l Limiter<S>,
    user: Id<'u>,
    book: Arc<PlanBook>,
    plan: Arc<Plan>,
    /// The refusal table's epoch when the plans were read.
    epoch: u64,
}

impl<S> std::fmt::Debug for ForUser<'_, '_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForUser")
            .field("user", &self.user)
            .field("plan", &self.plan.name)
            .finish_non_exhaustive()
    }
}

impl<'l, 'u, S: Store> ForUser<'l, 'u, S> {
    /// The user.
    pub fn id(&self) -> Id<'u> {
        self.user
    }

    /// The user's plan in this snapshot.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The plan book of this snapshot (prices, budgets' zone, alerts).
    pub fn book(&self) -> &PlanBook {
        &self.book
    }

    /// The limiter.
    pub fn limiter(&self) -> &'l Limiter<S> {
        self.limiter
    }

    fn report(&self, crossed: Crossed) {
        if crossed.is_empty() {
            return;
        }
        if let Some(observe) = self.limiter.alerts.get() {
            for (period, percent) in crossed.iter(self.book.budget_alerts()) {
                observe(&BudgetAlert {
                    user: self.user.as_str(),
                    plan: &self.plan.name,
                    period,
                    percent,
                });
            }
        }
    }

    /// Keeps the store's rate refusal `d` of `cost` from `bucket` `key`
    /// to answer locally until its hint ends (SPEC §3).
    fn keep_refusal(&self, bucket: Bucket, key: &str, cost: u64, d: &Denial, fallback: u64) {
        self.limiter
            .keep_refusal(bucket, key, cost, d, self.epoch, fallback);
    }

    /// The refusal of a turn of run `invocation_id` this limiter keeps
    /// (SPEC §3): the store refused the user's turn until a time still
    /// ahead, and this replica did not admit the run (a live holder's
    /// retry is admitted with an empty bucket). Never in shadow mode.
    /// Counted when found.
    pub(crate) fn kept_turn_refusal(&self, invocation_id: Id<'_>) -> Option<Denial> {
        let (user, refusals) = (self.user.as_str(), &self.limiter.refusals);
        if self.plan.shadow {
            return None;
        }
        let d = refusals.check(Bucket::Turns, user, 1, self.limiter.clock.now_ms())?;
        if refusals.was_admitted(user, invocation_id.as_str()) {
            return None;
        }
        refusals.count_answered();
        Some(d)
    }

    /// Admits a turn (SPEC §3): turn bucket and run lease, all or nothing.
    /// Retrying with the same live `invocation_id` refreshes its lease and
    /// charges nothing. A `turn_rate` refusal is kept and the user's next
    /// turns are refused here until its hint ends, without the store (but
    /// for a run this limiter admitted; SPEC §3).
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn admit_turn(
        &self,
        invocation_id: Id<'_>,
    ) -> Result<Decision<RunLease>, LimiterError> {
        let plan = &*self.plan;
        let (user, refusals) = (self.user.as_str(), &self.limiter.refusals);
        if let Some(d) = self.kept_turn_refusal(invocation_id) {
            return Ok(Decision::Denied(d));
        }
        let checks = match &plan.budgets {
            Some(b) if b.on_exhausted == OnExhausted::DenyTurns => self.budget_checks(),
            _ => Vec::new(),
        };
        let fallback = self.limiter.store.fallback_decisions();
        let out = self
            .limiter
            .store
            .admit_turn(TurnRequest {
                user: self.user.as_str(),
                invocation_id: invocation_id.as_str(),
                params: TurnParams {
                    turns: plan.turns,
                    max_runs: plan.concurrent_runs,
                    lease_ttl_ms: plan.lease_ttl_ms,
                    concurrency_retry_ms: plan.concurrency_retry_ms,
                },
                budgets: &checks,
            })
            .await?;
        if out.reclaimed > 0 {
            self.limiter
                .reclaimed
                .fetch_add(u64::from(out.reclaimed), Ordering::Relaxed);
        }
        match out.admit {
            Admit::Admitted { .. } => refusals.admitted(user, invocation_id.as_str()),
            Admit::Denied(d) if !plan.shadow => {
                self.keep_refusal(Bucket::Turns, user, 1, &d, fallback);
            }
            Admit::Denied(_) => {}
        }
        Ok(match out.admit {
            Admit::Admitted {
                lease_expires_at,
                refreshed,
            } => Decision::Allowed {
                grant: RunLease {
                    expires_at_ms: lease_expires_at,
                    refreshed,
                },
                shadow_denied: None,
            },
            Admit::Denied(d) if plan.shadow => Decision::Allowed {
                grant: RunLease {
                    expires_at_ms: self
                        .limiter
                        .clock
                        .now_ms()
                        .saturating_add(plan.lease_ttl_ms),
                    refreshed: false,
                },
                shadow_denied: Some(d),
            },
            Admit::Denied(d) => Decision::Denied(d),
        })
    }

    /// Takes `cost` turns from the user's turn bucket now, or nothing (no
    /// waiting, no run lease): the same bucket
    /// [`admit_turn`](Self::admit_turn) takes from, so both draw on one
    /// budget. For callers that count turns themselves, such as Envoy's
    /// rate-limit service (`hits_addend`).
    ///
    /// A refusal takes nothing, carries the exact retry hint and is kept:
    /// a take of the same cost is refused here until it ends (SPEC §3); a
    /// cost larger than the burst is [`Denial::ExceedsCapacity`]. In shadow mode
    /// the store applies the same enforcing transition and only the answer
    /// is rewritten to allowed (`taken: 0`, the denial kept in
    /// `shadow_denied`). A cost of 0 takes nothing and reports the bucket.
    ///
    /// # Errors
    ///
    /// A store fault.
    ///
    /// [`Denial::ExceedsCapacity`]: crate::Denial::ExceedsCapacity
    pub async fn take_turns(&self, cost: u64) -> Result<Decision<Taken>, LimiterError> {
        let plan = &*self.plan;
        let user = self.user.as_str();
        if !plan.shadow
            && let Some(d) =
                self.limiter
                    .refusals
                    .check(Bucket::Turns, user, cost, self.limiter.clock.now_ms())
        {
            self.limiter.refusals.count_answered();
            return Ok(Decision::Denied(d));
        }
        let fallback = self.limiter.store.fallback_decisions();
        let out = self
            .limiter
            .store
            .take_one(TakeRequest {
                bucket: BucketRef::Turns(self.user.as_str()),
                spec: plan.turns,
                cost,
            })
            .await?;
        let decided = taken(&out, cost, Limit::TurnRate, &plan.turns);
        if let Err(d) = &decided
            && !plan.shadow
        {
            self.keep_refusal(Bucket::Turns, user, cost, d, fallback);
        }
        Ok(match decided {
            Ok(grant) => Decision::Allowed {
                grant,
                shadow_denied: None,
            },
            Err(denial) if plan.shadow => Decision::Allowed {
                grant: Taken {
                    taken: 0,
                    remaining: out.remaining,
                    full_in_ms: out.full_in_ms,
                },
                shadow_denied: Some(denial),
            },
            Err(denial) => Decision::Denied(denial),
        })
    }

    /// Renews a live run lease by the plan's TTL. `None`: the lease is lost.
    /// In shadow mode a lost lease is answered renewed (`now + ttl`): the
    /// turn may have been admitted by shadow mode without one.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn renew_run(&self, invocation_id: Id<'_>) -> Result<Option<u64>, LimiterError> {
        let plan = &*self.plan;
        let renewed = self
            .limiter
            .store
            .renew_run(
                self.user.as_str(),
                invocation_id.as_str(),
                plan.lease_ttl_ms,
            )
            .await?;
        Ok(match renewed {
            None if plan.shadow => Some(
                self.limiter
                    .clock
                    .now_ms()
                    .saturating_add(plan.lease_ttl_ms),
            ),
            other => other,
        })
    }

    /// Counts session `session_id` against the plan's `max_sessions` before
    /// a session lease operation with `lease_ttl_ms` (SPEC §4): `create` for
    /// an acquire (a new session past the cap is denied,
    /// [`Limit::Sessions`], with the time until the earliest claim ends),
    /// not for a renew or release (which only extend a claim that exists).
    /// The bound protects the store's memory, so shadow mode does not
    /// waive it.
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn claim_session(
        &self,
        session_id: Id<'_>,
        lease_ttl_ms: u64,
        create: bool,
    ) -> Result<Decision<SessionsHeld>, LimiterError> {
        let claim = self
            .limiter
            .store
            .claim_session(ClaimRequest {
                user: self.user.as_str(),
                session: session_id.as_str(),
                lease_ttl_ms,
                max_sessions: self.plan.max_sessions,
                create,
            })
            .await?;
        Ok(match claim {
            Claim::Claimed { sessions } => Decision::Allowed {
                grant: SessionsHeld {
                    sessions,
                    claimed: true,
                },
                shadow_denied: None,
            },
            Claim::Unclaimed { sessions } => Decision::Allowed {
                grant: SessionsHeld {
                    sessions,
                    claimed: false,
                },
                shadow_denied: None,
            },
            Claim::Full { retry_after_ms } => Decision::Denied(Denial::Limited {
                limit: Limit::Sessions,
                retry_after_ms,
            }),
        })
    }

    /// Reserves tokens for a model call as `call` says (SPEC §2): with a
    /// request id (a retry answers the first grant instead of charging
    /// again), priced by its model for cost budgets, and waiting or not.
    /// Decide-only without `wait`: the grant says how long to wait before
    /// calling. The run's model calls are counted against
    /// `max_llm_calls`.
    ///
    /// An `estimate` of 0 is invalid (field `estimate`): a reservation
    /// holds a run record and an open reservation in the store, and one
    /// that charges nothing would hold them for free (SPEC §2).
    ///
    /// # Cancel safety
    ///
    /// With `wait`, if the future is dropped while waiting, the reservation
    /// is refunded (on a spawned task: a tokio runtime must be running).
    ///
    /// # Errors
    ///
    /// An estimate of 0; a model with no price under a cost budget (field
    /// `model`); a `request_id` a fallback answered during an outage that
    /// was reconciled since (field `request_id`: use a new one); a store
    /// fault.
    pub async fn reserve(&self, call: Reserve<'_>) -> Result<Decision<Reservation>, LimiterError>
    where
        S: Clone,
    {
        if call.wait {
            return self.reserve_and_wait(call).await;
        }
        self.reserve_with(call).await
    }

    async fn reserve_with(&self, call: Reserve<'_>) -> Result<Decision<Reservation>, LimiterError> {
        check_estimate(call.estimate)?;
        let plan = &*self.plan;
        let checks = self.budget_checks();
        let budget = match &plan.budgets {
            Some(b) if !checks.is_empty() => {
                let price = match call.model {
                    Some(m) => b
                        .price(self.book.prices(), m.provider.as_str(), m.model.as_str())
                        .copied(),
                    None => b.default_price,
                };
                if price.is_none() && checks.iter().any(|c| c.unit == BudgetUnit::Cost) {
                    let what = call.model.map_or_else(
                        || "is needed: the plan has a cost budget and no default_price".to_owned(),
                        |m| {
                            format!(
                                "{}:{} has no price in [prices] and the plan has no \
                                 default_price, so the call cannot be charged to its cost budget",
                                m.provider, m.model
                            )
                        },
                    );
                    return Err(LimiterError::invalid("model", what));
                }
                Some(BudgetRequest {
                    checks: &checks,
                    price,
                    split: call.split,
                    alerts: self.book.budget_alerts(),
                })
            }
            _ => None,
        };
        let out = self
            .limiter
            .store
            .reserve_tokens(ReserveRequest {
                user: self.user.as_str(),
                invocation_id: call.invocation_id.as_str(),
                tokens: plan.tokens,
                estimate: call.estimate,
                max_wait_ms: plan.max_wait_ms,
                max_llm_calls: plan.max_llm_calls,
                shadow: plan.shadow,
                request_id: call.request_id.map(Id::as_str),
                budget,
            })
            .await?;
        Ok(match out {
            ReserveOutcome::Granted {
                reservation,
                wait_ms,
                crossed,
            } => {
                self.report(crossed);
                Decision::Allowed {
                    grant: Reservation {
                        id: reservation,
                        wait_ms,
                        waited_ms: 0,
                    },
                    shadow_denied: None,
                }
            }
            ReserveOutcome::Denied {
                denial,
                shadow_reservation: Some(id),
            } => Decision::Allowed {
                grant: Reservation {
                    id,
                    wait_ms: 0,
                    waited_ms: 0,
                },
                shadow_denied: Some(denial),
            },
            ReserveOutcome::Denied { denial, .. } => Decision::Denied(denial),
            ReserveOutcome::Superseded => {
                return Err(LimiterError::invalid(
                    "request_id",
                    "was answered by a replica's fallback during a store outage and has been \
                     reconciled since: use a new request id",
                ));
            }
        })
    }

    /// Reserves, then waits out the grant's wait (refunding if dropped
    /// meanwhile), the reservation and its refund on this one snapshot.
    ///
    /// A waiter's memory is this future's size for as long as it waits,
    /// so it keeps little across the wait: the store call is boxed (made
    /// here, gone once answered) and holds the request, and only the
    /// reservation's id and wait are kept from the answer.
    fn reserve_and_wait<'a>(
        &'a self,
        call: Reserve<'a>,
    ) -> impl Future<Output = Result<Decision<Reservation>, LimiterError>> + 'a
    where
        S: Clone,
    {
        let reserve = Box::pin(self.reserve_with(call));
        async move {
            let (id, wait_ms) = match reserve.await? {
                Decision::Allowed {
                    grant,
                    shadow_denied: None,
                } if grant.wait_ms > 0 => (grant.id, grant.wait_ms),
                // Nothing to wait for (a shadow grant never waits).
                decision => return Ok(decision),
            };
            // Borrows only: what a refund needs is copied if it happens.
            let guard = RefundOnDrop {
                user: self,
                id: &id,
                armed: true,
            };
            let clock = &self.limiter.clock;
            let deadline = clock.now_ms().saturating_add(wait_ms);
            clock.sleep_until(deadline).await;
            guard.disarm();
            Ok(Decision::Allowed {
                grant: Reservation {
                    id,
                    wait_ms: 0,
                    waited_ms: wait_ms,
                },
                shadow_denied: None,
            })
        }
    }

    /// Settles a reservation with the real usage: adjusts the user's tokens
    /// by `actual - estimate`. A repeat changes nothing (`applied: false`).
    ///
    /// # Errors
    ///
    /// [`LimiterError::UnknownReservation`] if the user has no such
    /// reservation; [`LimiterError::InvalidRequest`] if `actual` is too large
    /// to account exactly, or the reservation's run id is no id.
    pub async fn settle(
        &self,
        reservation: &ReservationId,
        actual: u64,
    ) -> Result<Settled, LimiterError> {
        self.close(reservation, Some(actual), None).await
    }

    /// [`settle`](Self::settle) with the usage split into input, output
    /// and cached input tokens, each priced at its own price of the
    /// reservation's model for cost budgets (token budgets count `actual`).
    ///
    /// # Errors
    ///
    /// As [`settle`](Self::settle).
    pub async fn settle_split(
        &self,
        reservation: &ReservationId,
        actual: u64,
        split: Option<TokenSplit>,
    ) -> Result<Settled, LimiterError> {
        self.close(reservation, Some(actual), split).await
    }

    /// Refunds a reservation: gives its estimate back. A repeat (or a refund
    /// after a settle) changes nothing.
    ///
    /// # Errors
    ///
    /// As [`settle`](Self::settle).
    pub async fn refund(&self, reservation: &ReservationId) -> Result<Settled, LimiterError> {
        self.close(reservation, None, None).await
    }

    /// The user's budgets now: each window's limit, what is spent in it and
    /// when it resets (empty: the plan has none).
    ///
    /// # Errors
    ///
    /// A store fault (a failover store fails closed here: its fallback does
    /// not know the user's spend).
    pub async fn budgets(&self) -> Result<Vec<BudgetStatus>, LimiterError> {
        let checks = self.budget_checks();
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let spent = self
            .limiter
            .store
            .budget_spent(self.user.as_str(), &checks, None)
            .await?;
        Ok(self.statuses(&checks, spent))
    }

    fn statuses(&self, checks: &[BudgetCheck], spent: Vec<SpentNow>) -> Vec<BudgetStatus> {
        let now = self.limiter.clock.now_ms();
        checks
            .iter()
            .zip(spent)
            .map(|(c, s)| BudgetStatus {
                period: c.period,
                unit: c.unit,
                limit: c.limit,
                granted: s.granted,
                spent: s.spent,
                resets_at_ms: c.window(now).end_ms,
            })
            .collect()
    }

    /// Applies an operator's `adjust` to the user's `period` budget in its
    /// current window (reset it, or top it up for this window), and answers
    /// every budget of the user after it.
    ///
    /// # Errors
    ///
    /// As [`budgets`](Self::budgets); [`LimiterError::InvalidRequest`]
    /// (field `window`) when the user's plan has no such budget, (field
    /// `amount`) a top-up of 0 or past 2^53, or (field `request_id`) a
    /// top-up's request id that breaks the id rule ([`crate::id`]).
    ///
    /// A top-up with a request id the store applied within
    /// [`TOP_UP_ID_RETENTION_MS`](crate::spend::TOP_UP_ID_RETENTION_MS)
    /// is not applied again: the budgets are answered as they are.
    pub async fn adjust_budget(
        &self,
        period: crate::calendar::Period,
        adjust: BudgetAdjust<'_>,
    ) -> Result<Vec<BudgetStatus>, LimiterError> {
        let checks = self.budget_checks();
        if !checks.iter().any(|c| c.period == period) {
            return Err(LimiterError::invalid(
                "window",
                format!(
                    "the user's plan ({}) has no {} budget",
                    self.plan.name, period
                ),
            ));
        }
        if let BudgetAdjust::TopUp { amount, request_id } = adjust {
            if !(1..=crate::spend::MAX_AMOUNT).contains(&amount) {
                return Err(LimiterError::invalid(
                    "amount",
                    format!("must be more than 0 and at most 2^53 (got {amount})"),
                ));
            }
            if let Some(id) = request_id {
                crate::id::check_id(id)
                    .map_err(|e| LimiterError::invalid("request_id", e.to_string()))?;
            }
        }
        let spent = self
            .limiter
            .store
            .budget_spent(self.user.as_str(), &checks, Some((period, adjust)))
            .await?;
        Ok(self.statuses(&checks, spent))
    }

    /// The budgets of the plan as a store checks them now: each window's
    /// unit and limit, and the current and next windows in the budgets'
    /// time zone at the limiter's clock (a window the calendar cannot
    /// represent, before 1970 or past 9999, is left out). Empty: none.
    fn budget_checks(&self) -> Vec<BudgetCheck> {
        let Some(b) = &self.plan.budgets else {
            return Vec::new();
        };
        let now = self.limiter.clock.now_ms();
        b.iter()
            .filter_map(|(period, amount)| {
                let w = self.book.budget_zone().windows(period, now).ok()?;
                let (unit, limit) = match amount {
                    BudgetAmount::Tokens(t) => (BudgetUnit::Tokens, t),
                    BudgetAmount::Cost(c) => (BudgetUnit::Cost, c),
                };
                Some(BudgetCheck {
                    period,
                    unit,
                    limit,
                    current: w.current,
                    next: w.next,
                    fallback: b.on_outage == OnOutage::Fallback,
                })
            })
            .collect()
    }

    async fn close(
        &self,
        reservation: &ReservationId,
        actual: Option<u64>,
        split: Option<TokenSplit>,
    ) -> Result<Settled, LimiterError> {
        // A reservation id is data a client sends back: its run id is
        // checked here, once (it names store state).
        id("reservation_id", &reservation.invocation_id)?;
        let plan = &*self.plan;
        if let Some(a) = actual
            && plan.tokens.scale(i64::try_from(a).unwrap_or(i64::MAX)) > i128::from(MAX_SCALED)
        {
            return Err(LimiterError::invalid(
                "actual",
                format!(
                    "must be at most {} for this plan",
                    MAX_SCALED as u64 / plan.tokens.period_ms()
                ),
            ));
        }
        let checks = self.budget_checks();
        let out = self
            .limiter
            .store
            .settle(SettleRequest {
                user: self.user.as_str(),
                tokens: plan.tokens,
                reservation,
                actual,
                budget: (!checks.is_empty()).then_some(BudgetRequest {
                    checks: &checks,
                    price: None,
                    split,
                    alerts: self.book.budget_alerts(),
                }),
            })
            .await?;
        match out {
            SettleOutcome::Applied { balance, crossed } => {
                self.report(crossed);
                Ok(Settled {
                    balance,
                    applied: true,
                    pending: false,
                })
            }
            SettleOutcome::AlreadyClosed { balance } => Ok(Settled {
                balance,
                applied: false,
                pending: false,
            }),
            SettleOutcome::Pending => Ok(Settled {
                balance: 0,
                applied: false,
                pending: true,
            }),
            SettleOutcome::Unknown => {
                Err(LimiterError::UnknownReservation(reservation.to_string()))
            }
        }
    }
}

/// Refunds a reservation if dropped before [`disarm`](Self::disarm).
struct RefundOnDrop<'a, 'l, 'u, S: Store + Clone> {
    user: &'a ForUser<'l, 'u, S>,
    id: &'a ReservationId,
    armed: bool,
}

impl<S: Store + Clone> RefundOnDrop<'_, '_, '_, S> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<S: Store + Clone> Drop for RefundOnDrop<'_, '_, '_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let store = self.user.limiter.store.clone();
        let user = self.user.user.as_str().to_owned();
        let id = self.id.clone();
        let tokens = self.user.plan.tokens;
        let checks = self.user.budget_checks();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let req = SettleRequest {
                        user: &user,
                        tokens,
                        reservation: &id,
                        actual: None,
                        budget: (!checks.is_empty()).then_some(BudgetRequest {
                            checks: &checks,
                            price: None,
                            split: None,
                            alerts: &[],
                        }),
                    };
                    if let Err(e) = store.settle(req).await {
                        tracing::warn!(user, reservation = %id, error = %e, "refund of an abandoned wait failed");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(user, reservation = %id, "no runtime to refund an abandoned wait");
            }
        }
    }
}

/// The enforcing answer of one take of `cost` from a bucket of `spec`
/// ([`Store::take_one`]): what was taken, or why it was refused (by
/// `limit`).
fn taken(out: &TakeOutcome, cost: u64, limit: Limit, spec: &BucketSpec) -> Result<Taken, Denial> {
    match out.take {
        Take::Granted { .. } => Ok(Taken {
            taken: cost,
            remaining: out.remaining,
            full_in_ms: out.full_in_ms,
        }),
        Take::Refused { retry_after_ms } => Err(Denial::Limited {
            limit,
            retry_after_ms,
        }),
        Take::ExceedsCapacity => Err(Denial::ExceedsCapacity {
            limit,
            cost,
            max_cost: spec.capacity(),
        }),
    }
}
