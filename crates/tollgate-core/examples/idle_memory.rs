//! Measures the heap held per idle user by `MemoryStore`, and that expiry
//! returns it.
//!
//! ```sh
//! cargo run --release -p tollgate-core --example idle_memory -- 1000000
//! ```
//!
//! Two profiles: a user who made one turn (turn bucket; lease released),
//! and one who also made one model call (token bucket, the run's call counter
//! and its settled reservation). Heap bytes are counted by a wrapping global
//! allocator, so they are exact for this process.
#![allow(clippy::print_stdout)] // a measurement tool: printing is its job

use std::alloc::System;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tollgate_core::lease::TurnParams;
use tollgate_core::store::{ReserveRequest, SettleRequest, TurnRequest};
use tollgate_core::{BucketSpec, FakeClock, MemoryStore, Store};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn ready<T>(f: impl Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryStore futures are always ready"),
    }
}

fn held(region: &Region<'_, System>) -> i64 {
    let s = region.change();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64 + s.bytes_reallocated as i64
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let turns = BucketSpec::new(20, 60_000, 5).expect("valid");
    let tokens = BucketSpec::new(60_000, 60_000, 60_000).expect("valid");
    let params = TurnParams {
        turns,
        max_runs: 2,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    };
    let users: Vec<String> = (0..n).map(|i| format!("user-{i:08}")).collect();

    for with_call in [false, true] {
        let clock = FakeClock::new(1_700_000_000_000);
        let store = MemoryStore::new(clock.clone());
        let region = Region::new(GLOBAL);
        for u in &users {
            let req = TurnRequest {
                user: u,
                invocation_id: "inv-0001",
                params,
                budgets: &[],
            };
            let _ = ready(store.admit_turn(req)).expect("memory store");
            if with_call {
                let r = ready(store.reserve_tokens(ReserveRequest {
                    user: u,
                    invocation_id: "inv-0001",
                    tokens,
                    estimate: 6_000,
                    max_wait_ms: 0,
                    max_llm_calls: 500,
                    shadow: false,
                    request_id: None,
                    budget: None,
                }))
                .expect("memory store");
                if let tollgate_core::store::ReserveOutcome::Granted { reservation, .. } = r {
                    let _ = ready(store.settle(SettleRequest {
                        user: u,
                        tokens,
                        reservation: &reservation,
                        actual: Some(5_000),
                        budget: None,
                    }))
                    .expect("memory store");
                }
            }
            ready(store.release_run(u, "inv-0001")).expect("memory store");
        }
        let live = held(&region);
        let profile = if with_call {
            "one turn + one settled model call"
        } else {
            "one turn"
        };
        println!(
            "{profile}: {n} idle users hold {live} heap bytes = {:.1} bytes/user ({} entries)",
            live as f64 / n as f64,
            store.stats().users
        );
        // Past every expiry (the run's call record lasts 1 h).
        clock.advance(3_600_000 + 120_000);
        store.purge_expired();
        println!(
            "  after expiry and purge: {} heap bytes held, {} entries",
            held(&region),
            store.stats().users
        );
        drop(store);
    }
}
