//! Store outages against a real `redis-server` that the tests kill and
//! restart: fail-closed answers a transient `Unavailable`, fail-open keeps
//! deciding locally at the scaled rate, sessions always fail closed, nothing
//! panics, and after a restart decisions come from Redis again without
//! rebuilding the store. Clearing a provider key's cooldown and AIMD state
//! fails closed under fail-open too. Also: password authentication, and
//! permanent errors are never hidden by a fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate_core::aimd::AimdParams;
use tollgate_core::{
    Decision, FakeClock, Limit, Limiter, LimiterError, PlanConfig, PlansConfig, RateConfig, Store,
    StoreErrorKind,
};
use tollgate_redis::{Failover, FailurePolicy, RedisConfig, RedisStore};
use tollgate_testkit::redis::{RedisServer, unique_prefix, wait_until};

fn plans() -> tollgate_core::PlanBook {
    let plan = PlanConfig {
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
    };
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan);
    cfg.validate().expect("valid plans")
}

async fn redis(url: String) -> RedisStore {
    RedisStore::connect(
        RedisConfig::standalone(url)
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(1)),
    )
    .await
    .expect("connect")
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
    let store = Failover::new(
        redis(server.url()).await,
        FailurePolicy::FailOpen {
            fallback_share: 0.5,
        },
        clock.clone(),
    )
    .expect("policy")
    .with_hook(move |e| {
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
    // A lease renewal held in Redis is not ended by the outage.
    assert!(l.renew_run("u1", "before").await.unwrap().is_some());
    // Sessions always fail closed.
    assert!(store.session_acquire("s", "h", 1_000).await.is_err());
    assert!(store.append_fenced("s", 1, b"x").await.is_err());
    assert!(refused.load(Ordering::Relaxed) >= 2);
    // So does an operator's clear of a provider key: cleared only here, the
    // fleet's cooldown would stay while the operator was told it was gone.
    let (cd, aimd) = ("{p:m}:cooldown", "{p:m}:aimd");
    let far = tollgate_testkit::T0 + 10_000_000;
    assert_eq!(store.extend_cooldown(cd, far).await.unwrap(), far, "local");
    let e = store
        .clear_provider(cd, aimd, AimdParams::default())
        .await
        .expect_err("fails closed");
    assert!(e.is_transient(), "{e}");
    assert_eq!(
        store.extend_cooldown(cd, 0).await.unwrap(),
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
    // From Redis again (empty after the restart): the full burst of 4.
    let before = local.load(Ordering::Relaxed);
    for inv in ["d", "e", "f", "g"] {
        assert!(l.admit_turn("u1", inv).await.unwrap().is_allowed(), "{inv}");
    }
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
        store.extend_cooldown(cd, 0).await.unwrap(),
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
/// write needs memory with `OOM`: that is a full store
/// (`StoreErrorKind::Full`, the sidecar's 503 `store_full`), not an outage.
/// Under fail-open nothing is decided locally, the store is not marked
/// down, and once Redis has room again it decides as before. (A script that
/// has already written, e.g. one that first drops expired leases, runs to
/// its end: Redis keeps scripts atomic.)
#[tokio::test]
async fn redis_out_of_memory_is_full_and_never_falls_back() {
    use tollgate_core::BucketSpec;
    use tollgate_core::store::{BucketRef, TakeRequest};
    let server =
        RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]).expect("redis-server");
    let clock = FakeClock::new(tollgate_testkit::T0);
    let (local, refused) = counting();
    let (l2, r2) = (local.clone(), refused.clone());
    let store = Failover::new(
        redis(server.url()).await.with_clock_override(clock.clone()),
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy")
    .with_hook(move |e| {
        if e.local { &l2 } else { &r2 }.fetch_add(1, Ordering::Relaxed);
    });
    let take = |key| TakeRequest {
        bucket: BucketRef::Named(key),
        spec: BucketSpec::new(10, 60_000, 10).expect("spec"),
        cost: 1,
    };
    assert_eq!(store.take_one(take("{t}:a")).await.unwrap().remaining, 9);
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
    for key in ["{t}:a", "{t}:b"] {
        let e = store.take_one(take(key)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Full, "{e}");
        assert!(!e.is_transient());
    }
    assert!(!store.is_down(), "a full store answered: it is not down");
    assert_eq!(local.load(Ordering::Relaxed), 0, "nothing decided locally");
    assert_eq!(refused.load(Ordering::Relaxed), 0);
    let () = set("0").query_async(&mut raw).await.expect("config set");
    assert_eq!(
        store.take_one(take("{t}:a")).await.unwrap().remaining,
        8,
        "the refusals took nothing"
    );
}
