//! The decision audit log (`[audit]`) of a real server on a fake clock:
//! one JSON line per denial and shadow-denial with the user, plan, limit,
//! hint and the request's W3C trace id (HTTP `traceparent` header and gRPC
//! metadata); at most `max_lines_per_second` a second (the rest counted in
//! `tollgate_audit_dropped_total` and summed up by one line); the file
//! rotated at `max_file_bytes`. The writer is a thread: the test polls the
//! file until the lines it expects are there.

use std::path::Path;

use serde_json::{Value, json};
use tollgate_core::Clock;
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;
use tollgate_testkit::T0;
use tollgate_testkit::redis::wait_until;

use common::{Loopback, TempDir, metric, serve_loopback, shutdown, token_with};

mod common;

const SECRET: &str = "tollgate-audit-test-secret-0123456789abcdef";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn config(lines_per_second: u32) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
default_plan = "std"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{}"
audience = "{}"

[audit]
file = "audit.jsonl"
max_lines_per_second = {lines_per_second}
max_file_bytes = 4096

[plans.std]
turns = {{ amount = 1, period_ms = 3600000, burst = 1 }}
tokens = {{ amount = 60000, period_ms = 60000 }}
concurrent_runs = 10

[plans.watch]
turns = {{ amount = 1, period_ms = 3600000, burst = 1 }}
tokens = {{ amount = 60000, period_ms = 60000 }}
concurrent_runs = 10
shadow = true

[users]
wendy = "watch"
"#,
        common::ISSUER,
        common::AUDIENCE
    )
}

fn token(user: &str) -> String {
    token_with(user, SECRET, T0 / 1_000 + 86_400)
}

/// The file's lines as JSON.
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Waits (the writer is a thread) until the file holds `n` lines.
async fn until_lines(path: &Path, n: usize) -> Vec<Value> {
    let ok = wait_until(10, || async { lines(path).len() >= n }).await;
    let got = lines(path);
    assert!(ok, "expected {n} lines, got {got:#?}");
    got
}

async fn admit(
    s: &Loopback,
    web: &reqwest::Client,
    user: &str,
    inv: &str,
    trace: Option<&str>,
) -> u16 {
    let mut req = web
        .post(format!("http://{}/v1/runs", s.http))
        .bearer_auth(token(user))
        .json(&json!({"invocation_id": inv}));
    if let Some(t) = trace {
        req = req.header("traceparent", t);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn denials_are_audited_with_trace_ids_rate_limited_and_rotated() {
    let dir = TempDir::new();
    let file = dir.path().join("audit.jsonl");
    let cfg = Config::parse(&config(3), "t.toml", dir.path()).expect("valid");
    let s = serve_loopback(cfg, false).await;
    let web = reqwest::Client::new();
    let traceparent = format!("00-{TRACE}-00f067aa0ba902b7-01");

    // One admitted, then refusals: the first over HTTP with a traceparent.
    assert_eq!(admit(&s, &web, "ann", "a0", None).await, 200);
    assert_eq!(admit(&s, &web, "ann", "a1", Some(&traceparent)).await, 429);
    // Over gRPC, with the trace in the metadata.
    let mut grpc = TollgateClient::connect(format!("http://{}", s.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(proto::AdmitRunRequest {
        invocation_id: "a2".into(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token("ann")).parse().unwrap(),
    );
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let e = grpc.admit_run(req).await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    // A shadow plan's would-be refusal is audited too.
    assert_eq!(admit(&s, &web, "wendy", "w0", None).await, 200);
    assert_eq!(
        admit(&s, &web, "wendy", "w1", None).await,
        200,
        "shadow mode admits"
    );
    let got = until_lines(&file, 3).await;
    assert_eq!(
        got[0],
        json!({"ts_ms": T0, "user": "ann", "plan": "std", "op": "admit", "limit": "turn_rate",
               "outcome": "denied", "retry_after_ms": 3_600_000, "trace_id": TRACE})
    );
    assert_eq!(got[1]["trace_id"], TRACE, "from the gRPC metadata");
    assert_eq!(
        (
            got[2]["user"].clone(),
            got[2]["plan"].clone(),
            got[2]["outcome"].clone(),
            got[2]["trace_id"].clone()
        ),
        (
            json!("wendy"),
            json!("watch"),
            json!("shadow_denied"),
            Value::Null
        )
    );

    // Over 3 lines in this second: the next two are dropped and counted.
    for i in 0..2 {
        assert_eq!(admit(&s, &web, "ann", &format!("b{i}"), None).await, 429);
    }
    let scrape = web
        .get(format!("http://{}/metrics", s.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(metric(&scrape, "tollgate_audit_dropped_total "), Some(2.0));
    // The next second: a line says how many were dropped, then the entry.
    s.clock.advance(1_000);
    assert_eq!(admit(&s, &web, "ann", "c0", None).await, 429);
    let got = until_lines(&file, 5).await;
    assert_eq!(got.len(), 5, "{got:#?}");
    assert_eq!(got[3]["dropped"], 2, "{got:#?}");
    assert_eq!(got[4]["ts_ms"], T0 + 1_000);

    // Rotation at 4 KiB: two refusals a second until the file has rolled
    // over; no line is lost across the two files, neither passes 4 KiB.
    let before = got.len();
    let mut sent = 0;
    let rotated = dir.path().join("audit.jsonl.1");
    while !rotated.exists() {
        s.clock.advance(1_000);
        for _ in 0..2 {
            assert_eq!(admit(&s, &web, "ann", &format!("r{sent}"), None).await, 429);
            sent += 1;
        }
        let want = before + sent;
        assert!(
            wait_until(10, || async {
                lines(&rotated).len() + lines(&file).len() >= want
            })
            .await,
            "lines lost"
        );
        assert!(sent < 200, "never rotated");
    }
    assert_eq!(lines(&rotated).len() + lines(&file).len(), before + sent);
    for f in [&file, &rotated] {
        assert!(
            std::fs::metadata(f).unwrap().len() <= 4096,
            "{}",
            f.display()
        );
    }
    // The last refusal before a stop is on disk when the server returns.
    let total = lines(&rotated).len() + lines(&file).len();
    s.clock.advance(1_000);
    assert_eq!(admit(&s, &web, "ann", "last", None).await, 429);
    drop(grpc);
    shutdown(s.stop, s.task).await;
    let after = lines(&file);
    assert_eq!(lines(&rotated).len() + after.len(), total + 1);
    assert_eq!(after.last().unwrap()["ts_ms"], s.clock.now_ms());
}

#[test]
fn audit_settings_are_checked_with_their_paths() {
    let dir = TempDir::new();
    let bad = config(0).replace("max_file_bytes = 4096", "max_file_bytes = 1");
    let e = Config::parse(&bad, "t.toml", dir.path()).unwrap_err();
    let shown: Vec<String> = e
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.path, e.reason))
        .collect();
    assert_eq!(
        shown,
        [
            "audit.max_lines_per_second: must be between 1 and 100000 (got 0)",
            "audit.max_file_bytes: must be between 4096 and 1099511627776 (got 1)",
        ]
    );
    let typo = config(3).replace("max_lines_per_second", "max_line_per_second");
    let e = Config::parse(&typo, "t.toml", dir.path()).unwrap_err();
    assert_eq!(e.errors[0].path, "audit.max_line_per_second", "{e}");
}
