//! Store outages against a real `redis-server` that the tests kill,
//! restart, pause (SIGSTOP) and fill: fail-closed answers a transient
//! `Unavailable`, fail-open keeps deciding locally at the scaled rate,
//! sessions always fail closed, nothing panics, and after a restart
//! decisions come from Redis again without rebuilding the store. Closes
//! made during an outage are journalled and applied after it; what the
//! fallback decided is reconciled into Redis, and a call that timed out
//! after Redis queued it is charged once. The breaker opens on K faults in
//! a row, not on one slow call. Clearing a provider key's cooldown and AIMD
//! state fails closed under fail-open too. Also: password authentication,
//! and permanent errors are never hidden by a fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::aimd::AimdParams;
use tollgate_core::failover::{BreakerConfig, Failover, FailurePolicy};
use tollgate_core::{
    Decision, FakeClock, Limit, Limiter, LimiterError, PlanConfig, PlansConfig, RateConfig, Store,
    StoreErrorKind,
};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{RedisServer, unique_prefix, wait_until};

/// The plan of these tests: 4 turns a minute, 60,000 tokens a minute.
fn plan() -> PlanConfig {
    PlanConfig {
        turns: RateConfig {
            amount: 4,
            period_ms: 60_000,
            burst: Some(4),
        },
        tokens: RateConfig {
            amount: 60_000,
            period_ms: 60_000,
            burst: None,
        },
        max_wait_ms: 0,
        concurrent_runs: 10,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: None,
        estimate_tokens: None,
        max_sessions: None,
        shadow: false,
        budgets: None,
    }
}

fn plans() -> tollgate_core::PlanBook {
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan());
    cfg.validate().expect("valid plans")
}

async fn redis(url: String) -> RedisStore {
    redis_with_timeout(url, Duration::from_secs(1)).await
}

async fn redis_with_timeout(url: String, op_timeout: Duration) -> RedisStore {
    RedisStore::connect(
        RedisConfig::standalone(url)
            .with_key_prefix(unique_prefix())
            .with_op_timeout(op_timeout),
    )
    .await
    .expect("connect")
}

/// A breaker that opens after `k` faults in a row (1 s open).
fn breaker(k: u32) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: k,
        ..BreakerConfig::default()
    }
}

/// A failover over `server` under fail_open with half the rate locally,
/// the breaker opening at the first fault.
async fn fail_open(server: &RedisServer, clock: &FakeClock) -> Failover<RedisStore> {
    Failover::new(
        redis(server.url()).await,
        FailurePolicy::FailOpen {
            fallback_share: 0.5,
        },
        clock.clone(),
    )
    .expect("policy")
    .with_breaker(breaker(1))
}

/// A `redis-server` that writes its pid, so a test can SIGSTOP it: a
/// server that stops answering but keeps its data and the commands queued
/// on its sockets (they run when it resumes).
struct Pausable {
    server: RedisServer,
    pidfile: std::path::PathBuf,
}

impl Pausable {
    fn start() -> Self {
        let pidfile = std::env::temp_dir().join(format!("{}.pid", unique_prefix()));
        let server = RedisServer::start_with_args(&["--pidfile", pidfile.to_str().expect("utf-8")])
            .expect("redis-server");
        Self { server, pidfile }
    }

    fn signal(&self, sig: &str) {
        let pid = std::fs::read_to_string(&self.pidfile).expect("pidfile");
        let ok = std::process::Command::new("kill")
            .args([sig, pid.trim()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    fn pause(&self) {
        self.signal("-STOP");
    }

    fn resume(&self) {
        self.signal("-CONT");
    }
}

/// A [`Pausable`] server and a failover over it under `policy`: 200 ms op
/// timeout, Redis on the test's fake clock, the breaker opening after `k`
/// faults in a row.
async fn on_pausable(policy: FailurePolicy, k: u32) -> (Pausable, FakeClock, Failover<RedisStore>) {
    let server = Pausable::start();
    let clock = FakeClock::new(tollgate_testkit::T0);
    let shared = redis_with_timeout(server.server.url(), Duration::from_millis(200))
        .await
        .with_clock_override(clock.clone());
    let store = Failover::new(shared, policy, clock.clone())
        .expect("policy")
        .with_breaker(breaker(k));
    (server, clock, store)
}

impl Drop for Pausable {
    fn drop(&mut self) {
        // A stopped server cannot be stopped by SIGTERM.
        let _ = std::fs::read_to_string(&self.pidfile).map(|pid| {
            std::process::Command::new("kill")
                .args(["-CONT", pid.trim()])
                .status()
        });
    }
}

fn counting() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)))
}

#[tokio::test]
async fn fail_closed_answers_unavailable_then_recovers() {
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let (local, refused) = counting();
    let (l2, r2) = (local.clone(), refused.clone());
    let store = Failover::new(
        redis(server.url()).await,
        FailurePolicy::FailClosed,
        clock.clone(),
    )
    .expect("policy")
    .with_breaker(breaker(2))
    .with_hook(move |e| {
        if e.local { &l2 } else { &r2 }.fetch_add(1, Ordering::Relaxed);
    });
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());

    server.stop();
    for inv in ["r2", "r3"] {
        match l.admit_turn("u1", inv).await {
            Err(LimiterError::Store(e)) => {
                assert!(e.is_transient(), "{e}");
                assert!(matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ));
            }
            other => panic!("expected StoreUnavailable, got {other:?}"),
        }
    }
    assert!(store.is_down());
    assert!(store.session_acquire("s", "h", 1_000).await.is_err());
    assert_eq!(local.load(Ordering::Relaxed), 0);
    assert!(refused.load(Ordering::Relaxed) >= 3);

    server.restart().expect("restart");
    let recovered = wait_until(10, || {
        clock.advance(1_000); // past the probe interval
        let l = &l;
        async move { matches!(l.admit_turn("u1", "r4").await, Ok(d) if d.is_allowed()) }
    })
    .await;
    assert!(recovered, "decisions come from Redis again, same store");
    assert!(!store.is_down());
    // The restarted Redis is empty: only the lease taken since is there.
    let plan = l.plan_for("u1").unwrap();
    let state = store
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    let ids: Vec<&str> = state.leases.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(ids, vec!["r4"]);
    assert!(store.session_acquire("s", "h", 1_000).await.is_ok());
}

#[tokio::test]
async fn fail_open_decides_locally_at_the_scaled_rate() {
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let (local, refused) = counting();
    let (l2, r2) = (local.clone(), refused.clone());
    let store = fail_open(&server, &clock).await.with_hook(move |e| {
        if e.local { &l2 } else { &r2 }.fetch_add(1, Ordering::Relaxed);
    });
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    assert!(l.admit_turn("u1", "before").await.unwrap().is_allowed());

    server.stop();
    // Burst 4 scaled by 0.5: two turns, then the turn limit.
    for inv in ["a", "b"] {
        let d = l.admit_turn("u1", inv).await.unwrap();
        assert!(d.is_allowed(), "{inv}: {d:?}");
    }
    let d = l.admit_turn("u1", "c").await.unwrap();
    assert!(
        matches!(d, Decision::Denied(den) if den.limit() == Limit::TurnRate),
        "{d:?}"
    );
    assert_eq!(local.load(Ordering::Relaxed), 3);
    // A lease held in Redis cannot be renewed while Redis is down: the
    // client must not believe it holds a lease that is expiring there. One
    // the fallback granted can.
    let e = l.renew_run("u1", "before").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(l.renew_run("u1", "a").await.unwrap().is_some());
    // Sessions always fail closed.
    assert!(store.session_acquire("s", "h", 1_000).await.is_err());
    assert!(store.append_fenced("s", 1, b"x").await.is_err());
    assert!(refused.load(Ordering::Relaxed) >= 2);
    // So does an operator's clear of a provider key: cleared only here, the
    // fleet's cooldown would stay while the operator was told it was gone.
    let (cd, aimd) = ("{p:m}:cooldown", "{p:m}:aimd");
    let day = 86_400_000;
    let far = tollgate_core::Clock::now_ms(&clock) + 10_000_000;
    assert_eq!(
        store.extend_cooldown(cd, 10_000_000, day).await.unwrap(),
        far,
        "local"
    );
    let e = store
        .clear_provider(cd, aimd, AimdParams::default())
        .await
        .expect_err("fails closed");
    assert!(e.is_transient(), "{e}");
    assert_eq!(
        store.extend_cooldown(cd, 0, day).await.unwrap(),
        far,
        "nothing cleared"
    );

    server.restart().expect("restart");
    let recovered = wait_until(10, || {
        clock.advance(1_000);
        let store = &store;
        async move { store.session_acquire("s", "h", 1_000).await.is_ok() }
    })
    .await;
    assert!(recovered);
    assert!(!store.is_down());
    // The two turns the fallback gave are charged to Redis (empty after
    // the restart): 2 of the burst of 4 are left, not a fresh bucket.
    store.recover().await;
    assert_eq!(store.owed_users(), 0);
    let before = local.load(Ordering::Relaxed);
    for inv in ["d", "e"] {
        assert!(l.admit_turn("u1", inv).await.unwrap().is_allowed(), "{inv}");
    }
    let d = l.admit_turn("u1", "f").await.unwrap();
    assert!(
        matches!(d, Decision::Denied(den) if den.limit() == Limit::TurnRate),
        "{d:?}"
    );
    assert_eq!(local.load(Ordering::Relaxed), before, "no local decisions");
    // A clear the shared store made clears this replica's fallback copy too:
    // the next outage does not bring the old cooldown back.
    let cleared = store
        .clear_provider(cd, aimd, AimdParams::default())
        .await
        .unwrap();
    assert_eq!(cleared.cooldown_until_ms, None, "Redis restarted empty");
    server.stop();
    assert_eq!(
        store.extend_cooldown(cd, 0, day).await.unwrap(),
        0,
        "local, cleared"
    );
}

#[tokio::test]
async fn password_and_username_authenticate_and_bad_credentials_are_permanent() {
    let server = RedisServer::start_with_args(&["--requirepass", "s3cret"]).expect("redis");
    let port = server.port();
    let clock = FakeClock::new(tollgate_testkit::T0);
    for url in [
        format!("redis://:s3cret@127.0.0.1:{port}"),
        format!("redis://default:s3cret@127.0.0.1:{port}"),
    ] {
        let store = redis(url).await;
        let l = Limiter::new(store, clock.clone(), plans());
        assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
        assert!(l.release_run("u1", "r1").await.unwrap().released());
    }
    let wrong = redis(format!("redis://:nope@127.0.0.1:{port}")).await;
    let l = Limiter::new(wrong.clone(), clock.clone(), plans());
    match l.admit_turn("u1", "r1").await {
        Err(LimiterError::Store(e)) => {
            assert!(!e.is_transient(), "{e}");
            assert_eq!(e.kind(), StoreErrorKind::Refused, "{e}");
        }
        other => panic!("expected an auth error, got {other:?}"),
    }
    // Fail-open never hides a permanent fault behind local decisions.
    let open = Failover::new(
        wrong,
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy");
    let l = Limiter::new(open.clone(), clock, plans());
    assert!(matches!(
        l.admit_turn("u1", "r1").await,
        Err(LimiterError::Store(e)) if !e.is_transient()
    ));
    assert!(!open.is_down());
}

#[tokio::test]
async fn redis_down_at_startup_is_not_fatal_for_standalone() {
    let mut server = RedisServer::start().expect("redis-server");
    let url = server.url();
    server.stop();
    // The connection is made lazily: building the store works, operations
    // fail transiently, and it connects once Redis is up.
    let store = redis(url).await;
    let clock = FakeClock::new(tollgate_testkit::T0);
    let l = Limiter::new(store, clock, plans());
    assert!(matches!(
        l.admit_turn("u1", "r1").await,
        Err(e) if e.is_transient()
    ));
    server.restart().expect("restart");
    let ok = wait_until(10, || {
        let l = &l;
        async move { l.admit_turn("u1", "r1").await.is_ok() }
    })
    .await;
    assert!(ok);
}

/// Redis at its `maxmemory` (noeviction) refuses a script whose first
/// write needs memory with `OOM`: a fault of the shared store like an
/// outage. Fail-closed answers it as a full store
/// (`StoreErrorKind::Full`, the sidecar's 503 `store_full`); fail-open
/// decides locally; both count it for the breaker, and once Redis has room
/// again it decides as before. (A script that has already written, e.g. one
/// that first drops expired leases, runs to its end: Redis keeps scripts
/// atomic.)
#[tokio::test]
async fn redis_out_of_memory_goes_through_the_failure_policy() {
    use tollgate_core::BucketSpec;
    use tollgate_core::store::{BucketRef, TakeRequest};
    let server =
        RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]).expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let (local, refused) = counting();
    let (l2, r2) = (local.clone(), refused.clone());
    let shared = redis(server.url()).await.with_clock_override(clock.clone());
    let open = Failover::new(
        shared.clone(),
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy")
    .with_hook(move |e| {
        if e.local { &l2 } else { &r2 }.fetch_add(1, Ordering::Relaxed);
    });
    let closed = Failover::new(shared, FailurePolicy::FailClosed, clock.clone()).expect("policy");
    let take = |key| TakeRequest {
        bucket: BucketRef::Named(key),
        spec: BucketSpec::new(10, 60_000, 10).expect("spec"),
        cost: 1,
    };
    assert_eq!(open.take_one(take("{t}:a")).await.unwrap().remaining, 9);
    let mut raw = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let set = |v: &'static str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("SET").arg("maxmemory").arg(v);
        c
    };
    let () = set("1").query_async(&mut raw).await.expect("config set");
    let e = closed.take_one(take("{t}:b")).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Full, "{e}");
    // Fail-open: decided by the local store (a fresh bucket there).
    assert_eq!(open.take_one(take("{t}:b")).await.unwrap().remaining, 9);
    assert_eq!(local.load(Ordering::Relaxed), 1, "decided locally");
    assert_eq!(refused.load(Ordering::Relaxed), 0);
    assert!(!open.is_down(), "one fault does not open the breaker");
    let () = set("0").query_async(&mut raw).await.expect("config set");
    assert_eq!(
        open.take_one(take("{t}:a")).await.unwrap().remaining,
        8,
        "the refusals took nothing in Redis"
    );
}

/// `BUSY` (a script running past `busy-reply-threshold`) is a transient
/// fault: the policy applies, not a 500.
#[tokio::test]
async fn a_busy_redis_is_transient() {
    let server = RedisServer::start_with_args(&["--busy-reply-threshold", "10"]).expect("redis");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let store = Failover::new(
        redis(server.url()).await,
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy");
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let client = redis::Client::open(server.url()).expect("url");
    let mut spin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let spinner = tokio::spawn(async move {
        // Runs until SCRIPT KILL.
        let _: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async(&mut spin)
            .await;
    });
    let mut raw = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let busy = wait_until(5, || {
        let mut raw = raw.clone();
        async move {
            let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut raw).await;
            matches!(r, Err(e) if e.code() == Some("BUSY"))
        }
    })
    .await;
    assert!(busy, "Redis answers BUSY");
    let d = l
        .admit_turn("u1", "r1")
        .await
        .expect("decided by the policy");
    assert!(d.is_allowed());
    let () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut raw)
        .await
        .expect("script kill");
    spinner.await.expect("spinner");
}

/// Closes made while Redis does not answer are journalled (answered
/// pending), applied when it answers again, and charged once; a renew of
/// a Redis lease fails meanwhile; a reservation the fallback issued is
/// named as such, closed locally, and what the fallback charged is
/// reconciled into Redis. Redis is paused (SIGSTOP), so the calls sent
/// before the breaker opened are queued there and run when it resumes:
/// the journal's replay of them is harmless.
#[tokio::test]
async fn closes_in_an_outage_are_journalled_and_fallback_usage_reconciled() {
    use tollgate_core::store::Release;
    let (server, clock, store) = on_pausable(
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        2,
    )
    .await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
    let a = l.reserve_tokens("u1", "r1", 6_000).await.unwrap();
    let a = a.grant().expect("granted").id.clone();
    let b = l.reserve_tokens("u1", "r1", 1_000).await.unwrap();
    let b = b.grant().expect("granted").id.clone();
    assert_eq!((a.to_string().as_str(), a.fallback), ("1.r1", None));

    server.pause();
    // Two timeouts (queued in the paused Redis) open the breaker; the
    // third close is not sent at all. All three are journalled.
    let s = l.settle("u1", &a, 8_000).await.unwrap();
    assert!(s.pending && !s.applied, "{s:?}");
    assert!(l.refund("u1", &b).await.unwrap().pending);
    assert!(store.is_down());
    assert_eq!(l.release_run("u1", "r1").await.unwrap(), Release::Pending);
    assert!(l.renew_run("u1", "r1").await.unwrap_err().is_transient());
    assert_eq!(store.journal_stats().depth, 3);
    // The fallback decides a new run; its id names this replica.
    assert!(l.admit_turn("u1", "r2").await.unwrap().is_allowed());
    let c = l.reserve_tokens("u1", "r2", 500).await.unwrap();
    let c = c.grant().expect("granted").id.clone();
    assert_eq!(c.fallback, Some(store.tag()));
    assert!(c.to_string().starts_with('f'), "{c}");
    assert!(
        l.settle("u1", &c, 700).await.unwrap().applied,
        "closed locally"
    );
    assert_eq!(store.owed_users(), 1);

    server.resume();
    clock.advance(1_000); // past the breaker's open time: the next call probes
    let r = store.recover().await;
    assert_eq!(store.journal_stats().depth, 0, "{r:?}");
    assert_eq!(store.owed_users(), 0, "{r:?}");
    assert!(!store.is_down());
    // In Redis: 60,000 - 8,000 (settled a) - 0 (refunded b) - 700 (the
    // fallback's call, reconciled) + 1,000 (refilled over the 1 s) =
    // 52,300; turns 4 - 1 (r1) - 1 (r2, reconciled) = 2; r1's lease
    // released by the journal.
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(
        (st.tokens_available, st.turns_available),
        (52_300, 2),
        "{r:?}"
    );
    assert!(st.leases.is_empty(), "{:?}", st.leases);
    assert!(!l.settle("u1", &a, 8_000).await.unwrap().applied, "once");
    // The local reservation is still the fallback's: a second settle says
    // so, and charges nothing more.
    assert!(!l.settle("u1", &c, 700).await.unwrap().applied);
    assert_eq!(store.owed_users(), 0);
}

/// A reserve that timed out after Redis queued it is decided by the
/// fallback in the same request; Redis runs the queued copy when it
/// resumes. Reconciliation finds that copy by its request id and refunds
/// it, so the user is charged once, by the fallback's reservation.
#[tokio::test]
async fn a_reserve_that_timed_out_after_it_was_sent_is_charged_once() {
    let (server, clock, store) = on_pausable(
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        5,
    )
    .await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
    // Load the reserve script first: a copy queued before it is loaded
    // would be answered NOSCRIPT (and never run) after the pause.
    assert!(
        l.reserve_tokens("u1", "warm", 1_000)
            .await
            .unwrap()
            .is_allowed()
    );

    server.pause();
    let g = l.reserve_tokens("u1", "r1", 6_000).await.unwrap();
    let local = g.grant().expect("granted by the fallback").id.clone();
    assert_eq!(local.fallback, Some(store.tag()));
    assert!(!store.is_down(), "one slow call does not open the breaker");
    server.resume();

    let r = store.recover().await;
    assert_eq!((r.users, r.refunded, r.tokens), (1, 1, 0), "{r:?}");
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(st.tokens_available, 53_000, "charged once, not twice");
    // The call used 5,000: the fallback's reservation settles, and the
    // difference reaches Redis.
    assert!(l.settle("u1", &local, 5_000).await.unwrap().applied);
    let r = store.recover().await;
    assert_eq!(r.tokens, -1_000, "{r:?}");
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(st.tokens_available, 54_000);
}

/// Under fail_closed too, a reserve that timed out after Redis queued it
/// may run there when Redis resumes, charging its estimate for a
/// reservation the caller was refused (503) and can never close. Its
/// request id was generated by the replica, so reconciliation finds the
/// copy and refunds it: the refused reserve costs nothing.
#[tokio::test]
async fn under_fail_closed_a_reserve_that_timed_out_after_it_was_sent_is_refunded() {
    let (server, clock, store) = on_pausable(FailurePolicy::FailClosed, 5).await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
    // Load the reserve script first (a copy queued before it is loaded
    // would be answered NOSCRIPT after the pause, and never run).
    assert!(
        l.reserve_tokens("u1", "warm", 1_000)
            .await
            .unwrap()
            .is_allowed()
    );

    server.pause();
    match l.reserve_tokens("u1", "r1", 6_000).await {
        Err(LimiterError::Store(e)) => assert!(e.is_transient(), "{e}"),
        other => panic!("expected the store to fail, got {other:?}"),
    }
    assert_eq!(
        store.owed_users(),
        1,
        "the refused reserve is to be checked"
    );
    server.resume();

    // Redis ran the queued copy (6,000 charged): refunded.
    let r = store.recover().await;
    assert_eq!((r.users, r.refunded, r.tokens), (1, 1, -6_000), "{r:?}");
    assert_eq!(store.owed_users(), 0);
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(
        st.tokens_available, 59_000,
        "the refused reserve costs nothing"
    );
    // A reserve refused while the breaker is open was never sent: nothing
    // to check for it.
    server.pause();
    for i in 0..6 {
        let _ = l.reserve_tokens("u1", &format!("x{i}"), 10).await;
    }
    assert!(store.is_down());
    let owed = store.owed_users();
    let _ = l.reserve_tokens("u1", "not-sent", 10).await;
    assert_eq!(store.owed_users(), owed);
    server.resume();
}

/// Under fail_closed an admission that timed out after it was sent (Redis
/// paused) runs there when Redis resumes, taking a run lease for a run the
/// caller was refused (503) and will never release: a ghost holding one of
/// the user's runs to its TTL. The replica journals its release, so once
/// Redis answers the lease is gone; a retry of the run that this replica
/// admits before that keeps its lease (the release is dropped).
#[tokio::test]
async fn under_fail_closed_an_admission_that_timed_out_after_it_was_sent_leaves_no_lease() {
    let (server, clock, store) = on_pausable(FailurePolicy::FailClosed, 5).await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    let leases = || async {
        let st = store
            .primary()
            .user_state("u1", plan.turns, plan.tokens)
            .await
            .unwrap();
        st.leases.into_iter().map(|(i, _)| i).collect::<Vec<_>>()
    };
    // Load the admission script first (a copy queued before it is loaded
    // would be answered NOSCRIPT after the pause, and never run).
    assert!(l.admit_turn("u1", "warm").await.unwrap().is_allowed());
    l.release_run("u1", "warm").await.unwrap();

    server.pause();
    match l.admit_turn("u1", "r1").await {
        Err(LimiterError::Store(e)) => assert!(e.is_transient(), "{e}"),
        other => panic!("expected the store to fail, got {other:?}"),
    }
    assert!(store.needs_recovery(), "the release is journalled");
    server.resume();
    // Redis ran the queued admission: r1 holds a lease until the replay.
    assert_eq!(leases().await, ["r1"]);
    let r = store.recover().await;
    assert_eq!((r.replayed, r.remaining), (1, 0), "{r:?}");
    assert_eq!(leases().await, Vec::<String>::new(), "no ghost lease");

    // Refused the same way, then retried by its caller and admitted
    // before the store was recovered: the run keeps its lease.
    server.pause();
    assert!(l.admit_turn("u1", "r2").await.is_err());
    server.resume();
    assert!(l.admit_turn("u1", "r2").await.unwrap().is_allowed());
    let r = store.recover().await;
    assert_eq!((r.replayed, r.remaining), (0, 0), "{r:?}");
    assert_eq!(leases().await, ["r2"], "the admitted retry keeps its lease");

    // Refused twice while Redis is paused (the retry takes the journalled
    // release out and puts it back): one release, applied once.
    server.pause();
    assert!(l.admit_turn("u1", "r3").await.is_err());
    assert!(l.admit_turn("u1", "r3").await.is_err());
    server.resume();
    assert_eq!(leases().await, ["r2", "r3"]);
    let r = store.recover().await;
    assert_eq!((r.replayed, r.remaining), (1, 0), "{r:?}");
    assert_eq!(leases().await, ["r2"]);
}

/// A reconciliation that timed out after Redis queued it runs there when
/// Redis resumes; the replica, which never saw the answer, sends the same
/// batch again, and Redis applies a batch once: the fallback's charge
/// reaches Redis once, not twice.
#[tokio::test]
async fn a_reconciliation_that_timed_out_after_it_was_sent_is_charged_once() {
    use tollgate_core::store::ReconcileRequest;
    let (server, clock, store) = on_pausable(
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        100,
    )
    .await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    // Load the scripts first (a copy queued before its script is loaded
    // would be answered NOSCRIPT after the pause, and never run).
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
    assert!(
        l.reserve_tokens("u1", "warm", 1_000)
            .await
            .unwrap()
            .is_allowed()
    );
    let warm = ReconcileRequest {
        user: "warm",
        turns: plan.turns,
        tokens: plan.tokens,
        turns_taken: 0,
        tokens_net: 0,
        ambiguous_reserves: &[],
        ambiguous_admissions: &[],
        budgets: &[],
        replica: 0,
        batch: 1,
    };
    store.primary().reconcile(warm).await.unwrap();

    server.pause();
    // Decided by the fallback (the call to Redis timed out, queued there).
    let g = l.reserve_tokens("u1", "r1", 6_000).await.unwrap();
    assert_eq!(g.grant().expect("granted").id.fallback, Some(store.tag()));
    // The reconciliation is sent, and times out: queued too.
    let r = store.recover().await;
    assert_eq!(r.users, 0, "{r:?}");
    assert_eq!(store.owed_users(), 1);
    // More is decided meanwhile (and queued in Redis too).
    let g = l.reserve_tokens("u1", "r1", 500).await.unwrap();
    assert_eq!(g.grant().expect("granted").id.fallback, Some(store.tag()));
    server.resume();

    // Redis ran every copy: the reserves (6,000 and 500) and the first
    // batch (refunding the first copy, charging the fallback's 6,000). The
    // same batch again charges nothing; the next one charges the 500 and
    // refunds its copy.
    let r = store.recover().await;
    assert_eq!(
        (r.users, r.turns, r.tokens, r.refunded),
        (2, 0, 0, 1),
        "{r:?}"
    );
    assert_eq!(store.owed_users(), 0);
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(
        st.tokens_available, 52_500,
        "60,000 - 1,000 - 6,000 - 500: each once"
    );
}

/// A full journal refuses a close with a retryable `Full` error instead of
/// answering it pending.
#[tokio::test]
async fn a_full_journal_refuses_closes() {
    let (server, clock, store) = on_pausable(FailurePolicy::FailClosed, 1).await;
    let store = store.with_journal_capacity(1);
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    assert!(l.admit_turn("u1", "r1").await.unwrap().is_allowed());
    let a = l.reserve_tokens("u1", "r1", 100).await.unwrap();
    let a = a.grant().expect("granted").id.clone();
    server.pause();
    assert!(l.settle("u1", &a, 100).await.unwrap().pending);
    match l.release_run("u1", "r1").await {
        Err(LimiterError::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Full, "{e}"),
        other => panic!("expected a full journal, got {other:?}"),
    }
    server.resume();
    clock.advance(1_000);
    let r = store.recover().await;
    assert_eq!((r.replayed, r.remaining), (1, 0));
    assert!(l.release_run("u1", "r1").await.unwrap().released());
}

/// Admission stays idempotent by invocation id across a timeout: an admit
/// that timed out after Redis queued it is admitted by the fallback, Redis
/// admits the queued copy when it resumes, and reconciliation charges no
/// second turn for it (its lease is held in Redis). A repeat of the
/// admission after recovery refreshes the lease and charges nothing.
#[tokio::test]
async fn an_admission_that_timed_out_after_it_was_sent_takes_one_turn() {
    let (server, clock, store) = on_pausable(
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        5,
    )
    .await;
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    // Load the admission script before the pause (see above).
    assert!(l.admit_turn("u1", "warm").await.unwrap().is_allowed());

    server.pause();
    assert!(
        l.admit_turn("u1", "r1").await.unwrap().is_allowed(),
        "by the fallback"
    );
    server.resume();
    let r = store.recover().await;
    assert_eq!((r.users, r.turns), (1, 0), "{r:?}");
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(st.turns_available, 2, "warm and r1: one turn each");
    assert!(st.leases.iter().any(|(id, _)| id == "r1"));
    assert!(
        l.admit_turn("u1", "r1").await.unwrap().is_allowed(),
        "a refresh"
    );
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(st.turns_available, 2, "the repeat charged nothing");
    assert!(l.release_run("u1", "r1").await.unwrap().released());
}

/// A reserve with a client request id that the fallback answered during an
/// outage is answered the same (its local reservation) when the client
/// retries it after recovery, and is charged once.
#[tokio::test]
async fn a_request_id_the_fallback_answered_is_answered_again_after_recovery() {
    use tollgate_core::Reserve;
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let store = Failover::new(
        redis(server.url()).await.with_clock_override(clock.clone()),
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy")
    .with_breaker(breaker(1));
    let l = Limiter::new(store.clone(), clock.clone(), plans());
    let plan = l.plan_for("u1").unwrap();
    let call = Reserve {
        invocation_id: tollgate_testkit::id("r1"),
        estimate: 2_000,
        request_id: Some(tollgate_testkit::id("req-1")),
        wait: false,
        model: None,
        split: None,
    };
    server.stop();
    let first = l.reserve("u1", call).await.unwrap();
    let first = first.grant().expect("granted locally").id.clone();
    assert_eq!(first.fallback, Some(store.tag()));
    server.restart().expect("restart");
    clock.advance(1_000);
    store.recover().await;
    assert!(!store.is_down());
    let again = l.reserve("u1", call).await.unwrap();
    assert_eq!(
        again.grant().expect("granted").id,
        first,
        "the first answer"
    );
    let st = store
        .primary()
        .user_state("u1", plan.turns, plan.tokens)
        .await
        .unwrap();
    assert_eq!(
        st.tokens_available, 58_000,
        "charged once, by reconciliation"
    );
}

/// Under fail_open a budget is never decided by the fallback: while the
/// shared store is down, a reserve of a plan with budgets (and its turn
/// admission under `deny_turns`) fails closed, since the fallback's fresh
/// windows would forget what the user spent; a plan without budgets is
/// decided locally as before (SPEC §6).
#[tokio::test]
async fn budgets_fail_closed_under_fail_open() {
    use tollgate_core::budget::{BudgetAmountConfig, BudgetsConfig, OnExhausted};
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let store = fail_open(&server, &clock).await;
    let base = plan();
    let budgeted = PlanConfig {
        budgets: Some(BudgetsConfig {
            daily: Some(BudgetAmountConfig {
                tokens: Some(1_000_000),
                cost: None,
            }),
            on_exhausted: Some(OnExhausted::DenyTurns),
            ..BudgetsConfig::default()
        }),
        ..base.clone()
    };
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), base);
    cfg.plans.insert("b".into(), budgeted);
    cfg.users.insert("spender".into(), "b".into());
    let l = Limiter::new(store.clone(), clock.clone(), cfg.validate().expect("valid"));
    assert!(
        l.reserve_tokens("spender", "r", 10)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(l.admit_turn("spender", "t0").await.unwrap().is_allowed());

    server.stop();
    let e = l.reserve_tokens("spender", "r", 10).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    let e = l.admit_turn("spender", "t1").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(
        l.reserve_tokens("u1", "r", 10).await.unwrap().is_allowed(),
        "no budgets: the fallback decides"
    );
    assert!(l.admit_turn("u1", "t").await.unwrap().is_allowed());
}

/// A plan that opts its budgets into the fallback (`on_outage =
/// "fallback"`): while Redis is down the replica decides them at its share
/// (0.5) from a fresh window, and what it charged is added to Redis's
/// window when it answers again; a settle journalled during the outage of
/// a reservation Redis made moves that reservation's budget charge by the
/// real usage when it is replayed. The data survives the
/// restart (a durable server).
#[tokio::test]
async fn budgets_opted_into_the_fallback_are_reconciled_and_journalled_settles_adjust_them() {
    use tollgate_core::budget::{BudgetAmountConfig, BudgetsConfig, OnOutage};
    use tollgate_core::limiter::BudgetStatus;
    let mut server = tollgate_testkit::redis::RedisOptions::default()
        .durable()
        .start()
        .expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    // Redis on the fake clock too: budget windows are the caller's
    // calendar, which Redis's real TIME (today) would be years past.
    let store = Failover::new(
        redis(server.url()).await.with_clock_override(clock.clone()),
        FailurePolicy::FailOpen {
            fallback_share: 0.5,
        },
        clock.clone(),
    )
    .expect("policy");
    let budgeted = |on_outage| PlanConfig {
        budgets: Some(BudgetsConfig {
            daily: Some(BudgetAmountConfig {
                tokens: Some(10_000),
                cost: None,
            }),
            on_outage: Some(on_outage),
            ..BudgetsConfig::default()
        }),
        ..plan()
    };
    let mut cfg = PlansConfig {
        default_plan: Some("open".into()),
        ..PlansConfig::default()
    };
    cfg.plans
        .insert("open".into(), budgeted(OnOutage::Fallback));
    cfg.plans
        .insert("closed".into(), budgeted(OnOutage::FailClosed));
    cfg.users.insert("careful".into(), "closed".into());
    let l = Limiter::new(store.clone(), clock.clone(), cfg.validate().expect("valid"));
    let spent = |user: &'static str| {
        let l = &l;
        async move {
            let b: Vec<BudgetStatus> = l.budgets(user).await.expect("budgets");
            b[0].spent
        }
    };
    let id = |d: Decision<tollgate_core::limiter::Reservation>| match d {
        Decision::Allowed { grant, .. } => grant.id,
        other => panic!("expected a grant, got {other:?}"),
    };
    // Before the outage: 3,000 spent, and a reservation of 4,000 open.
    let a = id(l.reserve_tokens("ann", "r", 3_000).await.unwrap());
    assert!(l.settle("ann", &a, 3_000).await.unwrap().applied);
    let open = id(l.reserve_tokens("ann", "r", 4_000).await.unwrap());
    let careful = id(l.reserve_tokens("careful", "r", 4_000).await.unwrap());
    assert_eq!(spent("ann").await, 7_000);

    server.stop();
    // The fallback's share: 5,000 of the day, from a fresh window.
    let local = id(l.reserve_tokens("ann", "f", 5_000).await.unwrap());
    let d = l.reserve_tokens("ann", "f", 1).await.unwrap();
    assert!(
        matches!(d, Decision::Denied(den) if den.limit() == Limit::BudgetDaily),
        "{d:?}"
    );
    // Settled locally at 2,000: the fallback owes 2,000 to the day.
    assert!(l.settle("ann", &local, 2_000).await.unwrap().applied);
    // The reservations Redis made settle into the journal: 4,000
    // estimated, 1,000 used (and 500 for the plan that fails closed).
    assert!(l.settle("ann", &open, 1_000).await.unwrap().pending);
    assert!(l.settle("careful", &careful, 500).await.unwrap().pending);
    // The plan that keeps its budgets from the fallback fails closed.
    let e = l.reserve_tokens("careful", "r", 1).await.unwrap_err();
    assert!(e.is_transient(), "{e}");

    server.restart().expect("restart");
    let up = wait_until(10, || {
        clock.advance(1_000);
        let store = &store;
        async move { store.session_acquire("probe", "h", 1_000).await.is_ok() }
    })
    .await;
    assert!(up);
    store.recover().await;
    assert_eq!(store.owed_users(), 0);
    // 3,000 + 1,000 (the journalled settle) + 2,000 (the fallback's).
    assert_eq!(spent("ann").await, 6_000);
    assert_eq!(spent("careful").await, 500);
}
