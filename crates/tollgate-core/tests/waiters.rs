//! Many concurrent waiters of `Limiter::reserve_tokens_and_wait` on the fake
//! clock: every one is granted, when its wait ends and not before, and none
//! is lost. (The 100,000-waiter memory measurement is
//! `examples/waiters.rs`.)

use std::sync::Arc;

use parking_lot::Mutex;
use tollgate_core::{
    BucketSpec, Clock, Decision, FakeClock, Limiter, MemoryStore, PlansConfig, Store,
};

/// Users the waiters are spread over.
const USERS: usize = 10;
/// Waiters per user.
const PER_USER: usize = 1_000;
/// The burst, drained first (one token refills each ms).
const BURST: u64 = 500;

fn limiter(clock: &FakeClock) -> Limiter<MemoryStore> {
    let cfg: PlansConfig = serde_json::from_str(&format!(
        r#"{{ "default_plan": "p", "plans": {{ "p": {{
            "turns": {{ "amount": 10, "period_ms": 1000 }},
            "tokens": {{ "amount": 1000, "period_ms": 1000, "burst": {BURST} }},
            "concurrent_runs": 1, "max_wait_ms": 3600000,
            "max_llm_calls": 1000000 }} }} }}"#
    ))
    .unwrap();
    Limiter::new(
        MemoryStore::new(clock.clone()),
        clock.clone(),
        cfg.validate().unwrap(),
    )
}

/// Polls the other tasks until `done` holds (at most a bounded number of
/// rounds: a lost wake-up fails instead of hanging).
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the waiters never got there");
}

#[tokio::test]
async fn ten_thousand_waiters_are_granted_in_order_and_none_is_lost() {
    let clock = FakeClock::new(1_000_000);
    let limiter = Arc::new(limiter(&clock));
    let user = |u: usize| format!("user-{u}");
    let run = |u: usize| format!("run-{u}");
    for u in 0..USERS {
        let d = limiter
            .reserve_tokens(&user(u), &run(u), BURST)
            .await
            .unwrap();
        assert_eq!(d.grant().unwrap().wait_ms, 0);
    }
    // Each grant appends (user, how long it waited, the clock at the grant).
    let grants: Arc<Mutex<Vec<(usize, u64, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..USERS * PER_USER {
        let (limiter, grants, clock) = (limiter.clone(), grants.clone(), clock.clone());
        let (user, run) = (user(i % USERS), run(i % USERS));
        tasks.push(tokio::spawn(async move {
            let d = limiter
                .reserve_tokens_and_wait(&user, &run, 1)
                .await
                .unwrap();
            let Decision::Allowed {
                grant,
                shadow_denied: None,
            } = d
            else {
                panic!("waiter {i} refused: {d:?}");
            };
            assert_eq!(grant.wait_ms, 0, "waited out in the limiter");
            grants
                .lock()
                .push((i % USERS, grant.waited_ms, clock.now_ms()));
            grant.id
        }));
    }
    until(|| clock.pending_sleeps() == USERS * PER_USER).await;
    assert!(
        grants.lock().is_empty(),
        "no wait ends before the clock moves"
    );

    let start = clock.now_ms();
    for t in 1..=PER_USER as u64 {
        clock.advance(1);
        until(|| grants.lock().len() == t as usize * USERS).await;
        // Exactly the waiters whose wait ends now, one per user: the
        // user's t-th reservation (one token a ms past the drain).
        let g = grants.lock();
        let step = &g[(t as usize - 1) * USERS..];
        let mut users: Vec<usize> = step.iter().map(|&(u, _, _)| u).collect();
        users.sort_unstable();
        assert!(users.into_iter().eq(0..USERS), "at {t} ms: {step:?}");
        for &(_, waited, at) in step {
            assert_eq!((waited, at), (t, start + t), "at {t} ms");
        }
        assert_eq!(clock.pending_sleeps(), (PER_USER - t as usize) * USERS);
    }

    // No waiter lost: every task ends, each with its own reservation.
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap());
    }
    ids.sort_by_key(|id| (id.invocation_id.clone(), id.call));
    ids.dedup();
    assert_eq!(ids.len(), USERS * PER_USER);
    // The debt is paid to the token: the buckets are empty now.
    let spec = BucketSpec::new(1_000, 1_000, BURST).unwrap();
    for u in 0..USERS {
        let s = limiter
            .store()
            .user_state(&user(u), spec, spec)
            .await
            .unwrap();
        assert_eq!(s.tokens_available, 0, "user {u}");
    }
}
