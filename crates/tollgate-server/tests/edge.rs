//! The edge's bounds (`[limits]`, docs/security.md "Attacks, before and
//! now"), each tried over real sockets against `tollgate serve` on
//! loopback: slow headers, slow bodies with and without a token, 2,000
//! idle connections, a slow body at shutdown, and the per-user bound on
//! `wait=true` requests.
//!
//! The timeouts are hyper's and tokio's real timers, so the configs keep
//! them short (hundreds of ms); limit decisions still run on a fake clock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::FakeClock;
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;

use common::{AUDIENCE, ISSUER, Resp, send_with, valid_token, wait_for_sleepers};

mod common;

/// Real time, for hyper's and tokio's timers (limit decisions run on the
/// fake clock).
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

const SECRET: &str = "tollgate-edge-test-secret-0123456789abcdef";

/// A jwt config with `max_in_flight`, a plan whose token bucket makes
/// every reserve after the first wait a minute, and `limits` as the
/// `[limits]` table.
fn config(max_in_flight: usize, limits: &str) -> Config {
    let text = format!(
        r#"listen = "127.0.0.1:0"
max_in_flight = {max_in_flight}
default_plan = "p"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"

[plans.p]
turns = {{ amount = 1000, period_ms = 1000, burst = 1000 }}
tokens = {{ amount = 1000, period_ms = 60000, burst = 1000 }}
concurrent_runs = 1000
max_wait_ms = 3600000

[limits]
{limits}
"#
    );
    Config::parse(&text, "test", std::path::Path::new(".")).expect("valid config")
}

struct Server {
    http: SocketAddr,
    grpc: SocketAddr,
    clock: FakeClock,
    web: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    async fn start(config: Config) -> Self {
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

    async fn post(&self, path: &str, user: &str, body: serde_json::Value) -> Resp {
        let auth = format!("Bearer {}", valid_token(user, SECRET));
        send_with(
            &self.web,
            Method::POST,
            &format!("http://{}{path}", self.http),
            Some(&auth),
            Some(&body.to_string()),
        )
        .await
    }

    async fn admit(&self, user: &str, inv: &str) -> Resp {
        self.post("/v1/runs", user, json!({"invocation_id": inv}))
            .await
    }

    /// Stops the server; answers how long `serve_with` took to return.
    async fn stop(mut self) -> Duration {
        let _ = self.stop.take().expect("running").send(());
        let started = now();
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .expect("the server stops within 20 s")
            .expect("server task")
            .expect("server ran cleanly");
        started.elapsed()
    }
}

/// How long until the peer closes `stream` (reading and discarding what it
/// sends), at most `within`; `None`: still open then.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .map(|()| started.elapsed())
}

/// Everything the peer sends on `stream` until it closes (at most 10 s).
async fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A request whose headers say 60,000 bytes of body and whose body then
/// stops after one byte.
async fn slow_body(addr: SocketAddr, token: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\ncontent-length: 60000\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s
}

#[tokio::test]
async fn slow_headers_are_closed_after_the_header_timeout() {
    let server = Server::start(config(64, "header_timeout_ms = 300")).await;
    let mut s = TcpStream::connect(server.http).await.unwrap();
    s.write_all(b"POST /v1/ru").await.unwrap();
    let closed = closed_within(&mut s, Duration::from_secs(5))
        .await
        .expect("half a request line is closed within 5 s");
    assert!(
        closed >= Duration::from_millis(250) && closed < Duration::from_secs(3),
        "closed after {closed:?}"
    );
    // A kept-alive connection that sends nothing more is closed too.
    let mut s = TcpStream::connect(server.http).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let idle = closed_within(&mut s, Duration::from_secs(5))
        .await
        .expect("an idle kept-alive connection is closed within 5 s");
    assert!(idle < Duration::from_secs(3), "closed after {idle:?}");
    // gRPC: a connection that never sends its preface.
    let mut g = TcpStream::connect(server.grpc).await.unwrap();
    let g_closed = closed_within(&mut g, Duration::from_secs(5))
        .await
        .expect("a silent gRPC connection is closed within 5 s");
    assert!(g_closed >= Duration::from_millis(250), "{g_closed:?}");
    eprintln!(
        "slow headers closed after {closed:?}, idle keep-alive after {idle:?}, silent gRPC after {g_closed:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn slow_bodies_hold_no_in_flight_place() {
    let server = Server::start(config(64, "body_timeout_ms = 1000")).await;
    let token = valid_token("slow", SECRET);
    for with_token in [false, true] {
        let mut slow = Vec::new();
        for _ in 0..80 {
            slow.push(slow_body(server.http, with_token.then_some(token.as_str())).await);
        }
        // 80 bodies trickle on a replica of 64 places: a normal request
        // still gets one.
        let inv = format!("normal-{with_token}");
        server.admit("u1", &inv).await.ok();
        let started = now();
        let mut statuses = Vec::new();
        for mut s in slow {
            let answer = read_all(&mut s).await;
            statuses.push(answer.split(' ').nth(1).unwrap_or("closed").to_owned());
        }
        let expected = if with_token { "408" } else { "401" };
        assert!(
            statuses.iter().all(|s| s == expected),
            "with_token={with_token}: {statuses:?}"
        );
        eprintln!(
            "with_token={with_token}: a normal request 200 beside 80 slow bodies; \
             all 80 answered {expected} and closed within {:?}",
            started.elapsed()
        );
    }
    server.stop().await;
}

/// The soft limit on open files of this process (`ulimit -n`).
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(u64::MAX)
}

#[test]
fn two_thousand_idle_connections_do_not_shut_the_port() {
    // 2,000 client sockets and the server's in one process: rerun in a
    // child with a raised limit when this one's is too low.
    if open_files_limit() < 4_600 && std::env::var_os("TOLLGATE_EDGE_CHILD").is_none() {
        let exe = std::env::current_exe().expect("exe");
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(
                "ulimit -S -n 8192 || ulimit -S -n \"$(ulimit -H -n)\"; \
                 exec \"$0\" two_thousand_idle_connections_do_not_shut_the_port --exact --nocapture",
            )
            .arg(exe)
            .env("TOLLGATE_EDGE_CHILD", "1")
            .status()
            .expect("sh");
        assert!(status.success(), "the child run failed");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(idle_connections());
}

async fn idle_connections() {
    let server = Server::start(config(
        64,
        "max_connections = 500\nheader_timeout_ms = 1500",
    ))
    .await;
    let mut idle = Vec::new();
    for _ in 0..2_000 {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(server.http)).await {
            Ok(Ok(s)) => idle.push(s),
            other => panic!("connect: {other:?}"),
        }
    }
    // Past the cap, connections are closed at once: wait (real time, the
    // server's sockets) until the closes have arrived.
    let still_open = |conns: &[TcpStream]| {
        conns
            .iter()
            .filter(|s| {
                let mut b = [0u8; 1];
                matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let conns = &idle;
    let capped =
        tollgate_testkit::redis::wait_until(5, || async move { still_open(conns) <= 500 }).await;
    let open = still_open(&idle);
    assert!(capped && open <= 500, "{open} idle connections held");
    assert!(open >= 400, "{open}: the cap's connections were served");
    // The held ones send nothing: closed after the header timeout, and a
    // normal request is served again.
    let held = &idle;
    let ok = tollgate_testkit::redis::wait_until(5, || async move {
        let mut n = 0;
        for s in held {
            let mut b = [0u8; 1];
            if let Err(e) = s.try_read(&mut b)
                && e.kind() == std::io::ErrorKind::WouldBlock
            {
                n += 1;
            }
        }
        n == 0
    })
    .await;
    assert!(ok, "idle connections are closed after the header timeout");
    server.admit("u1", "after-idle").await.ok();
    eprintln!(
        "2,000 idle: {open} held (cap 500), the rest closed at once; all closed after the header timeout; then 200"
    );
    drop(idle);
    server.stop().await;
}

#[tokio::test]
async fn a_slow_body_does_not_hold_shutdown_past_the_drain_deadline() {
    let server = Server::start(config(
        64,
        "drain_timeout_ms = 300\nbody_timeout_ms = 60000",
    ))
    .await;
    let token = valid_token("slow", SECRET);
    let mut slow = slow_body(server.http, Some(&token)).await;
    // A gRPC call waiting on the (fake, never advanced) clock, too.
    let mut grpc = TollgateClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut drained = tonic::Request::new(proto::ReserveTokensRequest {
        invocation_id: "g".into(),
        estimate: 1000,
        wait: false,
        request_id: None,
        ..Default::default()
    });
    let auth = format!("Bearer {token}").parse().unwrap();
    drained.metadata_mut().insert("authorization", auth);
    grpc.reserve_tokens(drained)
        .await
        .expect("the bucket drained");
    let mut waiting = tonic::Request::new(proto::ReserveTokensRequest {
        invocation_id: "g".into(),
        estimate: 1000,
        wait: true,
        request_id: None,
        ..Default::default()
    });
    let auth = format!("Bearer {token}").parse().unwrap();
    waiting.metadata_mut().insert("authorization", auth);
    let call = tokio::spawn(async move { grpc.reserve_tokens(waiting).await });
    wait_for_sleepers(&server.clock, 1).await;
    let took = server.stop().await;
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    assert!(
        closed_within(&mut slow, Duration::from_secs(2))
            .await
            .is_some(),
        "the slow body's connection is closed"
    );
    let call = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the waiting gRPC call ends")
        .unwrap();
    assert!(call.is_err(), "{call:?}");
    eprintln!("shutdown with a slow body and a waiting gRPC call open: {took:?}");
}

#[tokio::test]
async fn the_ninth_wait_of_one_user_is_refused() {
    let server = Server::start(config(64, "max_waits_per_user = 8\nmax_waiting = 10")).await;
    for user in ["a", "b", "c"] {
        // The whole burst: every reserve after this waits.
        server
            .post(
                "/v1/tokens/reserve",
                user,
                json!({"invocation_id": "drain", "estimate": 1000}),
            )
            .await
            .ok();
    }
    let server = Arc::new(server);
    let wait = |user: &'static str, i: usize| {
        let s = server.clone();
        tokio::spawn(async move {
            s.post(
                "/v1/tokens/reserve",
                user,
                json!({"invocation_id": format!("w{i}"), "estimate": 1, "wait": true}),
            )
            .await
        })
    };
    let mut a: Vec<_> = (0..8).map(|i| wait("a", i)).collect();
    wait_for_sleepers(&server.clock, 8).await;
    let ninth = wait("a", 8).await.unwrap();
    ninth.refused(429, "too_many_waits");
    assert_eq!(ninth.body["retry_after_ms"], 1000, "{ninth:?}");
    assert_eq!(ninth.header("retry-after"), Some("1"), "{ninth:?}");
    // Over gRPC: the same row.
    let mut grpc = TollgateClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(proto::ReserveTokensRequest {
        invocation_id: "g9".into(),
        estimate: 1,
        wait: true,
        request_id: None,
        ..Default::default()
    });
    let auth = format!("Bearer {}", valid_token("a", SECRET))
        .parse()
        .unwrap();
    req.metadata_mut().insert("authorization", auth);
    let status = grpc.reserve_tokens(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        status.metadata().get("x-tollgate-error").unwrap(),
        "too_many_waits"
    );
    assert_eq!(status.metadata().get("retry-after-ms").unwrap(), "1000");
    // Another user still waits; and without wait=true "a" is answered.
    let b: Vec<_> = (0..2).map(|i| wait("b", i)).collect();
    wait_for_sleepers(&server.clock, 10).await;
    server
        .post(
            "/v1/tokens/reserve",
            "a",
            json!({"invocation_id": "nowait", "estimate": 1}),
        )
        .await
        .ok();
    // The replica's bound (10) is reached: a third user is refused.
    let c = wait("c", 0).await.unwrap();
    c.refused(429, "too_many_waits");
    assert!(
        c.body["message"].as_str().unwrap().contains("all users"),
        "{c:?}"
    );
    // The waits end on the clock and are answered; the places free.
    server.clock.advance(3_600_000);
    for h in a.drain(..).chain(b) {
        h.await.unwrap().ok();
    }
    wait("a", 9).await.unwrap().ok();
    let server = Arc::into_inner(server).expect("one owner");
    server.stop().await;
}

#[test]
fn limits_are_validated_with_their_paths_and_default_from_the_cap() {
    let c = config(64, "");
    assert_eq!(c.limits.max_connections, 4_096);
    assert_eq!(c.limits.header_timeout, Duration::from_secs(10));
    assert_eq!(c.limits.body_timeout, Duration::from_secs(10));
    assert_eq!(c.limits.drain_timeout, Duration::from_secs(30));
    assert_eq!(c.limits.max_waits_per_user, 8);
    assert_eq!(c.limits.max_waiting, 32, "half of max_in_flight");
    assert_eq!(c.limits.grpc_max_streams, 100);
    assert_eq!(c.limits.refusal_cache, 65_536);
    assert_eq!(config(64, "refusal_cache = 0").limits.refusal_cache, 0);
    // A tiny cap: the per-user default follows the replica's bound.
    let small = config(2, "");
    assert_eq!(
        (small.limits.max_waiting, small.limits.max_waits_per_user),
        (1, 1)
    );
    let text = format!(
        "max_in_flight = 10\n[identity]\nmode = \"dev\"\n[limits]\n{}",
        "max_connections = 0\nheader_timeout_ms = 0\nbody_timeout_ms = 600001\n\
         drain_timeout_ms = 3600001\nmax_waiting = 11\nmax_waits_per_user = 6\n\
         grpc_max_streams = 0\ngrpc_keepalive_ms = 999\nrefusal_cache = 16777217"
    );
    let e = Config::parse(&text, "t", std::path::Path::new(".")).unwrap_err();
    let paths: Vec<&str> = e.errors.iter().map(|e| e.path.as_str()).collect();
    for p in [
        "limits.max_connections",
        "limits.header_timeout_ms",
        "limits.body_timeout_ms",
        "limits.drain_timeout_ms",
        "limits.max_waiting",
        "limits.max_waits_per_user",
        "limits.grpc_max_streams",
        "limits.grpc_keepalive_ms",
        "limits.refusal_cache",
    ] {
        assert!(paths.contains(&p), "{p} in {e}");
    }
    let e = Config::parse(
        "[identity]\nmode = \"dev\"\n[limits]\nheader_timeout = 5",
        "t",
        std::path::Path::new("."),
    )
    .unwrap_err();
    assert!(e.to_string().contains("limits.header_timeout"), "{e}");
}

#[test]
fn a_reload_names_changed_limits_as_needing_a_restart() {
    let a = config(64, "body_timeout_ms = 1000");
    let b = config(64, "body_timeout_ms = 2000\nmax_waits_per_user = 4");
    assert_eq!(
        a.restart_only.changed(&b.restart_only),
        ["limits.body_timeout_ms", "limits.max_waits_per_user"]
    );
    assert!(a.restart_only.changed(&a.restart_only).is_empty());
}
