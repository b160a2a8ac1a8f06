//! Store operations as typed requests: each operation is one type that
//! names its reply, its name, what a replica does with it while the store
//! of record fails ([`Outage`], SPEC §6) and which [`Backend`] method runs
//! it. A [`Store`] has one method, [`Store::call`], so a decorator (the
//! failure policy's [`Failover`], a test's fault injector, any metrics or
//! tracing around the store) is written once for every operation, in the
//! spirit of tower's `Service<Request>`.
//!
//! Every request type here is `Copy` (it borrows what it names), so a
//! decorator may send it twice: to the store of record, and on a fault to
//! the replica's fallback.
//!
//! [`Failover`]: crate::failover::Failover

use std::future::Future;

use super::*;
use crate::failover::{Failover, scale_checks, scale_spec, scale_turn};
use crate::{BucketSpec, MemoryStore};

/// What a replica does with an operation while the store of record fails
/// (a transient fault, or the breaker open; SPEC §6). Stated once per
/// operation ([`Op::OUTAGE`]); [`Failover`] follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// Refused with the store's error (or `Unavailable` while the breaker
    /// is open), whatever the policy: nothing is decided without the store
    /// of record. Session leases and writes, session claims, budget reads,
    /// reconciliation and operator writes.
    FailClosed,
    /// Under `on_outage = "fallback"`, decided by the replica's fallback
    /// store on its share of each rate ([`Op::on_fallback`]); else refused.
    /// Nothing is owed to the store of record for it: provider permits and
    /// feedback, admin reads.
    Fallback,
    /// Decided by the fallback as [`Outage::Fallback`], and what it charged
    /// a user is owed to the store of record and charged there when it
    /// answers again ([`Store::reconcile`]).
    Owed,
    /// A close of something the store of record issued: kept in the
    /// replica's journal, answered `Pending`, and applied there when it
    /// answers again.
    Journalled,
}

/// One store operation: a request type with its reply.
pub trait Op: Copy + Send + Sync + Sized {
    /// What the store answers.
    type Reply: Send;
    /// The operation's name, in errors, metrics and events.
    const NAME: &'static str;
    /// What a replica does with it while the store of record fails.
    const OUTAGE: Outage;

    /// Runs the operation on a backend: one atomic step there.
    fn apply<B: Backend>(
        self,
        store: &B,
    ) -> impl Future<Output = Result<Self::Reply, StoreError>> + Send;

    /// Runs the operation on a replica's fallback store, which decides on
    /// `share` of each rate ([`Outage::Fallback`], [`Outage::Owed`]): the
    /// request with its rates (and budget limits) scaled. By default, the
    /// request as it is.
    fn on_fallback(
        self,
        fallback: &MemoryStore,
        share: f64,
    ) -> impl Future<Output = Result<Self::Reply, StoreError>> + Send {
        let _ = share;
        self.apply(fallback)
    }

    /// Runs the operation under the failure policy. By default it follows
    /// [`OUTAGE`](Self::OUTAGE) for [`Outage::FailClosed`] and
    /// [`Outage::Fallback`]; an operation that keeps books through an
    /// outage ([`Outage::Owed`], [`Outage::Journalled`]) writes its own,
    /// and one that does not fails closed.
    fn failover<S: Store + Clone>(
        self,
        failover: &Failover<S>,
    ) -> impl Future<Output = Result<Self::Reply, StoreError>> + Send {
        failover.by_policy(self)
    }
}

/// Releases the run lease of `invocation_id` only.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseRun<'a> {
    /// The user.
    pub user: &'a str,
    /// The run.
    pub invocation_id: &'a str,
}

/// Renews a live run lease to `now + ttl_ms`; `None`: the lease is lost.
#[derive(Debug, Clone, Copy)]
pub struct RenewRun<'a> {
    /// The user.
    pub user: &'a str,
    /// The run.
    pub invocation_id: &'a str,
    /// The new TTL, ms.
    pub ttl_ms: u64,
}

/// Takes from several buckets and checks a cooldown, all or nothing; the
/// wait is the largest.
#[derive(Debug, Clone, Copy)]
pub struct TakeMany<'a> {
    /// The buckets.
    pub takes: &'a [BucketTake<'a>],
    /// The cooldown, if any.
    pub cooldown: Option<CooldownCheck<'a>>,
}

/// [`TakeMany`] behind a provider key's fair-sharing gate (SPEC §5, *Fair
/// sharing*; [`crate::fair`]): the gate decides first, from the key's fair
/// state, whether the permit may wait (open), may take only what is free
/// now, or is refused; then the buckets and the cooldown as [`TakeMany`];
/// the fair state is saved with the answer, all in one step. A closed gate
/// refuses as `Refused { index: Some(0), .. }` (the pool's first bucket)
/// and takes nothing.
#[derive(Debug, Clone, Copy)]
pub struct FairTakeMany<'a> {
    /// The buckets (the pool's first).
    pub takes: &'a [BucketTake<'a>],
    /// The cooldown, if any.
    pub cooldown: Option<CooldownCheck<'a>>,
    /// The fair-sharing gate.
    pub fair: FairCheck<'a>,
}

/// A provider key's fair-sharing state and the permit's inputs.
#[derive(Debug, Clone, Copy)]
pub struct FairCheck<'a> {
    /// The state's key (`{provider:model}:fair`).
    pub key: &'a str,
    /// The permit's tenant, the weights and the pool's rate.
    pub take: crate::fair::FairTake<'a>,
}

/// Extends a cooldown to at least `for_ms` from now on the store's clock
/// (see [`Backend::extend_cooldown`]).
#[derive(Debug, Clone, Copy)]
pub struct ExtendCooldown<'a> {
    /// The cooldown's key.
    pub key: &'a str,
    /// How long it runs from now at least, ms (0: a read).
    pub for_ms: u64,
    /// The longest a cooldown of this key may run from now, ms: a stored
    /// one reaching further counts as ending then.
    pub max_ms: u64,
}

/// Reads or records a 429 in a provider key's AIMD state (see
/// [`Backend::aimd`]).
#[derive(Debug, Clone, Copy)]
pub struct Aimd<'a> {
    /// The state's key.
    pub key: &'a str,
    /// The provider's AIMD parameters.
    pub params: AimdParams,
    /// A per-minute 429 was seen now.
    pub throttled: bool,
}

/// Reads a provider key's fair-sharing state (see [`Backend::read_fair`]).
#[derive(Debug, Clone, Copy)]
pub struct ReadFair<'a> {
    /// The state's key (`{provider:model}:fair`).
    pub key: &'a str,
}

/// Clears a provider key's cooldown and AIMD state (see
/// [`Backend::clear_provider`]).
#[derive(Debug, Clone, Copy)]
pub struct ClearProvider<'a> {
    /// The cooldown's key.
    pub cooldown: &'a str,
    /// The AIMD state's key.
    pub aimd: &'a str,
    /// The provider's AIMD parameters.
    pub params: AimdParams,
}

/// Acquires a session lease for `holder` (SPEC §4).
#[derive(Debug, Clone, Copy)]
pub struct AcquireSession<'a> {
    /// The session.
    pub session: &'a str,
    /// Who asks.
    pub holder: &'a str,
    /// The lease's TTL, ms.
    pub ttl_ms: u64,
}

/// Renews a session lease; `None`: `holder` does not hold it live.
#[derive(Debug, Clone, Copy)]
pub struct RenewSession<'a> {
    /// The session.
    pub session: &'a str,
    /// Its holder.
    pub holder: &'a str,
    /// The new TTL, ms.
    pub ttl_ms: u64,
}

/// Releases a session lease; `false`: `holder` did not hold it live.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseSession<'a> {
    /// The session.
    pub session: &'a str,
    /// Its holder.
    pub holder: &'a str,
}

/// Whether `fence` is the session's latest issued number.
#[derive(Debug, Clone, Copy)]
pub struct CheckFence<'a> {
    /// The session.
    pub session: &'a str,
    /// The number checked.
    pub fence: u64,
}

/// Appends a record if `fence` is the latest issued number, checked and
/// written in one step.
#[derive(Debug, Clone, Copy)]
pub struct AppendFenced<'a> {
    /// The session.
    pub session: &'a str,
    /// The writer's fencing number.
    pub fence: u64,
    /// The record.
    pub record: &'a [u8],
}

/// Up to `limit` records of a session from position `from`, in order.
#[derive(Debug, Clone, Copy)]
pub struct ReadRecords<'a> {
    /// The session.
    pub session: &'a str,
    /// The first position read.
    pub from: u64,
    /// Most records answered.
    pub limit: usize,
}

/// Deletes a session's records (see [`Backend::delete_records`]).
#[derive(Debug, Clone, Copy)]
pub struct DeleteRecords<'a> {
    /// The session.
    pub session: &'a str,
}

/// One user's buckets (refilled to now) and live leases.
#[derive(Debug, Clone, Copy)]
pub struct ReadUser<'a> {
    /// The user.
    pub user: &'a str,
    /// The user's turn bucket.
    pub turns: BucketSpec,
    /// The user's token bucket.
    pub tokens: BucketSpec,
}

/// What a user has spent in each budget (see [`Backend::budget_spent`]).
#[derive(Debug, Clone, Copy)]
pub struct BudgetSpent<'a> {
    /// The user.
    pub user: &'a str,
    /// The budgets read.
    pub checks: &'a [BudgetCheck],
    /// An operator's change applied first.
    pub adjust: Option<(Period, BudgetAdjust<'a>)>,
}

/// The `n` users with the most tokens charged over the last minute.
#[derive(Debug, Clone, Copy)]
pub struct TopUsers {
    /// How many.
    pub n: usize,
}

/// Clears a user's buckets (full again); leases and reservations stay.
#[derive(Debug, Clone, Copy)]
pub struct ResetUser<'a> {
    /// The user.
    pub user: &'a str,
}

/// `impl Op` for a request: its reply, name, outage policy, the backend
/// method that runs it (given the backend and the request), and any
/// further items (an operation's scaling for the fallback, its own
/// books through an outage).
macro_rules! op {
    ($req:ty => $reply:ty, $name:literal, $outage:ident, |$b:ident, $r:ident| $apply:expr
     $(, { $($extra:tt)* })?) => {
        impl Op for $req {
            type Reply = $reply;
            const NAME: &'static str = $name;
            const OUTAGE: Outage = Outage::$outage;
            fn apply<B: Backend>(
                self,
                $b: &B,
            ) -> impl Future<Output = Result<$reply, StoreError>> + Send {
                let $r = self;
                $apply
            }
            $($($extra)*)?
        }
    };
}

/// The shape of an operation's own books through an outage: `failover`
/// calling the [`Failover`] function that keeps them.
macro_rules! books {
    ($reply:ty, $f:ident) => {
        fn failover<S: Store + Clone>(
            self,
            failover: &Failover<S>,
        ) -> impl Future<Output = Result<$reply, StoreError>> + Send {
            failover.$f(self)
        }
    };
}

/// The shape of an operation's fallback: the request with its rates
/// scaled to the fallback's share, then run there.
macro_rules! scaled {
    ($reply:ty, |$r:ident, $share:ident| $scaled:block) => {
        async fn on_fallback(
            self,
            fallback: &MemoryStore,
            $share: f64,
        ) -> Result<$reply, StoreError> {
            let $r = self;
            $scaled.apply(fallback).await
        }
    };
}

op!(TurnRequest<'_> => TurnOutcome, "admit_turn", Owed, |b, r| b.admit_turn(r), {
    async fn on_fallback(
        self,
        fallback: &MemoryStore,
        share: f64,
    ) -> Result<TurnOutcome, StoreError> {
        let budgets = scale_checks(self.budgets, share);
        TurnRequest {
            params: scale_turn(&self.params, share),
            budgets: &budgets,
            ..self
        }
        .apply(fallback)
        .await
    }
    books!(TurnOutcome, admit_owed);
});
op!(ReleaseRun<'_> => Release, "release_run", Journalled,
    |b, r| b.release_run(r.user, r.invocation_id), {
    books!(Release, release_journalled);
});
op!(RenewRun<'_> => Option<u64>, "renew_run", FailClosed,
    |b, r| b.renew_run(r.user, r.invocation_id, r.ttl_ms), {
    books!(Option<u64>, renew_local);
});
op!(ReserveRequest<'_> => ReserveOutcome, "reserve_tokens", Owed, |b, r| b.reserve_tokens(r), {
    async fn on_fallback(
        self,
        fallback: &MemoryStore,
        share: f64,
    ) -> Result<ReserveOutcome, StoreError> {
        let checks = self.budget.map(|b| scale_checks(b.checks, share));
        ReserveRequest {
            tokens: scale_spec(&self.tokens, share),
            budget: self.budget.map(|b| BudgetRequest {
                checks: checks.as_deref().unwrap_or_default(),
                // The fallback counts from a fresh window against its
                // share of each limit: its crossings would say nothing
                // of the user's real spend.
                alerts: &[],
                ..b
            }),
            ..self
        }
        .apply(fallback)
        .await
    }
    books!(ReserveOutcome, reserve_owed);
});
op!(SettleRequest<'_> => SettleOutcome, "settle", Journalled, |b, r| b.settle(r), {
    books!(SettleOutcome, settle_journalled);
});
/// `takes` with every rate scaled to the fallback's `share`.
fn scaled_takes<'a>(takes: &[BucketTake<'a>], share: f64) -> Vec<BucketTake<'a>> {
    takes
        .iter()
        .map(|t| BucketTake {
            spec: scale_spec(&t.spec, share),
            ..*t
        })
        .collect()
}

op!(TakeMany<'_> => MultiTake, "take_many", Fallback, |b, r| b.take_many(r.takes, r.cooldown), {
    async fn on_fallback(
        self,
        fallback: &MemoryStore,
        share: f64,
    ) -> Result<MultiTake, StoreError> {
        let takes = scaled_takes(self.takes, share);
        TakeMany {
            takes: &takes,
            ..self
        }
        .apply(fallback)
        .await
    }
});
op!(FairTakeMany<'_> => MultiTake, "take_many_fair", Fallback,
    |b, r| b.take_many_fair(r.takes, r.cooldown, r.fair), {
    async fn on_fallback(
        self,
        fallback: &MemoryStore,
        share: f64,
    ) -> Result<MultiTake, StoreError> {
        // The fair clock is paced by the pool's rate: the fallback's share
        // of it, as its buckets are.
        let f = self.fair.take;
        let pool = BucketSpec::new(f.amount, f.period_ms, f.capacity)
            .map_or((f.amount, f.capacity), |s| {
                let s = scale_spec(&s, share);
                (s.amount(), s.capacity())
            });
        let takes = scaled_takes(self.takes, share);
        FairTakeMany {
            takes: &takes,
            fair: FairCheck {
                take: crate::fair::FairTake {
                    amount: pool.0,
                    capacity: pool.1,
                    ..f
                },
                ..self.fair
            },
            ..self
        }
        .apply(fallback)
        .await
    }
});
op!(TakeRequest<'_> => TakeOutcome, "take_one", Owed, |b, r| b.take_one(r), {
    scaled!(TakeOutcome, |r, share| {
        TakeRequest {
            spec: scale_spec(&r.spec, share),
            ..r
        }
    });
    books!(TakeOutcome, take_one_owed);
});
op!(ReadUser<'_> => UserState, "user_state", Fallback,
    |b, r| b.user_state(r.user, r.turns, r.tokens), {
    scaled!(UserState, |r, share| {
        ReadUser {
            turns: scale_spec(&r.turns, share),
            tokens: scale_spec(&r.tokens, share),
            ..r
        }
    });
});
op!(ExtendCooldown<'_> => u64, "extend_cooldown", Fallback,
    |b, r| b.extend_cooldown(r.key, r.for_ms, r.max_ms));
op!(Aimd<'_> => u32, "aimd", Fallback,
    |b, r| b.aimd(r.key, r.params, r.throttled));
op!(ReadFair<'_> => Option<crate::fair::FairState>, "read_fair", Fallback, |b, r| b.read_fair(r.key));
op!(ClearProvider<'_> => ProviderCleared, "clear_provider", FailClosed,
    |b, r| b.clear_provider(r.cooldown, r.aimd, r.params), {
    books!(ProviderCleared, clear_both);
});
op!(ClaimRequest<'_> => Claim, "claim_session", FailClosed,
    |b, r| b.claim_session(r));
op!(AcquireSession<'_> => SessionAcquire, "session_acquire", FailClosed,
    |b, r| b.session_acquire(r.session, r.holder, r.ttl_ms));
op!(RenewSession<'_> => Option<SessionGrant>, "session_renew", FailClosed,
    |b, r| b.session_renew(r.session, r.holder, r.ttl_ms));
op!(ReleaseSession<'_> => bool, "session_release", FailClosed,
    |b, r| b.session_release(r.session, r.holder));
op!(CheckFence<'_> => FenceCheck, "fence_check", FailClosed,
    |b, r| b.fence_check(r.session, r.fence));
op!(AppendFenced<'_> => AppendOutcome, "append_fenced", FailClosed,
    |b, r| b.append_fenced(r.session, r.fence, r.record));
op!(ReadRecords<'_> => Vec<Vec<u8>>, "read_records", FailClosed,
    |b, r| b.read_records(r.session, r.from, r.limit));
op!(DeleteRecords<'_> => u64, "delete_records", FailClosed,
    |b, r| b.delete_records(r.session));
op!(BudgetSpent<'_> => Vec<SpentNow>, "budget_spent", FailClosed,
    |b, r| b.budget_spent(r.user, r.checks, r.adjust));
op!(TopUsers => Vec<TopUser>, "top_users", Fallback, |b, r| b.top_users(r.n));
op!(ResetUser<'_> => bool, "reset_user", Fallback, |b, r| b.reset_user(r.user));
op!(ReconcileRequest<'_> => Reconciled, "reconcile", FailClosed,
    |b, r| b.reconcile(r));
op!(SessionCreate<'_> => SessionCreated, "session_create", FailClosed,
    |b, r| b.session_create(r));
op!(SessionAppend<'_> => SessionAppended, "session_append", FailClosed,
    |b, r| b.session_append(r));
op!(SessionDelete<'_> => u64, "session_delete", FailClosed,
    |b, r| b.session_delete(r));

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation's name and stated outage policy.
    fn policies() -> Vec<(&'static str, Outage)> {
        fn p<O: Op>() -> (&'static str, Outage) {
            (O::NAME, O::OUTAGE)
        }
        vec![
            p::<TurnRequest<'_>>(),
            p::<ReleaseRun<'_>>(),
            p::<RenewRun<'_>>(),
            p::<ReserveRequest<'_>>(),
            p::<SettleRequest<'_>>(),
            p::<TakeMany<'_>>(),
            p::<FairTakeMany<'_>>(),
            p::<TakeRequest<'_>>(),
            p::<ExtendCooldown<'_>>(),
            p::<Aimd<'_>>(),
            p::<ReadFair<'_>>(),
            p::<ClearProvider<'_>>(),
            p::<ClaimRequest<'_>>(),
            p::<AcquireSession<'_>>(),
            p::<RenewSession<'_>>(),
            p::<ReleaseSession<'_>>(),
            p::<CheckFence<'_>>(),
            p::<AppendFenced<'_>>(),
            p::<ReadRecords<'_>>(),
            p::<DeleteRecords<'_>>(),
            p::<ReadUser<'_>>(),
            p::<BudgetSpent<'_>>(),
            p::<TopUsers>(),
            p::<ResetUser<'_>>(),
            p::<ReconcileRequest<'_>>(),
            p::<SessionCreate<'_>>(),
            p::<SessionAppend<'_>>(),
            p::<SessionDelete<'_>>(),
        ]
    }

    /// The fallback decides a fair permit on its share of the pool: its
    /// buckets and the fair clock's rate both scaled. Two tenants weighted
    /// 1:1 on a pool of 600/min with a burst of 60, the fallback's share a
    /// half (300/min, burst 30): after one permit of b's, a books 17 (its
    /// lead grows by a permit's 200,000 of virtual time each, up to one
    /// permit plus its half of the burst, 3,000,000) and the 18th is refused
    /// by the gate. (Paced at the whole pool's rate the gate would let a go
    /// on until the halved pool ran dry, after 29.)
    #[tokio::test]
    async fn the_fallback_paces_the_fair_clock_at_its_share() {
        let clock = crate::FakeClock::new(1_000_000);
        let mem = MemoryStore::new(clock.clone());
        let pool = BucketSpec::new(600, 60_000, 60).expect("spec");
        let takes = [BucketTake {
            key: "{p:m}:rpm",
            spec: pool,
            cost: 1,
            max_wait_ms: 4_000,
        }];
        let permit = |tenant| FairTakeMany {
            takes: &takes,
            cooldown: None,
            fair: FairCheck {
                key: "{p:m}:fair",
                take: crate::fair::FairTake {
                    tenant,
                    weights: &[("a", 1), ("b", 1)],
                    amount: pool.amount(),
                    period_ms: pool.period_ms(),
                    capacity: pool.capacity(),
                    window_ms: 4_000,
                },
            },
        };
        let granted = |r: Result<MultiTake, StoreError>| {
            matches!(r.expect("memory"), MultiTake::Granted { wait_ms: 0 })
        };
        assert!(granted(permit("a").on_fallback(&mem, 0.5).await));
        assert!(granted(permit("b").on_fallback(&mem, 0.5).await));
        let mut booked = 1;
        while granted(permit("a").on_fallback(&mem, 0.5).await) {
            booked += 1;
            assert!(booked < 60, "never refused");
        }
        assert_eq!(booked, 17);
    }

    /// docs/architecture.md's table of operations names each operation
    /// once, with the outage policy its `Op` states.
    #[test]
    fn the_architecture_table_states_each_operations_policy() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/architecture.md"
        ))
        .expect("docs/architecture.md");
        let mut documented = std::collections::BTreeMap::new();
        let table = doc
            .lines()
            .skip_while(|l| !l.starts_with("| operation | promise | outage |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        for row in table {
            let cells: Vec<&str> = row.split(" | ").collect();
            let outage = match cells[2].split_whitespace().next() {
                Some("closed") => Outage::FailClosed,
                Some("fallback") => Outage::Fallback,
                Some("owed") => Outage::Owed,
                Some("journalled") => Outage::Journalled,
                other => panic!("row {row}: outage {other:?}"),
            };
            for name in cells[0].split('`').skip(1).step_by(2) {
                assert!(
                    documented.insert(name.to_owned(), outage).is_none(),
                    "{name} is documented twice"
                );
            }
        }
        let stated: std::collections::BTreeMap<String, Outage> = policies()
            .into_iter()
            .map(|(name, outage)| (name.to_owned(), outage))
            .collect();
        assert_eq!(stated.len(), 28, "names are unique");
        assert_eq!(documented, stated);
    }
}
