//! End to end, in real time: callers → `tollgate serve` (provider permits
//! and feedback over HTTP) → a fake model provider, a real local HTTP
//! server that enforces its own quota and answers 429 in its provider's
//! format (OpenAI, Anthropic, Gemini).
//!
//! The governor is deliberately configured above the provider's quota
//! (32 requests/s against a quota of 20/s, burst 10), as a fleet whose config is out
//! of date would be. The first 429s come back as feedback: each sets the
//! shared cooldown to the provider's hint and halves the effective rate
//! (AIMD), after which the callers stay within the quota and 429s become
//! rare. Every figure is printed (`--nocapture`) for the record.
//!
//! Real time is the point here (a real provider's quota runs on wall-clock
//! time), so this test reads a monotonic clock and runs for a few seconds;
//! every other provider test runs on the fake clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_server::config::Config;

/// The fake provider's quota: 20 requests per second, burst 10 (room for
/// the bunching a loaded machine adds between a permit and the call).
const QUOTA_PER_S: u64 = 20;
const QUOTA_BURST: u64 = 10;
/// The governor's (out of date) rate: 32 per second = 1,920 per minute,
/// burst 4.
const GOVERNOR_PER_MIN: u64 = 1_920;
const GOVERNOR_BURST: u64 = 4;
/// How long the callers run, ms.
const RUN_MS: u64 = 4_000;
/// Concurrent callers per provider.
const CALLERS: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Format {
    fn provider(self) -> &'static str {
        match self {
            Format::OpenAi => "openai",
            Format::Anthropic => "anthropic",
            Format::Gemini => "gemini",
        }
    }
}

/// A provider's own quota: an exact token bucket on real time (levels in
/// request·ms, refilled `QUOTA_PER_S` per ms).
struct Quota {
    clock: MonotonicClock,
    state: Mutex<(u64, u64)>, // (level, at)
    accepted: AtomicU64,
    refused: AtomicU64,
    /// (ms since start, accepted?) of every request.
    log: Mutex<Vec<(u64, bool)>>,
    start: u64,
}

impl Quota {
    fn new() -> Self {
        let clock = MonotonicClock::new();
        let start = clock.now_ms();
        Self {
            state: Mutex::new((QUOTA_BURST * 1_000, start)),
            clock,
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
            start,
        }
    }

    /// Takes one request: `Ok` or `Err(ms until one is available)`.
    fn take(&self) -> Result<(), u64> {
        let now = self.clock.now_ms();
        let mut s = self.state.lock();
        let (level, at) = *s;
        let level = (level + now.saturating_sub(at) * QUOTA_PER_S).min(QUOTA_BURST * 1_000);
        let ok = level >= 1_000;
        *s = (if ok { level - 1_000 } else { level }, now.max(at));
        drop(s);
        self.log.lock().push((now - self.start, ok));
        if ok {
            self.accepted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            Err((1_000 - level).div_ceil(QUOTA_PER_S).max(1))
        }
    }
}

/// The provider's answer to one call, in its format.
async fn provider(State((format, quota)): State<(Format, Arc<Quota>)>) -> Response {
    let wait_ms = match quota.take() {
        Ok(()) => {
            let body = match format {
                Format::OpenAi => json!({"choices": [{"message": {"content": "ok"}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
                Format::Anthropic => {
                    json!({"type": "message", "content": [{"type": "text", "text": "ok"}]})
                }
                Format::Gemini => json!({"candidates": [{"content": {"parts": [{"text": "ok"}]}}]}),
            };
            return (StatusCode::OK, axum::Json(body)).into_response();
        }
        Err(ms) => ms,
    };
    let mut headers = HeaderMap::new();
    let body = match format {
        Format::OpenAi => {
            headers.insert(
                "x-ratelimit-limit-requests",
                HeaderValue::from(QUOTA_PER_S * 60),
            );
            headers.insert("x-ratelimit-remaining-requests", HeaderValue::from(0));
            headers.insert(
                "x-ratelimit-reset-requests",
                HeaderValue::from_str(&format!("{wait_ms}ms")).expect("header"),
            );
            json!({"error": {
                "message": format!("Rate limit reached for gpt-e2e on requests per min (RPM): Limit {}, Used {}, Requested 1. Please try again in {wait_ms}ms.", QUOTA_PER_S * 60, QUOTA_PER_S * 60),
                "type": "requests",
                "param": null,
                "code": "rate_limit_exceeded"
            }})
        }
        Format::Anthropic => {
            // Anthropic's retry-after is in whole seconds.
            headers.insert("retry-after", HeaderValue::from(wait_ms.div_ceil(1_000)));
            headers.insert(
                "anthropic-ratelimit-requests-limit",
                HeaderValue::from(QUOTA_PER_S * 60),
            );
            headers.insert(
                "anthropic-ratelimit-requests-remaining",
                HeaderValue::from(0),
            );
            json!({"type": "error", "error": {"type": "rate_limit_error",
                "message": "Number of requests has exceeded your per-minute rate limit"}})
        }
        Format::Gemini => json!({"error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                                 "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                                 "quotaValue": (QUOTA_PER_S * 60).to_string()}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                 "retryDelay": format!("{}.{:03}s", wait_ms / 1_000, wait_ms % 1_000)}
            ]
        }}),
    };
    (StatusCode::TOO_MANY_REQUESTS, headers, axum::Json(body)).into_response()
}

async fn start_provider(format: Format) -> (SocketAddr, Arc<Quota>) {
    let quota = Arc::new(Quota::new());
    let app = Router::new()
        .route("/v1/generate", post(provider))
        .with_state((format, Arc::clone(&quota)));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, quota)
}

fn config() -> String {
    let mut providers = String::new();
    for p in ["openai", "anthropic", "gemini"] {
        providers.push_str(&format!(
            r#"
[providers."{p}:e2e"]
requests = {{ amount = {GOVERNOR_PER_MIN}, period_ms = 60000, burst = {GOVERNOR_BURST} }}
policy = "block"
max_wait_ms = 5000
"#
        ));
    }
    format!(
        r#"listen = "127.0.0.1:0"
default_plan = "p"
max_in_flight = 4096

[identity]
mode = "trusted_header"
trusted_proxies = ["127.0.0.1"]

[plans.p]
turns = {{ amount = 1000, period_ms = 60000 }}
tokens = {{ amount = 1000000, period_ms = 60000 }}
concurrent_runs = 100

# Every caller is one service identity: its wait=true permits all wait at
# once (the default bound per user is 8).
[limits]
max_waits_per_user = 64
{providers}"#
    )
}

/// What one provider's callers saw.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    throttled: u64,
}

/// One caller: permit (the server waits), call, feedback — until `RUN_MS`.
async fn caller(
    client: reqwest::Client,
    sidecar: SocketAddr,
    provider_addr: SocketAddr,
    format: Format,
    clock: MonotonicClock,
    start: u64,
) -> Tally {
    let p = format.provider();
    let mut tally = Tally::default();
    while clock.now_ms() - start < RUN_MS {
        let permit = client
            .post(format!("http://{sidecar}/v1/providers/{p}/permits"))
            .header("x-tollgate-user", "caller")
            .json(&json!({"model": "e2e", "tokens": 0, "wait": true}))
            .send()
            .await
            .expect("permit");
        if permit.status() != reqwest::StatusCode::OK {
            // Refused (the wait would pass max_wait_ms): ask again; with
            // `wait: true` the server waits out the next grant itself.
            let body: Value = permit.json().await.expect("refusal body");
            assert_eq!(body["error"], "provider_cooldown", "{body}");
            continue;
        }
        let answer = client
            .post(format!("http://{provider_addr}/v1/generate"))
            .json(&json!({"prompt": "hi"}))
            .send()
            .await
            .expect("provider");
        tally.calls += 1;
        let status = answer.status().as_u16();
        if status == 429 {
            tally.throttled += 1;
        }
        let headers: BTreeMap<String, String> = answer
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let body = answer.text().await.expect("body");
        let fb = client
            .post(format!("http://{sidecar}/v1/providers/{p}/feedback"))
            .header("x-tollgate-user", "caller")
            .header("x-tollgate-scope", "tollgate:feedback")
            .json(&json!({"model": "e2e", "status": status, "headers": headers, "body": body}))
            .send()
            .await
            .expect("feedback");
        let fb: Value = fb.json().await.expect("feedback body");
        let expected = if status == 429 {
            "throttled"
        } else {
            "success"
        };
        assert_eq!(fb["class"], expected, "{format:?}: {fb}");
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_through_the_governor_stay_within_the_providers_quota() {
    let dir = std::env::temp_dir().join(format!("tollgate-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, config()).expect("config");
    let config = Config::load(&file).expect("valid config");
    let _ = std::fs::remove_dir_all(&dir);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let sidecar = listener.local_addr().expect("addr");
    tokio::spawn(tollgate_server::serve(
        config,
        listener,
        None,
        |_| {},
        std::future::pending(),
    ));

    let clock = MonotonicClock::new();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut runs = Vec::new();
    for format in [Format::OpenAi, Format::Anthropic, Format::Gemini] {
        let (addr, quota) = start_provider(format).await;
        runs.push((format, addr, quota));
    }
    let start = clock.now_ms();
    let mut tasks = Vec::new();
    for (format, addr, _) in &runs {
        for _ in 0..CALLERS {
            tasks.push((
                *format,
                tokio::spawn(caller(
                    client.clone(),
                    sidecar,
                    *addr,
                    *format,
                    clock.clone(),
                    start,
                )),
            ));
        }
    }
    let mut tallies: Vec<(Format, Tally)> = Vec::new();
    for (format, task) in tasks {
        let t = task.await.expect("caller");
        match tallies.iter_mut().find(|(f, _)| *f == format) {
            Some((_, total)) => {
                total.calls += t.calls;
                total.throttled += t.throttled;
            }
            None => tallies.push((format, t)),
        }
    }
    let elapsed = clock.now_ms() - start;

    for (format, addr, quota) in &runs {
        let _ = addr;
        let tally = &tallies.iter().find(|(f, _)| f == format).expect("tally").1;
        let log = quota.log.lock().clone();
        let accepted = quota.accepted.load(Ordering::Relaxed);
        let refused = quota.refused.load(Ordering::Relaxed);
        let early = log.iter().filter(|(t, ok)| *t < 1_000 && !ok).count();
        let late_calls = log.iter().filter(|(t, _)| *t >= 1_000).count();
        let late_429 = log.iter().filter(|(t, ok)| *t >= 1_000 && !ok).count();
        let late_span_s = (elapsed.saturating_sub(1_000)) as f64 / 1_000.0;
        let late_rate = late_calls as f64 / late_span_s.max(0.001);
        eprintln!(
            "{format:?}: {} calls in {elapsed} ms ({accepted} accepted, {refused} answered 429); \
             429s in the first second {early}, after it {late_429} of {late_calls} calls; \
             send rate after the first second {late_rate:.1}/s against a quota of {QUOTA_PER_S}/s",
            tally.calls
        );
        assert_eq!(tally.calls, accepted + refused);
        assert_eq!(tally.throttled, refused);
        // The provider's quota held: it never accepted more than its bucket.
        assert!(
            accepted <= QUOTA_BURST + elapsed * QUOTA_PER_S / 1_000 + 1,
            "{format:?}: {accepted} accepted in {elapsed} ms"
        );
        // The out-of-date governor met 429s, and fed them back…
        assert!(
            refused >= 1,
            "{format:?}: the governor started above the quota"
        );
        // …after which they became rare, and the callers kept within quota.
        assert!(
            late_429 * 10 <= late_calls.max(10),
            "{format:?}: {late_429} of {late_calls} calls after the first second answered 429"
        );
        assert!(
            late_rate <= QUOTA_PER_S as f64 * 1.1,
            "{format:?}: {late_rate:.1} calls/s after the first second"
        );
    }
}
