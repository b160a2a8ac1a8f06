//! The `TurnExecutor` through the real adk-runner with a scripted fake
//! model, on the memory store, a Redis node and a Redis cluster (fake
//! clock): replica permit, session lease and run lease are taken in SPEC
//! order, renewed while the turn runs, and freed exactly once when the
//! stream ends or is dropped.

mod support;

use std::sync::Arc;

use adk_core::{Content, SessionId, UserId};
use adk_session::InMemorySessionService;
use futures::StreamExt;
use support::{FakeLlm, Harness, Reply, Step, is_reply};
use tokio::sync::{Notify, Semaphore};
use tollgate_adk::{
    FenceError, FencedSessionService, TurnError, TurnExecutor, TurnStream, session_key,
};
use tollgate_core::lease::SessionAcquire;
use tollgate_core::{Denial, FakeClock, Limit, ReplicaGate, Store};
use tollgate_testkit::scenarios::support as support_plan;

on_every_store!(
    a_dropped_stream_frees_everything_at_once,
    a_second_turn_of_a_session_is_busy,
    a_long_turn_keeps_its_leases,
    the_gate_rejects_over_its_cap_and_retries_hold_one_permit,
    a_denied_turn_releases_its_session_lease,
    a_late_append_after_a_takeover_is_rejected,
);

const TTL: u64 = 30_000;

struct Setup<S> {
    h: Harness<S>,
    executor: TurnExecutor<S>,
}

fn setup<S: Store + Clone>(store: S, clock: FakeClock, cap: usize) -> Setup<S> {
    let h = Harness::assemble(
        store,
        clock,
        support_plan(),
        FakeLlm::replying(),
        Arc::new(InMemorySessionService::new()),
        false,
        |m| m,
    );
    let executor = TurnExecutor::new(
        Arc::clone(&h.runner),
        Arc::clone(&h.limiter),
        ReplicaGate::new(cap),
    )
    .with_session_ttl_ms(TTL);
    Setup { h, executor }
}

impl<S: Store + Clone> Setup<S> {
    async fn execute(&self, user: &str, session: &str) -> Result<TurnStream<S>, TurnError> {
        if self
            .h
            .sessions
            .get(adk_session::GetRequest {
                app_name: support::APP.into(),
                user_id: user.into(),
                session_id: session.into(),
                num_recent_events: None,
                after: None,
            })
            .await
            .is_err()
        {
            self.h.session(user, session).await;
        }
        self.executor
            .execute(
                UserId::new(user).expect("user"),
                SessionId::new(session).expect("session"),
                Content::new("user").with_text(format!("hello from {user}")),
            )
            .await
    }

    /// Probes the session lease with another holder: `Some(remaining ttl)`
    /// if a turn holds it; `None` if it was free (the probe then releases
    /// the lease it took).
    async fn session_held(&self, user: &str, session: &str) -> Option<u64> {
        let key = session_key(support::APP, user, session);
        let store = self.h.limiter.store();
        match store
            .session_acquire(&key, "probe", 1_000)
            .await
            .expect("probe")
        {
            SessionAcquire::Busy { retry_after_ms } => Some(retry_after_ms),
            SessionAcquire::Acquired(_) => {
                assert!(store.session_release(&key, "probe").await.expect("release"));
                None
            }
        }
    }

    /// Waits (bounded) for `cond` — for work done on spawned tasks
    /// (release after a drop, renewal after the clock moved).
    async fn eventually<F, Fut>(&self, what: &str, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        // Polled, yielding in between (no real sleep): the work it waits
        // for is already running on another task.
        for _ in 0..200_000 {
            if cond().await {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never happened: {what}");
    }
}

/// Collects a turn's texts (errors end it).
async fn texts<S: Store>(mut stream: TurnStream<S>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        if let Some(content) = event.llm_response.content {
            for part in content.parts {
                if let adk_core::Part::Text { text } = part {
                    out.push(text);
                }
            }
        }
    }
    out
}

/// The client disconnects mid-turn (its stream is dropped while the model
/// streams): the permit, the session lease and the run lease are freed at
/// once — the clock does not move, so nothing expired.
async fn a_dropped_stream_frees_everything_at_once<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = setup(store, clock, 4);
    let hung = Arc::new(Notify::new());
    s.h.model
        .push(Reply::Stream(vec![Step::Hang(Arc::clone(&hung))]));
    let mut stream = s.execute("u1", "s1").await.expect("admitted");
    assert!(stream.fence().fence >= 1);
    let poll = tokio::spawn(async move { while stream.next().await.is_some() {} });
    hung.notified().await;
    assert_eq!(s.executor.gate().in_flight(), 1);
    assert_eq!(s.h.leases("u1").await, 1);
    assert_eq!(s.session_held("u1", "s1").await, Some(TTL));

    poll.abort();
    assert!(poll.await.expect_err("aborted").is_cancelled());
    assert_eq!(
        s.executor.gate().in_flight(),
        0,
        "the permit is freed at once"
    );
    s.eventually("run lease released", || async {
        s.h.leases("u1").await == 0
    })
    .await;
    s.eventually("session lease released", || async {
        s.session_held("u1", "s1").await.is_none()
    })
    .await;
    // The next turn of that session runs at once.
    assert!(is_reply(
        &texts(s.execute("u1", "s1").await.expect("admitted")).await
    ));
    assert_eq!(s.executor.gate().in_flight(), 0);
    assert_eq!(s.h.leases("u1").await, 0, "released at the stream's end");
    assert_eq!(s.session_held("u1", "s1").await, None);
}

/// While a turn runs, a second turn of the same session is refused with
/// `SessionBusy` (the remaining TTL as the hint), is not charged to the
/// turn bucket, and gives its permit back.
async fn a_second_turn_of_a_session_is_busy<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = setup(store, clock, 4);
    let gate = Arc::new(Semaphore::new(0));
    s.h.model.push(support::gated(&gate));
    let first = s.execute("u1", "s1").await.expect("admitted");
    let first = tokio::spawn(texts(first));
    while s.h.model.calls() < 1 {
        tokio::task::yield_now().await;
    }
    let turns = s.h.state("u1").await.turns_available;
    s.h.clock.advance(1_000);
    match s.execute("u1", "s1").await {
        Err(TurnError::SessionBusy { retry_after_ms }) => assert_eq!(retry_after_ms, TTL - 1_000),
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    assert_eq!(s.h.state("u1").await.turns_available, turns, "not charged");
    assert_eq!(s.executor.gate().in_flight(), 1);
    // Another session of the same user runs meanwhile.
    assert!(is_reply(
        &texts(s.execute("u1", "s2").await.expect("admitted")).await
    ));
    gate.add_permits(1);
    assert!(is_reply(&first.await.expect("join")));
    assert_eq!(s.executor.gate().in_flight(), 0);
    assert!(is_reply(
        &texts(s.execute("u1", "s1").await.expect("admitted")).await
    ));
}

/// A turn that runs 4× the session TTL keeps both leases: they are renewed
/// every TTL/3 (10 s) on the clock.
async fn a_long_turn_keeps_its_leases<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = setup(store, clock, 4);
    let gate = Arc::new(Semaphore::new(0));
    s.h.model.push(support::gated(&gate));
    let stream = s.execute("u1", "s1").await.expect("admitted");
    let invocation = stream.invocation_id().expect("id").to_owned();
    let turn = tokio::spawn(texts(stream));
    while s.h.model.calls() < 1 {
        tokio::task::yield_now().await;
    }
    for step in 1..=12 {
        s.eventually("the renewal timer is armed", || async {
            s.h.clock.pending_sleeps() >= 1
        })
        .await;
        s.h.clock.advance(10_000);
        s.eventually("the session lease renewed", || async {
            s.session_held("u1", "s1").await == Some(TTL)
        })
        .await;
        let leases = s.h.state("u1").await.leases;
        assert_eq!(leases.len(), 1, "step {step}: the run lease is held");
        assert_eq!(leases[0].0, invocation);
    }
    // 120 s later (the plan's run lease TTL, 4× the session TTL) the turn
    // still holds both; it ends and frees them.
    gate.add_permits(1);
    assert!(is_reply(&turn.await.expect("join")));
    assert_eq!(s.h.leases("u1").await, 0);
    assert_eq!(s.session_held("u1", "s1").await, None);
    assert_eq!(s.executor.gate().in_flight(), 0);
}

/// A gate of 1: while a turn runs, another is refused `Overloaded` (retry
/// in 1 s, retryable). Failed attempts of every kind (overloaded, session
/// busy, denied) give their permit back: each retried call holds exactly
/// one permit, and none leaks.
async fn the_gate_rejects_over_its_cap_and_retries_hold_one_permit<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let s = setup(store, clock, 1);
    let gate = Arc::new(Semaphore::new(0));
    s.h.model.push(support::gated(&gate));
    let first = tokio::spawn(texts(s.execute("u1", "s1").await.expect("admitted")));
    while s.h.model.calls() < 1 {
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        let err = s.execute("u2", "s9").await.expect_err("over the cap");
        assert!(matches!(err, TurnError::Overloaded(_)), "{err:?}");
        assert_eq!(err.retry_after_ms(), Some(1_000));
        assert!(err.is_retryable());
        assert_eq!(s.executor.gate().in_flight(), 1);
    }
    gate.add_permits(1);
    assert!(is_reply(&first.await.expect("join")));
    assert_eq!(s.executor.gate().in_flight(), 0);

    // With the place free, session-busy and denied attempts hold it only
    // while they decide.
    let gate2 = Arc::new(Semaphore::new(0));
    s.h.model.push(support::gated(&gate2));
    let held = tokio::spawn(texts(s.execute("u3", "s1").await.expect("admitted")));
    while s.h.model.calls() < 2 {
        tokio::task::yield_now().await;
    }
    gate2.add_permits(1);
    assert!(is_reply(&held.await.expect("join")));
    for n in 0..6 {
        // u4's turn bucket holds 5: the sixth is denied.
        match s.execute("u4", "s1").await {
            Ok(stream) => assert!(is_reply(&texts(stream).await), "turn {n}"),
            Err(TurnError::Denied(d)) => {
                assert_eq!(n, 5);
                assert_eq!(d.limit(), Limit::TurnRate);
            }
            Err(other) => panic!("{other:?}"),
        }
        assert_eq!(s.executor.gate().in_flight(), 0);
    }
}

/// Admission denied for concurrency after the session lease was taken:
/// the session lease is released at once (SPEC §3 order).
async fn a_denied_turn_releases_its_session_lease<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = setup(store, clock, 8);
    let gate = Arc::new(Semaphore::new(0));
    s.h.model.push(support::gated(&gate));
    s.h.model.push(support::gated(&gate));
    let a = tokio::spawn(texts(s.execute("u1", "s1").await.expect("admitted")));
    let b = tokio::spawn(texts(s.execute("u1", "s2").await.expect("admitted")));
    while s.h.model.calls() < 2 {
        tokio::task::yield_now().await;
    }
    match s.execute("u1", "s3").await {
        Err(TurnError::Denied(Denial::Limited {
            limit: Limit::Concurrency,
            retry_after_ms,
        })) => assert_eq!(retry_after_ms, 1_000),
        other => panic!("expected a concurrency denial, got {other:?}"),
    }
    assert_eq!(s.session_held("u1", "s3").await, None, "released at once");
    assert_eq!(s.executor.gate().in_flight(), 2);
    gate.add_permits(2);
    assert!(is_reply(&a.await.expect("join")));
    assert!(is_reply(&b.await.expect("join")));
    assert_eq!(s.executor.gate().in_flight(), 0);
}

/// Sessions in the store (`FencedSessionService`): turn A holds session s1
/// and is paused past its session TTL (the clock jumps 31 s at once, so its
/// renewal comes too late and finds the lease lost); turn B takes the
/// session over with a higher fence and completes. When A resumes, its
/// model reply is refused by the store (stale fence), A ends with that
/// error, and the history holds A's user message, then B's turn — nothing
/// of A after B.
async fn a_late_append_after_a_takeover_is_rejected<S: Store + Clone>(store: S, clock: FakeClock) {
    let sessions = Arc::new(FencedSessionService::new(store.clone(), clock.clone()));
    let h = Harness::assemble(
        store,
        clock,
        support_plan(),
        FakeLlm::replying(),
        sessions,
        false,
        |m| m,
    );
    let executor = TurnExecutor::new(
        Arc::clone(&h.runner),
        Arc::clone(&h.limiter),
        ReplicaGate::new(4),
    )
    .with_session_ttl_ms(TTL);
    h.session("u1", "s1").await;
    let gate = Arc::new(Semaphore::new(0));
    h.model.push(support::gated(&gate));
    let turn = |text: &'static str| {
        executor.execute(
            UserId::new("u1").expect("user"),
            SessionId::new("s1").expect("session"),
            Content::new("user").with_text(text),
        )
    };
    let a = turn("from A").await.expect("A admitted");
    let (a_invocation, a_fence) = (a.invocation_id().expect("id").to_owned(), a.fence().fence);
    let a = tokio::spawn(support::outcome(a));
    while h.model.calls() < 1 {
        tokio::task::yield_now().await;
    }

    h.clock.advance(TTL + 1_000);
    let b = turn("from B").await.expect("B takes the session over");
    let b_fence = b.fence().fence;
    assert_eq!(b_fence, a_fence + 1);
    let (b_texts, b_error) = support::outcome(b).await;
    assert!(b_error.is_none(), "{b_error:?}");
    assert!(is_reply(&b_texts), "{b_texts:?}");

    gate.add_permits(1);
    let (_, a_error) = a.await.expect("join");
    let a_error = a_error.expect("A's late append is refused");
    assert_eq!(a_error.code, "session.fence_stale");
    assert_eq!(
        FenceError::find_in(&a_error),
        Some(&FenceError::Stale {
            fence: a_fence,
            latest: b_fence
        })
    );

    let history = h
        .sessions
        .get(adk_session::GetRequest {
            app_name: support::APP.into(),
            user_id: "u1".into(),
            session_id: "s1".into(),
            num_recent_events: None,
            after: None,
        })
        .await
        .expect("session");
    let events = history.events().all();
    let who: Vec<(bool, String)> = events
        .iter()
        .map(|e| (e.invocation_id == a_invocation, e.author.clone()))
        .collect();
    assert_eq!(
        who,
        vec![
            (true, "user".to_owned()),
            (false, "user".to_owned()),
            (false, "assistant".to_owned()),
        ],
        "A's user message, then B's turn; nothing of A after B"
    );
    assert_eq!(executor.gate().in_flight(), 0);
    assert_eq!(h.leases("u1").await, 0, "A's run lease released at its end");
}
