//! Many concurrent waiting reservations in one process: peak memory and OS
//! threads while `Limiter::reserve_tokens_and_wait` holds them all.
//!
//! ```sh
//! cargo run --release -p tollgate-core --example waiters -- fake          # FakeClock
//! cargo run --release -p tollgate-core --example waiters -- real          # MonotonicClock
//! cargo run --release -p tollgate-core --example waiters -- real 100000 2 # 2 workers
//! ```
//!
//! Arguments: the clock (`fake` or `real`), the number of waiters (default
//! 100,000) and the runtime (0, the default: tokio's current-thread
//! runtime; N: a multi-thread runtime of N workers).
//!
//! The waiters are spread over 100 users on one plan (a 1,000-token burst
//! refilled at 1,000 tokens a second: one token a millisecond). Each user's
//! bucket is first drained and put 5,000 tokens into debt by one
//! reservation (granted with a 5 s wait nobody waits out); then every
//! waiter is a task that reserves one token of its user's run and waits for
//! it, so a user's k-th waiter must wait 5 s + k ms (less what refilled
//! while the waiters reserved, on the real clock). On the fake clock the
//! clock is advanced 5 s, then 1 ms at a time once every waiter sleeps, and
//! after each step exactly the waiters whose wait ended are granted
//! (checked: counts). On the real clock real time passes (about 6 s).
//! Every waiter is checked granted, and each user's bucket ends where the
//! arithmetic says. The example prints the peak resident set (`VmHWM`) and
//! the OS threads (`Threads`) from `/proc/self/status`.
#![allow(clippy::print_stdout)]
// a measurement tool: printing is its job
// Timing the run is what a measuring tool does; decisions read the clock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tollgate_core::{
    BucketSpec, Clock, Decision, FakeClock, Limiter, MemoryStore, MonotonicClock, PlansConfig,
    Store,
};

/// Users the waiters are spread over.
const USERS: usize = 100;
/// The plan's burst, tokens (drained first).
const BURST: u64 = 1_000;
/// Debt the drain leaves, tokens (ms of wait before the first waiter's).
const DEBT: u64 = 5_000;

fn plans() -> PlansConfig {
    serde_json::from_str(&format!(
        r#"{{ "default_plan": "p", "plans": {{ "p": {{
            "turns": {{ "amount": 10, "period_ms": 1000 }},
            "tokens": {{ "amount": 1000, "period_ms": 1000, "burst": {BURST} }},
            "concurrent_runs": 1, "max_wait_ms": 3600000,
            "max_llm_calls": 10000000 }} }} }}"#
    ))
    .expect("valid plans")
}

fn status(field: &str) -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| "?".to_owned())
}

fn user(u: usize) -> String {
    format!("user-{u:03}")
}

fn run_id(u: usize) -> String {
    format!("run-{u:03}")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let clock = args.next().unwrap_or_else(|| "fake".to_owned());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    assert!(
        n.is_multiple_of(USERS),
        "the waiters are spread evenly over {USERS} users"
    );
    let rt = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    }
    .enable_time()
    .build()
    .expect("runtime");
    let fake = match clock.as_str() {
        "fake" => true,
        "real" => false,
        other => panic!("clock must be `fake` or `real`, not {other:?}"),
    };
    println!(
        "{n} waiters over {USERS} users, {} clock, {}",
        if fake { "fake" } else { "real (monotonic)" },
        if workers == 0 {
            "current-thread runtime".to_owned()
        } else {
            format!("multi-thread runtime, {workers} workers")
        }
    );
    let before = status("VmRSS:");
    let start = Instant::now();
    let threads = rt.block_on(async move {
        if fake {
            let clock = FakeClock::new(1_700_000_000_000);
            run(clock.clone(), n, Some(clock)).await
        } else {
            run(MonotonicClock::new(), n, None).await
        }
    });
    println!("all {n} granted in {:.2?}", start.elapsed());
    println!("RSS before: {before}; peak (VmHWM): {}", status("VmHWM:"));
    println!("OS threads while waiting: {threads}");
}

fn spec() -> BucketSpec {
    BucketSpec::new(1_000, 1_000, BURST).expect("valid")
}

/// Drains every user's bucket, starts `n` waiters and checks they are all
/// granted as the arithmetic says. `fake`: the clock to advance (else
/// real time passes). Answers the OS threads counted while all waited.
async fn run(clock: impl Clock + Clone, n: usize, fake: Option<FakeClock>) -> String {
    let spec = spec();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(clock.clone()),
        clock.clone(),
        plans().validate().expect("valid plans"),
    ));
    // When each user's bucket was drained, ms: between these readings.
    let mut drained_at = Vec::with_capacity(USERS);
    for u in 0..USERS {
        let before = clock.now_ms();
        let d = limiter
            .reserve_tokens(&user(u), &run_id(u), BURST + DEBT)
            .await
            .expect("memory store");
        assert_eq!(d.grant().map(|g| g.wait_ms), Some(DEBT), "the drain");
        drained_at.push((before, clock.now_ms()));
    }
    let granted = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let per_user = n / USERS;
    // The users' names, shared by their waiters (a waiter's own memory is
    // the limiter's, not the harness's).
    let names: Arc<[(String, String)]> = (0..USERS).map(|u| (user(u), run_id(u))).collect();
    let mut waiters = Vec::with_capacity(n);
    for i in 0..n {
        let (limiter, names) = (limiter.clone(), names.clone());
        let (granted, started) = (granted.clone(), started.clone());
        waiters.push(tokio::spawn(async move {
            let u = i % USERS;
            let (user, run) = &names[u];
            started.fetch_add(1, Ordering::Relaxed);
            let d = limiter
                .reserve_tokens_and_wait(user, run, 1)
                .await
                .expect("memory store");
            granted.fetch_add(1, Ordering::Relaxed);
            match d {
                Decision::Allowed {
                    grant,
                    shadow_denied: None,
                } if grant.wait_ms == 0 => (u, grant.waited_ms),
                other => panic!("waiter {i}: {other:?}"),
            }
        }));
    }
    let threads;
    if let Some(fake) = &fake {
        // Every waiter reserved and sleeps on the clock.
        while fake.pending_sleeps() < n {
            tokio::task::yield_now().await;
        }
        threads = status("Threads:");
        println!(
            "all {n} waiting: RSS {}, peak {}",
            status("VmRSS:"),
            status("VmHWM:")
        );
        fake.advance(DEBT);
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(granted.load(Ordering::Relaxed), 0, "none before its wait");
        for t in 1..=per_user {
            fake.advance(1);
            // Exactly the waiters whose wait (t ms) ended are granted.
            let want = t * USERS;
            let mut spins = 0u64;
            while granted.load(Ordering::Relaxed) < want {
                tokio::task::yield_now().await;
                spins += 1;
                assert!(spins < 10_000_000, "stuck at {t} ms");
            }
            assert_eq!(granted.load(Ordering::Relaxed), want, "at {t} ms");
        }
    } else {
        // Sample while they all wait (the first wait ends past the debt's
        // 5 s; they all reserve well within that).
        // (A waiter counts itself started in the poll that reserves and
        // starts its sleep: the store's futures are ready at once.)
        while started.load(Ordering::Relaxed) < n {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        threads = status("Threads:");
        println!(
            "waiting ({} granted so far): RSS {}, peak {}",
            granted.load(Ordering::Relaxed),
            status("VmRSS:"),
            status("VmHWM:")
        );
    }
    let mut waits: Vec<Vec<u64>> = (0..USERS).map(|_| Vec::with_capacity(per_user)).collect();
    for w in waiters {
        let (u, waited) = w.await.expect("waiter task");
        waits[u].push(waited);
    }
    assert_eq!(granted.load(Ordering::Relaxed), n);
    for (u, mut w) in waits.into_iter().enumerate() {
        assert_eq!(w.len(), per_user, "user {u}: every waiter granted");
        if fake.is_some() {
            // Nothing refilled while they reserved: the k-th waited the
            // debt and k ms.
            w.sort_unstable();
            assert!(
                w.iter().copied().eq(DEBT + 1..=DEBT + per_user as u64),
                "user {u}"
            );
        }
        // The debt is paid off one token a ms from the drain, and the
        // bucket never refilled to its burst meanwhile: the level now is
        // what refilled past the last waiter's token (bounded by clock
        // readings on either side, which are equal on the fake clock).
        let t0 = clock.now_ms();
        let state = limiter
            .store()
            .user_state(&user(u), spec, spec)
            .await
            .expect("memory store");
        let t1 = clock.now_ms();
        let (d0, d1) = drained_at[u];
        let level = |now: u64, drained: u64| {
            now.saturating_sub(drained + DEBT + per_user as u64)
                .min(BURST) as i64
        };
        let got = state.tokens_available;
        assert!(
            (level(t0, d1)..=level(t1, d0)).contains(&got),
            "user {u}: {got} tokens, want {}..={}",
            level(t0, d1),
            level(t1, d0)
        );
    }
    threads
}
