//! Model-call bookkeeping (SPEC §2), as pure transitions on a user's plain
//! [`CallState`]: a reserve (the token take, the run's `max_llm_calls` cap,
//! shadow reservations, request-id repeats), a settle or refund (applied at
//! most once) and the part of reconciliation (SPEC §6) that closes
//! ambiguous reserves.
//!
//! Nothing here reads a clock or touches a store: each function is given
//! `now` and the state, answers the decision and leaves the new state in
//! the value it was given. `MemoryStore` keeps one [`CallState`] per user
//! and applies these under the user's lock; the Redis scripts
//! `reserve_tokens.lua` and `settle.lua` restate them (checked by
//! `crates/tollgate-redis/tests/differential.rs`).

use crate::bucket::{self, BucketSpec, BucketState, EXPIRY_GRACE_MS, MAX_SCALED, Take};
use crate::decision::{Denial, Limit};
use crate::spend::{Charged, Crossed, Spend, TopUpIds};
use crate::store::MAX_TRACKED_RUNS;
use crate::store::{
    RESERVATION_RETENTION_MS, ReservationId, ReserveOutcome, ReserveRequest, SettleOutcome,
    SettleRequest, sliding_minute,
};

/// Replicas whose last reconciliation batch a user's state remembers.
pub const MAX_RECONCILING_REPLICAS: usize = 64;

/// All of one user's model-call state: the token bucket, the records of
/// recent runs, the per-minute usage and the reconciliation batches seen.
/// An empty state (`default`) is a user who made no model call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallState {
    /// The token bucket's saved state and its expiry, ms (`None`, or an
    /// expired one, is a full bucket).
    pub tokens: Option<(BucketState, u64)>,
    /// Records of the runs seen within [`RESERVATION_RETENTION_MS`], at
    /// most [`MAX_TRACKED_RUNS`].
    pub runs: Vec<RunRecord>,
    /// Tokens charged per minute.
    pub usage: Usage,
    /// The last reconciliation batch applied from each replica (tag,
    /// batch), at most [`MAX_RECONCILING_REPLICAS`], the least recent
    /// forgotten first.
    pub reconciled: Vec<(u32, u64)>,
    /// Spend per budget window, for a user whose plan has
    /// budgets.
    pub spend: Option<Box<Spend>>,
    /// The request ids of the user's recent budget top-ups.
    pub top_ups: Option<Box<TopUpIds>>,
}

/// An open reservation of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// Its call number.
    pub call: u64,
    /// The tokens it charged the token bucket.
    pub charged: u64,
    /// What it charged the user's budgets, and at what price.
    pub budget: Option<Box<Charged>>,
}

/// One run's record: its call counter (the `max_llm_calls` cap), its open
/// reservations and the request ids it granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// The run's invocation id.
    pub id: Box<str>,
    /// Model calls counted so far; reservation numbers are `1..=calls`.
    pub calls: u64,
    /// Open reservations. Closed ones are the numbers up to `calls` that
    /// are not here.
    pub open: Vec<Open>,
    /// Request ids of granted reserves: (id, call, when its wait ends).
    /// Call 0 marks an id superseded by reconciliation.
    pub requests: Vec<(Box<str>, u64, u64)>,
    /// When the record is forgotten, ms.
    pub expires_at: u64,
}

impl RunRecord {
    /// The (call, end of wait) a request id was granted, if any.
    fn request(&self, id: &str) -> Option<(u64, u64)> {
        self.requests
            .iter()
            .find(|(r, _, _)| &**r == id)
            .map(|(_, call, ready)| (*call, *ready))
    }
}

/// Tokens charged per minute, two windows, for the sliding-minute estimate
/// ([`sliding_minute`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
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

    /// Counts `tokens` (negative: given back) at `now`.
    pub fn add(&mut self, now: u64, tokens: i64) {
        self.roll(now);
        self.current = self.current.saturating_add(tokens);
    }

    /// Tokens over the last 60 s: this minute plus the overlapping share of
    /// the previous one.
    pub fn last_minute(&self, now: u64) -> i64 {
        let mut u = *self;
        u.roll(now);
        sliding_minute(u.current, u.previous, now)
    }

    /// When the counts stop mattering, ms (0: nothing counted).
    pub fn expires_at(&self) -> u64 {
        if self.current == 0 && self.previous == 0 {
            0
        } else {
            (self.minute + 2).saturating_mul(60_000)
        }
    }
}

impl CallState {
    /// After this time (ms) the state is as good as empty.
    pub fn expires_at(&self) -> u64 {
        self.tokens
            .map_or(0, |(_, e)| e)
            .max(self.runs.iter().map(|r| r.expires_at).max().unwrap_or(0))
            .max(self.usage.expires_at())
            .max(
                self.spend
                    .as_ref()
                    .map_or(0, |s| s.expires_at().saturating_add(EXPIRY_GRACE_MS)),
            )
            .max(self.top_ups.as_ref().map_or(0, |t| t.expires_at()))
    }

    /// The spend state, made on first use.
    pub fn spend(&mut self) -> &mut Spend {
        self.spend.get_or_insert_with(Box::default)
    }

    /// What a repeat of reserve request `request_id` of run
    /// `invocation_id` answers, if it was granted here (or marked
    /// superseded): the first grant with what is left of its wait. A read.
    pub fn repeat_of(
        &self,
        now: u64,
        invocation_id: &str,
        request_id: &str,
    ) -> Option<ReserveOutcome> {
        let run = self
            .runs
            .iter()
            .find(|r| &*r.id == invocation_id && r.expires_at > now)?;
        let (call, ready) = run.request(request_id)?;
        Some(repeat(invocation_id, call, ready, now))
    }

    /// Charges `delta` tokens (negative gives back) to the token bucket of
    /// `spec` and counts them in the usage; answers the new state.
    pub fn charge(&mut self, spec: &BucketSpec, now: u64, delta: i64) -> BucketState {
        let a = bucket::adjust(spec, bucket::live(self.tokens, now), now, delta);
        self.tokens = Some((a.state, a.expires_at));
        self.usage.add(now, delta);
        a.state
    }

    /// Records that reconciliation batch `batch` of `replica` is applied
    /// now; `false` (and nothing changes) if it, or a later one, already
    /// was.
    pub fn first_sight_of_batch(&mut self, replica: u32, batch: u64) -> bool {
        match self.reconciled.iter().position(|(r, _)| *r == replica) {
            Some(i) if self.reconciled[i].1 >= batch => return false,
            Some(i) => {
                self.reconciled.remove(i);
            }
            None if self.reconciled.len() >= MAX_RECONCILING_REPLICAS => {
                self.reconciled.remove(0);
            }
            None => {}
        }
        self.reconciled.push((replica, batch));
        true
    }

    /// The live record of run `invocation_id`, if any (expired records are
    /// dropped on the way).
    fn run(&mut self, now: u64, id: &str) -> Option<&mut RunRecord> {
        self.runs.retain(|r| r.expires_at > now);
        self.runs.iter_mut().find(|r| &*r.id == id)
    }

    /// The record of run `invocation_id`, made if there is none (at most
    /// [`MAX_TRACKED_RUNS`] per user: the least recently active is dropped
    /// for a new one); its retention restarts.
    fn run_record(&mut self, now: u64, invocation_id: &str) -> &mut RunRecord {
        let expires_at = now.saturating_add(RESERVATION_RETENTION_MS);
        self.runs.retain(|r| r.expires_at > now);
        let pos = self.runs.iter().position(|r| &*r.id == invocation_id);
        let run = match pos {
            Some(p) => &mut self.runs[p],
            None => {
                if self.runs.len() >= MAX_TRACKED_RUNS
                    && let Some(oldest) = self
                        .runs
                        .iter()
                        .enumerate()
                        .min_by(|(_, a), (_, b)| (a.expires_at, &a.id).cmp(&(b.expires_at, &b.id)))
                        .map(|(i, _)| i)
                {
                    self.runs.swap_remove(oldest);
                }
                // Most users run one invocation at a time: the first
                // allocation holds exactly one; growth after is amortized.
                if self.runs.capacity() == 0 {
                    self.runs.reserve_exact(1);
                }
                self.runs.push(RunRecord {
                    id: invocation_id.into(),
                    calls: 0,
                    open: Vec::new(),
                    requests: Vec::new(),
                    expires_at,
                });
                self.runs.last_mut().expect("just pushed")
            }
        };
        run.expires_at = expires_at;
        run
    }

    /// Counts a model call of `invocation_id` and records its reservation as
    /// open with the estimate it charged (0 for a shadow reservation, which
    /// took nothing: its settle charges the actual usage, its refund changes
    /// nothing). Answers the call's number.
    fn record_call(
        &mut self,
        now: u64,
        invocation_id: &str,
        charged: u64,
        budget: Option<Charged>,
    ) -> u64 {
        let run = self.run_record(now, invocation_id);
        run.calls += 1;
        if run.open.capacity() == 0 {
            run.open.reserve_exact(1);
        }
        run.open.push(Open {
            call: run.calls,
            charged,
            budget: budget.map(Box::new),
        });
        run.calls
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
        crossed: Crossed::NONE,
    }
}

/// Reserves `req.estimate` tokens before a model call of run
/// `req.invocation_id` (`req.user` is not read: `state` is that user's).
///
/// A repeated request id answers its first grant. A run at its
/// `max_llm_calls` is refused for good (shadow mode: the take is still
/// decided, and refused). A grant takes the estimate (with a wait up to
/// `max_wait_ms`), counts the call and opens its reservation; a refusal
/// takes nothing and counts nothing, except that in shadow mode the call is
/// counted and a zero-charge reservation opened.
pub fn reserve(state: &mut CallState, now: u64, req: &ReserveRequest<'_>) -> ReserveOutcome {
    let run = state.run(now, req.invocation_id);
    if let (Some(rid), Some(run)) = (req.request_id, &run)
        && let Some((call, ready)) = run.request(rid)
    {
        return repeat(req.invocation_id, call, ready, now);
    }
    let calls = run.map_or(0, |r| r.calls);
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
        bucket::live(state.tokens, now),
        now,
        req.estimate,
        req.max_wait_ms,
    );
    let token_denial = match t.outcome {
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
    let budget = req.budget.as_ref().filter(|b| !b.checks.is_empty());
    let none = Spend::default();
    let decided = budget.map(|b| {
        let spent = state.spend.as_deref().unwrap_or(&none);
        spent.decide(b, now, req.estimate)
    });
    let budget_denial = decided.as_ref().and_then(|d| d.as_ref().err().copied());
    let denial = if calls >= req.max_llm_calls {
        Some(cap)
    } else {
        first_denial(token_denial, budget_denial)
    };
    match (denial, t.outcome) {
        (None, Take::Granted { wait_ms }) => {
            state.tokens = Some((t.state, t.expires_at));
            state.usage.add(now, req.estimate as i64);
            let mut crossed = Crossed::NONE;
            let charged = match (budget, decided) {
                (Some(b), Some(Ok(charged))) => {
                    let spend = state.spend();
                    let before = spend.clone();
                    spend.charge(b.checks, &charged, now);
                    crossed = spend.crossed(&before, b, now);
                    Some(charged)
                }
                _ => None,
            };
            let call = state.record_call(now, req.invocation_id, req.estimate, charged);
            let reservation = ReservationId::new(req.invocation_id, call);
            if let Some(rid) = req.request_id
                && let Some(run) = state.run(now, req.invocation_id)
            {
                run.requests
                    .push((rid.into(), reservation.call, now.saturating_add(wait_ms)));
            }
            ReserveOutcome::Granted {
                reservation,
                wait_ms,
                crossed,
            }
        }
        (denial, _) => {
            // Take nothing: keep only the refilled level.
            let r = bucket::adjust(&req.tokens, bucket::live(state.tokens, now), now, 0);
            state.tokens = Some((r.state, r.expires_at));
            ReserveOutcome::Denied {
                denial: denial.unwrap_or(cap),
                shadow_reservation: req.shadow.then(|| {
                    let nothing = budget.map(|b| Charged::nothing(b, now));
                    ReservationId::new(
                        req.invocation_id,
                        state.record_call(now, req.invocation_id, 0, nothing),
                    )
                }),
            }
        }
    }
}

/// The refusal reported when both the token bucket and a budget refuse: a
/// request that can never fit first (the token bucket's before a
/// budget's), else the one with the later retry hint (a tie: the
/// budget's).
fn first_denial(token: Option<Denial>, budget: Option<Denial>) -> Option<Denial> {
    match (token, budget) {
        (None, d) | (d, None) => d,
        (Some(t @ Denial::ExceedsCapacity { .. }), _) => Some(t),
        (_, Some(b @ Denial::ExceedsCapacity { .. })) => Some(b),
        (Some(t), Some(b)) if t.retry_after_ms() > b.retry_after_ms() => Some(t),
        (_, b) => b,
    }
}

/// Settles (`req.actual` given: charges `actual - estimate`) or refunds
/// (gives the estimate back) reservation `req.reservation`, at most once:
/// a closed reservation answers [`SettleOutcome::AlreadyClosed`] and
/// changes nothing; one this state never opened (or forgot)
/// [`SettleOutcome::Unknown`]. Closing restarts the run's retention.
pub fn settle(state: &mut CallState, now: u64, req: &SettleRequest<'_>) -> SettleOutcome {
    let spec = req.tokens;
    let r = req.reservation;
    let Some(run) = state.run(now, &r.invocation_id) else {
        return SettleOutcome::Unknown;
    };
    if r.call == 0 || r.call > run.calls {
        return SettleOutcome::Unknown;
    }
    let Some(pos) = run.open.iter().position(|o| o.call == r.call) else {
        return SettleOutcome::AlreadyClosed {
            balance: spec
                .unscale(bucket::refill(&spec, bucket::live(state.tokens, now), now).level),
        };
    };
    let Open {
        charged: estimate,
        budget: charged,
        ..
    } = run.open.swap_remove(pos);
    if run.open.is_empty() {
        run.open = Vec::new();
    }
    run.expires_at = now.saturating_add(RESERVATION_RETENTION_MS);
    let mut crossed = Crossed::NONE;
    if let (Some(charged), Some(b)) = (charged, &req.budget) {
        let spend = state.spend();
        let before = spend.clone();
        spend.close(&charged, b, now, req.actual);
        crossed = spend.crossed(&before, b, now);
    }
    let delta = match req.actual {
        // Counts past 2^53 cannot be kept exactly (see SettleRequest).
        Some(actual) => i128::from(actual.min(MAX_SCALED as u64)) - i128::from(estimate),
        None => -i128::from(estimate),
    };
    let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    let after = state.charge(&spec, now, delta);
    SettleOutcome::Applied {
        balance: spec.unscale(after.level),
        crossed,
    }
}

/// Reconciliation's step on reserves that failed ambiguously elsewhere
/// (`(invocation id, request id)`, [`ReconcileRequest::ambiguous_reserves`]):
/// one granted here is closed (if still open) and its charge counted as
/// given back, and its id marked superseded; one never run here is marked
/// so a late copy takes nothing. The tokens are not given back here: the
/// caller nets them against the fallback's charge. Answers (reservations
/// closed, tokens they had charged).
///
/// [`ReconcileRequest::ambiguous_reserves`]: crate::store::ReconcileRequest::ambiguous_reserves
pub fn close_ambiguous(state: &mut CallState, now: u64, reserves: &[(&str, &str)]) -> (u32, i64) {
    let mut closed = 0u32;
    let mut given_back: i64 = 0;
    for &(inv_id, rid) in reserves {
        let run = state.run_record(now, inv_id);
        let mut budget = None;
        match run.requests.iter().position(|(r, _, _)| &**r == rid) {
            Some(i) => {
                let call = run.requests[i].1;
                if let Some(pos) = run.open.iter().position(|o| o.call == call) {
                    let open = run.open.swap_remove(pos);
                    given_back = given_back.saturating_add(open.charged as i64);
                    budget = open.budget;
                    closed += 1;
                }
                run.requests[i].1 = 0;
            }
            None => run.requests.push((rid.into(), 0, 0)),
        }
        // Its budget charges too: the fallback's charges replace them.
        if let Some(b) = budget {
            state.spend().give_back(&b);
        }
    }
    (closed, given_back)
}
