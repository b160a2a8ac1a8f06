//! Refusals answered locally (SPEC §3), through the `Limiter` on the
//! memory store behind a decorator that counts the store's calls, on a
//! fake clock: a refused user's further requests cost the store nothing
//! until the store's hint ends, and each local answer is the store's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate_core::store::Op;
use tollgate_core::{
    Clock, Decision, Denial, FakeClock, Limit, Limiter, MemoryStore, PlanConfig, RateConfig, Store,
    StoreError,
};
use tollgate_testkit::scenarios::{book_with, support};

/// A store that counts the calls that reach it.
#[derive(Clone)]
struct Counting {
    inner: MemoryStore,
    calls: Arc<AtomicUsize>,
}

impl Store for Counting {
    fn call<O: Op>(
        &self,
        op: O,
    ) -> impl std::future::Future<Output = Result<O::Reply, StoreError>> + Send {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.call(op)
    }
}

impl Counting {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }
}

const T0: u64 = 1_800_000_000_000;

/// Two turns of burst, one more every 10 s; runs enough.
fn plans(shadow: bool) -> tollgate_core::PlanBook {
    book_with(PlanConfig {
        turns: RateConfig {
            amount: 1,
            period_ms: 10_000,
            burst: Some(2),
        },
        max_wait_ms: 0,
        concurrent_runs: 100,
        shadow,
        ..support()
    })
}

fn limiter(shadow: bool) -> (Limiter<Counting>, Counting, FakeClock) {
    let clock = FakeClock::new(T0);
    let store = Counting {
        inner: MemoryStore::new(clock.clone()),
        calls: Arc::default(),
    };
    (
        Limiter::new(store.clone(), clock.clone(), plans(shadow)),
        store,
        clock,
    )
}

fn turn_rate(d: &Decision<impl std::fmt::Debug>) -> Option<u64> {
    match d {
        Decision::Denied(Denial::Limited {
            limit: Limit::TurnRate,
            retry_after_ms,
        }) => Some(*retry_after_ms),
        _ => None,
    }
}

#[tokio::test]
async fn a_flood_of_refused_admissions_asks_the_store_once_per_refill() {
    let (l, store, clock) = limiter(false);
    assert!(l.admit_turn("u", "r1").await.unwrap().is_allowed());
    assert!(l.admit_turn("u", "r2").await.unwrap().is_allowed());
    let first = l.admit_turn("u", "r3").await.unwrap();
    let hint = turn_rate(&first).expect("refused by the store");
    assert_eq!(store.calls(), 3);
    // 1,000 more new runs over 4 s: answered here, each with what is left
    // of the store's hint, the store untouched.
    for i in 0..1_000u64 {
        if i % 250 == 0 && i > 0 {
            clock.advance(1_000);
        }
        let d = l.admit_turn("u", format!("x{i}").as_str()).await.unwrap();
        let elapsed = clock.now_ms() - T0;
        assert_eq!(turn_rate(&d), Some(hint - elapsed), "{i}: {d:?}");
    }
    assert_eq!(store.calls(), 3, "no refusal reached the store");
    assert_eq!(l.refusals_answered_locally(), 1_000);
    // A turn in a session: refused before the session lease is taken.
    let lease = tollgate_core::session::SessionLease {
        key: "s1",
        ttl_ms: 10_000,
    };
    let d = l
        .admit_turn_in_session("u", "in-session", Some(lease))
        .await
        .unwrap();
    assert!(
        matches!(
            d,
            tollgate_core::session::SessionAdmit::Decided(Decision::Denied(Denial::Limited {
                limit: Limit::TurnRate,
                ..
            }))
        ),
        "{d:?}"
    );
    assert_eq!(store.calls(), 3, "no session lease either");
    // What the store itself answers then: the same hint.
    let direct = Limiter::new(store.inner.clone(), clock.clone(), plans(false));
    let d = direct.admit_turn("u", "probe").await.unwrap();
    assert_eq!(turn_rate(&d), Some(hint - (clock.now_ms() - T0)));
    // Another user is not refused.
    assert!(l.admit_turn("v", "r1").await.unwrap().is_allowed());
    // At the hint's end the store is asked again, and admits.
    clock.set(T0 + hint);
    let calls = store.calls();
    assert!(l.admit_turn("u", "late").await.unwrap().is_allowed());
    assert_eq!(store.calls(), calls + 1);
}

#[tokio::test]
async fn a_retry_of_a_run_this_replica_admitted_asks_the_store() {
    let (l, store, _clock) = limiter(false);
    assert!(l.admit_turn("u", "r1").await.unwrap().is_allowed());
    assert!(l.admit_turn("u", "r2").await.unwrap().is_allowed());
    assert!(turn_rate(&l.admit_turn("u", "r3").await.unwrap()).is_some());
    let calls = store.calls();
    // r1 holds a live lease: its retry is admitted with an empty bucket.
    let again = l.admit_turn("u", "r1").await.unwrap();
    assert!(again.is_allowed(), "{again:?}");
    assert_eq!(store.calls(), calls + 1);
}

#[tokio::test]
async fn shadow_mode_asks_the_store_every_time() {
    let (l, store, _clock) = limiter(true);
    for i in 0..10 {
        let d = l.admit_turn("u", format!("r{i}").as_str()).await.unwrap();
        assert!(d.is_allowed());
    }
    assert_eq!(store.calls(), 10);
    assert_eq!(l.refusals_answered_locally(), 0);
}

#[tokio::test]
async fn a_reload_or_a_reset_drops_the_kept_refusals() {
    let (l, store, _clock) = limiter(false);
    for r in ["r1", "r2", "r3"] {
        let _ = l.admit_turn("u", r).await.unwrap();
    }
    assert_eq!(store.calls(), 3);
    l.set_plans(plans(false));
    assert!(turn_rate(&l.admit_turn("u", "r4").await.unwrap()).is_some());
    assert_eq!(store.calls(), 4, "asked after the reload");
    assert!(turn_rate(&l.admit_turn("u", "r5").await.unwrap()).is_some());
    assert_eq!(store.calls(), 4, "kept again");
    // An operator's reset: the buckets are full again, the next
    // admission asks the store.
    assert!(store.reset_user("u").await.unwrap());
    l.forget_refusals("u");
    assert!(l.admit_turn("u", "r6").await.unwrap().is_allowed());
}

#[tokio::test]
async fn takes_of_turns_and_named_buckets_are_kept_per_cost() {
    let (l, store, clock) = limiter(false);
    // Turns taken by cost (the rate-limit service's hits_addend).
    let u = l.user("u").unwrap();
    assert!(u.take_turns(2).await.unwrap().is_allowed());
    let hint = turn_rate(&u.take_turns(2).await.unwrap()).expect("refused");
    assert_eq!(hint, 20_000, "two turns refill in 20 s");
    let calls = store.calls();
    clock.advance(5_000);
    assert_eq!(turn_rate(&u.take_turns(2).await.unwrap()), Some(15_000));
    assert_eq!(store.calls(), calls, "the same cost: answered here");
    assert_eq!(
        turn_rate(&u.take_turns(1).await.unwrap()),
        Some(5_000),
        "another cost asks the store"
    );
    assert_eq!(store.calls(), calls + 1);
    // A named bucket: 3 of 3, then 1 refused for 20 s, kept.
    let spec = tollgate_core::BucketSpec::new(1, 20_000, 3).unwrap();
    assert!(l.take_bucket("k", spec, 3).await.unwrap().is_allowed());
    let refused = |d: Decision<_>| match d {
        Decision::Denied(Denial::Limited {
            limit: Limit::Bucket,
            retry_after_ms,
        }) => Some(retry_after_ms),
        _ => None,
    };
    assert_eq!(
        refused(l.take_bucket("k", spec, 1).await.unwrap()),
        Some(20_000)
    );
    let calls = store.calls();
    clock.advance(1_000);
    assert_eq!(
        refused(l.take_bucket("k", spec, 1).await.unwrap()),
        Some(19_000)
    );
    assert_eq!(store.calls(), calls);
    // The same name under another spec (a reload of the rules): the store.
    let faster = tollgate_core::BucketSpec::new(1, 1_000, 3).unwrap();
    let _ = l.take_bucket("k", faster, 1).await.unwrap();
    assert_eq!(store.calls(), calls + 1);
}

#[tokio::test]
async fn a_limiter_without_the_table_asks_the_store_every_time() {
    let (l, store, _clock) = limiter(false);
    let l = l.with_refusal_cache(0);
    for i in 0..10 {
        let _ = l.admit_turn("u", format!("r{i}").as_str()).await.unwrap();
    }
    assert_eq!(store.calls(), 10);
}
