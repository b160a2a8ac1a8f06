//! The retry layer (SPEC §5): full-jitter backoff, attempts, the provider's
//! hint, the sliding-minute budget, and `Retrier::run` on a fake clock.

use std::sync::Arc;

use parking_lot::Mutex;
use tollgate_core::{Clock, Decision, FakeClock, MemoryStore};
use tollgate_provider::{
    AttemptError, Feedback, GiveUpReason, PermitRequest, ProviderGovernor, ProvidersConfig,
    RateLimitHeaders, Retrier, RetryBudget, RetryDecision, RetryError, RetryPolicy, ThrottleScope,
    backoff_ms, validate_providers,
};

fn server_error(hint: Option<u64>) -> Feedback {
    Feedback::ServerError {
        retry_after_ms: hint,
    }
}

fn throttled(hint: Option<u64>) -> Feedback {
    Feedback::Throttled {
        retry_after_ms: hint,
        scope: ThrottleScope::Requests,
    }
}

fn success() -> Feedback {
    Feedback::Success {
        limits: RateLimitHeaders::default(),
    }
}

fn exhausted() -> Feedback {
    Feedback::Exhausted {
        reason: "per_day_limit".to_owned(),
        retry_after_ms: None,
    }
}

/// Yields to the task under test until `cond` holds.
async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

/// Waits until the task under test has registered a sleep on the clock.
async fn sleeping(clock: &FakeClock) {
    wait_for("a sleep on the clock", || clock.pending_sleeps() > 0).await;
}

// ---------------------------------------------------------------------------
// Backoff
// ---------------------------------------------------------------------------

#[test]
fn backoff_stays_within_hint_and_cap_over_many_seeds() {
    let policy = RetryPolicy::default();
    for seed in 0..2_000u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        for attempt in 1..=10 {
            let cap = policy.backoff_cap_ms(attempt);
            for hint in [None, Some(0), Some(150), Some(5_000), Some(60_000)] {
                let d = backoff_ms(&policy, attempt, hint, &mut || rng.u64(..));
                let floor = hint.unwrap_or(0);
                assert!(
                    d >= floor,
                    "seed {seed} attempt {attempt}: {d} < hint {floor}"
                );
                assert!(
                    d <= cap.max(floor),
                    "seed {seed} attempt {attempt}: {d} > cap {cap} and hint {floor}"
                );
            }
        }
    }
}

#[test]
fn backoff_is_full_jitter_and_grows_by_attempt() {
    let policy = RetryPolicy::default();
    // The extremes of the generator give the ends of the range.
    for attempt in 1..=10 {
        assert_eq!(backoff_ms(&policy, attempt, None, &mut || 0), 0);
        assert_eq!(
            backoff_ms(&policy, attempt, None, &mut || u64::MAX),
            policy.backoff_cap_ms(attempt)
        );
    }
    let caps: Vec<u64> = (1..=9).map(|a| policy.backoff_cap_ms(a)).collect();
    assert_eq!(
        caps,
        [200, 400, 800, 1_600, 3_200, 6_400, 12_800, 20_000, 20_000]
    );

    // Over many draws: the whole range is used, and the mean doubles with
    // each attempt until the cap.
    let mut rng = fastrand::Rng::with_seed(1);
    let mut means = Vec::new();
    for attempt in 1..=9 {
        let cap = policy.backoff_cap_ms(attempt);
        let draws: Vec<u64> = (0..4_000)
            .map(|_| backoff_ms(&policy, attempt, None, &mut || rng.u64(..)))
            .collect();
        let (lo, hi) = (*draws.iter().min().unwrap(), *draws.iter().max().unwrap());
        assert!(lo <= cap / 50, "attempt {attempt}: min {lo}");
        assert!(hi >= cap - cap / 50, "attempt {attempt}: max {hi}");
        let mean = draws.iter().sum::<u64>() / draws.len() as u64;
        let half = cap / 2;
        assert!(
            mean.abs_diff(half) <= half / 10,
            "attempt {attempt}: mean {mean}, expected about {half}"
        );
        means.push(mean);
    }
    for w in means.windows(2).take(6) {
        assert!(w[1] > w[0] * 3 / 2, "{means:?}");
    }
}

#[test]
fn hint_is_honoured_over_jitter() {
    let policy = RetryPolicy::default();
    // A hint above the cap wins, even beyond max_delay_ms.
    assert_eq!(backoff_ms(&policy, 1, Some(1_500), &mut || u64::MAX), 1_500);
    assert_eq!(
        backoff_ms(&policy, 9, Some(37_000), &mut || u64::MAX),
        37_000
    );
    // A hint below the draw changes nothing.
    assert_eq!(backoff_ms(&policy, 3, Some(100), &mut || u64::MAX), 800);
    // Same through the retrier, for both retryable classes.
    let r = Retrier::with_seed(policy, FakeClock::new(0), 3);
    for fb in [server_error(Some(1_500)), throttled(Some(1_500))] {
        match r.decide(1, &fb) {
            RetryDecision::Retry { delay_ms } => assert_eq!(delay_ms, 1_500),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn same_seed_same_delays() {
    let delays = |seed| {
        let r = Retrier::with_seed(RetryPolicy::default(), FakeClock::new(0), seed);
        (1..=3)
            .map(|a| match r.decide(a, &server_error(None)) {
                RetryDecision::Retry { delay_ms } => delay_ms,
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(delays(11), delays(11));
    assert_ne!(delays(11), delays(12));
}

// ---------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------

#[test]
fn max_attempts_counts_the_first() {
    let r = Retrier::with_seed(RetryPolicy::default(), FakeClock::new(0), 5);
    for attempt in 1..=3 {
        assert!(
            matches!(
                r.decide(attempt, &server_error(None)),
                RetryDecision::Retry { .. }
            ),
            "attempt {attempt}"
        );
    }
    assert_eq!(
        r.decide(4, &server_error(None)),
        RetryDecision::GiveUp(GiveUpReason::AttemptsExhausted)
    );
    let once = Retrier::with_seed(
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        FakeClock::new(0),
        5,
    );
    assert_eq!(
        once.decide(1, &throttled(None)),
        RetryDecision::GiveUp(GiveUpReason::AttemptsExhausted)
    );
}

#[test]
fn non_retryable_feedback_is_not_retried_and_takes_no_token() {
    let clock = FakeClock::new(0);
    let r = Retrier::with_seed(RetryPolicy::default(), clock.clone(), 5);
    for fb in [exhausted(), Feedback::ClientError, success()] {
        assert_eq!(
            r.decide(1, &fb),
            RetryDecision::GiveUp(GiveUpReason::NotRetryable),
            "{fb:?}"
        );
    }
    assert_eq!(r.budget().snapshot(clock.now_ms()).retries, 0);
}

// ---------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------

#[test]
fn budget_allows_a_tenth_of_requests_with_a_floor() {
    for min in [0u32, 5, 10, 25] {
        let policy = RetryPolicy {
            budget_ratio: 0.1,
            min_retries_per_minute: min,
            ..RetryPolicy::default()
        };
        let budget = RetryBudget::new(&policy);
        for i in 0..100u64 {
            budget.record_request(i * 500); // 100 calls over 50 s
        }
        let allowed = (0..1_000).take_while(|_| budget.try_retry(55_000)).count();
        assert_eq!(allowed, 10.max(min as usize), "min_retries {min}");
        let snap = budget.snapshot(55_000);
        assert_eq!(
            (snap.requests, snap.retries, snap.allowed),
            (100, allowed as u64, allowed as u64)
        );
    }
}

#[test]
fn quiet_replica_gets_the_floor() {
    let budget = RetryBudget::new(&RetryPolicy::default());
    let allowed = (0..100).take_while(|_| budget.try_retry(1_000)).count();
    assert_eq!(allowed, 10);
}

#[test]
fn budget_window_slides() {
    let policy = RetryPolicy {
        budget_ratio: 0.1,
        min_retries_per_minute: 0,
        ..RetryPolicy::default()
    };
    let budget = RetryBudget::new(&policy);
    for _ in 0..100 {
        budget.record_request(0);
    }
    assert_eq!((0..100).take_while(|_| budget.try_retry(0)).count(), 10);
    // Still within the minute: spent, and the calls still count.
    assert!(!budget.try_retry(59_999));
    assert_eq!(budget.snapshot(59_999).requests, 100);
    // A minute on, calls and retries have left the window.
    let snap = budget.snapshot(60_000);
    assert_eq!((snap.requests, snap.retries), (0, 0));
    // New calls bring the budget back.
    for _ in 0..100 {
        budget.record_request(60_000);
    }
    assert_eq!(
        (0..100).take_while(|_| budget.try_retry(60_000)).count(),
        10
    );

    // Retries taken late in the window leave later than the calls.
    let budget = RetryBudget::new(&policy);
    for _ in 0..200 {
        budget.record_request(0);
    }
    assert_eq!(
        (0..100).take_while(|_| budget.try_retry(30_000)).count(),
        20
    );
    for _ in 0..100 {
        budget.record_request(60_000);
    }
    // 100 calls in the window allow 10, but the 20 retries at 30 s still count.
    assert!(!budget.try_retry(60_000));
    assert_eq!(
        (0..100).take_while(|_| budget.try_retry(90_000)).count(),
        10
    );
}

#[test]
fn retrier_gives_up_when_the_budget_is_spent() {
    let clock = FakeClock::new(0);
    let r = Retrier::with_seed(
        RetryPolicy {
            min_retries_per_minute: 2,
            budget_ratio: 0.0,
            ..RetryPolicy::default()
        },
        clock.clone(),
        5,
    );
    assert!(matches!(
        r.decide(1, &server_error(None)),
        RetryDecision::Retry { .. }
    ));
    assert!(matches!(
        r.decide(1, &server_error(None)),
        RetryDecision::Retry { .. }
    ));
    assert_eq!(
        r.decide(1, &server_error(None)),
        RetryDecision::GiveUp(GiveUpReason::RetryBudgetExhausted)
    );
    clock.advance(60_000);
    assert!(matches!(
        r.decide(1, &server_error(None)),
        RetryDecision::Retry { .. }
    ));
}

// ---------------------------------------------------------------------------
// run
// ---------------------------------------------------------------------------

/// (attempt, clock time it started at) of every attempt.
type Log = Arc<Mutex<Vec<(u32, u64)>>>;

/// What a scripted attempt returns.
type AttemptResult = Result<&'static str, AttemptError<String>>;

/// A scripted provider: attempt n answers `script[n - 1]`, and every attempt
/// is logged with the clock time it started at.
fn scripted(
    clock: FakeClock,
    script: Vec<Feedback>,
) -> (Log, impl FnMut(u32) -> std::future::Ready<AttemptResult>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let attempt_fn = {
        let log = Arc::clone(&log);
        move |attempt: u32| {
            log.lock().push((attempt, clock.now_ms()));
            let fb = script[attempt as usize - 1].clone();
            std::future::ready(if fb.class() != "success" {
                Err(AttemptError::from((format!("attempt {attempt}"), fb)))
            } else {
                Ok("answer")
            })
        }
    };
    (log, attempt_fn)
}

#[tokio::test]
async fn run_retries_a_scripted_sequence_with_the_right_sleeps() {
    let clock = FakeClock::new(10_000);
    let policy = RetryPolicy::default();
    let retrier = Arc::new(Retrier::with_seed(policy, clock.clone(), 77));
    // The first backoff is the seeded draw within [0, 200]: replay it.
    let mut rng = fastrand::Rng::with_seed(77);
    let first = backoff_ms(&policy, 1, None, &mut || rng.u64(..));
    assert!((1..=200).contains(&first), "{first}");

    let (log, attempt_fn) = scripted(
        clock.clone(),
        vec![server_error(None), throttled(Some(1_500)), success()],
    );
    let task = tokio::spawn({
        let retrier = Arc::clone(&retrier);
        async move { retrier.run(attempt_fn).await }
    });

    // Attempt 1 answered 503 without a hint: the seeded jitter decides.
    sleeping(&clock).await;
    assert_eq!(log.lock().len(), 1);
    clock.advance(first - 1);
    tokio::task::yield_now().await;
    assert_eq!(log.lock().len(), 1, "no retry 1 ms before the backoff ends");
    clock.advance(1);
    // Attempt 2 is throttled with a 1.5 s hint: the jitter is at most
    // 400 ms, so the hint decides.
    wait_for("attempt 2 and its sleep", || {
        log.lock().len() == 2 && clock.pending_sleeps() > 0
    })
    .await;
    clock.advance(1_499);
    tokio::task::yield_now().await;
    assert_eq!(log.lock().len(), 2, "no retry before the hint");
    clock.advance(1);

    assert_eq!(task.await.unwrap(), Ok("answer"));
    assert_eq!(
        *log.lock(),
        [
            (1, 10_000),
            (2, 10_000 + first),
            (3, 10_000 + first + 1_500)
        ]
    );
    let snap = retrier.budget().snapshot(clock.now_ms());
    assert_eq!(
        (snap.requests, snap.retries),
        (1, 2),
        "one call, two retries"
    );
}

#[tokio::test]
async fn run_gives_up_on_exhausted_at_once() {
    let clock = FakeClock::new(0);
    let retrier = Retrier::with_seed(RetryPolicy::default(), clock.clone(), 1);
    let (log, attempt_fn) = scripted(clock.clone(), vec![exhausted(), success()]);
    let err: RetryError<String> = retrier.run(attempt_fn).await.unwrap_err();
    assert_eq!(err.error, "attempt 1");
    assert_eq!(err.feedback, Some(exhausted()));
    assert_eq!((err.attempts, err.reason), (1, GiveUpReason::NotRetryable));
    assert_eq!(log.lock().len(), 1);
    assert_eq!(clock.pending_sleeps(), 0);
    assert_eq!(clock.now_ms(), 0);
}

#[tokio::test]
async fn run_stops_after_max_attempts() {
    let clock = FakeClock::new(0);
    let policy = RetryPolicy {
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    let retrier = Arc::new(Retrier::with_seed(policy, clock.clone(), 2));
    let (log, attempt_fn) = scripted(clock.clone(), vec![server_error(Some(100)); 5]);
    let task = tokio::spawn({
        let retrier = Arc::clone(&retrier);
        async move { retrier.run(attempt_fn).await }
    });
    while !task.is_finished() {
        if clock.pending_sleeps() > 0 {
            clock.advance(1_000);
        }
        tokio::task::yield_now().await;
    }
    let err = task.await.unwrap().unwrap_err();
    assert_eq!(
        (err.attempts, err.reason),
        (3, GiveUpReason::AttemptsExhausted)
    );
    assert_eq!(err.error, "attempt 3");
    assert_eq!(log.lock().len(), 3);
}

#[tokio::test]
async fn run_returns_a_stop_at_once() {
    let clock = FakeClock::new(0);
    let retrier = Retrier::with_seed(RetryPolicy::default(), clock, 1);
    let mut calls = 0;
    let err = retrier
        .run(|_| {
            calls += 1;
            async { Err::<(), _>(AttemptError::Stop("provider_cooldown")) }
        })
        .await
        .unwrap_err();
    assert_eq!(calls, 1);
    assert_eq!(
        (err.reason, err.attempts, err.feedback),
        (GiveUpReason::Stopped, 1, None)
    );
}

#[tokio::test]
async fn run_until_gives_up_when_the_hint_passes_the_deadline() {
    let clock = FakeClock::new(0);
    let retrier = Retrier::with_seed(RetryPolicy::default(), clock.clone(), 1);
    let (log, attempt_fn) = scripted(clock.clone(), vec![throttled(Some(2_500)), success()]);
    let err = retrier.run_until(2_000, attempt_fn).await.unwrap_err();
    assert_eq!((err.reason, err.attempts), (GiveUpReason::HintTooLong, 1));
    assert_eq!(log.lock().len(), 1);
    // No retry token was spent on it.
    assert_eq!(retrier.budget().snapshot(0).retries, 0);
}

#[test]
fn run_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let retrier = Retrier::new(RetryPolicy::default(), FakeClock::new(0));
    let fut = retrier.run(|_| async { Ok::<(), AttemptError<()>>(()) });
    assert_send(&fut);
}

/// A retry takes a new provider permit: two attempts take two requests
/// from the provider key's bucket, and the governor hears every answer.
#[tokio::test]
async fn each_attempt_takes_its_own_provider_permit() {
    let clock = FakeClock::new(0);
    let cfg: ProvidersConfig = serde_json::from_str(
        r#"{ "openai:gpt-4o": {
            "requests": { "amount": 60, "period_ms": 60000, "burst": 2 },
            "policy": "reject" } }"#,
    )
    .unwrap();
    let governor = Arc::new(ProviderGovernor::new(
        MemoryStore::new(clock.clone()),
        clock.clone(),
        validate_providers(&cfg).unwrap(),
    ));
    let retrier = Arc::new(Retrier::with_seed(RetryPolicy::default(), clock.clone(), 4));
    let answers = Arc::new(Mutex::new(vec![success(), server_error(Some(100))]));

    let task = tokio::spawn({
        let (governor, retrier, answers) = (
            Arc::clone(&governor),
            Arc::clone(&retrier),
            Arc::clone(&answers),
        );
        async move {
            retrier
                .run(|_attempt| {
                    let (governor, answers) = (Arc::clone(&governor), Arc::clone(&answers));
                    async move {
                        let req = PermitRequest::new("openai", "gpt-4o", 100);
                        match governor.permit(req).await {
                            Ok(Decision::Allowed { .. }) => {}
                            Ok(Decision::Denied(d)) => {
                                return Err(AttemptError::Stop(d.to_string()));
                            }
                            Err(e) => return Err(AttemptError::Stop(e.to_string())),
                        }
                        let fb = answers.lock().pop().unwrap();
                        governor
                            .observe("openai", "gpt-4o", fb.clone())
                            .await
                            .unwrap();
                        if fb.is_retryable() {
                            Err(AttemptError::from(("503".to_owned(), fb)))
                        } else {
                            Ok("answer")
                        }
                    }
                })
                .await
        }
    });
    sleeping(&clock).await;
    // The delay is max(hint 100, jitter ≤ 200): 200 ms covers it.
    clock.advance(200);
    assert_eq!(task.await.unwrap(), Ok("answer"));
    // The burst of 2 went to the two attempts, and 60/min gives one back
    // only after 1 s: a third permit now is refused.
    let third = governor
        .permit(PermitRequest::new("openai", "gpt-4o", 100))
        .await
        .unwrap();
    assert!(!third.is_allowed(), "{third:?}");
}
