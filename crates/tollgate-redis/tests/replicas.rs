//! Four replicas, each with its own `RedisStore` and connection, hammer one
//! user at once for two seconds on the real clock (Redis `TIME`). The fleet
//! shares one truth: the granted token cost stays within capacity + rate ×
//! elapsed, and concurrently held run leases never exceed the cap.
//!
//! Also what replicas see of each other's top-user counts (written in
//! batches, off the decision path) and, across a rolling upgrade, of each
//! other's tokens per minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::lease::{Admit, TurnParams};
use tollgate_core::store::{ReserveOutcome, ReserveRequest, TurnRequest};
use tollgate_core::{BucketSpec, Clock, Store, SystemClock};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{shared_url, unique_prefix};

const RATE_PER_S: u64 = 2_000;
const CAPACITY: u64 = 1_000;
const MAX_RUNS: u32 = 3;
const RUN_FOR_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_share_one_truth() {
    let prefix = unique_prefix();
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::connect(
            RedisConfig::standalone(shared_url())
                .with_key_prefix(prefix.clone())
                .with_op_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("connect");
        replicas.push(store);
    }
    let tokens = BucketSpec::new(RATE_PER_S, 1_000, CAPACITY).unwrap();
    let turns = BucketSpec::new(1_000_000, 1_000, 1_000_000).unwrap();
    let granted = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let max_held = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicU64::new(0));

    let start = SystemClock.now_ms();
    let deadline = start + RUN_FOR_MS;
    let mut tasks = Vec::new();
    for (r, store) in replicas.iter().enumerate() {
        for t in 0..4 {
            // Token reservations.
            let (reserver, granted, calls) = (store.clone(), granted.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                let store = reserver;
                let mut n = 0u64;
                while SystemClock.now_ms() < deadline {
                    let cost = 1 + (n * 7 + t) % 40;
                    let inv = format!("r{r}t{t}b{}", n / 400);
                    let out = store
                        .reserve_tokens(ReserveRequest {
                            user: "hot",
                            invocation_id: &inv,
                            tokens,
                            estimate: cost,
                            max_wait_ms: 0,
                            max_llm_calls: 500,
                            shadow: false,
                            request_id: None,
                            budget: None,
                        })
                        .await
                        .expect("reserve");
                    if let ReserveOutcome::Granted { wait_ms, .. } = out {
                        assert_eq!(wait_ms, 0);
                        granted.fetch_add(cost, Ordering::Relaxed);
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            }));
            // Run leases.
            let (store, held, max_held, admitted) = (
                store.clone(),
                held.clone(),
                max_held.clone(),
                admitted.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let inv = format!("run-{r}-{t}");
                let params = TurnParams {
                    turns,
                    max_runs: MAX_RUNS,
                    lease_ttl_ms: 60_000,
                    concurrency_retry_ms: 1_000,
                };
                while SystemClock.now_ms() < deadline {
                    let out = store
                        .admit_turn(TurnRequest {
                            user: "hot",
                            invocation_id: &inv,
                            params,
                            budgets: &[],
                        })
                        .await
                        .expect("admit");
                    if let Admit::Admitted { .. } = out.admit {
                        let now_held = held.fetch_add(1, Ordering::SeqCst) + 1;
                        max_held.fetch_max(now_held, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        assert!(
                            store
                                .release_run("hot", &inv)
                                .await
                                .expect("release")
                                .released()
                        );
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = SystemClock.now_ms() - start;
    let granted = granted.load(Ordering::Relaxed);
    // Redis TIME and this clock both run in real time; allow 50 ms of skew
    // between the first and last script and our own readings.
    let bound = CAPACITY + RATE_PER_S * (elapsed + 50) / 1_000;
    eprintln!(
        "{} reservations, {granted} tokens granted in {elapsed} ms (bound {bound}); \
         {} admissions, at most {} leases held at once",
        calls.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
        max_held.load(Ordering::SeqCst)
    );
    assert!(granted <= bound, "granted {granted} > bound {bound}");
    assert!(
        granted >= RATE_PER_S * elapsed / 1_000 / 2,
        "the limiter let through far less than the rate: {granted}"
    );
    assert!(max_held.load(Ordering::SeqCst) <= MAX_RUNS as usize);
    assert!(admitted.load(Ordering::Relaxed) > 0);
}

/// Each replica counts top users in memory and its task writes them to Redis
/// off the decision path: another replica reads them within the flush
/// interval without any flush of the writer's being awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_users_of_other_replicas_arrive_by_the_flush() {
    let prefix = unique_prefix();
    let connect = || {
        RedisStore::connect(
            RedisConfig::standalone(shared_url())
                .with_key_prefix(prefix.clone())
                .with_op_timeout(Duration::from_secs(2)),
        )
    };
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let tokens = BucketSpec::new(1_000_000, 1_000, 1_000_000).unwrap();
    for (user, estimate) in [("ua", 700), ("ub", 900)] {
        let out = a
            .reserve_tokens(ReserveRequest {
                user,
                invocation_id: "run",
                tokens,
                estimate,
                max_wait_ms: 0,
                max_llm_calls: 10,
                shadow: false,
                request_id: None,
                budget: None,
            })
            .await
            .unwrap();
        assert!(matches!(out, ReserveOutcome::Granted { .. }), "{out:?}");
    }
    let seen = tollgate_testkit::redis::wait_until(5, || async {
        let top = b.top_users(10).await.unwrap();
        top.iter()
            .map(|t| (t.user.as_str(), t.tokens_last_minute))
            .eq([("ub", 900), ("ua", 700)])
    })
    .await;
    assert!(seen, "replica a's counts reach replica b's read");
}

/// A rolling upgrade: replicas before this version kept a user's tokens per
/// minute in the token bucket hash (`{prefix}:tok:{user}`, fields `um`,
/// `uc`, `up`); this version keeps them in the packed token key and its user
/// view adds both (docs/spec.md §6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_view_counts_old_replicas_tokens_too() {
    let prefix = unique_prefix();
    let clock = tollgate_core::FakeClock::new(tollgate_testkit::T0);
    let store = RedisStore::connect(
        RedisConfig::standalone(shared_url())
            .with_key_prefix(prefix.clone())
            .with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap()
    .with_clock_override(clock.clone());
    let minute = clock.now_ms() / 60_000;
    // What an old replica wrote: 400 this minute, 600 the minute before.
    let client = redis::Client::open(shared_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let old = format!("{prefix}:tok:{{u1}}");
    let _: () = redis::pipe()
        .hset_multiple(&old, &[("um", minute), ("uc", 400), ("up", 0)])
        .pexpire(&old, 120_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let tokens = BucketSpec::new(1_000_000, 1_000, 1_000_000).unwrap();
    let out = store
        .reserve_tokens(ReserveRequest {
            user: "u1",
            invocation_id: "run",
            tokens,
            estimate: 250,
            max_wait_ms: 0,
            max_llm_calls: 10,
            shadow: false,
            request_id: None,
            budget: None,
        })
        .await
        .unwrap();
    assert!(matches!(out, ReserveOutcome::Granted { .. }), "{out:?}");
    let turns = BucketSpec::new(10, 1_000, 10).unwrap();
    let state = store.user_state("u1", turns, tokens).await.unwrap();
    assert_eq!(state.tokens_last_minute, 650, "400 old + 250 new");
}

/// A store that counts the calls reaching Redis.
#[derive(Clone)]
struct Counted {
    inner: RedisStore,
    calls: Arc<AtomicU64>,
}

impl Store for Counted {
    fn call<O: tollgate_core::store::Op>(
        &self,
        op: O,
    ) -> impl std::future::Future<Output = Result<O::Reply, tollgate_core::StoreError>> + Send {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.call(op)
    }
}

/// Refusals answered locally (SPEC §3) keep the fleet exact: four
/// replicas, each a `Limiter` keeping refusals on its own `RedisStore`,
/// share one user whose plan grants a turn a second (burst 2), offered
/// 4,000 admissions a second for a minute (fake clock, Redis on the same
/// clock). The fleet grants what one store would — the burst plus one per
/// refill — and Redis sees a few calls per refill, not the flood.
#[tokio::test]
async fn four_replicas_keeping_refusals_grant_what_the_store_allows() {
    use tollgate_core::{FakeClock, Limiter, PlanConfig, RateConfig};
    use tollgate_testkit::scenarios::{book_with, support};
    const STEP_MS: u64 = 10;
    const PER_STEP: usize = 10;
    const RUN_MS: u64 = 60_000;
    let clock = FakeClock::new(tollgate_testkit::T0);
    let book = book_with(PlanConfig {
        turns: RateConfig {
            amount: 1,
            period_ms: 1_000,
            burst: Some(2),
        },
        concurrent_runs: 1_000,
        ..support()
    });
    let prefix = unique_prefix();
    let calls = Arc::new(AtomicU64::new(0));
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let redis = RedisStore::connect(
            RedisConfig::standalone(shared_url())
                .with_key_prefix(prefix.clone())
                .with_op_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("connect")
        .with_clock_override(clock.clone());
        let store = Counted {
            inner: redis,
            calls: calls.clone(),
        };
        replicas.push(Limiter::new(store, clock.clone(), book.clone()));
    }
    let (mut granted, mut refused, mut n) = (0u64, 0u64, 0u64);
    let start = clock.now_ms();
    while clock.now_ms() - start < RUN_MS {
        for l in &replicas {
            for _ in 0..PER_STEP {
                n += 1;
                let inv = format!("i{n}");
                if l.admit_turn("flood", inv.as_str())
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    granted += 1;
                    l.release_run("flood", inv.as_str()).await.unwrap();
                } else {
                    refused += 1;
                }
            }
        }
        clock.advance(STEP_MS);
    }
    // Ideal: the burst, then one a second over the minute (the refill at
    // 60 s falls after the last step).
    let ideal = 2 + RUN_MS / 1_000 - 1;
    assert!(
        granted.abs_diff(ideal) <= 1,
        "granted {granted}, ideal {ideal}"
    );
    let admissions = calls.load(Ordering::Relaxed) - granted; // less the releases
    let per_refusal = admissions.saturating_sub(granted) as f64 / refused as f64;
    assert!(
        admissions <= granted + 4 * (RUN_MS / 1_000 + 2),
        "{admissions} admissions reached Redis for {granted} grants"
    );
    assert!(per_refusal < 0.01, "{per_refusal} calls per refusal");
    eprintln!(
        "4 replicas, 1 min, {} offered: {granted} granted (ideal {ideal}), {refused} refused, \
         {admissions} admission calls reached Redis ({per_refusal:.4} per refusal)",
        granted + refused
    );
}
