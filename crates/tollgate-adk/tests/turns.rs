//! SPEC §7 examples 1–4 as real turns through the adk-runner (admission
//! plugin + `LimitedLlm` around a scripted fake model), on the fake clock,
//! on the memory store, a Redis node and a Redis cluster; and 200
//! concurrent turns across 50 users.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use support::{FakeLlm, Harness, Reply, Step, answer, collect, is_reply};
use tokio::sync::{Notify, Semaphore};
use tollgate_adk::ModelCallEvent;
use tollgate_core::{Denial, FakeClock, Limit, Store};
use tollgate_testkit::scenarios::support as support_plan;

on_every_store!(
    example_1_turn_burst,
    example_2_steady_turns,
    example_3_token_wait_boundary,
    example_3_inclusive_boundary,
    example_4_concurrency,
    concurrent_turns_never_exceed_the_cap,
);

/// Example 1: turns 1–5 at t = 0 run the model; turns 6–10 at t = 1,000
/// are answered "try again in 2 s" without calling the model.
async fn example_1_turn_burst<S: Store + Clone>(store: S, clock: FakeClock) {
    let h = Harness::new(store, clock, support_plan(), FakeLlm::replying());
    for n in 1..=5 {
        let texts = h.turn("u1", "s1").await.expect("turn");
        assert!(is_reply(&texts), "turn {n} runs the model: {texts:?}");
        assert_eq!(h.model.calls(), n);
        assert_eq!(h.leases("u1").await, 0, "turn {n} released its lease");
    }
    h.clock.advance(1_000);
    for n in 6..=10 {
        let texts = h.turn("u1", "s1").await.expect("turn");
        assert_eq!(texts.len(), 1, "turn {n}: one denial event: {texts:?}");
        assert!(texts[0].contains("too many turns"), "{texts:?}");
        assert!(texts[0].contains("try again in 2 s"), "{texts:?}");
        assert_eq!(h.model.calls(), 5, "the model is not called on a denial");
    }
    assert_eq!(h.state("u1").await.turns_available, 0);
}

/// Example 2: one turn every 10 s for ten minutes is never denied; each
/// model call reserves and settles (1,000 tokens of usage each).
async fn example_2_steady_turns<S: Store + Clone>(store: S, clock: FakeClock) {
    let h = Harness::new(store, clock, support_plan(), FakeLlm::replying());
    for n in 0..60 {
        let texts = h.turn("u1", "s1").await.expect("turn");
        assert!(is_reply(&texts), "turn {n} at {} s: {texts:?}", n * 10);
        h.clock.advance(10_000);
    }
    assert_eq!(h.model.calls(), 60);
    let settled = h
        .events()
        .iter()
        .filter(|e| matches!(e, ModelCallEvent::Settled { actual: 1_000, .. }))
        .count();
    assert_eq!(settled, 60, "every call settled once with its usage");
}

/// Example 3: with the token bucket at 0, a 6,000-token call would wait
/// 6,000 ms > max wait 2,000 ms: refused, nothing taken, retry in 4,000 ms,
/// and the turn is told plainly that it stopped early. With max wait
/// 6,000 ms the same call waits exactly 6,000 ms on the clock and runs.
async fn example_3_token_wait_boundary<S: Store + Clone>(store: S, clock: FakeClock) {
    let h = Harness::new(store, clock, support_plan(), FakeLlm::replying());
    drain(&h, "u1").await;
    let texts = h.turn("u1", "s1").await.expect("turn");
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("stopped early"), "{texts:?}");
    assert!(texts[0].contains("per-minute token limit"), "{texts:?}");
    assert!(texts[0].contains("try again in 4 s"), "{texts:?}");
    assert_eq!(
        h.model.calls(),
        0,
        "a refused call does not reach the model"
    );
    assert_eq!(h.tokens("u1").await, 0, "a refusal takes nothing");
    assert_eq!(
        h.events(),
        vec![ModelCallEvent::Refused {
            user: "u1".into(),
            invocation_id: invocation_of(&h, 0),
            estimate: 6_000,
            denial: Denial::Limited {
                limit: Limit::TokenRate,
                retry_after_ms: 4_000
            },
        }]
    );
    assert_eq!(h.leases("u1").await, 0, "the stopped turn released its run");
}

/// The second half of example 3 (its own store and clock).
async fn example_3_inclusive_boundary<S: Store + Clone>(store: S, clock: FakeClock) {
    let mut plan = support_plan();
    plan.max_wait_ms = 6_000;
    let h = Harness::new(
        store,
        clock,
        plan,
        FakeLlm::new(|_| answer(Some((3_000, 3_000)))),
    );
    drain(&h, "u1").await;
    let runner = Arc::clone(&h.runner);
    let stream = h.start("u1", "s1", "hello").await;
    let turn = tokio::spawn(collect(stream));
    // The call waits on the fake clock: nothing happens until it moves.
    while h.clock.pending_sleeps() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.model.calls(), 0, "still waiting for tokens");
    h.clock.advance(6_000);
    let texts = turn.await.expect("join").expect("turn");
    assert!(is_reply(&texts), "{texts:?}");
    let waited: Vec<u64> = h
        .events()
        .iter()
        .filter_map(|e| match e {
            ModelCallEvent::Reserved { waited_ms, .. } => Some(*waited_ms),
            _ => None,
        })
        .collect();
    assert_eq!(waited, vec![6_000], "granted after exactly 6,000 ms");
    // -6,000 after the reservation, +6,000 refilled, settled at its estimate.
    assert_eq!(h.tokens("u1").await, 0);
    drop(runner);
}

/// Example 4: two runs in flight (held by the model), a third turn is
/// denied for concurrency with nothing charged to the turn bucket; after
/// one run ends, the next is admitted; a run abandoned without release
/// frees its slot once its lease expires (120 s).
async fn example_4_concurrency<S: Store + Clone>(store: S, clock: FakeClock) {
    let gate = Arc::new(Semaphore::new(0));
    let hung = Arc::new(Notify::new());
    let model = {
        let gate = Arc::clone(&gate);
        FakeLlm::new(move |_| {
            Reply::Stream(vec![
                Step::Gate(Arc::clone(&gate)),
                Step::Chunk(support::chunk(support::REPLY, false, Some((500, 500)))),
            ])
        })
    };
    let h = Harness::new(store, clock, support_plan(), model);
    let first = tokio::spawn(collect(h.start("u1", "s1", "one").await));
    let second = tokio::spawn(collect(h.start("u1", "s2", "two").await));
    while h.model.calls() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.leases("u1").await, 2, "two runs in flight");
    let turns_before = h.state("u1").await.turns_available;

    let texts = h.turn("u1", "s3").await.expect("turn");
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("maximum number of turns running at once"));
    assert!(texts[0].contains("try again in 1 s"), "{texts:?}");
    assert_eq!(h.model.calls(), 2, "the model is not called on a denial");
    assert_eq!(
        h.state("u1").await.turns_available,
        turns_before,
        "nothing charged to the turn bucket"
    );

    gate.add_permits(1);
    let done = tokio::select! {
        t = first => t,
        t = second => t,
    };
    assert!(is_reply(&done.expect("join").expect("turn")));
    assert_eq!(h.leases("u1").await, 1);

    // The next turn is admitted; its caller abandons it mid-run (the stream
    // is dropped, so after_run never releases its lease).
    h.model
        .push(Reply::Stream(vec![Step::Hang(Arc::clone(&hung))]));
    let mut abandoned = h.start("u1", "s4", "four").await;
    let poll = tokio::spawn(async move {
        use futures::StreamExt;
        while abandoned.next().await.is_some() {}
    });
    hung.notified().await;
    poll.abort();
    let _ = poll.await;
    assert_eq!(h.leases("u1").await, 2, "the abandoned run still holds");
    let texts = h.turn("u1", "s5").await.expect("turn");
    assert!(texts[0].contains("maximum number of turns"), "{texts:?}");

    h.clock.advance(120_000);
    gate.add_permits(10);
    let texts = h.turn("u1", "s6").await.expect("turn");
    assert!(
        is_reply(&texts),
        "admitted once the lease expired: {texts:?}"
    );
}

/// 200 turns at once across 50 users (4 each; the cap is 2 runs): the model
/// holds every admitted run until all 200 decisions are made, so the calls
/// a user has in the model are all at once — and never more than 2; the
/// other turns are denied for concurrency.
async fn concurrent_turns_never_exceed_the_cap<S: Store + Clone>(store: S, clock: FakeClock) {
    let gate = Arc::new(Semaphore::new(0));
    let in_model: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let model = {
        let gate = Arc::clone(&gate);
        let in_model = Arc::clone(&in_model);
        FakeLlm::new(move |req| {
            let text = serde_json::to_string(&req.contents).expect("json");
            let user = text
                .split("hello from ")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .expect("the user is in the message")
                .to_owned();
            *in_model.lock().entry(user).or_default() += 1;
            Reply::Stream(vec![
                Step::Gate(Arc::clone(&gate)),
                Step::Chunk(support::chunk(support::REPLY, false, Some((100, 100)))),
            ])
        })
    };
    let h = Arc::new(Harness::new(store, clock, support_plan(), model));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut turns = Vec::new();
    for n in 0..200 {
        let h = Arc::clone(&h);
        let finished = Arc::clone(&finished);
        let user = format!("u{}", n % 50);
        turns.push(tokio::spawn(async move {
            let stream = h
                .start(&user, &format!("s{n}"), &format!("hello from {user}"))
                .await;
            let texts = collect(stream).await.expect("turn");
            finished.fetch_add(1, Ordering::SeqCst);
            (user, texts)
        }));
    }
    // Admitted turns are held in the model; denied ones finish. Wait for
    // all 200 decisions: 100 held, 100 finished.
    while h.model.calls() < 100 || finished.load(Ordering::SeqCst) < 100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.model.calls(), 100);
    let most = in_model.lock().values().copied().max();
    assert_eq!(most, Some(2), "no user has more than 2 runs in the model");
    assert_eq!(in_model.lock().len(), 50);
    for u in 0..50 {
        assert_eq!(h.leases(&format!("u{u}")).await, 2);
    }
    gate.add_permits(1_000);
    let mut ran: HashMap<String, usize> = HashMap::new();
    let mut denied = 0;
    for t in turns {
        let (user, texts) = t.await.expect("join");
        if is_reply(&texts) {
            *ran.entry(user).or_default() += 1;
        } else {
            assert!(texts[0].contains("maximum number of turns"), "{texts:?}");
            denied += 1;
        }
    }
    assert_eq!(h.model.calls(), 100);
    assert_eq!(denied, 100);
    assert!(ran.values().all(|&n| n == 2), "{ran:?}");
    assert_eq!(in_model.lock().values().copied().max(), Some(2));
    for u in 0..50 {
        assert_eq!(h.leases(&format!("u{u}")).await, 0, "all released");
    }
}

/// Takes the user's whole token bucket (60,000) directly through the
/// limiter, as another run's call would.
async fn drain<S: Store + Clone>(h: &Harness<S>, user: &str) {
    let d = h
        .limiter
        .reserve_tokens(user, "drain", 60_000)
        .await
        .expect("reserve");
    assert!(d.is_allowed());
    assert_eq!(h.tokens(user).await, 0);
}

/// The invocation id of the `n`-th model-call event's run.
fn invocation_of<S: Store + Clone>(h: &Harness<S>, n: usize) -> String {
    match &h.events()[n] {
        ModelCallEvent::Refused { invocation_id, .. } => invocation_id.clone(),
        ModelCallEvent::Reserved { reservation, .. }
        | ModelCallEvent::Settled { reservation, .. }
        | ModelCallEvent::Refunded { reservation, .. } => reservation.invocation_id.clone(),
        other => panic!("unexpected {other:?}"),
    }
}
