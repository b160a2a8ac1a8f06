//! Where tollgate keeps its state: operations as typed requests ([`Op`]),
//! the [`Store`] that runs any of them ([`Store::call`]), and the
//! [`Backend`] contract a backend implements, one method per operation.
//!
//! Each operation is one atomic step on the store (one lock in memory, one
//! Lua script in Redis) and answers with data; `Err` means the store itself
//! failed. The store takes `now` from its own clock: an injected [`Clock`]
//! in memory, Redis `TIME` in Redis. Decorators (the failure policy, test
//! fault injectors) implement [`Store::call`] once for every operation.
//!
//! [`Clock`]: crate::Clock

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::aimd::AimdParams;
use crate::bucket::{BucketSpec, Take};
use crate::calendar::{Period, Window};
use crate::decision::Denial;
use crate::error::StoreError;
use crate::lease::{Admit, SessionAcquire, SessionGrant, TurnParams};
use crate::spend::{BudgetAdjust, BudgetCheck, BudgetRequest, BudgetUnit, Crossed, SpentNow};

pub mod grouped;
pub mod memory;
mod op;

pub use grouped::{
    LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
pub use op::{
    AcquireSession, Aimd, AppendFenced, BudgetSpent, CheckFence, ClearProvider, DeleteRecords,
    ExtendCooldown, FairCheck, FairTakeMany, Op, Outage, ReadFair, ReadRecords, ReadUser,
    ReleaseRun, ReleaseSession, RenewRun, RenewSession, ResetUser, TakeMany, TopUsers,
};

/// How long a reservation (and a run's model-call counter) is remembered
/// after its last change, ms: a settle or refund later than this answers
/// unknown reservation.
pub const RESERVATION_RETENTION_MS: u64 = 3_600_000;

/// Runs per user whose record (model-call counter and open reservations) a
/// store remembers (SPEC §2): past it the least recently active run's
/// record is dropped, so its open reservations then settle as unknown,
/// which never under-charges. Every store enforces it (the Redis scripts
/// are passed this value).
pub const MAX_TRACKED_RUNS: usize = 256;

/// Default time a session's lease state, fence counter and records are kept
/// after the last activity (SPEC §4): 7 days.
pub const DEFAULT_SESSION_RETENTION_MS: u64 = 7 * 24 * 3_600_000;

/// Default time a session that holds no record (a lease and its fence
/// only, as every sidecar session) is kept past the end of its lease, ms
/// (SPEC §4): 10 minutes. Never longer than the session retention.
pub const DEFAULT_SESSION_GRACE_MS: u64 = 600_000;

/// How much longer than the session it counts a claim
/// ([`Store::claim_session`]) lasts, ms: room for the clocks of two Redis
/// Cluster nodes to differ (the claim and the session live in different
/// slots) and for the time between the two steps.
pub const CLAIM_SLACK_MS: u64 = 60_000;

/// Names one token reservation: the run's invocation id and the model call's
/// number within the run (1, 2, …). Its text form is `"{call}.{invocation_id}"`,
/// or `"f{tag}.{call}.{invocation_id}"` for one a replica's fallback store
/// issued while the shared store was unreachable (`tag`: the replica's
/// fallback tag, 8 lowercase hex digits), so the two never collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReservationId {
    /// The run.
    pub invocation_id: String,
    /// The model call number within the run, from 1.
    pub call: u64,
    /// `Some(tag)`: issued by the fallback store of the replica whose tag
    /// this is (SPEC §6), not by the store of record.
    pub fallback: Option<u32>,
}

impl ReservationId {
    /// A reservation the store of record issued.
    pub fn new(invocation_id: impl Into<String>, call: u64) -> Self {
        Self {
            invocation_id: invocation_id.into(),
            call,
            fallback: None,
        }
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(tag) = self.fallback {
            write!(f, "f{tag:08x}.")?;
        }
        write!(f, "{}.{}", self.call, self.invocation_id)
    }
}

/// A reservation id that is not `"{call}.{invocation_id}"` (or
/// `"f{tag}.{call}.{invocation_id}"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed reservation id (expected \"<call>.<invocation_id>\")")]
pub struct MalformedReservationId;

impl FromStr for ReservationId {
    type Err = MalformedReservationId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (fallback, s) = match s.strip_prefix('f') {
            Some(rest) => {
                let (hex, rest) = rest.split_once('.').ok_or(MalformedReservationId)?;
                let canonical = hex.len() == 8
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if !canonical {
                    return Err(MalformedReservationId);
                }
                let tag = u32::from_str_radix(hex, 16).map_err(|_| MalformedReservationId)?;
                (Some(tag), rest)
            }
            None => (None, s),
        };
        let (digits, inv) = s.split_once('.').ok_or(MalformedReservationId)?;
        let call: u64 = digits.parse().map_err(|_| MalformedReservationId)?;
        // Canonical form only: no sign, no leading zeros.
        if call == 0 || inv.is_empty() || call.to_string() != digits {
            return Err(MalformedReservationId);
        }
        Ok(ReservationId {
            invocation_id: inv.to_owned(),
            call,
            fallback,
        })
    }
}

impl Serialize for ReservationId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ReservationId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Turn admission: the turn bucket and a run lease, all or nothing.
#[derive(Debug, Clone, Copy)]
pub struct TurnRequest<'a> {
    /// The verified user.
    pub user: &'a str,
    /// The run asking for a lease.
    pub invocation_id: &'a str,
    /// Bucket, cap and lease settings from the user's plan.
    pub params: TurnParams,
    /// Budgets whose exhaustion refuses the turn (a plan with
    /// `on_exhausted = "deny_turns"`): a spent one refuses it
    /// before the turn bucket and the lease are looked at, taking nothing.
    /// Empty: none.
    pub budgets: &'a [BudgetCheck],
}

/// The answer to a turn admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct TurnOutcome {
    /// Admitted or denied.
    pub admit: Admit,
    /// Leaked leases that expiry reclaimed on the way (a metric).
    pub reclaimed: u32,
}

/// A token reservation before a model call.
#[derive(Debug, Clone, Copy)]
pub struct ReserveRequest<'a> {
    /// The verified user.
    pub user: &'a str,
    /// The run making the call.
    pub invocation_id: &'a str,
    /// The user's token bucket.
    pub tokens: BucketSpec,
    /// Estimated tokens (the cost).
    pub estimate: u64,
    /// Longest acceptable wait, ms.
    pub max_wait_ms: u64,
    /// Model calls allowed per run; the call past it is refused for good.
    pub max_llm_calls: u64,
    /// Shadow mode: a refusal still takes nothing, but the call is counted and
    /// a reservation (charging nothing) is recorded so it can be settled.
    pub shadow: bool,
    /// The caller's id for this request (unique within the run): a repeat
    /// with the same id while the run's record is kept
    /// ([`RESERVATION_RETENTION_MS`]) answers the first grant (the same
    /// reservation, what is left of its wait) instead of charging again. A
    /// denial is not remembered: its repeat is decided anew. Stores keep
    /// at most one id per model call of the run.
    pub request_id: Option<&'a str>,
    /// The user's spend budgets, checked and charged in the
    /// same step as the token take (all or nothing); `None` or no checks:
    /// none.
    pub budget: Option<BudgetRequest<'a>>,
}

/// The answer to a token reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ReserveOutcome {
    /// Reserved; the caller waits `wait_ms` before calling the model.
    Granted {
        /// Names the reservation for settle/refund.
        reservation: ReservationId,
        /// How long to wait first, ms.
        wait_ms: u64,
        /// Budget alert thresholds this charge crossed.
        crossed: Crossed,
    },
    /// Refused; nothing taken.
    Denied {
        /// Why.
        denial: Denial,
        /// In shadow mode, the zero-charge reservation recorded instead.
        shadow_reservation: Option<ReservationId>,
    },
    /// The request id was settled elsewhere: a replica's fallback answered
    /// it during an outage and reconciliation ([`Store::reconcile`]) marked
    /// it here, so this attempt (a late copy, or a retry that reached
    /// another replica) takes nothing.
    Superseded,
}

/// Closes a reservation: settle with the real usage, or refund.
#[derive(Debug, Clone, Copy)]
pub struct SettleRequest<'a> {
    /// The verified user (reservations are per user).
    pub user: &'a str,
    /// The user's token bucket.
    pub tokens: BucketSpec,
    /// The reservation.
    pub reservation: &'a ReservationId,
    /// `Some(actual)`: settle, adjusting by `actual - estimate`.
    /// `None`: refund, adjusting by `-estimate`. Stores count exactly only up
    /// to 2^53: a larger `actual` is taken as 2^53 (the `Limiter` refuses
    /// anything past 2^53 / period as invalid before it gets here).
    pub actual: Option<u64>,
    /// The user's budgets now, and the usage split: the reservation's
    /// budget charges move by its actual cost (at the price it was made
    /// at), or are given back by a refund. `None`: budgets are left alone.
    pub budget: Option<BudgetRequest<'a>>,
}

/// The answer to a settle or refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SettleOutcome {
    /// Applied now; `balance` is the token level after it (whole tokens,
    /// negative while in debt).
    Applied {
        /// Token level after, whole tokens.
        balance: i64,
        /// Budget alert thresholds the settle's charge crossed.
        crossed: Crossed,
    },
    /// Already settled or refunded: nothing changed.
    AlreadyClosed {
        /// Token level now, whole tokens.
        balance: i64,
    },
    /// No such reservation for this user (never made, or forgotten after
    /// [`RESERVATION_RETENTION_MS`]).
    Unknown,
    /// Accepted but not applied yet: the store of record is unreachable, so
    /// the close waits in the replica's journal and is applied when it
    /// answers again (SPEC §6). Only a failure-policy wrapper answers this.
    Pending,
}

/// The answer to a run release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The run held a lease; it is gone.
    Released,
    /// The run held no live lease (not an error).
    NotHeld,
    /// Accepted but not applied yet: the store of record is unreachable, so
    /// the release waits in the replica's journal (SPEC §6).
    Pending,
}

impl Release {
    /// Whether a lease was released now.
    pub fn released(self) -> bool {
        self == Release::Released
    }
}

/// What a failure-policy fallback decided for one user during an outage,
/// charged to the store of record when it answers again
/// ([`Store::reconcile`], SPEC §6).
#[derive(Debug, Clone, Copy)]
pub struct ReconcileRequest<'a> {
    /// The user.
    pub user: &'a str,
    /// The user's turn bucket (the plan's, unscaled).
    pub turns: BucketSpec,
    /// The user's token bucket (the plan's, unscaled).
    pub tokens: BucketSpec,
    /// Turns the fallback took.
    pub turns_taken: u64,
    /// Tokens the fallback charged, net: estimates reserved plus settle
    /// adjustments minus refunds (negative: more was given back than
    /// taken since the last reconciliation).
    pub tokens_net: i64,
    /// Reserves that failed here ambiguously (sent, no answer) before the
    /// fallback decided them: `(invocation id, request id)`. One this store
    /// did run is refunded here (the fallback's charge replaces it); one
    /// it did not run is marked so a late copy takes nothing
    /// ([`ReserveOutcome::Superseded`]).
    pub ambiguous_reserves: &'a [(&'a str, &'a str)],
    /// Admissions that failed here ambiguously before the fallback admitted
    /// them: a run that holds a live lease here was admitted (and charged a
    /// turn) here, so one turn fewer is charged for it.
    pub ambiguous_admissions: &'a [&'a str],
    /// What the fallback charged the user's budgets (plans with
    /// `on_outage = "fallback"`), net per window: added to the spend of
    /// each window that has not ended (one that has is over: dropped).
    pub budgets: &'a [BudgetNet],
    /// The replica sending these charges (its fallback tag) …
    pub replica: u32,
    /// … and this batch's number, increasing per replica from 1. A batch
    /// at or below the last one applied for this user from this replica
    /// is not applied again (it charges nothing and answers zeros): a
    /// reconciliation whose answer was lost (it timed out after it was
    /// sent) is retried as the same batch, and so charged once.
    pub batch: u64,
}

/// A fallback's net charge to one budget window ([`ReconcileRequest::budgets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetNet {
    /// The budget's window length.
    pub period: Period,
    /// What it counts.
    pub unit: BudgetUnit,
    /// The window charged.
    pub window: Window,
    /// The net amount (negative: more given back than charged), within
    /// ±2^53.
    pub delta: i64,
}

/// What [`Store::reconcile`] charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Turns charged to the turn bucket.
    pub turns: u64,
    /// Tokens charged to the token bucket (net).
    pub tokens: i64,
    /// Ambiguous reserves found run here and refunded.
    pub refunded: u32,
}

/// One bucket of a multi-bucket take, with its own parameters.
#[derive(Debug, Clone, Copy)]
pub struct BucketTake<'a> {
    /// The bucket's key (namespaced by the caller, e.g. `provider:openai:gpt-4o:rpm`).
    pub key: &'a str,
    /// The rate, as effective now (AIMD may have lowered it).
    pub spec: BucketSpec,
    /// The cost.
    pub cost: u64,
    /// Longest acceptable wait for this bucket, ms.
    pub max_wait_ms: u64,
}

/// The bucket a single take ([`Store::take_one`]) draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketRef<'a> {
    /// A user's turn bucket: the very bucket turn admission
    /// ([`Store::admit_turn`]) takes from, so both share one budget.
    Turns(&'a str),
    /// A named bucket, in the key space of [`Store::take_many`] (namespaced
    /// by the caller; in Redis Cluster the key's hash tag picks its slot).
    Named(&'a str),
}

/// A take from one bucket that never waits (`max_wait` 0) and holds no
/// lease: `cost` now, or nothing.
#[derive(Debug, Clone, Copy)]
pub struct TakeRequest<'a> {
    /// Which bucket.
    pub bucket: BucketRef<'a>,
    /// Its rate (the user's plan's turn rate for [`BucketRef::Turns`]).
    pub spec: BucketSpec,
    /// The cost; 0 takes nothing and reports the bucket as it is.
    pub cost: u64,
}

/// The answer to a single take, with what is left: enough for rate-limit
/// headers (remaining, reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct TakeOutcome {
    /// [`Take::Granted`] (always with `wait_ms` 0), [`Take::Refused`] with
    /// the exact retry hint, or [`Take::ExceedsCapacity`] (`cost` is larger
    /// than the burst). Only a grant takes anything.
    ///
    /// [`Take::Granted`]: crate::bucket::Take::Granted
    /// [`Take::Refused`]: crate::bucket::Take::Refused
    /// [`Take::ExceedsCapacity`]: crate::bucket::Take::ExceedsCapacity
    pub take: Take,
    /// Whole tokens left after the answer (refilled to now).
    pub remaining: u64,
    /// How long until the bucket is full again, ms.
    pub full_in_ms: u64,
}

impl TakeOutcome {
    /// The outcome of `take` on a bucket of `spec` whose scaled level after
    /// it is `level`: what every store answers from its saved state.
    pub fn new(take: Take, spec: &BucketSpec, level: i64) -> Self {
        Self {
            take,
            remaining: u64::try_from(spec.unscale(level)).unwrap_or(0),
            full_in_ms: crate::bucket::full_in_ms(spec, level),
        }
    }
}

/// A cooldown checked together with a multi-bucket take.
#[derive(Debug, Clone, Copy)]
pub struct CooldownCheck<'a> {
    /// The cooldown's key.
    pub key: &'a str,
    /// Longest acceptable wait for the cooldown to pass, ms.
    pub max_wait_ms: u64,
    /// The longest the key's cooldown may run from now, ms: a stored end
    /// beyond it counts as ending then (see
    /// [`extend_cooldown`](Backend::extend_cooldown)).
    pub max_ms: u64,
}

/// The answer to a multi-bucket take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiTake {
    /// Every bucket granted; wait the largest of their waits (and the
    /// cooldown's) before acting.
    Granted {
        /// How long to wait first, ms.
        wait_ms: u64,
    },
    /// Refused, nothing taken. `index` names the refusing bucket (the one
    /// with the largest hint), `None` the cooldown.
    Refused {
        /// Which bucket refused (`None`: the cooldown).
        index: Option<usize>,
        /// When to retry, ms.
        retry_after_ms: u64,
    },
    /// The bucket at `index` can never grant this cost. Nothing taken.
    ExceedsCapacity {
        /// Which bucket.
        index: usize,
    },
}

/// What [`Store::clear_provider`] cleared: a provider key's shared feedback
/// state as it was just before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderCleared {
    /// The end of the cooldown that was cleared, ms (`None`: none was live).
    pub cooldown_until_ms: Option<u64>,
    /// The effective rate just before, permille of the configured rate
    /// ([`aimd::FULL`](crate::aimd::FULL): it was at the full rate).
    pub effective_permille: u32,
}

/// Counts a session among its user's live sessions ([`Store::claim_session`]).
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The verified user who owns the session.
    pub user: &'a str,
    /// The session id as the client names it (unique within the user).
    pub session: &'a str,
    /// The lease TTL of the session operation that follows, ms (0 for a
    /// release): the claim lasts at least as long as that operation can
    /// keep the session's record.
    pub lease_ttl_ms: u64,
    /// Most live sessions the user may have; only a new claim is refused
    /// past it.
    pub max_sessions: u32,
    /// `true`: make a new claim if there is none (acquire). `false`: only
    /// extend an existing one (renew, release), so a request naming a
    /// session that does not exist claims nothing.
    pub create: bool,
}

/// The answer to a session claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The session is counted (newly, or its claim extended).
    Claimed {
        /// The user's live claims now.
        sessions: u32,
    },
    /// `create` was `false` and the session had no claim: nothing changed.
    Unclaimed {
        /// The user's live claims now.
        sessions: u32,
    },
    /// The user already has `max_sessions` live claims: nothing changed.
    Full {
        /// When the earliest claim ends, ms from now (at least 1).
        retry_after_ms: u64,
    },
}

/// Whether a fence is the session's latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceCheck {
    /// `fence == latest`.
    pub current: bool,
    /// The latest issued number (0: never issued).
    pub latest: u64,
}

/// The answer to a fenced append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Appended at position `index` (from 0).
    Appended {
        /// The record's position.
        index: u64,
    },
    /// Rejected: the fence is not the latest issued number.
    Stale {
        /// The latest issued number.
        latest: u64,
    },
}

/// One user's state, for inspection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserState {
    /// Turns available now (whole, refilled to now).
    pub turns_available: i64,
    /// Tokens available now (whole, refilled to now; negative is debt).
    pub tokens_available: i64,
    /// Live run leases: invocation id and expiry.
    pub leases: Vec<(String, u64)>,
    /// Tokens charged over the last minute (sliding-window estimate).
    pub tokens_last_minute: i64,
}

/// A user among the top token users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopUser {
    /// The user id.
    pub user: String,
    /// Tokens charged over the last minute (sliding-window estimate).
    pub tokens_last_minute: i64,
}

/// Tokens over the last 60 s from per-minute counts: this minute's plus the
/// share of the previous minute that still overlaps the window (rounded
/// down). Every store estimates "the last minute" with this one rule.
pub fn sliding_minute(current: i64, previous: i64, now_ms: u64) -> i64 {
    let into = i128::from(now_ms % 60_000);
    let prev = (i128::from(previous) * (60_000 - into)).div_euclid(60_000);
    current.saturating_add(prev as i64)
}

/// Orders users by tokens (most first, ties by user id), keeps those with
/// tokens > 0, at most `n`: the ranking every store's `top_users` answers.
pub fn rank_top(mut users: Vec<TopUser>, n: usize) -> Vec<TopUser> {
    users.retain(|t| t.tokens_last_minute > 0);
    users.sort_by(|a, b| {
        b.tokens_last_minute
            .cmp(&a.tokens_last_minute)
            .then_with(|| a.user.cmp(&b.user))
    });
    users.truncate(n);
    users
}

/// The [`Store`] shorthand methods: each a [`Store::call`] of the request
/// it builds from its arguments, whose [`Backend`] method of the same name
/// states the promise.
macro_rules! shorthand {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $reply:ty = $op:expr;)*) => {
        $(
            $(#[$doc])*
            #[doc = concat!("\n\nSee [`Backend::", stringify!($name), "`].")]
            // One lifetime names every borrowed argument, so the request
            // built from them has one; where there is one, it could be elided.
            #[allow(clippy::needless_lifetimes)]
            fn $name<'a>(
                &'a self,
                $($arg: $ty),*
            ) -> impl Future<Output = Result<$reply, StoreError>> + Send {
                self.call($op)
            }
        )*
    };
}

/// Where tollgate keeps its state, as its users and decorators see it: one
/// method, [`call`](Store::call), that runs any [`Op`]. A backend is one
/// by running the operation on itself ([`Op::apply`]); a decorator (the
/// failure policy's [`Failover`](crate::failover::Failover), a test's
/// fault injector) wraps another store's `call` once for every operation.
/// The other methods are shorthand for a call, the [`Backend`] method's
/// promise holding for each.
pub trait Store: Send + Sync + 'static {
    /// Runs `op`: one atomic step on the store of record, or what the
    /// decorator makes of it.
    fn call<O: Op>(&self, op: O) -> impl Future<Output = Result<O::Reply, StoreError>> + Send;

    /// How many decisions a fallback made so far instead of the store of
    /// record (the failure policy's local store,
    /// [`Failover`](crate::failover::Failover)); 0 for a store without
    /// one. A limiter keeps a refusal to answer locally only when this did
    /// not move while it was decided (SPEC §3): a fallback's refusal is not
    /// the store's.
    fn fallback_decisions(&self) -> u64 {
        0
    }

    shorthand! {
        /// Turn admission (SPEC §3): [`TurnRequest`].
        fn admit_turn(req: TurnRequest<'a>) -> TurnOutcome = req;
        /// [`ReleaseRun`].
        fn release_run(user: &'a str, invocation_id: &'a str) -> Release
            = ReleaseRun { user, invocation_id };
        /// [`RenewRun`].
        fn renew_run(user: &'a str, invocation_id: &'a str, ttl_ms: u64) -> Option<u64>
            = RenewRun { user, invocation_id, ttl_ms };
        /// A token reservation: [`ReserveRequest`].
        fn reserve_tokens(req: ReserveRequest<'a>) -> ReserveOutcome = req;
        /// A settle or refund: [`SettleRequest`].
        fn settle(req: SettleRequest<'a>) -> SettleOutcome = req;
        /// [`TakeMany`].
        fn take_many(takes: &'a [BucketTake<'a>], cooldown: Option<CooldownCheck<'a>>) -> MultiTake
            = TakeMany { takes, cooldown };
        /// [`FairTakeMany`].
        fn take_many_fair(
            takes: &'a [BucketTake<'a>],
            cooldown: Option<CooldownCheck<'a>>,
            fair: FairCheck<'a>
        ) -> MultiTake = FairTakeMany { takes, cooldown, fair };
        /// A single take: [`TakeRequest`].
        fn take_one(req: TakeRequest<'a>) -> TakeOutcome = req;
        /// [`ExtendCooldown`].
        fn extend_cooldown(key: &'a str, for_ms: u64, max_ms: u64) -> u64
            = ExtendCooldown { key, for_ms, max_ms };
        /// [`Aimd`].
        fn aimd(key: &'a str, params: AimdParams, throttled: bool) -> u32
            = Aimd { key, params, throttled };
        /// [`ReadFair`].
        fn read_fair(key: &'a str) -> Option<crate::fair::FairState> = ReadFair { key };
        /// [`ClearProvider`].
        fn clear_provider(cooldown: &'a str, aimd: &'a str, params: AimdParams) -> ProviderCleared
            = ClearProvider { cooldown, aimd, params };
        /// A session claim: [`ClaimRequest`].
        fn claim_session(req: ClaimRequest<'a>) -> Claim = req;
        /// [`AcquireSession`].
        fn session_acquire(session: &'a str, holder: &'a str, ttl_ms: u64) -> SessionAcquire
            = AcquireSession { session, holder, ttl_ms };
        /// [`RenewSession`].
        fn session_renew(session: &'a str, holder: &'a str, ttl_ms: u64) -> Option<SessionGrant>
            = RenewSession { session, holder, ttl_ms };
        /// [`ReleaseSession`].
        fn session_release(session: &'a str, holder: &'a str) -> bool
            = ReleaseSession { session, holder };
        /// [`CheckFence`].
        fn fence_check(session: &'a str, fence: u64) -> FenceCheck = CheckFence { session, fence };
        /// [`AppendFenced`].
        fn append_fenced(session: &'a str, fence: u64, record: &'a [u8]) -> AppendOutcome
            = AppendFenced { session, fence, record };
        /// [`ReadRecords`].
        fn read_records(session: &'a str, from: u64, limit: usize) -> Vec<Vec<u8>>
            = ReadRecords { session, from, limit };
        /// [`DeleteRecords`].
        fn delete_records(session: &'a str) -> u64 = DeleteRecords { session };
        /// [`ReadUser`].
        fn user_state(user: &'a str, turns: BucketSpec, tokens: BucketSpec) -> UserState
            = ReadUser { user, turns, tokens };
        /// [`BudgetSpent`].
        fn budget_spent(
            user: &'a str,
            checks: &'a [BudgetCheck],
            adjust: Option<(Period, BudgetAdjust<'a>)>,
        ) -> Vec<SpentNow>
            = BudgetSpent { user, checks, adjust };
        /// [`TopUsers`].
        fn top_users(n: usize) -> Vec<TopUser> = TopUsers { n };
        /// [`ResetUser`].
        fn reset_user(user: &'a str) -> bool = ResetUser { user };
        /// A reconciliation: [`ReconcileRequest`].
        fn reconcile(req: ReconcileRequest<'a>) -> Reconciled = req;
        /// A grouped session create: [`SessionCreate`].
        fn session_create(req: SessionCreate<'a>) -> SessionCreated = req;
        /// A grouped session append: [`SessionAppend`].
        fn session_append(req: SessionAppend<'a>) -> SessionAppended = req;
        /// A grouped session delete: [`SessionDelete`].
        fn session_delete(req: SessionDelete<'a>) -> u64 = req;
    }
}

/// A backend that keeps tollgate's state: one method per operation, each
/// one atomic step there (one lock in memory, one Lua script in Redis).
/// The in-memory store returns ready futures. An [`Op`] names the method
/// that runs it ([`Op::apply`]); a backend is a [`Store`] whose
/// [`call`](Store::call) is `op.apply(self)`.
///
/// Implementations must pass the conformance suite in `tollgate-testkit`.
pub trait Backend: Send + Sync + 'static {
    /// Turn admission (SPEC §3): turn bucket and run lease, all or nothing.
    fn admit_turn(
        &self,
        req: TurnRequest<'_>,
    ) -> impl Future<Output = Result<TurnOutcome, StoreError>> + Send;

    /// Release the run lease of `invocation_id` only.
    fn release_run(
        &self,
        user: &str,
        invocation_id: &str,
    ) -> impl Future<Output = Result<Release, StoreError>> + Send;

    /// Renew a live run lease to `now + ttl_ms`; `None`: the lease is lost.
    fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Reserve tokens before a model call, counting the call against the
    /// run's `max_llm_calls`.
    fn reserve_tokens(
        &self,
        req: ReserveRequest<'_>,
    ) -> impl Future<Output = Result<ReserveOutcome, StoreError>> + Send;

    /// Settle or refund a reservation, at most once.
    fn settle(
        &self,
        req: SettleRequest<'_>,
    ) -> impl Future<Output = Result<SettleOutcome, StoreError>> + Send;

    /// Take from several buckets and check a cooldown, all or nothing; the
    /// wait is the largest.
    fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> impl Future<Output = Result<MultiTake, StoreError>> + Send;

    /// [`take_many`](Self::take_many) behind a provider key's fair-sharing
    /// gate, in one step: [`FairTakeMany`].
    fn take_many_fair(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
        fair: FairCheck<'_>,
    ) -> impl Future<Output = Result<MultiTake, StoreError>> + Send;

    /// Take `cost` from one bucket now or take nothing (SPEC §2 with
    /// `max_wait` 0): no lease, no waiting. On a user's turn bucket it draws
    /// from the same budget as [`admit_turn`](Self::admit_turn).
    fn take_one(
        &self,
        req: TakeRequest<'_>,
    ) -> impl Future<Output = Result<TakeOutcome, StoreError>> + Send;

    /// Extend a cooldown to end at least `for_ms` after now, now read on
    /// the store's clock (so a replica's clock skew moves no cooldown):
    /// its end becomes `max(existing, now + for_ms)`, where an existing end
    /// beyond `now + max_ms` counts as `now + max_ms` (and `for_ms` is
    /// capped at `max_ms` too). Answers the cooldown's end after the change
    /// on the store's clock, 0 if none runs; `for_ms` 0 is the read of a
    /// cooldown.
    fn extend_cooldown(
        &self,
        key: &str,
        for_ms: u64,
        max_ms: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The AIMD state of a provider key (SPEC §5). With `throttled`, a
    /// per-minute 429 was seen now: the effective rate halves (at most once
    /// per decrease interval, never below the floor) and the increase clock
    /// restarts. Without, a read. Answers the effective rate now, in
    /// permille of the configured rate ([`aimd::FULL`](crate::aimd::FULL) when
    /// no 429 was seen).
    fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> impl Future<Output = Result<u32, StoreError>> + Send;

    /// A provider key's fair-sharing state as saved by its last permit
    /// ([`take_many_fair`](Self::take_many_fair)), or `None` when it has
    /// none or it has expired: a read, for the admin view (the clock is not
    /// advanced; [`fair::view`](crate::fair::view) does that).
    fn read_fair(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<crate::fair::FairState>, StoreError>> + Send;

    /// Clear a provider key's shared feedback state (SPEC §5), in one atomic
    /// step: the cooldown at `cooldown` is gone (permits no longer wait for
    /// it) and the AIMD state at `aimd` is back at the full rate, as if no
    /// 429 had been seen (the next one halves it again at once). The key's
    /// buckets are not touched: the provider's quota still holds. Answers
    /// what was live just before, read as [`extend_cooldown`] and
    /// [`aimd`](Self::aimd) read it (`params` only computes the rate it
    /// had). In Redis Cluster both keys must share one hash tag, as a
    /// provider key's keys do (`{provider:model}`).
    ///
    /// [`extend_cooldown`]: Self::extend_cooldown
    fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> impl Future<Output = Result<ProviderCleared, StoreError>> + Send;

    /// Count a session among its user's live sessions (SPEC §4), before the
    /// session operation itself: a claim of `session` by `user` lasts until
    /// at least `now + lease_ttl_ms + grace + `[`CLAIM_SLACK_MS`] (`grace`
    /// the store's session grace), which is at least as long as a
    /// following [`session_acquire`](Self::session_acquire),
    /// [`session_renew`](Self::session_renew) or
    /// [`session_release`](Self::session_release) with that TTL can keep
    /// the record of a session that holds no record. A claim never shortens.
    ///
    /// The claim lives with the user's keys (in Redis Cluster, the slot of
    /// `{user}`), the session in its own slot, so the two are separate
    /// steps: claiming first makes the count an over-estimate, never an
    /// under-estimate, of the user's live session records.
    fn claim_session(
        &self,
        req: ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Acquire a session lease for `holder` (SPEC §4).
    fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<SessionAcquire, StoreError>> + Send;

    /// Renew a session lease; `None`: `holder` does not hold it live.
    fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<SessionGrant>, StoreError>> + Send;

    /// Release a session lease; `false`: `holder` did not hold it live.
    fn session_release(
        &self,
        session: &str,
        holder: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether `fence` is the session's latest issued number.
    fn fence_check(
        &self,
        session: &str,
        fence: u64,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Append a record if `fence` is the latest issued number, checked and
    /// written in one step.
    fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send;

    /// Up to `limit` records of a session from position `from`, in order.
    fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Vec<u8>>, StoreError>> + Send;

    /// Delete a session's records; its fence counter is kept (numbers never
    /// go back) until retention ends. Answers how many were deleted.
    fn delete_records(&self, session: &str)
    -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// One user's buckets (refilled to now) and live leases.
    fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> impl Future<Output = Result<UserState, StoreError>> + Send;

    /// What `user` has spent in each budget of `checks`, in the window the
    /// store's clock picks: one per check, in its unit (tokens
    /// or micro-units), with the window's top-ups. With `adjust`, first
    /// applies the operator's change to that budget's window
    /// ([`Spend::adjust`](crate::spend::Spend::adjust)).
    fn budget_spent(
        &self,
        user: &str,
        checks: &[BudgetCheck],
        adjust: Option<(Period, BudgetAdjust<'_>)>,
    ) -> impl Future<Output = Result<Vec<SpentNow>, StoreError>> + Send;

    /// The `n` users with the most tokens charged over the last minute.
    fn top_users(&self, n: usize) -> impl Future<Output = Result<Vec<TopUser>, StoreError>> + Send;

    /// Clear a user's buckets (full again); leases and reservations stay.
    /// `true` if there was anything to clear.
    fn reset_user(&self, user: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Charge what a fallback decided for a user during an outage (SPEC
    /// §6), in one atomic step on the user's keys: first the ambiguous
    /// reserves and admissions are resolved (see [`ReconcileRequest`]),
    /// then the turns and the net tokens are charged. Buckets may go into
    /// debt (a level below zero): the user waits it off. Tokens also count
    /// in the user's per-minute usage.
    fn reconcile(
        &self,
        req: ReconcileRequest<'_>,
    ) -> impl Future<Output = Result<Reconciled, StoreError>> + Send;

    /// Create a session with its record 0 and writes to logs of its group
    /// ([`grouped`]), all in one step (SPEC §4): [`SessionCreated::Busy`]
    /// if a holder holds its lease live, [`SessionCreated::Exists`] if it
    /// has records (either way nothing is written); else a new fencing
    /// number is issued, held by no one (so a holder from before the create
    /// can no longer write), `record` becomes record 0 and every log is
    /// written. Like every operation on a session, it refreshes the
    /// session's retention whatever it answers.
    ///
    /// # Errors
    ///
    /// As every operation, and [`StoreErrorKind::Protocol`] if a log is
    /// not in the session's group ([`grouped::check_group`]).
    ///
    /// [`StoreErrorKind::Protocol`]: crate::StoreErrorKind::Protocol
    fn session_create(
        &self,
        req: SessionCreate<'_>,
    ) -> impl Future<Output = Result<SessionCreated, StoreError>> + Send;

    /// Append an event record to a session and write logs of its group, all
    /// in one step (SPEC §4), checked in this order:
    /// [`SessionAppended::Stale`] unless `fence` is the session's latest
    /// issued number, [`SessionAppended::Missing`] if the session has no
    /// records, [`SessionAppended::Repeated`] if it holds the event's `id`
    /// already; in each case nothing is written. Else the record is
    /// appended, the id remembered (for as long as the session's records)
    /// and every log written.
    ///
    /// # Errors
    ///
    /// As [`session_create`](Self::session_create).
    fn session_append(
        &self,
        req: SessionAppend<'_>,
    ) -> impl Future<Output = Result<SessionAppended, StoreError>> + Send;

    /// Delete a session's records and event ids and, if it had records,
    /// write logs of its group, all in one step (SPEC §4). The fence
    /// counter is kept, as by [`delete_records`](Self::delete_records).
    /// Answers how many records were deleted.
    ///
    /// # Errors
    ///
    /// As [`session_create`](Self::session_create).
    fn session_delete(
        &self,
        req: SessionDelete<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

#[cfg(test)]
mod tests;
