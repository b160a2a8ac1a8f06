//! The turn-rate layer on an axum router, driven by `oneshot` (no sockets)
//! and a fake clock (no sleeps).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::{Extension, Router};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate_core::store::{Op, TurnRequest, UserState};
use tollgate_core::{
    FakeClock, Limiter, MemoryStore, PlanConfig, PlansConfig, Store, StoreError, StoreErrorKind,
};
use tollgate_tower::{
    HeaderIdentity, IdentityExtractor, ResponseBody, SHADOW_DENIED_HEADER, TurnChecked, TurnRate,
    TurnRateLayer,
};
use tower::{Layer, Service, ServiceExt, service_fn};

use tollgate_testkit::T0;

/// Plan "support" of SPEC §7 (the testkit's), optionally in shadow mode.
fn support(shadow: bool) -> PlanConfig {
    PlanConfig {
        shadow,
        ..tollgate_testkit::scenarios::support()
    }
}

/// A limiter whose default plan is `plan`.
fn limiter_with<S: Store>(store: S, clock: &FakeClock, plan: PlanConfig) -> Arc<Limiter<S>> {
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan);
    Arc::new(Limiter::new(
        store,
        clock.clone(),
        cfg.validate().expect("valid plan"),
    ))
}

/// A memory store with the fake clock, and the clock.
fn memory(plan: PlanConfig) -> (Arc<Limiter<MemoryStore>>, FakeClock) {
    let clock = FakeClock::new(T0);
    (
        limiter_with(MemoryStore::new(clock.clone()), &clock, plan),
        clock,
    )
}

/// `POST /turn` behind the layer (identity from `x-user`); counts its calls
/// and answers the user it was handed.
fn app<S: Store>(limiter: Arc<Limiter<S>>, calls: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/turn",
            post(move |Extension(turn): Extension<TurnChecked>| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                format!("ran for {}", turn.user)
            }),
        )
        .layer(TurnRateLayer::new(
            limiter,
            HeaderIdentity::from_static("x-user"),
        ))
}

fn turn(user: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/turn");
    if let Some(u) = user {
        b = b.header("x-user", u);
    }
    b.body(Body::empty()).expect("valid request")
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn send(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = res.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("body read");
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

async fn user_state<S: Store>(limiter: &Limiter<S>, user: &str) -> UserState {
    let plan = limiter.plan_for(user).expect("plan");
    limiter
        .store()
        .user_state(user, plan.turns, plan.tokens)
        .await
        .expect("state")
}

#[tokio::test]
async fn five_turns_then_429_with_the_exact_retry_hint() {
    let (limiter, clock) = memory(support(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&limiter), Arc::clone(&calls));

    // SPEC §7 example 1: turns 1–5 at t = 0 are allowed…
    for i in 1..=5 {
        let a = send(&app, turn(Some("u42"))).await;
        assert_eq!(a.status, StatusCode::OK, "turn {i}");
        assert_eq!(a.body, "ran for u42");
        assert!(a.headers.get(SHADOW_DENIED_HEADER).is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    // …turns 6–10 at t = 1,000 are denied, each with retry_after_ms = 2,000.
    clock.advance(1_000);
    for i in 6..=10 {
        let a = send(&app, turn(Some("u42"))).await;
        assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "turn {i}");
        assert_eq!(a.headers["retry-after"], "2");
        assert_eq!(a.headers["ratelimit-remaining"], "0");
        assert_eq!(a.headers["ratelimit-reset"], "2");
        assert_eq!(a.headers["content-type"], "application/json");
        assert_eq!(
            a.body,
            r#"{"error":"turn_rate","limit":"turn_rate","retry_after_ms":2000,"message":"too many turns: retry in 2 s"}"#
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "denied turns never reach the service"
    );

    // Another user has its own bucket.
    assert_eq!(send(&app, turn(Some("u7"))).await.status, StatusCode::OK);

    // At t = 3,000 one whole token has refilled.
    clock.advance(2_000);
    let a = send(&app, turn(Some("u42"))).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 7);
    let a = send(&app, turn(Some("u42"))).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "and only one");
}

#[tokio::test]
async fn no_identity_is_401_and_charges_nothing() {
    let (limiter, _clock) = memory(support(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&limiter), Arc::clone(&calls));

    let mut requests = vec![turn(None), turn(Some("")), turn(Some("   "))];
    let mut twice = turn(Some("u1"));
    twice
        .headers_mut()
        .append("x-user", "u2".parse().expect("value"));
    requests.push(twice);
    for req in requests {
        let a = send(&app, req).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert_eq!(a.headers["content-type"], "application/json");
        assert!(a.headers.get("retry-after").is_none());
        assert_eq!(
            a.body,
            r#"{"error":"unauthorized","message":"no verified identity on this request"}"#
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the inner service is not called"
    );
    assert_eq!(user_state(&limiter, "u1").await.turns_available, 5);
}

#[tokio::test]
async fn a_user_without_a_plan_is_401_and_a_bad_user_id_400() {
    let clock = FakeClock::new(T0);
    let mut cfg = PlansConfig::default();
    cfg.plans.insert("p".into(), support(false));
    cfg.users.insert("known".into(), "p".into());
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(clock.clone()),
        clock,
        cfg.validate().expect("valid"),
    ));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, Arc::clone(&calls));

    let a = send(&app, turn(Some("stranger"))).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        a.body,
        r#"{"error":"unauthorized","message":"this user has no plan"}"#
    );

    let long = "u".repeat(tollgate_core::id::MAX_ID_LEN + 1);
    let a = send(&app, turn(Some(&long))).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.body,
        r#"{"error":"invalid_request","field":"user","message":"must be at most 512 characters"}"#
    );

    assert_eq!(send(&app, turn(Some("known"))).await.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A store whose turn admissions fail while `down` is set; everything else
/// goes to the memory store.
#[derive(Clone)]
struct Flaky {
    inner: MemoryStore,
    down: Arc<AtomicBool>,
}

impl Store for Flaky {
    async fn call<O: Op>(&self, op: O) -> Result<O::Reply, StoreError> {
        if O::NAME == TurnRequest::NAME && self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "connection refused (test)",
            ));
        }
        self.inner.call(op).await
    }
}

#[tokio::test]
async fn a_store_outage_is_503_and_the_service_is_not_called() {
    let clock = FakeClock::new(T0);
    let down = Arc::new(AtomicBool::new(true));
    let store = Flaky {
        inner: MemoryStore::new(clock.clone()),
        down: Arc::clone(&down),
    };
    let limiter = limiter_with(store, &clock, support(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, Arc::clone(&calls));

    let a = send(&app, turn(Some("u42"))).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.headers["content-type"], "application/json");
    assert_eq!(
        a.body,
        r#"{"error":"store_unavailable","message":"the limit store is unreachable; retry shortly"}"#
    );
    assert!(
        !String::from_utf8_lossy(&a.body).contains("connection refused"),
        "the fault's detail stays in the log"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Recovery needs nothing but the store coming back.
    down.store(false, Ordering::SeqCst);
    assert_eq!(send(&app, turn(Some("u42"))).await.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_shadow_plan_lets_the_turn_through_and_names_the_limit() {
    let (limiter, clock) = memory(support(true));
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    let app = Router::new()
        .route(
            "/turn",
            post(move |Extension(turn): Extension<TurnChecked>| async move {
                seen2.lock().push(turn.shadow_denied.map(|d| d.limit()));
                "ok"
            }),
        )
        .layer(TurnRateLayer::new(
            Arc::clone(&limiter),
            HeaderIdentity::from_static("x-user"),
        ));

    for _ in 0..5 {
        let a = send(&app, turn(Some("u42"))).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.headers.get(SHADOW_DENIED_HEADER).is_none());
    }
    clock.advance(1_000);
    let a = send(&app, turn(Some("u42"))).await;
    assert_eq!(a.status, StatusCode::OK, "shadow mode never refuses");
    assert_eq!(a.headers[SHADOW_DENIED_HEADER], "turn_rate");
    assert!(a.headers.get("retry-after").is_none());
    assert_eq!(a.body, "ok");

    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 6);
    assert!(seen[..5].iter().all(Option::is_none));
    assert_eq!(seen[5], Some(tollgate_core::Limit::TurnRate));
    // The would-be refusal took nothing and held no lease.
    let st = user_state(&limiter, "u42").await;
    assert!(st.leases.is_empty(), "{:?}", st.leases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_are_each_checked() {
    let (limiter, _clock) = memory(support(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&limiter), Arc::clone(&calls));

    let mut set = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let app = app.clone();
        set.spawn(async move { send(&app, turn(Some("u42"))).await.status });
    }
    let mut ok = 0;
    let mut limited = 0;
    while let Some(status) = set.join_next().await {
        match status.expect("task") {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, limited), (5, 35), "the burst, exactly, and no more");
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let st = user_state(&limiter, "u42").await;
    assert!(st.leases.is_empty(), "{:?}", st.leases);
}

#[tokio::test]
async fn granted_prechecks_hold_no_lease_and_runs_at_the_cap_refuse() {
    let (limiter, clock) = memory(support(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(Arc::clone(&limiter), Arc::clone(&calls));

    // Three pre-checks in a row although the plan allows 2 runs at once:
    // none keeps its lease, each charges one turn.
    for _ in 0..3 {
        assert_eq!(send(&app, turn(Some("u42"))).await.status, StatusCode::OK);
        let st = user_state(&limiter, "u42").await;
        assert!(st.leases.is_empty(), "{:?}", st.leases);
    }
    assert_eq!(user_state(&limiter, "u42").await.turns_available, 2);

    // A minute later the bucket is full again. Two real runs (admitted
    // elsewhere, e.g. through the sidecar) fill the run cap: a pre-check is
    // then refused for concurrency and charges nothing.
    clock.advance(60_000);
    for inv in ["run-1", "run-2"] {
        let d = limiter.admit_turn("u42", inv).await.expect("admit");
        assert!(d.is_allowed());
    }
    let a = send(&app, turn(Some("u42"))).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.headers["retry-after"], "1");
    assert_eq!(a.headers["ratelimit-reset"], "1");
    assert_eq!(
        a.body,
        r#"{"error":"concurrency","limit":"concurrency","retry_after_ms":1000,"message":"too many runs at once: finish one or retry in 1 s"}"#
    );
    let st = user_state(&limiter, "u42").await;
    assert_eq!(st.turns_available, 3, "the refused pre-check took nothing");
    assert_eq!(st.leases.len(), 2, "only the real runs");

    // One run ends: the next turn fits, and still leaves only the real run.
    assert!(
        limiter
            .release_run("u42", "run-1")
            .await
            .expect("release")
            .released()
    );
    assert_eq!(send(&app, turn(Some("u42"))).await.status, StatusCode::OK);
    let st = user_state(&limiter, "u42").await;
    assert_eq!(st.turns_available, 2);
    assert_eq!(
        st.leases
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        ["run-2"]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_closure_extractor_and_a_non_axum_service() {
    let (limiter, _clock) = memory(support(false));
    // Any `Fn(&Request<B>) -> Option<String>` names the user.
    let by_key = |req: &Request<String>| {
        req.headers()
            .get("x-api-key")
            .and_then(|k| k.to_str().ok())
            .map(|k| format!("key:{k}"))
    };
    assert_eq!(
        by_key.user(&Request::new(String::new())),
        None,
        "no key, no user"
    );
    let inner = service_fn(|req: Request<String>| async move {
        let user = req
            .extensions()
            .get::<TurnChecked>()
            .map(|t| t.user.clone())
            .unwrap_or_default();
        Ok::<_, Infallible>(Response::new(format!("hello {user}")))
    });
    let svc: TurnRate<_, _, _> = TurnRateLayer::new(limiter, by_key).layer(inner);

    let req = Request::builder()
        .header("x-api-key", "abc")
        .body(String::new())
        .expect("request");
    let res: Response<ResponseBody<String>> = svc.clone().oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body, "hello key:abc");

    let res = svc
        .oneshot(Request::new(String::new()))
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// A service that must be driven to readiness before each call, like
/// tower's `ConcurrencyLimit`: a clone starts not ready. It is ready only
/// while `open` is set.
struct Gate {
    open: Arc<AtomicBool>,
    ready: bool,
}

impl Clone for Gate {
    fn clone(&self) -> Self {
        Self {
            open: Arc::clone(&self.open),
            ready: false,
        }
    }
}

impl Service<Request<String>> for Gate {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        if self.open.load(Ordering::SeqCst) {
            self.ready = true;
            std::task::Poll::Ready(Ok(()))
        } else {
            std::task::Poll::Pending
        }
    }

    fn call(&mut self, _req: Request<String>) -> Self::Future {
        assert!(self.ready, "poll_ready must be called first");
        self.ready = false;
        std::future::ready(Ok(Response::new("through".to_owned())))
    }
}

#[tokio::test]
async fn readiness_is_the_inner_services_and_the_readied_one_is_called() {
    let (limiter, _clock) = memory(support(false));
    let open = Arc::new(AtomicBool::new(false));
    let mut svc = TurnRateLayer::new(limiter, HeaderIdentity::from_static("x-user")).layer(Gate {
        open: Arc::clone(&open),
        ready: false,
    });
    let user = || {
        Request::builder()
            .header("x-user", "u42")
            .body(String::new())
            .expect("request")
    };

    // Not ready while the inner service is not.
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(svc.poll_ready(cx))).await;
    assert!(polled.is_pending());

    // Ready once it is; the service called later (after the limiter's
    // answer) is the one that was readied, not a fresh clone.
    open.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let res = svc
            .ready()
            .await
            .expect("ready")
            .call(user())
            .await
            .expect("ok");
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(body, "through");
    }
    // A refused request leaves the readiness unused and nothing breaks.
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(Request::new(String::new()))
        .await
        .expect("ok");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}
