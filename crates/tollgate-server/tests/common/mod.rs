//! Helpers shared by the integration tests: a temporary directory, JWT
//! minting, the HTTP response type with its assertions, the fail_closed
//! Redis store table, and the fake-clock server scaffolding (spawn, wait
//! for parked sleeps, shut down).
//!
//! Each test binary includes this module with `mod common;` and uses only a
//! subset of it.

// Every test binary compiles its own copy of this module and uses a subset
// of it; the rest would warn as dead code, and `pub` here only reaches the
// including test file.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::FakeClock;
use tollgate_server::config::Config;
use tollgate_testkit::T0;
use tollgate_testkit::redis::{unique_prefix, wait_until};

pub const ISSUER: &str = "https://issuer.test";
pub const AUDIENCE: &str = "tollgate-test";

/// An HS256 token for `user` signed with `secret`, issued at the fake
/// clock's start and expiring at `exp` (seconds).
pub fn token_with(user: &str, secret: &str, exp: u64) -> String {
    let claims = json!({
        "sub": user,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": T0 / 1_000,
        "exp": exp,
    });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign")
}

/// A valid HS256 token of a service that reports provider answers: `user`
/// with the `tollgate:feedback` scope, signed with `secret`, expiring an
/// hour after the fake clock's start.
pub fn service_token(user: &str, secret: &str) -> String {
    let claims = json!({
        "sub": user,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": T0 / 1_000,
        "exp": T0 / 1_000 + 3_600,
        "scope": "tollgate:feedback",
    });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign")
}

/// A valid HS256 token for `user` signed with `secret`, expiring an hour
/// after the fake clock's start.
pub fn valid_token(user: &str, secret: &str) -> String {
    token_with(user, secret, T0 / 1_000 + 3_600)
}

/// A temporary directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory named after the test binary
    /// (`tollgate-<binary>-test-<pid>-<n>`).
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "tollgate-{}-test-{}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `[store]` table for the Redis at `url` under `fail_closed`, with a
/// 1,000 ms operation timeout and a fresh key prefix.
pub fn fail_closed_store(url: &str) -> String {
    format!(
        r#"[store]
kind = "redis"
url = "{}"
failure = "fail_closed"
op_timeout_ms = 1000
key_prefix = "{}""#,
        url,
        unique_prefix()
    )
}

/// The value of the metric line starting with `line_prefix`.
pub fn metric(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A server spawned by [`spawn`].
pub struct Spawned {
    pub addr: SocketAddr,
    pub clock: FakeClock,
    pub client: reqwest::Client,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

/// Serves `config` on `127.0.0.1:0` on a [`FakeClock`] at [`T0`], with a
/// client (30 s timeout) to talk to it; stop it with [`shutdown`].
pub async fn spawn(config: Config) -> Spawned {
    let clock = FakeClock::new(T0);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve(
        config,
        listener,
        Some(Arc::new(clock.clone())),
        |_| {},
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    Spawned {
        addr,
        clock,
        client,
        stop: Some(stop),
        task,
    }
}

/// A server started by [`serve_loopback`].
pub struct Loopback {
    /// The HTTP API.
    pub http: SocketAddr,
    /// The gRPC API.
    pub grpc: SocketAddr,
    /// The operator's port, when asked for.
    pub admin: Option<SocketAddr>,
    /// The server's clock (a fake one at [`T0`]).
    pub clock: FakeClock,
    /// Stops it (see [`shutdown`]).
    pub stop: Option<oneshot::Sender<()>>,
    /// The server task.
    pub task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

/// Serves `config` with `serve_with` on a [`FakeClock`] at [`T0`], HTTP and
/// gRPC each on its own loopback listener, and with `admin_apart` the
/// operator's routes on a third.
pub async fn serve_loopback(config: Config, admin_apart: bool) -> Loopback {
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.expect("bind") };
    let (http, grpc) = (bind().await, bind().await);
    let (http_addr, grpc_addr) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let mut listeners = tollgate_server::Listeners::new(http).with_grpc(grpc);
    let mut admin = None;
    if admin_apart {
        let l = bind().await;
        admin = Some(l.local_addr().unwrap());
        listeners = listeners.with_admin(l);
    }
    let clock = FakeClock::new(T0);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve_with(
        config,
        listeners,
        Some(Arc::new(clock.clone())),
        |_| {},
        async move {
            let _ = stopped.await;
        },
    ));
    Loopback {
        http: http_addr,
        grpc: grpc_addr,
        admin,
        clock,
        stop: Some(stop),
        task,
    }
}

/// Waits (real time: the request runs concurrently) until `n` sleeps are
/// parked on `clock`.
pub async fn wait_for_sleepers(clock: &FakeClock, n: usize) {
    let clock = clock.clone();
    let ok = wait_until(10, || {
        let c = clock.clone();
        async move { c.pending_sleeps() == n }
    })
    .await;
    assert!(ok, "expected {n} sleeps parked on the fake clock");
}

/// Stops a server gracefully through `stop` and checks its `task` ended
/// cleanly.
pub async fn shutdown(
    stop: Option<oneshot::Sender<()>>,
    mut task: JoinHandle<Result<(), tollgate_server::StartError>>,
) {
    if let Some(stop) = stop {
        let _ = stop.send(());
    }
    let ended = tokio::time::timeout(Duration::from_secs(10), &mut task)
        .await
        .expect("the server stops within 10 s");
    ended.expect("server task").expect("server ran cleanly");
}

/// A response: status, headers and the JSON body (`Null` when not JSON).
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }

    #[track_caller]
    pub fn ok(&self) -> &Value {
        assert_eq!(self.status, StatusCode::OK, "{self:?}");
        &self.body
    }

    /// Asserts a refusal: status, `error`, and the body carries a message.
    #[track_caller]
    pub fn refused(&self, status: u16, error: &str) -> &Value {
        assert_eq!(self.status.as_u16(), status, "{self:?}");
        assert_eq!(self.body["error"], error, "{self:?}");
        assert!(
            self.body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "a refusal has a message: {self:?}"
        );
        &self.body
    }

    /// Asserts a retryable limit refusal (429) naming `limit`, with its
    /// exact hint and the headers that go with it.
    #[track_caller]
    pub fn limited(&self, limit: &str, retry_after_ms: u64) {
        self.refused(429, limit);
        assert_eq!(self.body["limit"], limit, "{self:?}");
        assert_eq!(self.body["retry_after_ms"], retry_after_ms, "{self:?}");
        let secs = retry_after_ms.div_ceil(1_000).to_string();
        assert_eq!(self.header("retry-after"), Some(secs.as_str()), "{self:?}");
        assert_eq!(
            self.header("ratelimit-reset"),
            Some(secs.as_str()),
            "{self:?}"
        );
        assert_eq!(self.header("ratelimit-remaining"), Some("0"), "{self:?}");
    }
}

/// Sends `method url` with an optional `Authorization` value and raw JSON
/// body; asserts the answer is not a 500.
pub async fn send_with(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    auth: Option<&str>,
    body: Option<&str>,
) -> Resp {
    let mut req = client.request(method, url);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_ne!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "no input produces a 500: {text}"
    );
    Resp {
        status,
        headers,
        body,
    }
}
