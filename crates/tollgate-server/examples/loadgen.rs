//! A load generator for `tollgate serve`: decisions per second, latency per
//! call and the CPU split between itself, the server and Redis.
//!
//! # Running it
//!
//! Build the server and this tool in release mode, start the server on a
//! bench config (a generous plan, dev identity, `127.0.0.1:8788`), then
//! run the load:
//!
//! ```sh
//! cargo build --release -p tollgate-server --examples --bin tollgate
//!
//! # Memory store.
//! target/release/tollgate serve --config crates/tollgate-server/examples/bench-memory.toml &
//! target/release/examples/loadgen --mode admit --duration 10 --warmup 2
//! target/release/examples/loadgen --mode reserve --duration 10 --warmup 2
//! target/release/examples/loadgen --mode rls --duration 10 --warmup 2   # rls_listen, port 8790
//! kill %1
//!
//! # Redis store: a fresh, throwaway redis-server (not the machine's 6379;
//! # if 6399 is taken, pick a free port and change `url` in bench-redis.toml).
//! redis-server --port 6399 --save '' --appendonly no --daemonize yes
//! target/release/tollgate serve --config crates/tollgate-server/examples/bench-redis.toml &
//! target/release/examples/loadgen --mode admit --duration 10 --warmup 2 --redis-port 6399
//! target/release/examples/loadgen --mode reserve --duration 10 --warmup 2 --redis-port 6399
//! target/release/examples/loadgen --mode rls --duration 10 --warmup 2 --redis-port 6399
//! kill %1; redis-cli -p 6399 shutdown nosave
//! ```
//!
//! Flags (all optional):
//!
//! * `--url URL` — the server (default `http://127.0.0.1:8788`).
//! * `--mode admit|reserve|rls|limitador-http` — what one operation is
//!   (default `admit`):
//!   * `admit`: `POST /v1/runs {invocation_id}` then
//!     `DELETE /v1/runs/{invocation_id}` (an admit + release pair);
//!   * `reserve`: `POST /v1/tokens/reserve {invocation_id, estimate}` then
//!     `POST /v1/tokens/settle {reservation_id, actual}` (reserve + settle).
//!
//!   * `rls`: one gRPC `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//!     to the server's `rls_listen`, `--rls-url` (default
//!     `http://127.0.0.1:8790`, the bench configs' `rls_listen`) for
//!     `--domain` (default `tollgate`) with one descriptor
//!     `{--descriptor-key: u<n>}` (default key `user_id`), `hits_addend` 1:
//!     OK counts as 2xx, OVER_LIMIT as 429. `--rls-key KEY` sends the
//!     server's `[rls] key` as `x-tollgate-rls-key` metadata (needed when the
//!     server has one). Up to 8 HTTP/2 connections are shared by the tasks.
//!     Any Envoy RLS server will do (Kuadrant limitador's `-p` port too).
//!   * `permit`: one `POST /v1/providers/bench/permits {"model": --model,
//!     "tenant": "t<n mod 4>", "tokens": 0}` (the bench configs' provider
//!     `bench`: `--model shares`, four tenants with a quarter share each, as
//!     today; `--model fair`, the default, the same four weighted 1 to 4).
//!   * `limitador-http`: Kuadrant limitador's own HTTP API, one
//!     `POST /check_and_report {"namespace": --domain, "values":
//!     {--descriptor-key: "u<n>"}, "delta": 1}` (no bearer token): 200 is a
//!     grant, 429 a denial. Give limitador's HTTP port as `--url` and
//!     `--ready-path /status`.
//!
//!   The second call is made only when the first answered 2xx. Every
//!   operation is for a uniformly random user and a fresh invocation id.
//!   In reserve mode that makes every model call a new run, the costliest
//!   case for state: each leaves a run record (call counter) that the store
//!   keeps for `RESERVATION_RETENTION_MS` (1 h), at most 256 per user, so
//!   state grows during a run; start a fresh server (and Redis) per
//!   measurement to compare like with like.
//! * `--concurrency N` — tasks, each with one call in flight (default 64).
//! * `--users N` — distinct users `u0` … `u{N-1}` (default 10000).
//! * `--user-prefix P` — name them `P0` … instead (default `u`; the HTTP
//!   modes), e.g. a flooding user beside the normal ones
//!   (`benches/refusal-flood`).
//! * `--rate R` — offer at most R operations a second in all (each task
//!   starts one every concurrency / R seconds; default: as fast as the
//!   answers come), so two runs offer the same load.
//! * `--refusals-expected` — a 429 to the check operation made before the
//!   run is not an error (a flood of a user the plan refuses).
//! * `--duration S`, `--warmup S` — measured window and warm-up before it,
//!   seconds (defaults 10 and 2).
//! * `--estimate N`, `--actual N` — reserve mode's token counts (1000, 800).
//! * `--workers N` — tokio worker threads of this tool (default: one per core).
//! * Identity, one of: nothing (dev mode: HS256 with
//!   `tollgate_server::identity::DEV_SECRET`, claims `sub`, `iat`, `exp`, which
//!   is all a dev server with no `issuer`/`audience` checks); `--secret S`
//!   (HS256 with that secret, plus `--issuer I` / `--audience A` if the
//!   server requires them); or `--config FILE` (the server's own config file:
//!   tokens are minted by `Verifier::mint` of that identity config, so the
//!   issuer, audience and user claim match whatever it says); or
//!   `--user-header NAME` (no token: each call carries `NAME: u<n>`, for a
//!   server in `trusted_header` mode whose `header` is NAME and whose
//!   `trusted_proxies` include 127.0.0.1).
//! * `--server-pid PID` — the server process; default: the process
//!   listening on the URL's port (found through `/proc/net/tcp` and
//!   `/proc/*/fd`).
//! * `--redis-port P` / `--redis-pid PID` — also report `redis-server`'s CPU.
//! * `--ready-path PATH` — what is asked (GET, 2xx) before the run to see
//!   the server is up (default `/readyz`; limitador's is `/status`).
//! * `--json FILE` — also write the run's figures to FILE as one JSON object
//!   (decisions/s, p50/p99/p99.9 in ms, CPU % of each process and the
//!   server's and Redis's CPU µs per decision); `benches/compare` reads it.
//!
//! # What is measured
//!
//! One HTTP/1.1 client (hyper's pooled `hyper_util` client: keep-alive
//! connections, `TCP_NODELAY`; lighter per request than `reqwest`, which
//! matters when the tool shares the machine with the server) shared by
//! `--concurrency` tokio tasks, so up to that many connections. One token
//! per user is minted before anything is timed. After the warm-up, a call counts when it starts
//! and ends inside the measured window; **decisions/s** counts every such
//! HTTP call (an admit and a release are two decisions), **pairs/s** the
//! operations whose two calls both counted and both answered 2xx. Each call
//! is classed 2xx, 429 or other (any other status, or a transport error);
//! non-2xx answers are tallied by status and error code. Latency is per call,
//! from sending the request to reading the whole body.
//!
//! **CPU**, in % of one core over the measured window (so a 2-core machine
//! has 200 %): this tool (`/proc/self/stat`), the server and `redis-server`
//! (`/proc/<pid>/stat`, utime + stime of all threads), and `other`: the rest
//! of the machine's busy time (`/proc/stat`), i.e. how quiet it was. On a
//! small machine the load tool and the server compete for the same cores:
//! read the figures as a split of one box, not as the server's ceiling.

// A benchmark measures wall time and prints its results: real clocks and
// stdout are its job.
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::print_stdout
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde::Deserialize;
use tollgate_core::{Clock, MonotonicClock};
use tollgate_server::identity::DEV_SECRET;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

// CPU accounting (`/proc`) and the end-of-run report (printed and
// `--json`), in loadgen/ beside this file.
#[path = "loadgen/cpu.rs"]
mod cpu;
#[path = "loadgen/report.rs"]
mod report;

use cpu::{clock_ticks_per_s, cpu_snap, pid_listening_on, url_port};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Admit,
    Reserve,
    /// Envoy's `ShouldRateLimit` over gRPC.
    Rls,
    /// Kuadrant limitador's `POST /check_and_report` (its HTTP API).
    LimitadorHttp,
    /// A provider permit of one of four tenants.
    Permit,
}

impl Mode {
    fn calls(self) -> [&'static str; 2] {
        match self {
            Mode::Admit => ["POST /v1/runs", "DELETE /v1/runs/{id}"],
            Mode::Reserve => ["POST /v1/tokens/reserve", "POST /v1/tokens/settle"],
            Mode::Rls => ["gRPC ShouldRateLimit", "(none)"],
            Mode::LimitadorHttp => ["POST /check_and_report", "(none)"],
            Mode::Permit => ["POST /v1/providers/bench/permits", "(none)"],
        }
    }

    /// One call is the whole operation.
    fn single_call(self) -> bool {
        matches!(self, Mode::Rls | Mode::LimitadorHttp | Mode::Permit)
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Admit => "admit",
            Mode::Reserve => "reserve",
            Mode::Rls => "rls",
            Mode::LimitadorHttp => "limitador-http",
            Mode::Permit => "permit",
        }
    }
}

struct Args {
    url: String,
    mode: Mode,
    concurrency: usize,
    users: usize,
    user_prefix: String,
    refusals_expected: bool,
    rate: Option<f64>,
    duration: Duration,
    warmup: Duration,
    estimate: u64,
    actual: u64,
    model: String,
    workers: Option<usize>,
    secret: Option<String>,
    issuer: Option<String>,
    audience: Option<String>,
    config: Option<PathBuf>,
    server_pid: Option<u32>,
    redis_pid: Option<u32>,
    redis_port: Option<u16>,
    rls_url: String,
    rls_key: Option<String>,
    domain: String,
    descriptor_key: String,
    ready_path: String,
    json: Option<PathBuf>,
    user_header: Option<HeaderName>,
}

fn usage(msg: &str) -> ! {
    eprintln!("loadgen: {msg} (see the doc comment at the top of examples/loadgen.rs)");
    std::process::exit(64)
}

fn parse_args() -> Args {
    let mut a = Args {
        url: "http://127.0.0.1:8788".to_owned(),
        mode: Mode::Admit,
        concurrency: 64,
        users: 10_000,
        user_prefix: "u".to_owned(),
        refusals_expected: false,
        rate: None,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        estimate: 1_000,
        actual: 800,
        model: "fair".to_owned(),
        workers: None,
        secret: None,
        issuer: None,
        audience: None,
        config: None,
        server_pid: None,
        redis_pid: None,
        redis_port: None,
        rls_url: "http://127.0.0.1:8790".to_owned(),
        rls_key: None,
        domain: "tollgate".to_owned(),
        descriptor_key: "user_id".to_owned(),
        ready_path: "/readyz".to_owned(),
        json: None,
        user_header: None,
    };
    let mut it = std::env::args().skip(1);
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> T {
        v.and_then(|s| s.parse().ok())
            .unwrap_or_else(|| usage(&format!("{flag} needs a number")))
    }
    fn secs(flag: &str, v: Option<String>) -> Duration {
        let s: f64 = num(flag, v);
        if !(s.is_finite() && s >= 0.0) {
            usage(&format!("{flag} needs a non-negative number of seconds"));
        }
        Duration::from_secs_f64(s)
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--url" => a.url = it.next().unwrap_or_else(|| usage("--url needs a URL")),
            "--mode" => {
                a.mode = match it.next().as_deref() {
                    Some("admit") => Mode::Admit,
                    Some("reserve") => Mode::Reserve,
                    Some("rls") => Mode::Rls,
                    Some("limitador-http") => Mode::LimitadorHttp,
                    Some("permit") => Mode::Permit,
                    _ => usage("--mode is admit, reserve, rls, limitador-http or permit"),
                }
            }
            "--concurrency" => a.concurrency = num(&flag, it.next()),
            "--users" => a.users = num(&flag, it.next()),
            "--user-prefix" => {
                a.user_prefix = it
                    .next()
                    .unwrap_or_else(|| usage("--user-prefix needs a value"));
            }
            "--refusals-expected" => a.refusals_expected = true,
            "--rate" => a.rate = Some(num(&flag, it.next())),
            "--duration" => a.duration = secs(&flag, it.next()),
            "--warmup" => a.warmup = secs(&flag, it.next()),
            "--estimate" => a.estimate = num(&flag, it.next()),
            "--model" => a.model = it.next().unwrap_or_else(|| usage("--model NAME")),
            "--actual" => a.actual = num(&flag, it.next()),
            "--workers" => a.workers = Some(num(&flag, it.next())),
            "--secret" => a.secret = it.next(),
            "--issuer" => a.issuer = it.next(),
            "--audience" => a.audience = it.next(),
            "--config" => a.config = it.next().map(PathBuf::from),
            "--server-pid" => a.server_pid = Some(num(&flag, it.next())),
            "--redis-pid" => a.redis_pid = Some(num(&flag, it.next())),
            "--redis-port" => a.redis_port = Some(num(&flag, it.next())),
            "--rls-url" => a.rls_url = it.next().unwrap_or_else(|| usage("--rls-url needs a URL")),
            "--rls-key" => {
                a.rls_key = Some(it.next().unwrap_or_else(|| usage("--rls-key needs a key")))
            }
            "--domain" => a.domain = it.next().unwrap_or_else(|| usage("--domain needs a name")),
            "--descriptor-key" => {
                a.descriptor_key = it
                    .next()
                    .unwrap_or_else(|| usage("--descriptor-key needs a key"))
            }
            "--ready-path" => {
                a.ready_path = it
                    .next()
                    .unwrap_or_else(|| usage("--ready-path needs a path"))
            }
            "--json" => {
                a.json = Some(
                    it.next()
                        .map_or_else(|| usage("--json needs a file"), PathBuf::from),
                )
            }
            "--user-header" => {
                a.user_header = Some(
                    it.next()
                        .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                        .unwrap_or_else(|| usage("--user-header needs a header name")),
                )
            }
            "-h" | "--help" => usage("flags"),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if a.concurrency == 0 || a.users == 0 || a.duration.is_zero() {
        usage("--concurrency, --users and --duration must be positive");
    }
    if a.config.is_some() && (a.secret.is_some() || a.issuer.is_some() || a.audience.is_some()) {
        usage("--config mints as the server's config says: no --secret/--issuer/--audience");
    }
    if a.user_header.is_some()
        && (a.config.is_some() || a.secret.is_some() || a.issuer.is_some() || a.audience.is_some())
    {
        usage("--user-header sends no token: no --config/--secret/--issuer/--audience");
    }
    a.url = a.url.trim_end_matches('/').to_owned();
    a
}

/// One identity header value per user, minted before anything is timed: a
/// bearer token, or with `--user-header` the user id itself.
fn mint_tokens(a: &Args) -> Result<Vec<HeaderValue>, String> {
    if a.user_header.is_some() {
        return (0..a.users)
            .map(|i| {
                HeaderValue::from_str(&format!("{}{i}", a.user_prefix)).map_err(|e| e.to_string())
            })
            .collect();
    }
    // Valid for the whole run and then some.
    let ttl_s = 3_600 + (a.warmup + a.duration).as_secs();
    let bearer = |t: String| {
        HeaderValue::from_str(&format!("Bearer {t}")).map_err(|e| format!("token header: {e}"))
    };
    let users = (0..a.users).map(|i| format!("{}{i}", a.user_prefix));
    if let Some(path) = &a.config {
        let cfg = tollgate_server::load_config(Some(path)).map_err(|e| e.to_string())?;
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let verifier = tollgate_server::verifier(&cfg, clock).map_err(|e| e.to_string())?;
        return users
            .map(|u| {
                verifier
                    .mint(&u, ttl_s)
                    .map_err(|e| format!("cannot mint with {}: {e}", path.display()))
                    .and_then(bearer)
            })
            .collect();
    }
    let secret = a.secret.as_deref().unwrap_or(DEV_SECRET);
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let now_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    users
        .map(|u| {
            let mut claims = serde_json::json!({ "sub": u, "iat": now_s, "exp": now_s + ttl_s });
            if let Some(iss) = &a.issuer {
                claims["iss"] = iss.as_str().into();
            }
            if let Some(aud) = &a.audience {
                claims["aud"] = aud.as_str().into();
            }
            jsonwebtoken::encode(&header, &claims, &key)
                .map_err(|e| format!("signing: {e}"))
                .and_then(bearer)
        })
        .collect()
}

// ---------------------------------------------------------------- the load

/// What a call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Ok,
    Denied,
    Other,
}

#[derive(Default)]
struct CallStats {
    ok: u64,
    denied: u64,
    other: u64,
    /// Latency of every counted call, µs.
    lat_us: Vec<u32>,
}

impl CallStats {
    fn merge(&mut self, o: CallStats) {
        self.ok += o.ok;
        self.denied += o.denied;
        self.other += o.other;
        self.lat_us.extend(o.lat_us);
    }

    fn total(&self) -> u64 {
        self.ok + self.denied + self.other
    }
}

#[derive(Default)]
struct TaskStats {
    calls: [CallStats; 2],
    pairs: u64,
}

struct Ctx {
    /// The pause between one task's operation starts (`--rate`).
    pace: Option<Duration>,
    /// Envoy RLS clients (rls mode), spread over a few HTTP/2 connections.
    rls: Vec<RateLimitServiceClient<Channel>>,
    /// The `x-tollgate-rls-key` metadata of every RLS call, if any.
    rls_key: Option<AsciiMetadataValue>,
    domain: String,
    descriptor_key: String,
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    mode: Mode,
    tokens: Vec<HeaderValue>,
    /// The header `tokens` go in: `authorization`, or `--user-header`.
    id_header: HeaderName,
    estimate: u64,
    actual: u64,
    /// Permit mode's model of the provider `bench`.
    model: String,
    /// Prefix of every invocation id: unique per run, so a rerun against
    /// the same server is not answered from an earlier run's idempotency.
    tag: String,
    measure_start: Instant,
    measure_end: Instant,
    /// Non-2xx answers at any time (warm-up included), by "status code",
    /// with one example body.
    refusals: Mutex<BTreeMap<String, (u64, String)>>,
}

/// A finished call.
struct Done {
    class: Class,
    started: Instant,
    ended: Instant,
    body: Option<Bytes>,
}

impl Ctx {
    async fn send(&self, method: Method, path: &str, user: usize, body: Option<String>) -> Done {
        let started = Instant::now();
        let req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header(&self.id_header, self.tokens[user].clone());
        self.exchange(started, req, body).await
    }

    /// Sends a request (with a JSON `body`, if any) and classes the answer.
    async fn exchange(
        &self,
        started: Instant,
        mut req: axum::http::request::Builder,
        body: Option<String>,
    ) -> Done {
        if body.is_some() {
            req = req.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let req = match req.body(Full::new(Bytes::from(body.unwrap_or_default()))) {
            Ok(r) => r,
            Err(e) => {
                self.note("bad request".to_owned(), e.to_string().as_bytes());
                return Done {
                    class: Class::Other,
                    started,
                    ended: Instant::now(),
                    body: None,
                };
            }
        };
        let (class, body) = match self.client.request(req).await {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(b) => {
                        let b = b.to_bytes();
                        let class = if status.is_success() {
                            Class::Ok
                        } else if status == StatusCode::TOO_MANY_REQUESTS {
                            Class::Denied
                        } else {
                            Class::Other
                        };
                        if class != Class::Ok {
                            self.note(status.as_u16().to_string(), &b);
                        }
                        (class, Some(b))
                    }
                    Err(e) => {
                        self.note(format!("{status}, body error"), e.to_string().as_bytes());
                        (Class::Other, None)
                    }
                }
            }
            Err(e) => {
                self.note("transport error".to_owned(), e.to_string().as_bytes());
                (Class::Other, None)
            }
        };
        Done {
            class,
            started,
            ended: Instant::now(),
            body,
        }
    }

    /// One `ShouldRateLimit` of one descriptor `{descriptor_key: u<user>}`,
    /// cost 1: OK is a grant, OVER_LIMIT a denial.
    async fn should_rate_limit(&self, user: usize) -> Done {
        let started = Instant::now();
        let req = RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: self.descriptor_key.clone(),
                    value: format!("u{user}"),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let mut client = self.rls[user % self.rls.len()].clone();
        let mut req = tonic::Request::new(req);
        if let Some(key) = &self.rls_key {
            req.metadata_mut()
                .insert(tollgate_server::envoy::KEY_METADATA, key.clone());
        }
        let class = match client.should_rate_limit(req).await {
            Ok(resp) => match Code::try_from(resp.get_ref().overall_code) {
                Ok(Code::Ok) => Class::Ok,
                Ok(Code::OverLimit) => Class::Denied,
                _ => {
                    self.note("unknown code".to_owned(), b"");
                    Class::Other
                }
            },
            Err(status) => {
                self.note(
                    format!("gRPC {:?}", status.code()),
                    status.message().as_bytes(),
                );
                Class::Other
            }
        };
        Done {
            class,
            started,
            ended: Instant::now(),
            body: None,
        }
    }

    /// One limitador `POST /check_and_report` of `{namespace: --domain,
    /// values: {--descriptor-key: u<user>}, delta: 1}`, no bearer token:
    /// 200 is a grant, 429 a denial.
    async fn check_and_report(&self, user: usize) -> Done {
        let started = Instant::now();
        let body = serde_json::json!({
            "namespace": self.domain,
            "values": { self.descriptor_key.as_str(): format!("u{user}") },
            "delta": 1,
        });
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("{}/check_and_report", self.url));
        self.exchange(started, req, Some(body.to_string())).await
    }

    fn note(&self, what: String, body: &[u8]) {
        #[derive(Deserialize)]
        struct Err {
            error: String,
        }
        let key = match serde_json::from_slice::<Err>(body) {
            Ok(e) => format!("{what} {}", e.error),
            Err(_) => what,
        };
        let mut map = self.refusals.lock();
        let entry = map
            .entry(key)
            .or_insert_with(|| (0, String::from_utf8_lossy(body).chars().take(300).collect()));
        entry.0 += 1;
    }

    fn in_window(&self, d: &Done) -> bool {
        d.started >= self.measure_start && d.ended <= self.measure_end
    }

    fn record(&self, stats: &mut TaskStats, i: usize, d: &Done) -> bool {
        if !self.in_window(d) {
            return false;
        }
        let s = &mut stats.calls[i];
        match d.class {
            Class::Ok => s.ok += 1,
            Class::Denied => s.denied += 1,
            Class::Other => s.other += 1,
        }
        let us = d.ended.duration_since(d.started).as_micros();
        s.lat_us.push(u32::try_from(us).unwrap_or(u32::MAX));
        true
    }

    /// One operation (two calls when the first is granted); answers the two
    /// calls' outcomes.
    async fn op(&self, user: usize, inv: &str) -> (Done, Option<Done>) {
        match self.mode {
            Mode::Rls => (self.should_rate_limit(user).await, None),
            Mode::LimitadorHttp => (self.check_and_report(user).await, None),
            Mode::Permit => {
                let body = format!(
                    r#"{{"model":"{}","tenant":"t{}","tokens":0}}"#,
                    self.model,
                    user % 4
                );
                let d = self
                    .send(
                        Method::POST,
                        "/v1/providers/bench/permits",
                        user,
                        Some(body),
                    )
                    .await;
                (d, None)
            }
            Mode::Admit => {
                let body = format!(r#"{{"invocation_id":"{inv}"}}"#);
                let first = self.send(Method::POST, "/v1/runs", user, Some(body)).await;
                if first.class != Class::Ok {
                    return (first, None);
                }
                let path = format!("/v1/runs/{inv}");
                let second = self.send(Method::DELETE, &path, user, None).await;
                (first, Some(second))
            }
            Mode::Reserve => {
                let body = format!(
                    r#"{{"invocation_id":"{inv}","estimate":{}}}"#,
                    self.estimate
                );
                let first = self
                    .send(Method::POST, "/v1/tokens/reserve", user, Some(body))
                    .await;
                if first.class != Class::Ok {
                    return (first, None);
                }
                #[derive(Deserialize)]
                struct Reserved {
                    reservation_id: String,
                }
                let id = match first
                    .body
                    .as_deref()
                    .map(serde_json::from_slice::<Reserved>)
                {
                    Some(Ok(r)) => r.reservation_id,
                    _ => {
                        self.note(
                            "2xx without a reservation_id".to_owned(),
                            first.body.as_deref().unwrap_or_default(),
                        );
                        return (first, None);
                    }
                };
                let id = serde_json::to_string(&id).unwrap_or_default();
                let body = format!(r#"{{"reservation_id":{id},"actual":{}}}"#, self.actual);
                let second = self
                    .send(Method::POST, "/v1/tokens/settle", user, Some(body))
                    .await;
                (first, Some(second))
            }
        }
    }
}

/// SplitMix64: a tiny, good-enough PRNG for picking users.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

async fn worker(ctx: Arc<Ctx>, task: usize) -> TaskStats {
    let mut stats = TaskStats::default();
    let mut rng = SplitMix(0x5EED ^ (task as u64).wrapping_mul(0x1234_5678_9ABC_DEF1));
    let users = ctx.tokens.len() as u64;
    let mut seq = 0_u64;
    // Paced tasks start spread over one pause.
    let mut next = ctx
        .pace
        .map(|p| Instant::now() + p.mul_f64((task % 64) as f64 / 64.0));
    while Instant::now() < ctx.measure_end {
        if let (Some(at), Some(p)) = (next.as_mut(), ctx.pace) {
            tokio::time::sleep_until((*at).into()).await;
            *at += p;
        }
        let user = usize::try_from(rng.next() % users).unwrap_or(0);
        seq += 1;
        let inv = format!("{}-{task}-{seq}", ctx.tag);
        let (first, second) = ctx.op(user, &inv).await;
        let counted = ctx.record(&mut stats, 0, &first);
        if let Some(second) = second {
            let counted_too = ctx.record(&mut stats, 1, &second);
            if counted && counted_too && second.class == Class::Ok {
                stats.pairs += 1;
            }
        } else if ctx.mode.single_call() && counted && first.class == Class::Ok {
            // One call is the whole operation.
            stats.pairs += 1;
        }
    }
    stats
}

// ---------------------------------------------------------------- main

fn main() -> ExitCode {
    let args = parse_args();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            args.workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from)),
        )
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadgen: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> Result<(), String> {
    let server_pid = a
        .server_pid
        .or_else(|| url_port(&a.url).and_then(pid_listening_on));
    let redis_pid = a
        .redis_pid
        .or_else(|| a.redis_port.and_then(pid_listening_on));
    if a.redis_port.is_some() && redis_pid.is_none() {
        eprintln!("loadgen: nothing of mine listens on the --redis-port; no Redis CPU figure");
    }

    let minted = Instant::now();
    let tokens = mint_tokens(&a)?;
    let mint_time = minted.elapsed();

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(a.concurrency)
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector);

    let readyz = format!("{}{}", a.url, a.ready_path)
        .parse()
        .map_err(|e| format!("--url {}: {e}", a.url))?;
    let ready = client
        .get(readyz)
        .await
        .map_err(|e| format!("{} does not answer: {e}", a.url))?;
    if !ready.status().is_success() {
        return Err(format!(
            "{}{} answered {}",
            a.url,
            a.ready_path,
            ready.status()
        ));
    }

    let tag = format!(
        "lg{:x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
            ^ u128::from(std::process::id())
    );
    // RLS mode: a few HTTP/2 connections to the gRPC port (each carries
    // many concurrent calls).
    let mut rls = Vec::new();
    if a.mode == Mode::Rls {
        for _ in 0..a.concurrency.div_ceil(16).clamp(1, 8) {
            let channel = Channel::from_shared(a.rls_url.clone())
                .map_err(|e| format!("--rls-url {}: {e}", a.rls_url))?
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| format!("{} does not answer: {e}", a.rls_url))?;
            rls.push(RateLimitServiceClient::new(channel));
        }
    }
    let now = Instant::now();
    let rls_key = match &a.rls_key {
        Some(k) => Some(
            k.parse::<AsciiMetadataValue>()
                .map_err(|_| "--rls-key must be printable ASCII".to_owned())?,
        ),
        None => None,
    };
    let mut ctx = Ctx {
        rls,
        rls_key,
        domain: a.domain.clone(),
        descriptor_key: a.descriptor_key.clone(),
        client,
        url: a.url.clone(),
        mode: a.mode,
        tokens,
        id_header: a.user_header.clone().unwrap_or(AUTHORIZATION),
        estimate: a.estimate,
        actual: a.actual,
        model: a.model.clone(),
        tag,
        measure_start: now,
        measure_end: now,
        pace: a
            .rate
            .filter(|r| *r > 0.0)
            .map(|r| Duration::from_secs_f64(a.concurrency as f64 / r)),
        refusals: Mutex::new(BTreeMap::new()),
    };

    // One operation before anything is timed: fail fast on a token the
    // server refuses (401) or a config that denies everything.
    let (first, second) = ctx.op(0, &format!("{}-check", ctx.tag)).await;
    let second_ok = second.as_ref().is_none_or(|d| d.class == Class::Ok);
    let refused_as_expected = a.refusals_expected && first.class == Class::Denied;
    if (first.class != Class::Ok || !second_ok) && !refused_as_expected {
        let body = second
            .as_ref()
            .filter(|_| first.class == Class::Ok)
            .unwrap_or(&first)
            .body
            .as_deref()
            .map(String::from_utf8_lossy)
            .unwrap_or_default()
            .into_owned();
        return Err(format!("the check operation was refused: {body}"));
    }

    let start = Instant::now();
    ctx.measure_start = start + a.warmup;
    ctx.measure_end = ctx.measure_start + a.duration;
    let ctx = Arc::new(ctx);
    let tasks: Vec<_> = (0..a.concurrency)
        .map(|t| tokio::spawn(worker(ctx.clone(), t)))
        .collect();

    tokio::time::sleep_until(ctx.measure_start.into()).await;
    let before = cpu_snap(server_pid, redis_pid);
    let t0 = Instant::now();
    tokio::time::sleep_until(ctx.measure_end.into()).await;
    let after = cpu_snap(server_pid, redis_pid);
    let cpu_wall = t0.elapsed().as_secs_f64();

    let mut calls = [CallStats::default(), CallStats::default()];
    let mut pairs = 0_u64;
    for t in tasks {
        let s = t.await.map_err(|e| format!("a task failed: {e}"))?;
        let [c0, c1] = s.calls;
        calls[0].merge(c0);
        calls[1].merge(c1);
        pairs += s.pairs;
    }

    // ------------------------------------------------------------ report
    let hz = clock_ticks_per_s();
    let pct = |b: Option<u64>, a: Option<u64>| -> Option<f64> {
        Some(a?.checked_sub(b?)? as f64 / hz / cpu_wall * 100.0)
    };
    let (me, server, redis) = (
        pct(before.me, after.me),
        pct(before.server, after.server),
        pct(before.redis, after.redis),
    );
    let machine = pct(before.machine, after.machine);
    let cpu = report::Cpu {
        loadgen: me,
        server,
        redis,
        other: machine
            .map(|m| m - me.unwrap_or(0.0) - server.unwrap_or(0.0) - redis.unwrap_or(0.0)),
        machine,
    };
    let report = report::Report::new(&a, server_pid, calls, pairs, cpu);
    let refusals = ctx.refusals.lock();
    report.print(ctx.tokens.len(), mint_time, &refusals);
    if let Some(path) = &a.json {
        report.write(path, &refusals)?;
    }
    Ok(())
}
