//! The sidecar's HTTP/JSON API (SPEC §8) over a real socket.
//!
//! Every test starts `tollgate_server::serve` on `127.0.0.1:0` with a config
//! parsed from TOML, JWT identity (HS256, issuer and audience set; tokens
//! minted here with `jsonwebtoken`) and a [`FakeClock`] at [`T0`], talks to
//! it with `reqwest` (or a raw TCP stream where a disconnect must be exact),
//! and shuts it down at the end. Time only moves when a test advances the
//! fake clock; the only real waiting is for real concurrency (a request that
//! is parked in the server, a killed `redis-server`).
//!
//! Covered: SPEC §7 examples 1, 3 and 4 to the exact number; every JWT
//! failure → 401; a body user id is ignored; the refusal body and headers of
//! every non-provider row of §8; idempotent release, settle and refund;
//! fail_closed → 503 with Redis killed; session keys namespaced by user;
//! runs holding a session lease; refund when a `wait=true` client
//! disconnects; the replica in-flight cap; bad input → 400 naming the field;
//! `/openapi.json` matching the routes; the embedded default config and
//! `tollgate check-config`.

use std::net::SocketAddr;
use std::path::Path;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::FakeClock;
use tollgate_server::config::Config;
use tollgate_testkit::T0;
use tollgate_testkit::redis::{RedisServer, shared_url, wait_until};

use common::{AUDIENCE, ISSUER, Resp, Spawned, TempDir, fail_closed_store, send_with};

mod common;

// ---------------------------------------------------------------------------
// Helpers

/// The HS256 secret of the test servers (at least 32 bytes).
const SECRET: &str = "tollgate-http-test-secret-0123456789abcdef";

/// 1 minute of token refill at 60,000 tokens/min, exact: 1 token per ms.
const CAPACITY: i64 = 60_000;

/// The SPEC §7 "support" plan for everyone; user `patient` waits up to
/// 6,000 ms for tokens; user `looper` may make 2 model calls per run.
fn config_text(max_in_flight: usize, store: &str, identity: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
max_in_flight = {max_in_flight}
default_plan = "support"

{store}

[identity]
{identity}

[plans.support]
turns = {{ amount = 20, period_ms = 60000, burst = 5 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 60000 }}
concurrent_runs = 2
max_wait_ms = 2000

[plans.patient]
turns = {{ amount = 20, period_ms = 60000, burst = 5 }}
tokens = {{ amount = 60000, period_ms = 60000, burst = 60000 }}
concurrent_runs = 2
max_wait_ms = 6000

[users]
patient = "patient"

[overrides.looper]
max_llm_calls = 2
"#
    )
}

fn hs256_identity() -> String {
    format!(
        r#"mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}""#
    )
}

/// The default test config: memory store, HS256 identity.
fn memory_config(max_in_flight: usize) -> String {
    config_text(max_in_flight, "", &hs256_identity())
}

/// A token for `user` signed with `key` and `alg`, with `claims` over the
/// valid defaults (`null` removes a claim).
fn sign(alg: Algorithm, key: &EncodingKey, user: &str, claims: Value) -> String {
    let mut c = json!({
        "sub": user,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": T0 / 1_000,
        "exp": T0 / 1_000 + 3_600,
    });
    let obj = c.as_object_mut().expect("object");
    for (k, v) in claims.as_object().expect("claims object") {
        if v.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.clone(), v.clone());
        }
    }
    jsonwebtoken::encode(&Header::new(alg), &c, key).expect("sign")
}

/// A valid token for `user`: HS256 with the server's secret, expiring an
/// hour after the fake clock's start.
fn token(user: &str) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        user,
        json!({}),
    )
}

fn bearer(user: &str) -> String {
    format!("Bearer {}", token(user))
}

fn b64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

impl Resp {
    /// Whether this is a 400 `invalid_request` naming `field`, with a
    /// message.
    fn is_invalid(&self, field: &str) -> bool {
        self.status == StatusCode::BAD_REQUEST
            && self.body["error"] == "invalid_request"
            && self.body["field"] == field
            && self.body["message"].as_str().is_some_and(|m| !m.is_empty())
    }
}

/// A running server on a fake clock.
struct Server {
    addr: SocketAddr,
    clock: FakeClock,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    /// Serves `toml` (relative paths resolved against `base`).
    async fn start_in(toml: &str, base: &Path) -> Self {
        let config = Config::parse(toml, "test", base).expect("valid test config");
        let Spawned {
            addr,
            clock,
            client,
            stop,
            task,
        } = common::spawn(config).await;
        Self {
            addr,
            clock,
            client,
            stop,
            task,
        }
    }

    async fn start(toml: &str) -> Self {
        Self::start_in(toml, Path::new(".")).await
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends a request with an optional `Authorization` value and raw body.
    async fn send(
        &self,
        method: Method,
        path: &str,
        auth: Option<&str>,
        body: Option<String>,
    ) -> Resp {
        send_with(&self.client, method, &self.url(path), auth, body.as_deref()).await
    }

    /// `POST path` as `user` with a JSON body.
    async fn post(&self, user: &str, path: &str, body: Value) -> Resp {
        self.send(
            Method::POST,
            path,
            Some(&bearer(user)),
            Some(body.to_string()),
        )
        .await
    }

    /// `DELETE path` as `user`.
    async fn delete(&self, user: &str, path: &str) -> Resp {
        self.send(Method::DELETE, path, Some(&bearer(user)), None)
            .await
    }

    async fn get(&self, path: &str) -> Resp {
        self.send(Method::GET, path, None, None).await
    }

    /// Admits run `inv` for `user`.
    async fn admit(&self, user: &str, inv: &str) -> Resp {
        self.post(user, "/v1/runs", json!({ "invocation_id": inv }))
            .await
    }

    /// Releases run `inv` of `user`; answers `released`.
    async fn release(&self, user: &str, inv: &str) -> bool {
        let r = self.delete(user, &format!("/v1/runs/{}", enc(inv))).await;
        r.ok()["released"].as_bool().expect("released is a bool")
    }

    /// Reserves `estimate` tokens for `inv` (no server-side wait).
    async fn reserve(&self, user: &str, inv: &str, estimate: u64) -> Resp {
        self.post(
            user,
            "/v1/tokens/reserve",
            json!({ "invocation_id": inv, "estimate": estimate }),
        )
        .await
    }

    async fn settle(&self, user: &str, id: &str, actual: u64) -> Resp {
        self.post(
            user,
            "/v1/tokens/settle",
            json!({ "reservation_id": id, "actual": actual }),
        )
        .await
    }

    async fn refund(&self, user: &str, id: &str) -> Resp {
        self.post(user, "/v1/tokens/refund", json!({ "reservation_id": id }))
            .await
    }

    /// Waits (real time: the request runs concurrently) until `n` sleeps
    /// are parked on the fake clock.
    async fn wait_for_sleepers(&self, n: usize) {
        common::wait_for_sleepers(&self.clock, n).await;
    }

    /// Stops the server gracefully and checks it ended cleanly.
    async fn shutdown(self) {
        drop(self.client);
        common::shutdown(self.stop, self.task).await;
    }
}

/// The current token balance of `user`, read without changing it: a repeat
/// settle of the closed reservation `closed` answers the balance and
/// changes nothing.
async fn balance(srv: &Server, user: &str, closed: &str) -> i64 {
    let r = srv.settle(user, closed, 0).await;
    r.ok()["balance"].as_i64().expect("balance")
}

// ---------------------------------------------------------------------------
// SPEC §7 worked examples

#[tokio::test]
async fn example_1_turn_burst_then_denied_with_exact_hint() {
    let srv = Server::start(&memory_config(64)).await;
    for i in 1..=5 {
        let inv = format!("turn-{i}");
        let r = srv.admit("alice", &inv).await;
        assert_eq!(r.ok()["lease_expires_at_ms"], T0 + 120_000, "turn {i}");
        assert!(r.body.get("session").is_none(), "{r:?}");
        assert!(srv.release("alice", &inv).await);
    }
    srv.clock.advance(1_000);
    for i in 6..=10 {
        let r = srv.admit("alice", &format!("turn-{i}")).await;
        r.limited("turn_rate", 2_000);
        assert_eq!(r.header("retry-after"), Some("2"));
    }
    srv.shutdown().await;
}

/// A reserve may name its model and split its estimate, a settle its usage
/// (they price a call for cost budgets); the token rate counts `estimate`
/// and `actual` whatever the split says. A part past 2^53 is refused with
/// its field, and so is a model id with a control character.
#[tokio::test]
async fn reserve_and_settle_take_a_model_and_a_token_split() {
    let srv = Server::start(&memory_config(64)).await;
    let r = srv
        .post(
            "alice",
            "/v1/tokens/reserve",
            json!({"invocation_id": "run", "estimate": 6_000, "model": "openai:gpt-4o",
                   "input_tokens": 5_000, "output_tokens": 500}),
        )
        .await;
    let id = r.ok()["reservation_id"].as_str().expect("id").to_owned();
    let r = srv
        .post(
            "alice",
            "/v1/tokens/settle",
            json!({"reservation_id": id, "actual": 7_000, "input_tokens": 4_000,
                   "output_tokens": 2_000, "cached_input_tokens": 1_000}),
        )
        .await;
    assert_eq!(
        r.ok()["balance"],
        CAPACITY - 7_000,
        "the rate counts actual"
    );
    // A model id that names no "provider:model" is accepted (it has no
    // price; found by the API fuzzer: "0").
    for model in ["0", "gpt-4o", ":x", "x:"] {
        let r = srv
            .post(
                "alice",
                "/v1/tokens/reserve",
                json!({"invocation_id": "run2", "estimate": 1, "model": model}),
            )
            .await;
        r.ok();
    }
    for (body, field) in [
        (
            json!({"invocation_id": "run", "estimate": 1, "output_tokens": 9_007_199_254_740_993_u64}),
            "output_tokens",
        ),
        (
            json!({"invocation_id": "run", "estimate": 1, "model": "gpt\u{7}4o"}),
            "model",
        ),
    ] {
        let r = srv.post("alice", "/v1/tokens/reserve", body).await;
        assert_eq!(r.refused(400, "invalid_request")["field"], field);
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn example_3_token_wait_boundary() {
    let srv = Server::start(&memory_config(64)).await;
    // Drain alice's bucket: the whole capacity, no wait.
    let r = srv.reserve("alice", "run-1", CAPACITY as u64).await;
    assert_eq!(r.ok()["wait_ms"], 0);
    let drained = r.body["reservation_id"].as_str().expect("id").to_owned();
    // Close it at its estimate (no change) so its repeats read the balance.
    let r = srv.settle("alice", &drained, CAPACITY as u64).await;
    assert_eq!(r.ok()["balance"], 0);

    // 6,000 tokens need 6,000 ms > max wait 2,000 ms: refused, hint 4,000.
    for _ in 0..2 {
        let r = srv.reserve("alice", "run-1", 6_000).await;
        r.limited("token_rate", 4_000);
        assert_eq!(r.header("retry-after"), Some("4"));
    }
    // ... and it took nothing.
    assert_eq!(balance(&srv, "alice", &drained).await, 0);

    // With max wait 6,000 ms (user `patient`) the same call is granted
    // with a 6,000 ms wait: the boundary is inclusive.
    let r = srv.reserve("patient", "run-p", CAPACITY as u64).await;
    assert_eq!(r.ok()["wait_ms"], 0);
    let r = srv.reserve("patient", "run-p", 6_000).await;
    assert_eq!(r.ok()["wait_ms"], 6_000);
    assert!(r.header("retry-after").is_none());
    srv.shutdown().await;
}

#[tokio::test]
async fn example_4_concurrency_release_and_expiry() {
    let srv = Server::start(&memory_config(64)).await;
    srv.admit("alice", "r1").await.ok();
    srv.admit("alice", "r2").await.ok();
    // Both buckets have room; the third run is denied for concurrency:
    // hint min(earliest expiry 120,000, concurrency_retry 1,000).
    let r = srv.admit("alice", "r3").await;
    r.limited("concurrency", 1_000);
    assert_eq!(r.header("retry-after"), Some("1"));
    // After one run releases, the next is admitted.
    assert!(srv.release("alice", "r1").await);
    srv.admit("alice", "r3").await.ok();
    // Nothing was charged to the turn bucket by the denial: five turns
    // (r1, r2, r3, r4, r5) fit the burst of 5.
    assert!(srv.release("alice", "r2").await);
    assert!(srv.release("alice", "r3").await);
    srv.admit("alice", "r4").await.ok();
    srv.admit("alice", "r5").await.ok();

    // r5 is abandoned (never released or renewed); r4 renews.
    srv.clock.advance(60_000);
    let r = srv.post("alice", "/v1/runs/r4/renew", json!({})).await;
    assert_eq!(r.ok()["lease_expires_at_ms"], T0 + 180_000);
    // Just before r5's lease expires the turn is still denied for
    // concurrency, with the exact remaining time as the hint.
    srv.clock.advance(59_999);
    let r = srv.admit("alice", "r6").await;
    r.limited("concurrency", 1);
    // Once it expires (lease_ttl 120,000 ms) the turn is admitted.
    srv.clock.advance(1);
    srv.admit("alice", "r6").await.ok();
    // The abandoned run's lease is gone.
    let r = srv.post("alice", "/v1/runs/r5/renew", json!({})).await;
    r.refused(404, "lease_lost");
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Identity

#[tokio::test]
async fn every_jwt_failure_is_401_with_a_json_error() {
    let srv = Server::start(&memory_config(64)).await;
    let hs = |secret: &[u8], claims: Value| {
        format!(
            "Bearer {}",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(secret),
                "alice",
                claims
            )
        )
    };
    let alg_none = {
        let head = b64url(br#"{"alg":"none","typ":"JWT"}"#);
        let claims =
            json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": T0 / 1_000 + 3_600});
        let body = b64url(claims.to_string().as_bytes());
        format!("Bearer {head}.{body}.")
    };
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no header", None, "missing credentials"),
        (
            "not bearer",
            Some("Basic YWxpY2U6c2VjcmV0".to_owned()),
            "Bearer scheme",
        ),
        ("empty bearer", Some("Bearer ".to_owned()), "malformed"),
        ("garbage", Some("Bearer not-a-jwt".to_owned()), "malformed"),
        (
            "garbage parts",
            Some("Bearer a.b.c".to_owned()),
            "malformed",
        ),
        (
            "expired",
            Some(hs(SECRET.as_bytes(), json!({"exp": T0 / 1_000 - 3_600}))),
            "expired",
        ),
        (
            "no exp",
            Some(hs(SECRET.as_bytes(), json!({"exp": null}))),
            "expiry",
        ),
        (
            "wrong key",
            Some(hs(b"another-secret-of-at-least-32-bytes!!", json!({}))),
            "signature",
        ),
        (
            "wrong audience",
            Some(hs(SECRET.as_bytes(), json!({"aud": "someone-else"}))),
            "audience",
        ),
        (
            "no audience",
            Some(hs(SECRET.as_bytes(), json!({"aud": null}))),
            "audience",
        ),
        (
            "wrong issuer",
            Some(hs(SECRET.as_bytes(), json!({"iss": "https://evil.test"}))),
            "issuer",
        ),
        (
            "no subject",
            Some(hs(SECRET.as_bytes(), json!({"sub": null}))),
            "sub",
        ),
        ("alg none", Some(alg_none), "algorithm"),
    ];
    // A valid token works on every route used below (the control).
    let r = srv.admit("alice", "control").await;
    r.ok();
    for (name, auth, says) in &cases {
        for (method, path, body) in [
            (
                Method::POST,
                "/v1/runs",
                Some(json!({"invocation_id": "x"})),
            ),
            (Method::DELETE, "/v1/runs/x", None),
            (
                Method::POST,
                "/v1/tokens/reserve",
                Some(json!({"invocation_id": "x", "estimate": 1})),
            ),
            (
                Method::POST,
                "/v1/sessions/s/lease",
                Some(json!({"holder": "h", "ttl_ms": 1000})),
            ),
        ] {
            let r = srv
                .send(
                    method.clone(),
                    path,
                    auth.as_deref(),
                    body.map(|b| b.to_string()),
                )
                .await;
            r.refused(401, "unauthorized");
            let msg = r.body["message"].as_str().unwrap_or_default();
            assert!(
                msg.to_lowercase().contains(&says.to_lowercase()),
                "{name} on {method} {path}: {msg:?} should mention {says:?}"
            );
            assert_eq!(r.body.as_object().map(|o| o.len()), Some(2), "{r:?}");
        }
    }
    // Nothing the refused requests did was charged: alice's second run fits.
    srv.admit("alice", "control-2").await.ok();
    srv.shutdown().await;
}

fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn rs256_server_refuses_an_hs256_token_keyed_with_its_public_key() {
    let dir = TempDir::new();
    let private = dir.path().join("private.pem");
    let public = dir.path().join("public.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private.to_str().expect("utf-8 path"),
    ]);
    openssl(&[
        "pkey",
        "-in",
        private.to_str().expect("utf-8 path"),
        "-pubout",
        "-out",
        public.to_str().expect("utf-8 path"),
    ]);
    let identity = format!(
        r#"mode = "jwt"
algorithm = "RS256"
public_key_file = "public.pem"
issuer = "{ISSUER}"
audience = "{AUDIENCE}""#
    );
    let srv = Server::start_in(&config_text(64, "", &identity), dir.path()).await;
    let admit = |auth: String| {
        let srv = &srv;
        async move {
            srv.send(
                Method::POST,
                "/v1/runs",
                Some(&auth),
                Some(json!({"invocation_id": "x"}).to_string()),
            )
            .await
        }
    };

    // The control: a real RS256 token from the private key is accepted.
    let private_pem = std::fs::read(&private).expect("private key");
    let rs = EncodingKey::from_rsa_pem(&private_pem).expect("rsa key");
    let r = admit(format!(
        "Bearer {}",
        sign(Algorithm::RS256, &rs, "alice", json!({}))
    ))
    .await;
    r.ok();

    // Algorithm confusion: HS256 "signed" with the public PEM as the secret.
    let public_pem = std::fs::read(&public).expect("public key");
    let confused = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&public_pem),
        "alice",
        json!({}),
    );
    let r = admit(format!("Bearer {confused}")).await;
    r.refused(401, "unauthorized");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("algorithm"),
        "{r:?}"
    );
    // HS256 with the server's HS secret means nothing here either.
    let r = admit(bearer("alice")).await;
    r.refused(401, "unauthorized");
    srv.shutdown().await;
}

#[tokio::test]
async fn a_user_id_in_the_body_is_ignored() {
    let srv = Server::start(&memory_config(64)).await;
    // Alice claims to be bob in every body field she can think of.
    for i in 1..=5 {
        let inv = format!("x{i}");
        let r = srv
            .post(
                "alice",
                "/v1/runs",
                json!({"invocation_id": inv, "user": "bob", "user_id": "bob", "sub": "bob"}),
            )
            .await;
        r.ok();
        assert!(srv.release("alice", &inv).await);
    }
    // Alice was charged: her turn bucket is empty...
    srv.admit("alice", "x6").await.limited("turn_rate", 3_000);
    // ...and bob was not: his whole burst is there.
    for i in 1..=5 {
        let inv = format!("b{i}");
        srv.admit("bob", &inv).await.ok();
        assert!(srv.release("bob", &inv).await);
    }
    srv.admit("bob", "b6").await.limited("turn_rate", 3_000);
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// The refusals of §8, row by row

#[tokio::test]
async fn run_refusals_turn_rate_concurrency_and_lease_lost() {
    let srv = Server::start(&memory_config(64)).await;
    // 429 concurrency: Retry-After whole seconds, RateLimit-* headers.
    srv.admit("carol", "a").await.ok();
    srv.admit("carol", "b").await.ok();
    let r = srv.admit("carol", "c").await;
    r.limited("concurrency", 1_000);
    assert!(r.body["message"].as_str().unwrap().contains("at once"));
    // An idempotent retry of a live run is allowed and charges nothing.
    let r = srv.admit("carol", "a").await;
    assert_eq!(r.ok()["lease_expires_at_ms"], T0 + 120_000);
    // 429 turn_rate, with a hint rounded up to whole seconds.
    assert!(srv.release("carol", "a").await);
    assert!(srv.release("carol", "b").await);
    for inv in ["d", "e", "f"] {
        srv.admit("carol", inv).await.ok();
        assert!(srv.release("carol", inv).await);
    }
    srv.clock.advance(500);
    // Level 500/3000 of a turn: needs 2,500 ms more → Retry-After: 3.
    let r = srv.admit("carol", "g").await;
    r.limited("turn_rate", 2_500);
    assert_eq!(r.header("retry-after"), Some("3"));
    // 404 lease_lost on renewing a released or never-held run.
    for inv in ["a", "never"] {
        let r = srv
            .post("carol", &format!("/v1/runs/{inv}/renew"), json!({}))
            .await;
        let b = r.refused(404, "lease_lost");
        assert!(b.get("retry_after_ms").is_none());
        assert!(r.header("retry-after").is_none());
    }
    // Renewal of a live run pushes its expiry.
    srv.clock.advance(3_000);
    srv.admit("carol", "live").await.ok();
    srv.clock.advance(10_000);
    let r = srv.post("carol", "/v1/runs/live/renew", json!({})).await;
    assert_eq!(r.ok()["lease_expires_at_ms"], T0 + 13_500 + 120_000);
    srv.shutdown().await;
}

#[tokio::test]
async fn token_refusals_rate_max_llm_calls_exceeds_capacity_unknown() {
    let srv = Server::start(&memory_config(64)).await;
    // 429 token_rate with Retry-After (whole seconds, rounded up).
    srv.reserve("dave", "r", 59_000).await.ok();
    let r = srv.reserve("dave", "r", 3_500).await;
    // Level 1,000; 2,500 short → wait 2,500 > 2,000: retry after 500 ms.
    r.limited("token_rate", 500);
    assert_eq!(r.header("retry-after"), Some("1"));

    // 400 exceeds_capacity: more than capacity + max_wait × rate (62,000).
    let r = srv.reserve("erin", "r", 62_001).await;
    let b = r.refused(400, "exceeds_capacity");
    assert_eq!(b["limit"], "token_rate");
    assert!(b.get("retry_after_ms").is_none(), "{r:?}");
    assert!(r.header("retry-after").is_none(), "not retryable");
    // 62,000 exactly is grantable (with a 2,000 ms wait).
    let r = srv.reserve("erin", "r", 62_000).await;
    assert_eq!(r.ok()["wait_ms"], 2_000);

    // 429 max_llm_calls, NOT retryable: no Retry-After, no hint.
    srv.reserve("looper", "run", 1).await.ok();
    srv.reserve("looper", "run", 1).await.ok();
    for _ in 0..2 {
        let r = srv.reserve("looper", "run", 1).await;
        let b = r.refused(429, "max_llm_calls");
        assert_eq!(b["limit"], "max_llm_calls");
        assert!(b.get("retry_after_ms").is_none(), "{r:?}");
        assert!(r.header("retry-after").is_none(), "{r:?}");
        assert!(r.header("ratelimit-reset").is_none(), "{r:?}");
    }
    // Another run of the same user has its own count.
    srv.reserve("looper", "run-2", 1).await.ok();

    // 404 unknown reservation on settle and refund: well-formed ids the
    // user never got, and another user's reservation.
    let r = srv.reserve("frank", "mine", 10).await;
    let franks = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    for id in ["1.nothing", "7.mine", franks.as_str()] {
        srv.settle("gina", id, 5)
            .await
            .refused(404, "unknown_reservation");
        srv.refund("gina", id)
            .await
            .refused(404, "unknown_reservation");
    }
    // Frank's is untouched by gina's attempts.
    let r = srv.refund("frank", &franks).await;
    assert_eq!(r.ok()["balance"], CAPACITY);
    srv.shutdown().await;
}

#[tokio::test]
async fn session_lease_busy_not_holder_and_stale_fence() {
    let srv = Server::start(&memory_config(64)).await;
    let lease = |holder: &str, ttl: u64| json!({"holder": holder, "ttl_ms": ttl});
    let r = srv
        .post("alice", "/v1/sessions/s1/lease", lease("h1", 10_000))
        .await;
    let b = r.ok();
    assert_eq!(b["fence"], 1);
    assert_eq!(b["expires_at_ms"], T0 + 10_000);

    // 409 session_busy with retry_after_ms (the remaining TTL).
    srv.clock.advance(4_000);
    let r = srv
        .post("alice", "/v1/sessions/s1/lease", lease("h2", 10_000))
        .await;
    let b = r.refused(409, "session_busy");
    assert_eq!(b["retry_after_ms"], 6_000);
    assert_eq!(r.header("retry-after"), Some("6"));

    // 404 not_holder: renew and release by someone else.
    let r = srv
        .post("alice", "/v1/sessions/s1/lease/renew", lease("h2", 10_000))
        .await;
    r.refused(404, "not_holder");
    let r = srv.delete("alice", "/v1/sessions/s1/lease?holder=h2").await;
    r.refused(404, "not_holder");

    // The holder renews (same fence) and re-acquires (a refresh).
    let r = srv
        .post("alice", "/v1/sessions/s1/lease/renew", lease("h1", 10_000))
        .await;
    assert_eq!(r.ok()["fence"], 1);
    assert_eq!(r.body["expires_at_ms"], T0 + 14_000);
    let r = srv
        .post("alice", "/v1/sessions/s1/lease", lease("h1", 10_000))
        .await;
    assert_eq!(r.ok()["fence"], 1);
    let r = srv
        .post("alice", "/v1/sessions/s1/fence", json!({"fence": 1}))
        .await;
    assert_eq!(r.ok()["current"], true);

    // Released: h2 takes over with fence 2, and fence 1 is stale (409).
    let r = srv.delete("alice", "/v1/sessions/s1/lease?holder=h1").await;
    assert_eq!(r.ok()["released"], true);
    let r = srv.delete("alice", "/v1/sessions/s1/lease?holder=h1").await;
    r.refused(404, "not_holder");
    let r = srv
        .post("alice", "/v1/sessions/s1/lease", lease("h2", 10_000))
        .await;
    assert_eq!(r.ok()["fence"], 2);
    let r = srv
        .post("alice", "/v1/sessions/s1/fence", json!({"fence": 1}))
        .await;
    let b = r.refused(409, "stale_fence");
    assert_eq!(b["latest_fence"], 2);
    assert!(r.header("retry-after").is_none());
    let r = srv
        .post("alice", "/v1/sessions/s1/fence", json!({"fence": 2}))
        .await;
    assert_eq!(r.ok()["current"], true);
    // A lease that lapsed is not renewable by its old holder.
    srv.clock.advance(10_000);
    let r = srv
        .post("alice", "/v1/sessions/s1/lease/renew", lease("h2", 10_000))
        .await;
    r.refused(404, "not_holder");
    srv.shutdown().await;
}

#[tokio::test]
async fn sessions_are_namespaced_by_the_verified_user() {
    let srv = Server::start(&memory_config(64)).await;
    let lease = |holder: &str| json!({"holder": holder, "ttl_ms": 10_000});
    // Both lease "s1" at once: different namespaces.
    let r = srv
        .post("alice", "/v1/sessions/s1/lease", lease("a1"))
        .await;
    assert_eq!(r.ok()["fence"], 1);
    let r = srv.post("bob", "/v1/sessions/s1/lease", lease("b1")).await;
    assert_eq!(r.ok()["fence"], 1);
    // Bob cannot release or renew alice's lease even with her holder token.
    let r = srv.delete("bob", "/v1/sessions/s1/lease?holder=a1").await;
    r.refused(404, "not_holder");
    // Alice's session moves on to fence 3; bob's fence 1 stays current.
    for holder in ["a2", "a3"] {
        let prev = if holder == "a2" { "a1" } else { "a2" };
        let r = srv
            .delete("alice", &format!("/v1/sessions/s1/lease?holder={prev}"))
            .await;
        r.ok();
        srv.post("alice", "/v1/sessions/s1/lease", lease(holder))
            .await
            .ok();
    }
    let r = srv
        .post("alice", "/v1/sessions/s1/fence", json!({"fence": 1}))
        .await;
    r.refused(409, "stale_fence");
    let r = srv
        .post("alice", "/v1/sessions/s1/fence", json!({"fence": 3}))
        .await;
    r.ok();
    let r = srv
        .post("bob", "/v1/sessions/s1/fence", json!({"fence": 1}))
        .await;
    assert_eq!(r.ok()["current"], true);
    let r = srv
        .post("bob", "/v1/sessions/s1/fence", json!({"fence": 3}))
        .await;
    assert_eq!(r.refused(409, "stale_fence")["latest_fence"], 1);
    // The user part cannot be smuggled into the session id.
    let r = srv
        .post("bob", "/v1/sessions/5:alice%2Fs1/lease", lease("b9"))
        .await;
    assert_eq!(r.ok()["fence"], 1);
    srv.shutdown().await;
}

#[tokio::test]
async fn runs_with_a_session_lease() {
    let srv = Server::start(&memory_config(64)).await;
    // The run holds the session: {fence, expires_at_ms} (default TTL 30 s).
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "r1", "session_id": "chat"}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["lease_expires_at_ms"], T0 + 120_000);
    assert_eq!(b["session"]["fence"], 1);
    assert_eq!(b["session"]["expires_at_ms"], T0 + 30_000);
    // A retry of the same run refreshes both (same fence).
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "r1", "session_id": "chat", "session_ttl_ms": 5_000}),
        )
        .await;
    assert_eq!(r.ok()["session"]["fence"], 1);
    // (a refresh never shortens a lease)
    assert_eq!(r.body["session"]["expires_at_ms"], T0 + 30_000);

    // Another run on the same session: 409 session_busy, nothing charged.
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "r2", "session_id": "chat"}),
        )
        .await;
    assert_eq!(r.refused(409, "session_busy")["retry_after_ms"], 30_000);
    assert_eq!(r.header("retry-after"), Some("30"));
    // Release the run and its session lease together.
    assert!(
        srv.delete("alice", "/v1/runs/r1?session_id=chat")
            .await
            .ok()["released"]
            .as_bool()
            .unwrap()
    );
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "r2", "session_id": "chat"}),
        )
        .await;
    assert_eq!(r.ok()["session"]["fence"], 2);
    assert!(srv.release("alice", "r2").await);

    // So far r1 and r2 took two turns (the busy attempt took none). Three
    // more use up the burst.
    for inv in ["t3", "t4", "t5"] {
        srv.admit("alice", inv).await.ok();
        assert!(srv.release("alice", inv).await);
    }
    // Admission denied (turn rate): the session lease it took is released.
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "r6", "session_id": "other"}),
        )
        .await;
    r.limited("turn_rate", 3_000);
    let r = srv
        .post(
            "alice",
            "/v1/sessions/other/lease",
            json!({"holder": "someone-else", "ttl_ms": 1_000}),
        )
        .await;
    // Free (and granted once before, to r6: fence 2).
    assert_eq!(r.ok()["fence"], 2);
    srv.shutdown().await;
}

#[tokio::test]
async fn idempotent_release_settle_and_refund() {
    let srv = Server::start(&memory_config(64)).await;
    // Release twice: the second answers released:false, 200.
    srv.admit("alice", "r1").await.ok();
    assert!(srv.release("alice", "r1").await);
    assert!(!srv.release("alice", "r1").await);
    assert!(!srv.release("alice", "never-admitted").await);

    // Settle twice: the same balance; a different actual changes nothing.
    let r = srv.reserve("alice", "r1", 1_000).await;
    let a = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    let r = srv.settle("alice", &a, 400).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    let r = srv.settle("alice", &a, 400).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    let r = srv.settle("alice", &a, 9_000).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    // Refund after settle: no change.
    let r = srv.refund("alice", &a).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);

    // Refund twice: the estimate comes back once.
    let r = srv.reserve("alice", "r1", 2_000).await;
    let b = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    assert_ne!(a, b);
    let r = srv.refund("alice", &b).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    let r = srv.refund("alice", &b).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    // Settle after refund: no change either.
    let r = srv.settle("alice", &b, 2_000).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 400);
    // A settle above the estimate charges the difference, once.
    let r = srv.reserve("alice", "r1", 1_000).await;
    let c = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    let r = srv.settle("alice", &c, 3_000).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 3_400);
    let r = srv.settle("alice", &c, 3_000).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 3_400);
    // The id of a run with the longest accepted invocation id settles too.
    let long = "l".repeat(512);
    let r = srv.reserve("alice", &long, 100).await;
    let d = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    assert!(d.len() > 512);
    let r = srv.settle("alice", &d, 100).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 3_500);
    let r = srv.refund("alice", &d).await;
    assert_eq!(r.ok()["balance"], CAPACITY - 3_500);
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Waiting, disconnects and the in-flight cap

#[tokio::test]
async fn wait_true_waits_on_the_clock_and_a_disconnect_refunds() {
    let srv = Server::start(&memory_config(64)).await;
    // Drain, then close that reservation so its repeats read the balance.
    let r = srv.reserve("alice", "run", CAPACITY as u64).await;
    let drained = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        srv.settle("alice", &drained, CAPACITY as u64).await.ok()["balance"],
        0
    );

    // wait=true: the server waits on the fake clock and answers wait_ms 0.
    let client = reqwest::Client::new();
    let url = srv.url("/v1/tokens/reserve");
    let waiting = tokio::spawn(send_with_owned(
        client.clone(),
        url.clone(),
        bearer("alice"),
        json!({"invocation_id": "run", "estimate": 1_500, "wait": true}).to_string(),
    ));
    srv.wait_for_sleepers(1).await;
    assert!(!waiting.is_finished());
    srv.clock.advance(1_499);
    assert_eq!(srv.clock.pending_sleeps(), 1, "still waiting 1 ms short");
    srv.clock.advance(1);
    let r = waiting.await.expect("task");
    assert_eq!(r.ok()["wait_ms"], 0);
    // The reservation stands: the balance is −1,500 + 1,500 refilled.
    assert_eq!(balance(&srv, "alice", &drained).await, 0);

    // A client that disconnects while the server waits: a raw connection,
    // closed once the server is parked on the clock.
    let body = json!({"invocation_id": "run", "estimate": 1_000, "wait": true}).to_string();
    let request = format!(
        "POST /v1/tokens/reserve HTTP/1.1\r\nhost: test\r\nauthorization: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        bearer("alice"),
        body.len()
    );
    // A blocking std stream: a few hundred bytes to a local socket.
    let mut stream = std::net::TcpStream::connect(srv.addr).expect("connect");
    std::io::Write::write_all(&mut stream, request.as_bytes()).expect("write");
    srv.wait_for_sleepers(1).await;
    // While parked, the reservation is taken: the balance shows the debt.
    assert_eq!(balance(&srv, "alice", &drained).await, -1_000);
    drop(stream);
    // The server notices, drops the wait and refunds the reservation.
    srv.wait_for_sleepers(0).await;
    let refunded = wait_until(10, || {
        let srv = &srv;
        let drained = drained.clone();
        async move { balance(srv, "alice", &drained).await == 0 }
    })
    .await;
    assert!(refunded, "the abandoned reservation is refunded");
    // Nothing else is held: 2,000 tokens now wait exactly the 2,000 ms max.
    let r = srv.reserve("alice", "run", 2_000).await;
    assert_eq!(r.ok()["wait_ms"], 2_000);
    srv.shutdown().await;
}

async fn send_with_owned(client: reqwest::Client, url: String, auth: String, body: String) -> Resp {
    send_with(&client, Method::POST, &url, Some(&auth), Some(&body)).await
}

#[tokio::test]
async fn over_the_in_flight_cap_is_429_overloaded() {
    let srv = Server::start(&memory_config(1)).await;
    srv.reserve("alice", "run", CAPACITY as u64).await.ok();
    // The one slot is held by a wait=true reservation parked on the clock.
    let client = reqwest::Client::new();
    let waiting = tokio::spawn(send_with_owned(
        client.clone(),
        srv.url("/v1/tokens/reserve"),
        bearer("alice"),
        json!({"invocation_id": "run", "estimate": 1_000, "wait": true}).to_string(),
    ));
    srv.wait_for_sleepers(1).await;
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/runs",
            Some(json!({"invocation_id": "x"})),
        ),
        (Method::DELETE, "/v1/runs/x", None),
        (
            Method::POST,
            "/v1/tokens/reserve",
            Some(json!({"invocation_id": "y", "estimate": 1})),
        ),
    ] {
        let r = srv
            .send(
                method,
                path,
                Some(&bearer("bob")),
                body.map(|b| b.to_string()),
            )
            .await;
        r.refused(429, "overloaded");
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    }
    // Health and the document are not behind the cap.
    assert_eq!(srv.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(srv.get("/readyz").await.status, StatusCode::OK);
    // The clock moves: the parked request completes, the slot frees.
    srv.clock.advance(1_000);
    let r = waiting.await.expect("task");
    assert_eq!(r.ok()["wait_ms"], 0);
    srv.admit("bob", "x").await.ok();
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Store outage

#[tokio::test]
async fn fail_closed_is_503_while_redis_is_down() {
    let mut redis = RedisServer::start().expect("redis-server");
    let store = fail_closed_store(&redis.url());
    let srv = Server::start(&config_text(64, &store, &hs256_identity())).await;
    srv.admit("alice", "r1").await.ok();
    let r = srv
        .post(
            "alice",
            "/v1/tokens/reserve",
            json!({"invocation_id": "r1", "estimate": 6000}),
        )
        .await;
    let id = r.ok()["reservation_id"].as_str().expect("id").to_owned();
    assert_eq!(srv.get("/readyz").await.ok()["status"], "ok");

    redis.stop();
    for path in ["/v1/runs", "/v1/tokens/reserve", "/v1/sessions/s/lease"] {
        let body = json!({"invocation_id": "r2", "estimate": 1, "holder": "h", "ttl_ms": 1000});
        let r = srv.post("alice", path, body).await;
        r.refused(503, "store_unavailable");
    }
    // Closes of what Redis issued are journalled, not lost and not 404 (SPEC §6).
    let r = srv
        .post(
            "alice",
            "/v1/tokens/settle",
            json!({"reservation_id": id, "actual": 5000}),
        )
        .await;
    assert_eq!(r.ok(), &json!({"pending": true}));
    let r = srv.delete("alice", "/v1/runs/r1").await;
    assert_eq!(r.ok(), &json!({"released": false, "pending": true}));
    // A renew is not a close: the lease cannot be renewed meanwhile.
    let r = srv.post("alice", "/v1/runs/r1/renew", json!({})).await;
    r.refused(503, "store_unavailable");
    let r = srv.get("/readyz").await;
    r.refused(503, "store_unavailable");
    let r = srv.get("/healthz").await;
    assert_eq!(r.ok()["status"], "ok");
    // Identity is still checked first.
    let r = srv
        .send(Method::POST, "/v1/runs", None, Some("{}".to_owned()))
        .await;
    r.refused(401, "unauthorized");
    srv.shutdown().await;
}

#[tokio::test]
async fn a_retried_reserve_with_a_request_id_is_charged_once() {
    let store = fail_closed_store(&shared_url());
    let srv = Server::start(&config_text(64, &store, &hs256_identity())).await;
    let body = json!({"invocation_id": "r1", "estimate": 6000, "request_id": "call-1"});
    let first = srv.post("rita", "/v1/tokens/reserve", body.clone()).await;
    let id = first.ok()["reservation_id"].clone();
    let again = srv.post("rita", "/v1/tokens/reserve", body).await;
    assert_eq!(again.ok()["reservation_id"], id, "the first grant");
    let other = json!({"invocation_id": "r1", "estimate": 6000, "request_id": "call-2"});
    let second = srv.post("rita", "/v1/tokens/reserve", other).await;
    assert_ne!(second.ok()["reservation_id"], id);
    let r = srv
        .post(
            "rita",
            "/v1/tokens/refund",
            json!({"reservation_id": second.ok()["reservation_id"]}),
        )
        .await;
    // Two reservations of 6,000 were charged, not three, and one refunded:
    // 54,000 plus what refilled meanwhile (Redis time: 1 token per ms).
    let balance = r.ok()["balance"].as_i64().expect("balance");
    assert!((54_000..59_000).contains(&balance), "{balance}");
    let bad = json!({"invocation_id": "r1", "estimate": 1, "request_id": "a\u{7}b"});
    let r = srv.post("rita", "/v1/tokens/reserve", bad).await;
    assert_eq!(r.refused(400, "invalid_request")["field"], "request_id");
    srv.shutdown().await;
}

#[tokio::test]
async fn redis_store_takes_hostile_but_valid_input_without_a_500() {
    let store = fail_closed_store(&shared_url());
    let srv = Server::start(&config_text(64, &store, &hs256_identity())).await;
    // Ids full of hash-tag and separator characters, at the length limit.
    let odd = "{a}:%/}{ü";
    let user = format!("{odd}-user");
    let inv = format!("{odd}{}", "i".repeat(512 - odd.len()));
    assert_eq!(inv.len(), 512);
    let r = srv
        .post(
            &user,
            "/v1/runs",
            json!({"invocation_id": inv, "session_id": odd}),
        )
        .await;
    assert_eq!(r.ok()["session"]["fence"], 1);
    let r = srv
        .post(&user, &format!("/v1/runs/{}/renew", enc(&inv)), json!({}))
        .await;
    r.ok();
    let r = srv
        .post(
            &user,
            &format!("/v1/sessions/{}/fence", enc(odd)),
            json!({"fence": u64::MAX}),
        )
        .await;
    assert_eq!(r.refused(409, "stale_fence")["latest_fence"], 1);
    let r = srv
        .post(
            &user,
            &format!("/v1/sessions/{}/fence", enc(odd)),
            json!({"fence": 1}),
        )
        .await;
    r.ok();
    // Another user with a look-alike id has their own session of that name.
    let r = srv
        .post(
            &format!("{odd}-user:x"),
            &format!("/v1/sessions/{}/lease", enc(odd)),
            json!({"holder": "h", "ttl_ms": 1000}),
        )
        .await;
    assert_eq!(r.ok()["fence"], 1);
    // Token extremes.
    srv.reserve(&user, &inv, 1 << 53)
        .await
        .refused(400, "exceeds_capacity");
    let r = srv.reserve(&user, &inv, 100).await;
    let id = r.ok()["reservation_id"].as_str().unwrap().to_owned();
    let r = srv.settle(&user, &id, 1 << 53).await;
    assert!(r.is_invalid("actual"), "{r:?}");
    srv.settle(&user, &id, 50).await.ok();
    for unknown in [
        format!("{}.{inv}", u64::MAX),
        "1.nothing".to_owned(),
        format!("999.{inv}"),
    ] {
        srv.settle(&user, &unknown, 1)
            .await
            .refused(404, "unknown_reservation");
        srv.refund(&user, &unknown)
            .await
            .refused(404, "unknown_reservation");
    }
    assert!(srv.release(&user, &inv).await);
    assert!(!srv.release(&user, &inv).await);
    srv.shutdown().await;
}

/// Percent-encodes a path segment.
fn enc(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Bad input

#[tokio::test]
async fn bad_input_is_400_naming_the_field() {
    let srv = Server::start(&memory_config(64)).await;
    let long = "x".repeat(10 * 1024);
    let long_lease = format!("/v1/sessions/{long}/lease");
    let long_fence = format!("/v1/sessions/{long}/fence");
    let long_renew = format!("/v1/runs/{long}/renew");
    let body_cases: Vec<(&str, String, &str)> = vec![
        // Malformed JSON, not an object, no body.
        // (a truncated body names where it broke off)
        (
            "/v1/runs",
            r#"{"invocation_id":"#.to_owned(),
            "invocation_id",
        ),
        ("/v1/runs", r#"{"invocation_id" "a"}"#.to_owned(), "body"),
        ("/v1/runs", "not json".to_owned(), "body"),
        ("/v1/runs", "[]".to_owned(), "body"),
        ("/v1/runs", "null".to_owned(), "body"),
        ("/v1/runs", String::new(), "body"),
        (
            "/v1/runs",
            r#"{"invocation_id":"a"} trailing"#.to_owned(),
            "body",
        ),
        // Wrong types.
        (
            "/v1/runs",
            r#"{"invocation_id":5}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":null}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":["a"]}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":{}}"#.to_owned(),
            "session_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":"s","session_ttl_ms":"5"}"#.to_owned(),
            "session_ttl_ms",
        ),
        // Empty, 10 kB and control-character ids.
        (
            "/v1/runs",
            r#"{"invocation_id":""}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            json!({"invocation_id": long}).to_string(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a\u0000b"}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":""}"#.to_owned(),
            "session_id",
        ),
        (
            "/v1/runs",
            json!({"invocation_id": "a", "session_id": long}).to_string(),
            "session_id",
        ),
        // ttl 0, negative, too long.
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":"s","session_ttl_ms":0}"#.to_owned(),
            "session_ttl_ms",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":"s","session_ttl_ms":-1}"#.to_owned(),
            "session_ttl_ms",
        ),
        (
            "/v1/runs",
            r#"{"invocation_id":"a","session_id":"s","session_ttl_ms":3600001}"#.to_owned(),
            "session_ttl_ms",
        ),
        // Missing required field.
        ("/v1/runs", "{}".to_owned(), "invocation_id"),
        // Reserve: negative, past u64, past 2^53, fractional, string.
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":-1}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":18446744073709551616}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":1e300}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":9007199254740993}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":1.5}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":"10"}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a","estimate":10,"wait":"yes"}"#.to_owned(),
            "wait",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"a"}"#.to_owned(),
            "estimate",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"estimate":10}"#.to_owned(),
            "invocation_id",
        ),
        (
            "/v1/tokens/reserve",
            r#"{"invocation_id":"","estimate":10}"#.to_owned(),
            "invocation_id",
        ),
        // Settle and refund: reservation ids of the wrong format.
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"garbage","actual":1}"#.to_owned(),
            "reservation_id",
        ),
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"x.run","actual":1}"#.to_owned(),
            "reservation_id",
        ),
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"","actual":1}"#.to_owned(),
            "reservation_id",
        ),
        (
            "/v1/tokens/settle",
            json!({"reservation_id": format!("1.{long}"), "actual": 1}).to_string(),
            "reservation_id",
        ),
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"1.run","actual":-5}"#.to_owned(),
            "actual",
        ),
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"1.run","actual":9007199254740993}"#.to_owned(),
            "actual",
        ),
        (
            "/v1/tokens/settle",
            r#"{"reservation_id":"1.run"}"#.to_owned(),
            "actual",
        ),
        (
            "/v1/tokens/refund",
            r#"{"reservation_id":7}"#.to_owned(),
            "reservation_id",
        ),
        (
            "/v1/tokens/refund",
            r#"{"reservation_id":"99999999999999999999999.run"}"#.to_owned(),
            "reservation_id",
        ),
        ("/v1/tokens/refund", "{}".to_owned(), "reservation_id"),
        // Session leases.
        (
            "/v1/sessions/s/lease",
            r#"{"holder":"h","ttl_ms":0}"#.to_owned(),
            "ttl_ms",
        ),
        (
            "/v1/sessions/s/lease",
            r#"{"holder":"h","ttl_ms":3600001}"#.to_owned(),
            "ttl_ms",
        ),
        (
            "/v1/sessions/s/lease",
            r#"{"holder":"h","ttl_ms":-1}"#.to_owned(),
            "ttl_ms",
        ),
        (
            "/v1/sessions/s/lease",
            r#"{"holder":"","ttl_ms":1000}"#.to_owned(),
            "holder",
        ),
        (
            "/v1/sessions/s/lease",
            json!({"holder": long, "ttl_ms": 1000}).to_string(),
            "holder",
        ),
        (
            "/v1/sessions/s/lease",
            r#"{"ttl_ms":1000}"#.to_owned(),
            "holder",
        ),
        (
            "/v1/sessions/s/lease/renew",
            r#"{"holder":"h","ttl_ms":0}"#.to_owned(),
            "ttl_ms",
        ),
        (
            "/v1/sessions/s/lease/renew",
            r#"{"holder":"h"}"#.to_owned(),
            "ttl_ms",
        ),
        (
            "/v1/sessions/s/fence",
            r#"{"fence":-1}"#.to_owned(),
            "fence",
        ),
        (
            "/v1/sessions/s/fence",
            r#"{"fence":"1"}"#.to_owned(),
            "fence",
        ),
        (
            "/v1/sessions/s/fence",
            r#"{"fence":18446744073709551616}"#.to_owned(),
            "fence",
        ),
        ("/v1/sessions/s/fence", "{}".to_owned(), "fence"),
        // Ids in the path: 10 kB, control characters, not UTF-8.
        (
            &long_lease,
            r#"{"holder":"h","ttl_ms":1000}"#.to_owned(),
            "session_id",
        ),
        (&long_fence, r#"{"fence":1}"#.to_owned(), "session_id"),
        (&long_renew, "{}".to_owned(), "invocation_id"),
        ("/v1/runs/a%00b/renew", "{}".to_owned(), "invocation_id"),
        ("/v1/runs/%FF%FE/renew", "{}".to_owned(), "invocation_id"),
        (
            "/v1/sessions/a%0Ab/lease",
            r#"{"holder":"h","ttl_ms":1000}"#.to_owned(),
            "session_id",
        ),
    ];
    let mut wrong = Vec::new();
    for (path, body, field) in &body_cases {
        let r = srv
            .send(
                Method::POST,
                path,
                Some(&bearer("alice")),
                Some(body.clone()),
            )
            .await;
        if !r.is_invalid(field) {
            wrong.push(format!("POST {path:.60} {body:.60}: {r:?}"));
        }
    }
    let delete_cases: Vec<(String, &str)> = vec![
        (format!("/v1/runs/{long}"), "invocation_id"),
        ("/v1/runs/a%01".to_owned(), "invocation_id"),
        ("/v1/runs/ok?session_id=".to_owned(), "session_id"),
        (format!("/v1/runs/ok?session_id={long}"), "session_id"),
        ("/v1/sessions/s/lease".to_owned(), "holder"),
        ("/v1/sessions/s/lease?holder=".to_owned(), "holder"),
        (format!("/v1/sessions/s/lease?holder={long}"), "holder"),
        (format!("/v1/sessions/{long}/lease?holder=h"), "session_id"),
    ];
    for (path, field) in &delete_cases {
        let r = srv.delete("alice", path).await;
        if !r.is_invalid(field) {
            wrong.push(format!("DELETE {path:.60}: {r:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "not a 400 naming the field:\n{}",
        wrong.join("\n")
    );
    // A body over the size limit is refused as bad input too.
    let huge = json!({"invocation_id": "a", "pad": "x".repeat(100 * 1024)}).to_string();
    let r = srv
        .send(Method::POST, "/v1/runs", Some(&bearer("alice")), Some(huge))
        .await;
    assert_eq!(r.status.as_u16(), 400, "{r:?}");
    // None of it was charged: alice's whole turn burst is there.
    for i in 0..4 {
        let inv = format!("ok-{i}");
        srv.admit("alice", &inv).await.ok();
        assert!(srv.release("alice", &inv).await);
    }
    // A 400 changes nothing, even where part of the request was fine.
    srv.admit("alice", "held").await.ok();
    let r = srv.delete("alice", "/v1/runs/held?session_id=").await;
    assert!(r.is_invalid("session_id"), "{r:?}");
    assert!(
        srv.release("alice", "held").await,
        "still held after the 400"
    );
    // The store is untouched by a rejected 2^53 + 1: 2^53 exactly is
    // well-formed (and can never be granted).
    let r = srv.reserve("alice", "big", 1 << 53).await;
    r.refused(400, "exceeds_capacity");
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// The document, the default config, check-config

#[tokio::test]
async fn openapi_document_matches_the_routes() {
    use std::collections::BTreeSet;
    let srv = Server::start(&memory_config(64)).await;
    let r = srv.get("/openapi.json").await;
    let doc = r.ok();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{doc}"
    );
    let methods = [
        "get", "put", "post", "delete", "patch", "head", "options", "trace",
    ];
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("path item");
            methods
                .iter()
                .filter(|m| item.contains_key(**m))
                .map(|m| ((*m).to_owned(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let routed: BTreeSet<(String, String)> = tollgate_server::http::routes::ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        routed.len(),
        tollgate_server::http::routes::ROUTES.len(),
        "no duplicates"
    );
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from the document: {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "documented but not routed: {unrouted:?}"
    );
    // Every route in the list is really served (not the 404 fallback).
    for (method, path) in &routed {
        let concrete = path
            .replace("{invocation_id}", "inv")
            .replace("{session_id}", "sess")
            .replace("{provider}", "openai");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let r = srv.send(method.clone(), &concrete, None, None).await;
        assert_ne!(
            r.body["error"], "not_found",
            "{method} {concrete} is not routed: {r:?}"
        );
    }
    let r = srv.get("/v1/nothing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.body["error"], "not_found");
    srv.shutdown().await;
}

/// The schema of a request body's `field`, or of `name`'s parameter, of
/// `method path` in `doc`, with `$ref`s to components followed.
fn param_schema<'a>(doc: &'a Value, method: &str, path: &str, name: &str) -> &'a Value {
    let op = &doc["paths"][path][method];
    if let Some(p) = op["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
    {
        return &p["schema"];
    }
    let body = &op["requestBody"]["content"]["application/json"]["schema"];
    let body = match body["$ref"].as_str() {
        Some(r) => &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")],
        None => body,
    };
    &body["properties"][name]
}

#[tokio::test]
async fn openapi_document_states_every_bound_refusal_and_link() {
    use tollgate_server::http::routes::{MAX_SESSION_TTL_MS, MAX_TOKENS, ROUTES};
    use tollgate_server::ops::MAX_ID;
    let srv = Server::start(&memory_config(64)).await;
    let r = srv.get("/openapi.json").await;
    let doc = r.ok();
    srv.shutdown().await;
    let id_pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$";

    // Every /v1 route: the bearer credential and the refusals any of them
    // can answer, each with the JSON error body; 429 and 409 with their
    // retry headers.
    for (method, path) in ROUTES.iter().filter(|(_, p)| p.starts_with("/v1/")) {
        let op = &doc["paths"][path][method];
        assert_eq!(op["security"], json!([{"bearer": []}]), "{method} {path}");
        for status in ["200", "400", "401", "429", "500", "503"] {
            assert!(
                op["responses"][status].is_object(),
                "{method} {path} does not document {status}"
            );
        }
        for (status, r) in op["responses"].as_object().expect("responses") {
            if status.starts_with('2') {
                continue;
            }
            assert_eq!(
                r["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{method} {path} {status}"
            );
            if status == "429" || status == "409" {
                for h in ["Retry-After", "RateLimit-Remaining", "RateLimit-Reset"] {
                    assert_eq!(
                        r["headers"][h]["schema"]["type"], "integer",
                        "{method} {path} {status} {h}"
                    );
                }
            }
        }
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(doc["paths"]["/readyz"]["get"]["responses"]["503"].is_object());
    let permit = &doc["paths"]["/v1/providers/{provider}/permits"]["post"]["responses"];
    let feedback = &doc["paths"]["/v1/providers/{provider}/feedback"]["post"]["responses"];
    for r in [permit, feedback] {
        for status in ["403", "404"] {
            assert!(r[status].is_object(), "{status}");
        }
    }

    // Every id: 1–512, no control characters; path and query too.
    let ids = [
        ("post", "/v1/runs", "invocation_id"),
        ("post", "/v1/runs", "session_id"),
        ("delete", "/v1/runs/{invocation_id}", "invocation_id"),
        ("delete", "/v1/runs/{invocation_id}", "session_id"),
        ("post", "/v1/runs/{invocation_id}/renew", "invocation_id"),
        ("post", "/v1/tokens/reserve", "invocation_id"),
        ("post", "/v1/sessions/{session_id}/lease", "session_id"),
        ("post", "/v1/sessions/{session_id}/lease", "holder"),
        ("post", "/v1/sessions/{session_id}/lease/renew", "holder"),
        ("delete", "/v1/sessions/{session_id}/lease", "holder"),
        ("post", "/v1/sessions/{session_id}/fence", "session_id"),
        ("post", "/v1/providers/{provider}/permits", "provider"),
        ("post", "/v1/providers/{provider}/permits", "model"),
        ("post", "/v1/providers/{provider}/permits", "tenant"),
        ("post", "/v1/providers/{provider}/feedback", "model"),
    ];
    for (method, path, name) in ids {
        let s = param_schema(doc, method, path, name);
        assert_eq!(s["minLength"], 1, "{method} {path} {name}: {s}");
        assert_eq!(s["maxLength"], MAX_ID, "{method} {path} {name}: {s}");
        assert_eq!(s["pattern"], id_pattern, "{method} {path} {name}: {s}");
    }
    for path in ["/v1/tokens/settle", "/v1/tokens/refund"] {
        let s = param_schema(doc, "post", path, "reservation_id");
        assert_eq!(
            s["pattern"],
            r"^(f[0-9a-f]{8}\.)?[1-9][0-9]{0,18}\.[^\u0000-\u001f\u007f-\u009f]{1,512}$",
            "{path}"
        );
    }
    let s = param_schema(doc, "post", "/v1/tokens/reserve", "request_id");
    assert_eq!(
        (&s["minLength"], &s["maxLength"], &s["pattern"]),
        (&json!(1), &json!(MAX_ID), &json!(id_pattern)),
        "{s}"
    );
    // Every integer's range.
    let ranges = [
        ("post", "/v1/runs", "session_ttl_ms", 1, MAX_SESSION_TTL_MS),
        ("post", "/v1/tokens/reserve", "estimate", 1, MAX_TOKENS),
        ("post", "/v1/tokens/settle", "actual", 0, MAX_TOKENS),
        (
            "post",
            "/v1/sessions/{session_id}/lease",
            "ttl_ms",
            1,
            MAX_SESSION_TTL_MS,
        ),
        (
            "post",
            "/v1/sessions/{session_id}/lease/renew",
            "ttl_ms",
            1,
            MAX_SESSION_TTL_MS,
        ),
        (
            "post",
            "/v1/sessions/{session_id}/fence",
            "fence",
            0,
            u64::MAX,
        ),
        (
            "post",
            "/v1/providers/{provider}/permits",
            "tokens",
            0,
            MAX_TOKENS,
        ),
        (
            "post",
            "/v1/providers/{provider}/permits",
            "input_tokens",
            0,
            MAX_TOKENS,
        ),
        (
            "post",
            "/v1/providers/{provider}/permits",
            "output_tokens",
            0,
            MAX_TOKENS,
        ),
        (
            "post",
            "/v1/providers/{provider}/permits",
            "max_wait_ms",
            0,
            u64::MAX,
        ),
        (
            "post",
            "/v1/providers/{provider}/feedback",
            "status",
            100,
            599,
        ),
    ];
    for (method, path, name, min, max) in ranges {
        let s = param_schema(doc, method, path, name);
        assert_eq!(s["minimum"], min, "{path} {name}: {s}");
        assert_eq!(s["maximum"], max, "{path} {name}: {s}");
    }

    // Links, in the OpenAPI spelling, to operations that exist.
    let operation_ids: std::collections::BTreeSet<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|item| item.as_object().expect("item").values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    let links = [
        ("/v1/runs", "renew", "renew_run"),
        ("/v1/runs", "release", "release_run"),
        ("/v1/runs", "reserve", "reserve"),
        ("/v1/tokens/reserve", "settle", "settle"),
        ("/v1/tokens/reserve", "refund", "refund"),
        ("/v1/sessions/{session_id}/lease", "renew", "session_renew"),
        (
            "/v1/sessions/{session_id}/lease",
            "release",
            "session_release",
        ),
        ("/v1/sessions/{session_id}/lease", "fence", "fence_check"),
    ];
    for (path, name, target) in links {
        let link = &doc["paths"][path]["post"]["responses"]["200"]["links"][name];
        assert_eq!(link["operationId"], target, "{path} {name}: {link}");
        assert!(operation_ids.contains(target), "{target}");
        assert!(link.get("operation_id").is_none(), "{link}");
    }
    let settle = &doc["paths"]["/v1/tokens/reserve"]["post"]["responses"]["200"]["links"]["settle"];
    assert_eq!(
        settle["requestBody"]["reservation_id"],
        "$response.body#/reservation_id"
    );
}

/// JSON Schema's `integer` (the document's type of every count and time)
/// includes `5.0`: the server takes it as 5, and refuses a fraction, a
/// negative number or one past `u64::MAX`; a field is checked against its
/// range even when it would be unused.
#[tokio::test]
async fn integral_numbers_are_integers_and_every_field_is_checked() {
    let srv = Server::start(&memory_config(64)).await;
    let r = srv
        .post(
            "alice",
            "/v1/runs",
            json!({"invocation_id": "f1", "session_id": "s", "session_ttl_ms": 5e3}),
        )
        .await;
    assert!(r.ok()["session"]["fence"].is_u64());
    let r = srv
        .post(
            "alice",
            "/v1/tokens/reserve",
            json!({"invocation_id": "f1", "estimate": 10.0}),
        )
        .await;
    assert!(r.ok()["reservation_id"].is_string());
    for (body, field) in [
        (json!({"invocation_id": "f1", "estimate": 1.5}), "estimate"),
        (json!({"invocation_id": "f1", "estimate": -1.0}), "estimate"),
        (json!({"invocation_id": "f1", "estimate": -1}), "estimate"),
        (
            json!({"invocation_id": "f1", "estimate": 1.8446744073709552e19}),
            "estimate",
        ),
        (json!({"invocation_id": "f1", "estimate": "1"}), "estimate"),
    ] {
        let r = srv.post("alice", "/v1/tokens/reserve", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {r:?}");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    // No session named: session_ttl_ms is still held to 1..=3,600,000.
    for ttl in [json!(0), json!(3_600_001)] {
        let r = srv
            .post(
                "alice",
                "/v1/runs",
                json!({"invocation_id": "f2", "session_ttl_ms": ttl}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{ttl}: {r:?}");
        assert_eq!(r.body["field"], "session_ttl_ms");
    }
    srv.shutdown().await;
}

#[test]
fn the_embedded_default_config_parses() {
    let c = Config::default_config().expect("the embedded default config is valid");
    assert_eq!(c.listen.to_string(), "127.0.0.1:8787");
    assert!(matches!(
        c.store,
        tollgate_server::StoreSettings::Memory { .. }
    ));
    assert!(c.plans.resolve("anyone").is_some(), "a default plan");
}

#[test]
fn check_config_exits_64_with_field_paths_on_a_bad_file_and_0_on_a_good_one() {
    let dir = TempDir::new();
    let run = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write config");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("check-config")
            .arg(&path)
            .output()
            .expect("run tollgate");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run("good.toml", &memory_config(8));
    assert_eq!(code, Some(0), "stdout {stdout}\nstderr {stderr}");
    assert!(stdout.contains("ok"), "{stdout}");

    let (code, _, stderr) = run("default.toml", tollgate_server::config::DEFAULT_CONFIG);
    assert_eq!(code, Some(0), "{stderr}");

    let bad = r#"
listen = "not an address"
max_in_flight = 0
default_plan = "support"

[store]
kind = "redis"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "too short"

[plans.support]
turns = { amount = 0, period_ms = 60000 }
tokens = { amount = 60000, period_ms = 60000 }
concurrent_runs = 2
"#;
    let (code, _, stderr) = run("bad.toml", bad);
    assert_eq!(code, Some(64), "{stderr}");
    for path in [
        "listen",
        "max_in_flight",
        "store.url",
        "identity.secret",
        "plans.support.turns",
    ] {
        assert!(stderr.contains(path), "{path} is named in:\n{stderr}");
    }
    // A TOML shape error names its field too.
    let (code, _, stderr) = run(
        "typo.toml",
        &memory_config(8).replace("max_in_flight = 8", "max_in_flight = \"eight\""),
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("max_in_flight"), "{stderr}");
    // A cap past a million is refused, not a panic at start.
    let (code, _, stderr) = run(
        "huge.toml",
        &memory_config(8).replace("max_in_flight = 8", "max_in_flight = 18446744073709551615"),
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("max_in_flight: must be 1 to 1000000"),
        "{stderr}"
    );
    let (code, _, stderr) = run("unknown.toml", &format!("colour = 1\n{}", memory_config(8)));
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("colour"), "{stderr}");
    // A missing file is a usage error as well.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check-config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(64));
}

/// `tollgate serve` prints where it listens, which store and which identity
/// mode, serves, and exits 0 after draining when sent SIGTERM or SIGINT.
#[test]
fn serve_prints_its_banner_and_shuts_down_gracefully_on_signals() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    for signal in ["TERM", "INT"] {
        let dir =
            std::env::temp_dir().join(format!("tollgate-serve-{}-{signal}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("tollgate.toml");
        let body = tollgate_server::config::DEFAULT_CONFIG
            .replace("listen = \"127.0.0.1:8787\"", "listen = \"127.0.0.1:0\"");
        std::fs::write(&cfg, body).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("serve")
            .arg("--config")
            .arg(&cfg)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run tollgate serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        assert!(
            first.starts_with("tollgate listening on http://127.0.0.1:"),
            "{first}"
        );
        let addr = first
            .trim_start_matches("tollgate listening on http://")
            .to_owned();
        let store = lines.next().unwrap().unwrap();
        assert!(
            store.contains("store:") && store.contains("memory"),
            "{store}"
        );
        let identity = lines.next().unwrap().unwrap();
        assert!(
            identity.contains("identity:") && identity.contains("dev"),
            "{identity}"
        );
        // It serves.
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        std::io::Write::write_all(
            &mut s,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let mut resp = String::new();
        std::io::Read::read_to_string(&mut s, &mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        let exit = child.wait().unwrap();
        assert!(exit.success(), "SIG{signal}: {exit:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---------------------------------------------------------------------------
// What a client needs from the plan

#[tokio::test]
async fn admit_answer_carries_the_plan_a_client_needs() {
    let srv = Server::start(&memory_config(64)).await;
    // The support plan: estimate_tokens and lease_ttl_ms by default,
    // max_wait_ms as configured, max_llm_calls by default.
    let r = srv.admit("alice", "run-a").await;
    let b = r.ok();
    assert_eq!(b["lease_expires_at_ms"], T0 + 120_000, "{b}");
    assert_eq!(b["lease_ttl_ms"], 120_000, "{b}");
    assert_eq!(b["estimate_tokens"], 1_000, "{b}");
    assert_eq!(b["max_wait_ms"], 2_000, "{b}");
    assert_eq!(b["max_llm_calls"], 500, "{b}");
    // Another plan, and an override, answer their own numbers.
    let b = srv.admit("patient", "run-p").await.ok().clone();
    assert_eq!(b["max_wait_ms"], 6_000, "{b}");
    let b = srv.admit("looper", "run-l").await.ok().clone();
    assert_eq!(b["max_llm_calls"], 2, "{b}");
    // A refused admission carries none of it.
    srv.admit("alice", "run-b").await.ok();
    let r = srv.admit("alice", "run-c").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.body.get("estimate_tokens").is_none(), "{r:?}");
    // The document states them as required integers.
    let doc = srv.get("/openapi.json").await.ok().clone();
    let schema = &doc["components"]["schemas"]["AdmitResponse"];
    for field in [
        "lease_expires_at_ms",
        "lease_ttl_ms",
        "estimate_tokens",
        "max_wait_ms",
        "max_llm_calls",
    ] {
        assert_eq!(
            schema["properties"][field]["type"], "integer",
            "{field}: {schema}"
        );
        assert!(
            schema["required"]
                .as_array()
                .is_some_and(|r| r.iter().any(|f| f == field)),
            "{field} required: {schema}"
        );
    }
    srv.shutdown().await;
}

const ADMIN_TOKEN: &str = "http-test-admin-token-0123456789abcdef";

/// Calls of the admission script Redis has run (`INFO commandstats`).
fn evalsha_calls(redis: &RedisServer) -> u64 {
    let info = redis.command(&["INFO", "commandstats"]).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A refused user's flood (SPEC §3): once Redis has refused a user's turn
/// until a time, this replica answers that user's further admissions
/// itself until then, with what is left of Redis's hint — 200 refusals,
/// no script call — while another user is decided by Redis as before, and
/// a retry of a run this replica admitted still goes to Redis. An
/// operator's reset ends it here at once; so does the hint's end.
#[tokio::test]
async fn a_refused_users_flood_does_not_reach_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let store = fail_closed_store(&redis.url());
    let config = format!(
        "admin_token = \"{ADMIN_TOKEN}\"\n{}",
        config_text(64, &store, &hs256_identity())
    );
    let srv = Server::start(&config).await;
    // Five turns of burst (20 a minute), two runs at a time.
    for i in 0..5 {
        let inv = format!("r{i}");
        srv.admit("flood", &inv).await.ok();
        if i > 0 {
            assert!(srv.release("flood", &inv).await);
        }
    }
    let refused = srv.admit("flood", "r5").await;
    refused.refused(429, "turn_rate");
    let hint = refused.body["retry_after_ms"].as_u64().expect("a hint");
    assert!((1..=3_000).contains(&hint), "{hint}");
    let before = evalsha_calls(&redis);
    for i in 0..200 {
        let r = srv.admit("flood", &format!("x{i}")).await;
        r.limited("turn_rate", hint);
    }
    assert_eq!(evalsha_calls(&redis), before, "no script ran for the flood");
    // Another user, and a retry of r0 (it holds its lease): Redis decides.
    srv.admit("calm", "c1").await.ok();
    srv.admit("flood", "r0").await.ok();
    assert_eq!(evalsha_calls(&redis), before + 2);
    let text = srv
        .client
        .get(srv.url("/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert_eq!(
        common::metric(&text, "tollgate_refusals_answered_locally_total "),
        Some(200.0),
        "{text}"
    );
    // An operator's reset: full buckets, and this replica asks Redis again.
    let r = srv
        .send(
            Method::POST,
            "/admin/users/flood/reset",
            Some(&format!("Bearer {ADMIN_TOKEN}")),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    srv.admit("flood", "after-reset").await.ok();
    assert!(srv.release("flood", "after-reset").await);
    assert!(srv.release("flood", "r0").await);
    // Refused again, then kept until the hint ends on this replica's clock.
    for i in 0..4 {
        let inv = format!("y{i}");
        srv.admit("flood", &inv).await.ok();
        assert!(srv.release("flood", &inv).await);
    }
    let r = srv.admit("flood", "y4").await;
    r.refused(429, "turn_rate");
    let hint = r.body["retry_after_ms"].as_u64().expect("a hint");
    let before = evalsha_calls(&redis);
    srv.admit("flood", "y5").await.limited("turn_rate", hint);
    assert_eq!(evalsha_calls(&redis), before);
    srv.clock.advance(hint);
    let r = srv.admit("flood", "y6").await;
    assert_eq!(
        evalsha_calls(&redis),
        before + 1,
        "asked at the hint's end: {r:?}"
    );
    srv.shutdown().await;
}
