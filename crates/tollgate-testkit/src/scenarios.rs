//! The conformance scenarios. Each takes a fresh, empty store that reads
//! `clock`, and panics with a message on any deviation from the SPEC.
//!
//! Times in comments are relative to [`T0`](crate::T0), the SPEC's t = 0.

use std::sync::Arc;

use tollgate_core::aimd::AimdParams;
use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::store::{
    AppendOutcome, BucketTake, CooldownCheck, FenceCheck, MultiTake, UserState,
};
use tollgate_core::store::{
    LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated, SessionDelete,
};
use tollgate_core::{
    BucketSpec, Clock, Decision, Denial, FakeClock, Limit, Limiter, LimiterError, PlanConfig,
    PlansConfig, RateConfig, ReservationId, Store,
};
use tollgate_provider::{
    PermitRequest, Policy, ProviderConfig, ProviderError, ProviderGovernor, ProviderPermit,
    ProvidersConfig, TenantConfig, validate_providers,
};

/// Plan "support" of SPEC §7: 20 turns/min, burst 5; 60,000 tokens/min,
/// burst 60,000; 2 concurrent runs; max wait 2,000 ms.
pub fn support() -> PlanConfig {
    PlanConfig {
        turns: RateConfig {
            amount: 20,
            period_ms: 60_000,
            burst: Some(5),
        },
        tokens: RateConfig {
            amount: 60_000,
            period_ms: 60_000,
            burst: Some(60_000),
        },
        max_wait_ms: 2_000,
        concurrent_runs: 2,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: None,
        estimate_tokens: Some(6_000),
        max_sessions: None,
        shadow: false,
    }
}

/// A limiter whose default plan is `plan`, named "p".
pub fn limiter_with<S: Store>(store: S, clock: &FakeClock, plan: PlanConfig) -> Limiter<S> {
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan);
    Limiter::new(store, clock.clone(), cfg.validate().expect("valid plan"))
}

fn limited<T: std::fmt::Debug>(d: &Decision<T>) -> (Limit, u64) {
    match d {
        Decision::Denied(Denial::Limited {
            limit,
            retry_after_ms,
        }) => (*limit, *retry_after_ms),
        other => panic!("expected a retryable denial, got {other:?}"),
    }
}

fn allowed<T: std::fmt::Debug + Clone>(d: &Decision<T>) -> T {
    match d {
        Decision::Allowed {
            grant,
            shadow_denied: None,
        } => grant.clone(),
        other => panic!("expected allowed, got {other:?}"),
    }
}

async fn state<S: Store>(l: &Limiter<S>, user: &str) -> UserState {
    let plan = l.plan_for(user).unwrap();
    l.store()
        .user_state(user, plan.turns, plan.tokens)
        .await
        .unwrap()
}

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

/// Settle adjusts by `actual - estimate`, refund by `-estimate`; each closes
/// the reservation, and a repeat (or a refund after a settle) changes nothing.
pub async fn settle_and_refund_once<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let a = allowed(&l.reserve_tokens("u1", "run", 6_000).await.unwrap());
    assert_eq!(a.id, ReservationId::new("run", 1));
    let s = l.settle("u1", &a.id, 8_000).await.unwrap();
    assert_eq!((s.balance, s.applied), (52_000, true));
    let s = l.settle("u1", &a.id, 8_000).await.unwrap();
    assert_eq!((s.balance, s.applied), (52_000, false));
    let s = l.refund("u1", &a.id).await.unwrap();
    assert_eq!((s.balance, s.applied), (52_000, false));

    let b = allowed(&l.reserve_tokens("u1", "run", 6_000).await.unwrap());
    assert_eq!(b.id.call, 2);
    assert_eq!(state(&l, "u1").await.tokens_available, 46_000);
    let s = l.refund("u1", &b.id).await.unwrap();
    assert_eq!((s.balance, s.applied), (52_000, true));
    let s = l.refund("u1", &b.id).await.unwrap();
    assert_eq!((s.balance, s.applied), (52_000, false));
    let s = l.settle("u1", &b.id, 1).await.unwrap();
    assert!(!s.applied);

    // A settle below the estimate gives the difference back.
    let c = allowed(&l.reserve_tokens("u1", "run", 6_000).await.unwrap());
    let s = l.settle("u1", &c.id, 1_000).await.unwrap();
    assert_eq!(s.balance, 51_000);

    for unknown in [
        ReservationId {
            invocation_id: "run".into(),
            call: 4,
            fallback: None,
        },
        ReservationId {
            invocation_id: "other".into(),
            call: 1,
            fallback: None,
        },
    ] {
        let e = l.settle("u1", &unknown, 10).await.unwrap_err();
        assert!(
            matches!(e, LimiterError::UnknownReservation(_)),
            "{unknown}: {e:?}"
        );
    }
}

/// A reservation belongs to its user: another user cannot settle or refund it.
pub async fn reservations_are_per_user<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let a = allowed(&l.reserve_tokens("u1", "run", 6_000).await.unwrap());
    assert!(matches!(
        l.refund("u2", &a.id).await,
        Err(LimiterError::UnknownReservation(_))
    ));
    assert_eq!(state(&l, "u1").await.tokens_available, 54_000);
    assert!(l.refund("u1", &a.id).await.unwrap().applied);
}

/// `max_llm_calls` stops a run for good (not retryable); other runs go on.
pub async fn max_llm_calls<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.max_llm_calls = Some(3);
    let l = limiter_with(store, &clock, plan);
    for call in 1..=3 {
        let g = allowed(&l.reserve_tokens("u1", "loop", 10).await.unwrap());
        assert_eq!(g.id.call, call);
    }
    let d = l.reserve_tokens("u1", "loop", 10).await.unwrap();
    let denial = *d.denial().unwrap();
    assert_eq!(
        denial,
        Denial::CapReached {
            limit: Limit::MaxLlmCalls,
            cap: 3
        }
    );
    assert!(!denial.is_retryable());
    assert!(!d.is_allowed());
    assert_eq!(state(&l, "u1").await.tokens_available, 59_970);
    allowed(&l.reserve_tokens("u1", "other-run", 10).await.unwrap());
}

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

/// SPEC §4: fence numbers grow only for a new holder; busy with the remaining
/// TTL; compare-and-act renew/release; appends only at the latest number;
/// records in order; the counter survives record deletion.
pub async fn session_fencing<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let now = clock.now_ms();
    assert_eq!(
        s.fence_check("sess", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 0
        }
    );
    assert!(matches!(
        s.append_fenced("sess", 0, b"x").await.unwrap(),
        AppendOutcome::Stale { latest: 0 }
    ));
    let g = s.session_acquire("sess", "h1", 30_000).await.unwrap();
    assert_eq!(
        g,
        SessionAcquire::Acquired(SessionGrant {
            fence: 1,
            expires_at_ms: now + 30_000
        })
    );
    assert_eq!(
        s.append_fenced("sess", 1, b"a").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
    assert_eq!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Busy {
            retry_after_ms: 30_000
        }
    );
    clock.advance(10_000);
    assert_eq!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Busy {
            retry_after_ms: 20_000
        }
    );
    assert_eq!(s.session_renew("sess", "h2", 30_000).await.unwrap(), None);
    assert!(!s.session_release("sess", "h2").await.unwrap());
    let renewed = s
        .session_renew("sess", "h1", 30_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.fence, 1);
    assert_eq!(renewed.expires_at_ms, clock.now_ms() + 30_000);
    // A refresh by the live holder keeps the number.
    assert!(matches!(
        s.session_acquire("sess", "h1", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    assert_eq!(
        s.append_fenced("sess", 1, b"b").await.unwrap(),
        AppendOutcome::Appended { index: 1 }
    );
    // h1 pauses past its TTL; h2 takes over.
    clock.advance(30_000);
    assert!(matches!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 2, .. })
    ));
    assert_eq!(
        s.append_fenced("sess", 1, b"late").await.unwrap(),
        AppendOutcome::Stale { latest: 2 },
        "a holder whose lease was taken over cannot write"
    );
    assert_eq!(
        s.fence_check("sess", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 2
        }
    );
    assert!(s.fence_check("sess", 2).await.unwrap().current);
    assert_eq!(
        s.append_fenced("sess", 2, b"c").await.unwrap(),
        AppendOutcome::Appended { index: 2 }
    );
    assert_eq!(s.session_renew("sess", "h1", 30_000).await.unwrap(), None);
    assert!(!s.session_release("sess", "h1").await.unwrap());
    let all = s.read_records("sess", 0, 100).await.unwrap();
    assert_eq!(all, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        s.read_records("sess", 1, 1).await.unwrap(),
        vec![b"b".to_vec()]
    );
    assert!(s.read_records("sess", 9, 10).await.unwrap().is_empty());
    assert!(s.read_records("other", 0, 10).await.unwrap().is_empty());
    assert!(s.session_release("sess", "h2").await.unwrap());
    // Released: the same holder acquiring again is a new grant.
    assert!(matches!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 3, .. })
    ));
    assert_eq!(s.delete_records("sess").await.unwrap(), 3);
    assert!(s.read_records("sess", 0, 10).await.unwrap().is_empty());
    assert!(s.session_release("sess", "h2").await.unwrap());
    assert!(matches!(
        s.session_acquire("sess", "h3", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 4, .. })
    ));
    assert!(matches!(
        s.append_fenced("sess", 3, b"z").await.unwrap(),
        AppendOutcome::Stale { latest: 4 }
    ));
    assert_eq!(
        s.append_fenced("sess", 4, b"d").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
}

/// SPEC §6 shadow mode: would-be refusals take nothing and are answered
/// allowed, carrying the denial enforcement would have given.
pub async fn shadow_mode<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.shadow = true;
    plan.turns.burst = Some(1);
    plan.tokens.burst = Some(1_000);
    plan.tokens.amount = 1_000;
    plan.estimate_tokens = None;
    plan.max_wait_ms = 0;
    let l = limiter_with(store, &clock, plan);
    allowed(&l.admit_turn("u1", "r1").await.unwrap());
    let d = l.admit_turn("u1", "r2").await.unwrap();
    match &d {
        Decision::Allowed {
            grant,
            shadow_denied: Some(denial),
        } => {
            assert_eq!(denial.limit(), Limit::TurnRate);
            assert_eq!(grant.expires_at_ms, clock.now_ms() + 120_000);
        }
        other => panic!("expected shadow-allowed, got {other:?}"),
    }
    assert_eq!(d.outcome(), tollgate_core::Outcome::ShadowDenied);
    let s = state(&l, "u1").await;
    assert_eq!(
        s.leases.len(),
        1,
        "no lease taken for the shadow-admitted turn"
    );
    assert_eq!(s.turns_available, 0);
    // Its renewals succeed too: shadow mode never shows to the client.
    assert_eq!(
        l.renew_run("u1", "r2").await.unwrap(),
        Some(clock.now_ms() + 120_000)
    );

    allowed(&l.reserve_tokens("u1", "r1", 1_000).await.unwrap());
    let d = l.reserve_tokens("u1", "r1", 500).await.unwrap();
    let Decision::Allowed {
        grant,
        shadow_denied: Some(denial),
    } = d
    else {
        panic!("expected shadow-allowed, got {d:?}");
    };
    assert_eq!(denial.limit(), Limit::TokenRate);
    assert_eq!(grant.wait_ms, 0);
    assert_eq!(grant.id.call, 2);
    assert_eq!(state(&l, "u1").await.tokens_available, 0, "took nothing");
    // The call ran: settling charges its actual usage; a repeat changes nothing.
    let s = l.settle("u1", &grant.id, 300).await.unwrap();
    assert_eq!((s.balance, s.applied), (-300, true));
    assert!(!l.settle("u1", &grant.id, 300).await.unwrap().applied);
}

/// A clock that steps back never refills twice.
pub async fn clock_steps_back<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    for i in 0..5 {
        let inv = format!("t{i}");
        allowed(&l.admit_turn("u1", &inv).await.unwrap());
        l.release_run("u1", &inv).await.unwrap().released();
    }
    clock.advance(3_000);
    allowed(&l.admit_turn("u1", "t5").await.unwrap());
    l.release_run("u1", "t5").await.unwrap().released();
    let t3000 = clock.now_ms();
    clock.set(t3000 - 2_000);
    assert_eq!(
        limited(&l.admit_turn("u1", "t6").await.unwrap()),
        (Limit::TurnRate, 3_000)
    );
    clock.set(t3000);
    assert_eq!(
        limited(&l.admit_turn("u1", "t6").await.unwrap()),
        (Limit::TurnRate, 3_000),
        "no refill for time already counted"
    );
    clock.advance(3_000);
    allowed(&l.admit_turn("u1", "t6").await.unwrap());
}

/// Yields until `cond` holds: a store over the network needs real time to
/// answer, so this spins on the scheduler (no sleep) for at most 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let spin = async {
        while !cond() {
            tokio::task::yield_now().await;
        }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(10), spin)
        .await
        .is_err()
    {
        panic!("timed out waiting for {what}");
    }
}

async fn until_sleeping(clock: &FakeClock, n: usize) {
    eventually(&format!("{n} pending sleeps"), || {
        clock.pending_sleeps() == n
    })
    .await;
}

/// The waiting reserve waits on the clock, no thread blocked: it completes
/// only when the fake clock reaches the wait.
pub async fn waiting_reserve<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.max_wait_ms = 6_000;
    let l = Arc::new(limiter_with(store, &clock, plan));
    allowed(&l.reserve_tokens("u1", "run", 60_000).await.unwrap());
    let task = tokio::spawn({
        let l = l.clone();
        async move { l.reserve_tokens_and_wait("u1", "run", 6_000).await }
    });
    until_sleeping(&clock, 1).await;
    clock.advance(5_999);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!task.is_finished(), "must wait the full 6,000 ms");
    clock.advance(1);
    let g = allowed(&task.await.unwrap().unwrap());
    assert_eq!((g.wait_ms, g.waited_ms), (0, 6_000));
    // A grant with no wait answers at once.
    let g = allowed(&l.reserve_tokens_and_wait("u2", "run", 10).await.unwrap());
    assert_eq!((g.wait_ms, g.waited_ms), (0, 0));
}

/// A caller that gives up while the limiter waits for it is refunded.
pub async fn abandoned_wait_is_refunded<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.max_wait_ms = 6_000;
    let l = Arc::new(limiter_with(store, &clock, plan));
    allowed(&l.reserve_tokens("u1", "run", 60_000).await.unwrap());
    let task = tokio::spawn({
        let l = l.clone();
        async move { l.reserve_tokens_and_wait("u1", "run", 6_000).await }
    });
    until_sleeping(&clock, 1).await;
    assert_eq!(state(&l, "u1").await.tokens_available, -6_000);
    task.abort();
    // The refund runs on a spawned task: wait for it to land.
    let refunded = async {
        while state(&l, "u1").await.tokens_available != 0 {
            tokio::task::yield_now().await;
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), refunded).await;
    assert_eq!(state(&l, "u1").await.tokens_available, 0, "refunded");
    let id = ReservationId {
        invocation_id: "run".into(),
        call: 2,
        fallback: None,
    };
    assert!(!l.refund("u1", &id).await.unwrap().applied, "closed once");
}

/// The multi-bucket take is all or nothing, with per-call parameters; the
/// wait is the largest of the waits.
pub async fn take_many_all_or_nothing<S: Store + Clone>(store: S, _clock: FakeClock) {
    let a = BucketSpec::new(1, 1_000, 10).unwrap();
    let b = BucketSpec::new(1, 1_000, 5).unwrap();
    let take = |key, spec, cost, max_wait_ms| BucketTake {
        key,
        spec,
        cost,
        max_wait_ms,
    };
    let s = &store;
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 3, 0), take("{t}:b", b, 3, 0)], None)
            .await
            .unwrap(),
        MultiTake::Granted { wait_ms: 0 }
    );
    // b holds 2: refused, and a is not charged.
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 3, 0), take("{t}:b", b, 3, 0)], None)
            .await
            .unwrap(),
        MultiTake::Refused {
            index: Some(1),
            retry_after_ms: 1_000
        }
    );
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 7, 0)], None).await.unwrap(),
        MultiTake::Granted { wait_ms: 0 }
    );
    // a is empty: a cost-2 take waits 2,000 on a, 0 on b; wait = the largest.
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 2, 5_000), take("{t}:b", b, 1, 0)], None)
            .await
            .unwrap(),
        MultiTake::Granted { wait_ms: 2_000 }
    );
    // Both refuse: the larger hint is reported.
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 5, 1_000), take("{t}:b", b, 3, 0)], None)
            .await
            .unwrap(),
        MultiTake::Refused {
            index: Some(0),
            retry_after_ms: 6_000
        }
    );
    assert_eq!(
        s.take_many(&[take("{t}:a", a, 1, 0), take("{t}:b", b, 99, 1_000)], None)
            .await
            .unwrap(),
        MultiTake::ExceedsCapacity { index: 1 }
    );
    // A key named twice is taken twice, in order: a is 2 in debt, so the
    // first take waits 3,000 and the second 4,000.
    assert_eq!(
        s.take_many(
            &[take("{t}:a", a, 1, 9_000), take("{t}:a", a, 1, 9_000)],
            None
        )
        .await
        .unwrap(),
        MultiTake::Granted { wait_ms: 4_000 }
    );
    // Nothing was taken from b by the refusals: it holds 1.
    assert_eq!(
        s.take_many(&[take("{t}:b", b, 1, 0)], None).await.unwrap(),
        MultiTake::Granted { wait_ms: 0 }
    );
}

/// A provider governor over `store` for one provider key `p:m` with
/// `requests` per minute (burst `burst`), `policy` and `max_wait_ms`, and
/// tenant shares.
fn governor<S: Store + Clone>(
    store: S,
    clock: &FakeClock,
    requests: i64,
    burst: i64,
    policy: Policy,
    max_wait_ms: i64,
    tenants: &[(&str, f64)],
) -> ProviderGovernor<S> {
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("openai".into()),
            requests: Some(RateConfig {
                amount: requests,
                period_ms: 60_000,
                burst: Some(burst),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy,
            max_wait_ms: Some(max_wait_ms),
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: tenants
                .iter()
                .map(|(t, share)| ((*t).to_owned(), TenantConfig { share: *share }))
                .collect(),
        },
    );
    ProviderGovernor::new(
        store,
        clock.clone(),
        validate_providers(&cfg).expect("valid providers"),
    )
}

fn permit_wait(d: &Decision<ProviderPermit>) -> Option<u64> {
    d.grant().map(|p| p.wait_ms)
}

/// SPEC §7's provider example through the governor: 600 requests/min =
/// 10/s, burst 60, block. 100 calls at t = 0: 1–60 wait 0, call 60+k waits
/// 100·k ms, the last 4,000 ms; with max wait 2,000 ms calls 81–100 are
/// refused (provider rate, retry in 100 ms), taking nothing.
pub async fn provider_governor_example<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(store.clone(), &clock, 600, 60, Policy::Block, 4_000, &[]);
    for call in 1..=100u64 {
        let d = g.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
        assert_eq!(
            permit_wait(&d),
            Some(call.saturating_sub(60) * 100),
            "call {call}"
        );
    }
    let g = governor(store, &clock, 600, 60, Policy::Block, 4_000, &[]);
    // Same bucket, now drained by 100 calls: a deadline of 2,000 ms.
    let short = |n| PermitRequest {
        max_wait_ms: Some(n),
        ..PermitRequest::new("p", "m", 0)
    };
    clock.advance(4_000); // the 100 granted calls' debt is paid: level 0
    for call in 61..=100u64 {
        let d = g.permit(short(2_000)).await.unwrap();
        if call <= 80 {
            assert_eq!(permit_wait(&d), Some((call - 60) * 100), "call {call}");
        } else {
            assert_eq!(
                d.denial(),
                Some(&Denial::Limited {
                    limit: Limit::Bucket,
                    retry_after_ms: 100
                }),
                "call {call}"
            );
        }
    }
    // Reject policy: nothing waits.
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "q:m".into(),
        ProviderConfig {
            kind: None,
            requests: Some(RateConfig {
                amount: 600,
                period_ms: 60_000,
                burst: Some(60),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy: Policy::Reject,
            max_wait_ms: None,
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: Default::default(),
        },
    );
    let r = ProviderGovernor::new(
        g.store().clone(),
        clock.clone(),
        validate_providers(&cfg).unwrap(),
    );
    for call in 1..=61u64 {
        let d = r.permit(PermitRequest::new("q", "m", 0)).await.unwrap();
        assert_eq!(d.is_allowed(), call <= 60, "call {call}");
    }
    assert!(matches!(
        r.permit(PermitRequest::new("q", "other", 0)).await,
        Err(ProviderError::Unknown { .. })
    ));
}

/// A 429 with `Retry-After: 3` seen by one replica sets the shared
/// cooldown: every replica's permits wait it out (block) or are refused
/// naming the cooldown when it does not fit their deadline.
pub async fn provider_cooldown_is_shared<S: Store + Clone>(store: S, clock: FakeClock) {
    let a = governor(store.clone(), &clock, 600, 60, Policy::Block, 4_000, &[]);
    let b = governor(store, &clock, 600, 60, Policy::Block, 4_000, &[]);
    let out = a
        .feedback("p", "m", 429, &[("retry-after", "3")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.class(), "throttled");
    assert_eq!(out.cooldown_until_ms, Some(clock.now_ms() + 3_000));
    assert_eq!(out.effective_permille, Some(500));
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(permit_wait(&d), Some(3_000), "the other replica waits");
    let short = PermitRequest {
        max_wait_ms: Some(1_000),
        ..PermitRequest::new("p", "m", 0)
    };
    assert_eq!(
        b.permit(short).await.unwrap().denial(),
        Some(&Denial::Limited {
            limit: Limit::Cooldown,
            retry_after_ms: 2_000
        })
    );
    clock.advance(3_000);
    let d = b.permit(short).await.unwrap();
    assert_eq!(permit_wait(&d), Some(0), "the cooldown is over");
    // Exhaustion fails fast on the replica that saw it.
    let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let out = a.feedback("p", "m", 429, &[], Some(body)).await.unwrap();
    assert_eq!(out.feedback.class(), "exhausted");
    assert!(matches!(
        a.permit(PermitRequest::new("p", "m", 0)).await,
        Err(ProviderError::Exhausted { .. })
    ));
}

/// A provider answer's hint is data to clamp (SPEC §5): a 429 with
/// `Retry-After: 999999999` seen by one replica cools the key down for the
/// whole fleet for at most `max_cooldown_ms` (300 s by default), not 31
/// years; an operator's clear on one replica ends the cooldown and the
/// AIMD cut for every replica at once.
pub async fn provider_bad_hint_is_clamped_and_cleared<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let a = governor(store.clone(), &clock, 600, 60, Policy::Reject, 0, &[]);
    let b = governor(store, &clock, 600, 60, Policy::Reject, 0, &[]);
    let t0 = clock.now_ms();
    let out = a
        .feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(300_000));
    assert_eq!(out.cooldown_until_ms, Some(t0 + 300_000));
    assert_eq!(out.effective_permille, Some(500));
    let refused = |retry_after_ms| {
        Some(Denial::Limited {
            limit: Limit::Cooldown,
            retry_after_ms,
        })
    };
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(
        d.denial().cloned(),
        refused(300_000),
        "the other replica too"
    );
    let st = b.status("p", "m").await.unwrap();
    assert_eq!(
        (
            st.cooldown_until_ms,
            st.cooldown_remaining_ms,
            st.effective_permille
        ),
        (Some(t0 + 300_000), 300_000, 500)
    );
    clock.advance(299_999);
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(d.denial().cloned(), refused(1));
    clock.advance(1);
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(permit_wait(&d), Some(0), "over after 300 s");

    // Another bad hint, then the operator clears it on replica a: replica
    // b's next permit is granted at once, at the full rate.
    clock.advance(5_000);
    a.feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    let out = a.clear("p", "m").await.unwrap();
    assert_eq!(out.cooldown_until_ms, Some(clock.now_ms() + 300_000));
    assert_eq!(
        out.effective_permille, 500,
        "recovered in the 300 s, halved again"
    );
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(
        d.grant().map(|p| (p.wait_ms, p.effective_permille)),
        Some((0, 1_000))
    );
    let st = b.status("p", "m").await.unwrap();
    assert_eq!(
        (
            st.cooldown_until_ms,
            st.cooldown_remaining_ms,
            st.effective_permille
        ),
        (None, 0, 1_000)
    );
}

/// A burst of 429s seen by five replicas at once halves the shared rate
/// once; the next halving needs another decrease interval (5 s); the
/// permits follow the lowered rate (capacity scales too) and it recovers
/// 5 % per quiet 10 s.
pub async fn provider_aimd_under_a_burst_of_429s<S: Store + Clone>(store: S, clock: FakeClock) {
    let replicas: Vec<_> = (0..5)
        .map(|_| governor(store.clone(), &clock, 600, 60, Policy::Block, 60_000, &[]))
        .collect();
    for r in &replicas {
        let out = r.feedback("p", "m", 429, &[], None).await.unwrap();
        assert_eq!(out.effective_permille, Some(500));
    }
    let g = &replicas[0];
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 500);
    // Half the rate: capacity 30, refill 5/s: call 31 waits 200 ms.
    for call in 1..=31u64 {
        let d = g.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
        let expect = if call <= 30 { 0 } else { 200 };
        assert_eq!(permit_wait(&d), Some(expect), "call {call}");
    }
    clock.advance(5_000);
    for r in &replicas {
        assert_eq!(
            r.feedback("p", "m", 429, &[], None)
                .await
                .unwrap()
                .effective_permille,
            Some(250)
        );
    }
    clock.advance(10_000);
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 300);
    clock.advance(150_000);
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 1_000);
}

/// Tenant shares: a noisy tenant (share 0.25 of 600/min, burst 15) is held
/// to its share while a quiet tenant (share 0.5) still gets permits at
/// once: the pool (burst 60) is not drained by the noisy one.
pub async fn provider_tenant_shares_isolate<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(
        store,
        &clock,
        600,
        60,
        Policy::Reject,
        0,
        &[("noisy", 0.25), ("quiet", 0.5)],
    );
    let call = |tenant| PermitRequest {
        tenant: Some(tenant),
        ..PermitRequest::new("p", "m", 0)
    };
    let mut granted = 0;
    for _ in 0..100 {
        if g.permit(call("noisy")).await.unwrap().is_allowed() {
            granted += 1;
        }
    }
    assert_eq!(granted, 15, "the noisy tenant gets its share's burst");
    for n in 1..=30 {
        let d = g.permit(call("quiet")).await.unwrap();
        assert_eq!(permit_wait(&d), Some(0), "quiet call {n} runs at once");
    }
    // The pool held 60: 15 + 30 taken, 15 left for calls without a tenant.
    for n in 1..=15 {
        assert!(
            g.permit(PermitRequest::new("p", "m", 0))
                .await
                .unwrap()
                .is_allowed(),
            "pool call {n}"
        );
    }
    assert!(
        !g.permit(PermitRequest::new("p", "m", 0))
            .await
            .unwrap()
            .is_allowed()
    );
}

/// AIMD (SPEC §5): a 429 halves the effective rate at most once per
/// decrease interval (a burst of 429s counts once), never below the floor;
/// each quiet increase interval adds 5 %, up to the configured rate; keys
/// are independent.
pub async fn aimd_halves_once_and_recovers<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let p = AimdParams::default();
    let k = "{prov:m}:aimd";
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000, "starts full");
    assert_eq!(s.aimd(k, p, true).await.unwrap(), 500);
    for step in [1_000, 3_999] {
        clock.advance(step);
        assert_eq!(s.aimd(k, p, true).await.unwrap(), 500, "counted once");
    }
    clock.advance(1); // 5,000 ms after the first halving
    assert_eq!(s.aimd(k, p, true).await.unwrap(), 250);
    assert_eq!(s.aimd("{prov:other}:aimd", p, false).await.unwrap(), 1_000);
    clock.advance(9_999);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 250);
    clock.advance(1);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 300, "+5 % per 10 s");
    clock.advance(140_000);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000, "back to full");
    for _ in 0..6 {
        s.aimd(k, p, true).await.unwrap();
        clock.advance(5_000);
    }
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 100, "the floor: 10 %");
    clock.advance(180_000);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000);
}

/// A cooldown only grows; permits wait it out (block) or are refused with
/// the cooldown named, taking nothing.
pub async fn cooldown<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let now = clock.now_ms();
    let spec = BucketSpec::new(10, 1_000, 60).unwrap();
    assert_eq!(
        s.extend_cooldown("{p}:cd", now + 5_000).await.unwrap(),
        now + 5_000
    );
    assert_eq!(
        s.extend_cooldown("{p}:cd", now + 1_000).await.unwrap(),
        now + 5_000,
        "until = max(existing, new)"
    );
    let rpm = |max_wait_ms| BucketTake {
        key: "{p}:rpm",
        spec,
        cost: 60,
        max_wait_ms,
    };
    let cd = |max_wait_ms| {
        Some(CooldownCheck {
            key: "{p}:cd",
            max_wait_ms,
        })
    };
    assert_eq!(
        s.take_many(&[rpm(0)], cd(2_000)).await.unwrap(),
        MultiTake::Refused {
            index: None,
            retry_after_ms: 3_000
        }
    );
    assert_eq!(
        s.take_many(&[rpm(0)], cd(10_000)).await.unwrap(),
        MultiTake::Granted { wait_ms: 5_000 },
        "the refusal took nothing: the full 60 were still there"
    );
    clock.advance(5_000);
    assert_eq!(
        s.take_many(&[rpm(10_000)], cd(0)).await.unwrap(),
        MultiTake::Granted { wait_ms: 1_000 },
        "cooldown over; 50 refilled of 60"
    );
}

/// Clearing a provider key (SPEC §5, the operator's tool after a bad hint):
/// one step removes its cooldown and puts its AIMD state back at the full
/// rate, answering what was live; its buckets and other keys are left
/// alone. An end of 0 reads a cooldown without changing it.
pub async fn clear_provider<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::store::ProviderCleared;

    let s = &store;
    let p = AimdParams::default();
    let (cd, aimd) = ("{prov:m}:cooldown", "{prov:m}:aimd");
    let now = clock.now_ms();
    assert_eq!(s.extend_cooldown(cd, 0).await.unwrap(), 0, "none: reads 0");
    assert_eq!(
        s.extend_cooldown(cd, now + 5_000).await.unwrap(),
        now + 5_000
    );
    assert_eq!(
        s.extend_cooldown(cd, 0).await.unwrap(),
        now + 5_000,
        "an end of 0 reads the cooldown"
    );
    assert_eq!(s.extend_cooldown(cd, now).await.unwrap(), now + 5_000);
    assert_eq!(s.aimd(aimd, p, true).await.unwrap(), 500);
    // Another provider key, and a bucket of this one.
    let other = "{prov:other}:cooldown";
    s.extend_cooldown(other, now + 9_000).await.unwrap();
    let spec = BucketSpec::new(1, 1_000, 10).unwrap();
    let rpm = |cost| BucketTake {
        key: "{prov:m}:rpm",
        spec,
        cost,
        max_wait_ms: 0,
    };
    let cooldown = |max_wait_ms| {
        Some(CooldownCheck {
            key: cd,
            max_wait_ms,
        })
    };
    assert_eq!(
        s.take_many(&[rpm(10)], cooldown(5_000)).await.unwrap(),
        MultiTake::Granted { wait_ms: 5_000 }
    );
    clock.advance(1_000);
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: Some(now + 5_000),
            effective_permille: 500
        }
    );
    assert_eq!(s.extend_cooldown(cd, 0).await.unwrap(), 0, "cleared");
    assert_eq!(s.aimd(aimd, p, false).await.unwrap(), 1_000, "full rate");
    assert_eq!(s.extend_cooldown(other, 0).await.unwrap(), now + 9_000);
    assert_eq!(
        s.take_many(&[rpm(10)], cooldown(0)).await.unwrap(),
        MultiTake::Refused {
            index: Some(0),
            retry_after_ms: 9_000
        },
        "the bucket is left alone: 1 of 10 refilled"
    );
    assert_eq!(
        s.take_many(&[rpm(1)], cooldown(0)).await.unwrap(),
        MultiTake::Granted { wait_ms: 0 },
        "and no cooldown to wait for"
    );
    // Cleared state is as if never written: the next 429 halves at once.
    assert_eq!(s.aimd(aimd, p, true).await.unwrap(), 500);
    clock.advance(10_000);
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: None,
            effective_permille: 550
        },
        "the rate as it was, recovering; no cooldown"
    );
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: None,
            effective_permille: 1_000
        },
        "nothing left to clear"
    );
    // A cooldown that has passed is none.
    let now = clock.now_ms();
    s.extend_cooldown(cd, now + 100).await.unwrap();
    clock.advance(100);
    assert_eq!(
        s.clear_provider(cd, aimd, p)
            .await
            .unwrap()
            .cooldown_until_ms,
        None
    );
}

/// Admin inspection: one user's state, the top users by tokens over the last
/// minute, and a reset that clears buckets but keeps leases.
pub async fn inspection_and_reset<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    allowed(&l.admit_turn("u1", "r1").await.unwrap());
    allowed(&l.reserve_tokens("u1", "r1", 6_000).await.unwrap());
    let big = allowed(&l.reserve_tokens("u2", "r9", 10_000).await.unwrap());
    l.settle("u2", &big.id, 12_000).await.unwrap();
    let s = state(&l, "u1").await;
    assert_eq!(s.turns_available, 4);
    assert_eq!(s.tokens_available, 54_000);
    assert_eq!(s.leases, vec![("r1".to_owned(), clock.now_ms() + 120_000)]);
    assert_eq!(s.tokens_last_minute, 6_000);
    let top = l.store().top_users(10).await.unwrap();
    let top: Vec<(&str, i64)> = top
        .iter()
        .map(|t| (t.user.as_str(), t.tokens_last_minute))
        .collect();
    assert_eq!(top, vec![("u2", 12_000), ("u1", 6_000)]);
    assert_eq!(l.store().top_users(1).await.unwrap().len(), 1);
    assert!(l.store().reset_user("u1").await.unwrap());
    let s = state(&l, "u1").await;
    assert_eq!((s.turns_available, s.tokens_available), (5, 60_000));
    assert_eq!(s.leases.len(), 1, "leases survive a reset");
    assert!(!l.store().reset_user("nobody").await.unwrap());
    clock.advance(120_000);
    assert!(l.store().top_users(10).await.unwrap().is_empty());
}

/// A cost larger than capacity + max wait × rate is a typed, non-retryable
/// answer; it takes nothing and counts no model call.
pub async fn exceeds_capacity<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    let d = l.reserve_tokens("u1", "run", 62_001).await.unwrap();
    assert_eq!(
        d,
        Decision::Denied(Denial::ExceedsCapacity {
            limit: Limit::TokenRate,
            cost: 62_001,
            max_cost: 62_000
        })
    );
    assert!(!d.denial().unwrap().is_retryable());
    assert_eq!(state(&l, "u1").await.tokens_available, 60_000);
    let g = allowed(&l.reserve_tokens("u1", "run", 62_000).await.unwrap());
    assert_eq!((g.id.call, g.wait_ms), (1, 2_000));
}

/// SPEC §6: lowering a capacity takes effect at the next refill.
pub async fn lowered_capacity_applies_at_refill<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    allowed(&l.reserve_tokens("u1", "run", 100).await.unwrap());
    let mut smaller = support();
    smaller.tokens.burst = Some(10_000);
    smaller.max_wait_ms = 0;
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), smaller);
    l.set_plans(cfg.validate().unwrap());
    assert_eq!(state(&l, "u1").await.tokens_available, 10_000);
    let d = l.reserve_tokens("u1", "run", 10_001).await.unwrap();
    assert!(matches!(d.denial(), Some(Denial::ExceedsCapacity { .. })));
    allowed(&l.reserve_tokens("u1", "run", 10_000).await.unwrap());
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

/// A model call refused for tokens is not counted against `max_llm_calls`.
pub async fn refused_calls_are_not_counted<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support();
    plan.max_llm_calls = Some(2);
    plan.max_wait_ms = 0;
    let l = limiter_with(store, &clock, plan);
    allowed(&l.reserve_tokens("u1", "run", 60_000).await.unwrap());
    for _ in 0..3 {
        let d = l.reserve_tokens("u1", "run", 10).await.unwrap();
        assert_eq!(limited(&d).0, Limit::TokenRate);
    }
    clock.advance(1_000);
    let g = allowed(&l.reserve_tokens("u1", "run", 10).await.unwrap());
    assert_eq!(g.id.call, 2);
}

/// A reloaded plan that changes a rate's period keeps the level in whole
/// tokens (never more credit).
pub async fn period_change_keeps_tokens<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut per_second = support();
    per_second.tokens = RateConfig {
        amount: 1_000,
        period_ms: 1_000,
        burst: Some(60_000),
    };
    let l = limiter_with(store, &clock, per_second);
    allowed(&l.reserve_tokens("u1", "run", 1).await.unwrap());
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), support());
    l.set_plans(cfg.validate().unwrap());
    assert_eq!(state(&l, "u1").await.tokens_available, 59_999);
    let g = allowed(&l.reserve_tokens("u1", "run", 59_999).await.unwrap());
    assert_eq!(g.wait_ms, 0);
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

/// A single take with no lease and no wait (Envoy's `hits_addend`): on a
/// user's turn bucket it draws from the budget turn admission uses; on a
/// named bucket, from the key space of `take_many`. A refusal takes nothing
/// and carries the exact hint; shadow mode applies the same transition and
/// only rewrites the answer.
pub async fn take_one_shares_budgets<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::Taken;
    use tollgate_core::bucket::Take;
    use tollgate_core::store::{BucketRef, TakeOutcome, TakeRequest};

    let l = limiter_with(store.clone(), &clock, support());
    // 20 turns/min (one per 3,000 ms), burst 5. A cost of 3 on a full
    // bucket: 2 left, full again after 3 × 3,000 ms.
    let taken = |taken, remaining, full_in_ms| Taken {
        taken,
        remaining,
        full_in_ms,
    };
    let g = allowed(&l.take_turns("u1", 3).await.unwrap());
    assert_eq!(g, taken(3, 2, 9_000));
    // The next 3 need one more turn: refused, nothing taken, retry 3,000.
    let d = l.take_turns("u1", 3).await.unwrap();
    assert_eq!(limited(&d), (Limit::TurnRate, 3_000));
    assert_eq!(state(&l, "u1").await.turns_available, 2);
    // The same bucket as turn admission: two turns empty it.
    for inv in ["r1", "r2"] {
        allowed(&l.admit_turn("u1", inv).await.unwrap());
        assert!(l.release_run("u1", inv).await.unwrap().released());
    }
    let d = l.take_turns("u1", 1).await.unwrap();
    assert_eq!(limited(&d), (Limit::TurnRate, 3_000));
    // A cost of 0 takes nothing and reports the bucket.
    assert_eq!(
        allowed(&l.take_turns("u1", 0).await.unwrap()),
        taken(0, 0, 15_000)
    );
    // More than the burst can never be granted.
    assert_eq!(
        l.take_turns("u1", 6).await.unwrap(),
        Decision::Denied(Denial::ExceedsCapacity {
            limit: Limit::TurnRate,
            cost: 6,
            max_cost: 5
        })
    );
    // Taking turns leaves admission the hint it would have had.
    clock.advance(1_000);
    let d = l.admit_turn("u1", "r3").await.unwrap();
    assert_eq!(limited(&d), (Limit::TurnRate, 2_000));
    clock.advance(2_000);
    assert_eq!(
        allowed(&l.take_turns("u1", 1).await.unwrap()),
        taken(1, 0, 15_000)
    );

    // SPEC §7 example 1 through single takes: 5 at t = 0, then at
    // t = 1,000 the bucket holds 1/3 of a turn: retry after 2,000 exactly.
    let t0 = clock.now_ms();
    for _ in 0..5 {
        allowed(&l.take_turns("u2", 1).await.unwrap());
    }
    clock.set(t0 + 1_000);
    let d = l.take_turns("u2", 1).await.unwrap();
    assert_eq!(limited(&d), (Limit::TurnRate, 2_000));

    // Shadow mode: the refusal is rewritten, and nothing is taken.
    let mut plan = support();
    plan.shadow = true;
    let s = limiter_with(store.clone(), &clock, plan);
    assert_eq!(
        allowed(&s.take_turns("u3", 5).await.unwrap()),
        taken(5, 0, 15_000)
    );
    match s.take_turns("u3", 2).await.unwrap() {
        Decision::Allowed {
            grant,
            shadow_denied: Some(denial),
        } => {
            assert_eq!(grant, taken(0, 0, 15_000));
            assert_eq!(denial.retry_after_ms(), Some(6_000));
        }
        other => panic!("expected shadow-allowed, got {other:?}"),
    }
    assert_eq!(state(&s, "u3").await.turns_available, 0);

    // A named bucket: 1 per second, burst 5, shared with take_many.
    let spec = BucketSpec::new(1, 1_000, 5).unwrap();
    let one = |cost| TakeRequest {
        bucket: BucketRef::Named("{rls:t}:x"),
        spec,
        cost,
    };
    assert_eq!(
        store.take_one(one(3)).await.unwrap(),
        TakeOutcome {
            take: Take::Granted { wait_ms: 0 },
            remaining: 2,
            full_in_ms: 3_000
        }
    );
    assert_eq!(
        store.take_one(one(3)).await.unwrap(),
        TakeOutcome {
            take: Take::Refused {
                retry_after_ms: 1_000
            },
            remaining: 2,
            full_in_ms: 3_000
        }
    );
    let many = BucketTake {
        key: "{rls:t}:x",
        spec,
        cost: 2,
        max_wait_ms: 0,
    };
    assert_eq!(
        store.take_many(&[many], None).await.unwrap(),
        MultiTake::Granted { wait_ms: 0 }
    );
    assert_eq!(
        store.take_one(one(0)).await.unwrap(),
        TakeOutcome {
            take: Take::Granted { wait_ms: 0 },
            remaining: 0,
            full_in_ms: 5_000
        }
    );
    assert_eq!(
        store.take_one(one(6)).await.unwrap().take,
        Take::ExceedsCapacity
    );
    // 1,500 ms later: 1.5 tokens, so 1 remains after a take of 1 and the
    // bucket is full 4,500 ms after that.
    clock.advance(1_500);
    assert_eq!(
        store.take_one(one(1)).await.unwrap(),
        TakeOutcome {
            take: Take::Granted { wait_ms: 0 },
            remaining: 0,
            full_in_ms: 4_500
        }
    );

    // The limiter's decision on a named bucket (Envoy's rules): the same
    // take answered as a decision of `Limit::Bucket`, refusals taking
    // nothing.
    let key = "{rls:t}:y";
    assert_eq!(
        allowed(&l.take_bucket(key, spec, 3).await.unwrap()),
        taken(3, 2, 3_000)
    );
    let d = l.take_bucket(key, spec, 3).await.unwrap();
    assert_eq!(limited(&d), (Limit::Bucket, 1_000));
    assert_eq!(
        l.take_bucket(key, spec, 6).await.unwrap(),
        Decision::Denied(Denial::ExceedsCapacity {
            limit: Limit::Bucket,
            cost: 6,
            max_cost: 5
        })
    );
    assert_eq!(
        allowed(&l.take_bucket(key, spec, 0).await.unwrap()),
        taken(0, 2, 3_000)
    );
}

/// SPEC §4 session bound: a user holds at most `max_sessions` session
/// claims; a new session past it is denied ([`Limit::Sessions`]) with the
/// time until the earliest claim ends, while an existing one is extended
/// and other users are unaffected. A claim that may only be extended
/// (renew, release) never creates one. Claims end `lease_ttl + grace +
/// slack` after their last extension.
pub async fn sessions_are_bounded_per_user<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::SessionsHeld;
    use tollgate_core::store::{CLAIM_SLACK_MS, DEFAULT_SESSION_GRACE_MS};
    let mut plan = support();
    plan.max_sessions = Some(3);
    let l = limiter_with(store, &clock, plan);
    let hold = 30_000 + DEFAULT_SESSION_GRACE_MS + CLAIM_SLACK_MS;
    let held = |sessions, claimed| SessionsHeld { sessions, claimed };
    for (i, s) in ["s1", "s2", "s3"].iter().enumerate() {
        let d = l.claim_session("u1", s, 30_000, true).await.unwrap();
        assert_eq!(allowed(&d), held(i as u32 + 1, true), "{s}");
    }
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(limited(&d), (Limit::Sessions, hold), "the 4th session");
    clock.advance(1_000);
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(limited(&d), (Limit::Sessions, hold - 1_000));
    // An existing session is extended, whatever the count.
    let d = l.claim_session("u1", "s1", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
    let d = l.claim_session("u1", "s2", 0, false).await.unwrap();
    assert_eq!(
        allowed(&d),
        held(3, true),
        "a release keeps its claim (never shortened)"
    );
    // Renewing or releasing a session that was never claimed claims nothing.
    let d = l.claim_session("u1", "ghost", 30_000, false).await.unwrap();
    assert_eq!(allowed(&d), held(3, false));
    // Another user has a bound of their own.
    let d = l.claim_session("u2", "s4", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(1, true));
    // s2's and s3's claims end at their hold; s1's, extended, a second later.
    clock.advance(hold - 1_000);
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(
        allowed(&d),
        held(2, true),
        "s2's and s3's places are free again"
    );
    let d = l.claim_session("u1", "s5", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
    let d = l.claim_session("u1", "s6", 30_000, true).await.unwrap();
    assert_eq!(
        limited(&d),
        (Limit::Sessions, 1_000),
        "s1's claim ends first"
    );
    clock.advance(1_000);
    let d = l.claim_session("u1", "s6", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
}

/// SPEC §4 retention: a session with no record (a lease and its fence
/// only) is kept until its lease's end (or its last operation) plus the
/// grace, then forgotten (its fence counter starts again at 1); one with a
/// record is kept for the retention, even after its records are deleted.
pub async fn sessions_without_records_are_kept_for_the_grace<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_GRACE_MS as GRACE;
    let s = &store;
    let fence = |n: u64| {
        SessionAcquire::Acquired(SessionGrant {
            fence: n,
            expires_at_ms: clock.now_ms() + 30_000,
        })
    };
    assert_eq!(
        s.session_acquire("bare", "h", 30_000).await.unwrap(),
        fence(1)
    );
    assert_eq!(
        s.session_acquire("kept", "h", 30_000).await.unwrap(),
        fence(1)
    );
    assert_eq!(
        s.append_fenced("kept", 1, b"r").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
    assert_eq!(
        s.session_acquire("freed", "h", 30_000).await.unwrap(),
        fence(1)
    );
    clock.advance(10_000);
    // Released at +10 s: what the acquire kept (the lease's end at +30 s
    // plus the grace) is never cut short.
    assert!(s.session_release("freed", "h").await.unwrap());
    clock.advance(20_000 + GRACE - 1);
    assert_eq!(s.fence_check("bare", 1).await.unwrap().latest, 1);
    assert_eq!(s.fence_check("freed", 1).await.unwrap().latest, 1);
    clock.advance(1);
    assert_eq!(s.fence_check("freed", 1).await.unwrap().latest, 0);
    assert_eq!(
        s.fence_check("bare", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 0
        },
        "forgotten"
    );
    assert_eq!(
        s.session_acquire("bare", "h2", 30_000).await.unwrap(),
        fence(1)
    );
    // The session with a record is kept for the retention.
    assert_eq!(s.fence_check("kept", 1).await.unwrap().latest, 1);
    assert_eq!(s.delete_records("kept").await.unwrap(), 1);
    clock.advance(GRACE + 30_000);
    assert_eq!(
        s.fence_check("kept", 1).await.unwrap().latest,
        1,
        "deleting its records keeps the counter for the retention"
    );
}

/// SPEC §2: a reservation of 0 tokens is invalid (field `estimate`) and
/// records nothing: it would hold a run record for free.
pub async fn zero_token_reservations_are_invalid<S: Store + Clone>(store: S, clock: FakeClock) {
    let l = limiter_with(store, &clock, support());
    for r in [
        l.reserve_tokens("u1", "run", 0).await,
        l.reserve_tokens_and_wait("u1", "run", 0).await,
    ] {
        assert!(
            matches!(
                r,
                Err(LimiterError::InvalidRequest {
                    field: "estimate",
                    ..
                })
            ),
            "{r:?}"
        );
    }
    // Nothing was recorded: the run's first reservation is call 1.
    let g = allowed(&l.reserve_tokens("u1", "run", 1).await.unwrap());
    assert_eq!(g.id.to_string(), "1.run");
}

/// A reserve that names a request id answers its first grant again on a
/// repeat (same reservation, what is left of its wait) and charges once; a
/// denial is not remembered; ids are per run (SPEC §2).
pub async fn request_ids_answer_the_first_grant<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::Reserve;
    let l = limiter_with(store, &clock, support());
    let call = |inv, estimate, id| Reserve {
        invocation_id: inv,
        estimate,
        request_id: Some(id),
        wait: false,
    };
    let a = allowed(&l.reserve("u1", call("run", 50_000, "q1")).await.unwrap());
    assert_eq!(a.id, ReservationId::new("run", 1));
    let again = allowed(&l.reserve("u1", call("run", 50_000, "q1")).await.unwrap());
    assert_eq!(again.id, a.id, "the first grant");
    assert_eq!(
        state(&l, "u1").await.tokens_available,
        10_000,
        "charged once"
    );
    // A grant with a wait: a repeat later answers what is left of it.
    let w = allowed(&l.reserve("u1", call("run", 12_000, "q2")).await.unwrap());
    assert_eq!((w.id.call, w.wait_ms), (2, 2_000));
    clock.advance(500);
    let w2 = allowed(&l.reserve("u1", call("run", 12_000, "q2")).await.unwrap());
    assert_eq!((w2.id, w2.wait_ms), (w.id.clone(), 1_500));
    clock.advance(5_000);
    let w3 = allowed(&l.reserve("u1", call("run", 12_000, "q2")).await.unwrap());
    assert_eq!(w3.wait_ms, 0);
    // Another run's id space is its own; another user's too.
    let b = allowed(&l.reserve("u1", call("other", 1_000, "q1")).await.unwrap());
    assert_eq!(b.id, ReservationId::new("other", 1));
    let c = allowed(&l.reserve("u2", call("run", 1_000, "q1")).await.unwrap());
    assert_eq!(c.id, ReservationId::new("run", 1));
    // A denial is decided anew on its repeat.
    let d = l.reserve("u1", call("run", 60_000, "q3")).await.unwrap();
    assert_eq!(limited(&d).0, Limit::TokenRate);
    clock.advance(60_000);
    let e = allowed(&l.reserve("u1", call("run", 60_000, "q3")).await.unwrap());
    assert_eq!(e.id.call, 3);
    // Settling the first grant and repeating it answers the same id: the
    // settle then says it is already closed.
    l.settle("u1", &a.id, 1).await.unwrap();
    let r = allowed(&l.reserve("u1", call("run", 50_000, "q1")).await.unwrap());
    assert_eq!(r.id, a.id);
    assert!(!l.settle("u1", &r.id, 1).await.unwrap().applied);
}

/// Reconciliation (SPEC §6): a fallback's turns and net tokens are
/// charged, into debt if need be; an ambiguous reserve the store ran is
/// refunded (so it is charged once) and one it did not run is marked, so a
/// late copy takes nothing; an ambiguous admission whose lease is held
/// here is not charged a second turn; a batch is applied once per replica.
pub async fn reconcile_charges_and_resolves_ambiguity<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::Reserve;
    use tollgate_core::store::{ReconcileRequest, Reconciled};
    let l = limiter_with(store, &clock, support());
    let plan = l.plan_for("u1").unwrap();
    allowed(&l.admit_turn("u1", "held").await.unwrap());
    let ran = Reserve {
        invocation_id: "run",
        estimate: 6_000,
        request_id: Some("ran"),
        wait: false,
    };
    let first = allowed(&l.reserve("u1", ran).await.unwrap());
    let s = state(&l, "u1").await;
    assert_eq!((s.turns_available, s.tokens_available), (4, 54_000));
    let req = ReconcileRequest {
        user: "u1",
        turns: plan.turns,
        tokens: plan.tokens,
        turns_taken: 3,
        tokens_net: 70_000,
        ambiguous_reserves: &[("run", "ran"), ("run", "never-ran")],
        ambiguous_admissions: &["held", "not-held"],
        replica: 7,
        batch: 1,
    };
    let r = l.store().reconcile(req).await.unwrap();
    assert_eq!(
        r,
        Reconciled {
            turns: 2,
            tokens: 64_000,
            refunded: 1,
        }
    );
    let s = state(&l, "u1").await;
    // 4 - 2 turns; 54,000 + 6,000 refunded - 70,000 charged: in debt.
    assert_eq!((s.turns_available, s.tokens_available), (2, -10_000));
    assert_eq!(s.tokens_last_minute, 6_000 + 64_000);
    // The same batch again (a retry after its answer was lost): charged
    // once.
    let again = l.store().reconcile(req).await.unwrap();
    assert_eq!(again, Reconciled::default());
    let s = state(&l, "u1").await;
    assert_eq!((s.turns_available, s.tokens_available), (2, -10_000));
    // The refunded reservation is closed; its id and the one never run are
    // superseded: a late copy or a retry takes nothing.
    assert!(!l.settle("u1", &first.id, 6_000).await.unwrap().applied);
    for id in ["ran", "never-ran"] {
        let late = Reserve {
            request_id: Some(id),
            ..ran
        };
        let e = l.reserve("u1", late).await.unwrap_err();
        assert!(
            matches!(&e, tollgate_core::LimiterError::InvalidRequest { field, .. } if *field == "request_id"),
            "{e:?}"
        );
    }
    assert_eq!(state(&l, "u1").await.tokens_available, -10_000);
    // A negative net gives back (a refund settled after the last
    // reconciliation), capped at the burst.
    let back = ReconcileRequest {
        turns_taken: 0,
        tokens_net: -100_000,
        ambiguous_reserves: &[],
        ambiguous_admissions: &[],
        batch: 2,
        ..req
    };
    let r = l.store().reconcile(back).await.unwrap();
    assert_eq!((r.turns, r.tokens, r.refunded), (0, -100_000, 0));
    assert_eq!(state(&l, "u1").await.tokens_available, 60_000);
    // The debt waits off like any other: nothing was lost.
    clock.advance(60_000);
    assert_eq!(state(&l, "u1").await.turns_available, 5);
}

// ----- grouped session writes (SPEC §4) --------------------------------------

fn g(rest: &str) -> String {
    tollgate_core::store::grouped::grouped_name("grp", rest)
}

fn write<'a>(log: &'a str, record: Option<&'a [u8]>) -> LogWrite<'a> {
    LogWrite { log, record }
}

async fn records<S: Store>(s: &S, name: &str) -> Vec<Vec<u8>> {
    s.read_records(name, 0, 100).await.unwrap()
}

fn bytes(items: &[&[u8]]) -> Vec<Vec<u8>> {
    items.iter().map(|b| b.to_vec()).collect()
}

/// SPEC §4 grouped create: record 0 and the logs of the session's group in
/// one step, or nothing (busy while a holder holds the lease, exists once
/// it has records); the create issues a fence of its own, so an earlier
/// holder is stale; a log in another group is refused before anything is
/// written.
pub async fn session_create_writes_its_group_in_one_step<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let s = &store;
    let (sess, catalog, app) = (g("s1"), g("catalog"), g("app"));
    // A holder from before the create.
    assert!(matches!(
        s.session_acquire(&sess, "h1", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    assert!(s.session_release(&sess, "h1").await.unwrap());
    let logs = [write(&catalog, Some(b"c1")), write(&app, None)];
    let create = |session, record, logs| SessionCreate {
        session,
        record,
        logs,
    };
    assert_eq!(
        s.session_create(create(&sess, b"r0", &logs)).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0"]));
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    assert!(
        records(s, &app).await.is_empty(),
        "a log only refreshed is not created"
    );
    assert_eq!(
        s.append_fenced(&sess, 1, b"late").await.unwrap(),
        AppendOutcome::Stale { latest: 2 },
        "the create superseded the earlier holder"
    );
    // Exists: nothing written, not even the logs.
    let again = [write(&catalog, Some(b"c2")), write(&app, Some(b"a2"))];
    assert_eq!(
        s.session_create(create(&sess, b"r0'", &again))
            .await
            .unwrap(),
        SessionCreated::Exists
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0"]));
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    assert!(records(s, &app).await.is_empty());
    // Busy while a holder holds the lease: nothing written.
    let held = g("s2");
    assert!(matches!(
        s.session_acquire(&held, "turn", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    clock.advance(10_000);
    assert_eq!(
        s.session_create(create(&held, b"r0", &again))
            .await
            .unwrap(),
        SessionCreated::Busy {
            retry_after_ms: 20_000
        }
    );
    assert!(records(s, &held).await.is_empty());
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    // Once the lease is free (released or lapsed) the create goes ahead.
    clock.advance(20_000);
    let c2 = [write(&catalog, Some(b"c2"))];
    assert_eq!(
        s.session_create(create(&held, b"h0", &c2)).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1", b"c2"]));
    // A log of another group (or an ungrouped name) cannot be in the step.
    let lone = g("s3");
    let other = tollgate_core::store::grouped::grouped_name("other", "catalog");
    for bad in [other.as_str(), "catalog", lone.as_str()] {
        let logs = [write(bad, Some(b"x"))];
        let e = s
            .session_create(SessionCreate {
                session: &lone,
                record: b"r0",
                logs: &logs,
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol, "{bad}");
        assert!(records(s, bad).await.is_empty());
    }
    assert!(records(s, &lone).await.is_empty());
    assert_eq!(s.fence_check(&lone, 1).await.unwrap().latest, 0);
    // An ungrouped session is a group of its own: created alone.
    assert_eq!(
        s.session_create(create("plain", b"p0", &[])).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    assert_eq!(records(s, "plain").await, bytes(&[b"p0"]));
}

/// SPEC §4 retention of a log: a log written a record keeps the end its
/// record gave it after the records are deleted (the end never moves back),
/// so a lease taken on it later is kept to that end, past the grace.
pub async fn a_log_keeps_its_end_after_its_records_are_deleted<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_GRACE_MS as GRACE;
    let s = &store;
    let (sess, log) = (g("s1"), g("catalog"));
    let logs = [write(&log, Some(b"c1"))];
    assert_eq!(
        s.session_create(SessionCreate {
            session: &sess,
            record: b"r0",
            logs: &logs,
        })
        .await
        .unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    assert_eq!(s.delete_records(&log).await.unwrap(), 1);
    assert!(matches!(
        s.session_acquire(&log, "h", 1).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    clock.advance(GRACE + 1);
    assert!(
        matches!(
            s.session_acquire(&log, "h", 1).await.unwrap(),
            SessionAcquire::Acquired(SessionGrant { fence: 2, .. })
        ),
        "kept for the retention its record gave it, not forgotten after the grace"
    );
}

/// SPEC §4 grouped append: checked in one step against the fence (stale
/// first), the session's existence, then the event id; a refused or
/// repeated append writes nothing, its logs included; ids are kept with
/// the records.
pub async fn session_append_is_fenced_and_once_per_id<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let s = &store;
    let (sess, user, app) = (g("s"), g("user"), g("app"));
    let append = |fence, id, record, logs| SessionAppend {
        session: &sess,
        fence,
        id,
        record,
        logs,
    };
    let deltas = |u: &'static [u8], a: &'static [u8]| [write(&user, Some(u)), write(&app, Some(a))];
    let fence_of = |a: SessionAcquire| match a {
        SessionAcquire::Acquired(g) => g.fence,
        busy => panic!("busy: {busy:?}"),
    };
    // Not created yet: missing, nothing written.
    let f1 = fence_of(s.session_acquire(&sess, "h1", 30_000).await.unwrap());
    let d1 = deltas(b"u0", b"a0");
    assert_eq!(
        s.session_append(append(f1, Some("e0"), b"e0", &d1))
            .await
            .unwrap(),
        SessionAppended::Missing
    );
    assert!(records(s, &sess).await.is_empty());
    assert!(records(s, &user).await.is_empty());
    assert!(s.session_release(&sess, "h1").await.unwrap());
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    let f3 = fence_of(s.session_acquire(&sess, "h2", 30_000).await.unwrap());
    assert_eq!(f3, 3);
    let d2 = deltas(b"u1", b"a1");
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1", &d2))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    // The same id again: nothing written, whatever it carries.
    let d3 = deltas(b"u1'", b"a1'");
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1'", &d3))
            .await
            .unwrap(),
        SessionAppended::Repeated
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0", b"e1"]));
    assert_eq!(records(s, &user).await, bytes(&[b"u1"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1"]));
    // Without an id (or with an empty one), every append lands.
    for (id, index) in [(None, 2), (None, 3), (Some(""), 4), (Some(""), 5)] {
        assert_eq!(
            s.session_append(append(f3, id, b"x", &[])).await.unwrap(),
            SessionAppended::Appended { index },
            "{id:?}"
        );
    }
    // h2 stalls past its TTL; h3 takes the session over.
    clock.advance(30_001);
    let f4 = fence_of(s.session_acquire(&sess, "h3", 30_000).await.unwrap());
    assert_eq!(f4, 4);
    let d4 = deltas(b"late", b"late");
    assert_eq!(
        s.session_append(append(f3, Some("e2"), b"late", &d4))
            .await
            .unwrap(),
        SessionAppended::Stale { latest: 4 },
        "the old holder's deltas cannot land after the takeover"
    );
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Stale { latest: 4 },
        "the fence is checked first"
    );
    assert_eq!(records(s, &user).await, bytes(&[b"u1"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1"]));
    let d5 = deltas(b"u2", b"a2");
    assert_eq!(
        s.session_append(append(f4, Some("e2"), b"e2", &d5))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 6 }
    );
    assert_eq!(records(s, &user).await, bytes(&[b"u1", b"u2"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1", b"a2"]));
    // The ids go with the records.
    assert_eq!(s.delete_records(&sess).await.unwrap(), 7);
    assert_eq!(
        s.session_append(append(f4, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Missing
    );
    assert!(s.session_release(&sess, "h3").await.unwrap());
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 5 }
    );
    let f6 = fence_of(s.session_acquire(&sess, "h4", 30_000).await.unwrap());
    assert_eq!(
        s.session_append(append(f6, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 1 },
        "a deleted session's ids are forgotten"
    );
    let e = s
        .session_append(append(f6, Some("e9"), b"e9", &[write("elsewhere", None)]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol);
    assert_eq!(records(s, &sess).await, bytes(&[b"r0", b"e1"]));
}

/// SPEC §4 grouped delete: the records, the event ids and the logs in one
/// step; a session without records writes nothing; the fence counter stays.
pub async fn session_delete_writes_its_group_in_one_step<S: Store + Clone>(
    store: S,
    _clock: FakeClock,
) {
    let s = &store;
    let (sess, catalog) = (g("s"), g("catalog"));
    let gone = [write(&catalog, Some(b"deleted"))];
    let delete = SessionDelete {
        session: &sess,
        logs: &gone,
    };
    assert_eq!(s.session_delete(delete).await.unwrap(), 0);
    assert!(records(s, &catalog).await.is_empty(), "nothing to delete");
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[write(&catalog, Some(b"created"))],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    let append = SessionAppend {
        session: &sess,
        fence: 1,
        id: Some("e1"),
        record: b"e1",
        logs: &[],
    };
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    assert_eq!(s.session_delete(delete).await.unwrap(), 2);
    assert!(records(s, &sess).await.is_empty());
    assert_eq!(records(s, &catalog).await, bytes(&[b"created", b"deleted"]));
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Missing
    );
    assert_eq!(s.session_delete(delete).await.unwrap(), 0);
    assert_eq!(records(s, &catalog).await, bytes(&[b"created", b"deleted"]));
    assert_eq!(s.fence_check(&sess, 1).await.unwrap().latest, 1);
    let e = s
        .session_delete(SessionDelete {
            session: &sess,
            logs: &[write("elsewhere", Some(b"x"))],
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol);
}

/// SPEC §4 retention of logs: a log is a session like any other, kept for
/// the retention after its last write; a grouped write that only names it
/// (`record: None`) refreshes it.
pub async fn grouped_logs_live_as_long_as_they_are_written<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_RETENTION_MS as RETENTION;
    let s = &store;
    let (sess, kept, left) = (g("s"), g("kept"), g("left"));
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[write(&kept, Some(b"k")), write(&left, Some(b"l"))],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    clock.advance(RETENTION - 1_000);
    let append = SessionAppend {
        session: &sess,
        fence: 1,
        id: Some("e1"),
        record: b"e1",
        logs: &[write(&kept, None)],
    };
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    clock.advance(1_000);
    assert!(records(s, &left).await.is_empty(), "past its retention");
    assert_eq!(records(s, &kept).await, bytes(&[b"k"]), "refreshed");
    clock.advance(RETENTION - 1_001);
    assert_eq!(records(s, &kept).await, bytes(&[b"k"]));
    assert_eq!(records(s, &sess).await.len(), 2);
    clock.advance(1);
    assert!(records(s, &kept).await.is_empty());
    assert!(records(s, &sess).await.is_empty());
    // Forgotten with its records: the fence and the ids start again.
    assert_eq!(s.fence_check(&sess, 1).await.unwrap().latest, 0);
}
