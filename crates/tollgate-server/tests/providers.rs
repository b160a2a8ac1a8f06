//! The sidecar's provider rows of SPEC §8 over a real socket:
//! `POST /v1/providers/{provider}/permits` and `…/feedback`, the
//! `[providers."<provider>:<model>"]` config, its reload, and the provider
//! metrics.
//!
//! Every test starts `tollgate_server::serve` on `127.0.0.1:0` with a config
//! written to a temporary file (so reloads can reread it), JWT identity
//! (HS256; tokens minted here) and a [`FakeClock`] at [`T0`], and talks to
//! it with `reqwest`. Time only moves when a test advances the fake clock.
//!
//! Covered: SPEC §7's provider example to the number (600/min, burst 60:
//! waits 0…4,000 ms; with a 2,000 ms deadline calls 81–100 are refused
//! `provider_rate` with `Retry-After: 1`); `wait=true`; a 429 with a hint
//! sets the shared cooldown (`provider_cooldown`, or a wait) and halves the
//! effective rate; an OpenAI `insufficient_quota` answer makes permits fail
//! fast with 403 `provider_exhausted`; feedback classes; tenant shares;
//! `exceeds_capacity`; 404 `unknown_provider`; bad input → 400 naming the
//! field; no identity → 401; 503 `store_unavailable` with Redis down
//! (fail_closed); the metrics; `/openapi.json`; a bad provider
//! section refused with its field path (`check-config` and in process);
//! reload swaps the providers and a bad file keeps the old ones; a
//! provider's hint clamped (`max_cooldown_ms`, `max_exhausted_ms`: a 31-year
//! `Retry-After` cools the key down for 300 s at most); the admin views of
//! provider keys and the clear that ends a bad cooldown at once.

use std::net::SocketAddr;
use std::path::PathBuf;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::FakeClock;
use tollgate_server::config::Config;
use tollgate_testkit::T0;
use tollgate_testkit::redis::RedisServer;

use common::{AUDIENCE, ISSUER, Resp, Spawned, TempDir, fail_closed_store, metric, send_with};

mod common;

// ---------------------------------------------------------------------------
// Helpers

const SECRET: &str = "tollgate-providers-test-secret-0123456789";
const ADMIN: &str = "admin-token-0123456789abcdef";

/// The permits route of `provider`.
fn permits(provider: &str) -> String {
    format!("/v1/providers/{provider}/permits")
}

/// The feedback route of `provider`.
fn feedback(provider: &str) -> String {
    format!("/v1/providers/{provider}/feedback")
}

/// A config with the SPEC §7 "support" plan and `providers` (TOML tables).
fn config_with(providers: &str) -> String {
    config_on("", providers)
}

/// The same on the store of `store` (a `[store]` table; empty: memory).
fn config_on(store: &str, providers: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
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
concurrent_runs = 2
max_wait_ms = 2000

{providers}"#
    )
}

/// SPEC §7's provider (600 requests/min = 10/s, burst 60, block, max wait
/// 4,000 ms) as `openai:gpt-4o`; a token-limited `openai:gpt-4o-mini`; a
/// `reject` key with tenant shares, `anthropic:claude`.
const PROVIDERS: &str = r#"
[providers."openai:gpt-4o"]
requests = { amount = 600, period_ms = 60000, burst = 60 }
policy = "block"
max_wait_ms = 4000

[providers."openai:gpt-4o-mini"]
requests = { amount = 600, period_ms = 60000, burst = 60 }
tokens = { amount = 60000, period_ms = 60000, burst = 10000 }
max_wait_ms = 1000

[providers."anthropic:claude"]
requests = { amount = 600, period_ms = 60000, burst = 10 }
policy = "reject"

[providers."anthropic:claude".tenants.noisy]
share = 0.2

[providers."anthropic:claude".tenants.quiet]
share = 0.5
"#;

/// A provider key shared fairly: SPEC §5's worked example.
const FAIR: &str = r#"
[providers."openai:fair"]
requests = { amount = 600, period_ms = 60000, burst = 2 }
max_wait_ms = 1000

[providers."openai:fair".tenants.a]
weight = 3

[providers."openai:fair".tenants.b]
weight = 1
"#;

fn config() -> String {
    config_with(PROVIDERS)
}

/// A valid token for `user`, expiring an hour after the fake clock's start.
fn token(user: &str) -> String {
    common::valid_token(user, SECRET)
}

impl Resp {
    /// The `wait_ms` of a granted permit.
    #[track_caller]
    fn wait_ms(&self) -> u64 {
        self.ok()["wait_ms"].as_u64().expect("wait_ms")
    }

    /// Asserts a 400 `invalid_request` naming `field`.
    #[track_caller]
    fn invalid(&self, field: &str) {
        self.refused(400, "invalid_request");
        assert_eq!(self.body["field"], field, "{self:?}");
    }
}

/// A running server on a fake clock, its config in a file.
struct Server {
    addr: SocketAddr,
    clock: FakeClock,
    client: reqwest::Client,
    dir: TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    async fn start(text: &str) -> Self {
        let dir = TempDir::new();
        let file = dir.0.join("tollgate.toml");
        std::fs::write(&file, text).expect("write config");
        let config = Config::load(&file).expect("valid test config");
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
            dir,
            stop,
            task,
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.0.join("tollgate.toml")
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        auth: Option<&str>,
        body: Option<&str>,
    ) -> Resp {
        send_with(&self.client, method, &self.url(path), auth, body).await
    }

    /// `POST path` as `user` with a JSON body.
    async fn post(&self, user: &str, path: &str, body: Value) -> Resp {
        let auth = format!("Bearer {}", token(user));
        self.send(Method::POST, path, Some(&auth), Some(&body.to_string()))
            .await
    }

    /// A permit for `provider` with `body`.
    async fn permit(&self, provider: &str, body: Value) -> Resp {
        self.post("alice", &permits(provider), body).await
    }

    /// Feedback for `provider` with `body`, from a service with the
    /// feedback scope.
    async fn feedback(&self, provider: &str, body: Value) -> Resp {
        let auth = format!("Bearer {}", common::service_token("gateway", SECRET));
        self.send(
            Method::POST,
            &feedback(provider),
            Some(&auth),
            Some(&body.to_string()),
        )
        .await
    }

    async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// An admin request with the admin token.
    async fn admin(&self, method: Method, path: &str) -> Resp {
        let auth = format!("Bearer {ADMIN}");
        self.send(method, path, Some(&auth), None).await
    }

    /// `POST /admin/reload`.
    async fn reload(&self) -> Resp {
        let auth = format!("Bearer {ADMIN}");
        self.send(Method::POST, "/admin/reload", Some(&auth), None)
            .await
    }

    /// Waits (real time: the request runs concurrently) until `n` sleeps
    /// are parked on the fake clock.
    async fn wait_for_sleepers(&self, n: usize) {
        common::wait_for_sleepers(&self.clock, n).await;
    }

    async fn shutdown(self) {
        drop(self.client);
        common::shutdown(self.stop, self.task).await;
    }
}

/// The OpenAI answer to a call on an account out of credit.
const INSUFFICIENT_QUOTA: &str = r#"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}"#;

// ---------------------------------------------------------------------------
// SPEC §7

/// 600 requests/min = 10/s, burst 60, block, max wait 4,000 ms: 100 calls
/// at t = 0 wait 0 (1–60), then 100·k ms (60+k), the last 4,000 ms. With a
/// deadline of 2,000 ms calls 81–100 are refused `provider_rate`, retry in
/// 100 ms (`Retry-After: 1`), and take nothing.
#[tokio::test]
async fn spec_provider_example_through_http() {
    let srv = Server::start(&config()).await;
    for call in 1..=100u64 {
        let r = srv
            .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await;
        assert_eq!(r.wait_ms(), call.saturating_sub(60) * 100, "call {call}");
        assert_eq!(r.body["effective_permille"], 1_000);
    }
    // The last call's debt is paid after 4,000 ms: the bucket is at 0.
    srv.clock.advance(4_000);
    for call in 61..=100u64 {
        let r = srv
            .permit(
                "openai",
                json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 2_000}),
            )
            .await;
        if call <= 80 {
            assert_eq!(r.wait_ms(), (call - 60) * 100, "call {call}");
        } else {
            r.limited("provider_rate", 100);
            assert_eq!(r.header("retry-after"), Some("1"));
        }
    }
    // The refusals took nothing: 100 ms later call 81 fits the deadline.
    srv.clock.advance(100);
    let r = srv
        .permit(
            "openai",
            json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 2_000}),
        )
        .await;
    assert_eq!(r.wait_ms(), 2_000);
    srv.shutdown().await;
}

/// `wait: true`: the server waits on the clock and answers `wait_ms` 0; a
/// client that disconnects abandons the wait.
#[tokio::test]
async fn wait_true_waits_on_the_clock() {
    let srv = Server::start(&config()).await;
    for _ in 0..60 {
        srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await
            .ok();
    }
    let client = srv.client.clone();
    let url = srv.url(&permits("openai"));
    let auth = format!("Bearer {}", token("alice"));
    let waiting = tokio::spawn(async move {
        let body = json!({"model": "gpt-4o", "tokens": 0, "wait": true}).to_string();
        send_with(&client, Method::POST, &url, Some(&auth), Some(&body)).await
    });
    srv.wait_for_sleepers(1).await;
    srv.clock.advance(99);
    assert_eq!(srv.clock.pending_sleeps(), 1, "still waiting 1 ms short");
    srv.clock.advance(1);
    let r = waiting.await.expect("task");
    assert_eq!(r.wait_ms(), 0);
    assert_eq!(r.body["effective_permille"], 1_000);

    // A disconnect while parked drops the wait.
    let body = json!({"model": "gpt-4o", "tokens": 0, "wait": true}).to_string();
    let request = format!(
        "POST {} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        permits("openai"),
        token("alice"),
        body.len()
    );
    let mut stream = std::net::TcpStream::connect(srv.addr).expect("connect");
    std::io::Write::write_all(&mut stream, request.as_bytes()).expect("write");
    srv.wait_for_sleepers(1).await;
    drop(stream);
    srv.wait_for_sleepers(0).await;
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Feedback

/// A per-minute 429 with `Retry-After: 3` sets the shared cooldown and
/// halves the effective rate: permits wait it out when it fits their
/// deadline (block), else are refused `provider_cooldown`; a `reject` key
/// refuses at once.
#[tokio::test]
async fn a_429_with_a_hint_sets_a_cooldown_that_permits_report() {
    let srv = Server::start(&config()).await;
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": {"Retry-After": "3"},
                   "body": r#"{"error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}}"#}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["class"], "throttled");
    assert_eq!(b["retryable"], true);
    assert_eq!(b["retry_after_ms"], 3_000);
    assert_eq!(b["cooldown_until_ms"], T0 + 3_000);
    assert_eq!(b["effective_permille"], 500);
    assert!(b.get("reason").is_none(), "{b}");

    let r = srv
        .permit(
            "openai",
            json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 1_000}),
        )
        .await;
    r.limited("provider_cooldown", 2_000);
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    assert_eq!(
        r.wait_ms(),
        3_000,
        "block: the permit waits the cooldown out"
    );
    assert_eq!(r.body["effective_permille"], 500);

    // Reject policy: refused with the cooldown named, at once.
    let r = srv
        .feedback(
            "anthropic",
            json!({"model": "claude", "status": 429, "headers": {"retry-after": "2"}}),
        )
        .await;
    assert_eq!(r.ok()["cooldown_until_ms"], T0 + 2_000);
    let r = srv
        .permit("anthropic", json!({"model": "claude", "tokens": 0}))
        .await;
    r.limited("provider_cooldown", 2_000);
    srv.clock.advance(3_000);
    let r = srv
        .permit("anthropic", json!({"model": "claude", "tokens": 0}))
        .await;
    assert_eq!(r.wait_ms(), 0, "the cooldown is over");
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    assert_eq!(r.wait_ms(), 0, "the cooldown is over");
    srv.shutdown().await;
}

/// An OpenAI `insufficient_quota` answer: the key fails fast with 403
/// `provider_exhausted` (the reason in the message, no `Retry-After`: it
/// is not retryable) for 60 s, then permits are decided again.
#[tokio::test]
async fn insufficient_quota_makes_permits_fail_fast_with_403() {
    let srv = Server::start(&config()).await;
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": {}, "body": INSUFFICIENT_QUOTA}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["class"], "exhausted");
    assert_eq!(b["retryable"], false);
    assert!(
        b["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("insufficient_quota")),
        "{b}"
    );
    assert!(b.get("cooldown_until_ms").is_none(), "{b}");

    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    let b = r.refused(403, "provider_exhausted");
    assert_eq!(b["retry_after_ms"], 60_000);
    assert!(
        b["message"]
            .as_str()
            .is_some_and(|m| m.contains("insufficient_quota")),
        "{b}"
    );
    assert_eq!(r.header("retry-after"), None, "not retryable: {r:?}");
    // Another model of the provider is another key: not exhausted.
    let r = srv
        .permit("openai", json!({"model": "gpt-4o-mini", "tokens": 0}))
        .await;
    assert_eq!(r.wait_ms(), 0);
    srv.clock.advance(59_999);
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    assert_eq!(r.refused(403, "provider_exhausted")["retry_after_ms"], 1);
    srv.clock.advance(1);
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    assert_eq!(r.wait_ms(), 0, "the hold is over");
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Hints are clamped

/// The problem of issue 15: a `Retry-After: 999999999` (31 years) on a 429
/// sets the shared cooldown for at most `max_cooldown_ms` (default
/// 300,000 ms); the feedback answer shows the clamped hint and end, and
/// permits are granted again 300 s later.
#[tokio::test]
async fn a_31_year_retry_after_cools_the_key_down_for_300_s_at_most() {
    let srv = Server::start(&config()).await;
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "999999999"}}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["class"], "throttled");
    assert_eq!(b["retry_after_ms"], 300_000);
    assert_eq!(b["cooldown_until_ms"], T0 + 300_000);
    let now_or_never = json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 0});
    srv.permit("openai", now_or_never.clone())
        .await
        .limited("provider_cooldown", 300_000);
    // block with the key's 4,000 ms wait: refused for the rest.
    srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await
        .limited("provider_cooldown", 296_000);
    srv.clock.advance(299_999);
    srv.permit("openai", now_or_never.clone())
        .await
        .limited("provider_cooldown", 1);
    srv.clock.advance(1);
    assert_eq!(srv.permit("openai", now_or_never).await.wait_ms(), 0);
    srv.shutdown().await;
}

/// `max_cooldown_ms` and `max_exhausted_ms` per provider row: an
/// exhaustion's hint (a 402's `Retry-After`) holds this replica's fail-fast
/// for at most `max_exhausted_ms` (default 60,000 ms, the hold without a
/// hint), and a lower `max_cooldown_ms` cuts a 429's hint further.
#[tokio::test]
async fn exhaustion_and_cooldown_hints_are_cut_to_the_rows_maximums() {
    let srv = Server::start(&config_with(&format!(
        r#"{PROVIDERS}
[providers."vllm:llama"]
requests = {{ amount = 600, period_ms = 60000 }}
max_cooldown_ms = 10000
max_exhausted_ms = 120000
"#
    )))
    .await;
    let huge = json!({"retry-after": "999999999"});
    // The default row: at most 60 s.
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": huge, "body": INSUFFICIENT_QUOTA}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["class"], "exhausted");
    assert_eq!(b["retry_after_ms"], 60_000);
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    assert_eq!(
        r.refused(403, "provider_exhausted")["retry_after_ms"],
        60_000
    );
    // The raised row: at most 120 s.
    let r = srv
        .feedback(
            "vllm",
            json!({"model": "llama", "status": 402, "headers": huge}),
        )
        .await;
    let b = r.ok();
    assert_eq!(
        (b["class"].as_str(), b["retryable"].as_bool()),
        (Some("exhausted"), Some(false))
    );
    assert_eq!(b["retry_after_ms"], 120_000);
    assert_eq!(b["reason"], "payment_required");
    let llama = json!({"model": "llama", "tokens": 0, "max_wait_ms": 0});
    let r = srv.permit("vllm", llama.clone()).await;
    assert_eq!(
        r.refused(403, "provider_exhausted")["retry_after_ms"],
        120_000
    );
    srv.clock.advance(60_000);
    assert_eq!(
        srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await
            .wait_ms(),
        0,
        "the default row's hold is over"
    );
    let r = srv.permit("vllm", llama.clone()).await;
    assert_eq!(
        r.refused(403, "provider_exhausted")["retry_after_ms"],
        60_000
    );
    srv.clock.advance(60_000);
    assert_eq!(srv.permit("vllm", llama.clone()).await.wait_ms(), 0);
    // Its 429s cool it down for 10 s at most.
    let r = srv
        .feedback(
            "vllm",
            json!({"model": "llama", "status": 429, "headers": {"retry-after": "60"}}),
        )
        .await;
    assert_eq!(r.ok()["retry_after_ms"], 10_000);
    assert_eq!(r.ok()["cooldown_until_ms"], T0 + 130_000);
    srv.permit("vllm", llama.clone())
        .await
        .limited("provider_cooldown", 10_000);
    srv.clock.advance(10_000);
    assert_eq!(srv.permit("vllm", llama).await.wait_ms(), 0);
    srv.shutdown().await;
}

/// The admin views of provider keys show what the providers' answers set
/// (the shared cooldown with its end and what is left of it, the effective
/// rate, this replica's exhaustion with its end and reason), and the clear
/// ends all of it at once: the next permit is granted without a wait at the
/// full rate.
#[tokio::test]
async fn admin_provider_views_and_clear() {
    let srv = Server::start(&config_with(&format!(
        "{PROVIDERS}\n[providers.\"vllm:meta/llama\"]\nrequests = {{ amount = 60, period_ms = 60000 }}\n"
    )))
    .await;
    let clean = |provider: &str, model: &str| {
        json!({"provider": provider, "model": model, "cooldown_until_ms": null,
               "cooldown_remaining_ms": 0, "effective_permille": 1000, "exhausted": null,
               "tenants": []})
    };
    // A key with tenants by share lists them (no fair sharing: never
    // active, never ahead).
    let mut claude = clean("anthropic", "claude");
    let tenant = |name: &str, share: f64| json!({"name": name, "weight": null, "share": share, "active": false, "booked_ahead_ms": 0, "recent_share": null});
    claude["tenants"] = json!([tenant("noisy", 0.2), tenant("quiet", 0.5)]);
    let r = srv.admin(Method::GET, "/admin/providers").await;
    assert_eq!(
        r.ok()["providers"],
        json!([
            claude.clone(),
            clean("openai", "gpt-4o"),
            clean("openai", "gpt-4o-mini"),
            clean("vllm", "meta/llama")
        ])
    );
    // A model with a slash is one path segment, written %2F.
    let r = srv
        .admin(Method::GET, "/admin/providers/vllm/meta%2Fllama")
        .await;
    assert_eq!(*r.ok(), clean("vllm", "meta/llama"));
    // A bad hint (a 429 with 31 years) and an exhaustion on gpt-4o.
    srv.feedback(
        "openai",
        json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "999999999"}}),
    )
    .await
    .ok();
    srv.feedback(
        "openai",
        json!({"model": "gpt-4o", "status": 429, "headers": {}, "body": INSUFFICIENT_QUOTA}),
    )
    .await
    .ok();
    srv.clock.advance(1_000);
    let r = srv
        .admin(Method::GET, "/admin/providers/openai/gpt-4o")
        .await;
    let b = r.ok();
    assert_eq!(b["cooldown_until_ms"], T0 + 300_000);
    assert_eq!(b["cooldown_remaining_ms"], 299_000);
    assert_eq!(b["effective_permille"], 500);
    assert_eq!(b["exhausted"]["until_ms"], T0 + 60_000);
    assert_eq!(b["exhausted"]["remaining_ms"], 59_000);
    assert!(
        b["exhausted"]["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("insufficient_quota")),
        "{b}"
    );
    let r = srv.admin(Method::GET, "/admin/providers").await;
    let rows = r.ok()["providers"].as_array().expect("rows").clone();
    assert_eq!(rows[1], *b, "the list shows the same row");
    assert_eq!(rows[0], claude);
    srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await
        .refused(403, "provider_exhausted");

    // Clear: answers what was cleared; the next permit goes at once.
    let r = srv
        .admin(Method::POST, "/admin/providers/openai/gpt-4o/clear")
        .await;
    let b = r.ok();
    assert_eq!(b["provider"], "openai");
    assert_eq!(b["model"], "gpt-4o");
    let cleared = &b["cleared"];
    assert_eq!(cleared["cooldown_until_ms"], T0 + 300_000);
    assert_eq!(cleared["effective_permille"], 500);
    assert_eq!(cleared["exhausted"]["until_ms"], T0 + 60_000);
    let r = srv
        .permit(
            "openai",
            json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 0}),
        )
        .await;
    assert_eq!(r.wait_ms(), 0);
    assert_eq!(r.body["effective_permille"], 1_000);
    let r = srv
        .admin(Method::GET, "/admin/providers/openai/gpt-4o")
        .await;
    assert_eq!(*r.ok(), clean("openai", "gpt-4o"));
    let text = srv.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_provider_effective_rate_permille{provider="openai",model="gpt-4o"}"#
        ),
        Some(1_000.0),
        "{text}"
    );
    // Again: nothing left to clear.
    let r = srv
        .admin(Method::POST, "/admin/providers/openai/gpt-4o/clear")
        .await;
    assert_eq!(
        r.ok()["cleared"],
        json!({"cooldown_until_ms": null, "effective_permille": 1000, "exhausted": null})
    );
    // Unknown keys are 404, bad ids 400 naming the path parameter.
    srv.admin(Method::GET, "/admin/providers/openai/nope")
        .await
        .refused(404, "unknown_provider");
    srv.admin(Method::POST, "/admin/providers/nope/gpt-4o/clear")
        .await
        .refused(404, "unknown_provider");
    srv.admin(Method::GET, "/admin/providers/openai/a%01b")
        .await
        .invalid("model");
    // A user's token is not the admin token.
    let user = format!("Bearer {}", token("alice"));
    for (method, path) in [
        (Method::GET, "/admin/providers"),
        (Method::GET, "/admin/providers/openai/gpt-4o"),
        (Method::POST, "/admin/providers/openai/gpt-4o/clear"),
    ] {
        srv.send(method, path, Some(&user), None)
            .await
            .refused(401, "unauthorized");
    }
    srv.shutdown().await;
}

/// Every class of answer, counted by class; only a 429 changes the rate.
#[tokio::test]
async fn feedback_classes_and_their_metrics() {
    let srv = Server::start(&config()).await;
    let cases = [
        (
            json!({"model": "gpt-4o", "status": 200, "headers": {"x-ratelimit-remaining-requests": "59", "x-ratelimit-limit-requests": "600"}}),
            "success",
            false,
        ),
        (
            json!({"model": "gpt-4o", "status": 503, "headers": {"retry-after": "1"}}),
            "server_error",
            true,
        ),
        (
            json!({"model": "gpt-4o", "status": 400, "headers": {}, "body": "{\"error\": {\"message\": \"bad\", \"type\": \"invalid_request_error\"}}"}),
            "client_error",
            false,
        ),
        (
            json!({"model": "gpt-4o", "status": 100, "headers": {}}),
            "client_error",
            false,
        ),
    ];
    for (body, class, retryable) in cases {
        let r = srv.feedback("openai", body.clone()).await;
        let b = r.ok();
        assert_eq!(b["class"], class, "{body}");
        assert_eq!(b["retryable"], retryable, "{body}");
        assert!(b.get("cooldown_until_ms").is_none(), "{b}");
        assert!(b.get("effective_permille").is_none(), "{b}");
    }
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 503, "headers": {"retry-after": "1"}}),
        )
        .await;
    assert_eq!(r.ok()["retry_after_ms"], 1_000);
    let text = srv.metrics().await;
    for (class, n) in [
        ("success", 1.0),
        ("server_error", 2.0),
        ("client_error", 2.0),
    ] {
        let line = format!(
            r#"tollgate_provider_responses_total{{provider="openai",model="gpt-4o",class="{class}"}}"#
        );
        assert_eq!(metric(&text, &line), Some(n), "{line}\n{text}");
    }
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Tenants and capacity

/// A tenant's share bounds it (0.2 of burst 10: 2 at once, `reject`) while
/// another tenant and calls without a tenant still get permits; an
/// unconfigured tenant uses the pool alone.
#[tokio::test]
async fn tenant_shares_through_http() {
    let srv = Server::start(&config()).await;
    let call = |tenant: &str| json!({"model": "claude", "tenant": tenant, "tokens": 0});
    for n in 1..=2 {
        let r = srv.permit("anthropic", call("noisy")).await;
        assert_eq!(r.wait_ms(), 0, "noisy call {n}");
    }
    // Its share refills at 120/min: one permit every 500 ms.
    let r = srv.permit("anthropic", call("noisy")).await;
    r.limited("provider_rate", 500);
    for n in 1..=5 {
        let r = srv.permit("anthropic", call("quiet")).await;
        assert_eq!(r.wait_ms(), 0, "quiet call {n}");
    }
    // 7 of the pool's 10 are taken: 3 left, for anyone.
    let r = srv.permit("anthropic", call("someone-else")).await;
    assert_eq!(r.wait_ms(), 0);
    for _ in 0..2 {
        srv.permit("anthropic", json!({"model": "claude", "tokens": 0}))
            .await
            .ok();
    }
    let r = srv
        .permit("anthropic", json!({"model": "claude", "tokens": 0}))
        .await;
    r.limited("provider_rate", 100);
    srv.shutdown().await;
}

/// Fair sharing through HTTP: SPEC §5's worked example (tenants a, weight
/// 3, and b, weight 1, on a pool of 600/min with a burst of 2), permit by
/// permit, to the millisecond.
#[tokio::test]
async fn weighted_tenants_share_fairly_through_http() {
    let srv = Server::start(&config_with(&format!("{PROVIDERS}{FAIR}"))).await;
    let call = |tenant: &str| json!({"model": "fair", "tenant": tenant, "tokens": 0});
    let rows: [(u64, &str, Result<u64, u64>); 13] = [
        (0, "a", Ok(0)),
        (0, "b", Ok(0)),
        (0, "a", Ok(100)),
        (0, "a", Err(200)),
        (0, "b", Ok(200)),
        (50, "a", Err(250)),
        (100, "a", Err(200)),
        (100, "b", Err(300)),
        (150, "a", Ok(150)),
        (200, "b", Err(200)),
        (250, "a", Err(150)),
        (300, "a", Ok(100)),
        (300, "b", Err(200)),
    ];
    let mut now = 0;
    for (at, tenant, want) in rows {
        srv.clock.advance(at - now);
        now = at;
        let r = srv.permit("openai", call(tenant)).await;
        match want {
            Ok(wait) => assert_eq!(r.wait_ms(), wait, "t={at} {tenant}"),
            Err(hint) => r.limited("provider_rate", hint),
        }
    }
    // The admin view at t = 300 (V 75,000, both ahead: 250 per ms): a's tag
    // 133,332 is 234 ms ahead, b's 200,000 is 500 ms; of the six permits
    // granted in the last minute, four were a's.
    let v = srv.admin(Method::GET, "/admin/providers/openai/fair").await;
    assert_eq!(
        v.ok()["tenants"],
        json!([
            {"name": "a", "weight": 3, "share": null, "active": true, "booked_ahead_ms": 234,
             "recent_share": 4.0 / 6.0},
            {"name": "b", "weight": 1, "share": null, "active": true, "booked_ahead_ms": 500,
             "recent_share": 2.0 / 6.0},
        ])
    );
    srv.shutdown().await;
}

/// Tokens are charged to the key's token rate: a call larger than burst +
/// max wait × rate can never be granted (400 `exceeds_capacity`); one that
/// fits the deadline waits.
#[tokio::test]
async fn token_rates_and_exceeds_capacity() {
    let srv = Server::start(&config()).await;
    // gpt-4o-mini: 60,000 tokens/min = 1/ms, burst 10,000, max wait 1,000.
    let r = srv
        .permit("openai", json!({"model": "gpt-4o-mini", "tokens": 11_001}))
        .await;
    let b = r.refused(400, "exceeds_capacity");
    assert_eq!(b["limit"], "provider_rate");
    assert_eq!(r.header("retry-after"), None);
    let r = srv
        .permit("openai", json!({"model": "gpt-4o-mini", "tokens": 11_000}))
        .await;
    assert_eq!(r.wait_ms(), 1_000, "the boundary is inclusive");
    // The bucket is 1,000 in debt: 1 token waits 1,001 ms > 1,000.
    let r = srv
        .permit("openai", json!({"model": "gpt-4o-mini", "tokens": 1}))
        .await;
    r.limited("provider_rate", 1);
    // A shorter deadline of the call's own.
    srv.clock.advance(1_001);
    let r = srv
        .permit(
            "openai",
            json!({"model": "gpt-4o-mini", "tokens": 500, "max_wait_ms": 100}),
        )
        .await;
    r.limited("provider_rate", 399);
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Refusals of the request itself

#[tokio::test]
async fn unknown_provider_or_model_is_404_and_leaves_no_metric() {
    let srv = Server::start(&config()).await;
    for (provider, model) in [("nope", "gpt-4o"), ("openai", "gpt-5-unconfigured")] {
        let r = srv
            .permit(provider, json!({"model": model, "tokens": 1}))
            .await;
        r.refused(404, "unknown_provider");
        let r = srv
            .feedback(
                provider,
                json!({"model": model, "status": 429, "headers": {"retry-after": "5"}}),
            )
            .await;
        r.refused(404, "unknown_provider");
    }
    let text = srv.metrics().await;
    assert!(!text.contains("nope"), "{text}");
    assert!(!text.contains("gpt-5-unconfigured"), "{text}");
    srv.shutdown().await;
}

#[tokio::test]
async fn no_identity_is_401() {
    let srv = Server::start(&config()).await;
    let permit = json!({"model": "gpt-4o", "tokens": 0}).to_string();
    let fb = json!({"model": "gpt-4o", "status": 200, "headers": {}}).to_string();
    for (path, body) in [(permits("openai"), &permit), (feedback("openai"), &fb)] {
        for auth in [None, Some("Bearer not-a-jwt"), Some("Basic YWxpY2U6cHc=")] {
            let r = srv.send(Method::POST, &path, auth, Some(body)).await;
            r.refused(401, "unauthorized");
        }
        // A token signed with another key.
        let forged = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": T0 / 1_000 + 3_600}),
            &EncodingKey::from_secret(b"another-secret-another-secret-0123456789"),
        )
        .expect("sign");
        let r = srv
            .send(
                Method::POST,
                &path,
                Some(&format!("Bearer {forged}")),
                Some(body),
            )
            .await;
        r.refused(401, "unauthorized");
    }
    // Nothing was charged: the whole burst is still there.
    for _ in 0..60 {
        let r = srv
            .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await;
        assert_eq!(r.wait_ms(), 0);
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_400_naming_the_field() {
    let srv = Server::start(&config()).await;
    let too_many = (1u64 << 53) + 1;
    let permit_cases = [
        (json!({"tokens": 1}), "model"),
        (json!({"model": "gpt-4o"}), "tokens"),
        (json!({"model": "", "tokens": 1}), "model"),
        (json!({"model": "gpt\u{1}4o", "tokens": 1}), "model"),
        (json!({"model": "m".repeat(513), "tokens": 1}), "model"),
        (json!({"model": "gpt-4o", "tokens": -1}), "tokens"),
        (json!({"model": "gpt-4o", "tokens": 1.5}), "tokens"),
        (json!({"model": "gpt-4o", "tokens": "10"}), "tokens"),
        (json!({"model": "gpt-4o", "tokens": too_many}), "tokens"),
        (
            json!({"model": "gpt-4o", "tokens": 1, "input_tokens": too_many}),
            "input_tokens",
        ),
        (
            json!({"model": "gpt-4o", "tokens": 1, "output_tokens": too_many}),
            "output_tokens",
        ),
        (
            json!({"model": "gpt-4o", "tokens": 1, "max_wait_ms": -5}),
            "max_wait_ms",
        ),
        (
            json!({"model": "gpt-4o", "tokens": 1, "tenant": ""}),
            "tenant",
        ),
        (
            json!({"model": "gpt-4o", "tokens": 1, "wait": "yes"}),
            "wait",
        ),
        (json!({"model": 7, "tokens": 1}), "model"),
    ];
    for (body, field) in permit_cases {
        let r = srv.permit("openai", body.clone()).await;
        assert!(r.status == StatusCode::BAD_REQUEST, "{body}: {r:?}");
        r.invalid(field);
    }
    let feedback_cases = [
        (json!({"status": 200, "headers": {}}), "model"),
        (json!({"model": "gpt-4o", "headers": {}}), "status"),
        (json!({"model": "gpt-4o", "status": 200}), "headers"),
        (
            json!({"model": "gpt-4o", "status": 99, "headers": {}}),
            "status",
        ),
        (
            json!({"model": "gpt-4o", "status": 600, "headers": {}}),
            "status",
        ),
        (
            json!({"model": "gpt-4o", "status": 70_000, "headers": {}}),
            "status",
        ),
        (
            json!({"model": "gpt-4o", "status": -429, "headers": {}}),
            "status",
        ),
        (
            json!({"model": "gpt-4o", "status": 429, "headers": ["retry-after", "3"]}),
            "headers",
        ),
        (
            json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": 3}}),
            "headers.retry-after",
        ),
        (
            json!({"model": "gpt-4o", "status": 429, "headers": {}, "body": {"error": 1}}),
            "body",
        ),
    ];
    for (body, field) in feedback_cases {
        let r = srv.feedback("openai", body.clone()).await;
        assert!(r.status == StatusCode::BAD_REQUEST, "{body}: {r:?}");
        r.invalid(field);
    }
    // Not JSON, empty, trailing garbage.
    let auth = format!("Bearer {}", token("alice"));
    for raw in ["", "{", "[]", r#"{"model": "gpt-4o", "tokens": 1} x"#] {
        let r = srv
            .send(Method::POST, &permits("openai"), Some(&auth), Some(raw))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{raw:?}: {r:?}");
        assert_eq!(r.body["error"], "invalid_request", "{raw:?}");
    }
    // A provider path segment with a control character.
    let r = srv
        .permit("open%01ai", json!({"model": "gpt-4o", "tokens": 1}))
        .await;
    r.invalid("provider");
    // Nothing was charged by any of it.
    for _ in 0..60 {
        let r = srv
            .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await;
        assert_eq!(r.wait_ms(), 0);
    }
    srv.shutdown().await;
}

// ---------------------------------------------------------------------------
// Operations

/// Permits by outcome, answers by class and the effective rate, labelled by
/// provider and model only (never a user id, never an unconfigured key).
#[tokio::test]
async fn metrics_count_permits_answers_and_the_effective_rate() {
    let srv = Server::start(&config()).await;
    let user = "user-with-a-very-distinctive-id-77";
    for _ in 0..61 {
        srv.post(
            user,
            &permits("openai"),
            json!({"model": "gpt-4o", "tokens": 0}),
        )
        .await
        .ok();
    }
    srv.post(
        user,
        &permits("openai"),
        json!({"model": "gpt-4o", "tokens": 0, "max_wait_ms": 0}),
    )
    .await
    .limited("provider_rate", 200);
    let text = srv.metrics().await;
    for (outcome, n) in [("granted", 60.0), ("waited", 1.0), ("refused", 1.0)] {
        let line = format!(
            r#"tollgate_provider_permits_total{{provider="openai",model="gpt-4o",outcome="{outcome}"}}"#
        );
        assert_eq!(metric(&text, &line), Some(n), "{line}\n{text}");
    }
    let gauge = r#"tollgate_provider_effective_rate_permille{provider="openai",model="gpt-4o"}"#;
    assert_eq!(metric(&text, gauge), Some(1_000.0), "{text}");
    // A 429 halves it; the gauge follows.
    srv.feedback(
        "openai",
        json!({"model": "gpt-4o", "status": 429, "headers": {}}),
    )
    .await
    .ok();
    // Exhaustion refusals are counted as refused.
    srv.feedback(
        "openai",
        json!({"model": "gpt-4o", "status": 429, "headers": {}, "body": INSUFFICIENT_QUOTA}),
    )
    .await
    .ok();
    srv.post(
        user,
        &permits("openai"),
        json!({"model": "gpt-4o", "tokens": 0}),
    )
    .await
    .refused(403, "provider_exhausted");
    let text = srv.metrics().await;
    assert_eq!(metric(&text, gauge), Some(500.0), "{text}");
    for (class, n) in [("throttled", 1.0), ("exhausted", 1.0)] {
        let line = format!(
            r#"tollgate_provider_responses_total{{provider="openai",model="gpt-4o",class="{class}"}}"#
        );
        assert_eq!(metric(&text, &line), Some(n), "{line}\n{text}");
    }
    assert_eq!(
        metric(
            &text,
            r#"tollgate_provider_permits_total{provider="openai",model="gpt-4o",outcome="refused"}"#
        ),
        Some(2.0)
    );
    for help in [
        "# HELP tollgate_provider_permits ",
        "# HELP tollgate_provider_responses ",
        "# HELP tollgate_provider_effective_rate_permille ",
    ] {
        assert!(text.contains(help), "{help} missing:\n{text}");
    }
    assert!(!text.contains("distinctive"), "a user id leaked:\n{text}");
    srv.shutdown().await;
}

#[tokio::test]
async fn openapi_documents_the_provider_routes() {
    let srv = Server::start(&config()).await;
    let r = srv.send(Method::GET, "/openapi.json", None, None).await;
    let doc = r.ok();
    for (path, codes) in [
        (
            "/v1/providers/{provider}/permits",
            &["200", "400", "401", "403", "404", "429", "503"][..],
        ),
        (
            "/v1/providers/{provider}/feedback",
            &["200", "400", "401", "403", "404", "503"][..],
        ),
    ] {
        let op = &doc["paths"][path]["post"];
        assert!(op.is_object(), "{path} missing from the document");
        for code in codes {
            assert!(
                op["responses"][code].is_object(),
                "{path} documents {code}: {op}"
            );
        }
        assert_eq!(op["parameters"][0]["name"], "provider", "{op}");
        assert!(
            tollgate_server::http::routes::ROUTES.contains(&("post", path)),
            "{path} in ROUTES"
        );
    }
    let schemas = &doc["components"]["schemas"];
    for (schema, field) in [
        ("PermitBody", "tokens"),
        ("PermitResponse", "wait_ms"),
        ("FeedbackBody", "headers"),
        ("FeedbackResponse", "class"),
    ] {
        assert!(
            schemas[schema]["properties"][field].is_object(),
            "{schema}.{field}: {schemas}"
        );
    }
    srv.shutdown().await;
}

/// A bad `[providers]` section is refused with every field path, in
/// process and by `tollgate check-config` (exit 64).
#[test]
fn a_bad_provider_section_is_refused_with_its_field_paths() {
    let bad = config_with(
        r#"
[providers."openai:gpt-4o"]
requests = { amount = 0, period_ms = 60000 }
max_wait_ms = -1

[providers."openai:gpt-4o".tenants.noisy]
share = 1.5

[providers.nocolon]
requests = { amount = 1, period_ms = 1000 }

[providers."gemini:flash"]
kind = "bard"

[providers."anthropic:claude"]
requests = { amount = 10, period_ms = 60000 }
aimd = { floor_permille = 0, step_permille = 50, decrease_interval_ms = 5000, increase_interval_ms = 10000 }

[providers."anthropic:claude".tenants.heavy]
weight = 0

[providers."anthropic:claude".tenants.empty]

[providers."openai:tpm-only"]
tokens = { amount = 1000, period_ms = 60000 }

[providers."openai:tpm-only".tenants.weighted]
weight = 2
"#,
    );
    let expected = [
        r#"providers."openai:gpt-4o".requests"#,
        r#"providers."openai:gpt-4o".max_wait_ms"#,
        r#"providers."openai:gpt-4o".tenants."noisy".share"#,
        r#"providers."nocolon""#,
        r#"providers."gemini:flash".kind"#,
        r#"providers."gemini:flash""#,
        r#"providers."anthropic:claude".aimd"#,
        r#"providers."anthropic:claude".tenants."heavy".weight"#,
        r#"providers."anthropic:claude".tenants."empty""#,
        r#"providers."openai:tpm-only".tenants."weighted".weight"#,
    ];
    let e = Config::parse(&bad, "bad.toml", std::path::Path::new(".")).expect_err("refused");
    let paths: Vec<&str> = e.errors.iter().map(|e| e.path.as_str()).collect();
    for path in expected {
        assert!(paths.contains(&path), "{path} in {paths:?}");
    }

    let dir = TempDir::new();
    let run = |name: &str, text: &str| {
        let path = dir.0.join(name);
        std::fs::write(&path, text).expect("write config");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("check-config")
            .arg(&path)
            .output()
            .expect("run tollgate");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run("good.toml", &config());
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = run("bad.toml", &bad);
    assert_eq!(code, Some(64), "{stderr}");
    for path in expected {
        assert!(stderr.contains(path), "{path} is named in:\n{stderr}");
    }
    // A shape error (an unknown field) names its field too.
    let (code, stderr) = run(
        "typo.toml",
        &config().replace("policy = \"reject\"", "polcy = \"reject\""),
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains(r#"providers."anthropic:claude".polcy"#),
        "{stderr}"
    );
    let (code, stderr) = run(
        "policy.toml",
        &config().replace("policy = \"reject\"", "policy = \"drop\""),
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("policy"), "{stderr}");
}

/// `POST /admin/reload` swaps the providers: a key added is served, a key
/// removed is 404; a bad provider section is refused and the old providers
/// keep serving.
#[tokio::test]
async fn reload_swaps_the_providers_and_a_bad_file_keeps_the_old() {
    let srv = Server::start(&config()).await;
    let gemini = json!({"model": "flash", "tokens": 0});
    srv.permit("gemini", gemini.clone())
        .await
        .refused(404, "unknown_provider");

    // A bad provider section: refused with its path; the old ones serve.
    let bad = config_with(&format!(
        "{PROVIDERS}\n[providers.\"gemini:flash\"]\nrequests = {{ amount = 0, period_ms = 60000 }}\n"
    ));
    std::fs::write(srv.file(), bad).expect("write");
    let r = srv.reload().await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.body["error"], "invalid_config");
    assert_eq!(
        r.body["errors"][0]["path"],
        r#"providers."gemini:flash".requests"#
    );
    srv.permit("gemini", gemini.clone())
        .await
        .refused(404, "unknown_provider");
    assert_eq!(
        srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await
            .wait_ms(),
        0
    );

    // A good file: gemini:flash added (reject, burst 1), openai:gpt-4o gone.
    let good = config_with(
        r#"
[providers."gemini:flash"]
requests = { amount = 60, period_ms = 60000, burst = 1 }
policy = "reject"
"#,
    );
    std::fs::write(srv.file(), good).expect("write");
    let r = srv.reload().await;
    assert_eq!(r.ok()["reloaded"], true);
    assert_eq!(srv.permit("gemini", gemini.clone()).await.wait_ms(), 0);
    srv.permit("gemini", gemini.clone())
        .await
        .limited("provider_rate", 1_000);
    srv.permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await
        .refused(404, "unknown_provider");
    // The feedback route follows the new keys too.
    let r = srv
        .feedback(
            "gemini",
            json!({"model": "flash", "status": 429, "headers": {},
                   "body": r#"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Resource exhausted.", "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]}}"#}),
        )
        .await;
    let b = r.ok();
    assert_eq!(b["class"], "throttled");
    assert_eq!(b["cooldown_until_ms"], T0 + 7_000);
    let text = srv.metrics().await;
    assert!(
        metric(&text, r#"tollgate_config_reloads_total{result="ok"}"#).unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    srv.shutdown().await;
}

/// On Redis under `fail_closed`: permits and feedback are decided in Redis
/// (the burst of 60 holds), and the admin clear too; while Redis is down
/// they answer 503 `store_unavailable` (a success needs no store and still
/// answers 200).
#[tokio::test]
async fn fail_closed_is_503_while_redis_is_down() {
    let mut redis = RedisServer::start().expect("redis-server");
    let store = fail_closed_store(&redis.url());
    let srv = Server::start(&config_on(&store, PROVIDERS)).await;
    // Redis decides on its own clock (TIME), which moves while the test
    // runs: the bucket refills a little between calls, so call 61 waits
    // 100 ms less the time the test took.
    let mut waits = Vec::new();
    for _ in 1..=61u64 {
        let r = srv
            .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
            .await;
        waits.push(r.wait_ms());
    }
    assert!(waits[..60].iter().all(|w| *w == 0), "{waits:?}");
    assert!(waits[60] <= 100, "{waits:?}");
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "2"}}),
        )
        .await;
    assert_eq!(r.ok()["effective_permille"], 500);
    // The admin clear, in Redis: the rate the 429 halved is full again.
    // (The cooldown's end, taken on the fake clock at T0, is long past by
    // Redis's own: there is none to clear.)
    let clear = "/admin/providers/openai/gpt-4o/clear";
    let r = srv.admin(Method::POST, clear).await;
    assert_eq!(r.ok()["cleared"]["effective_permille"], 500);
    let r = srv
        .admin(Method::GET, "/admin/providers/openai/gpt-4o")
        .await;
    assert_eq!(r.ok()["cooldown_until_ms"], Value::Null);
    assert_eq!(r.ok()["effective_permille"], 1_000);

    redis.stop();
    let r = srv
        .permit("openai", json!({"model": "gpt-4o", "tokens": 0}))
        .await;
    r.refused(503, "store_unavailable");
    // A clear that cannot reach the store clears nothing: 503.
    srv.admin(Method::POST, clear)
        .await
        .refused(503, "store_unavailable");
    srv.admin(Method::GET, "/admin/providers")
        .await
        .refused(503, "store_unavailable");
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "2"}}),
        )
        .await;
    r.refused(503, "store_unavailable");
    let r = srv
        .feedback(
            "openai",
            json!({"model": "gpt-4o", "status": 200, "headers": {}}),
        )
        .await;
    assert_eq!(r.ok()["class"], "success");
    // Unknown keys and identity are still checked without the store.
    srv.permit("nope", json!({"model": "m", "tokens": 0}))
        .await
        .refused(404, "unknown_provider");
    let body = json!({"model": "gpt-4o", "tokens": 0}).to_string();
    srv.send(Method::POST, &permits("openai"), None, Some(&body))
        .await
        .refused(401, "unauthorized");
    srv.shutdown().await;
}
