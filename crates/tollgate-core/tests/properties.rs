//! Property tests for the core invariants (SPEC §2–4).
//!
//! Each property runs random operation sequences against the public API and
//! checks an invariant or a small reference model after every step:
//!
//! 1. [`bucket_level_never_exceeds_capacity`]: takes and adjusts at random
//!    times (sometimes stepping back) never fill a bucket past its capacity.
//! 2. [`refused_take_changes_nothing`]: a refused or exceeds-capacity take
//!    saves only the refilled state; a granted one takes exactly its cost.
//! 3. [`granted_cost_is_bounded_and_retry_hints_are_honest`]: over any window
//!    from a full bucket, granted cost ≤ capacity + rate × elapsed + the debt
//!    `max_wait_ms` allows, and a refusal's retry hint is honest and tight.
//! 4. [`lease_set_matches_model`]: a run lease is only ever freed by its own
//!    invocation id (or by expiry), the set never exceeds its cap, and a lost
//!    lease is never renewed back.
//! 5. [`session_fencing_matches_model`]: fencing numbers never decrease, grow
//!    exactly when a new holder gets the lease, and a fenced append (pure and
//!    through [`MemoryStore`]) is accepted iff it carries the latest number.
//! 6. [`concurrent_admissions_never_exceed_cap`]: tasks racing on a
//!    multi-threaded runtime never hold more run leases than the cap.
//! 7. [`settles_apply_at_most_once_and_the_cap_holds`]: the pure model-call
//!    bookkeeping ([`reserve`]) closes a reservation at most once, keeps a
//!    run within `max_llm_calls` and answers a repeated request id with its
//!    first grant.
//! 8. [`take_many_is_all_or_nothing`]: the pure multi-bucket take
//!    ([`take::take_many`]) saves every take or none, waits the largest wait
//!    and names the right refusing bucket.
//! 9. [`take_single_is_take_many_of_one`]: the allocation-free single take
//!    ([`take::take_single`]) answers and saves exactly what
//!    [`take::take_many`] does for one take without a cooldown.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use tollgate_core::bucket::{self, BucketSpec, BucketState, MAX_SCALED, Take};
use tollgate_core::lease::{
    Acquire, Admit, LeaseSet, SessionAcquire, SessionGrant, SessionLease, TurnParams,
};
use tollgate_core::reserve::{self, CallState};
use tollgate_core::store::{
    AppendOutcome, BucketTake, MultiTake, ReservationId, ReserveOutcome, ReserveRequest,
    SettleOutcome, SettleRequest, TurnRequest,
};
use tollgate_core::take::{self, Cooldown};
use tollgate_core::{Denial, FakeClock, Limit, MemoryStore, Store};

/// Runs a [`MemoryStore`] future, which is always ready at once.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryStore futures are always ready"),
    }
}

/// Small valid bucket specs: every scaled value stays far below 2^53.
fn spec() -> impl Strategy<Value = BucketSpec> {
    (1u64..=5_000, 1u64..=120_000, 1u64..=50_000)
        .prop_map(|(amount, period, cap)| BucketSpec::new(amount, period, cap).expect("valid"))
}

/// A start state: missing (a full bucket) or any level from deep debt to full.
fn start_state(spec: BucketSpec) -> impl Strategy<Value = Option<BucketState>> {
    let cap = spec.capacity_scaled();
    prop_oneof![
        1 => Just(None),
        4 => (-4 * cap..=cap, 0u64..1_000_000)
            .prop_map(move |(level, ts)| Some(BucketState {
                level,
                ts,
                period_ms: spec.period_ms(),
            })),
    ]
}

/// A time step: usually forward (up to two periods), sometimes back.
fn time_step(spec: BucketSpec) -> impl Strategy<Value = i64> {
    let period = spec.period_ms() as i64;
    prop_oneof![
        2 => Just(0i64),
        7 => 0..=2 * period,
        1 => -period..0,
    ]
}

#[derive(Debug, Clone, Copy)]
enum BucketOp {
    Take { cost: u64, max_wait_ms: u64 },
    Adjust { delta: i64 },
}

fn bucket_op(spec: BucketSpec) -> impl Strategy<Value = BucketOp> {
    let cap = spec.capacity();
    let period = spec.period_ms();
    prop_oneof![
        3 => (0..=2 * cap, 0..=2 * period)
            .prop_map(|(cost, max_wait_ms)| BucketOp::Take { cost, max_wait_ms }),
        1 => (-2 * cap as i64..=2 * cap as i64).prop_map(|delta| BucketOp::Adjust { delta }),
    ]
}

fn bucket_run() -> impl Strategy<Value = (BucketSpec, Option<BucketState>, Vec<(i64, BucketOp)>)> {
    spec().prop_flat_map(|s| {
        (
            Just(s),
            start_state(s),
            prop::collection::vec((time_step(s), bucket_op(s)), 1..48),
        )
    })
}

proptest! {
    /// Property 1: over any sequence of takes and adjusts at non-decreasing
    /// and occasionally stepping-back times, the level never exceeds the
    /// capacity (scaled), never drops below -2^53, and `ts` is the latest
    /// time seen (a clock that steps back never refills twice).
    #[test]
    fn bucket_level_never_exceeds_capacity((spec, start, ops) in bucket_run()) {
        let cap = spec.capacity_scaled();
        let mut state = start;
        let mut now: u64 = start.map_or(500_000, |s| s.ts);
        let mut latest = start.map_or(0, |s| s.ts);
        for (step, op) in ops {
            now = now.saturating_add_signed(step);
            latest = latest.max(now);
            let next = match op {
                BucketOp::Take { cost, max_wait_ms } => {
                    bucket::take(&spec, state, now, cost, max_wait_ms).state
                }
                BucketOp::Adjust { delta } => bucket::adjust(&spec, state, now, delta).state,
            };
            prop_assert!(next.level <= cap, "level {} > capacity {cap} after {op:?}", next.level);
            prop_assert!(next.level >= -MAX_SCALED);
            prop_assert_eq!(next.ts, latest, "ts is the latest time seen");
            // Refilling alone (any time later or earlier) never passes the cap either.
            prop_assert!(bucket::refill(&spec, Some(next), now.saturating_add(spec.period_ms())).level <= cap);
            state = Some(next);
        }
    }

    /// Property 2: a refused take (`Refused` or `ExceedsCapacity`) changes
    /// nothing: the returned state is exactly `refill(spec, state, now)`. A
    /// granted take removes exactly its cost from the refilled level, with
    /// `wait_ms ≤ max_wait_ms`.
    #[test]
    fn refused_take_changes_nothing(
        (spec, state, dt, max_wait_ms, cost) in
            (spec(), prop_oneof![Just(0u64), 0u64..=240_000]).prop_flat_map(|(s, max_wait_ms)| {
                let max_cost = s.max_cost(max_wait_ms);
                (
                    Just(s),
                    start_state(s),
                    -(s.period_ms() as i64)..=2 * s.period_ms() as i64,
                    Just(max_wait_ms),
                    prop_oneof![
                        4 => 0..=s.capacity(),
                        4 => 0..=max_cost,
                        1 => max_cost..=max_cost.saturating_mul(2).max(max_cost + 1),
                    ],
                )
            })
    ) {
        let now = state.map_or(1_000_000, |s| s.ts).saturating_add_signed(dt);
        let t = bucket::take(&spec, state, now, cost, max_wait_ms);
        let refilled = bucket::refill(&spec, state, now);
        match t.outcome {
            Take::Refused { retry_after_ms } => {
                prop_assert_eq!(t.state, refilled);
                prop_assert!(retry_after_ms >= 1);
            }
            Take::ExceedsCapacity => prop_assert_eq!(t.state, refilled),
            Take::Granted { wait_ms } => {
                prop_assert!(wait_ms <= max_wait_ms);
                prop_assert_eq!(t.state.ts, refilled.ts);
                prop_assert_eq!(
                    i128::from(t.state.level),
                    i128::from(refilled.level) - spec.scale(cost as i64)
                );
            }
        }
        prop_assert_eq!(t.expires_at, bucket::expires_at(&spec, t.state.level, now));
    }
}

/// A take sequence from a full bucket: per step a forward time step and a
/// cost; the whole run shares one `max_wait_ms`.
fn window_run() -> impl Strategy<Value = (BucketSpec, u64, u64, Vec<(u64, u64)>)> {
    spec().prop_flat_map(|s| {
        let max_cost = s.max_cost(2 * s.period_ms());
        (
            Just(s),
            prop_oneof![Just(0u64), 0..=2 * s.period_ms()],
            0u64..1_000_000_000,
            prop::collection::vec(
                (
                    prop_oneof![2 => Just(0u64), 3 => 0..=s.period_ms()],
                    prop_oneof![
                        6 => 0..=s.capacity(),
                        3 => 0..=max_cost,
                        1 => max_cost..=max_cost + 2,
                    ],
                ),
                1..64,
            ),
        )
    })
}

proptest! {
    /// Property 3: starting from a full bucket at `t0`, for every prefix of a
    /// take sequence at non-decreasing times,
    /// `Σ granted × period ≤ capacity × period + (t - t0) × amount + max_wait × amount`.
    ///
    /// Also: a refusal's hint is honest (the same take retried at
    /// `now + retry_after_ms`, nothing else in between, is granted with at
    /// most `max_wait_ms` of wait) and tight (one ms earlier it is still
    /// refused); exceeds-capacity is answered exactly when
    /// `cost > capacity + max_wait × rate`.
    #[test]
    fn granted_cost_is_bounded_and_retry_hints_are_honest(
        (spec, max_wait_ms, t0, steps) in window_run()
    ) {
        let period = i128::from(spec.period_ms());
        let amount = i128::from(spec.amount());
        let cap_s = i128::from(spec.capacity_scaled());
        let debt = i128::from(max_wait_ms) * amount;
        let mut state: Option<BucketState> = None;
        let mut now = t0;
        let mut granted: i128 = 0;
        for (dt, cost) in steps {
            now += dt;
            let t = bucket::take(&spec, state, now, cost, max_wait_ms);
            let cost_s = i128::from(cost) * period;
            match t.outcome {
                Take::Granted { .. } => granted += i128::from(cost),
                Take::Refused { retry_after_ms } => {
                    prop_assert!(cost_s <= cap_s + debt, "refused, not exceeds: it can fit");
                    let later = now + retry_after_ms;
                    let retry = bucket::take(&spec, Some(t.state), later, cost, max_wait_ms);
                    prop_assert!(
                        matches!(retry.outcome, Take::Granted { wait_ms } if wait_ms <= max_wait_ms),
                        "retry at +{retry_after_ms} ms answered {:?}", retry.outcome
                    );
                    let early = bucket::take(&spec, Some(t.state), later - 1, cost, max_wait_ms);
                    prop_assert!(
                        !matches!(early.outcome, Take::Granted { .. }),
                        "granted one ms before the hint of {retry_after_ms} ms: hint not tight"
                    );
                }
                Take::ExceedsCapacity => {
                    prop_assert!(cost_s > cap_s + debt, "exceeds-capacity for a cost that fits");
                    prop_assert!(cost > spec.max_cost(max_wait_ms));
                }
            }
            if cost_s > cap_s + debt {
                prop_assert_eq!(t.outcome, Take::ExceedsCapacity);
            }
            state = Some(t.state);
            let elapsed = i128::from(now - t0);
            prop_assert!(
                granted * period <= cap_s + elapsed * amount + debt,
                "granted {granted} tokens in {elapsed} ms: over capacity + rate × elapsed + debt"
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum LeaseOp {
    Acquire { id: usize, ttl: u64 },
    Renew { id: usize, ttl: u64 },
    Release { id: usize },
}

const IDS: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];

fn lease_op() -> impl Strategy<Value = LeaseOp> {
    let id = 0..IDS.len();
    let ttl = 1u64..=60;
    prop_oneof![
        4 => (id.clone(), ttl.clone()).prop_map(|(id, ttl)| LeaseOp::Acquire { id, ttl }),
        2 => (id.clone(), ttl).prop_map(|(id, ttl)| LeaseOp::Renew { id, ttl }),
        3 => id.prop_map(|id| LeaseOp::Release { id }),
    ]
}

fn lease_step() -> impl Strategy<Value = i64> {
    prop_oneof![3 => Just(0i64), 6 => 0i64..=25, 1 => -25i64..0]
}

proptest! {
    /// Property 4: `LeaseSet` against a `HashMap<id, expiry>` model, over
    /// random acquire/renew/release by ids from a small pool at random
    /// (occasionally stepping-back) times: release of an id removes that id
    /// only, the set never holds more than the cap, a full set's hint is
    /// `min(earliest expiry - now, retry_ms)`, and renewing a missing or
    /// expired id answers `None` and never adds it.
    #[test]
    fn lease_set_matches_model(
        cap in 1u32..=4,
        retry_ms in 1u64..=40,
        ops in prop::collection::vec((lease_step(), lease_op()), 1..96),
    ) {
        let mut set = LeaseSet::default();
        let mut model: HashMap<&str, u64> = HashMap::new();
        let mut now: u64 = 1_000;
        for (step, op) in ops {
            now = now.saturating_add_signed(step);
            model.retain(|_, exp| *exp > now);
            match op {
                LeaseOp::Acquire { id, ttl } => {
                    let id = IDS[id];
                    let got = set.acquire(now, id, ttl, cap, retry_ms);
                    let want = if model.contains_key(id) || model.len() < cap as usize {
                        // A refresh never shortens a lease.
                        let exp = (now + ttl).max(model.get(id).copied().unwrap_or(0));
                        let refreshed = model.insert(id, exp).is_some();
                        Acquire::Acquired { expires_at: exp, refreshed }
                    } else {
                        let earliest = model.values().copied().min().expect("full, so not empty");
                        Acquire::Full { retry_after_ms: (earliest - now).min(retry_ms).max(1) }
                    };
                    prop_assert_eq!(got, want, "acquire {} at {}", id, now);
                }
                LeaseOp::Renew { id, ttl } => {
                    let id = IDS[id];
                    let got = set.renew(now, id, ttl);
                    let want = model.get_mut(id).map(|exp| {
                        *exp = (now + ttl).max(*exp);
                        *exp
                    });
                    prop_assert_eq!(got, want, "renew {} at {}", id, now);
                }
                LeaseOp::Release { id } => {
                    let id = IDS[id];
                    let others_before: HashMap<String, u64> = live(&set, now)
                        .into_iter()
                        .filter(|(m, _)| m != id)
                        .collect();
                    let got = set.release(now, id);
                    prop_assert_eq!(got, model.remove(id).is_some(), "release {} at {}", id, now);
                    let after = live(&set, now);
                    prop_assert!(!after.contains_key(id), "{} still held after release", id);
                    prop_assert_eq!(after, others_before, "release of {} freed another id", id);
                }
            }
            prop_assert!(set.len() <= cap as usize, "{} leases > cap {}", set.len(), cap);
            let want: HashMap<String, u64> =
                model.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
            prop_assert_eq!(live(&set, now), want);
        }
    }
}

/// The live members of a lease set at `now`.
fn live(set: &LeaseSet, now: u64) -> HashMap<String, u64> {
    set.iter()
        .filter(|(_, exp)| *exp > now)
        .map(|(id, exp)| (id.to_owned(), exp))
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum SessionOp {
    Acquire {
        holder: usize,
        ttl: u64,
    },
    Renew {
        holder: usize,
        ttl: u64,
    },
    Release {
        holder: usize,
    },
    /// The holder appends with the last fence it was granted.
    Append {
        holder: usize,
    },
    /// Anyone checks an arbitrary fence near the latest.
    Probe {
        offset: i64,
    },
}

const HOLDERS: [&str; 3] = ["h0", "h1", "h2"];

fn session_op() -> impl Strategy<Value = SessionOp> {
    let h = 0..HOLDERS.len();
    let ttl = 1u64..=30;
    prop_oneof![
        4 => (h.clone(), ttl.clone()).prop_map(|(holder, ttl)| SessionOp::Acquire { holder, ttl }),
        2 => (h.clone(), ttl).prop_map(|(holder, ttl)| SessionOp::Renew { holder, ttl }),
        2 => h.clone().prop_map(|holder| SessionOp::Release { holder }),
        3 => h.prop_map(|holder| SessionOp::Append { holder }),
        1 => (-2i64..=2).prop_map(|offset| SessionOp::Probe { offset }),
    ]
}

proptest! {
    /// Property 5: `SessionLease` against a model (holder, expiry, fence), in
    /// lockstep with the same operations on a [`MemoryStore`] session at the
    /// same (non-decreasing) fake-clock times. The fence never decreases and
    /// grows by exactly one when the lease is granted to a holder that did
    /// not hold it live; busy/renew/release follow the live holder only; a
    /// fenced append is accepted iff its fence equals the latest issued
    /// number (never 0, which is never issued).
    #[test]
    fn session_fencing_matches_model(
        ops in prop::collection::vec((prop_oneof![2 => Just(0u64), 3 => 0u64..=20], session_op()), 1..96),
    ) {
        const SESSION: &str = "s1";
        let clock = FakeClock::new(10_000);
        let store = MemoryStore::new(clock.clone());
        let mut lease = SessionLease::default();
        let mut holder: Option<(usize, u64)> = None; // model: holder and expiry
        let mut fence: u64 = 0;
        let mut granted: HashMap<usize, u64> = HashMap::new(); // last fence per holder
        let mut appended: u64 = 0;
        let mut now: u64 = 10_000;
        for (dt, op) in ops {
            now += dt;
            clock.set(now);
            let before = lease.fence;
            let live = holder.filter(|&(_, exp)| exp > now);
            let mut grew = false;
            match op {
                SessionOp::Acquire { holder: h, ttl } => {
                    let got = lease.acquire(now, HOLDERS[h], ttl);
                    let want = match live {
                        Some((other, exp)) if other != h => SessionAcquire::Busy { retry_after_ms: exp - now },
                        Some((_, exp)) => SessionAcquire::Acquired(SessionGrant {
                            fence,
                            expires_at_ms: (now + ttl).max(exp),
                        }),
                        None => {
                            fence += 1;
                            grew = true;
                            SessionAcquire::Acquired(SessionGrant { fence, expires_at_ms: now + ttl })
                        }
                    };
                    if let SessionAcquire::Acquired(g) = want {
                        holder = Some((h, g.expires_at_ms));
                        granted.insert(h, g.fence);
                    }
                    prop_assert_eq!(got, want, "acquire by {} at {}", HOLDERS[h], now);
                    prop_assert_eq!(ready(store.session_acquire(SESSION, HOLDERS[h], ttl)).unwrap(), want);
                }
                SessionOp::Renew { holder: h, ttl } => {
                    let got = lease.renew(now, HOLDERS[h], ttl);
                    let want = match live {
                        Some((l, exp)) if l == h => {
                            let exp = (now + ttl).max(exp);
                            holder = Some((h, exp));
                            Some(SessionGrant { fence, expires_at_ms: exp })
                        }
                        _ => None,
                    };
                    prop_assert_eq!(got, want, "renew by {} at {}", HOLDERS[h], now);
                    prop_assert_eq!(ready(store.session_renew(SESSION, HOLDERS[h], ttl)).unwrap(), want);
                }
                SessionOp::Release { holder: h } => {
                    let got = lease.release(now, HOLDERS[h]);
                    let want = matches!(live, Some((l, _)) if l == h);
                    if want {
                        holder = None;
                    }
                    prop_assert_eq!(got, want, "release by {} at {}", HOLDERS[h], now);
                    prop_assert_eq!(ready(store.session_release(SESSION, HOLDERS[h])).unwrap(), want);
                }
                SessionOp::Append { holder: h } => {
                    let Some(&f) = granted.get(&h) else { continue };
                    let accepted = lease.fence_is_current(f);
                    prop_assert_eq!(accepted, f == fence, "append by {} with fence {} (latest {})", HOLDERS[h], f, fence);
                    let out = ready(store.append_fenced(SESSION, f, HOLDERS[h].as_bytes())).unwrap();
                    if accepted {
                        prop_assert_eq!(out, AppendOutcome::Appended { index: appended });
                        appended += 1;
                    } else {
                        prop_assert_eq!(out, AppendOutcome::Stale { latest: fence });
                    }
                }
                SessionOp::Probe { offset } => {
                    let f = fence.saturating_add_signed(offset);
                    let want = f == fence && fence != 0;
                    prop_assert_eq!(lease.fence_is_current(f), want, "probe {} (latest {})", f, fence);
                    let check = ready(store.fence_check(SESSION, f)).unwrap();
                    prop_assert_eq!(check.current, want);
                    prop_assert_eq!(check.latest, fence);
                }
            }
            prop_assert!(lease.fence >= before, "fence went back: {} -> {}", before, lease.fence);
            prop_assert_eq!(lease.fence, before + u64::from(grew), "fence grew exactly on a new grant");
            prop_assert_eq!(lease.fence, fence);
        }
        let records = ready(store.read_records(SESSION, 0, usize::MAX)).unwrap();
        prop_assert_eq!(records.len() as u64, appended);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Property 6: tasks racing on a multi-threaded runtime to admit turns
    /// for one user of a [`MemoryStore`] never hold more run leases than the
    /// cap. A task counts itself in after admission and out before release,
    /// so the count is a lower bound of the store's live leases. The fake
    /// clock never moves (leases never expire) and the turn rate is huge, so
    /// only concurrency binds.
    #[test]
    fn concurrent_admissions_never_exceed_cap(cap in 1u32..=4, tasks in 8usize..=16) {
        const ROUNDS: usize = 150;
        let params = TurnParams {
            turns: BucketSpec::new(1_000_000, 1_000, 1_000_000).expect("valid"),
            max_runs: cap,
            lease_ttl_ms: 120_000,
            concurrency_retry_ms: 1_000,
        };
        let tokens = BucketSpec::new(1_000, 1_000, 1_000).expect("valid");
        let clock = FakeClock::new(0);
        let store = MemoryStore::new(clock);
        let held = Arc::new(AtomicUsize::new(0));
        let max_held = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .expect("runtime");
        let (admitted, denied) = rt.block_on(async {
            let mut handles = Vec::new();
            for task in 0..tasks {
                let store = store.clone();
                let held = held.clone();
                let max_held = max_held.clone();
                handles.push(tokio::spawn(async move {
                    let (mut admitted, mut denied) = (0usize, 0usize);
                    for round in 0..ROUNDS {
                        let inv = format!("inv-{task}-{round}");
                        let req = TurnRequest { user: "u", invocation_id: &inv, params, budgets: &[]  };
                        let out = store.admit_turn(req).await.expect("memory store");
                        match out.admit {
                            Admit::Admitted { refreshed, .. } => {
                                assert!(!refreshed, "fresh invocation id reported as refreshed");
                                admitted += 1;
                                let n = held.fetch_add(1, Ordering::SeqCst) + 1;
                                max_held.fetch_max(n, Ordering::SeqCst);
                                assert!(n <= cap as usize, "{n} concurrent leases > cap {cap}");
                                tokio::task::yield_now().await;
                                let st = store.user_state("u", params.turns, tokens).await.expect("memory store");
                                assert!(st.leases.len() <= cap as usize, "user_state: {} leases > cap {cap}", st.leases.len());
                                assert!(st.leases.iter().any(|(id, _)| *id == inv), "own lease not listed");
                                assert!(store.renew_run("u", &inv, 120_000).await.expect("memory store").is_some());
                                held.fetch_sub(1, Ordering::SeqCst);
                                assert!(store.release_run("u", &inv).await.expect("memory store").released());
                                assert!(!store.release_run("u", &inv).await.expect("memory store").released());
                            }
                            Admit::Denied(d) => {
                                assert!(
                                    matches!(d, Denial::Limited { limit: Limit::Concurrency, .. }),
                                    "only concurrency should bind, got {d:?}"
                                );
                                denied += 1;
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                    (admitted, denied)
                }));
            }
            let mut totals = (0usize, 0usize);
            for h in handles {
                let (a, d) = h.await.expect("task panicked");
                totals.0 += a;
                totals.1 += d;
            }
            totals
        });
        let max = max_held.load(Ordering::SeqCst);
        prop_assert!(max <= cap as usize, "max observed {} > cap {}", max, cap);
        prop_assert!(max >= 1 && admitted >= 1);
        prop_assert_eq!(admitted + denied, tasks * ROUNDS);
        let st = ready(store.user_state("u", params.turns, tokens)).unwrap();
        prop_assert!(st.leases.is_empty(), "leases left after every release: {:?}", st.leases);
    }
}

#[derive(Debug, Clone)]
enum CallOp {
    /// Reserve `estimate` for run `run`, with request id `request` (if any).
    Reserve {
        run: u8,
        estimate: u64,
        max_wait_ms: u64,
        shadow: bool,
        request: Option<u8>,
    },
    /// Settle (`Some(actual)`) or refund the `pick`th reservation named so
    /// far (or a made-up one past the end).
    Close { pick: usize, actual: Option<u64> },
}

fn call_op(spec: BucketSpec) -> impl Strategy<Value = CallOp> {
    let cap = spec.capacity();
    let period = spec.period_ms();
    prop_oneof![
        3 => (0u8..2, 0..=cap, 0..=period, prop::bool::weighted(0.2), prop::option::of(0u8..3))
            .prop_map(|(run, estimate, max_wait_ms, shadow, request)| CallOp::Reserve {
                run,
                estimate,
                max_wait_ms,
                shadow,
                request,
            }),
        2 => (0usize..12, prop::option::of(0..=2 * cap))
            .prop_map(|(pick, actual)| CallOp::Close { pick, actual }),
    ]
}

proptest! {
    /// Property 7: the model-call bookkeeping of [`reserve`] against a
    /// model. A settle or refund applies at most once (a repeat answers
    /// `AlreadyClosed` with the refilled balance and changes no level); a
    /// reservation never named is `Unknown`; a run never counts more
    /// grants than `max_llm_calls` (shadow mode aside); a repeated request
    /// id answers its first grant and charges nothing.
    #[test]
    fn settles_apply_at_most_once_and_the_cap_holds(
        (spec, max_llm_calls, ops) in spec().prop_flat_map(|s| {
            (Just(s), 1u64..=4, prop::collection::vec((-1_000i64..=60_000, call_op(s)), 1..40))
        })
    ) {
        let mut state = CallState::default();
        let mut now = 1_000_000u64;
        // Every reservation named: (id, open?).
        let mut named: Vec<(ReservationId, bool)> = Vec::new();
        let mut grants: HashMap<(u8, u8), ReservationId> = HashMap::new();
        let mut counted: HashMap<u8, u64> = HashMap::new();
        for (step, op) in ops {
            now = now.saturating_add_signed(step);
            match op {
                CallOp::Reserve { run, estimate, max_wait_ms, shadow, request } => {
                    let inv = format!("run-{run}");
                    let rid = request.map(|r| format!("req-{r}"));
                    let before = state.tokens;
                    let req = ReserveRequest {
                        user: "u",
                        invocation_id: &inv,
                        tokens: spec,
                        estimate,
                        max_wait_ms,
                        max_llm_calls,
                        shadow,
                        request_id: rid.as_deref(),
                        budget: None,
                    };
                    let out = reserve::reserve(&mut state, now, &req);
                    if let Some(first) = request.and_then(|r| grants.get(&(run, r))) {
                        let ReserveOutcome::Granted { reservation, .. } = &out else {
                            return Err(TestCaseError::fail(format!("repeat not granted: {out:?}")));
                        };
                        prop_assert_eq!(reservation, first);
                        prop_assert_eq!(state.tokens, before, "a repeat charges nothing");
                        continue;
                    }
                    let n = counted.entry(run).or_default();
                    match out {
                        ReserveOutcome::Granted { reservation, wait_ms, .. } => {
                            prop_assert!(wait_ms <= max_wait_ms);
                            *n += 1;
                            prop_assert!(*n <= max_llm_calls, "run {} past its cap", run);
                            prop_assert_eq!(reservation.call, *n);
                            if let Some(r) = request {
                                grants.insert((run, r), reservation.clone());
                            }
                            named.push((reservation, true));
                        }
                        ReserveOutcome::Denied { denial, shadow_reservation } => {
                            if *n >= max_llm_calls {
                                prop_assert!(matches!(denial, Denial::CapReached { .. }), "{:?}", denial);
                            }
                            prop_assert_eq!(shadow_reservation.is_some(), shadow);
                            if let Some(s) = shadow_reservation {
                                *n += 1;
                                prop_assert_eq!(s.call, *n);
                                named.push((s, true));
                            }
                        }
                        ReserveOutcome::Superseded => {
                            return Err(TestCaseError::fail("nothing was reconciled"));
                        }
                    }
                }
                CallOp::Close { pick, actual } => {
                    let made_up = ReservationId::new("run-0", 99);
                    let id = named.get(pick).map_or(made_up, |(id, _)| id.clone());
                    let balance_before =
                        spec.unscale(bucket::refill(&spec, bucket::live(state.tokens, now), now).level);
                    let req = SettleRequest { user: "u", tokens: spec, reservation: &id, actual, budget: None  };
                    let out = reserve::settle(&mut state, now, &req);
                    match named.get_mut(pick) {
                        Some((_, open @ true)) => {
                            prop_assert!(matches!(out, SettleOutcome::Applied { .. }), "{:?}", out);
                            *open = false;
                        }
                        Some((_, false)) => {
                            prop_assert_eq!(out, SettleOutcome::AlreadyClosed { balance: balance_before });
                            let after = spec.unscale(
                                bucket::refill(&spec, bucket::live(state.tokens, now), now).level,
                            );
                            prop_assert_eq!(after, balance_before, "a repeated close changed the level");
                        }
                        None => prop_assert_eq!(out, SettleOutcome::Unknown),
                    }
                }
            }
        }
    }
}

/// A multi-bucket take over keys `a`, `b`, `c` (a key may be named twice),
/// each key with its own spec and saved state, and maybe a cooldown.
#[allow(clippy::type_complexity)]
fn multi_run() -> impl Strategy<
    Value = (
        Vec<(BucketSpec, Option<BucketState>)>,
        Vec<(usize, u64, u64)>,
        Option<Cooldown>,
    ),
> {
    prop::collection::vec(spec().prop_flat_map(|s| (Just(s), start_state(s))), 3).prop_flat_map(
        |keys| {
            let take = (0usize..3, 0u64..=60_000, 0u64..=120_000);
            (
                Just(keys),
                prop::collection::vec(take, 0..5),
                prop::option::of((1_000_000u64..1_200_000, 0u64..=100_000).prop_map(
                    |(until_ms, max_wait_ms)| Cooldown {
                        until_ms,
                        max_wait_ms,
                    },
                )),
            )
        },
    )
}

proptest! {
    /// Property 8: the multi-bucket take is all or nothing. Granted: each
    /// bucket's saved state is its take in order (a key named twice taken
    /// twice), the wait the largest of the takes' and the cooldown's.
    /// Refused or exceeds-capacity: every saved state is only refilled, and
    /// the bucket named is the first that can never grant, or the refusal
    /// with the largest hint.
    #[test]
    fn take_many_is_all_or_nothing((keys, picks, cooldown) in multi_run()) {
        const NAMES: [&str; 3] = ["a", "b", "c"];
        let now = 1_100_000u64;
        let takes: Vec<BucketTake<'_>> = picks
            .iter()
            .map(|&(k, cost, max_wait_ms)| BucketTake {
                key: NAMES[k],
                spec: keys[k].0,
                cost: cost % (2 * keys[k].0.capacity() + 1),
                max_wait_ms,
            })
            .collect();
        let states: Vec<Option<BucketState>> = picks.iter().map(|&(k, _, _)| keys[k].1).collect();
        let tr = take::take_many(&takes, &states, cooldown, now);
        prop_assert_eq!(tr.states.len(), takes.len());
        // The takes one by one, each from what the last take of its key left.
        let mut current: HashMap<usize, Option<BucketState>> = HashMap::new();
        let mut each = Vec::new();
        for (&(k, _, _), t) in picks.iter().zip(&takes) {
            let before = *current.entry(k).or_insert(keys[k].1);
            let one = bucket::take(&t.spec, before, now, t.cost, t.max_wait_ms);
            current.insert(k, Some(one.state));
            each.push(one);
        }
        let cooldown_left = cooldown.map(|c| (c.until_ms.saturating_sub(now), c.max_wait_ms));
        match tr.outcome {
            MultiTake::Granted { wait_ms } => {
                let mut wait = 0;
                for (one, saved) in each.iter().zip(&tr.states) {
                    let Take::Granted { wait_ms } = one.outcome else {
                        return Err(TestCaseError::fail("granted with a refused bucket"));
                    };
                    wait = wait.max(wait_ms);
                    prop_assert_eq!(*saved, (one.state, one.expires_at));
                }
                if let Some((left, max)) = cooldown_left {
                    prop_assert!(left <= max);
                    wait = wait.max(left);
                }
                prop_assert_eq!(wait_ms, wait);
            }
            refused => {
                for ((t, s), saved) in takes.iter().zip(&states).zip(&tr.states) {
                    let r = bucket::refill(&t.spec, *s, now);
                    prop_assert_eq!(*saved, (r, bucket::expires_at(&t.spec, r.level, now)));
                }
                let first_exceeds = takes.iter().position(|t| t.spec.exceeds(t.cost, t.max_wait_ms));
                match refused {
                    MultiTake::ExceedsCapacity { index } => {
                        prop_assert_eq!(Some(index), first_exceeds);
                    }
                    MultiTake::Refused { index, retry_after_ms } => {
                        prop_assert_eq!(first_exceeds, None);
                        let hints = each.iter().enumerate().filter_map(|(i, one)| match one.outcome {
                            Take::Refused { retry_after_ms } => Some((Some(i), retry_after_ms)),
                            _ => None,
                        });
                        let cooldown_hint = cooldown_left
                            .filter(|(left, max)| left > max)
                            .map(|(left, max)| (None, left - max));
                        let mut best: Option<(Option<usize>, u64)> = None;
                        for (i, h) in hints.chain(cooldown_hint) {
                            if best.is_none_or(|(_, b)| h > b) {
                                best = Some((i, h));
                            }
                        }
                        prop_assert_eq!(Some((index, retry_after_ms)), best);
                    }
                    MultiTake::Granted { .. } => unreachable!(),
                }
            }
        }
    }

    /// Property 9: the single take (the memory store's one-bucket path) is
    /// the multi-bucket take of one bucket, outcome and saved state alike.
    #[test]
    fn take_single_is_take_many_of_one(
        (s, state) in spec().prop_flat_map(|s| (Just(s), start_state(s))),
        cost in 0u64..=60_000,
        max_wait_ms in 0u64..=120_000,
        now in 900_000u64..1_300_000,
    ) {
        let t = BucketTake { key: "a", spec: s, cost: cost % (2 * s.capacity() + 1), max_wait_ms };
        let many = take::take_many(&[t], &[state], None, now);
        let (outcome, saved) = take::take_single(&t, state, now);
        prop_assert_eq!(outcome, many.outcome);
        prop_assert_eq!(vec![saved], many.states);
    }
}

/// The refill rule (SPEC §2 rules 1–2) in exact 128-bit arithmetic, as it
/// reads: the model `bucket::refill`'s 64-bit fast path must equal.
fn refill_model(spec: &BucketSpec, s: BucketState, now: u64) -> BucketState {
    let max = i128::from(bucket::MAX_SCALED);
    let mut level = i128::from(s.level);
    if s.period_ms != spec.period_ms() && s.period_ms > 0 {
        level = level.div_euclid(i128::from(s.period_ms)) * i128::from(spec.period_ms());
        level = level.max(-max);
    }
    let level = level + i128::from(now.saturating_sub(s.ts)) * i128::from(spec.amount());
    BucketState {
        level: level
            .min(i128::from(spec.capacity_scaled()))
            .clamp(-max, max) as i64,
        ts: s.ts.max(now),
        period_ms: spec.period_ms(),
    }
}

/// Any valid spec, up to the 2^53 bounds.
fn any_spec() -> impl Strategy<Value = BucketSpec> {
    prop_oneof![
        spec(),
        (1u64..=1 << 40, 1u64..=1 << 12, 1u64..=1 << 40)
            .prop_filter_map("past 2^53", |(a, p, c)| { BucketSpec::new(a, p, c).ok() }),
    ]
}

proptest! {
    /// `refill` equals the exact model for any state (including levels and
    /// times no store would save: the fast path must not depend on them),
    /// any time (forward by up to 2^64 ms, or back) and any period change.
    #[test]
    fn refill_is_exact(
        spec in any_spec(),
        level in any::<i64>(),
        ts in any::<u64>(),
        now in any::<u64>(),
        same_period in any::<bool>(),
        period in 0u64..=1 << 20,
    ) {
        let s = BucketState {
            level,
            ts,
            period_ms: if same_period { spec.period_ms() } else { period },
        };
        prop_assert_eq!(bucket::refill(&spec, Some(s), now), refill_model(&spec, s, now));
    }
}
