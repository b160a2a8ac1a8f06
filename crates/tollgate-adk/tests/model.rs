//! `LimitedLlm` through the real adk-runner with a scripted fake model, on
//! the memory store, a Redis node and a Redis cluster: every reservation is
//! closed exactly once — settled with the usage after the final chunk,
//! refunded on a model error, settled or refunded when the stream is
//! dropped — and the moving-average estimator converges.

mod support;

use std::sync::Arc;

use adk_core::{Llm, LlmRequest};
use futures::StreamExt;
use support::{FakeLlm, Harness, Reply, Step, answer, chunk, is_reply, tool_call};
use tokio::sync::Notify;
use tollgate_adk::{LimitedLlm, ModelCallEvent, RefundReason};
use tollgate_core::{FakeClock, Store};
use tollgate_testkit::scenarios::support as support_plan;

const FULL: i64 = 60_000;

on_every_store!(
    partial_chunks_settle_once_with_the_final_usage,
    no_usage_settles_at_the_estimate,
    a_failed_call_is_refunded,
    an_error_in_the_stream_is_refunded,
    an_error_code_response_is_refunded,
    a_dropped_stream_settles_what_it_saw,
    a_dropped_stream_with_nothing_seen_is_refunded,
    max_llm_calls_stops_the_turn_early,
    the_moving_average_converges,
    a_custom_estimator_is_used,
);

/// The one close event, after waiting for it.
async fn closes<S: Store + Clone>(h: &Harness<S>, events: usize) -> Vec<ModelCallEvent> {
    let all = h.wait_events(events).await;
    all.into_iter()
        .filter(|e| {
            matches!(
                e,
                ModelCallEvent::Settled { .. } | ModelCallEvent::Refunded { .. }
            )
        })
        .collect()
}

/// Asserts the reservation of `event` is closed: closing it again changes
/// nothing.
async fn closed_for_good<S: Store + Clone>(h: &Harness<S>, event: &ModelCallEvent) {
    let reservation = match event {
        ModelCallEvent::Settled { reservation, .. }
        | ModelCallEvent::Refunded { reservation, .. } => reservation,
        other => panic!("not a close: {other:?}"),
    };
    let again = h
        .limiter
        .settle("u1", reservation, 1)
        .await
        .expect("settle again");
    assert!(!again.applied, "a second close must change nothing");
}

/// Three partial chunks (each with a running usage count), then the final
/// chunk with the real usage: one settle, with the final usage.
async fn partial_chunks_settle_once_with_the_final_usage<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let model = FakeLlm::replying();
    model.push(Reply::Stream(vec![
        Step::Chunk(chunk("scr", true, Some((300, 10)))),
        Step::Chunk(chunk("ipted ", true, Some((300, 20)))),
        Step::Chunk(chunk("reply", true, Some((300, 30)))),
        Step::Chunk(chunk("", false, Some((300, 700)))),
    ]));
    let h = Harness::new(store, clock, support_plan(), model);
    let texts = h.turn("u1", "s1").await.expect("turn");
    assert!(texts.concat().contains("scripted reply"), "{texts:?}");
    let closes = closes(&h, 2).await;
    assert_eq!(closes.len(), 1, "{closes:?}");
    assert!(
        matches!(
            closes[0],
            ModelCallEvent::Settled {
                estimate: 6_000,
                actual: 1_000,
                reported: true,
                ..
            }
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL - 1_000);
    closed_for_good(&h, &closes[0]).await;
    assert_eq!(h.tokens("u1").await, FULL - 1_000);
}

/// A model that reports no usage: the reservation is settled at the
/// estimate (the 6,000 reserved stay charged).
async fn no_usage_settles_at_the_estimate<S: Store + Clone>(store: S, clock: FakeClock) {
    let h = Harness::new(store, clock, support_plan(), FakeLlm::new(|_| answer(None)));
    assert!(is_reply(&h.turn("u1", "s1").await.expect("turn")));
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Settled {
                actual: 6_000,
                reported: false,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL - 6_000);
}

/// `generate_content` fails: refunded, the error reaches the caller, the
/// run lease is released.
async fn a_failed_call_is_refunded<S: Store + Clone>(store: S, clock: FakeClock) {
    let model = FakeLlm::replying();
    model.push(Reply::Fail("provider down"));
    let h = Harness::new(store, clock, support_plan(), model);
    let err = h.turn("u1", "s1").await.expect_err("the model failed");
    assert!(err.to_string().contains("provider down"), "{err}");
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Refunded {
                estimate: 6_000,
                reason: RefundReason::ModelError,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL);
    closed_for_good(&h, &closes[0]).await;
    assert_eq!(h.tokens("u1").await, FULL);
}

/// The stream yields a chunk, then an error: refunded once.
async fn an_error_in_the_stream_is_refunded<S: Store + Clone>(store: S, clock: FakeClock) {
    let model = FakeLlm::replying();
    model.push(Reply::Stream(vec![
        Step::Chunk(chunk("par", true, Some((300, 5)))),
        Step::Error("connection reset"),
    ]));
    let h = Harness::new(store, clock, support_plan(), model);
    let err = h.turn("u1", "s1").await.expect_err("the stream failed");
    assert!(err.to_string().contains("connection reset"), "{err}");
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Refunded {
                reason: RefundReason::ModelError,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL);
}

/// A response carrying an `error_code` (the provider's error inside an
/// `Ok`): refunded.
async fn an_error_code_response_is_refunded<S: Store + Clone>(store: S, clock: FakeClock) {
    let model = FakeLlm::replying();
    let mut failed = chunk("", false, None);
    failed.error_code = Some("SAFETY".into());
    failed.error_message = Some("blocked".into());
    model.push(Reply::Stream(vec![Step::Chunk(failed)]));
    let h = Harness::new(store, clock, support_plan(), model);
    assert!(h.turn("u1", "s1").await.is_err());
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Refunded {
                reason: RefundReason::ModelError,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL);
}

/// The caller drops the turn while the model is streaming, after a chunk
/// reporting 350 tokens: settled once with those 350.
async fn a_dropped_stream_settles_what_it_saw<S: Store + Clone>(store: S, clock: FakeClock) {
    let hung = Arc::new(Notify::new());
    let model = FakeLlm::replying();
    model.push(Reply::Stream(vec![
        Step::Chunk(chunk("so far", true, Some((300, 50)))),
        Step::Hang(Arc::clone(&hung)),
    ]));
    let h = Harness::new(store, clock, support_plan(), model);
    abandon(&h, &hung).await;
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Settled {
                actual: 350,
                reported: true,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL - 350);
    closed_for_good(&h, &closes[0]).await;
    assert_eq!(h.events().len(), 2, "reserved, settled: nothing more");
}

/// Dropped before any usage was seen: refunded once.
async fn a_dropped_stream_with_nothing_seen_is_refunded<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let hung = Arc::new(Notify::new());
    let model = FakeLlm::replying();
    model.push(Reply::Stream(vec![
        Step::Chunk(chunk("so far", true, None)),
        Step::Hang(Arc::clone(&hung)),
    ]));
    let h = Harness::new(store, clock, support_plan(), model);
    abandon(&h, &hung).await;
    let closes = closes(&h, 2).await;
    assert!(
        matches!(
            closes[..],
            [ModelCallEvent::Refunded {
                reason: RefundReason::Dropped,
                ..
            }]
        ),
        "{closes:?}"
    );
    assert_eq!(h.tokens("u1").await, FULL);
    closed_for_good(&h, &closes[0]).await;
}

/// Starts a turn, polls it until the model hangs mid-stream, then drops it.
async fn abandon<S: Store + Clone>(h: &Harness<S>, hung: &Notify) {
    let mut stream = h.start("u1", "s1", "hello").await;
    let poll = tokio::spawn(async move { while stream.next().await.is_some() {} });
    hung.notified().await;
    poll.abort();
    assert!(poll.await.expect_err("aborted").is_cancelled());
}

/// A runaway tool loop: the model always calls a tool; with
/// `max_llm_calls = 3` the third call is the last, the fourth is refused
/// and the turn ends with a plain "stopped early" answer.
async fn max_llm_calls_stops_the_turn_early<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support_plan();
    plan.max_llm_calls = Some(3);
    let h = Harness::new(store, clock, plan, FakeLlm::new(|_| tool_call("echo")));
    let texts = h.turn("u1", "s1").await.expect("turn");
    assert_eq!(h.model.calls(), 3);
    let last = texts.last().expect("an answer");
    assert!(last.contains("stopped early"), "{texts:?}");
    assert!(last.contains("limit of 3 model calls"), "{texts:?}");
    let events = h.events();
    let settled = events
        .iter()
        .filter(|e| matches!(e, ModelCallEvent::Settled { actual: 110, .. }))
        .count();
    assert_eq!(settled, 3, "{events:?}");
    assert!(matches!(
        events.last(),
        Some(ModelCallEvent::Refused { .. })
    ));
    assert_eq!(h.tokens("u1").await, FULL - 330);
    assert_eq!(h.leases("u1").await, 0);
}

/// A scripted workload: the conversation grows turn by turn; the model
/// uses one prompt token per 3 bytes of request and 500–899 output tokens
/// (mean ≈ 700). The first estimate is the plan's 6,000; after a few calls
/// the estimates track the actual usage closely.
async fn the_moving_average_converges<S: Store + Clone>(store: S, clock: FakeClock) {
    let model = FakeLlm::new(|req: &LlmRequest| {
        let bytes = serde_json::to_vec(&req.contents).expect("json").len() as i32;
        let n = req.contents.len() as i32;
        let output = 500 + (n * 137) % 400;
        answer(Some((bytes / 3, output)))
    });
    let mut plan = support_plan();
    plan.turns.burst = Some(100);
    plan.turns.amount = 100;
    let h = Harness::new(store, clock, plan, model);
    let mut errors = Vec::new();
    for n in 0..30 {
        assert!(
            is_reply(&h.turn("u1", "s1").await.expect("turn")),
            "turn {n}"
        );
        h.clock.advance(2_000);
    }
    let events = h.wait_events(60).await;
    let mut estimates = Vec::new();
    for e in &events {
        match e {
            ModelCallEvent::Reserved { estimate, .. } => estimates.push(*estimate as f64),
            ModelCallEvent::Settled { actual, .. } => {
                let estimate = estimates.last().copied().expect("reserved first");
                errors.push((estimate - *actual as f64).abs() / *actual as f64);
            }
            _ => {}
        }
    }
    assert_eq!(estimates.len(), 30);
    assert_eq!(estimates[0], 6_000.0, "seeded by the plan's estimate");
    let first = errors[0];
    let last10 = errors[20..].iter().sum::<f64>() / 10.0;
    eprintln!(
        "estimator: relative error of call 1 {first:.2}, calls 2-5 {:.3?}, mean of calls 21-30 {last10:.4}",
        &errors[1..5]
    );
    assert!(first > 2.0, "the seed is far off: {first:.2}");
    assert!(
        last10 < 0.2,
        "mean relative error of the last 10 calls {last10:.3}; all: {errors:.3?}"
    );
}

/// A closure is an estimator.
async fn a_custom_estimator_is_used<S: Store + Clone>(store: S, clock: FakeClock) {
    let h = Harness::build(store, clock, support_plan(), FakeLlm::replying(), |m| {
        m.with_estimator(|_: &tollgate_adk::CallShape<'_>| 1_234)
    });
    assert!(is_reply(&h.turn("u1", "s1").await.expect("turn")));
    assert!(matches!(
        h.events()[0],
        ModelCallEvent::Reserved {
            estimate: 1_234,
            ..
        }
    ));
}

/// Without `identify_calls`, the wrapper refuses to run unlimited: the call
/// fails with `tollgate.unidentified` and the model is not called.
#[tokio::test]
async fn an_unidentified_call_fails_clearly() {
    let clock = tollgate_testkit::clock();
    let limiter = Arc::new(tollgate_testkit::scenarios::limiter_with(
        tollgate_core::MemoryStore::new(clock.clone()),
        &clock,
        support_plan(),
    ));
    let fake = Arc::new(FakeLlm::replying());
    let limited = LimitedLlm::new(support::Shared(Arc::clone(&fake)), limiter);
    let err = match limited
        .generate_content(LlmRequest::new("fake", vec![]), true)
        .await
    {
        Ok(_) => panic!("an unidentified call must fail"),
        Err(e) => e,
    };
    assert_eq!(err.code, "tollgate.unidentified");
    assert_eq!(fake.calls(), 0);
}

/// `identify_calls` leaves the inner model the request as the agent built
/// it: no tollgate extension, no config added.
#[tokio::test]
async fn the_inner_model_sees_the_request_unchanged() {
    let clock = tollgate_testkit::clock();
    let h = Harness::new(
        tollgate_core::MemoryStore::new(clock.clone()),
        clock,
        support_plan(),
        FakeLlm::replying(),
    );
    assert!(is_reply(&h.turn("u1", "s1").await.expect("turn")));
    let requests = h.model.requests.lock();
    assert_eq!(requests.len(), 1);
    let config = requests[0].config.as_ref();
    assert!(
        config.is_none_or(|c| !c.extensions.contains_key(tollgate_adk::IDENTITY_EXTENSION)),
        "{config:?}"
    );
}
