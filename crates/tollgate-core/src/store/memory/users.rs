//! Users' entries: turn bucket, run leases, model-call state and session
//! claims, all in one entry so turn admission is one critical section. The
//! rules are core's pure transitions ([`lease`], [`reserve`]); this file
//! looks the entry up under its shard's lock and applies them.

use super::MemoryStore;
use super::shards::{Expiring, Full};
use crate::bucket::{self, BucketSpec, BucketState};
use crate::lease::{self, Admit, LeaseSet};
use crate::reserve::{self, CallState};
use crate::spend::{BudgetAdjust, BudgetCheck, Spend};
use crate::store::{
    CLAIM_SLACK_MS, Claim, ClaimRequest, ReconcileRequest, Reconciled, Release, ReserveOutcome,
    ReserveRequest, SettleOutcome, SettleRequest, TakeOutcome, TopUser, TurnOutcome, TurnRequest,
    UserState,
};
use crate::take;

/// All of one user's state. Kept small for idle users: the turn bucket and
/// leases inline, everything about model calls boxed (a user who only made
/// turns pays one pointer for it).
#[derive(Default)]
pub(crate) struct UserEntry {
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
///
/// [`Store::claim_session`]: crate::Store::claim_session
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

impl Expiring for UserEntry {
    /// Keeps the (expired) leases so the operation that purges them counts
    /// them as reclaimed, as the Redis scripts do.
    fn reset(&mut self) {
        self.turns = None;
        self.calls = None;
        self.claims = None;
    }

    fn expires_at(&self) -> u64 {
        self.turns
            .map_or(0, |(_, e)| e)
            .max(self.leases.expires_at().unwrap_or(0))
            .max(self.calls.as_ref().map_or(0, |c| c.expires_at()))
            .max(self.claims.as_ref().map_or(0, |c| c.last_end))
    }
}

impl UserEntry {
    /// The model-call state, created on first use.
    fn calls(&mut self) -> &mut CallState {
        self.calls.get_or_insert_with(Box::default)
    }

    /// The spend per budget window, if any was charged.
    pub(super) fn spend(&self) -> Option<&Spend> {
        self.calls.as_ref()?.spend.as_deref()
    }

    fn tokens(&self) -> Option<(BucketState, u64)> {
        self.calls.as_ref().and_then(|c| c.tokens)
    }
}

impl MemoryStore {
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
            u?.calls
                .as_deref()?
                .repeat_of(now, invocation_id, request_id)
        })
    }

    pub(super) fn admit(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, Full> {
        let now = self.now();
        self.inner.users.with(req.user, now, |u| {
            if let Some(denial) = u
                .calls
                .as_ref()
                .and_then(|c| c.spend.as_ref())
                .and_then(|s| s.exhausted(req.budgets, now))
            {
                return TurnOutcome {
                    admit: Admit::Denied(denial),
                    reclaimed: 0,
                };
            }
            let t = lease::admit_turn(
                &req.params,
                bucket::live(u.turns, now),
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

    pub(super) fn release_now(&self, user: &str, invocation_id: &str) -> Result<Release, Full> {
        let now = self.now();
        self.inner.users.with(user, now, |u| {
            if u.leases.release(now, invocation_id) {
                Release::Released
            } else {
                Release::NotHeld
            }
        })
    }

    pub(super) fn renew_now(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, Full> {
        let now = self.now();
        self.inner
            .users
            .with(user, now, |u| u.leases.renew(now, invocation_id, ttl_ms))
    }

    pub(super) fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, Full> {
        let now = self.now();
        self.inner
            .users
            .with(req.user, now, |u| reserve::reserve(u.calls(), now, &req))
    }

    pub(super) fn settle_now(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, Full> {
        let now = self.now();
        self.inner
            .users
            .with(req.user, now, |u| match u.calls.as_deref_mut() {
                Some(c) => reserve::settle(c, now, &req),
                None => SettleOutcome::Unknown,
            })
    }

    pub(super) fn reconcile_now(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, Full> {
        let now = self.now();
        self.inner.users.with(req.user, now, |u| {
            if !u.calls().first_sight_of_batch(req.replica, req.batch) {
                return Reconciled::default();
            }
            let (refunded, given_back) = if req.ambiguous_reserves.is_empty() {
                (0, 0)
            } else {
                reserve::close_ambiguous(u.calls(), now, req.ambiguous_reserves)
            };
            let held_here = req
                .ambiguous_admissions
                .iter()
                .filter(|id| u.leases.iter().any(|(l, exp)| l == **id && exp > now))
                .count() as u64;
            let turns = req.turns_taken.saturating_sub(held_here);
            if turns > 0 {
                let delta = i64::try_from(turns).unwrap_or(i64::MAX);
                let a = bucket::adjust(&req.turns, bucket::live(u.turns, now), now, delta);
                u.turns = Some((a.state, a.expires_at));
            }
            let tokens = req.tokens_net.saturating_sub(given_back);
            if tokens != 0 {
                u.calls().charge(&req.tokens, now, tokens);
            }
            for b in req.budgets.iter().filter(|b| b.window.end_ms > now) {
                u.calls()
                    .spend()
                    .add(b.period, b.unit, b.window, i128::from(b.delta));
            }
            Reconciled {
                turns,
                tokens,
                refunded,
            }
        })
    }

    pub(super) fn user_state_now(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> UserState {
        let now = self.now();
        self.inner.users.read(user, now, |u| {
            let level = |spec: &BucketSpec, s: Option<(BucketState, u64)>| {
                spec.unscale(bucket::refill(spec, bucket::live(s, now), now).level)
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
        })
    }

    pub(super) fn top_users_now(&self) -> Vec<TopUser> {
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
        all
    }

    /// A take from a user's turn bucket ([`take::take_one`]).
    pub(super) fn take_turns(
        &self,
        user: &str,
        now: u64,
        spec: &BucketSpec,
        cost: u64,
    ) -> Result<TakeOutcome, Full> {
        self.inner.users.with(user, now, |u| {
            let (outcome, save) = take::take_one(spec, bucket::live(u.turns, now), now, cost);
            if save.is_some() {
                u.turns = save;
            }
            outcome
        })
    }

    /// Applies an operator's `adjust` to `check`'s window, then answers
    /// `read` of the user's spend.
    pub(super) fn adjust_budget_now<R>(
        &self,
        user: &str,
        check: &BudgetCheck,
        now: u64,
        adjust: BudgetAdjust<'_>,
        read: impl Fn(Option<&Spend>) -> R,
    ) -> Result<R, Full> {
        self.inner.users.with(user, now, |u| {
            let calls = u.calls();
            let apply = match adjust {
                BudgetAdjust::TopUp {
                    request_id: Some(id),
                    ..
                } => calls
                    .top_ups
                    .get_or_insert_with(Box::default)
                    .first(id, now),
                _ => true,
            };
            if apply {
                let _ = calls.spend().adjust(check, now, adjust);
            }
            read(u.spend())
        })
    }

    pub(super) fn reset_user_now(&self, user: &str) -> Result<bool, Full> {
        let now = self.now();
        self.inner.users.with(user, now, |u| {
            let had =
                bucket::live(u.turns, now).is_some() || bucket::live(u.tokens(), now).is_some();
            u.turns = None;
            if let Some(c) = u.calls.as_deref_mut() {
                c.tokens = None;
            }
            had
        })
    }

    pub(super) fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, Full> {
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
