use super::*;

fn turns() -> BucketSpec {
    // 20 turns/min, burst 5.
    BucketSpec::new(20, 60_000, 5).unwrap()
}

fn tokens() -> BucketSpec {
    // 60,000 tokens/min, burst 60,000.
    BucketSpec::new(60_000, 60_000, 60_000).unwrap()
}

#[test]
fn spec_validation() {
    assert_eq!(BucketSpec::new(0, 1, 1), Err(InvalidSpec::ZeroAmount));
    assert_eq!(BucketSpec::new(1, 0, 1), Err(InvalidSpec::ZeroPeriod));
    assert_eq!(BucketSpec::new(1, 1, 0), Err(InvalidSpec::ZeroCapacity));
    assert_eq!(
        BucketSpec::new(1, 1 << 27, 1 << 27),
        Err(InvalidSpec::TooLarge)
    );
    assert!(BucketSpec::new(1, 1 << 26, 1 << 27).is_ok());
    assert_eq!(
        BucketSpec::new(1 << 30, 1 << 24, 1),
        Err(InvalidSpec::TooLarge)
    );
}

#[test]
fn missing_state_is_full() {
    let s = refill(&turns(), None, 77);
    assert_eq!(
        s,
        BucketState {
            level: 300_000,
            ts: 77,
            period_ms: 60_000
        }
    );
}

#[test]
fn refill_is_capped_and_clock_step_back_never_refills_twice() {
    let spec = turns();
    let s = BucketState {
        level: 0,
        ts: 1_000,
        period_ms: 60_000,
    };
    assert_eq!(refill(&spec, Some(s), 2_000).level, 20_000);
    assert_eq!(refill(&spec, Some(s), 1_000_000).level, 300_000);
    // Stepping back: no refill, ts kept at the later time.
    let back = refill(&spec, Some(s), 500);
    assert_eq!(
        back,
        BucketState {
            level: 0,
            ts: 1_000,
            period_ms: 60_000
        }
    );
    // And moving forward again counts only from the later time.
    assert_eq!(refill(&spec, Some(back), 1_500).level, 10_000);
}

#[test]
fn example_1_turns() {
    let spec = turns();
    let mut state = None;
    for _ in 0..5 {
        let t = take(&spec, state, 0, 1, 0);
        assert_eq!(t.outcome, Take::Granted { wait_ms: 0 });
        state = Some(t.state);
    }
    for _ in 0..5 {
        let t = take(&spec, state, 1_000, 1, 0);
        assert_eq!(
            t.outcome,
            Take::Refused {
                retry_after_ms: 2_000
            }
        );
        // One third of a token, nothing taken.
        assert_eq!(t.state.level, 20_000);
        state = Some(t.state);
    }
    // Retried at the hint, it is granted.
    let t = take(&spec, state, 3_000, 1, 0);
    assert_eq!(t.outcome, Take::Granted { wait_ms: 0 });
}

#[test]
fn example_3_refusal_and_inclusive_boundary() {
    let spec = tokens();
    let empty = Some(BucketState {
        level: 0,
        ts: 0,
        period_ms: 60_000,
    });
    let t = take(&spec, empty, 0, 6_000, 2_000);
    assert_eq!(
        t.outcome,
        Take::Refused {
            retry_after_ms: 4_000
        }
    );
    assert_eq!(
        t.state,
        BucketState {
            level: 0,
            ts: 0,
            period_ms: 60_000
        }
    );
    let t = take(&spec, empty, 0, 6_000, 6_000);
    assert_eq!(t.outcome, Take::Granted { wait_ms: 6_000 });
    assert_eq!(t.state.level, -360_000_000);
    // One ms short of the boundary is refused with a 1 ms hint.
    let t = take(&spec, empty, 0, 6_000, 5_999);
    assert_eq!(t.outcome, Take::Refused { retry_after_ms: 1 });
    // Retrying at the hint: granted within max_wait.
    let t = take(&spec, empty, 4_000, 6_000, 2_000);
    assert_eq!(t.outcome, Take::Granted { wait_ms: 2_000 });
}

#[test]
fn wait_is_a_ceiling() {
    // 1 token per 3 ms: 1 token short needs ceil(3) = 3 ms; a third of a
    // token short needs 1 ms.
    let spec = BucketSpec::new(1, 3, 1).unwrap();
    let t = take(
        &spec,
        Some(BucketState {
            level: 0,
            ts: 0,
            period_ms: 3,
        }),
        0,
        1,
        10,
    );
    assert_eq!(t.outcome, Take::Granted { wait_ms: 3 });
    let t = take(
        &spec,
        Some(BucketState {
            level: 2,
            ts: 0,
            period_ms: 3,
        }),
        0,
        1,
        10,
    );
    assert_eq!(t.outcome, Take::Granted { wait_ms: 1 });
}

#[test]
fn exceeds_capacity_is_separate_and_takes_nothing() {
    let spec = tokens();
    // capacity 60,000 + 2,000 ms × 1 token/ms = 62,000 fits, 62,001 never.
    assert_eq!(spec.max_cost(2_000), 62_000);
    let t = take(&spec, None, 0, 62_001, 2_000);
    assert_eq!(t.outcome, Take::ExceedsCapacity);
    assert_eq!(t.state.level, spec.capacity_scaled());
    let t = take(&spec, None, 0, 62_000, 2_000);
    assert_eq!(t.outcome, Take::Granted { wait_ms: 2_000 });
    // Huge costs do not overflow.
    let t = take(&spec, None, 0, u64::MAX, u64::MAX / 2);
    assert_eq!(t.outcome, Take::ExceedsCapacity);
}

#[test]
fn debt_then_the_next_take_waits() {
    let spec = tokens();
    let t = take(&spec, None, 0, 62_000, 2_000);
    assert_eq!(t.outcome, Take::Granted { wait_ms: 2_000 });
    // 2,000 tokens of debt: a 1-token take needs 2,001 ms.
    let t2 = take(&spec, Some(t.state), 0, 1, 10_000);
    assert_eq!(t2.outcome, Take::Granted { wait_ms: 2_001 });
}

#[test]
fn adjust_settle_and_refund() {
    let spec = tokens();
    let t = take(&spec, None, 0, 6_000, 0);
    let level = t.state.level;
    // Settle: actual 8,000 vs estimate 6,000 takes 2,000 more.
    let s = adjust(&spec, Some(t.state), 0, 2_000);
    assert_eq!(s.state.level, level - 2_000 * 60_000);
    // Refund gives it back, capped at capacity.
    let r = adjust(&spec, Some(s.state), 0, -1_000_000);
    assert_eq!(r.state.level, spec.capacity_scaled());
    // Unbounded debt within MAX_SCALED, never refused.
    let d = adjust(&spec, None, 0, 1_000_000);
    assert_eq!(spec.unscale(d.state.level), -940_000);
    let huge = adjust(&spec, None, 0, i64::MAX);
    assert_eq!(huge.state.level, -MAX_SCALED);
}

#[test]
fn expiry_rule() {
    let spec = turns();
    // Empty at t=0: full after 5 × 3,000 ms, plus the 60 s grace.
    assert_eq!(expires_at(&spec, 0, 0), 15_000 + 60_000);
    assert_eq!(expires_at(&spec, spec.capacity_scaled(), 10), 60_010);
    // Debt extends it; the ceiling holds for a partial token.
    assert_eq!(expires_at(&spec, -1, 0), 15_001 + 60_000);
    let t = take(&spec, None, 0, 1, 0);
    assert_eq!(t.expires_at, 3_000 + 60_000);
}

#[test]
fn a_new_period_rescales_in_whole_tokens() {
    // 59,999.5 tokens at 1,000/1,000 ms, reloaded as 60,000/60,000 ms.
    let old = BucketSpec::new(1_000, 1_000, 60_000).unwrap();
    let new = BucketSpec::new(60_000, 60_000, 60_000).unwrap();
    let s = BucketState {
        level: 59_999_500,
        ts: 0,
        period_ms: 1_000,
    };
    let r = refill(&new, Some(s), 0);
    assert_eq!(r.level, 59_999 * 60_000);
    assert_eq!(r.period_ms, 60_000);
    assert_eq!(new.unscale(r.level), 59_999);
    // Debt keeps its size (rounded toward more debt).
    let d = BucketState {
        level: -1_500,
        ts: 0,
        period_ms: 1_000,
    };
    assert_eq!(refill(&new, Some(d), 0).level, -2 * 60_000);
    assert_eq!(refill(&old, Some(s), 0).level, 59_999_500);
}

#[test]
fn max_wait_is_cut_so_debt_stays_exact() {
    let spec = BucketSpec::new(1, 1, 1).unwrap();
    assert_eq!(spec.max_wait_limit(), (1 << 53) - 1);
    let t = take(&spec, None, 0, 1 << 60, u64::MAX);
    assert_eq!(t.outcome, Take::ExceedsCapacity);
    let t = take(&spec, None, 0, 1 << 53, u64::MAX);
    assert_eq!(
        t.outcome,
        Take::Granted {
            wait_ms: (1 << 53) - 1
        }
    );
    assert_eq!(t.state.level, -((1 << 53) - 1));
}

#[test]
fn ttl_is_clamped() {
    assert_eq!(clamp_ttl(0), 1);
    assert_eq!(clamp_ttl(u64::MAX), MAX_TTL_MS);
    assert_eq!(clamp_ttl(5), 5);
}

#[test]
fn unscale_rounds_down() {
    let spec = turns();
    assert_eq!(spec.unscale(20_000), 0);
    assert_eq!(spec.unscale(-1), -1);
    assert_eq!(spec.unscale(120_000), 2);
}
