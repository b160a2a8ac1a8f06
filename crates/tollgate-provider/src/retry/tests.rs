//! Backoff, the budget's window and the retrier's decisions.

use super::*;
use tollgate_core::clock::FakeClock;

fn server_error(hint: Option<u64>) -> Feedback {
    Feedback::ServerError {
        retry_after_ms: hint,
    }
}

#[test]
fn seeded_draws_are_fastrands() {
    // A seeded retrier draws what `fastrand::Rng::with_seed` draws, so a
    // test can replay its delays.
    let policy = RetryPolicy {
        min_retries_per_minute: u32::MAX,
        ..RetryPolicy::default()
    };
    let r = Retrier::with_seed(policy, FakeClock::new(0), 1_234_567);
    let mut rng = fastrand::Rng::with_seed(1_234_567);
    for attempt in [1, 2, 3, 1, 2, 3] {
        let expected = backoff_ms(&policy, attempt, None, &mut || rng.u64(..));
        assert_eq!(
            r.decide(attempt, &server_error(None)),
            RetryDecision::Retry { delay_ms: expected }
        );
    }
}

#[test]
fn uniform_covers_both_ends() {
    assert_eq!(uniform_inclusive(0, 200), 0);
    assert_eq!(uniform_inclusive(u64::MAX, 200), 200);
    assert_eq!(uniform_inclusive(u64::MAX, 0), 0);
    assert_eq!(uniform_inclusive(u64::MAX, u64::MAX), u64::MAX);
    assert_eq!(uniform_inclusive(1 << 63, 199), 100);
}

#[test]
fn cap_saturates() {
    let p = RetryPolicy {
        max_delay_ms: u64::MAX,
        ..RetryPolicy::default()
    };
    assert_eq!(p.backoff_cap_ms(0), 200);
    assert_eq!(p.backoff_cap_ms(1), 200);
    assert_eq!(p.backoff_cap_ms(64), u64::MAX);
    assert_eq!(p.backoff_cap_ms(u32::MAX), u64::MAX);
}

#[test]
fn ratio_is_clamped_and_exact() {
    let ppm = |r| {
        RetryPolicy {
            budget_ratio: r,
            ..RetryPolicy::default()
        }
        .ratio_ppm()
    };
    assert_eq!(ppm(0.1), 100_000);
    assert_eq!(ppm(f64::NAN), 0);
    assert_eq!(ppm(-1.0), 0);
    assert_eq!(ppm(7.0), PPM);
    assert_eq!(ppm(0.333_333_4), 333_333);
}

#[test]
fn validate_lists_every_problem() {
    RetryPolicy::default().validate().unwrap();
    let err = RetryPolicy {
        max_attempts: 0,
        budget_ratio: f64::NAN,
        ..RetryPolicy::default()
    }
    .validate()
    .unwrap_err();
    let paths: Vec<_> = err.errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["max_attempts", "budget_ratio"]);
}

#[test]
fn zero_attempts_still_make_one() {
    let r = Retrier::with_seed(
        RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        },
        FakeClock::new(0),
        1,
    );
    assert_eq!(
        r.decide(1, &server_error(None)),
        RetryDecision::GiveUp(GiveUpReason::AttemptsExhausted)
    );
}

#[test]
fn window_clears_skipped_seconds_and_tolerates_steps_back() {
    let b = RetryBudget::new(&RetryPolicy {
        budget_ratio: 1.0,
        min_retries_per_minute: 0,
        ..RetryPolicy::default()
    });
    b.record_request(10_000);
    b.record_request(30_000);
    // Seconds 10 to 69 are in the window at 69.999 s.
    assert_eq!(b.snapshot(69_999).requests, 2);
    assert_eq!(b.snapshot(70_000).requests, 1);
    // A step back counts in the newest second (70).
    b.record_request(5_000);
    assert_eq!(b.snapshot(89_999).requests, 2);
    assert_eq!(b.snapshot(90_000).requests, 1);
    assert_eq!(b.snapshot(129_999).requests, 1);
    assert_eq!(b.snapshot(130_000).requests, 0);
    // A gap longer than the window clears everything.
    b.record_request(130_000);
    assert_eq!(b.snapshot(10_000_000).requests, 0);
}

#[test]
fn deadline_cuts_jitter_but_honours_the_hint() {
    let clock = FakeClock::new(1_000);
    let r = Retrier::with_seed(
        RetryPolicy {
            base_delay_ms: 10_000,
            min_retries_per_minute: u32::MAX,
            ..RetryPolicy::default()
        },
        clock.clone(),
        9,
    );
    for _ in 0..50 {
        match r.decide_until(1, &server_error(None), 1_050) {
            RetryDecision::Retry { delay_ms } => assert!(delay_ms <= 50),
            other => panic!("{other:?}"),
        }
    }
    let r = Retrier::with_seed(
        RetryPolicy {
            min_retries_per_minute: u32::MAX,
            ..RetryPolicy::default()
        },
        clock.clone(),
        9,
    );
    for _ in 0..50 {
        match r.decide_until(1, &server_error(Some(40)), 1_050) {
            RetryDecision::Retry { delay_ms } => assert!((40..=50).contains(&delay_ms)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        r.decide_until(1, &server_error(Some(51)), 1_050),
        RetryDecision::GiveUp(GiveUpReason::HintTooLong)
    );
    assert_eq!(
        r.decide_until(1, &server_error(None), 1_000),
        RetryDecision::GiveUp(GiveUpReason::DeadlineReached)
    );
}
