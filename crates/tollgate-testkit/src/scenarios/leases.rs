//! Run leases and turn admission (SPEC §3): idempotent admission,
//! release and renew by id, reclaimed leases and bounded run records.

use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::{BucketSpec, Clock, FakeClock, Limit, LimiterError, Store};

use super::{allowed, limited, limiter_with, state, support};

/// Admission by a live holder is idempotent: refreshed, charged once.
pub async fn idempotent_admission<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let first = allowed(&l.admit_turn("u1", "r1").await.unwrap());
    assert!(!first.refreshed);
    clock.advance(1_000); // refills 1/3 of a turn: 4 whole remain

    let again = allowed(&l.admit_turn("u1", "r1").await.unwrap());
    assert!(again.refreshed);
    assert_eq!(again.expires_at_ms, clock.now_ms() + 120_000);
    let s = state(&l, "u1").await;
    assert_eq!(s.turns_available, 4, "charged once");
    assert_eq!(s.leases.len(), 1);
}

/// Release removes by invocation id only; renew pushes a live lease and
/// answers lost for a gone one, which is never re-added.
pub async fn release_and_renew_by_id<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    allowed(&l.admit_turn("u1", "r1").await.unwrap());
    allowed(&l.admit_turn("u1", "r2").await.unwrap());
    assert!(!l.release_run("u1", "zz").await.unwrap().released());
    assert!(
        !l.release_run("u2", "r1").await.unwrap().released(),
        "another user's"
    );
    assert_eq!(state(&l, "u1").await.leases.len(), 2);
    assert!(l.release_run("u1", "r1").await.unwrap().released());
    assert!(
        !l.release_run("u1", "r1").await.unwrap().released(),
        "second release"
    );
    clock.advance(60_000);
    assert_eq!(
        l.renew_run("u1", "r2").await.unwrap(),
        Some(clock.now_ms() + 120_000)
    );
    clock.advance(120_000);
    assert_eq!(l.renew_run("u1", "r2").await.unwrap(), None, "lost");
    assert_eq!(l.renew_run("u1", "never").await.unwrap(), None);
    allowed(&l.admit_turn("u1", "r3").await.unwrap());
    assert_eq!(l.renew_run("u1", "r2").await.unwrap(), None);
    let leases = state(&l, "u1").await.leases;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].0, "r3");
}

/// Turn admission when both limits fail reports the larger hint, ties going
/// to concurrency; a live holder retrying is admitted even then, uncharged.
pub async fn both_limits_fail<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.concurrent_runs = 1;
    plan.turns.burst = Some(1);
    let l = limiter_with(store, &clock, plan);
    allowed(&l.admit_turn("u1", "x").await.unwrap());
    // Turn hint 3,000 > concurrency hint 1,000.
    let d = l.admit_turn("u1", "y").await.unwrap();
    assert_eq!(limited(&d), (Limit::TurnRate, 3_000));
    // At 2,000 ms: turn hint 1,000 = concurrency hint 1,000 -> concurrency.
    clock.advance(2_000);
    let d = l.admit_turn("u1", "y").await.unwrap();
    assert_eq!(limited(&d), (Limit::Concurrency, 1_000));
    // The holder of the only slot, with an empty turn bucket, retries.
    let again = allowed(&l.admit_turn("u1", "x").await.unwrap());
    assert!(again.refreshed);
    assert_eq!(state(&l, "u1").await.turns_available, 0);
    clock.advance(1_000);
    assert_eq!(state(&l, "u1").await.turns_available, 1, "nothing charged");
}

/// Renewals push expiries and never shorten them; TTLs are clamped to
/// `1..=MAX_TTL_MS`.
pub async fn renew_never_shortens<S: Store + Clone>(store: S, clock: FakeClock) {
    let now = clock.now_ms();
    let s = &store;
    let params = tollgate_core::lease::TurnParams {
        turns: BucketSpec::new(20, 60_000, 5).unwrap(),
        max_runs: 2,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    };
    let req = tollgate_core::store::TurnRequest {
        user: "u1",
        invocation_id: "r1",
        params,
        budgets: &[],
    };
    let _ = s.admit_turn(req).await.unwrap();
    assert_eq!(
        s.renew_run("u1", "r1", 1).await.unwrap(),
        Some(now + 120_000)
    );
    assert_eq!(
        s.renew_run("u1", "r1", 200_000).await.unwrap(),
        Some(now + 200_000)
    );
    let g = s.session_acquire("s", "h", 30_000).await.unwrap();
    assert!(
        matches!(g, SessionAcquire::Acquired(SessionGrant { expires_at_ms, .. }) if expires_at_ms == now + 30_000)
    );
    let r = s.session_renew("s", "h", 5).await.unwrap().unwrap();
    assert_eq!(r.expires_at_ms, now + 30_000);
    let g = s.session_acquire("s", "h", 1).await.unwrap();
    assert!(
        matches!(g, SessionAcquire::Acquired(SessionGrant { expires_at_ms, .. }) if expires_at_ms == now + 30_000)
    );
    // TTL 0 counts as 1 ms; u64::MAX is cut to 30 days.
    let g = s.session_acquire("t", "h", 0).await.unwrap();
    assert!(
        matches!(g, SessionAcquire::Acquired(SessionGrant { expires_at_ms, .. }) if expires_at_ms == now + 1)
    );
    let g = s.session_acquire("v", "h", u64::MAX).await.unwrap();
    assert!(
        matches!(g, SessionAcquire::Acquired(SessionGrant { expires_at_ms, .. })
        if expires_at_ms == now + tollgate_core::bucket::MAX_TTL_MS)
    );
}

/// Leaked leases found expired by an admission are reported as reclaimed.
pub async fn reclaimed_leases_are_counted<S: Store + Clone>(store: S, clock: FakeClock) {
    let params = tollgate_core::lease::TurnParams {
        turns: BucketSpec::new(20, 60_000, 5).unwrap(),
        max_runs: 2,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    };
    let admit = |inv| tollgate_core::store::TurnRequest {
        user: "u1",
        invocation_id: inv,
        params,
        budgets: &[],
    };
    assert_eq!(store.admit_turn(admit("r1")).await.unwrap().reclaimed, 0);
    assert_eq!(store.admit_turn(admit("r2")).await.unwrap().reclaimed, 0);
    clock.advance(120_000);
    let out = store.admit_turn(admit("r3")).await.unwrap();
    assert!(matches!(
        out.admit,
        tollgate_core::lease::Admit::Admitted { .. }
    ));
    assert_eq!(out.reclaimed, 2);
}

/// A user's run records are bounded: past `MAX_TRACKED_RUNS` runs, the
/// least recently active one is forgotten (its reservation settles as
/// unknown) and the newest are kept.
pub async fn run_records_are_bounded<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let n = tollgate_core::store::MAX_TRACKED_RUNS + 1;
    let mut ids = Vec::new();
    for i in 0..n {
        let g = allowed(
            &l.reserve_tokens("u1", &format!("run{i:04}"), 1)
                .await
                .unwrap(),
        );
        ids.push(g.id);
        clock.advance(1);
    }
    assert!(matches!(
        l.refund("u1", &ids[0]).await,
        Err(LimiterError::UnknownReservation(_))
    ));
    assert!(l.refund("u1", &ids[1]).await.unwrap().applied);
    assert!(l.refund("u1", &ids[n - 1]).await.unwrap().applied);
}
