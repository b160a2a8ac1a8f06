//! Token reservations (SPEC §2, §3, §6): settle and refund, model-call
//! counts, waiting reserves, request ids and reconciliation.

use std::sync::Arc;

use tollgate_core::{
    Decision, Denial, FakeClock, Limit, Limiter, LimiterError, Reservation, ReservationId, Store,
};

use super::{allowed, limited, limiter_with, state, support};

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

/// A limiter on the support plan with a 6,000 ms max wait, u1's token
/// bucket drained, and a task whose 6,000-token reserve waits on the
/// clock (its sleep registered).
async fn waiting_on_an_empty_bucket<S: Store + Clone>(
    store: S,
    clock: &FakeClock,
) -> (
    Arc<Limiter<S>>,
    tokio::task::JoinHandle<Result<Decision<Reservation>, LimiterError>>,
) {
    let mut plan = support();
    plan.max_wait_ms = 6_000;
    let l = Arc::new(limiter_with(store, clock, plan));
    allowed(&l.reserve_tokens("u1", "run", 60_000).await.unwrap());
    let task = tokio::spawn({
        let l = l.clone();
        async move { l.reserve_tokens_and_wait("u1", "run", 6_000).await }
    });
    until_sleeping(clock, 1).await;
    (l, task)
}

/// The waiting reserve waits on the clock, no thread blocked: it completes
/// only when the fake clock reaches the wait.
pub async fn waiting_reserve<S: Store + Clone>(store: S, clock: FakeClock) {
    let (l, task) = waiting_on_an_empty_bucket(store, &clock).await;
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
    let (l, task) = waiting_on_an_empty_bucket(store, &clock).await;
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
        invocation_id: crate::id(inv),
        estimate,
        request_id: Some(crate::id(id)),
        wait: false,
        model: None,
        split: None,
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
        invocation_id: crate::id("run"),
        estimate: 6_000,
        request_id: Some(crate::id("ran")),
        wait: false,
        model: None,
        split: None,
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
        budgets: &[],
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
            request_id: Some(crate::id(id)),
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
        budgets: &[],
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
