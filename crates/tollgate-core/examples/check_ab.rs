//! The memory store's keyed check beside governor's `check_key`, in one
//! process, alternating A B A B in short batches, so both see the same
//! machine at nearly the same moment (the criterion group `check` of
//! `benches/limiter.rs` runs each case for seconds in turn, which a loaded
//! machine skews).
//!
//! ```sh
//! cargo run --release -p tollgate-core --example check_ab -- 100000 1 monotonic
//! cargo run --release -p tollgate-core --example check_ab -- 1 2 system
//! ```
//!
//! Arguments: keys (default 100,000; pre-built `String`s walked in order),
//! threads (1 or 2; default 1), the store's clock (`monotonic`, quanta's
//! counter like governor's, or `system`, the wall clock; default
//! `monotonic`), rounds (default 400) and the tollgate call (`sync`,
//! `MemoryStore::take_single`, the default; or `async`, the same take
//! through `Store::take_many`'s future, polled once). A round is a batch of
//! 20,000 checks on tollgate (one bucket, cost 1, no wait, always granted)
//! then one on governor (`RateLimiter::keyed`, 10^9 per second, always
//! allowed); with 2 threads both run each batch at once
//! (from a barrier, on halves of the key set) and a batch's time is its
//! wall time over both threads' checks. Printed: the median and 10th
//! percentile ns per check of each, and the median (10th, 90th
//! percentile) of the rounds' ratios tollgate / governor.
#![allow(clippy::print_stdout)]
// a measurement tool: printing is its job
// Measuring wall time is its job: decisions still read the store's clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use governor::{Quota, RateLimiter};
use tollgate_core::store::{BucketTake, MultiTake};
use tollgate_core::{BucketSpec, MemoryStore, MonotonicClock, Store, SystemClock};

const BATCH: usize = 20_000;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryStore futures are always ready"),
    }
}

fn pct(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let clock = args.next().unwrap_or_else(|| "monotonic".to_owned());
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(400);
    let call = args.next().unwrap_or_else(|| "sync".to_owned());
    assert!(
        call == "sync" || call == "async",
        "call must be `sync` or `async`"
    );
    assert!(threads == 1 || threads == 2, "1 or 2 threads");
    let keys: Vec<String> = (0..n).map(|i| format!("user-{i:06}")).collect();
    let spec = BucketSpec::new(1_000_000_000, 1_000, 1_000_000_000).expect("valid spec");
    let store = match clock.as_str() {
        "monotonic" => MemoryStore::new(MonotonicClock::new()),
        "system" => MemoryStore::new(SystemClock),
        other => panic!("clock must be `monotonic` or `system`, not {other:?}"),
    };
    let take = |key: &str| {
        let takes = [BucketTake {
            key,
            spec,
            cost: 1,
            max_wait_ms: 0,
        }];
        if call == "sync" {
            store.take_single(&takes[0]).expect("memory store")
        } else {
            ready(store.take_many(&takes, None)).expect("memory store")
        }
    };
    let gov = RateLimiter::keyed(Quota::per_second(
        NonZeroU32::new(1_000_000_000).expect("non-zero"),
    ));
    for k in &keys {
        assert_eq!(take(k), MultiTake::Granted { wait_ms: 0 });
        assert!(gov.check_key(k).is_ok());
    }
    let barrier = Barrier::new(threads);
    // Each thread's batch times (tollgate, governor), as thread 0 saw them
    // between barriers: the wall time of both threads' batches.
    let times: Vec<(f64, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, keys, take, gov) = (&barrier, &keys, &take, &gov);
                s.spawn(move || {
                    let mut i = t * n / threads;
                    let mut j = i;
                    let mut out = Vec::with_capacity(rounds);
                    for _ in 0..rounds {
                        barrier.wait();
                        let start = Instant::now();
                        for _ in 0..BATCH {
                            black_box(take(&keys[i]));
                            i = if i + 1 == n { 0 } else { i + 1 };
                        }
                        barrier.wait();
                        let a = start.elapsed().as_nanos() as f64;
                        let start = Instant::now();
                        for _ in 0..BATCH {
                            let _ = black_box(gov.check_key(&keys[j]));
                            j = if j + 1 == n { 0 } else { j + 1 };
                        }
                        barrier.wait();
                        let b = start.elapsed().as_nanos() as f64;
                        let per = (BATCH * threads) as f64;
                        out.push((a / per, b / per));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .next()
            .expect("thread 0")
    });
    let mut a: Vec<f64> = times.iter().map(|t| t.0).collect();
    let mut b: Vec<f64> = times.iter().map(|t| t.1).collect();
    let mut r: Vec<f64> = times.iter().map(|t| t.0 / t.1).collect();
    println!(
        "{n} keys, {threads} thread(s), {clock} clock, {call}, {rounds} rounds of {BATCH}: \
         tollgate {:.1} ns (p10 {:.1}), governor {:.1} ns (p10 {:.1}), \
         ratio {:.2} (p10 {:.2}, p90 {:.2})",
        pct(&mut a, 50),
        pct(&mut a, 10),
        pct(&mut b, 50),
        pct(&mut b, 10),
        pct(&mut r, 50),
        pct(&mut r, 10),
        pct(&mut r, 90),
    );
}
