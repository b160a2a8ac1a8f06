//! OpenTelemetry traces (`[telemetry]`) against an OTLP/gRPC trace
//! receiver run by the test: a span per decision of the HTTP and gRPC APIs,
//! child of the caller's `traceparent` (header or metadata), with the
//! operation, limit, outcome, plan and wait, and no user id; sampled at the
//! ratio, a sampled parent followed. The exporter batches on its own
//! thread: the spans arrive when the server stops (it flushes), and the
//! test waits for them there.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use tokio::net::TcpListener;
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;
use tollgate_testkit::T0;
use tollgate_testkit::redis::wait_until;

use common::{TempDir, serve_loopback, shutdown, token_with};

mod common;

const SECRET: &str = "tollgate-otel-test-secret-0123456789abcdef";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Collects what is exported to it.
#[derive(Default, Clone)]
struct Receiver(Arc<parking_lot::Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    got.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn receiver() -> (Receiver, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = Receiver::default();
    let service = TraceServiceServer::new(r.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (r, format!("http://{addr}"))
}

fn config(endpoint: &str, ratio: f64) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
default_plan = "std"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{}"
audience = "{}"

[telemetry]
otlp_endpoint = "{endpoint}"
sample_ratio = {ratio}
service_name = "tollgate-test"

[plans.std]
turns = {{ amount = 1, period_ms = 3600000, burst = 1 }}
tokens = {{ amount = 1000, period_ms = 60000 }}
concurrent_runs = 10
max_wait_ms = 60000
"#,
        common::ISSUER,
        common::AUDIENCE
    )
}

fn token(user: &str) -> String {
    token_with(user, SECRET, T0 / 1_000 + 86_400)
}

fn attr(span: &Span, key: &str) -> Option<serde_json::Value> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            Any::StringValue(s) => Some(json!(s)),
            Any::IntValue(i) => Some(json!(i)),
            _ => None,
        }
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_exported_as_spans_under_the_callers_trace() {
    let (got, endpoint) = receiver().await;
    let dir = TempDir::new();
    let cfg = Config::parse(&config(&endpoint, 1.0), "t.toml", dir.path()).expect("valid");
    let s = serve_loopback(cfg, false).await;
    let web = reqwest::Client::new();
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    let post = |path: &str, body: serde_json::Value, trace: bool| {
        let mut r = web
            .post(format!("http://{}{path}", s.http))
            .bearer_auth(token("ann"))
            .json(&body);
        if trace {
            r = r.header("traceparent", &traceparent);
        }
        r.send()
    };
    // Admitted under the caller's trace; a reservation that waits, with no
    // traceparent (a root span); over gRPC, refused, under the trace.
    assert_eq!(
        post("/v1/runs", json!({"invocation_id": "r"}), true)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        post(
            "/v1/tokens/reserve",
            json!({"invocation_id": "r", "estimate": 1000}),
            false
        )
        .await
        .unwrap()
        .status(),
        200
    );
    let r = post(
        "/v1/tokens/reserve",
        json!({"invocation_id": "r", "estimate": 500}),
        false,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let mut grpc = TollgateClient::connect(format!("http://{}", s.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(proto::AdmitRunRequest {
        invocation_id: "r2".into(),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", token("ann")).parse().unwrap(),
    );
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    assert_eq!(
        grpc.admit_run(req).await.expect_err("refused").code(),
        tonic::Code::ResourceExhausted
    );
    drop(grpc);
    // Stopping flushes the batch.
    shutdown(s.stop, s.task).await;
    assert!(
        wait_until(10, || async { got.0.lock().len() >= 4 }).await,
        "spans did not arrive"
    );
    let spans = got.0.lock().clone();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    assert!(spans.iter().all(|(service, _)| service == "tollgate-test"));
    let by = |op: &str, outcome: &str| {
        spans
            .iter()
            .map(|(_, s)| s)
            .find(|s| s.name == op && attr(s, "tollgate.outcome") == Some(json!(outcome)))
            .unwrap_or_else(|| panic!("no {op} {outcome} in {spans:#?}"))
    };
    let admitted = by("tollgate.admit", "allowed");
    assert_eq!(hex(&admitted.trace_id), TRACE, "the caller's trace");
    assert_eq!(
        hex(&admitted.parent_span_id),
        PARENT,
        "the caller's span is the parent"
    );
    assert_eq!(attr(admitted, "tollgate.op"), Some(json!("admit")));
    assert_eq!(attr(admitted, "tollgate.limit"), Some(json!("none")));
    assert_eq!(attr(admitted, "tollgate.plan"), Some(json!("std")));
    assert_eq!(attr(admitted, "tollgate.wait_ms"), Some(json!(0)));
    let refused = by("tollgate.admit", "denied");
    assert_eq!(hex(&refused.trace_id), TRACE, "from the gRPC metadata");
    assert_eq!(attr(refused, "tollgate.limit"), Some(json!("turn_rate")));
    let waited = by("tollgate.reserve", "waited");
    assert!(waited.parent_span_id.is_empty(), "a root span");
    assert_ne!(hex(&waited.trace_id), TRACE);
    assert_eq!(attr(waited, "tollgate.wait_ms"), Some(json!(30_000)));
    assert_eq!(
        waited.start_time_unix_nano,
        T0 * 1_000_000,
        "on the server's clock"
    );
    for (_, span) in &spans {
        assert_eq!(attr(span, "tollgate.user"), None, "no user id on a span");
        assert!(
            !span
                .attributes
                .iter()
                .any(|a| format!("{a:?}").contains("ann"))
        );
    }
}

/// At ratio 0 a root decision is not exported; one under a sampled
/// `traceparent` is (the caller's sampling is followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_ratio_applies_to_root_decisions_only() {
    let (got, endpoint) = receiver().await;
    let dir = TempDir::new();
    let cfg = Config::parse(&config(&endpoint, 0.0), "t.toml", dir.path()).expect("valid");
    let s = serve_loopback(cfg, false).await;
    let web = reqwest::Client::new();
    for (inv, trace) in [("a", None), ("b", Some(format!("00-{TRACE}-{PARENT}-01")))] {
        let mut r = web
            .post(format!("http://{}/v1/runs", s.http))
            .bearer_auth(token("bo"))
            .json(&json!({"invocation_id": inv}));
        if let Some(t) = trace {
            r = r.header("traceparent", t);
        }
        r.send().await.unwrap();
    }
    shutdown(s.stop, s.task).await;
    assert!(wait_until(10, || async { !got.0.lock().is_empty() }).await);
    let spans = got.0.lock().clone();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(hex(&spans[0].1.trace_id), TRACE);
}

/// Envoy's rate-limit service: one `tollgate.rls` span per descriptor, in
/// the trace Envoy forwards in the call's metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_decisions_are_spans_too() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    let (got, endpoint) = receiver().await;
    let dir = TempDir::new();
    // (`rls_listen` names the service on; `serve_with` takes its listener.)
    let text = format!(
        "rls_listen = \"127.0.0.1:0\"\n{}\n[rls]\ndomain = \"agents\"\n\n[[rls.descriptors]]\nkey = \"user_id\"\nlimit = \"user_turns\"\n",
        config(&endpoint, 1.0)
    );
    let cfg = Config::parse(&text, "t.toml", dir.path()).expect("valid");
    let bind = || async { TcpListener::bind("127.0.0.1:0").await.unwrap() };
    let (http, rls) = (bind().await, bind().await);
    let rls_addr = rls.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve_with(
        cfg,
        tollgate_server::Listeners::new(http).with_rls(rls),
        Some(Arc::new(tollgate_core::FakeClock::new(T0))),
        |_| {},
        async {
            let _ = stopped.await;
        },
    ));
    let mut client = RateLimitServiceClient::connect(format!("http://{rls_addr}"))
        .await
        .unwrap();
    for _ in 0..2 {
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "agents".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user_id".into(),
                    value: "eve".into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        });
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{TRACE}-{PARENT}-01").parse().unwrap(),
        );
        client.should_rate_limit(req).await.expect("answer");
    }
    drop(client);
    shutdown(Some(stop), task).await;
    assert!(wait_until(10, || async { got.0.lock().len() >= 2 }).await);
    let spans = got.0.lock().clone();
    let outcomes: Vec<_> = spans
        .iter()
        .map(|(_, s)| {
            assert_eq!(s.name, "tollgate.rls");
            assert_eq!(hex(&s.trace_id), TRACE);
            assert_eq!(hex(&s.parent_span_id), PARENT);
            assert_eq!(attr(s, "tollgate.op"), Some(json!("rls")));
            assert_eq!(attr(s, "tollgate.user"), None);
            (
                attr(s, "tollgate.limit").unwrap(),
                attr(s, "tollgate.outcome").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (json!("turn_rate"), json!("allowed")),
            (json!("turn_rate"), json!("denied"))
        ]
    );
}
