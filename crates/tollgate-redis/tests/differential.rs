//! Differential test: [`RedisStore`] must answer exactly as [`MemoryStore`].
//!
//! Random operation sequences run against both stores, driven by one shared
//! [`FakeClock`] (starting at [`T0`]), and every answer must be identical.
//! The [`MemoryStore`] is the reference (the pure transitions of
//! `tollgate-core`, SPEC §2–4); the Redis side is the Lua scripts.
//!
//! Names come from small pools so operations collide: three users, four
//! invocation ids, four sessions (two of one group), three holders, two named buckets, a
//! cooldown and an AIMD state sharing one hash tag. Some ids carry `:`, `{`, `}`, `%` and `.`
//! to exercise key escaping and reservation-id parsing. Per case, a random
//! turn plan (bucket, cap, lease TTL, retry cap), two token bucket specs (a
//! plan reload now and then changes the spec, so levels are rescaled) and two
//! specs per named bucket (an AIMD-lowered rate) are drawn. The operations:
//! turn admission, run release and renewal, token reservation (including a
//! zero, a huge estimate, shadow mode and a small call cap), settle and
//! refund of granted or made-up reservations, multi-bucket takes (a key named
//! twice, an optional cooldown), single takes with no wait from a user's
//! turn bucket or a named bucket, cooldown extension (an end of 0 or in the past
//! changes nothing), AIMD reads and 429s (default parameters) and the clearing of
//! the cooldown and AIMD state together, session leases, fence
//! checks, fenced appends, record reads and deletion, the grouped session
//! writes (create, event append with an id, delete, each with writes to
//! another name of the group), user inspection and
//! reset, top users, and clock moves: mostly a few seconds forward, sometimes
//! minutes to an hour (past lease, bucket, session and reservation expiry),
//! rarely a step back. Sessions use a 10-minute retention on both sides.
//! After every operation, every Redis key of the case must have a TTL (idle
//! state costs no memory).
//!
//! Cases: 1,000 by default; `TOLLGATE_DIFF_CASES=10000` for more. On a
//! mismatch the case is shrunk and reported with the trace of every
//! operation, its time and its answer (and saved to
//! `differential.proptest-regressions`, replayed first on the next run).
//!
//! Not compared raw, each for a reason given where it is done:
//! - the lease list of [`UserState`] is compared as a set: its order is not
//!   part of the contract (memory keeps insertion order, Redis score order);
//! - `reclaimed` of a turn admission, a best-effort metric: memory may count
//!   fewer than Redis, never more;
//! - `top_users` is not compared for two minutes after the clock stepped
//!   back into an earlier minute;
//! - a step back never crosses the end of a run record's retention once
//!   passed (every reserve or settle time + `RESERVATION_RETENTION_MS` is a
//!   possible end): past it, memory forgets the record with the user's
//!   whole entry, or when it looks up any of the user's runs, and a Redis
//!   key stays until a script reads that very key. A step back across the
//!   end brings the Redis record back to life (the run's calls go on from
//!   its count) while memory starts the run afresh. Either is within the
//!   contract (a run idle for its retention may be forgotten); what stores
//!   answer when the clock stands still or moves forward is compared;
//! - inputs past what the Lua numbers hold exactly are kept out: cooldown
//!   ends past 2^53 ms, settled usage past the Limiter's bound, and debts
//!   that a period change would rescale past -2^53 token·ms (see
//!   [`Case::huge_actual`]). The stores differ there.
//!
//! And one thing about the harness: both stores decide on the fake clock's
//! logical expiries, but Redis also drops keys on its own wall clock. A
//! write made when a lease or cooldown has a few fake milliseconds left sets
//! a real TTL of those few milliseconds, which really elapse before the next
//! operation although the fake clock did not move. After each operation
//! that may set such a TTL the test raises it to [`TTL_FLOOR_MS`]. This only keeps keys Redis would drop by wall time; what the
//! scripts answer still depends on the fake clock alone, so it hides nothing
//! a fake-clock test could find (the real TTLs' lengths are not checked).

use std::fmt::Debug;
use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;

/// Alert thresholds every budgeted request carries: crossings are part of
/// what the stores answer.
const ALERTS: &[u8] = &[1, 33, 50, 80, 99, 100];
use proptest::test_runner::TestCaseError;
use tollgate_core::aimd::AimdParams;
use tollgate_core::bucket::BucketSpec;
use tollgate_core::calendar::{Period, Window};
use tollgate_core::fair::FairTake;
use tollgate_core::lease::TurnParams;
use tollgate_core::money::{Price, TokenSplit};
use tollgate_core::spend::{BudgetAdjust, BudgetCheck, BudgetRequest, BudgetUnit};
use tollgate_core::store::memory::MemoryConfig;
use tollgate_core::store::{
    BucketRef, BucketTake, ClaimRequest, CooldownCheck, FairCheck, ReservationId, ReserveOutcome,
    ReserveRequest, SettleRequest, TakeRequest, TurnRequest, UserState,
};
use tollgate_core::store::{
    LogWrite, RESERVATION_RETENTION_MS, SessionAppend, SessionCreate, SessionDelete,
};
use tollgate_core::{Clock, FakeClock, MemoryStore, Store, StoreError};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::T0;
use tollgate_testkit::redis::{shared_url, unique_prefix};

const USERS: [&str; 3] = ["u0", "u1", "u:{2}%"];

/// A top-up's amount and the index of its request id in `TOP_UP_IDS`.
type TopUpArgs = (Qty, Option<usize>);

/// Top-up request ids: a repeat of one within a day grants nothing.
const TOP_UP_IDS: [&str; 3] = ["top-1", "top-2", "top:{3} é"];
const INVOCATIONS: [&str; 4] = ["i0", "i1", "i.2", "r:{3}"];
/// Two plain session names and two grouped ones (group `g:{%`,
/// `tollgate_core::store::grouped`), each the other's log in grouped writes.
const SESSIONS: [&str; 4] = ["s0", "s:{1}", "@4:g:{%/s2", "@4:g:{%/l:3}"];
/// Session ids a user claims (more than the largest cap drawn).
const CLAIMED: [&str; 4] = ["c0", "c1", "c:{2}%", "c3"];
const HOLDERS: [&str; 3] = ["h0", "h1", "h2"];
const BUCKETS: [&str; 2] = ["{p}:a", "{p}:b"];
const COOLDOWN: &str = "{p}:cd";
/// The cooldown ceiling permits read it under (extensions draw theirs).
const COOLDOWN_MAX_MS: u64 = 60_000;
/// A provider key's fair-sharing state, and the tenants permits name.
const FAIR: &str = "{p}:fair";
/// (The last is held under `{others}`: a control character.)
const TENANTS: [&str; 5] = ["t0", "t1", "t2", "{none}", "t\u{1}"];
const AIMD: &str = "{p}:aimd";
/// Session retention on both sides: short enough that the long clock moves
/// cross it.
const SESSION_RETENTION_MS: u64 = 600_000;
/// Session grace on both sides: shorter than the retention, so sessions
/// without records are forgotten first.
const SESSION_GRACE_MS: u64 = 120_000;
/// Real TTLs of lease sets and cooldowns under this are raised to it after
/// each operation that may set them (see the module docs).
const TTL_FLOOR_MS: i64 = 60_000;

// ----- the operations ----------------------------------------------------------

/// A quantity relative to a bound (twice a capacity or a period), shrinking
/// toward 0: up to a sixteenth of it, up to all of it, or a huge one.
#[derive(Debug, Clone, Copy)]
enum Qty {
    Low(u32),
    Rel(u32),
    Huge,
}

impl Qty {
    fn resolve(self, bound: u64, huge: u64) -> u64 {
        match self {
            Qty::Low(x) => u64::from(x) % (bound / 16 + 1),
            Qty::Rel(x) => u64::from(x) % (bound + 1),
            Qty::Huge => huge,
        }
    }
}

/// A TTL: 0 and `u64::MAX` are clamped by both stores.
#[derive(Debug, Clone, Copy)]
enum Ttl {
    Ms(u64),
    Zero,
    Max,
}

impl Ttl {
    fn ms(self) -> u64 {
        match self {
            Ttl::Ms(ms) => ms,
            Ttl::Zero => 0,
            Ttl::Max => u64::MAX,
        }
    }
}

/// Which reservation a settle or refund names.
#[derive(Debug, Clone, Copy)]
enum Rid {
    /// One granted earlier (index modulo their number), for its own user or
    /// (`Some`) another.
    Granted { pick: usize, user: Option<usize> },
    /// Made up: may never have been granted.
    MadeUp {
        user: usize,
        invocation: usize,
        call: u64,
    },
}

/// A cooldown's extension: how long from now, and the key's ceiling.
#[derive(Debug, Clone, Copy)]
struct Until {
    for_ms: u64,
    max_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct TakeOp {
    key: usize,
    /// The key's other spec (an AIMD-lowered rate).
    alt: bool,
    cost: Qty,
    max_wait: Qty,
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    StepBack(u64),
    Admit {
        user: usize,
        invocation: usize,
        /// The budgets refuse the turn when spent (`deny_turns`).
        budget: Option<BudgetUse>,
    },
    Release {
        user: usize,
        invocation: usize,
    },
    Renew {
        user: usize,
        invocation: usize,
        ttl: Ttl,
    },
    Reserve {
        user: usize,
        invocation: usize,
        plan: usize,
        estimate: Qty,
        max_wait: Qty,
        max_calls: u64,
        shadow: bool,
        budget: Option<BudgetUse>,
    },
    Settle {
        rid: Rid,
        plan: usize,
        /// `None`: a refund.
        actual: Option<Qty>,
        budget: Option<BudgetUse>,
    },
    TakeMany {
        takes: Vec<TakeOp>,
        /// The cooldown's max wait, if checked.
        cooldown: Option<Qty>,
    },
    /// `TakeMany` behind the fair-sharing gate: `tenant` (an index in
    /// `TENANTS`), the weights configured now (`None`: unconfigured), the
    /// window (the key's max wait).
    FairTake {
        takes: Vec<TakeOp>,
        cooldown: Option<Qty>,
        tenant: usize,
        weights: [Option<u32>; 3],
        window: u64,
    },
    /// A single take with no wait: a user's turn bucket, or a named one.
    TakeOne {
        /// `Some(user)`: the user's turn bucket; `None`: `key`.
        user: Option<usize>,
        key: usize,
        alt: bool,
        cost: Qty,
    },
    ExtendCooldown(Until),
    /// The AIMD state: a read, or (`throttled`) a 429 seen now.
    Aimd {
        throttled: bool,
    },
    /// Clears the cooldown and the AIMD state together.
    ClearProvider,
    /// A user's budgets read, after an operator's reset or top-up of the
    /// `period`-th (modulo their number) with `adjust` (a top-up: its
    /// amount and the index of its request id in `TOP_UP_IDS`, if any).
    BudgetSpent {
        user: usize,
        budget: BudgetUse,
        adjust: Option<(usize, Option<TopUpArgs>)>,
    },
    /// Counts a session against its user's cap.
    ClaimSession {
        user: usize,
        session: usize,
        ttl: Ttl,
        cap: u32,
        create: bool,
    },
    SessionAcquire {
        session: usize,
        holder: usize,
        ttl: Ttl,
    },
    SessionRenew {
        session: usize,
        holder: usize,
        ttl: Ttl,
    },
    SessionRelease {
        session: usize,
        holder: usize,
    },
    /// Checks `latest + offset` (the memory store's latest).
    FenceCheck {
        session: usize,
        offset: i8,
    },
    Append {
        session: usize,
        offset: i8,
        record: u8,
    },
    Read {
        session: usize,
        from: u64,
        limit: usize,
    },
    Delete {
        session: usize,
    },
    /// A grouped create; `logs` are writes to the other grouped name (none
    /// for a plain session).
    GroupCreate {
        session: usize,
        record: u8,
        logs: Vec<Option<u8>>,
    },
    /// A grouped append at `latest + offset`, with event id `id`.
    GroupAppend {
        session: usize,
        offset: i8,
        id: Option<u8>,
        record: u8,
        logs: Vec<Option<u8>>,
    },
    GroupDelete {
        session: usize,
        logs: Vec<Option<u8>>,
    },
    UserState {
        user: usize,
        plan: usize,
    },
    ResetUser {
        user: usize,
    },
    TopUsers {
        n: usize,
    },
}

/// One test case: the plans and the operations.
#[derive(Debug, Clone)]
struct Case {
    turns: TurnParams,
    /// The user's budgets (no two of one period) and the call's price.
    budgets: Vec<BudgetSpec>,
    price: Option<Price>,
    /// Token bucket specs: `[0]` the plan, `[1]` a reloaded plan.
    tokens: [BucketSpec; 2],
    /// Per named bucket: its spec and an alternative one.
    named: [[BucketSpec; 2]; 2],
    ops: Vec<Op>,
}

impl Case {
    /// The "huge" actual usage of a settle under `plan`.
    ///
    /// At most what the Limiter lets through (`actual × period ≤ 2^53`;
    /// larger is an invalid request): past it Redis clamps `actual` to 2^53
    /// before subtracting the estimate where memory clamps the level after,
    /// so at period 1 the balances differ by one.
    ///
    /// When a plan reload changes the token period, a 64th of that, so no
    /// debt can come near -2^53 token·ms: rescaling such a debt to a longer
    /// period leaves it past -2^53, which Redis clamps before the refill
    /// (prelude.lua `refill`) and memory after it (`bucket::refill`), so
    /// the refill is lost in Redis and kept in memory. Lift this once the
    /// two clamp in the same place.
    fn huge_actual(&self, plan: usize) -> u64 {
        let [a, b] = self.tokens;
        if a.period_ms() == b.period_ms() {
            (1 << 53) / self.tokens[plan].period_ms()
        } else {
            (1 << 53) / (64 * a.period_ms().max(b.period_ms()))
        }
    }
}

// ----- strategies ----------------------------------------------------------------

/// A valid spec whose scaled values stay far below 2^53.
fn spec() -> impl Strategy<Value = BucketSpec> {
    (1u64..=5_000, 1u64..=120_000, 1u64..=50_000)
        .prop_map(|(a, p, c)| BucketSpec::new(a, p, c).expect("valid spec"))
}

/// Turn buckets are mostly small (a few turns per minute), so they run dry.
fn turn_spec() -> impl Strategy<Value = BucketSpec> {
    prop_oneof![
        3 => (1u64..=20, 1_000u64..=120_000, 1u64..=10)
            .prop_map(|(a, p, c)| BucketSpec::new(a, p, c).expect("valid spec")),
        1 => spec(),
    ]
}

fn turn_params() -> impl Strategy<Value = TurnParams> {
    (turn_spec(), 1u32..=4, 1u64..=200_000, 1u64..=5_000).prop_map(
        |(turns, max_runs, lease_ttl_ms, concurrency_retry_ms)| TurnParams {
            turns,
            max_runs,
            lease_ttl_ms,
            concurrency_retry_ms,
        },
    )
}

fn qty() -> impl Strategy<Value = Qty> {
    prop_oneof![
        6 => any::<u32>().prop_map(Qty::Low),
        6 => any::<u32>().prop_map(Qty::Rel),
        1 => Just(Qty::Huge),
    ]
}

fn ttl() -> impl Strategy<Value = Ttl> {
    prop_oneof![
        10 => (1u64..=200_000).prop_map(Ttl::Ms),
        1 => Just(Ttl::Zero),
        1 => Just(Ttl::Max),
    ]
}

fn plan() -> impl Strategy<Value = usize> {
    prop_oneof![9 => Just(0usize), 1 => Just(1usize)]
}

fn user() -> impl Strategy<Value = usize> {
    0..USERS.len()
}

fn invocation() -> impl Strategy<Value = usize> {
    0..INVOCATIONS.len()
}

fn session() -> impl Strategy<Value = usize> {
    0..SESSIONS.len()
}

fn holder() -> impl Strategy<Value = usize> {
    0..HOLDERS.len()
}

fn rid() -> impl Strategy<Value = Rid> {
    prop_oneof![
        8 => (any::<usize>(), prop_oneof![5 => Just(None), 1 => user().prop_map(Some)])
            .prop_map(|(pick, user)| Rid::Granted { pick, user }),
        2 => (user(), invocation(), 0u64..5)
            .prop_map(|(user, invocation, call)| Rid::MadeUp { user, invocation, call }),
    ]
}

/// Mostly the latest fence, else one or two before it, or the next one.
/// The log writes of a grouped op: up to two (a record, or a refresh).
fn group_logs() -> impl Strategy<Value = Vec<Option<u8>>> {
    prop::collection::vec(prop::option::of(any::<u8>()), 0..=2)
}

fn fence_offset() -> impl Strategy<Value = i8> {
    prop_oneof![6 => Just(0i8), 2 => -2i8..=1]
}

fn until() -> impl Strategy<Value = Until> {
    (
        prop_oneof![
            8 => 0u64..=200_000,
            1 => Just(0u64),
            1 => Just(u64::MAX),
        ],
        prop_oneof![Just(10_000u64), Just(COOLDOWN_MAX_MS), Just(86_400_000)],
    )
        .prop_map(|(for_ms, max_ms)| Until { for_ms, max_ms })
}

fn take_op() -> impl Strategy<Value = TakeOp> {
    (0..BUCKETS.len(), prop::bool::weighted(0.15), qty(), qty()).prop_map(
        |(key, alt, cost, max_wait)| TakeOp {
            key,
            alt,
            cost,
            max_wait,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        14 => (0u64..=5_000).prop_map(Op::Advance),
        1 => (60_000u64..=700_000).prop_map(Op::Advance),
        1 => (700_000u64..=4_000_000).prop_map(Op::Advance),
        // About a day: top-up ids are forgotten after one.
        1 => (86_300_000u64..=86_500_000).prop_map(Op::Advance),
        1 => (1u64..=5_000).prop_map(Op::StepBack),
        10 => (user(), invocation(), budget_use())
            .prop_map(|(user, invocation, budget)| Op::Admit { user, invocation, budget }),
        4 => (user(), invocation()).prop_map(|(user, invocation)| Op::Release { user, invocation }),
        4 => (user(), invocation(), ttl())
            .prop_map(|(user, invocation, ttl)| Op::Renew { user, invocation, ttl }),
        10 => (
            (user(), invocation(), plan()),
            prop_oneof![1 => Just(Qty::Low(0)), 10 => qty()],
            qty(),
            prop_oneof![3 => Just(500u64), 1 => 0u64..=3],
            prop::bool::weighted(0.2),
            budget_use(),
        )
            .prop_map(
                |((user, invocation, plan), estimate, max_wait, max_calls, shadow, budget)| {
                    Op::Reserve {
                        user,
                        invocation,
                        plan,
                        estimate,
                        max_wait,
                        max_calls,
                        shadow,
                        budget,
                    }
                },
            ),
        8 => (
            rid(),
            plan(),
            prop_oneof![3 => qty().prop_map(Some), 1 => Just(None)],
            budget_use(),
        )
            .prop_map(|(rid, plan, actual, budget)| Op::Settle {
                rid,
                plan,
                actual,
                budget,
            }),
        8 => (
            prop_oneof![
                1 => prop::collection::vec(take_op(), 0..=0),
                8 => prop::collection::vec(take_op(), 1..=3),
            ],
            prop_oneof![1 => Just(None), 1 => qty().prop_map(Some)],
        )
            .prop_map(|(takes, cooldown)| Op::TakeMany { takes, cooldown }),
        8 => (
            prop::collection::vec(take_op(), 1..=2),
            prop_oneof![3 => Just(None), 1 => qty().prop_map(Some)],
            0..TENANTS.len(),
            prop::array::uniform3(prop_oneof![1 => Just(None), 3 => (1u32..=5).prop_map(Some)]),
            prop_oneof![Just(0u64), Just(500), Just(4_000)],
        )
            .prop_map(|(takes, cooldown, tenant, weights, window)| Op::FairTake {
                takes,
                cooldown,
                tenant,
                weights,
                window,
            }),
        5 => (
            prop_oneof![1 => Just(None), 1 => user().prop_map(Some)],
            0..BUCKETS.len(),
            prop::bool::weighted(0.15),
            prop_oneof![1 => Just(Qty::Low(0)), 10 => qty()],
        )
            .prop_map(|(user, key, alt, cost)| Op::TakeOne { user, key, alt, cost }),
        3 => until().prop_map(Op::ExtendCooldown),
        3 => prop::bool::weighted(0.6).prop_map(|throttled| Op::Aimd { throttled }),
        1 => Just(Op::ClearProvider),
        5 => (user(), 0..CLAIMED.len(), ttl(), 1u32..=3, prop::bool::weighted(0.7))
            .prop_map(|(user, session, ttl, cap, create)| Op::ClaimSession {
                user,
                session,
                ttl,
                cap,
                create,
            }),
        6 => (session(), holder(), ttl())
            .prop_map(|(session, holder, ttl)| Op::SessionAcquire { session, holder, ttl }),
        3 => (session(), holder(), ttl())
            .prop_map(|(session, holder, ttl)| Op::SessionRenew { session, holder, ttl }),
        3 => (session(), holder())
            .prop_map(|(session, holder)| Op::SessionRelease { session, holder }),
        3 => (session(), fence_offset())
            .prop_map(|(session, offset)| Op::FenceCheck { session, offset }),
        6 => (session(), fence_offset(), any::<u8>())
            .prop_map(|(session, offset, record)| Op::Append { session, offset, record }),
        3 => (
            session(),
            prop_oneof![6 => Just(0u64), 4 => 0u64..=4, 1 => Just(u64::MAX)],
            prop_oneof![8 => 0usize..=4, 1 => Just(usize::MAX)],
        )
            .prop_map(|(session, from, limit)| Op::Read { session, from, limit }),
        2 => session().prop_map(|session| Op::Delete { session }),
        3 => (session(), any::<u8>(), group_logs())
            .prop_map(|(session, record, logs)| Op::GroupCreate { session, record, logs }),
        6 => (
            session(),
            fence_offset(),
            prop_oneof![1 => Just(None), 4 => (0u8..4).prop_map(Some)],
            any::<u8>(),
            group_logs(),
        )
            .prop_map(|(session, offset, id, record, logs)| Op::GroupAppend {
                session,
                offset,
                id,
                record,
                logs,
            }),
        1 => (session(), group_logs())
            .prop_map(|(session, logs)| Op::GroupDelete { session, logs }),
        5 => (user(), plan()).prop_map(|(user, plan)| Op::UserState { user, plan }),
        2 => user().prop_map(|user| Op::ResetUser { user }),
        3 => (0usize..=4).prop_map(|n| Op::TopUsers { n }),
        3 => (
            user(),
            budget_use().prop_filter_map("named budgets", |b| b),
            prop_oneof![
                2 => Just(None),
                1 => (
                    0usize..3,
                    prop_oneof![
                        1 => Just(None),
                        3 => (qty(), proptest::option::of(0..TOP_UP_IDS.len())).prop_map(Some),
                    ],
                )
                    .prop_map(Some),
            ],
        )
            .prop_map(|(user, budget, adjust)| Op::BudgetSpent { user, budget, adjust }),
    ]
}

/// The token plan and a reloaded one: half the time with the same period
/// (amount and capacity change), else any.
fn token_specs() -> impl Strategy<Value = [BucketSpec; 2]> {
    (spec(), spec(), any::<bool>()).prop_map(|(a, b, same_period)| {
        if same_period {
            [
                a,
                BucketSpec::new(b.amount(), a.period_ms(), b.capacity()).expect("valid spec"),
            ]
        } else {
            [a, b]
        }
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        turn_params(),
        token_specs(),
        [[spec(), spec()], [spec(), spec()]],
        prop::collection::vec(op(), 20..=40),
        budget_specs(),
        prop_oneof![8 => price().prop_map(Some), 1 => Just(None)],
    )
        .prop_map(|(turns, tokens, named, ops, mut budgets, price)| {
            // A limit of a few calls' worth, so reserves run a budget dry:
            // `limit` is drawn as eighths of the token capacity (of its
            // cost at the higher price, for money), or as itself when huge.
            for b in &mut budgets {
                if b.limit <= 64 {
                    let cap = tokens[0].capacity();
                    let per = match (b.unit, price) {
                        (BudgetUnit::Tokens, _) => cap,
                        (BudgetUnit::Cost, Some(p)) => {
                            (cap.saturating_mul(p.input.max(p.output)) / 1_000_000).max(1)
                        }
                        (BudgetUnit::Cost, None) => 1,
                    };
                    b.limit = (per.saturating_mul(b.limit) / 8).clamp(1, 1 << 53);
                }
            }
            Case {
                turns,
                budgets,
                price,
                tokens,
                named,
                ops,
            }
        })
}

/// A budget of a case: windows of `len_ms` (short, so clock moves cross
/// them) cut from the epoch, as a calendar would cut days.
#[derive(Debug, Clone, Copy)]
struct BudgetSpec {
    period: Period,
    unit: BudgetUnit,
    limit: u64,
    len_ms: u64,
}

/// How an operation names the budgets: the caller's clock `skew` ms behind
/// the store's (so the store sometimes picks the next window), and a token
/// split.
#[derive(Debug, Clone, Copy)]
struct BudgetUse {
    skew: u64,
    split: Option<(u32, u32, u32)>,
}

fn budget_specs() -> impl Strategy<Value = Vec<BudgetSpec>> {
    let one = |period| {
        (
            prop::bool::ANY,
            prop_oneof![6 => 1u64..=64, 1 => 65u64..=(1 << 53)],
            prop_oneof![1 => 1_000u64..=10_000, 3 => 60_000u64..=3_600_000],
        )
            .prop_map(move |(cost, limit, len_ms)| BudgetSpec {
                period,
                unit: if cost {
                    BudgetUnit::Cost
                } else {
                    BudgetUnit::Tokens
                },
                limit,
                len_ms,
            })
    };
    (
        prop::option::weighted(0.6, one(Period::Daily)),
        prop::option::weighted(0.3, one(Period::Weekly)),
        prop::option::weighted(0.3, one(Period::Monthly)),
    )
        .prop_map(|(d, w, m)| [d, w, m].into_iter().flatten().collect())
}

fn price() -> impl Strategy<Value = Price> {
    let micros = prop_oneof![8 => 0u64..=2_000_000, 1 => 0u64..=(1 << 53)];
    (micros.clone(), micros.clone(), micros).prop_map(|(input, output, cached_input)| Price {
        input,
        output,
        cached_input,
    })
}

fn budget_use() -> impl Strategy<Value = Option<BudgetUse>> {
    prop_oneof![
        1 => Just(None),
        3 => (
            prop_oneof![4 => Just(0u64), 1 => 0u64..=20_000],
            prop_oneof![
                2 => Just(None),
                3 => (0u32..=5_000, 0u32..=5_000, 0u32..=5_000).prop_map(Some),
                1 => (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(Some),
            ],
        )
            .prop_map(|(skew, split)| Some(BudgetUse { skew, split })),
    ]
}

// ----- running a case -----------------------------------------------------------

/// The case's budgets as a caller whose clock is `skew` ms behind `now`
/// names them (none without `budget`).
fn checks(case: &Case, now: u64, budget: Option<BudgetUse>) -> Vec<BudgetCheck> {
    let Some(b) = budget else {
        return Vec::new();
    };
    let at = now.saturating_sub(b.skew);
    case.budgets
        .iter()
        .map(|s| {
            let start = at - at % s.len_ms;
            BudgetCheck {
                period: s.period,
                unit: s.unit,
                limit: s.limit,
                current: Window {
                    start_ms: start,
                    end_ms: start + s.len_ms,
                },
                next: Window {
                    start_ms: start + s.len_ms,
                    end_ms: start + 2 * s.len_ms,
                },
                fallback: false,
            }
        })
        .collect()
}

fn split(budget: Option<BudgetUse>) -> Option<TokenSplit> {
    let (i, o, c) = budget?.split?;
    Some(TokenSplit::new(i.into(), o.into(), c.into()))
}

/// Both stores on one clock, and the trace so far.
struct Run<'a> {
    case: &'a Case,
    clock: FakeClock,
    mem: MemoryStore,
    redis: RedisStore,
    /// A plain connection for the TTL floor.
    raw: redis::aio::MultiplexedConnection,
    /// This case's Redis keys.
    keys: Keys,
    floor_script: redis::Script,
    log: Vec<String>,
    /// Reservations granted so far (and shadow ones): owner and id.
    granted: Vec<(usize, ReservationId)>,
    /// The latest time the clock has shown.
    latest: u64,
    /// `top_users` is compared from this minute on (see there).
    top_users_from_minute: u64,
    /// Where a run record written by a reserve or settle so far may end its
    /// retention: a step back never crosses one of these once passed (see
    /// the module docs).
    run_ends: Vec<u64>,
}

/// The records of a grouped op's log writes: none
/// for a plain session (a plain name has no other name in its group).
fn group_writes(session: usize, logs: &[Option<u8>]) -> Vec<Option<[u8; 2]>> {
    if tollgate_core::store::grouped::split_grouped(SESSIONS[session]).is_none() {
        return Vec::new();
    }
    logs.iter().map(|r| r.map(|r| [b'l', r])).collect()
}

/// The log writes, each to the other grouped name of [`SESSIONS`].
fn log_writes(session: usize, recs: &[Option<[u8; 2]>]) -> Vec<LogWrite<'_>> {
    let other = if session == 2 {
        SESSIONS[3]
    } else {
        SESSIONS[2]
    };
    recs.iter()
        .map(|r| LogWrite {
            log: other,
            record: r.as_ref().map(|r| &r[..]),
        })
        .collect()
}

fn fail(what: impl Debug) -> TestCaseError {
    TestCaseError::fail(format!("{what:?}"))
}

/// The Redis keys of one case (their layout is crates/tollgate-redis/src/keys.rs).
struct Keys {
    /// Every key a store can write for the pools above, except the top-users
    /// minutes (whose real TTL is a fixed 3 minutes).
    all: Vec<String>,
    /// Each user's run lease set.
    leases: Vec<String>,
    /// The cooldown.
    cooldown: String,
    /// The AIMD state.
    aimd: String,
}

/// The only keys whose real TTL can be short: a lease set expires with its
/// latest lease, a cooldown at its end and an AIMD state when it is back at
/// the full rate (10 s after a 429 at the least), while every other key lives at
/// least a minute (buckets and usage), the session retention (sessions) or
/// the reservation retention (runs).
fn case_keys(prefix: &str) -> Keys {
    fn esc(id: &str) -> String {
        id.replace('%', "%25")
            .replace('{', "%7B")
            .replace('}', "%7D")
            .replace(':', "%3A")
    }
    let mut keys = Vec::new();
    let mut leases = Vec::new();
    for u in USERS {
        let u = esc(u);
        leases.push(format!("{prefix}:lease:{{{u}}}"));
        for kind in ["turn2", "tok2", "lease", "invs", "sess", "bud"] {
            keys.push(format!("{prefix}:{kind}:{{{u}}}"));
        }
        for i in INVOCATIONS {
            keys.push(format!("{prefix}:inv:{{{u}}}:{}", esc(i)));
        }
    }
    for s in SESSIONS {
        let (tag, rest) = match tollgate_core::store::grouped::split_grouped(s) {
            Some((group, rest)) => (esc(group), format!(":{}", esc(rest))),
            None => (esc(s), String::new()),
        };
        for kind in ["sl", "sr", "si"] {
            keys.push(format!("{prefix}:{kind}:{{{tag}}}{rest}"));
        }
    }
    for k in BUCKETS {
        keys.push(format!("{prefix}:k2:{k}"));
    }
    for k in [COOLDOWN, AIMD, FAIR] {
        keys.push(format!("{prefix}:k:{k}"));
    }
    Keys {
        all: keys,
        leases,
        cooldown: format!("{prefix}:k:{COOLDOWN}"),
        aimd: format!("{prefix}:k:{AIMD}"),
    }
}

/// Raises real TTLs under ARGV[1] to it; answers the keys that have no TTL
/// at all (every key must expire, or idle users would cost memory).
const TTL_FLOOR_SCRIPT: &str = r"
local persistent = {}
for _, k in ipairs(KEYS) do
  local t = redis.call('PTTL', k)
  if t == -1 then
    persistent[#persistent + 1] = k
  elseif t >= 0 and t < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', k, ARGV[1])
  end
end
return persistent
";

impl Run<'_> {
    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn line(&self, what: &str) -> String {
        format!("#{:<2} T0+{:<8} {what}", self.log.len(), self.now() - T0)
    }

    /// Both answers must be `Ok` and equal.
    fn same<T: PartialEq + Debug>(
        &mut self,
        what: String,
        m: Result<T, StoreError>,
        r: Result<T, StoreError>,
    ) -> Result<T, TestCaseError> {
        self.agree(what, m, r, |m, r| m == r)
    }

    /// Both answers must be `Ok` and `agree(memory, redis)`.
    fn agree<T: Debug>(
        &mut self,
        what: String,
        m: Result<T, StoreError>,
        r: Result<T, StoreError>,
        agree: impl FnOnce(&T, &T) -> bool,
    ) -> Result<T, TestCaseError> {
        let line = self.line(&what);
        match (m, r) {
            (Ok(m), Ok(r)) if agree(&m, &r) => {
                let (md, rd) = (format!("{m:?}"), format!("{r:?}"));
                if md == rd {
                    self.log.push(format!("{line} -> {md}"));
                } else {
                    self.log
                        .push(format!("{line} -> memory {md}, redis {rd} (they agree)"));
                }
                Ok(m)
            }
            (m, r) => Err(TestCaseError::fail(format!(
                "stores disagree\n{}\n{line}\n    memory: {m:?}\n    redis:  {r:?}\n",
                self.log.join("\n"),
            ))),
        }
    }

    fn note(&mut self, what: String) {
        let line = self.line(&what);
        self.log.push(line);
    }

    /// Raises the real TTLs of `keys` to [`TTL_FLOOR_MS`] (see the module
    /// docs) and fails if one has no TTL at all.
    async fn ttl_floor(&mut self, keys: &[String]) -> Result<(), TestCaseError> {
        let mut inv = self.floor_script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        inv.arg(TTL_FLOOR_MS);
        let persistent: Vec<String> = inv.invoke_async(&mut self.raw).await.map_err(fail)?;
        if persistent.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(format!(
                "keys without a TTL: {persistent:?}\n{}\n",
                self.log.join("\n")
            )))
        }
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let case = self.case;
        let now = self.now();
        match *op {
            Op::Advance(ms) => {
                self.clock.advance(ms);
                self.latest = self.latest.max(self.now());
                if ms > 0 {
                    self.note(format!("advance {ms}"));
                }
            }
            Op::StepBack(ms) => {
                let mut to = now.saturating_sub(ms).max(T0);
                for &end in &self.run_ends {
                    if to < end && end <= now {
                        to = end;
                    }
                }
                self.clock.set(to);
                self.note(format!("step back {} ms", now - to));
                let latest_minute = self.latest / 60_000;
                if to / 60_000 < latest_minute {
                    self.top_users_from_minute = self.top_users_from_minute.max(latest_minute + 2);
                }
            }
            Op::Admit {
                user,
                invocation,
                budget,
            } => {
                let checks = checks(case, now, budget);
                let req = TurnRequest {
                    user: USERS[user],
                    invocation_id: INVOCATIONS[invocation],
                    params: case.turns,
                    budgets: &checks,
                };
                let m = self.mem.admit_turn(req).await;
                let r = self.redis.admit_turn(req).await;
                // `reclaimed` is a best-effort metric: memory forgets the
                // expired leases of a user entry that expired as a whole
                // once any operation (a reset, an unknown settle, …) or a
                // shard sweep drops the entry, where Redis keeps them in
                // the lease set (whose real TTL does not run on the fake
                // clock) until an admission, release or renewal purges
                // them. So memory may count fewer, never more.
                let _ = self.agree(format!("admit_turn({user}, {invocation})"), m, r, |m, r| {
                    m.admit == r.admit && m.reclaimed <= r.reclaimed
                })?;
            }
            Op::Release { user, invocation } => {
                let (u, i) = (USERS[user], INVOCATIONS[invocation]);
                let m = self.mem.release_run(u, i).await;
                let r = self.redis.release_run(u, i).await;
                self.same(format!("release_run({user}, {invocation})"), m, r)?;
            }
            Op::Renew {
                user,
                invocation,
                ttl,
            } => {
                let (u, i, t) = (USERS[user], INVOCATIONS[invocation], ttl.ms());
                let m = self.mem.renew_run(u, i, t).await;
                let r = self.redis.renew_run(u, i, t).await;
                self.same(format!("renew_run({user}, {invocation}, {t})"), m, r)?;
            }
            Op::Reserve {
                user,
                invocation,
                plan,
                estimate,
                max_wait,
                max_calls,
                shadow,
                budget,
            } => {
                self.run_ends.push(now + RESERVATION_RETENTION_MS);
                let checks = checks(case, now, budget);
                let estimate_split = split(budget);
                let tokens = case.tokens[plan];
                let req = ReserveRequest {
                    user: USERS[user],
                    invocation_id: INVOCATIONS[invocation],
                    tokens,
                    estimate: estimate.resolve(2 * tokens.capacity(), u64::MAX / 2),
                    max_wait_ms: max_wait.resolve(2 * tokens.period_ms(), u64::MAX),
                    max_llm_calls: max_calls,
                    shadow,
                    request_id: None,
                    budget: budget.map(|_| BudgetRequest {
                        checks: &checks,
                        price: case.price,
                        split: estimate_split,
                        alerts: ALERTS,
                    }),
                };
                let m = self.mem.reserve_tokens(req).await;
                let r = self.redis.reserve_tokens(req).await;
                let what = format!(
                    "reserve_tokens({user}, {invocation}, plan {plan}, estimate {}, \
                     max_wait {}, max_calls {max_calls}, shadow {shadow}, budgets {budget:?})",
                    req.estimate, req.max_wait_ms
                );
                match self.same(what, m, r)? {
                    ReserveOutcome::Granted { reservation, .. }
                    | ReserveOutcome::Denied {
                        shadow_reservation: Some(reservation),
                        ..
                    } => self.granted.push((user, reservation)),
                    ReserveOutcome::Denied { .. } | ReserveOutcome::Superseded => {}
                }
            }
            Op::Settle {
                rid,
                plan,
                actual,
                budget,
            } => {
                self.run_ends.push(now + RESERVATION_RETENTION_MS);
                let checks = checks(case, now, budget);
                let (user, reservation) = match rid {
                    Rid::Granted { pick, user } if !self.granted.is_empty() => {
                        let (owner, r) = self.granted[pick % self.granted.len()].clone();
                        (user.unwrap_or(owner), r)
                    }
                    Rid::Granted { pick, user } => (
                        user.unwrap_or(0),
                        ReservationId {
                            invocation_id: INVOCATIONS[pick % INVOCATIONS.len()].to_owned(),
                            call: 1,
                            fallback: None,
                        },
                    ),
                    Rid::MadeUp {
                        user,
                        invocation,
                        call,
                    } => (user, ReservationId::new(INVOCATIONS[invocation], call)),
                };
                let tokens = case.tokens[plan];
                let req = SettleRequest {
                    user: USERS[user],
                    tokens,
                    reservation: &reservation,
                    actual: actual
                        .map(|a| a.resolve(2 * tokens.capacity(), case.huge_actual(plan))),
                    budget: budget.map(|_| BudgetRequest {
                        checks: &checks,
                        price: case.price,
                        split: split(budget),
                        alerts: ALERTS,
                    }),
                };
                let m = self.mem.settle(req).await;
                let r = self.redis.settle(req).await;
                let what = match req.actual {
                    Some(a) => format!(
                        "settle({user}, {reservation}, plan {plan}, actual {a}, budgets {budget:?})"
                    ),
                    None => {
                        format!("refund({user}, {reservation}, plan {plan}, budgets {budget:?})")
                    }
                };
                let _ = self.same(what, m, r)?;
            }
            Op::TakeMany {
                ref takes,
                cooldown,
            } => {
                let (takes, cooldown) = bucket_takes(case, takes, cooldown);
                let m = self.mem.take_many(&takes, cooldown).await;
                let r = self.redis.take_many(&takes, cooldown).await;
                let desc: Vec<String> = takes
                    .iter()
                    .map(|t| {
                        format!(
                            "{} {}/{}ms cap {} cost {} wait {}",
                            t.key,
                            t.spec.amount(),
                            t.spec.period_ms(),
                            t.spec.capacity(),
                            t.cost,
                            t.max_wait_ms
                        )
                    })
                    .collect();
                let what = format!(
                    "take_many([{}], cooldown wait {:?})",
                    desc.join("; "),
                    cooldown.map(|c| c.max_wait_ms)
                );
                self.same(what, m, r)?;
            }
            Op::FairTake {
                ref takes,
                cooldown,
                tenant,
                weights,
                window,
            } => {
                let (takes, cooldown) = bucket_takes(case, takes, cooldown);
                let configured: Vec<(&str, u32)> = weights
                    .iter()
                    .enumerate()
                    .filter_map(|(i, w)| w.map(|w| (TENANTS[i], w)))
                    .collect();
                let pool = takes[0].spec;
                let fair = FairCheck {
                    key: FAIR,
                    take: FairTake {
                        tenant: TENANTS[tenant],
                        weights: &configured,
                        amount: pool.amount(),
                        period_ms: pool.period_ms(),
                        capacity: pool.capacity(),
                        window_ms: window,
                    },
                };
                let m = self.mem.take_many_fair(&takes, cooldown, fair).await;
                let r = self.redis.take_many_fair(&takes, cooldown, fair).await;
                let what = format!(
                    "take_many_fair({} takes, cooldown {:?}, tenant {}, weights {configured:?}, window {window})",
                    takes.len(),
                    cooldown.map(|c| c.max_wait_ms),
                    TENANTS[tenant],
                );
                self.same(what, m, r)?;
            }
            Op::TakeOne {
                user,
                key,
                alt,
                cost,
            } => {
                let (bucket, spec, what) = match user {
                    Some(u) => (
                        BucketRef::Turns(USERS[u]),
                        case.turns.turns,
                        format!("turns of {u}"),
                    ),
                    None => {
                        let spec = case.named[key][usize::from(alt)];
                        (
                            BucketRef::Named(BUCKETS[key]),
                            spec,
                            BUCKETS[key].to_owned(),
                        )
                    }
                };
                let req = TakeRequest {
                    bucket,
                    spec,
                    cost: cost.resolve(2 * spec.capacity(), u64::MAX / 2),
                };
                let m = self.mem.take_one(req).await;
                let r = self.redis.take_one(req).await;
                let what = format!(
                    "take_one({what} {}/{}ms cap {} cost {})",
                    spec.amount(),
                    spec.period_ms(),
                    spec.capacity(),
                    req.cost
                );
                let _ = self.same(what, m, r)?;
            }
            Op::ExtendCooldown(Until { for_ms, max_ms }) => {
                let m = self.mem.extend_cooldown(COOLDOWN, for_ms, max_ms).await;
                let r = self.redis.extend_cooldown(COOLDOWN, for_ms, max_ms).await;
                self.same(format!("extend_cooldown({for_ms}, {max_ms})"), m, r)?;
            }
            Op::Aimd { throttled } => {
                let p = AimdParams::default();
                let m = self.mem.aimd(AIMD, p, throttled).await;
                let r = self.redis.aimd(AIMD, p, throttled).await;
                self.same(format!("aimd(throttled {throttled})"), m, r)?;
            }
            Op::ClearProvider => {
                let p = AimdParams::default();
                let m = self.mem.clear_provider(COOLDOWN, AIMD, p).await;
                let r = self.redis.clear_provider(COOLDOWN, AIMD, p).await;
                self.same("clear_provider".to_owned(), m, r)?;
            }
            Op::ClaimSession {
                user,
                session,
                ttl,
                cap,
                create,
            } => {
                let req = ClaimRequest {
                    user: USERS[user],
                    session: CLAIMED[session],
                    lease_ttl_ms: ttl.ms(),
                    max_sessions: cap,
                    create,
                };
                let m = self.mem.claim_session(req).await;
                let r = self.redis.claim_session(req).await;
                self.same(
                    format!(
                        "claim_session({user}, {session}, {}, cap {cap}, create {create})",
                        ttl.ms()
                    ),
                    m,
                    r,
                )?;
            }
            Op::SessionAcquire {
                session,
                holder,
                ttl,
            } => {
                let (s, h, t) = (SESSIONS[session], HOLDERS[holder], ttl.ms());
                let m = self.mem.session_acquire(s, h, t).await;
                let r = self.redis.session_acquire(s, h, t).await;
                let _ = self.same(format!("session_acquire({session}, {holder}, {t})"), m, r)?;
            }
            Op::SessionRenew {
                session,
                holder,
                ttl,
            } => {
                let (s, h, t) = (SESSIONS[session], HOLDERS[holder], ttl.ms());
                let m = self.mem.session_renew(s, h, t).await;
                let r = self.redis.session_renew(s, h, t).await;
                self.same(format!("session_renew({session}, {holder}, {t})"), m, r)?;
            }
            Op::SessionRelease { session, holder } => {
                let (s, h) = (SESSIONS[session], HOLDERS[holder]);
                let m = self.mem.session_release(s, h).await;
                let r = self.redis.session_release(s, h).await;
                self.same(format!("session_release({session}, {holder})"), m, r)?;
            }
            Op::FenceCheck { session, offset } => {
                let s = SESSIONS[session];
                let fence = self.fence_near(s, offset).await?;
                let m = self.mem.fence_check(s, fence).await;
                let r = self.redis.fence_check(s, fence).await;
                self.same(format!("fence_check({session}, {fence})"), m, r)?;
            }
            Op::Append {
                session,
                offset,
                record,
            } => {
                let s = SESSIONS[session];
                let fence = self.fence_near(s, offset).await?;
                let rec = [record, b'.', record];
                let m = self.mem.append_fenced(s, fence, &rec).await;
                let r = self.redis.append_fenced(s, fence, &rec).await;
                self.same(format!("append_fenced({session}, {fence}, {rec:?})"), m, r)?;
            }
            Op::Read {
                session,
                from,
                limit,
            } => {
                let s = SESSIONS[session];
                let m = self.mem.read_records(s, from, limit).await;
                let r = self.redis.read_records(s, from, limit).await;
                self.same(format!("read_records({session}, {from}, {limit})"), m, r)?;
            }
            Op::Delete { session } => {
                let s = SESSIONS[session];
                let m = self.mem.delete_records(s).await;
                let r = self.redis.delete_records(s).await;
                self.same(format!("delete_records({session})"), m, r)?;
            }
            Op::GroupCreate {
                session,
                record,
                ref logs,
            } => {
                let s = SESSIONS[session];
                let logs = group_writes(session, logs);
                let writes = log_writes(session, &logs);
                let rec = [b'c', record];
                let req = SessionCreate {
                    session: s,
                    record: &rec,
                    logs: &writes,
                };
                let m = self.mem.session_create(req).await;
                let r = self.redis.session_create(req).await;
                self.same(
                    format!("session_create({session}, {rec:?}, {logs:?})"),
                    m,
                    r,
                )?;
            }
            Op::GroupAppend {
                session,
                offset,
                id,
                record,
                ref logs,
            } => {
                let s = SESSIONS[session];
                let fence = self.fence_near(s, offset).await?;
                let logs = group_writes(session, logs);
                let writes = log_writes(session, &logs);
                let id = id.map(|i| format!("e{i}"));
                let rec = [b'e', record];
                let req = SessionAppend {
                    session: s,
                    fence,
                    id: id.as_deref(),
                    record: &rec,
                    logs: &writes,
                };
                let m = self.mem.session_append(req).await;
                let r = self.redis.session_append(req).await;
                self.same(
                    format!("session_append({session}, {fence}, {id:?}, {rec:?}, {logs:?})"),
                    m,
                    r,
                )?;
            }
            Op::GroupDelete { session, ref logs } => {
                let s = SESSIONS[session];
                let logs = group_writes(session, logs);
                let writes = log_writes(session, &logs);
                let req = SessionDelete {
                    session: s,
                    logs: &writes,
                };
                let m = self.mem.session_delete(req).await;
                let r = self.redis.session_delete(req).await;
                self.same(format!("session_delete({session}, {logs:?})"), m, r)?;
            }
            Op::UserState { user, plan } => {
                let u = USERS[user];
                let tokens = case.tokens[plan];
                let m = self.mem.user_state(u, case.turns.turns, tokens).await;
                let r = self.redis.user_state(u, case.turns.turns, tokens).await;
                // Leases as a set: their order is not part of the contract.
                let sorted = |s: UserState| UserState {
                    leases: {
                        let mut l = s.leases;
                        l.sort();
                        l
                    },
                    ..s
                };
                self.same(
                    format!("user_state({user}, plan {plan})"),
                    m.map(sorted),
                    r.map(sorted),
                )?;
            }
            Op::BudgetSpent {
                user,
                budget,
                adjust,
            } => {
                let checks = checks(case, now, Some(budget));
                let adjust = adjust.and_then(|(i, top_up)| {
                    let c = checks.get(i % checks.len().max(1))?;
                    Some((
                        c.period,
                        match top_up {
                            None => BudgetAdjust::Reset,
                            Some((q, id)) => BudgetAdjust::TopUp {
                                amount: q.resolve(2 * c.limit, 1 << 53),
                                request_id: id.map(|i| TOP_UP_IDS[i]),
                            },
                        },
                    ))
                });
                let u = USERS[user];
                let m = self.mem.budget_spent(u, &checks, adjust).await;
                let r = self.redis.budget_spent(u, &checks, adjust).await;
                self.same(
                    format!("budget_spent({user}, {budget:?}, {adjust:?})"),
                    m,
                    r,
                )?;
            }
            Op::ResetUser { user } => {
                let u = USERS[user];
                let m = self.mem.reset_user(u).await;
                let r = self.redis.reset_user(u).await;
                self.same(format!("reset_user({user})"), m, r)?;
            }
            Op::TopUsers { n } => {
                let m = self.mem.top_users(n).await;
                let r = self.redis.top_users(n).await;
                // After the clock stepped back into an earlier minute, the
                // two stores' sliding minutes disagree until both of the
                // minutes read are past every minute seen before: memory
                // keeps one (current, previous) pair per user and a step
                // back into an earlier minute resets it, where Redis keeps a
                // sorted set per minute and reads the earlier minute's set
                // again, with what was charged in it before the clock moved
                // on. The SPEC defines no sliding window for a clock that
                // goes back; `user_state`'s `tokens_last_minute` (the same
                // pair in both stores) is still compared.
                if now / 60_000 >= self.top_users_from_minute {
                    self.same(format!("top_users({n})"), m, r)?;
                } else {
                    self.note(format!(
                        "top_users({n}) not compared after a step back: memory {m:?}, redis {r:?}"
                    ));
                }
            }
        }
        // A lease set or a cooldown may just have been given a real TTL of
        // a few ms.
        let short = match *op {
            Op::Admit { user, .. } | Op::Renew { user, .. } => Some(self.keys.leases[user].clone()),
            Op::ExtendCooldown(_) => Some(self.keys.cooldown.clone()),
            Op::Aimd { throttled: true } => Some(self.keys.aimd.clone()),
            _ => None,
        };
        match short {
            Some(key) => self.ttl_floor(&[key]).await,
            None => Ok(()),
        }
    }

    /// A fence near the session's latest (as the reference store says; its
    /// fence check changes nothing).
    async fn fence_near(&self, session: &str, offset: i8) -> Result<u64, TestCaseError> {
        let latest = self.mem.fence_check(session, 0).await.map_err(fail)?.latest;
        Ok(latest.saturating_add_signed(i64::from(offset)))
    }
}

async fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let clock = FakeClock::new(T0);
    let prefix = unique_prefix();
    let url = shared_url();
    let mem = MemoryStore::with_config(
        clock.clone(),
        MemoryConfig {
            session_retention_ms: SESSION_RETENTION_MS,
            session_grace_ms: SESSION_GRACE_MS,
            ..MemoryConfig::default()
        },
    );
    let redis = RedisStore::connect(
        RedisConfig::standalone(url.clone())
            .with_key_prefix(prefix.clone())
            .with_op_timeout(Duration::from_secs(2))
            .with_session_retention_ms(SESSION_RETENTION_MS)
            .with_session_grace_ms(SESSION_GRACE_MS),
    )
    .await
    .map_err(fail)?
    .with_clock_override(clock.clone());
    let raw = redis::Client::open(url)
        .map_err(fail)?
        .get_multiplexed_async_connection()
        .await
        .map_err(fail)?;
    let mut run = Run {
        case,
        clock,
        mem,
        redis,
        raw,
        keys: case_keys(&prefix),
        floor_script: redis::Script::new(TTL_FLOOR_SCRIPT),
        log: Vec::new(),
        granted: Vec::new(),
        latest: T0,
        top_users_from_minute: 0,
        run_ends: Vec::new(),
    };
    for op in &case.ops {
        run.step(op).await?;
    }
    // Every key left must expire on its own.
    let all = std::mem::take(&mut run.keys.all);
    run.ttl_floor(&all).await
}

/// A memory store and a Redis store (a key prefix of its own), each on a
/// fake clock of its own at `T0`.
async fn side_by_side() -> (MemoryStore, FakeClock, RedisStore, FakeClock) {
    let mem_clock = FakeClock::new(T0);
    let mem = MemoryStore::new(mem_clock.clone());
    let clock = FakeClock::new(T0);
    let redis = RedisStore::connect(
        RedisConfig::standalone(shared_url())
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("redis")
    .with_clock_override(clock.clone());
    (mem, mem_clock, redis, clock)
}

/// Fair sharing's loads (SPEC §5: 3:1 backlogged, a light tenant beside a
/// heavy one, three tenants, a tenant back from idle) through the governor
/// on the memory store and on Redis, side by side on one fake clock each:
/// every permit's answer the same.
#[test]
fn fair_loads_answer_as_memory() {
    use tollgate_testkit::scenarios::fair::{Load, Offer, Sharing};
    let o = |tenant, weight, every_ms, from_ms| Offer {
        tenant,
        weight,
        every_ms,
        from_ms,
    };
    let loads = [
        vec![o("a", 3, 10, 0), o("b", 1, 10, 5)],
        vec![o("heavy", 1, 10, 0), o("light", 1, 400, 3)],
        vec![o("a", 2, 20, 0), o("b", 3, 15, 1), o("c", 5, 50, 7)],
        vec![o("a", 1, 10, 0), o("b", 1, 10, 15_000)],
    ];
    runtime().block_on(async {
        for offers in &loads {
            let (mem, mem_clock, redis, clock) = side_by_side().await;
            let m = Load::run(mem, &mem_clock, offers, Sharing::Weights, 30_000).await;
            let r = Load::run(redis, &clock, offers, Sharing::Weights, 30_000).await;
            assert_eq!(m.tenants, r.tenants, "{offers:?}");
            assert_eq!(m.densest_second, r.densest_second);
        }
    });
}

/// A generated multi-bucket take's buckets and cooldown, as the stores take
/// them.
fn bucket_takes(
    case: &Case,
    takes: &[TakeOp],
    cooldown: Option<Qty>,
) -> (Vec<BucketTake<'static>>, Option<CooldownCheck<'static>>) {
    let takes = takes
        .iter()
        .map(|t| {
            let spec = case.named[t.key][usize::from(t.alt)];
            BucketTake {
                key: BUCKETS[t.key],
                spec,
                cost: t.cost.resolve(2 * spec.capacity(), u64::MAX / 2),
                max_wait_ms: t.max_wait.resolve(2 * spec.period_ms(), u64::MAX),
            }
        })
        .collect();
    let cooldown = cooldown.map(|w| CooldownCheck {
        key: COOLDOWN,
        max_wait_ms: w.resolve(10_000, u64::MAX),
        max_ms: COOLDOWN_MAX_MS,
    });
    (takes, cooldown)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

fn config() -> ProptestConfig {
    let cases = std::env::var("TOLLGATE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Every operation answers the same in memory and in Redis.
    #[test]
    fn redis_answers_as_memory(case in case()) {
        runtime().block_on(run_case(&case))?;
    }
}

/// A run of fair permits only: the pool, the key's window, weights for
/// five tenants (`None`: unconfigured), and each permit's tenant and the
/// time before it. With `flood`, most permits name one of 90 tenants, so
/// the key fills its 64 entries and `{others}`.
#[derive(Debug, Clone)]
struct FairRun {
    pool: BucketSpec,
    window: u64,
    weights: [Option<u32>; 5],
    flood: bool,
    permits: Vec<(usize, u64)>,
}

fn fair_run() -> impl Strategy<Value = FairRun> {
    (
        (
            1u64..=20,
            prop_oneof![Just(1_000u64), Just(60_000)],
            1u64..=8,
        )
            .prop_map(|(a, p, b)| BucketSpec::new(a, p, b).expect("valid spec")),
        prop_oneof![Just(0u64), Just(300), Just(4_000)],
        prop::array::uniform5(prop_oneof![1 => Just(None), 2 => (1u32..=9).prop_map(Some)]),
        prop::bool::weighted(0.2),
        prop::collection::vec(
            (
                0usize..90,
                prop_oneof![
                    4 => Just(0u64),
                    4 => 1u64..=20,
                    2 => 21u64..=400,
                    1 => 401u64..=70_000,
                ],
            ),
            1..=160,
        ),
    )
        .prop_map(|(pool, window, weights, flood, permits)| FairRun {
            pool,
            window,
            weights,
            flood,
            permits,
        })
}

const FAIR_NAMES: [&str; 5] = ["a", "b", "c", "{none}", "d\u{7f}"];

async fn fair_run_case(run: &FairRun) -> Result<(), TestCaseError> {
    let (mem, mem_clock, redis, clock) = side_by_side().await;
    let configured: Vec<(&str, u32)> = FAIR_NAMES
        .iter()
        .zip(run.weights)
        .filter_map(|(n, w)| w.map(|w| (*n, w)))
        .collect();
    let flood: Vec<String> = (0..90).map(|i| format!("f{i}")).collect();
    let takes = [BucketTake {
        key: "{p}:pool",
        spec: run.pool,
        cost: 1,
        max_wait_ms: run.window,
    }];
    for (i, &(pick, gap)) in run.permits.iter().enumerate() {
        mem_clock.advance(gap);
        clock.advance(gap);
        let tenant = if run.flood && pick >= 5 {
            flood[pick].as_str()
        } else {
            FAIR_NAMES[pick % 5]
        };
        let fair = FairCheck {
            key: FAIR,
            take: FairTake {
                tenant,
                weights: &configured,
                amount: run.pool.amount(),
                period_ms: run.pool.period_ms(),
                capacity: run.pool.capacity(),
                window_ms: run.window,
            },
        };
        let m = mem
            .take_many_fair(&takes, None, fair)
            .await
            .expect("memory");
        let r = redis
            .take_many_fair(&takes, None, fair)
            .await
            .expect("redis");
        prop_assert_eq!(m, r, "permit {} of {:?}", i, tenant);
    }
    // The state each saved, read back: the same clock, tags and tenants.
    let m = mem.read_fair(FAIR).await.expect("memory");
    let r = redis.read_fair(FAIR).await.expect("redis");
    prop_assert_eq!(m, r, "the saved fair states");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases / 8, ..config() })]

    /// Runs of fair permits (many tenants, weights, gaps that pass finish
    /// tags or leave the key idle) answer the same in memory and in Redis.
    #[test]
    fn fair_permits_answer_as_memory(run in fair_run()) {
        runtime().block_on(fair_run_case(&run))?;
    }
}

/// A case this test found: a refused multi-take naming a missing key twice
/// with different specs must leave the key as if untouched (full under the
/// later spec). Redis saved the first spec's full level rescaled to the
/// later spec instead (1 token of 30,404), taking credit on a refusal.
#[test]
fn refused_take_of_a_missing_key_named_twice() {
    let small = BucketSpec::new(1, 1, 1).expect("valid spec");
    let big = BucketSpec::new(265, 12_164, 30_404).expect("valid spec");
    let take = |alt, cost| TakeOp {
        key: 0,
        alt,
        cost: Qty::Rel(cost),
        max_wait: Qty::Rel(0),
    };
    let case = Case {
        budgets: Vec::new(),
        price: None,
        turns: TurnParams {
            turns: small,
            max_runs: 1,
            lease_ttl_ms: 1,
            concurrency_retry_ms: 1,
        },
        tokens: [small, small],
        named: [[small, big], [small, small]],
        ops: vec![
            // Refused: 1 token (small, rescaled) < 127.
            Op::TakeMany {
                takes: vec![take(false, 0), take(true, 127)],
                cooldown: None,
            },
            // Memory: full (30,404), granted. Redis before the fix: 1 token.
            Op::TakeMany {
                takes: vec![take(true, 2)],
                cooldown: None,
            },
        ],
    };
    if let Err(e) = runtime().block_on(run_case(&case)) {
        panic!("{e}");
    }
}

/// One step of a run of budget top-ups: the clock moves `advance`, then
/// `user` tops up its daily budget by `amount` under request id `id`
/// (an index of `TOP_UP_IDS`; `None`: no id).
#[derive(Debug, Clone)]
struct TopUpStep {
    advance: u64,
    user: usize,
    id: Option<usize>,
    amount: u64,
}

fn top_up_run() -> impl Strategy<Value = Vec<TopUpStep>> {
    let step = (
        prop_oneof![
            8 => 0u64..=5_000,
            // Around the day an id is remembered.
            2 => 86_399_990u64..=86_400_010,
        ],
        0..2usize,
        proptest::option::weighted(0.9, 0..TOP_UP_IDS.len()),
        1u64..=1_000,
    )
        .prop_map(|(advance, user, id, amount)| TopUpStep {
            advance,
            user,
            id,
            amount,
        });
    prop::collection::vec(step, 1..40)
}

/// A daily token budget of 10,000 around `now`.
fn daily_check(now: u64) -> [BudgetCheck; 1] {
    const DAY: u64 = 86_400_000;
    let start = now - now % DAY;
    [BudgetCheck {
        period: Period::Daily,
        unit: BudgetUnit::Tokens,
        limit: 10_000,
        current: Window {
            start_ms: start,
            end_ms: start + DAY,
        },
        next: Window {
            start_ms: start + DAY,
            end_ms: start + 2 * DAY,
        },
        fallback: false,
    }]
}

async fn top_up_run_case(run: &[TopUpStep]) -> Result<(), TestCaseError> {
    let (mem, mem_clock, redis, clock) = side_by_side().await;
    for (i, s) in run.iter().enumerate() {
        mem_clock.advance(s.advance);
        clock.advance(s.advance);
        let checks = daily_check(mem_clock.now_ms());
        let adjust = Some((
            Period::Daily,
            BudgetAdjust::TopUp {
                amount: s.amount,
                request_id: s.id.map(|i| TOP_UP_IDS[i]),
            },
        ));
        let u = USERS[s.user];
        let m = mem.budget_spent(u, &checks, adjust).await;
        let r = redis.budget_spent(u, &checks, adjust).await;
        prop_assert_eq!(format!("{m:?}"), format!("{r:?}"), "step {}: {:?}", i, s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases / 8, ..config() })]

    /// Runs of top-ups, with and without request ids, some a day apart:
    /// each answers the same in memory and in Redis (a repeat within the
    /// day grants nothing, one after it grants again).
    #[test]
    fn top_ups_answer_as_memory(run in top_up_run()) {
        runtime().block_on(top_up_run_case(&run))?;
    }
}

/// More top-ups with ids than a store remembers, many at one instant:
/// memory and Redis forget the same ones (the least time, then the least
/// id), so the same repeats grant again.
#[test]
fn top_up_ids_are_forgotten_alike() {
    runtime().block_on(async {
        let (mem, mem_clock, redis, clock) = side_by_side().await;
        let ids: Vec<String> = (0..300)
            .map(|i| format!("id-{:03}", (i * 7) % 300))
            .collect();
        let mut answers = Vec::new();
        for round in 0..2 {
            for (n, id) in ids.iter().enumerate() {
                if n % 100 == 0 {
                    mem_clock.advance(1);
                    clock.advance(1);
                }
                let checks = daily_check(mem_clock.now_ms());
                let adjust = Some((
                    Period::Daily,
                    BudgetAdjust::TopUp {
                        amount: 1,
                        request_id: Some(id),
                    },
                ));
                let m = mem.budget_spent("u0", &checks, adjust).await.expect("mem");
                let r = redis
                    .budget_spent("u0", &checks, adjust)
                    .await
                    .expect("redis");
                assert_eq!(m, r, "round {round}, {id}");
                answers.push(m[0].granted);
            }
        }
        // The first round grants each of the 300; of the second, those
        // forgotten (pushed out by later ones) grant again, not all.
        assert_eq!(answers[299], 300);
        let last = *answers.last().expect("answers");
        assert!(last > 300 && last < 600, "{last}");
    });
}
