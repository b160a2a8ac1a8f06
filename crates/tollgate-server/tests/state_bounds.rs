//! The attacks of docs/security.md that create state without paying for
//! it, each tried over real sockets against `tollgate serve_with` on
//! loopback (HTTP, and gRPC where the answer differs), on a fake clock:
//! session ids by the million, reservations of 0 tokens, and a memory
//! store filled to its bound. Every test is one row of that table.

use std::net::SocketAddr;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::store::{CLAIM_SLACK_MS, DEFAULT_SESSION_GRACE_MS};
use tollgate_core::{Clock, Decision, FakeClock, Limiter, MemoryStore, PlansConfig, Store};
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;
use tollgate_testkit::T0;
use tonic::{Code, Request};

use common::{AUDIENCE, ISSUER, Resp, metric, send_with, valid_token};

mod common;

const SECRET: &str = "tollgate-state-bounds-test-secret-0123456789";
const ADMIN: &str = "state-bounds-admin-token-0123456789";

/// A claim's hold after an acquire with a 30 s lease (SPEC §4).
const HOLD_MS: u64 = 30_000 + DEFAULT_SESSION_GRACE_MS + CLAIM_SLACK_MS;

/// A jwt config with plan `p` (`plan_extra` lines added to it) and
/// `store` as its `[store]` table.
fn config_text(plan_extra: &str, store: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "p"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"

[plans.p]
turns = {{ amount = 600, period_ms = 60000, burst = 100 }}
tokens = {{ amount = 60000, period_ms = 60000 }}
concurrent_runs = 2
{plan_extra}

{store}
"#
    )
}

/// A server on a fake clock with HTTP and gRPC on loopback listeners.
struct Server {
    http: SocketAddr,
    grpc: SocketAddr,
    clock: FakeClock,
    web: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    async fn start(toml: &str) -> Self {
        let config = Config::parse(toml, "test", std::path::Path::new(".")).expect("valid config");
        let s = common::serve_loopback(config, false).await;
        Self {
            http: s.http,
            grpc: s.grpc,
            clock: s.clock,
            web: reqwest::Client::new(),
            stop: s.stop,
            task: s.task,
        }
    }

    async fn send(&self, method: Method, path: &str, user: &str, body: Option<Value>) -> Resp {
        let auth = format!("Bearer {}", valid_token(user, SECRET));
        let body = body.map(|b| b.to_string());
        send_with(
            &self.web,
            method,
            &format!("http://{}{path}", self.http),
            Some(&auth),
            body.as_deref(),
        )
        .await
    }

    async fn metrics(&self) -> String {
        self.web
            .get(format!("http://{}/metrics", self.http))
            .header("authorization", format!("Bearer {ADMIN}"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    async fn grpc(&self) -> TollgateClient<tonic::transport::Channel> {
        TollgateClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    async fn stop(mut self) {
        common::shutdown(self.stop.take(), self.task).await;
    }
}

fn as_user<T>(user: &str, message: T) -> Request<T> {
    let mut r = Request::new(message);
    let auth = format!("Bearer {}", valid_token(user, SECRET));
    r.metadata_mut()
        .insert("authorization", auth.parse().expect("ascii"));
    r
}

fn lease(holder: &str) -> Option<Value> {
    Some(json!({"holder": holder, "ttl_ms": 30_000}))
}

/// Attack: one user acquires a session lease under a million new session
/// ids, each record kept for a week. Now: a user holds at most
/// `max_sessions` live sessions (default 1,000). Over HTTP, with a cap of
/// 50: 50 of 2,000 ids are granted, every other is 429 `sessions` with the
/// time until the earliest claim ends, a turn naming a new session takes
/// no run lease, an existing session still renews, another user is
/// unaffected, and the places come back when the claims end. Then a
/// million ids through the same store operations on a fake clock: never
/// more than 1,000 live session records.
#[tokio::test]
async fn a_million_session_ids_stay_within_the_bound() {
    let srv = Server::start(&config_text("max_sessions = 50", "")).await;
    let mut granted = 0;
    for i in 0..2_000 {
        let r = srv
            .send(
                Method::POST,
                &format!("/v1/sessions/s{i}/lease"),
                "mallory",
                lease("h"),
            )
            .await;
        if i < 50 {
            r.ok();
            granted += 1;
        } else {
            r.limited("sessions", HOLD_MS);
        }
    }
    assert_eq!(granted, 50);
    // A turn naming a new session is refused before anything is taken.
    let r = srv
        .send(
            Method::POST,
            "/v1/runs",
            "mallory",
            Some(json!({"invocation_id": "run-1", "session_id": "fresh"})),
        )
        .await;
    r.limited("sessions", HOLD_MS);
    let r = send_with(
        &srv.web,
        Method::GET,
        &format!("http://{}/admin/users/mallory", srv.http),
        Some(&format!("Bearer {ADMIN}")),
        None,
    )
    .await;
    assert_eq!(r.ok()["leases"], json!([]), "no run lease was taken");
    // An existing session renews and is acquired again; another user has
    // a bound of their own.
    srv.send(
        Method::POST,
        "/v1/sessions/s7/lease/renew",
        "mallory",
        lease("h"),
    )
    .await
    .ok();
    srv.send(Method::POST, "/v1/sessions/s7/lease", "mallory", lease("h"))
        .await
        .ok();
    srv.send(Method::POST, "/v1/sessions/s0/lease", "alice", lease("h"))
        .await
        .ok();
    // Renewing or releasing ids that were never granted claims nothing.
    for i in 2_000..2_100 {
        let path = format!("/v1/sessions/g{i}/lease");
        srv.send(
            Method::POST,
            &format!("{path}/renew"),
            "mallory",
            lease("h"),
        )
        .await
        .refused(404, "not_holder");
        srv.send(Method::DELETE, &format!("{path}?holder=h"), "mallory", None)
            .await
            .refused(404, "not_holder");
    }
    let text = srv.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="session",limit="sessions",outcome="denied",plan="p"}"#
        ),
        Some(1_951.0),
        "{text}"
    );
    // The first claims end at their hold (s7's was extended): places free.
    srv.clock.advance(HOLD_MS);
    srv.send(
        Method::POST,
        "/v1/sessions/new-1/lease",
        "mallory",
        lease("h"),
    )
    .await
    .ok();
    srv.stop().await;

    // A million ids, driven fast through the store operations the sidecar
    // runs (claim, then acquire), on a fake clock moving 1 ms per id: the
    // default bound of 1,000 holds at every checkpoint.
    let clock = FakeClock::new(T0);
    let store = MemoryStore::new(clock.clone());
    let mut plans = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    plans
        .plans
        .insert("p".into(), tollgate_testkit::scenarios::support());
    let limiter = Limiter::new(store.clone(), clock.clone(), plans.validate().unwrap());
    let (mut admitted, mut refused, mut most) = (0u64, 0u64, 0usize);
    for i in 0..1_000_000u64 {
        let sid = format!("s{i}");
        match limiter
            .claim_session("mallory", &sid, 30_000, true)
            .await
            .unwrap()
        {
            Decision::Allowed { .. } => {
                let key = tollgate_core::session::session_key("mallory", &sid);
                let _ = store.session_acquire(&key, "h", 30_000).await.unwrap();
                admitted += 1;
            }
            Decision::Denied(_) => refused += 1,
        }
        if i % 50_000 == 49_999 {
            store.purge_expired();
            let live = store.stats().sessions;
            most = most.max(live);
            assert!(live <= 1_000, "{live} session records at id {i}");
        }
        clock.advance(1);
    }
    assert!(most >= 1_000, "the bound was reached: {most}");
    assert_eq!(admitted + refused, 1_000_000);
    // 1,000 s of ids, claims held 690 s: two waves of 1,000.
    assert_eq!(admitted, 2_000, "refused {refused}");
    assert!(clock.now_ms() > T0);
}

/// Attack: reserve 0 tokens under a fresh run id, over and over: before,
/// each answered `{reservation_id: "1.<run>"}` and kept a run record and an
/// open reservation for an hour, for free. Now: 400 `invalid_request`
/// naming `estimate` over HTTP, `INVALID_ARGUMENT` over gRPC, and nothing
/// is recorded (the run's first paid reservation is call 1).
#[tokio::test]
async fn zero_token_reservations_are_refused() {
    let srv = Server::start(&config_text("", "")).await;
    for i in 0..100 {
        let r = srv
            .send(
                Method::POST,
                "/v1/tokens/reserve",
                "mallory",
                Some(json!({"invocation_id": format!("free-{i}"), "estimate": 0})),
            )
            .await;
        let body = r.refused(400, "invalid_request");
        assert_eq!(body["field"], "estimate", "{r:?}");
    }
    let status = srv
        .grpc()
        .await
        .reserve_tokens(as_user(
            "mallory",
            proto::ReserveTokensRequest {
                invocation_id: "free-0".into(),
                estimate: 0,
                wait: false,
                request_id: None,
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let r = srv
        .send(
            Method::POST,
            "/v1/tokens/reserve",
            "mallory",
            Some(json!({"invocation_id": "free-0", "estimate": 1})),
        )
        .await;
    assert_eq!(r.ok()["reservation_id"], "1.free-0", "nothing was recorded");
    srv.stop().await;
}

/// Attack: fill the memory store with new users (or sessions, or keys)
/// until the process runs out of memory, taking every user down with it.
/// Now: past `[store] max_entries` (4 here) a request that needs a new
/// entry is 503 `store_full` with `Retry-After: 1` (gRPC
/// `RESOURCE_EXHAUSTED`), counted in `tollgate_store_full_total`; users
/// already held keep working (their live leases renew, new runs and
/// reservations in their entry are granted) and nothing is evicted.
#[tokio::test]
async fn a_full_memory_store_is_503_store_full_and_existing_state_works() {
    let store = "[store]\nkind = \"memory\"\nmax_entries = 4";
    let srv = Server::start(&config_text("", store)).await;
    let run = |inv: &str| Some(json!({ "invocation_id": inv }));
    // Four entries: three users and one session.
    for u in ["u1", "u2", "u3"] {
        srv.send(Method::POST, "/v1/runs", u, run("r1")).await.ok();
    }
    let long = || Some(json!({"holder": "r1", "ttl_ms": 300_000}));
    srv.send(Method::POST, "/v1/sessions/s1/lease", "u1", long())
        .await
        .ok();
    let r = srv
        .send(Method::POST, "/v1/runs", "mallory", run("r1"))
        .await;
    r.refused(503, "store_full");
    assert_eq!(r.body["retry_after_ms"], 1_000, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    let status = srv
        .grpc()
        .await
        .admit_run(as_user(
            "mallory",
            proto::AdmitRunRequest {
                invocation_id: "r1".into(),
                session_id: None,
                session_ttl_ms: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.metadata().get("x-tollgate-error").unwrap(),
        "store_full"
    );
    assert_eq!(status.metadata().get("retry-after-ms").unwrap(), "1000");
    // A new session of a known user needs a new entry too.
    srv.send(Method::POST, "/v1/sessions/s2/lease", "u1", lease("r1"))
        .await
        .refused(503, "store_full");
    // Existing state keeps working, and live leases are kept.
    srv.clock.advance(100_000);
    srv.send(Method::POST, "/v1/runs/r1/renew", "u1", None)
        .await
        .ok();
    srv.send(Method::POST, "/v1/runs", "u1", run("r2"))
        .await
        .ok();
    srv.send(Method::POST, "/v1/sessions/s1/lease/renew", "u1", long())
        .await
        .ok();
    srv.send(
        Method::POST,
        "/v1/tokens/reserve",
        "u2",
        Some(json!({"invocation_id": "r1", "estimate": 100})),
    )
    .await
    .ok();
    srv.send(Method::POST, "/v1/runs/r1/renew", "u3", None)
        .await
        .ok();
    let text = srv.metrics().await;
    assert_eq!(
        metric(&text, r#"tollgate_store_full_total{op="admit_turn"}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, r#"tollgate_store_full_total{op="session_acquire"}"#),
        Some(1.0),
        "{text}"
    );
    // The refused user's request is fine once there is room: u2's and u3's
    // leases (120 s) have ended and their buckets are full again.
    srv.clock.advance(200_000);
    srv.send(Method::POST, "/v1/runs", "mallory", run("r1"))
        .await
        .ok();
    srv.stop().await;
}

/// The bounds' settings are validated with their field paths: `[store]
/// max_entries` (memory only, 1 to 100,000,000), `session_grace_ms` (1 to
/// the retention) and a plan's `max_sessions` (1 to 100,000).
#[test]
fn the_bounds_are_validated_with_their_paths() {
    let paths = |plan: &str, store: &str| -> Vec<String> {
        match Config::parse(&config_text(plan, store), "t", std::path::Path::new(".")) {
            Ok(_) => Vec::new(),
            Err(e) => e.errors.into_iter().map(|f| f.path).collect(),
        }
    };
    assert!(paths("max_sessions = 100000", "[store]\nmax_entries = 100000000").is_empty());
    assert_eq!(paths("max_sessions = 0", ""), ["plans.p.max_sessions"]);
    assert_eq!(paths("max_sessions = 100001", ""), ["plans.p.max_sessions"]);
    assert_eq!(paths("", "[store]\nmax_entries = 0"), ["store.max_entries"]);
    assert_eq!(
        paths(
            "",
            "[store]\nsession_retention_ms = 1000\nsession_grace_ms = 1001"
        ),
        ["store.session_grace_ms"]
    );
    assert_eq!(
        paths(
            "",
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nmax_entries = 5"
        ),
        ["store.max_entries"]
    );
}
