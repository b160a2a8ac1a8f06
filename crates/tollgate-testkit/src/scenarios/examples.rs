//! The worked examples of SPEC §7, to the exact number.

use tollgate_core::store::{BucketTake, MultiTake};
use tollgate_core::{BucketSpec, Clock, FakeClock, Limit, Store};

use super::{allowed, limited, limiter_with, state, support};

/// SPEC §7 example 1: turns 1–5 at t = 0 allowed; turns 6–10 at t = 1,000
/// denied with `retry_after_ms` = 2,000 exactly.
pub async fn example_1_turn_burst<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    for i in 1..=5 {
        let inv = format!("turn-{i}");
        allowed(&l.admit_turn("u1", &inv).await.unwrap());
        assert!(l.release_run("u1", &inv).await.unwrap().released());
    }
    clock.advance(1_000);
    for i in 6..=10 {
        let d = l.admit_turn("u1", &format!("turn-{i}")).await.unwrap();
        assert_eq!(limited(&d), (Limit::TurnRate, 2_000), "turn {i}");
        assert_eq!(d.denial().unwrap().retry_after_secs(), Some(2));
    }
    // Retried at the hint, a turn is admitted.
    clock.advance(2_000);
    allowed(&l.admit_turn("u1", "turn-11").await.unwrap());
}

/// SPEC §7 example 2: one turn every 10 s for ten minutes is never denied.
pub async fn example_2_steady_turns<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    for i in 0..60 {
        let inv = format!("turn-{i}");
        let d = l.admit_turn("u1", &inv).await.unwrap();
        assert!(d.is_allowed(), "turn {i} at {} s denied: {d:?}", i * 10);
        assert!(l.release_run("u1", &inv).await.unwrap().released());
        clock.advance(10_000);
    }
}

/// SPEC §7 example 3: with the token bucket at 0, a 6,000-token call needs a
/// 6,000 ms wait: refused at max wait 2,000 (nothing taken, retry 4,000);
/// granted with a 6,000 ms wait at max wait 6,000 (inclusive boundary).
pub async fn example_3_token_wait_boundary<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store.clone(), &clock, support());
    let drain = allowed(&l.reserve_tokens("u1", "run", 60_000).await.unwrap());
    assert_eq!(drain.wait_ms, 0);
    assert_eq!(state(&l, "u1").await.tokens_available, 0);
    let d = l.reserve_tokens("u1", "run", 6_000).await.unwrap();
    assert_eq!(limited(&d), (Limit::TokenRate, 4_000));
    assert_eq!(
        state(&l, "u1").await.tokens_available,
        0,
        "a refusal takes nothing"
    );
    // Retried at the hint: granted within max wait.
    clock.advance(4_000);
    let g = allowed(&l.reserve_tokens("u1", "run", 6_000).await.unwrap());
    assert_eq!(g.wait_ms, 2_000);

    let mut wide = support();
    wide.max_wait_ms = 6_000;
    let l6 = limiter_with(store, &clock, wide);
    allowed(&l6.reserve_tokens("u2", "run", 60_000).await.unwrap());
    let g = allowed(&l6.reserve_tokens("u2", "run", 6_000).await.unwrap());
    assert_eq!(g.wait_ms, 6_000, "the boundary is inclusive");
    assert_eq!(state(&l6, "u2").await.tokens_available, -6_000);
}

/// SPEC §7 example 4: two runs active, a third turn is denied for
/// concurrency with nothing charged; a release lets the next in; an
/// abandoned run's lease expires and lets a turn in.
pub async fn example_4_concurrency<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let r1 = allowed(&l.admit_turn("u1", "r1").await.unwrap());
    assert_eq!(r1.expires_at_ms, clock.now_ms() + 120_000);
    allowed(&l.admit_turn("u1", "r2").await.unwrap());
    assert_eq!(state(&l, "u1").await.turns_available, 3);
    let d = l.admit_turn("u1", "r3").await.unwrap();
    assert_eq!(limited(&d), (Limit::Concurrency, 1_000));
    assert_eq!(
        state(&l, "u1").await.turns_available,
        3,
        "nothing charged to the turn bucket"
    );
    assert!(l.release_run("u1", "r1").await.unwrap().released());
    allowed(&l.admit_turn("u1", "r3").await.unwrap());
    // r2 and r3 are abandoned without release.
    clock.advance(119_999);
    let d = l.admit_turn("u1", "r4").await.unwrap();
    assert_eq!(limited(&d), (Limit::Concurrency, 1));
    clock.advance(1);
    allowed(&l.admit_turn("u1", "r4").await.unwrap());
    let s = state(&l, "u1").await;
    assert_eq!(s.leases.len(), 1);
    assert_eq!(s.leases[0].0, "r4");
}

/// SPEC §7 provider example: 600 requests/min = 10/s, capacity 60. 100 calls
/// at t = 0 with max wait 4,000: calls 1–60 wait 0, call 60+k waits 100·k,
/// the last 4,000. With max wait 2,000, calls 81–100 are refused.
pub async fn provider_example<S: Store + Clone>(store: S, _clock: FakeClock) {
    let spec = BucketSpec::new(10, 1_000, 60).unwrap();
    for (key, max_wait) in [("{prov:a}:rpm", 4_000), ("{prov:b}:rpm", 2_000)] {
        for call in 1..=100u64 {
            let take = BucketTake {
                key,
                spec,
                cost: 1,
                max_wait_ms: max_wait,
            };
            let got = store.take_many(&[take], None).await.unwrap();
            let expect_wait = call.saturating_sub(60) * 100;
            if expect_wait <= max_wait {
                assert_eq!(
                    got,
                    MultiTake::Granted {
                        wait_ms: expect_wait
                    },
                    "call {call}, max wait {max_wait}"
                );
            } else {
                assert_eq!(
                    got,
                    MultiTake::Refused {
                        index: Some(0),
                        retry_after_ms: 100
                    },
                    "call {call}, max wait {max_wait}"
                );
                assert!(call >= 81);
            }
        }
    }
}
