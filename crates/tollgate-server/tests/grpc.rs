//! tollgate's gRPC API (`tollgate.v1.Tollgate`) with the generated tonic
//! client over a real socket.
//!
//! Every test starts `tollgate_server::serve_with` on `127.0.0.1:0` for
//! both HTTP and gRPC, with a config parsed from TOML, JWT identity (HS256;
//! tokens minted here) and a [`FakeClock`] at [`T0`]. Time only moves when
//! a test advances the fake clock; the only real waiting is for real
//! concurrency (a call parked in the server, a stopped `redis-server`).
//!
//! Covered: every operation's success; every status mapping of the outcome
//! table (SPEC §7 example 1: RESOURCE_EXHAUSTED turn_rate with RetryInfo
//! 2,000 ms; concurrency; example 3: token_rate with 4,000 ms;
//! max_llm_calls without RetryInfo; exceeds_capacity FAILED_PRECONDITION;
//! session_busy ABORTED with the holder's TTL; stale_fence; lease_lost,
//! not_holder, unknown_reservation and unknown_provider NOT_FOUND;
//! provider_rate, provider_cooldown and provider_exhausted; invalid input
//! INVALID_ARGUMENT with a BadRequest naming the field; no or a bad token
//! UNAUTHENTICATED; the replica's in-flight cap; Redis down under
//! fail_closed UNAVAILABLE); one scenario over HTTP and gRPC with the same
//! outcomes on the same limiter; shadow mode's metadata; a cancelled
//! `wait` reservation refunded; the metrics; a reload seen over gRPC; and
//! `grpc_listen` in the config.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::FakeClock;
use tollgate_server::Listeners;
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;
use tollgate_testkit::T0;
use tollgate_testkit::redis::{RedisServer, wait_until};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use common::{AUDIENCE, ISSUER, TempDir, fail_closed_store, token_with};

mod common;

// ---------------------------------------------------------------------------
// Helpers

const SECRET: &str = "tollgate-grpc-test-secret-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";

/// 1 minute of token refill at 60,000 tokens/min, exact: 1 token per ms.
const CAPACITY: u64 = 60_000;

/// An OpenAI per-day/billing refusal.
const INSUFFICIENT_QUOTA: &str = r#"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}"#;

/// The SPEC §7 "support" plan for everyone (`concurrent_runs` as given);
/// user `patient` waits up to 6,000 ms for tokens; user `looper` may make
/// 2 model calls per run; user `shadowy` is on a shadow plan with a burst
/// of 1; providers: a `reject` key bursting to 10 and a token-limited key.
fn config_text(max_in_flight: usize, concurrent_runs: u32, store: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
max_in_flight = {max_in_flight}
default_plan = "support"

{store}

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"

[plans.support]
turns = {{ amount = 20, period_ms = 60000, burst = 5 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 60000 }}
concurrent_runs = {concurrent_runs}
max_wait_ms = 2000

[plans.patient]
turns = {{ amount = 20, period_ms = 60000, burst = 5 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 60000 }}
concurrent_runs = 2
max_wait_ms = 6000

[plans.shadow]
turns = {{ amount = 20, period_ms = 60000, burst = 1 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 60000 }}
concurrent_runs = 2
max_wait_ms = 2000
shadow = true

[users]
patient = "patient"
shadowy = "shadow"

[overrides.looper]
max_llm_calls = 2

[providers."anthropic:claude"]
requests = {{ amount = 600, period_ms = 60000, burst = 10 }}
policy = "reject"

[providers."openai:gpt-4o"]
requests = {{ amount = 600, period_ms = 60000, burst = 60 }}
policy = "block"
max_wait_ms = 4000

[providers."openai:gpt-4o-mini"]
requests = {{ amount = 600, period_ms = 60000, burst = 60 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 10000 }}
max_wait_ms = 1000
"#
    )
}

fn memory_config() -> String {
    config_text(64, 2, "")
}

/// A valid token for `user`: HS256 with the server's secret, expiring an
/// hour after the fake clock's start.
fn token(user: &str) -> String {
    token_with(user, SECRET, T0 / 1_000 + 3_600)
}

/// `message` as a call of `user` (`authorization: Bearer <JWT>`).
fn req<T>(user: &str, message: T) -> Request<T> {
    with_auth(Some(&format!("Bearer {}", token(user))), message)
}

/// `message` with this `authorization` value, or none.
fn with_auth<T>(auth: Option<&str>, message: T) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(a) = auth {
        r.metadata_mut()
            .insert("authorization", a.parse().expect("ascii"));
    }
    r
}

/// A running server (HTTP and gRPC) on a fake clock.
struct Server {
    http: SocketAddr,
    clock: FakeClock,
    grpc: TollgateClient<Channel>,
    web: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    async fn start(toml: &str) -> Self {
        let config = Config::parse(toml, "test", std::path::Path::new(".")).expect("valid config");
        Self::start_config(config).await
    }

    async fn start_config(config: Config) -> Self {
        let clock = FakeClock::new(T0);
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http_addr = http.local_addr().expect("addr");
        let grpc_addr = grpc.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::serve_with(
            config,
            Listeners::new(http).with_grpc(grpc),
            Some(Arc::new(clock.clone())),
            |_| {},
            async move {
                let _ = stopped.await;
            },
        ));
        let grpc = TollgateClient::connect(format!("http://{grpc_addr}"))
            .await
            .expect("connect");
        Self {
            http: http_addr,
            clock,
            grpc,
            web: reqwest::Client::new(),
            stop: Some(stop),
            task,
        }
    }

    /// A client of its own (calls on one client are not ordered).
    fn client(&self) -> TollgateClient<Channel> {
        self.grpc.clone()
    }

    async fn admit(&self, user: &str, inv: &str) -> Result<proto::AdmitRunResponse, Status> {
        self.client()
            .admit_run(req(
                user,
                proto::AdmitRunRequest {
                    invocation_id: inv.to_owned(),
                    ..Default::default()
                },
            ))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn release(&self, user: &str, inv: &str) -> bool {
        self.client()
            .release_run(req(
                user,
                proto::ReleaseRunRequest {
                    invocation_id: inv.to_owned(),
                    session_id: None,
                },
            ))
            .await
            .expect("release")
            .into_inner()
            .released
    }

    async fn reserve(
        &self,
        user: &str,
        inv: &str,
        estimate: u64,
    ) -> Result<proto::ReserveTokensResponse, Status> {
        self.client()
            .reserve_tokens(req(
                user,
                proto::ReserveTokensRequest {
                    invocation_id: inv.to_owned(),
                    estimate,
                    wait: false,
                    request_id: None,
                    ..Default::default()
                },
            ))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn settle(&self, user: &str, id: &str, actual: u64) -> Result<i64, Status> {
        self.client()
            .settle(req(
                user,
                proto::SettleRequest {
                    reservation_id: id.to_owned(),
                    actual,
                    ..Default::default()
                },
            ))
            .await
            .map(|r| r.into_inner().balance)
    }

    async fn permit(
        &self,
        user: &str,
        provider: &str,
        model: &str,
        tokens: u64,
    ) -> Result<proto::ProviderPermitResponse, Status> {
        self.client()
            .provider_permit(req(
                user,
                proto::ProviderPermitRequest {
                    provider: provider.to_owned(),
                    model: model.to_owned(),
                    tokens,
                    ..Default::default()
                },
            ))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn feedback(
        &self,
        provider: &str,
        model: &str,
        status: u32,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<proto::ProviderFeedbackResponse, Status> {
        let auth = format!("Bearer {}", common::service_token("gateway", SECRET));
        self.client()
            .provider_feedback(with_auth(
                Some(&auth),
                proto::ProviderFeedbackRequest {
                    provider: provider.to_owned(),
                    model: model.to_owned(),
                    status,
                    headers: headers
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                    body: body.map(str::to_owned),
                },
            ))
            .await
            .map(tonic::Response::into_inner)
    }

    /// `POST path` over HTTP as `user`: status and JSON body.
    async fn http_post(&self, user: &str, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .web
            .post(format!("http://{}{path}", self.http))
            .bearer_auth(token(user))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        self.web
            .get(format!("http://{}/metrics", self.http))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    /// Waits (real time: the call runs concurrently) until `n` sleeps are
    /// parked on the fake clock.
    async fn wait_for_sleepers(&self, n: usize) {
        common::wait_for_sleepers(&self.clock, n).await;
    }

    async fn shutdown(self) {
        drop(self.grpc);
        common::shutdown(self.stop, self.task).await;
    }
}

/// A metric's value in the text exposition, if present.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Asserts a refusal: its code, `x-tollgate-error`, the `ErrorInfo`
/// (reason and domain) and a message; answers the `ErrorInfo` metadata.
#[track_caller]
fn refused(r: Result<impl std::fmt::Debug, Status>, code: Code, error: &str) -> (Status, Value) {
    let s = r.expect_err("a refusal");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(!s.message().is_empty(), "a refusal has a message: {s:?}");
    assert_eq!(
        s.metadata()
            .get("x-tollgate-error")
            .and_then(|v| v.to_str().ok()),
        Some(error),
        "{s:?}"
    );
    let info = s.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, error, "{s:?}");
    assert_eq!(info.domain, "tollgate", "{s:?}");
    let meta = info
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    (s, Value::Object(meta))
}

/// The retry hint of a status: `retry-after-ms` metadata and `RetryInfo`,
/// which must agree.
#[track_caller]
fn hint(s: &Status) -> Option<u64> {
    let meta = s
        .metadata()
        .get("retry-after-ms")
        .map(|v| v.to_str().expect("ascii").parse::<u64>().expect("ms"));
    let info = s
        .get_details_retry_info()
        .map(|r| u64::try_from(r.retry_delay.expect("a delay").as_millis()).expect("ms"));
    assert_eq!(meta, info, "metadata and RetryInfo agree: {s:?}");
    meta
}

/// Asserts a retryable limit refusal: RESOURCE_EXHAUSTED naming `limit`
/// (`x-tollgate-limit` and `ErrorInfo`), retry hint `retry_after_ms`.
#[track_caller]
fn limited(r: Result<impl std::fmt::Debug, Status>, limit: &str, retry_after_ms: u64) -> Status {
    let (s, info) = refused(r, Code::ResourceExhausted, limit);
    assert_eq!(
        s.metadata()
            .get("x-tollgate-limit")
            .and_then(|v| v.to_str().ok()),
        Some(limit),
        "{s:?}"
    );
    assert_eq!(info["limit"], limit, "{s:?}");
    assert_eq!(info["retry_after_ms"], retry_after_ms.to_string(), "{s:?}");
    assert_eq!(hint(&s), Some(retry_after_ms), "{s:?}");
    s
}

/// Asserts INVALID_ARGUMENT `invalid_request` with a `BadRequest` naming
/// `field` (and the same field in `ErrorInfo`).
#[track_caller]
fn invalid(r: Result<impl std::fmt::Debug, Status>, field: &str) {
    let (s, info) = refused(r, Code::InvalidArgument, "invalid_request");
    assert_eq!(info["field"], field, "{s:?}");
    let bad = s.get_details_bad_request().expect("BadRequest");
    assert_eq!(bad.field_violations.len(), 1, "{s:?}");
    assert_eq!(bad.field_violations[0].field, field, "{s:?}");
    assert!(!bad.field_violations[0].description.is_empty(), "{s:?}");
    assert_eq!(hint(&s), None, "{s:?}");
}

// ---------------------------------------------------------------------------
// Every operation

#[tokio::test]
async fn every_operation_succeeds() {
    let srv = Server::start(&memory_config()).await;
    let mut c = srv.client();

    // Admit with a session lease.
    let r = c
        .admit_run(req(
            "alice",
            proto::AdmitRunRequest {
                invocation_id: "run-1".into(),
                session_id: Some("conv".into()),
                session_ttl_ms: Some(10_000),
            },
        ))
        .await
        .expect("admit")
        .into_inner();
    assert_eq!(r.lease_expires_at_ms, T0 + 120_000);
    let session = r.session.expect("a session lease");
    assert_eq!(session.fence, 1);
    assert_eq!(session.expires_at_ms, T0 + 10_000);
    // Without a session: none.
    assert_eq!(
        srv.admit("alice", "run-2").await.expect("admit").session,
        None
    );

    // Renew the run.
    srv.clock.advance(1_000);
    let r = c
        .renew_run(req(
            "alice",
            proto::RenewRunRequest {
                invocation_id: "run-1".into(),
            },
        ))
        .await
        .expect("renew")
        .into_inner();
    assert_eq!(r.lease_expires_at_ms, T0 + 121_000);

    // Tokens: reserve, settle, refund (repeats change nothing).
    let r = srv.reserve("alice", "run-1", 6_000).await.expect("reserve");
    assert_eq!(r.wait_ms, 0);
    assert!(!r.reservation_id.is_empty());
    assert_eq!(
        srv.settle("alice", &r.reservation_id, 1_000).await.ok(),
        Some(CAPACITY as i64 - 1_000)
    );
    assert_eq!(
        srv.settle("alice", &r.reservation_id, 1_000).await.ok(),
        Some(CAPACITY as i64 - 1_000),
        "a repeat changes nothing"
    );
    let r = srv.reserve("alice", "run-1", 2_000).await.expect("reserve");
    let refunded = c
        .refund(req(
            "alice",
            proto::RefundRequest {
                reservation_id: r.reservation_id.clone(),
            },
        ))
        .await
        .expect("refund")
        .into_inner();
    assert_eq!(refunded.balance, CAPACITY as i64 - 1_000);

    // Session leases: acquire, renew, check the fence, release.
    let lease = c
        .acquire_session_lease(req(
            "alice",
            proto::AcquireSessionLeaseRequest {
                session_id: "other".into(),
                holder: "h1".into(),
                ttl_ms: 5_000,
            },
        ))
        .await
        .expect("acquire")
        .into_inner();
    assert_eq!(lease.fence, 1);
    assert_eq!(lease.expires_at_ms, T0 + 1_000 + 5_000);
    let renewed = c
        .renew_session_lease(req(
            "alice",
            proto::RenewSessionLeaseRequest {
                session_id: "other".into(),
                holder: "h1".into(),
                ttl_ms: 8_000,
            },
        ))
        .await
        .expect("renew")
        .into_inner();
    assert_eq!((renewed.fence, renewed.expires_at_ms), (1, T0 + 9_000));
    let fence = c
        .check_fence(req(
            "alice",
            proto::CheckFenceRequest {
                session_id: "other".into(),
                fence: 1,
            },
        ))
        .await
        .expect("fence")
        .into_inner();
    assert!(fence.current);
    let released = c
        .release_session_lease(req(
            "alice",
            proto::ReleaseSessionLeaseRequest {
                session_id: "other".into(),
                holder: "h1".into(),
            },
        ))
        .await
        .expect("release")
        .into_inner();
    assert!(released.released);

    // Providers: a permit, a success reported.
    let p = srv
        .permit("alice", "openai", "gpt-4o", 100)
        .await
        .expect("permit");
    assert_eq!((p.wait_ms, p.effective_permille), (0, 1_000));
    let f = srv
        .feedback("openai", "gpt-4o", 200, &[], None)
        .await
        .expect("feedback");
    assert_eq!(f.class, "success");
    assert!(!f.retryable);
    assert_eq!(
        (f.retry_after_ms, f.cooldown_until_ms, f.reason),
        (None, None, None)
    );

    // Release the run and its session lease; a repeat released nothing.
    let r = c
        .release_run(req(
            "alice",
            proto::ReleaseRunRequest {
                invocation_id: "run-1".into(),
                session_id: Some("conv".into()),
            },
        ))
        .await
        .expect("release")
        .into_inner();
    assert!(r.released);
    assert!(!srv.release("alice", "run-1").await, "idempotent");
    // The session is free again: a new holder gets the next fence.
    let lease = c
        .acquire_session_lease(req(
            "alice",
            proto::AcquireSessionLeaseRequest {
                session_id: "conv".into(),
                holder: "run-3".into(),
                ttl_ms: 5_000,
            },
        ))
        .await
        .expect("acquire")
        .into_inner();
    assert_eq!(lease.fence, 2);
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Limits: RESOURCE_EXHAUSTED

/// SPEC §7 example 1 over gRPC: turns 1–5 at t = 0 are admitted; turns
/// 6–10 at t = 1,000 ms are RESOURCE_EXHAUSTED `turn_rate`, each with a
/// retry hint of exactly 2,000 ms in `RetryInfo` and `retry-after-ms`.
#[tokio::test]
async fn example_1_turn_rate_is_resource_exhausted_with_retry_info_2000_ms() {
    let srv = Server::start(&memory_config()).await;
    for i in 1..=5 {
        let inv = format!("turn-{i}");
        srv.admit("alice", &inv).await.expect("admitted");
        assert!(srv.release("alice", &inv).await);
    }
    srv.clock.advance(1_000);
    for i in 6..=10 {
        let s = limited(
            srv.admit("alice", &format!("turn-{i}")).await,
            "turn_rate",
            2_000,
        );
        let retry = s.get_details_retry_info().expect("RetryInfo");
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(2_000)));
    }
    srv.shutdown().await;
}

/// SPEC §7 example 4's denial: two runs active, a third is
/// RESOURCE_EXHAUSTED `concurrency` (hint: the concurrency retry, 1,000
/// ms); after a release it is admitted.
#[tokio::test]
async fn concurrency_is_resource_exhausted() {
    let srv = Server::start(&memory_config()).await;
    srv.admit("alice", "r1").await.expect("r1");
    srv.admit("alice", "r2").await.expect("r2");
    limited(srv.admit("alice", "r3").await, "concurrency", 1_000);
    assert!(srv.release("alice", "r1").await);
    srv.admit("alice", "r3").await.expect("r3 after a release");
    srv.shutdown().await;
}

/// SPEC §7 example 3 over gRPC: with the bucket at 0 a 6,000-token call is
/// RESOURCE_EXHAUSTED `token_rate` with a 4,000 ms hint and takes nothing;
/// with max wait 6,000 ms it is granted with a 6,000 ms wait. Then
/// `max_llm_calls` (RESOURCE_EXHAUSTED, no retry hint: the run must stop)
/// and `exceeds_capacity` (FAILED_PRECONDITION, no hint).
#[tokio::test]
async fn token_refusals_token_rate_max_llm_calls_exceeds_capacity() {
    let srv = Server::start(&memory_config()).await;
    let drained = srv
        .reserve("alice", "run-1", CAPACITY)
        .await
        .expect("whole capacity");
    assert_eq!(
        srv.settle("alice", &drained.reservation_id, CAPACITY)
            .await
            .ok(),
        Some(0)
    );
    for _ in 0..2 {
        limited(
            srv.reserve("alice", "run-1", 6_000).await,
            "token_rate",
            4_000,
        );
    }
    assert_eq!(
        srv.settle("alice", &drained.reservation_id, CAPACITY)
            .await
            .ok(),
        Some(0),
        "the refusals took nothing"
    );
    srv.reserve("patient", "run-p", CAPACITY)
        .await
        .expect("drain");
    let r = srv
        .reserve("patient", "run-p", 6_000)
        .await
        .expect("granted");
    assert_eq!(r.wait_ms, 6_000, "the boundary is inclusive");

    // max_llm_calls: not retryable.
    srv.reserve("looper", "run", 1).await.expect("call 1");
    srv.reserve("looper", "run", 1).await.expect("call 2");
    let (s, info) = refused(
        srv.reserve("looper", "run", 1).await,
        Code::ResourceExhausted,
        "max_llm_calls",
    );
    assert_eq!(info["limit"], "max_llm_calls");
    assert_eq!(hint(&s), None, "not retryable: {s:?}");
    assert!(info.get("retry_after_ms").is_none(), "{s:?}");
    srv.reserve("looper", "run-2", 1)
        .await
        .expect("another run");

    // exceeds_capacity: more than capacity + max_wait × rate (62,000).
    let (s, info) = refused(
        srv.reserve("bob", "run", 62_001).await,
        Code::FailedPrecondition,
        "exceeds_capacity",
    );
    assert_eq!(info["limit"], "token_rate");
    assert_eq!(hint(&s), None, "{s:?}");
    srv.reserve("bob", "run", 62_000)
        .await
        .expect("fits with a wait");
    srv.shutdown().await;
}

/// The replica's in-flight cap applies to gRPC: with one place taken by a
/// call waiting server-side, the next is RESOURCE_EXHAUSTED `overloaded`
/// with a 1,000 ms hint, over gRPC and over HTTP alike.
#[tokio::test]
async fn the_in_flight_cap_is_resource_exhausted_overloaded() {
    let srv = Server::start(&config_text(1, 2, "")).await;
    srv.reserve("alice", "run", CAPACITY).await.expect("drain");
    let mut c = srv.client();
    let waiting = tokio::spawn(async move {
        c.reserve_tokens(req(
            "alice",
            proto::ReserveTokensRequest {
                invocation_id: "run".into(),
                estimate: 1_000,
                wait: true,
                request_id: None,
                ..Default::default()
            },
        ))
        .await
        .map(tonic::Response::into_inner)
    });
    srv.wait_for_sleepers(1).await;
    let (s, info) = refused(
        srv.admit("bob", "x").await,
        Code::ResourceExhausted,
        "overloaded",
    );
    assert_eq!(hint(&s), Some(1_000));
    assert_eq!(info["retry_after_ms"], "1000");
    let (status, body) = srv
        .http_post("bob", "/v1/runs", json!({"invocation_id": "x"}))
        .await;
    assert_eq!((status, body["error"].as_str()), (429, Some("overloaded")));
    srv.clock.advance(1_000);
    let r = waiting
        .await
        .expect("task")
        .expect("granted after the wait");
    assert_eq!(r.wait_ms, 0, "the server waited");
    srv.admit("bob", "x").await.expect("a place again");
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Sessions, leases, reservations

/// Session busy is ABORTED with the holder's remaining TTL as the hint;
/// renewing or releasing another holder's lease is NOT_FOUND `not_holder`;
/// a stale fence is FAILED_PRECONDITION with the latest fence; a run lease
/// that expired is NOT_FOUND `lease_lost`; an unknown reservation is
/// NOT_FOUND.
#[tokio::test]
async fn session_lease_and_reservation_refusals() {
    let srv = Server::start(&memory_config()).await;
    let mut c = srv.client();
    let acquire = |holder: &str| {
        req(
            "alice",
            proto::AcquireSessionLeaseRequest {
                session_id: "conv".into(),
                holder: holder.into(),
                ttl_ms: 10_000,
            },
        )
    };
    c.acquire_session_lease(acquire("h1")).await.expect("h1");
    srv.clock.advance(4_000);
    let (s, info) = refused(
        c.acquire_session_lease(acquire("h2")).await,
        Code::Aborted,
        "session_busy",
    );
    assert_eq!(hint(&s), Some(6_000), "the holder's remaining TTL");
    assert_eq!(info["retry_after_ms"], "6000");
    // Admitting a run into the busy session is refused the same way, and
    // takes no turn and no run lease.
    let r = c
        .admit_run(req(
            "alice",
            proto::AdmitRunRequest {
                invocation_id: "run".into(),
                session_id: Some("conv".into()),
                session_ttl_ms: None,
            },
        ))
        .await;
    let (s, _) = refused(r, Code::Aborted, "session_busy");
    assert_eq!(hint(&s), Some(6_000));
    assert!(!srv.release("alice", "run").await, "no run lease was taken");

    let (s, _) = refused(
        c.renew_session_lease(req(
            "alice",
            proto::RenewSessionLeaseRequest {
                session_id: "conv".into(),
                holder: "h2".into(),
                ttl_ms: 1_000,
            },
        ))
        .await,
        Code::NotFound,
        "not_holder",
    );
    assert_eq!(hint(&s), None);
    refused(
        c.release_session_lease(req(
            "alice",
            proto::ReleaseSessionLeaseRequest {
                session_id: "conv".into(),
                holder: "h2".into(),
            },
        ))
        .await,
        Code::NotFound,
        "not_holder",
    );

    // h1's lease expires; h2 takes the session over with fence 2.
    srv.clock.advance(6_001);
    let lease = c
        .acquire_session_lease(acquire("h2"))
        .await
        .expect("h2")
        .into_inner();
    assert_eq!(lease.fence, 2);
    let (s, info) = refused(
        c.check_fence(req(
            "alice",
            proto::CheckFenceRequest {
                session_id: "conv".into(),
                fence: 1,
            },
        ))
        .await,
        Code::FailedPrecondition,
        "stale_fence",
    );
    assert_eq!(info["latest_fence"], "2");
    assert_eq!(hint(&s), None);

    // A run lease that expired (lease_ttl 120,000 ms) is lost.
    srv.admit("alice", "short").await.expect("admit");
    srv.clock.advance(120_000);
    refused(
        c.renew_run(req(
            "alice",
            proto::RenewRunRequest {
                invocation_id: "short".into(),
            },
        ))
        .await,
        Code::NotFound,
        "lease_lost",
    );

    // A well-formed reservation nobody made; another user's reservation.
    refused(
        srv.settle("alice", "7.nobody", 1).await,
        Code::NotFound,
        "unknown_reservation",
    );
    let mine = srv.reserve("alice", "run", 10).await.expect("reserve");
    refused(
        c.refund(req(
            "bob",
            proto::RefundRequest {
                reservation_id: mine.reservation_id.clone(),
            },
        ))
        .await,
        Code::NotFound,
        "unknown_reservation",
    );
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Providers

/// Fair sharing through gRPC: with the tenant named in the request, the
/// first rows of SPEC §5's worked example (weights 3:1, a burst of 2).
#[tokio::test]
async fn weighted_tenants_share_fairly_through_grpc() {
    let config = memory_config().replace(
        "[providers.\"openai:gpt-4o\"]",
        "[providers.\"openai:fair\"]\nrequests = { amount = 600, period_ms = 60000, burst = 2 }\nmax_wait_ms = 1000\n\n[providers.\"openai:fair\".tenants.a]\nweight = 3\n\n[providers.\"openai:fair\".tenants.b]\nweight = 1\n\n[providers.\"openai:gpt-4o\"]",
    );
    let srv = Server::start(&config).await;
    let permit = |tenant: &'static str| {
        let srv = &srv;
        async move {
            srv.client()
                .provider_permit(req(
                    "alice",
                    proto::ProviderPermitRequest {
                        provider: "openai".to_owned(),
                        model: "fair".to_owned(),
                        tenant: Some(tenant.to_owned()),
                        ..Default::default()
                    },
                ))
                .await
                .map(tonic::Response::into_inner)
        }
    };
    assert_eq!(permit("a").await.expect("a").wait_ms, 0);
    assert_eq!(permit("b").await.expect("b").wait_ms, 0);
    assert_eq!(permit("a").await.expect("a").wait_ms, 100);
    limited(permit("a").await, "provider_rate", 200);
    assert_eq!(permit("b").await.expect("b").wait_ms, 200);
    srv.shutdown().await;
}

/// provider_rate (a `reject` key over its burst) and provider_cooldown
/// (after a 429 with `retry-after: 2`) are RESOURCE_EXHAUSTED with the
/// exact hint; provider_exhausted (OpenAI `insufficient_quota`) is
/// RESOURCE_EXHAUSTED without a retry hint (ErrorInfo `retry_after_ms`:
/// how long it fails fast); a cost the key can never grant is
/// FAILED_PRECONDITION `exceeds_capacity`; an unconfigured key is
/// NOT_FOUND `unknown_provider`.
#[tokio::test]
async fn provider_refusals() {
    let srv = Server::start(&memory_config()).await;
    for _ in 0..10 {
        srv.permit("alice", "anthropic", "claude", 0)
            .await
            .expect("within the burst");
    }
    limited(
        srv.permit("alice", "anthropic", "claude", 0).await,
        "provider_rate",
        100,
    );

    srv.clock.advance(10_000);
    let f = srv
        .feedback("anthropic", "claude", 429, &[("retry-after", "2")], None)
        .await
        .expect("feedback");
    assert_eq!(f.class, "throttled");
    assert!(f.retryable);
    assert_eq!(f.cooldown_until_ms, Some(T0 + 12_000));
    assert_eq!(f.effective_permille, Some(500));
    limited(
        srv.permit("alice", "anthropic", "claude", 0).await,
        "provider_cooldown",
        2_000,
    );

    let f = srv
        .feedback("openai", "gpt-4o", 429, &[], Some(INSUFFICIENT_QUOTA))
        .await
        .expect("feedback");
    assert_eq!(f.class, "exhausted");
    assert!(!f.retryable);
    assert!(
        f.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("insufficient_quota")),
        "{f:?}"
    );
    let (s, info) = refused(
        srv.permit("alice", "openai", "gpt-4o", 0).await,
        Code::ResourceExhausted,
        "provider_exhausted",
    );
    assert_eq!(hint(&s), None, "not retryable: {s:?}");
    assert_eq!(info["retry_after_ms"], "60000");
    assert!(s.message().contains("insufficient_quota"), "{s:?}");

    // gpt-4o-mini: burst 10,000 tokens + max wait 1,000 ms × 1 token/ms.
    let (s, info) = refused(
        srv.permit("alice", "openai", "gpt-4o-mini", 11_001).await,
        Code::FailedPrecondition,
        "exceeds_capacity",
    );
    assert_eq!(info["limit"], "provider_rate");
    assert_eq!(hint(&s), None);

    refused(
        srv.permit("alice", "openai", "gpt-5", 0).await,
        Code::NotFound,
        "unknown_provider",
    );
    refused(
        srv.feedback("nobody", "x", 200, &[], None).await,
        Code::NotFound,
        "unknown_provider",
    );
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Input and identity

/// Bad input is INVALID_ARGUMENT with a `BadRequest` naming the field (the
/// same field names as the HTTP API), and changes nothing.
#[tokio::test]
async fn invalid_input_names_the_field() {
    let srv = Server::start(&memory_config()).await;
    let mut c = srv.client();
    invalid(srv.admit("alice", "").await, "invocation_id");
    invalid(srv.admit("alice", &"x".repeat(513)).await, "invocation_id");
    invalid(srv.admit("alice", "a\u{7}b").await, "invocation_id");
    let r = c
        .admit_run(req(
            "alice",
            proto::AdmitRunRequest {
                invocation_id: "run".into(),
                session_id: Some("conv".into()),
                session_ttl_ms: Some(0),
            },
        ))
        .await;
    invalid(r, "session_ttl_ms");
    assert!(
        !srv.release("alice", "run").await,
        "a refusal changed nothing"
    );
    let r = c
        .release_run(req(
            "alice",
            proto::ReleaseRunRequest {
                invocation_id: "run".into(),
                session_id: Some(String::new()),
            },
        ))
        .await;
    invalid(r, "session_id");
    invalid(srv.reserve("alice", "run", (1 << 53) + 1).await, "estimate");
    invalid(srv.settle("alice", "no-dot", 1).await, "reservation_id");
    invalid(srv.settle("alice", "1.", 1).await, "reservation_id");
    let r = c
        .acquire_session_lease(req(
            "alice",
            proto::AcquireSessionLeaseRequest {
                session_id: "conv".into(),
                holder: "h".into(),
                ttl_ms: 3_600_001,
            },
        ))
        .await;
    invalid(r, "ttl_ms");
    let r = c
        .check_fence(req(
            "alice",
            proto::CheckFenceRequest {
                session_id: String::new(),
                fence: 1,
            },
        ))
        .await;
    invalid(r, "session_id");
    invalid(srv.permit("alice", "", "gpt-4o", 0).await, "provider");
    invalid(srv.permit("alice", "openai", "", 0).await, "model");
    invalid(
        srv.feedback("openai", "gpt-4o", 42, &[], None).await,
        "status",
    );
    srv.shutdown().await;
}

/// No identity, a token that is not a bearer token, a bad signature or an
/// expired token: UNAUTHENTICATED, checked before anything is decided.
#[tokio::test]
async fn no_verified_identity_is_unauthenticated() {
    let srv = Server::start(&memory_config()).await;
    let mut c = srv.client();
    let msg = || proto::AdmitRunRequest {
        invocation_id: "run".into(),
        ..Default::default()
    };
    let bad_sig = format!(
        "Bearer {}",
        token_with(
            "alice",
            "another-secret-0123456789abcdefgh",
            T0 / 1_000 + 3_600
        )
    );
    let expired = format!("Bearer {}", token_with("alice", SECRET, T0 / 1_000 - 3_600));
    let basic = "Basic YWxpY2U6cGFzc3dvcmQ=".to_owned();
    for auth in [
        None,
        Some(basic.as_str()),
        Some(bad_sig.as_str()),
        Some(expired.as_str()),
        Some("Bearer nonsense"),
    ] {
        let (s, _) = refused(
            c.admit_run(with_auth(auth, msg())).await,
            Code::Unauthenticated,
            "unauthorized",
        );
        assert_eq!(hint(&s), None);
    }
    // Even invalid input is refused for identity first.
    let r = c
        .admit_run(with_auth(None, proto::AdmitRunRequest::default()))
        .await;
    refused(r, Code::Unauthenticated, "unauthorized");
    // Nothing was admitted: alice's five turns are all there.
    for i in 0..5 {
        srv.admit("alice", &format!("r{i}"))
            .await
            .expect("admitted");
        srv.release("alice", &format!("r{i}")).await;
    }
    srv.shutdown().await;
}

/// In `trusted_header` mode the user is the header the proxy in front set,
/// read from the call's metadata as over HTTP; without it,
/// UNAUTHENTICATED.
#[tokio::test]
async fn the_trusted_header_identifies_the_user_over_grpc() {
    let text = memory_config().replace(
        &format!(
            "mode = \"jwt\"\nalgorithm = \"HS256\"\nsecret = \"{SECRET}\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\""
        ),
        "mode = \"trusted_header\"\nheader = \"x-user\"\ntrusted_proxies = [\"127.0.0.1\"]",
    );
    assert!(text.contains("trusted_header"), "{text}");
    let srv = Server::start(&text).await;
    let mut c = srv.client();
    let admit = |user: Option<&str>, inv: &str| {
        let mut r = Request::new(proto::AdmitRunRequest {
            invocation_id: inv.into(),
            ..Default::default()
        });
        if let Some(u) = user {
            r.metadata_mut().insert("x-user", u.parse().expect("ascii"));
        }
        r
    };
    let release = |user: Option<&str>, inv: &str| {
        let mut r = Request::new(proto::ReleaseRunRequest {
            invocation_id: inv.into(),
            session_id: None,
        });
        if let Some(u) = user {
            r.metadata_mut().insert("x-user", u.parse().expect("ascii"));
        }
        r
    };
    for i in 0..5 {
        let inv = format!("r{i}");
        c.admit_run(admit(Some("carol"), &inv))
            .await
            .expect("admitted");
        refused(
            c.release_run(release(None, &inv)).await,
            Code::Unauthenticated,
            "unauthorized",
        );
        let released = c.release_run(release(Some("carol"), &inv)).await;
        assert!(released.expect("released").into_inner().released);
    }
    // carol's five turns are spent; dave has his own.
    let (s, _) = refused(
        c.admit_run(admit(Some("carol"), "r5")).await,
        Code::ResourceExhausted,
        "turn_rate",
    );
    assert_eq!(hint(&s), Some(3_000));
    c.admit_run(admit(Some("dave"), "r5")).await.expect("dave");
    refused(
        c.admit_run(admit(None, "r6")).await,
        Code::Unauthenticated,
        "unauthorized",
    );
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Store outage

/// With Redis down under fail_closed, every store-backed call is
/// UNAVAILABLE `store_unavailable`, counted as a store error; identity is
/// still checked first.
#[tokio::test]
async fn fail_closed_is_unavailable_while_redis_is_down() {
    let mut redis = RedisServer::start().expect("redis-server");
    let store = fail_closed_store(&redis.url());
    let srv = Server::start(&config_text(64, 2, &store)).await;
    let mut c = srv.client();
    srv.admit("alice", "r1")
        .await
        .expect("admitted while Redis is up");

    redis.stop();
    let (s, _) = refused(
        srv.admit("alice", "r2").await,
        Code::Unavailable,
        "store_unavailable",
    );
    assert_eq!(hint(&s), None);
    refused(
        srv.reserve("alice", "r1", 1).await,
        Code::Unavailable,
        "store_unavailable",
    );
    let r = c
        .acquire_session_lease(req(
            "alice",
            proto::AcquireSessionLeaseRequest {
                session_id: "s".into(),
                holder: "h".into(),
                ttl_ms: 1_000,
            },
        ))
        .await;
    refused(r, Code::Unavailable, "store_unavailable");
    // A release is a close: journalled and answered pending (SPEC §6).
    let r = c
        .release_run(req(
            "alice",
            proto::ReleaseRunRequest {
                invocation_id: "r1".into(),
                session_id: None,
            },
        ))
        .await
        .expect("pending, not refused")
        .into_inner();
    assert!(!r.released && r.pending, "{r:?}");
    let r = c
        .admit_run(with_auth(None, proto::AdmitRunRequest::default()))
        .await;
    refused(r, Code::Unauthenticated, "unauthorized");

    let text = srv.metrics().await;
    assert_eq!(
        metric(&text, "tollgate_store_errors_total"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"tollgate_grpc_requests_total{method="AdmitRun",code="UNAVAILABLE"}"#
        ),
        Some(1.0),
        "{text}"
    );
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// One limiter, two transports

/// One scenario over HTTP and gRPC on the same limiter: turns taken over
/// either count against the same bucket, and the refusal is the same over
/// both (code, limit, hint, message); a reservation made over gRPC settles
/// over HTTP.
#[tokio::test]
async fn http_and_grpc_give_the_same_outcomes_on_one_limiter() {
    let srv = Server::start(&memory_config()).await;
    for i in 1..=5 {
        let inv = format!("turn-{i}");
        if i % 2 == 0 {
            let (status, _) = srv
                .http_post("alice", "/v1/runs", json!({"invocation_id": inv}))
                .await;
            assert_eq!(status, 200);
        } else {
            srv.admit("alice", &inv).await.expect("admitted");
        }
        assert!(srv.release("alice", &inv).await, "released over gRPC");
    }
    srv.clock.advance(1_000);
    let (status, body) = srv
        .http_post("alice", "/v1/runs", json!({"invocation_id": "turn-6"}))
        .await;
    assert_eq!(status, 429);
    let s = limited(srv.admit("alice", "turn-6").await, "turn_rate", 2_000);
    assert_eq!(body["error"], "turn_rate");
    assert_eq!(body["limit"], "turn_rate");
    assert_eq!(body["retry_after_ms"], 2_000);
    assert_eq!(body["message"].as_str(), Some(s.message()));

    // Invalid input: the same field and message.
    let (status, body) = srv
        .http_post(
            "alice",
            "/v1/tokens/reserve",
            json!({"invocation_id": "run", "estimate": 9_007_199_254_740_993u64}),
        )
        .await;
    assert_eq!(status, 400);
    let r = srv.reserve("alice", "run", 9_007_199_254_740_993).await;
    let (s, info) = refused(r, Code::InvalidArgument, "invalid_request");
    assert_eq!(body["field"], info["field"]);
    assert_eq!(body["message"].as_str(), Some(s.message()));

    // A reservation made over gRPC settles over HTTP, and the repeat over
    // gRPC answers the same balance.
    let r = srv.reserve("alice", "run", 6_000).await.expect("reserve");
    let (status, body) = srv
        .http_post(
            "alice",
            "/v1/tokens/settle",
            json!({"reservation_id": r.reservation_id, "actual": 500}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["balance"], CAPACITY - 500);
    assert_eq!(
        srv.settle("alice", &r.reservation_id, 500).await.ok(),
        Some(CAPACITY as i64 - 500)
    );
    srv.shutdown().await;
}

/// A plan in shadow mode admits what it would refuse, over gRPC too, and
/// says so in `x-tollgate-shadow-denied`.
#[tokio::test]
async fn shadow_mode_admits_and_reports_the_limit_in_metadata() {
    let srv = Server::start(&memory_config()).await;
    let mut c = srv.client();
    let admit = |inv: &str| {
        req(
            "shadowy",
            proto::AdmitRunRequest {
                invocation_id: inv.into(),
                ..Default::default()
            },
        )
    };
    let r = c.admit_run(admit("a")).await.expect("admitted");
    assert!(r.metadata().get("x-tollgate-shadow-denied").is_none());
    let r = c
        .admit_run(admit("b"))
        .await
        .expect("admitted in shadow mode");
    assert_eq!(
        r.metadata()
            .get("x-tollgate-shadow-denied")
            .and_then(|v| v.to_str().ok()),
        Some("turn_rate")
    );
    let text = srv.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="admit",limit="turn_rate",outcome="shadow_denied",plan="shadow"}"#
        ),
        Some(1.0),
        "{text}"
    );
    srv.shutdown().await;
}

/// A `wait` reservation whose call is cancelled while the server waits is
/// refunded, and the call is counted CANCELLED.
#[tokio::test]
async fn a_cancelled_wait_reservation_is_refunded() {
    let srv = Server::start(&memory_config()).await;
    let drained = srv.reserve("alice", "run", CAPACITY).await.expect("drain");
    assert_eq!(
        srv.settle("alice", &drained.reservation_id, CAPACITY)
            .await
            .ok(),
        Some(0)
    );
    let mut c = srv.client();
    let waiting = tokio::spawn(async move {
        c.reserve_tokens(req(
            "alice",
            proto::ReserveTokensRequest {
                invocation_id: "run".into(),
                estimate: 1_000,
                wait: true,
                request_id: None,
                ..Default::default()
            },
        ))
        .await
    });
    srv.wait_for_sleepers(1).await;
    assert_eq!(
        srv.settle("alice", &drained.reservation_id, CAPACITY)
            .await
            .ok(),
        Some(-1_000),
        "charged while it waits"
    );
    waiting.abort();
    let _ = waiting.await;
    let id = drained.reservation_id.clone();
    let refunded = wait_until(10, || {
        let (srv, id) = (&srv, &id);
        async move { srv.settle("alice", id, CAPACITY).await.ok() == Some(0) }
    })
    .await;
    assert!(refunded, "the cancelled reservation is refunded");
    let counted = wait_until(10, || {
        let srv = &srv;
        async move {
            metric(
                &srv.metrics().await,
                r#"tollgate_grpc_requests_total{method="ReserveTokens",code="CANCELLED"}"#,
            ) == Some(1.0)
        }
    })
    .await;
    assert!(counted, "{}", srv.metrics().await);
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Metrics, reload, config

/// gRPC calls are counted by method and code; their decisions are counted
/// with the HTTP ones (`tollgate_decisions_total`), and no label carries a
/// user id.
#[tokio::test]
async fn grpc_calls_and_their_decisions_are_counted() {
    let srv = Server::start(&memory_config()).await;
    for i in 1..=5 {
        let inv = format!("t{i}");
        srv.admit("user-secret-id", &inv).await.expect("admitted");
        if i < 5 {
            assert!(srv.release("user-secret-id", &inv).await);
        }
    }
    srv.admit("user-secret-id", "t6")
        .await
        .expect_err("turn_rate");
    srv.admit("user-secret-id", "").await.expect_err("invalid");
    srv.reserve("user-secret-id", "t1", 100)
        .await
        .expect("reserve");
    let text = srv.metrics().await;
    for (series, n) in [
        (
            r#"tollgate_grpc_requests_total{method="AdmitRun",code="OK"}"#,
            5.0,
        ),
        (
            r#"tollgate_grpc_requests_total{method="AdmitRun",code="RESOURCE_EXHAUSTED"}"#,
            1.0,
        ),
        (
            r#"tollgate_grpc_requests_total{method="AdmitRun",code="INVALID_ARGUMENT"}"#,
            1.0,
        ),
        (
            r#"tollgate_grpc_requests_total{method="ReserveTokens",code="OK"}"#,
            1.0,
        ),
        (
            r#"tollgate_decisions_total{op="admit",limit="none",outcome="allowed",plan="support"}"#,
            5.0,
        ),
        (
            r#"tollgate_decisions_total{op="admit",limit="turn_rate",outcome="denied",plan="support"}"#,
            1.0,
        ),
        (
            r#"tollgate_decisions_total{op="reserve",limit="none",outcome="allowed",plan="support"}"#,
            1.0,
        ),
        ("tollgate_turns_in_flight", 1.0),
    ] {
        assert_eq!(metric(&text, series), Some(n), "{series} in\n{text}");
    }
    assert!(!text.contains("user-secret-id"), "no user id in a label");
    srv.shutdown().await;
}

/// A reload (here `POST /admin/reload`) is seen over gRPC: the same App.
#[tokio::test]
async fn a_reload_is_seen_over_grpc() {
    let dir = TempDir::new();
    let file = dir.0.join("tollgate.toml");
    std::fs::write(&file, config_text(64, 1, "")).expect("write");
    let srv = Server::start_config(Config::load(&file).expect("valid")).await;
    srv.admit("alice", "r1").await.expect("r1");
    limited(srv.admit("alice", "r2").await, "concurrency", 1_000);

    std::fs::write(&file, config_text(64, 2, "")).expect("rewrite");
    let resp = srv
        .web
        .post(format!("http://{}/admin/reload", srv.http))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("reload");
    assert_eq!(resp.status().as_u16(), 200);
    srv.admit("alice", "r2").await.expect("two runs now");
    limited(srv.admit("alice", "r3").await, "concurrency", 1_000);
    srv.shutdown().await;
}

/// `grpc_listen`: `serve` binds it and reports it; the embedded default
/// turns it on at 127.0.0.1:8788; a bad value or the HTTP port is refused
/// naming the field.
#[tokio::test]
async fn grpc_listen_is_bound_by_serve_and_validated() {
    let d = Config::default_config().expect("default");
    assert_eq!(
        d.grpc_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:8788")
    );
    let none = Config::parse(&memory_config(), "t", std::path::Path::new(".")).expect("valid");
    assert_eq!(none.grpc_listen, None, "absent: no gRPC server");

    let text = memory_config().replace(
        "listen = \"127.0.0.1:0\"",
        "listen = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"",
    );
    let config = Config::parse(&text, "t", std::path::Path::new(".")).expect("valid");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (tx, rx) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve(
        config,
        listener,
        Some(Arc::new(FakeClock::new(T0))),
        move |r| {
            let _ = tx.send(r.grpc_addr);
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let addr = rx.await.expect("started").expect("a gRPC address");
    assert_ne!(addr.port(), 0);
    let mut c = TollgateClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    c.admit_run(req(
        "alice",
        proto::AdmitRunRequest {
            invocation_id: "r".into(),
            ..Default::default()
        },
    ))
    .await
    .expect("served");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops")
        .expect("task")
        .expect("ran cleanly");

    for (value, why) in [
        ("not an address", "not an address"),
        ("127.0.0.1:8787", "own port"),
    ] {
        let text = memory_config().replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:8787\"\ngrpc_listen = \"{value}\""),
        );
        let e = Config::parse(&text, "t", std::path::Path::new(".")).expect_err("refused");
        assert!(
            e.errors
                .iter()
                .any(|f| f.path == "grpc_listen" && f.reason.contains(why)),
            "{e}"
        );
    }
}

// ---------------------------------------------------------------------------
// What a client needs from the plan

#[tokio::test]
async fn admit_answer_carries_the_plan_a_client_needs() {
    let srv = Server::start(&memory_config()).await;
    let r = srv.admit("alice", "run-a").await.expect("admit");
    assert_eq!(r.lease_expires_at_ms, T0 + 120_000);
    assert_eq!(r.lease_ttl_ms, 120_000);
    assert_eq!(r.estimate_tokens, 1_000);
    assert_eq!(r.max_wait_ms, 2_000);
    assert_eq!(r.max_llm_calls, 500);
    let r = srv.admit("patient", "run-p").await.expect("admit");
    assert_eq!(r.max_wait_ms, 6_000);
    let r = srv.admit("looper", "run-l").await.expect("admit");
    assert_eq!(r.max_llm_calls, 2);
    srv.shutdown().await;
}

/// A configured budget over gRPC and HTTP on one limiter: plan
/// "support" with 10,000 tokens a day and $0.10 a month in UTC, `gpt-4o`
/// at $2.50 / $10.00 per million input / output tokens. T0 is 2023-11-14
/// 22:13:20 UTC: the day resets at 2023-11-15 00:00, the month at
/// 2023-12-01 00:00.
#[tokio::test]
async fn a_configured_budget_over_grpc_and_http() {
    let text = format!(
        "currency = \"USD\"\n{}\n[prices.\"openai:gpt-4o\"]\ninput = \"2.50\"\noutput = \"10.00\"\n\n\
         [plans.support.budgets]\ndaily = {{ tokens = 10000 }}\nmonthly = {{ cost = \"0.10\" }}\n",
        memory_config()
    );
    let srv = Server::start(&text).await;
    let (midnight, month_end) = (1_700_006_400_000_u64, 1_701_388_800_000_u64);
    srv.admit("alice", "run").await.expect("admitted");
    // A reservation of `estimate` tokens of `model` for alice's run, over
    // gRPC (with a split) and over HTTP.
    let grpc = |estimate: u64, model: &str, split: Option<(u64, u64)>| {
        let mut c = srv.client();
        let r = req(
            "alice",
            proto::ReserveTokensRequest {
                invocation_id: "run".into(),
                estimate,
                model: Some(model.into()),
                input_tokens: split.map(|s| s.0),
                output_tokens: split.map(|s| s.1),
                ..Default::default()
            },
        );
        async move { c.reserve_tokens(r).await }
    };
    let http = |estimate: u64| {
        srv.http_post(
            "alice",
            "/v1/tokens/reserve",
            json!({"invocation_id": "run", "estimate": estimate, "model": "openai:gpt-4o"}),
        )
    };
    // gRPC: 5,000 input + 1,000 output tokens estimated: $0.0125 + $0.01.
    let r = grpc(6_000, "openai:gpt-4o", Some((5_000, 1_000)))
        .await
        .expect("reserved")
        .into_inner();
    // HTTP: the usage, 4,000 input + 2,000 output: $0.01 + $0.02.
    let (status, body) = srv
        .http_post(
            "alice",
            "/v1/tokens/settle",
            json!({"reservation_id": r.reservation_id, "actual": 6_000,
                   "input_tokens": 4_000, "output_tokens": 2_000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let view = srv
        .web
        .get(format!("http://{}/admin/users/alice", srv.http))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        view["budgets"],
        json!([
            {"window": "daily", "unit": "tokens", "limit": 10_000, "granted": 0, "spent": 6_000, "resets_at_ms": midnight},
            {"window": "monthly", "unit": "micros", "currency": "USD", "limit": 100_000, "granted": 0, "spent": 30_000, "resets_at_ms": month_end},
        ])
    );
    // HTTP: 4,000 unsplit tokens at the higher price, $0.04: the day's
    // tokens exactly spent, $0.07 of the month.
    let (status, body) = http(4_000).await;
    assert_eq!(status, 200, "{body}");
    // One token more: refused until midnight, on both transports alike.
    let r = grpc(1, "openai:gpt-4o", None).await;
    let (s, info) = refused(r, Code::ResourceExhausted, "budget_exhausted");
    assert_eq!(info["limit"], "budget_daily", "{s:?}");
    assert_eq!(info["resets_at_ms"], midnight.to_string(), "{s:?}");
    assert_eq!(hint(&s), Some(midnight - T0), "{s:?}");
    let (status, body) = http(1).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"], "budget_exhausted");
    assert_eq!(body["limit"], "budget_daily");
    assert_eq!(body["resets_at_ms"], midnight);
    assert_eq!(body["retry_after_ms"], midnight - T0);
    assert_eq!(body["message"].as_str(), Some(s.message()));
    // A model with no price, against the cost budget: invalid, field model.
    invalid(grpc(1, "openai:o3", None).await, "model");
    // After midnight the day's tokens are back; the month's money is not.
    srv.clock.advance(midnight - T0);
    let day_token = token_with("alice", SECRET, midnight / 1_000 + 3_600);
    let post = |estimate: u64| {
        srv.web
            .post(format!("http://{}/v1/tokens/reserve", srv.http))
            .bearer_auth(&day_token)
            .json(&json!({"invocation_id": "run", "estimate": estimate, "model": "openai:gpt-4o"}))
            .send()
    };
    let r = post(3_000).await.unwrap();
    let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_eq!(status, 200, "$0.03 fits the $0.03 left: {body}");
    let r = post(1).await.unwrap();
    let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["limit"], "budget_monthly");
    assert_eq!(body["resets_at_ms"], month_end);
    srv.shutdown().await;
}
