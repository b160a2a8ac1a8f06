//! `LimitedLlm` with a provider governor, through the real adk-runner, on
//! the memory store, a Redis node and a Redis cluster (fake clock): the
//! provider permit is taken inside the call's one deadline, a refusal
//! refunds the user, and model errors are fed back to the governor.

mod support;

use std::sync::Arc;

use adk_core::ErrorCategory;
use support::{FakeLlm, Harness, Reply, is_reply};
use tollgate_adk::{ModelCallEvent, RefundReason};
use tollgate_core::{Clock, FakeClock, RateConfig, Store};
use tollgate_provider::{
    Policy, ProviderConfig, ProviderGovernor, ProvidersConfig, TenantConfig, validate_providers,
};
use tollgate_testkit::scenarios::support as support_plan;

on_every_store!(
    a_provider_refusal_refunds_the_user,
    one_deadline_for_both_waits,
    a_rate_limited_model_error_slows_every_caller,
    an_exhausted_provider_fails_fast,
    a_retry_takes_a_new_permit_but_charges_the_user_once,
    a_huge_hint_is_clamped_for_the_cooldown_and_the_retry,
    weighted_tenants_share_the_key_through_the_model_wrapper,
);

const FULL: i64 = 60_000;

/// A governor of provider key `p:m`: `rpm` requests/min with `burst`.
fn governor<S: Store + Clone>(
    store: S,
    clock: &FakeClock,
    rpm: i64,
    burst: i64,
    policy: Policy,
) -> Arc<ProviderGovernor<S>> {
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("openai".into()),
            requests: Some(RateConfig {
                amount: rpm,
                period_ms: 60_000,
                burst: Some(burst),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy,
            max_wait_ms: Some(60_000),
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: Default::default(),
        },
    );
    Arc::new(ProviderGovernor::new(
        store,
        clock.clone(),
        validate_providers(&cfg).expect("valid"),
    ))
}

fn harness<S: Store + Clone>(
    store: S,
    clock: FakeClock,
    governor: &Arc<ProviderGovernor<S>>,
    model: FakeLlm,
) -> Harness<S> {
    let g = Arc::clone(governor);
    Harness::build(store, clock, support_plan(), model, move |m| {
        m.with_provider(g, "p", "m")
    })
}

/// Reject policy, burst 1: the first call runs; the second is refused by
/// the provider's quota — the user's 6,000 reserved tokens come back, the
/// model is not called, the turn says it stopped early.
async fn a_provider_refusal_refunds_the_user<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(store.clone(), &clock, 60, 1, Policy::Reject);
    let h = harness(store, clock, &g, FakeLlm::replying());
    assert!(is_reply(&h.turn("u1", "s1").await.expect("turn")));
    assert_eq!(h.tokens("u1").await, FULL - 1_000);
    let texts = h.turn("u1", "s2").await.expect("turn");
    assert_eq!(
        h.model.calls(),
        1,
        "the refused call did not reach the model"
    );
    assert!(
        texts[0].contains("stopped early because the model provider's rate limit"),
        "{texts:?}"
    );
    assert!(texts[0].contains("try again in 1 s"), "{texts:?}");
    assert_eq!(h.tokens("u1").await, FULL - 1_000, "the user was refunded");
    assert!(h.events().iter().any(|e| matches!(
        e,
        ModelCallEvent::Refunded {
            reason: RefundReason::ProviderRefused,
            ..
        }
    )));
}

/// One deadline: the plan's max wait is 2,000 ms. The user's tokens wait
/// 1,500 ms; the provider (one request per second) then needs 1,500 ms
/// more, which does not fit the 500 ms left: refused, the user refunded.
/// When the provider needs only 400 ms more, the call runs after 1,900 ms.
async fn one_deadline_for_both_waits<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(store.clone(), &clock, 60, 1, Policy::Block);
    let h = harness(store, clock, &g, FakeLlm::replying());
    let take = |n: usize| {
        let g = Arc::clone(&g);
        async move {
            for _ in 0..n {
                let d = g
                    .permit(tollgate_provider::PermitRequest::new("p", "m", 0))
                    .await
                    .expect("permit");
                assert!(d.is_allowed());
            }
        }
    };
    // The user's bucket 1,500 ms of tokens short of 6,000; the provider's
    // two requests in debt (level -1 after the first free one... -2).
    let drain = h
        .limiter
        .reserve_tokens("u1", "other", 55_500)
        .await
        .expect("drain");
    assert!(drain.is_allowed());
    take(3).await;
    let stream = h.start("u1", "s1", "hello").await;
    let turn = tokio::spawn(support::collect(stream));
    advance_when_waiting(&h, 1_500).await;
    let texts = finish(turn).await;
    assert!(
        texts[0].contains("model provider's rate limit"),
        "{texts:?}"
    );
    assert_eq!(h.model.calls(), 0);
    assert_eq!(h.tokens("u1").await, 6_000, "refunded after its wait");

    // Both buckets full again; the provider at -0.9 requests, the user
    // 1,500 ms of tokens short: after the user's wait the provider lacks
    // 0.4 requests (400 ms), which fits the 500 ms left.
    h.clock.advance(60_000);
    let drain = h
        .limiter
        .reserve_tokens("u1", "other2", 55_500)
        .await
        .expect("drain");
    assert!(drain.is_allowed());
    take(2).await;
    h.clock.advance(100);
    let drain = h
        .limiter
        .reserve_tokens("u1", "other3", 100)
        .await
        .expect("drain");
    assert!(drain.is_allowed());
    let stream = h.start("u1", "s2", "hello").await;
    let turn = tokio::spawn(support::collect(stream));
    advance_when_waiting(&h, 1_500).await; // the user's tokens
    advance_when_waiting(&h, 400).await; // then the provider's permit
    let texts = finish(turn).await;
    assert!(is_reply(&texts), "{texts:?}");
    assert_eq!(h.model.calls(), 1);
    let waited: Vec<u64> = h
        .events()
        .iter()
        .filter_map(|e| match e {
            ModelCallEvent::Reserved { waited_ms, .. } => Some(*waited_ms),
            _ => None,
        })
        .collect();
    assert_eq!(waited, vec![1_500, 1_500]);
}

/// A spawned turn's texts; fails instead of hanging if it never ends.
async fn finish(
    turn: tokio::task::JoinHandle<Result<Vec<String>, adk_core::AdkError>>,
) -> Vec<String> {
    tokio::time::timeout(std::time::Duration::from_secs(10), turn)
        .await
        .expect("the turn ends")
        .expect("join")
        .expect("turn")
}

/// Advances the clock by `ms` once a wait is registered on it. The turn
/// runs on another task and, on Redis, waits for real I/O before it parks
/// on the clock: yield first, then poll in real time (up to 10 s), as the
/// server tests wait for parked sleeps; a count of yields alone ran out on
/// a loaded machine.
async fn advance_when_waiting<S: Store + Clone>(h: &Harness<S>, ms: u64) {
    let mut parked = false;
    for _ in 0..10_000 {
        if h.clock.pending_sleeps() > 0 {
            parked = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    if !parked {
        let clock = h.clock.clone();
        parked = tollgate_testkit::redis::wait_until(10, || {
            let c = clock.clone();
            async move { c.pending_sleeps() > 0 }
        })
        .await;
    }
    assert!(parked, "nothing waited on the clock");
    h.clock.advance(ms);
}

/// The model answers a rate-limited error (the provider's 429) with a 3 s
/// hint: the user is refunded, and the governor — shared by every replica
/// through the store — sets a 3 s cooldown and halves the effective rate.
/// A generic model error changes neither.
async fn a_rate_limited_model_error_slows_every_caller<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let g = governor(store.clone(), &clock, 600, 60, Policy::Block);
    let model = FakeLlm::replying();
    model.push(Reply::Fail("bad request"));
    model.push(Reply::RateLimited(3_000));
    let h = harness(store, clock, &g, model);
    let _ = h.turn("u1", "s1").await.expect_err("the model failed");
    assert_eq!(h.tokens("u1").await, FULL, "refunded");
    assert_eq!(g.effective_permille("p", "m").await.expect("rate"), 1_000);

    let err = h.turn("u1", "s2").await.expect_err("rate limited");
    assert_eq!(err.category, ErrorCategory::RateLimited);
    assert_eq!(h.tokens("u1").await, FULL, "refunded");
    assert_eq!(g.effective_permille("p", "m").await.expect("rate"), 500);
    let d = g
        .permit(tollgate_provider::PermitRequest::new("p", "m", 0))
        .await
        .expect("permit");
    assert_eq!(d.grant().map(|p| p.wait_ms), Some(3_000), "the cooldown");
}

/// An exhausted provider (OpenAI `insufficient_quota`): the next call
/// fails fast with a plain message, the user is refunded.
async fn an_exhausted_provider_fails_fast<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(store.clone(), &clock, 600, 60, Policy::Block);
    let h = harness(store, clock, &g, FakeLlm::replying());
    let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let out = g
        .feedback("p", "m", 429, &[], Some(body))
        .await
        .expect("feedback");
    assert_eq!(out.feedback.class(), "exhausted");
    let texts = h.turn("u1", "s1").await.expect("turn");
    assert!(texts[0].contains("quota is used up"), "{texts:?}");
    assert_eq!(h.model.calls(), 0);
    assert_eq!(h.tokens("u1").await, FULL);
}

/// With a retrier: the model's first answer is a 429 with a 1.5 s hint; the
/// retry waits at least the hint on the clock, takes a second provider
/// permit and succeeds. The user's tokens
/// were reserved once and settled once with the real usage. A client error
/// is not retried.
async fn a_retry_takes_a_new_permit_but_charges_the_user_once<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let g = governor(store.clone(), &clock, 60, 2, Policy::Reject);
    let retrier = Arc::new(tollgate_provider::Retrier::with_seed(
        tollgate_provider::RetryPolicy::default(),
        clock.clone(),
        7,
    ));
    let model = FakeLlm::replying();
    model.push(Reply::RateLimited(1_500));
    let g2 = Arc::clone(&g);
    let r2 = Arc::clone(&retrier);
    let h = Harness::build(store, clock, support_plan(), model, move |m| {
        m.with_provider(g2, "p", "m").with_retries(r2)
    });
    let stream = h.start("u1", "s1", "hello").await;
    let turn = tokio::spawn(support::collect(stream));
    let start = h.clock.now_ms();
    // The backoff is at least the hint (1,500 ms) and at most the cap.
    advance_when_waiting(&h, 1_500).await;
    while !turn.is_finished() {
        if h.clock.pending_sleeps() > 0 {
            h.clock.advance(100);
        }
        tokio::task::yield_now().await;
    }
    let texts = finish(turn).await;
    assert!(is_reply(&texts), "{texts:?}");
    assert!(
        h.clock.now_ms() - start >= 1_500,
        "waited at least the hint"
    );
    assert_eq!(h.model.calls(), 2, "one retry");
    let reserved = h
        .events()
        .iter()
        .filter(|e| matches!(e, ModelCallEvent::Reserved { .. }))
        .count();
    assert_eq!(reserved, 1, "the user was charged once");
    let settled: Vec<u64> = h
        .events()
        .iter()
        .filter_map(|e| match e {
            ModelCallEvent::Settled { actual, .. } => Some(*actual),
            _ => None,
        })
        .collect();
    assert_eq!(settled, vec![1_000], "settled once, with the real usage");
    let snapshot = retrier.budget().snapshot(h.clock.now_ms());
    assert_eq!((snapshot.requests, snapshot.retries), (1, 1));

    // A client error is not retried.
    h.clock.advance(10_000);
    h.model.push(Reply::Fail("bad request"));
    assert!(h.turn("u1", "s2").await.is_err());
    assert_eq!(h.model.calls(), 3);
}

/// A model error with a 31-year hint: the governor cools the key down for
/// its `max_cooldown_ms` (300 s by default), not 31 years, and the retry
/// layer waits the clamped hint, not the provider's: after 300 s the retry
/// takes a new permit and succeeds.
async fn a_huge_hint_is_clamped_for_the_cooldown_and_the_retry<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let g = governor(store.clone(), &clock, 60, 2, Policy::Reject);
    let retrier = Arc::new(tollgate_provider::Retrier::with_seed(
        tollgate_provider::RetryPolicy::default(),
        clock.clone(),
        7,
    ));
    let model = FakeLlm::replying();
    model.push(Reply::RateLimited(999_999_999_000));
    let g2 = Arc::clone(&g);
    let h = Harness::build(store, clock, support_plan(), model, move |m| {
        m.with_provider(g2, "p", "m").with_retries(retrier)
    });
    let stream = h.start("u1", "s1", "hello").await;
    let turn = tokio::spawn(support::collect(stream));
    let start = h.clock.now_ms();
    advance_when_waiting(&h, 1).await;
    let d = g
        .permit(tollgate_provider::PermitRequest::new("p", "m", 0))
        .await
        .expect("permit");
    assert_eq!(
        d.denial().and_then(|d| d.retry_after_ms()),
        Some(300_000 - 1),
        "the cooldown ends 300 s after the answer"
    );
    // The retry sleeps the clamped hint: 300 s, then the call runs.
    h.clock.advance(300_000 - 1);
    let texts = finish(turn).await;
    assert!(is_reply(&texts), "{texts:?}");
    assert_eq!(h.clock.now_ms() - start, 300_000);
    assert_eq!(h.model.calls(), 2, "one retry");
}

/// Fair sharing through the real runner (SPEC §5, *Fair sharing*): the
/// model wrapper's `with_tenant` names each user's tenant, weighted a 3, b
/// 1, on a pool of 60 requests/min with a burst of 10. After one call of
/// a's, b books four (two within its lead, two more from its part of the
/// burst); its fifth is refused by the fair gate although the pool still
/// holds five permits (b is 3 permits past its share: 12 s at a quarter of
/// the pool), and b's user is refunded; a's next call is granted.
async fn weighted_tenants_share_the_key_through_the_model_wrapper<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let mut cfg = ProvidersConfig::new();
    let tenant = |weight| TenantConfig {
        share: None,
        weight: Some(weight),
    };
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("openai".into()),
            requests: Some(RateConfig {
                amount: 60,
                period_ms: 60_000,
                burst: Some(10),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy: Policy::Block,
            max_wait_ms: Some(60_000),
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: [("a".to_owned(), tenant(3)), ("b".to_owned(), tenant(1))].into(),
        },
    );
    let g = Arc::new(ProviderGovernor::new(
        store.clone(),
        clock.clone(),
        validate_providers(&cfg).expect("valid"),
    ));
    let h = Harness::build(
        store,
        clock,
        support_plan(),
        FakeLlm::replying(),
        move |m| {
            m.with_provider(g, "p", "m")
                .with_tenant(|user| user.strip_suffix("-user").map(str::to_owned))
        },
    );
    assert!(is_reply(&h.turn("a-user", "s1").await.expect("turn")));
    for n in 0..4 {
        let texts = h.turn("b-user", &format!("b{n}")).await.expect("turn");
        assert!(is_reply(&texts), "b's call {n}: {texts:?}");
    }
    let texts = h.turn("b-user", "b4").await.expect("turn");
    assert!(
        texts[0].contains("stopped early because the model provider's rate limit"),
        "{texts:?}"
    );
    assert!(texts[0].contains("try again in 12 s"), "{texts:?}");
    assert_eq!(h.model.calls(), 5, "b's fifth call did not reach the model");
    assert_eq!(h.tokens("b-user").await, FULL - 4 * 1_000, "refunded");
    assert!(is_reply(&h.turn("a-user", "s2").await.expect("turn")));
    assert_eq!(h.model.calls(), 6);
}
