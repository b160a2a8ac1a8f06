//! The token bucket (SPEC §2, §6): shadow mode, a clock stepping back,
//! multi-bucket and single takes, inspection and reset, capacity and
//! period changes.

use tollgate_core::store::{BucketTake, MultiTake};
use tollgate_core::{
    BucketSpec, Clock, Decision, Denial, FakeClock, Limit, PlansConfig, RateConfig, Store,
};

use super::{allowed, limited, limiter_with, state, support};

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
