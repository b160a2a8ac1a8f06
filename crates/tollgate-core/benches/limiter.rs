//! Criterion benchmarks of the [`MemoryStore`] hot paths, beside governor's
//! keyed limiter.
//!
//! Every case runs on 1 key and on 100,000 keys (pre-built `String`s, walked
//! in order, resuming where the previous sample stopped; a second thread
//! starts halfway through the set), on 1 thread and on 2 threads:
//!
//! * `check/tollgate`: one bucket check, `Store::take_many` with a single
//!   [`BucketTake`] and no cooldown (cost 1, no wait; the rate is so high
//!   that it always grants).
//! * `check/governor`: `RateLimiter::keyed(Quota::per_second(10^9))`
//!   `check_key` on the same `String` keys (always allowed).
//! * `check/tollgate_monotonic_clock`: the tollgate check on a
//!   [`MonotonicClock`] (quanta's TSC counter, like governor's clock).
//! * `check/tollgate_sync_monotonic_clock`: the same check on a
//!   [`MonotonicClock`] through [`MemoryStore::take_single`], the
//!   synchronous call an in-process caller makes (governor's `check_key` is
//!   synchronous too): no future to build and poll.
//! * `check/tollgate_fake_clock`: the tollgate check on a [`FakeClock`]
//!   (1 thread only), to show what reading the wall clock costs.
//! * `admit_release`: `Store::admit_turn` then `Store::release_run` of the
//!   same invocation (one id per thread, cap of 8 runs): one op is both calls,
//!   so leases never fill up.
//! * `reserve`: `Store::reserve_tokens` of 1,000 tokens on a 10^12 tokens/s
//!   bucket with `max_llm_calls = u64::MAX` (always granted, wait 0; one
//!   invocation id per thread). Each reservation stays open (nothing settles
//!   it) and the store remembers it, so the store is rebuilt and pre-warmed
//!   outside the timed region after [`rebuild_after`] reservations: 3 per key
//!   and thread, which keeps every list of open reservations short on
//!   100,000 keys (on 1 key, one list grows through each sample).
//! * `reserve_settle`: the full lifecycle of a model call, `reserve_tokens`
//!   then `settle` of that reservation with the estimate as actual usage; one
//!   op is both calls, and the state stays bounded.
//! * `clock`: `SystemClock::now_ms`, `MonotonicClock::now_ms` and governor's
//!   default (quanta) clock.
//!
//! Store futures are ready: they are polled once with [`Waker::noop`], no
//! runtime. All stores and keys are built, and every key touched once,
//! before timing.
//!
//! Timing with 2 threads: the iterations are split evenly over the threads,
//! which start together at a barrier; the reported time is the wall time from
//! the first thread's start to the last thread's end divided by the total ops
//! of both threads, i.e. the inverse of the aggregate throughput. Perfect
//! scaling would halve the 1-thread figure; contention shows as a figure at
//! or above it.

// Benchmarks measure wall time: `std::time::Instant` is what criterion's
// `iter_custom` expects, and the workspace ban on it (tollgate core must read
// time through `Clock`) does not apply to a measuring harness.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion};
use governor::clock::Clock as _;
use governor::{Quota, RateLimiter};
use tollgate_core::bucket::BucketSpec;
use tollgate_core::lease::{Admit, TurnParams};
use tollgate_core::store::{
    BucketTake, MultiTake, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest,
    TurnRequest,
};
use tollgate_core::{Clock, FakeClock, MemoryStore, MonotonicClock, Store, SystemClock};

/// Key-set sizes.
const KEY_SETS: [usize; 2] = [1, 100_000];
/// Thread counts.
const THREADS: [usize; 2] = [1, 2];
/// Invocation ids, one per thread.
const INVOCATIONS: [&str; 2] = ["inv-0", "inv-1"];
/// Reservations after which the reserve benchmark starts on a fresh store:
/// 3 per key and thread, so with the pre-warming one no invocation holds more
/// than 4 open reservations on 100,000 keys. On 1 key that means a fresh
/// store every sample (one invocation's list grows through the sample).
fn rebuild_after(keys: usize, threads: usize) -> u64 {
    3 * (keys * threads) as u64
}

/// Polls a ready future once, without a runtime.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryStore futures are always ready"),
    }
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user-{i:06}")).collect()
}

/// A rate that always grants a cost-1 check: 10^9 per second, burst 10^9.
fn check_spec() -> BucketSpec {
    BucketSpec::new(1_000_000_000, 1_000, 1_000_000_000).expect("valid spec")
}

fn turn_params() -> TurnParams {
    TurnParams {
        turns: check_spec(),
        max_runs: 8,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    }
}

fn reserve_req<'a>(user: &'a str, invocation_id: &'a str) -> ReserveRequest<'a> {
    ReserveRequest {
        user,
        invocation_id,
        // 10^12 tokens per second, burst 10^12.
        tokens: BucketSpec::new(1_000_000_000_000, 1_000, 1_000_000_000_000).expect("valid spec"),
        estimate: 1_000,
        max_wait_ms: 2_000,
        max_llm_calls: u64::MAX,
        shadow: false,
        request_id: None,
        budget: None,
    }
}

fn take(store: &MemoryStore, key: &str) -> MultiTake {
    let takes = [BucketTake {
        key,
        spec: check_spec(),
        cost: 1,
        max_wait_ms: 0,
    }];
    now(store.take_many(&takes, None)).expect("memory store")
}

/// The same check through [`MemoryStore::take_single`]: no future.
fn take_sync(store: &MemoryStore, key: &str) -> MultiTake {
    let take = BucketTake {
        key,
        spec: check_spec(),
        cost: 1,
        max_wait_ms: 0,
    };
    store.take_single(&take).expect("memory store")
}

fn admit_release(store: &MemoryStore, thread: usize, user: &str) -> (Admit, bool) {
    let inv = INVOCATIONS[thread];
    let admitted = now(store.admit_turn(TurnRequest {
        user,
        invocation_id: inv,
        params: turn_params(),
        budgets: &[],
    }))
    .expect("memory store");
    let released = now(store.release_run(user, inv)).expect("memory store");
    (admitted.admit, released.released())
}

fn reserve(store: &MemoryStore, thread: usize, user: &str) -> ReserveOutcome {
    now(store.reserve_tokens(reserve_req(user, INVOCATIONS[thread]))).expect("memory store")
}

fn reserve_settle(store: &MemoryStore, thread: usize, user: &str) -> SettleOutcome {
    let req = reserve_req(user, INVOCATIONS[thread]);
    let ReserveOutcome::Granted { reservation, .. } = reserve(store, thread, user) else {
        panic!("the token bucket always grants");
    };
    now(store.settle(SettleRequest {
        user,
        tokens: req.tokens,
        reservation: &reservation,
        actual: Some(req.estimate),
        budget: None,
    }))
    .expect("memory store")
}

/// Where each thread starts on a set of `keys` keys: evenly spread.
fn cursors(keys: usize, threads: usize) -> Vec<usize> {
    (0..threads).map(|t| t * keys / threads).collect()
}

/// Runs `iters` calls of `op(thread, key)` split evenly over the threads,
/// thread `t` walking `keys` in order from `cursors[t]` (left where it
/// stopped, so successive samples cover the whole set, not just its first
/// keys), and answers the wall time from the first thread's start to the last
/// one's end.
fn run<F>(iters: u64, keys: &[String], cursors: &mut [usize], op: &F) -> Duration
where
    F: Fn(usize, &String) + Sync,
{
    let walk = |thread: usize, mut i: usize, n: u64| {
        for _ in 0..n {
            op(thread, &keys[i]);
            i += 1;
            if i == keys.len() {
                i = 0;
            }
        }
        i
    };
    if let [cursor] = cursors {
        let start = Instant::now();
        *cursor = walk(0, *cursor, iters);
        return start.elapsed();
    }
    let threads = cursors.len() as u64;
    let barrier = Barrier::new(cursors.len());
    let share = iters.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = cursors
            .iter_mut()
            .enumerate()
            .map(|(t, cursor)| {
                let n = share.min(iters.saturating_sub(share * t as u64));
                let (barrier, walk) = (&barrier, &walk);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    *cursor = walk(t, *cursor, n);
                    (start, Instant::now())
                })
            })
            .collect();
        let spans: Vec<(Instant, Instant)> = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect();
        let start = spans.iter().map(|s| s.0).min().expect("threads");
        let end = spans.iter().map(|s| s.1).max().expect("threads");
        end - start
    })
}

fn label(keys: usize, threads: usize) -> String {
    format!("{keys}keys/{threads}thr")
}

fn bench<F>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    keys: &[String],
    threads: usize,
    op: F,
) where
    F: Fn(usize, &String) + Sync,
{
    let mut at = cursors(keys.len(), threads);
    g.bench_function(BenchmarkId::new(name, label(keys.len(), threads)), |b| {
        b.iter_custom(|iters| run(iters, keys, &mut at, &op));
    });
}

fn check(c: &mut Criterion) {
    let mut g = c.benchmark_group("check");
    for n in KEY_SETS {
        let keys = keys(n);
        for threads in THREADS {
            let store = MemoryStore::new(SystemClock);
            for k in &keys {
                assert_eq!(take(&store, k), MultiTake::Granted { wait_ms: 0 });
            }
            bench(&mut g, "tollgate", &keys, threads, |_, k| {
                black_box(take(&store, k));
            });

            let mono = MemoryStore::new(MonotonicClock::new());
            for k in &keys {
                assert_eq!(take(&mono, k), MultiTake::Granted { wait_ms: 0 });
            }
            bench(
                &mut g,
                "tollgate_sync_monotonic_clock",
                &keys,
                threads,
                |_, k| {
                    black_box(take_sync(&mono, k));
                },
            );
            bench(
                &mut g,
                "tollgate_monotonic_clock",
                &keys,
                threads,
                |_, k| {
                    black_box(take(&mono, k));
                },
            );

            let gov = RateLimiter::keyed(Quota::per_second(
                NonZeroU32::new(1_000_000_000).expect("non-zero"),
            ));
            for k in &keys {
                assert!(gov.check_key(k).is_ok());
            }
            bench(&mut g, "governor", &keys, threads, |_, k| {
                let _ = black_box(gov.check_key(k));
            });
        }
        let store = MemoryStore::new(FakeClock::new(1_000));
        for k in &keys {
            assert_eq!(take(&store, k), MultiTake::Granted { wait_ms: 0 });
        }
        bench(&mut g, "tollgate_fake_clock", &keys, 1, |_, k| {
            black_box(take(&store, k));
        });
    }
    g.finish();
}

fn admit(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_release");
    for n in KEY_SETS {
        let keys = keys(n);
        for threads in THREADS {
            let store = MemoryStore::new(SystemClock);
            for k in &keys {
                for t in 0..threads {
                    let (admit, released) = admit_release(&store, t, k);
                    assert!(
                        matches!(
                            admit,
                            Admit::Admitted {
                                refreshed: false,
                                ..
                            }
                        ) && released
                    );
                }
            }
            bench(&mut g, "tollgate", &keys, threads, |t, k| {
                let _ = black_box(admit_release(&store, t, k));
            });
        }
    }
    g.finish();
}

/// A store on which every key already has a live invocation per thread.
fn reserve_store(keys: &[String], threads: usize) -> MemoryStore {
    let store = MemoryStore::new(SystemClock);
    for k in keys {
        for t in 0..threads {
            let out = reserve(&store, t, k);
            assert!(
                matches!(out, ReserveOutcome::Granted { wait_ms: 0, .. }),
                "{out:?}"
            );
        }
    }
    store
}

fn reserve_tokens(c: &mut Criterion) {
    let mut g = c.benchmark_group("reserve");
    for n in KEY_SETS {
        let keys = keys(n);
        for threads in THREADS {
            let mut at = cursors(n, threads);
            let mut current: Option<(MemoryStore, u64)> = None;
            g.bench_function(BenchmarkId::new("tollgate", label(n, threads)), |b| {
                b.iter_custom(|iters| {
                    if current
                        .as_ref()
                        .is_none_or(|(_, used)| used + iters > rebuild_after(n, threads))
                    {
                        // Drop the old store first: its memory is not timed.
                        current = None;
                        current = Some((reserve_store(&keys, threads), 0));
                    }
                    let (store, used) = current.as_mut().expect("just built");
                    *used += iters;
                    let store = &*store;
                    run(iters, &keys, &mut at, &|t, k: &String| {
                        let _ = black_box(reserve(store, t, k));
                    })
                });
            });
        }
    }
    g.finish();
}

fn reserve_and_settle(c: &mut Criterion) {
    let mut g = c.benchmark_group("reserve_settle");
    for n in KEY_SETS {
        let keys = keys(n);
        for threads in THREADS {
            let store = MemoryStore::new(SystemClock);
            for k in &keys {
                for t in 0..threads {
                    let out = reserve_settle(&store, t, k);
                    assert!(matches!(out, SettleOutcome::Applied { .. }), "{out:?}");
                }
            }
            bench(&mut g, "tollgate", &keys, threads, |t, k| {
                let _ = black_box(reserve_settle(&store, t, k));
            });
        }
    }
    g.finish();
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    g.bench_function("tollgate_system_clock_now_ms", |b| {
        b.iter(|| black_box(SystemClock.now_ms()));
    });
    let mono = MonotonicClock::new();
    g.bench_function("tollgate_monotonic_clock_now_ms", |b| {
        b.iter(|| black_box(mono.now_ms()));
    });
    let quanta = governor::clock::DefaultClock::default();
    g.bench_function("governor_default_clock_now", |b| {
        b.iter(|| black_box(quanta.now()));
    });
    g.finish();
}

// What `criterion_group!`/`criterion_main!` expand to, written out so no
// undocumented `pub fn` is generated (missing_docs).
fn main() {
    let mut c = Criterion::default().configure_from_args();
    check(&mut c);
    admit(&mut c);
    reserve_tokens(&mut c);
    reserve_and_settle(&mut c);
    clocks(&mut c);
    c.final_summary();
}
