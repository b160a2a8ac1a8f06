//! Envoy's rate-limit service (`envoy.service.ratelimit.v3`) over real
//! sockets, asked with the generated `RateLimitServiceClient` on a
//! [`FakeClock`] at [`T0`]. The decision tests serve the service as
//! `RlsService::into_server` builds it (key check, 64 KiB decode limit,
//! bounds, in-flight cap) with tonic on `127.0.0.1:0`, over a
//! [`MemoryStore`] (and a real `redis-server` that the outage tests stop);
//! the listener tests run `tollgate_server::serve_with` on loopback
//! listeners for HTTP, the gRPC API and `rls_listen`, and `tollgate
//! check-config`.
//!
//! The listener: ShouldRateLimit on `grpc_listen` is UNIMPLEMENTED and
//! takes nothing; on `rls_listen` without the key or with a wrong one it is
//! UNAUTHENTICATED and the user's turn bucket is untouched (POST /v1/runs
//! still admits the whole burst); with the key it decides; more than 16
//! descriptors or 16 entries, or an entry that is not an id, is
//! INVALID_ARGUMENT naming the field, and nothing is taken; a message over
//! 64 KiB is refused; the in-flight cap is RESOURCE_EXHAUSTED; rules reload
//! on the new listener; config validation (a non-loopback `rls_listen`
//! needs a key, its own port, the key's rules, `Debug` redacts it).
//!
//! Covered: `user_id` → the user's turn bucket with SPEC §7 example 1 to the
//! number (and the budget shared with turn admission); `hits_addend` as the
//! cost (request and descriptor level, 0, past the burst); generic
//! descriptors → named buckets with their own rates, value-specific rules
//! first; a descriptor of several entries; several descriptors with one
//! over the limit; unmatched descriptors and other domains → OK; the
//! `x-ratelimit-*` and `retry-after` headers; shadow mode (`[rls]` and a
//! plan's) → OK while counting, nothing taken; swapping rules (reload); an
//! unknown user; a store outage → UNAVAILABLE under fail_closed (and local
//! decisions under fail_open), and recovery.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::failover::{Failover, FailurePolicy};
use tollgate_core::{FakeClock, MemoryStore, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_server::config::Config;
use tollgate_server::envoy::{RlsConfig, RlsRules, RlsServer, RlsService, validate_rls};
use tollgate_server::{App, Listeners};
use tollgate_testkit::T0;
use tollgate_testkit::redis::{RedisServer, unique_prefix, wait_until};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};

mod common;

// ---------------------------------------------------------------------------
// Helpers

/// SPEC §7 plan "support" for everyone; user `trial` is on a plan in shadow
/// mode with a burst of 2.
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

[plans.trial]
turns = { amount = 20, period_ms = 60000, burst = 2 }
tokens = { amount = 60000, period_ms = 60000, burst = 60000 }
concurrent_runs = 2
shadow = true

[users]
trial = "trial"
"#;

const RULES: &str = r#"
[rls]
domain = "agents"

[[rls.descriptors]]
key = "user_id"
limit = "user_turns"

[[rls.descriptors]]
key = "generic_key"
value = "search"
rate = { amount = 2, period_ms = 1000, burst = 4 }
name = "search"

[[rls.descriptors]]
key = "generic_key"
rate = { amount = 1, period_ms = 1000, burst = 1 }

[[rls.descriptors]]
key = "user_id"
with = { generic_key = "chat" }
rate = { amount = 30, period_ms = 60000, burst = 3 }
"#;

fn rules(text: &str) -> RlsRules {
    #[derive(Deserialize)]
    struct File {
        rls: RlsConfig,
    }
    let file: File = toml::from_str(text).expect("rls toml");
    validate_rls(&file.rls).expect("valid rls rules")
}

/// A running rate-limit service and a client of it.
struct Rls<S: Store + Clone> {
    client: RateLimitServiceClient<Channel>,
    app: App<S>,
    service: RlsService<S>,
    clock: FakeClock,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl<S: Store + Clone> Rls<S> {
    async fn start(store: S, clock: FakeClock, plans: &str, rls: &str) -> Self {
        let config = Config::parse(plans, "the test config", Path::new(".")).expect("config");
        let app = tollgate_server::app(&config, store, Arc::new(clock.clone())).expect("app");
        Self::start_with(app, clock, rls, RlsServer::default()).await
    }

    /// Serves `app` as `rls` says, guarded as `server` says.
    async fn start_with(app: App<S>, clock: FakeClock, rls: &str, server: RlsServer) -> Self {
        let service = RlsService::new(app.clone(), rules(rls)).with_server(server);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = Server::builder()
            .add_service(service.clone().into_server())
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            });
        let task = tokio::spawn(async move { server.await.expect("serve") });
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        Self {
            client,
            app,
            service,
            clock,
            stop: Some(stop),
            task,
        }
    }

    async fn ask(
        &mut self,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
        hits_addend: u32,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(RateLimitRequest {
                domain: domain.to_owned(),
                descriptors,
                hits_addend,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// Asks for one descriptor in domain `agents`.
    async fn one(&mut self, entries: &[(&str, &str)], hits_addend: u32) -> RateLimitResponse {
        self.ask("agents", vec![desc(entries)], hits_addend)
            .await
            .expect("answer")
    }

    /// `tollgate_decisions_total` of `op="rls"` with these labels.
    fn decisions(&self, limit: &str, outcome: &str, plan: &str) -> u64 {
        let want = format!(
            "tollgate_decisions_total{{op=\"rls\",limit=\"{limit}\",outcome=\"{outcome}\",plan=\"{plan}\"}} "
        );
        metric(&self.app.metrics().encode(), &want)
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .map_or(0, |v| v.trim().parse().expect("a counter"))
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

fn memory() -> (MemoryStore, FakeClock) {
    let clock = FakeClock::new(T0);
    (MemoryStore::new(clock.clone()), clock)
}

fn ms(ms: u64) -> Option<PbDuration> {
    Some(PbDuration {
        seconds: (ms / 1_000) as i64,
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    })
}

fn limit(requests_per_unit: u32, unit: Unit, name: &str) -> Option<RateLimit> {
    Some(RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit as i32,
    })
}

fn status(
    code: Code,
    current_limit: Option<RateLimit>,
    limit_remaining: u32,
    reset: Option<PbDuration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining,
        duration_until_reset: reset,
        quota: None,
    }
}

/// The user-turns limit of plan "support": 20 per MINUTE.
fn turns() -> Option<RateLimit> {
    limit(20, Unit::Minute, "user_id")
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).expect("a known code")
}

// ---------------------------------------------------------------------------
// The user's turn bucket

/// SPEC §7 example 1 through Envoy: 5 allowed at t = 0, the 6th to 10th at
/// t = 1,000 OVER_LIMIT with 2 s until the same hit fits (`retry-after: 2`),
/// allowed again at t = 3,000; the budget is the one turn admission uses.
#[tokio::test]
async fn user_id_draws_on_the_turn_bucket_spec_example_1() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    for i in 1..=5u32 {
        let r = rls.one(&[("user_id", "u1")], 0).await;
        assert_eq!(code(&r), Code::Ok, "turn {i}");
        // Each turn is refilled in 3,000 ms (20 per minute).
        let left = 5 - i;
        assert_eq!(
            r.statuses,
            [status(Code::Ok, turns(), left, ms(3_000 * u64::from(i)))]
        );
        assert_eq!(
            headers(&r),
            h(&[
                ("x-ratelimit-limit", "20, 20;w=60;name=\"user_id\""),
                ("x-ratelimit-remaining", &left.to_string()),
                ("x-ratelimit-reset", &(3 * i).to_string()),
            ])
        );
    }
    rls.clock.advance(1_000);
    for i in 6..=10 {
        let r = rls.one(&[("user_id", "u1")], 0).await;
        assert_eq!(code(&r), Code::OverLimit, "turn {i}");
        assert_eq!(r.statuses, [status(Code::OverLimit, turns(), 0, ms(2_000))]);
        assert_eq!(
            headers(&r),
            h(&[
                ("x-ratelimit-limit", "20, 20;w=60;name=\"user_id\""),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "2"),
                ("retry-after", "2"),
            ])
        );
    }
    // Turn admission sees the same bucket: refused with the same hint.
    let d = rls.app.limiter().admit_turn("u1", "run-1").await.unwrap();
    assert_eq!(d.denial().and_then(|d| d.retry_after_ms()), Some(2_000));
    rls.clock.advance(2_000);
    assert_eq!(code(&rls.one(&[("user_id", "u1")], 0).await), Code::Ok);

    // And the other way round: two admitted turns leave 3, Envoy takes one.
    let l = rls.app.limiter();
    for inv in ["a", "b"] {
        assert!(l.admit_turn("u2", inv).await.unwrap().is_allowed());
    }
    let r = rls.one(&[("user_id", "u2")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert_eq!(rls.decisions("turn_rate", "allowed", "support"), 7);
    assert_eq!(rls.decisions("turn_rate", "denied", "support"), 5);
    rls.stop().await;
}

/// `hits_addend` is the cost: the request's (0 means 1), overridden by a
/// descriptor's (where 0 takes nothing); past the burst it can never fit.
#[tokio::test]
async fn hits_addend_is_the_cost() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let r = rls.one(&[("user_id", "u1")], 3).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 2, ms(9_000))]);
    // 3 more need one more turn, refilled in 3,000 ms; nothing is taken.
    let r = rls.one(&[("user_id", "u1")], 3).await;
    assert_eq!(r.statuses, [status(Code::OverLimit, turns(), 0, ms(3_000))]);
    assert!(headers(&r).contains(&("retry-after".to_owned(), "3".to_owned())));
    // A descriptor's own hits_addend wins over the request's.
    let r = rls
        .ask("agents", vec![desc_hits(&[("user_id", "u1")], 2)], 3)
        .await
        .unwrap();
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 0, ms(15_000))]);
    // 0 on a descriptor reports the bucket and takes nothing.
    let r = rls
        .ask("agents", vec![desc_hits(&[("user_id", "u1")], 0)], 0)
        .await
        .unwrap();
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 0, ms(15_000))]);
    // So does a refund request (is_negative_hits): tollgate gives back only
    // through settle and refund.
    let refund = RateLimitDescriptor {
        is_negative_hits: true,
        ..desc_hits(&[("user_id", "u1")], 2)
    };
    let r = rls.ask("agents", vec![refund], 0).await.unwrap();
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 0, ms(15_000))]);
    // More than the burst of 5: never grantable, no hint.
    let r = rls.one(&[("user_id", "u2")], 6).await;
    assert_eq!(r.statuses, [status(Code::OverLimit, turns(), 0, None)]);
    assert!(!headers(&r).iter().any(|(k, _)| k == "retry-after"));
    assert_eq!(code(&rls.one(&[("user_id", "u2")], 5).await), Code::Ok);
    rls.stop().await;
}

// ---------------------------------------------------------------------------
// Named buckets

/// Generic descriptors go to named buckets with their own rates, one per
/// value; a value-specific rule comes before the rule for every value.
#[tokio::test]
async fn generic_descriptors_use_named_buckets_with_their_own_rates() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let search = || limit(2, Unit::Second, "search");
    // search: 2 per second, burst 4; each refilled in 500 ms.
    for left in (0..4u32).rev() {
        let r = rls.one(&[("generic_key", "search")], 0).await;
        assert_eq!(
            r.statuses,
            [status(
                Code::Ok,
                search(),
                left,
                ms(500 * u64::from(4 - left))
            )]
        );
    }
    let r = rls.one(&[("generic_key", "search")], 0).await;
    assert_eq!(r.statuses, [status(Code::OverLimit, search(), 0, ms(500))]);
    assert_eq!(
        headers(&r),
        h(&[
            ("x-ratelimit-limit", "2, 2;w=1;name=\"search\""),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1"),
            ("retry-after", "1"),
        ])
    );
    // Asked again before the hint ends: the same answer, from this
    // replica's kept refusal (SPEC §3), the store not asked.
    let r = rls.one(&[("generic_key", "search")], 0).await;
    assert_eq!(r.statuses, [status(Code::OverLimit, search(), 0, ms(500))]);
    assert_eq!(rls.app.limiter().refusals_answered_locally(), 1);
    // Every other value: its own bucket of 1 per second, burst 1.
    let other = || limit(1, Unit::Second, "generic_key");
    let r = rls.one(&[("generic_key", "index")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, other(), 0, ms(1_000))]);
    let r = rls.one(&[("generic_key", "index")], 0).await;
    assert_eq!(r.statuses, [status(Code::OverLimit, other(), 0, ms(1_000))]);
    let r = rls.one(&[("generic_key", "upload")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, other(), 0, ms(1_000))]);
    // The user's turns were not touched.
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    // 500 ms later search holds 1 again.
    rls.clock.advance(500);
    let r = rls.one(&[("generic_key", "search")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, search(), 0, ms(2_000))]);
    assert_eq!(rls.decisions("bucket", "allowed", "search"), 5);
    assert_eq!(rls.decisions("bucket", "denied", "search"), 2);
    assert_eq!(rls.decisions("bucket", "denied", "generic_key"), 1);
    rls.stop().await;
}

/// A descriptor of two entries matches the rule of exactly that shape, in
/// any order, with its own bucket per user; it is not the user's turns.
#[tokio::test]
async fn descriptors_of_several_entries_match_whole() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let chat = || limit(30, Unit::Minute, "generic_key=chat,user_id");
    for (i, entries) in [
        [("generic_key", "chat"), ("user_id", "u1")],
        [("user_id", "u1"), ("generic_key", "chat")],
        [("generic_key", "chat"), ("user_id", "u1")],
    ]
    .iter()
    .enumerate()
    {
        let r = rls.one(entries, 0).await;
        let left = 2 - i as u32;
        assert_eq!(
            r.statuses,
            [status(Code::Ok, chat(), left, ms(2_000 * (i as u64 + 1)))]
        );
    }
    let r = rls
        .one(&[("generic_key", "chat"), ("user_id", "u1")], 0)
        .await;
    assert_eq!(r.statuses, [status(Code::OverLimit, chat(), 0, ms(2_000))]);
    // Another user has a bucket of their own; u1's turns are untouched.
    let r = rls
        .one(&[("generic_key", "chat"), ("user_id", "u2")], 0)
        .await;
    assert_eq!(code(&r), Code::Ok);
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    // Another shape (another value, an extra entry) matches no rule.
    for entries in [
        &[("generic_key", "mail"), ("user_id", "u1")][..],
        &[("generic_key", "chat"), ("user_id", "u1"), ("x", "y")][..],
    ] {
        let r = rls.one(entries, 0).await;
        assert_eq!(r.statuses, [status(Code::Ok, None, 0, None)]);
    }
    rls.stop().await;
}

/// Several descriptors: each is decided and reported on its own; one over
/// the limit makes the answer OVER_LIMIT; the headers follow the one with
/// the least remaining and list every limit.
#[tokio::test]
async fn one_descriptor_over_the_limit_refuses_the_request() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let other = || limit(1, Unit::Second, "generic_key");
    assert_eq!(
        code(&rls.one(&[("generic_key", "index")], 0).await),
        Code::Ok
    );
    let r = rls
        .ask(
            "agents",
            vec![
                desc(&[("user_id", "u2")]),
                desc(&[("generic_key", "index")]),
                desc(&[("remote_address", "192.0.2.1")]),
            ],
            0,
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(
        r.statuses,
        [
            status(Code::Ok, turns(), 4, ms(3_000)),
            status(Code::OverLimit, other(), 0, ms(1_000)),
            status(Code::Ok, None, 0, None),
        ]
    );
    assert_eq!(
        headers(&r),
        h(&[
            (
                "x-ratelimit-limit",
                "1, 20;w=60;name=\"user_id\", 1;w=1;name=\"generic_key\""
            ),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1"),
            ("retry-after", "1"),
        ])
    );
    // The descriptor that granted was counted (as Envoy's reference
    // service does): u2 has 4 turns left, then 3.
    let r = rls.one(&[("user_id", "u2")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 3);
    rls.stop().await;
}

/// Descriptors no rule matches, and requests for another domain, are OK with
/// no limit and no headers, and charge nothing.
#[tokio::test]
async fn unmatched_descriptors_and_other_domains_are_ok() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let r = rls.one(&[("remote_address", "192.0.2.1")], 0).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(r.statuses, [status(Code::Ok, None, 0, None)]);
    assert!(r.response_headers_to_add.is_empty());
    for _ in 0..6 {
        let r = rls
            .ask("other", vec![desc(&[("user_id", "u1")])], 0)
            .await
            .unwrap();
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses, [status(Code::Ok, None, 0, None)]);
    }
    let r = rls.ask("agents", Vec::new(), 0).await.unwrap();
    assert_eq!((code(&r), r.statuses.len()), (Code::Ok, 0));
    // u1 still has a full bucket.
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(rls.decisions("none", "allowed", "unmatched"), 7);
    rls.stop().await;
}

// ---------------------------------------------------------------------------
// Shadow mode, reload, unknown users

/// `[rls] shadow`: decided and counted as usual, a would-be refusal takes
/// nothing and is counted shadow_denied, and Envoy is told OK with no
/// headers. Swapping the rules (a reload) turns enforcement on.
#[tokio::test]
async fn shadow_mode_answers_ok_while_counting() {
    let (store, clock) = memory();
    let shadow = RULES.replace("domain = \"agents\"", "domain = \"agents\"\nshadow = true");
    let mut rls = Rls::start(store, clock, PLANS, &shadow).await;
    for _ in 0..5 {
        assert_eq!(code(&rls.one(&[("user_id", "u1")], 0).await), Code::Ok);
    }
    for _ in 0..3 {
        let r = rls.one(&[("user_id", "u1")], 0).await;
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses, [status(Code::Ok, turns(), 0, ms(3_000))]);
        assert!(r.response_headers_to_add.is_empty());
    }
    assert_eq!(rls.decisions("turn_rate", "allowed", "support"), 5);
    assert_eq!(rls.decisions("turn_rate", "shadow_denied", "support"), 3);
    // Named buckets too.
    assert_eq!(code(&rls.one(&[("generic_key", "x")], 0).await), Code::Ok);
    assert_eq!(code(&rls.one(&[("generic_key", "x")], 0).await), Code::Ok);
    assert_eq!(rls.decisions("bucket", "shadow_denied", "generic_key"), 1);

    // Enforcing now (a reload through a handle): the shadow refusals took
    // nothing, so after 3,000 ms exactly one turn is back.
    rls.service.rules_handle().set(rules(RULES));
    assert!(!rls.service.rules().shadow());
    rls.clock.advance(3_000);
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 0, ms(15_000))]);
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(code(&r), Code::OverLimit);
    rls.stop().await;
}

/// A plan in shadow mode: its users' turns are answered OK while counted
/// shadow_denied, and nothing is taken.
#[tokio::test]
async fn a_plan_in_shadow_mode_is_ok_while_counting() {
    let (store, clock) = memory();
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let trial = || limit(20, Unit::Minute, "user_id");
    for left in [1, 0] {
        let r = rls.one(&[("user_id", "trial")], 0).await;
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let r = rls.one(&[("user_id", "trial")], 0).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(r.statuses, [status(Code::Ok, trial(), 0, ms(6_000))]);
    assert!(!headers(&r).iter().any(|(k, _)| k == "retry-after"));
    assert_eq!(rls.decisions("turn_rate", "shadow_denied", "trial"), 1);
    assert_eq!(rls.decisions("turn_rate", "allowed", "trial"), 2);
    rls.stop().await;
}

/// A user with no plan (and no default plan) is refused on a `user_turns`
/// rule; a value that is no id never gets that far (see
/// `bounds_are_invalid_argument_and_take_nothing`).
#[tokio::test]
async fn users_without_a_plan_are_over_limit() {
    let (store, clock) = memory();
    let plans = PLANS.replace("default_plan = \"support\"\n", "");
    let mut rls = Rls::start(store, clock, &plans, RULES).await;
    for _ in 0..2 {
        let r = rls.one(&[("user_id", "stranger")], 0).await;
        assert_eq!(code(&r), Code::OverLimit);
        assert_eq!(r.statuses, [status(Code::OverLimit, None, 0, None)]);
        assert!(r.response_headers_to_add.is_empty());
    }
    assert_eq!(rls.decisions("turn_rate", "denied", "unknown"), 2);
    // A user with a plan is fine.
    assert_eq!(code(&rls.one(&[("user_id", "trial")], 0).await), Code::Ok);
    rls.stop().await;
}

// ---------------------------------------------------------------------------
// Store outages

async fn redis_store(url: String) -> RedisStore {
    RedisStore::connect(
        RedisConfig::standalone(url)
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect")
}

/// With Redis down under fail_closed the service answers UNAVAILABLE (so
/// Envoy's `failure_mode_deny` decides), counted as a store error; once
/// Redis is back it answers again without a restart.
#[tokio::test]
async fn store_down_answers_unavailable_then_recovers() {
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(T0);
    let store = Failover::new(
        redis_store(server.url()).await,
        FailurePolicy::FailClosed,
        clock.clone(),
    )
    .expect("policy");
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    assert_eq!(code(&rls.one(&[("generic_key", "x")], 0).await), Code::Ok);

    server.stop();
    for entries in [&[("user_id", "u1")][..], &[("generic_key", "search")][..]] {
        let e = rls
            .ask("agents", vec![desc(entries)], 0)
            .await
            .expect_err("store down");
        assert_eq!(e.code(), tonic::Code::Unavailable, "{entries:?}: {e:?}");
        assert!(!e.message().contains("redis"), "no detail leaks: {e:?}");
    }
    let errors = metric(&rls.app.metrics().encode(), "tollgate_store_errors_total ");
    assert_eq!(errors, 2);
    // Unmatched descriptors need no store: still OK.
    let r = rls.one(&[("remote_address", "192.0.2.1")], 0).await;
    assert_eq!(code(&r), Code::Ok);

    server.restart().expect("restart");
    rls.clock.advance(1_000); // past the failover's probe interval
    let back = wait_until(10, || {
        let mut client = rls.client.clone();
        async move {
            client
                .should_rate_limit(RateLimitRequest {
                    domain: "agents".into(),
                    descriptors: vec![desc(&[("user_id", "u9")])],
                    hits_addend: 0,
                })
                .await
                .is_ok()
        }
    })
    .await;
    assert!(back, "answers again once Redis is back");
    rls.stop().await;
}

/// Under fail_open the service keeps deciding from the local store while
/// Redis is down.
#[tokio::test]
async fn store_down_under_fail_open_decides_locally() {
    let mut server = RedisServer::start().expect("redis-server");
    let clock = FakeClock::new(T0);
    let store = Failover::new(
        redis_store(server.url()).await,
        FailurePolicy::FailOpen {
            fallback_share: 1.0,
        },
        clock.clone(),
    )
    .expect("policy");
    let mut rls = Rls::start(store, clock, PLANS, RULES).await;
    server.stop();
    for left in (0..5).rev() {
        let r = rls.one(&[("user_id", "u1")], 0).await;
        assert_eq!(r.statuses[0].limit_remaining, left);
    }
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(code(&r), Code::OverLimit);
    rls.stop().await;
}

// ---------------------------------------------------------------------------
// The listener: `tollgate serve` with `rls_listen`, the key and the bounds

/// The key of the keyed sidecars (`[rls] key`).
const KEY: &str = "rls-test-key-0123456789abcdef-0123456789";

/// PLANS and RULES as one `tollgate serve` config on loopback port 0 for
/// HTTP, the gRPC API and `rls_listen`; with `[rls] key = KEY` when `keyed`.
fn sidecar_config(keyed: bool) -> String {
    let plans = PLANS.replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nrls_listen = \"127.0.0.1:0\"\n",
    );
    let rules = if keyed {
        RULES.replace(
            "[rls]\n",
            &format!("[rls]\nkey = \"{KEY}\"\nmax_in_flight = 64\n"),
        )
    } else {
        RULES.to_owned()
    };
    format!("{plans}\n{rules}")
}

/// `tollgate_server::serve_with` on loopback listeners for HTTP, the gRPC
/// API and Envoy's rate-limit service, on a fake clock at [`T0`].
struct Sidecar {
    http: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
    rls: std::net::SocketAddr,
    clock: FakeClock,
    web: reqwest::Client,
    config: Config,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Sidecar {
    async fn start(config: Config) -> Self {
        let clock = FakeClock::new(T0);
        let bind = || async { TcpListener::bind("127.0.0.1:0").await.expect("bind") };
        let (http, grpc, rls) = (bind().await, bind().await, bind().await);
        let addr = |l: &TcpListener| l.local_addr().expect("addr");
        let (http_addr, grpc_addr, rls_addr) = (addr(&http), addr(&grpc), addr(&rls));
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, on_start) = oneshot::channel();
        let task = tokio::spawn(tollgate_server::serve_with(
            config.clone(),
            Listeners::new(http).with_grpc(grpc).with_rls(rls),
            Some(Arc::new(clock.clone())),
            move |r| {
                let _ = started.send((r.rls_addr, r.rls_key));
            },
            async move {
                let _ = stopped.await;
            },
        ));
        let (reported, keyed) = on_start.await.expect("started");
        assert_eq!(reported, Some(rls_addr), "serve reports the RLS listener");
        assert_eq!(keyed, config.rls_server.key.is_some());
        Self {
            http: http_addr,
            grpc: grpc_addr,
            rls: rls_addr,
            clock,
            web: reqwest::Client::new(),
            config,
            stop: Some(stop),
            task,
        }
    }

    async fn keyed() -> Self {
        let config = Config::parse(&sidecar_config(true), "test", Path::new(".")).expect("valid");
        Self::start(config).await
    }

    async fn client(addr: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect")
    }

    /// A dev-mode token for `user`.
    fn token(&self, user: &str) -> String {
        tollgate_server::verifier(&self.config, Arc::new(self.clock.clone()))
            .expect("verifier")
            .mint(user, 3_600)
            .expect("mint")
    }

    /// `POST /v1/runs` for `user`, then its release; answers the admission.
    async fn admit(&self, user: &str, inv: &str) -> common::Resp {
        let auth = format!("Bearer {}", self.token(user));
        let base = format!("http://{}", self.http);
        let r = common::send_with(
            &self.web,
            reqwest::Method::POST,
            &format!("{base}/v1/runs"),
            Some(&auth),
            Some(&format!(r#"{{"invocation_id":"{inv}"}}"#)),
        )
        .await;
        common::send_with(
            &self.web,
            reqwest::Method::DELETE,
            &format!("{base}/v1/runs/{inv}"),
            Some(&auth),
            None,
        )
        .await
        .ok();
        r
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

    async fn shutdown(mut self) {
        common::shutdown(self.stop.take(), self.task).await;
    }
}

/// A `ShouldRateLimit` of `descriptors` in domain `agents`, with `key` as
/// `x-tollgate-rls-key` when given.
fn keyed_request(
    key: Option<&str>,
    descriptors: Vec<RateLimitDescriptor>,
) -> tonic::Request<RateLimitRequest> {
    let mut r = tonic::Request::new(RateLimitRequest {
        domain: "agents".into(),
        descriptors,
        hits_addend: 0,
    });
    if let Some(k) = key {
        r.metadata_mut()
            .insert("x-tollgate-rls-key", k.parse().expect("ascii"));
    }
    r
}

/// The turns `user` has left, asked with the key at cost 0 (takes nothing).
async fn turns_left(c: &mut RateLimitServiceClient<Channel>, user: &str) -> u32 {
    let r = c
        .should_rate_limit(keyed_request(
            Some(KEY),
            vec![desc_hits(&[("user_id", user)], 0)],
        ))
        .await
        .expect("keyed call")
        .into_inner();
    r.statuses[0].limit_remaining
}

/// The field a status's `google.rpc.BadRequest` names.
fn bad_field(s: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    let details = s.get_error_details();
    let v = &details
        .bad_request()
        .expect("a BadRequest")
        .field_violations;
    assert_eq!(v.len(), 1, "{s:?}");
    v[0].field.clone()
}

/// The API's gRPC port no longer answers Envoy's rate-limit service: an
/// anonymous ShouldRateLimit there is UNIMPLEMENTED however often it is
/// sent, and the user's turns are untouched.
#[tokio::test]
async fn should_rate_limit_on_grpc_listen_is_unimplemented() {
    let srv = Sidecar::keyed().await;
    let mut api = Sidecar::client(srv.grpc).await;
    for _ in 0..20 {
        let e = api
            .should_rate_limit(keyed_request(None, vec![desc(&[("user_id", "u0")])]))
            .await
            .expect_err("not served here");
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    }
    // Not even with the key: it is not the RLS listener.
    let e = api
        .should_rate_limit(keyed_request(Some(KEY), vec![desc(&[("user_id", "u0")])]))
        .await
        .expect_err("not served here");
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    srv.admit("u0", "r1").await.ok();
    let mut rls = Sidecar::client(srv.rls).await;
    assert_eq!(
        turns_left(&mut rls, "u0").await,
        4,
        "only the run took a turn"
    );
    srv.shutdown().await;
}

/// On `rls_listen` with a key configured, a call without it or with a
/// wrong one is UNAUTHENTICATED before anything is read or taken: an
/// anonymous loop for u0 leaves u0's turns whole, so POST /v1/runs admits
/// the whole burst. With the key it decides.
#[tokio::test]
async fn without_the_key_nothing_is_taken() {
    let srv = Sidecar::keyed().await;
    let mut c = Sidecar::client(srv.rls).await;
    let wrong_same_length = format!("{}X", &KEY[..KEY.len() - 1]);
    for key in [
        None,
        Some("wrong"),
        Some(wrong_same_length.as_str()),
        Some(""),
    ] {
        for _ in 0..10 {
            let e = c
                .should_rate_limit(keyed_request(key, vec![desc(&[("user_id", "u0")])]))
                .await
                .expect_err("refused");
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{key:?}: {e:?}");
            assert_eq!(
                e.metadata()
                    .get("x-tollgate-error")
                    .map(|v| v.to_str().unwrap()),
                Some("unauthorized")
            );
            assert!(!e.message().contains(KEY), "the key never leaks");
        }
    }
    // Refused before the message is read: even one over the decode limit.
    let big = vec![desc(&[("user_id", &"u".repeat(100 * 1024))])];
    let e = c
        .should_rate_limit(keyed_request(None, big))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // u0's bucket is untouched: the plan's whole burst of 5 is admitted.
    for i in 1..=5 {
        srv.admit("u0", &format!("r{i}")).await.ok();
    }
    srv.admit("u0", "r6").await.limited("turn_rate", 3_000);
    // With the key it decides, on the same bucket.
    let r = c
        .should_rate_limit(keyed_request(Some(KEY), vec![desc(&[("user_id", "u1")])]))
        .await
        .expect("keyed")
        .into_inner();
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    assert_eq!(turns_left(&mut c, "u1").await, 4);
    let text = srv.metrics().await;
    assert_eq!(
        common::metric(
            &text,
            r#"tollgate_grpc_requests_total{method="ShouldRateLimit",code="UNAUTHENTICATED"}"#
        ),
        Some(41.0),
        "{text}"
    );
    assert_eq!(
        common::metric(
            &text,
            r#"tollgate_decisions_total{op="rls",limit="turn_rate",outcome="allowed",plan="support"}"#
        ),
        Some(2.0),
        "only keyed calls were decided: {text}"
    );
    srv.shutdown().await;
}

/// More than 16 descriptors, more than 16 entries in one, or an entry key
/// that is not an id (empty, over 512 characters, a control character) is
/// INVALID_ARGUMENT naming the field; an entry value that is not an id
/// (values may come from a client's headers) fails safe: the whole request
/// is OVER_LIMIT. Either way nothing of the request is taken (a valid
/// descriptor beside the bad one included); 16 and 16 are fine; a message
/// over 64 KiB is refused unread.
#[tokio::test]
async fn bounds_are_invalid_argument_and_take_nothing() {
    let srv = Sidecar::keyed().await;
    let mut c = Sidecar::client(srv.rls).await;
    let u1 = || desc(&[("user_id", "u1")]);
    let long = "v".repeat(513);
    let seventeen: Vec<(String, String)> =
        (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    let entries = |n: usize| -> Vec<(&str, &str)> {
        seventeen[..n]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    };
    let cases: Vec<(Vec<RateLimitDescriptor>, &str)> = vec![
        ((0..17).map(|_| u1()).collect(), "descriptors"),
        (vec![u1(), desc(&entries(17))], "descriptors[1].entries"),
        (
            vec![desc(&[("generic_key", "search"), ("x\ny", "1")])],
            "descriptors[0].entries[1].key",
        ),
        (vec![desc(&[("", "u1")])], "descriptors[0].entries[0].key"),
    ];
    for (descriptors, field) in cases {
        let e = c
            .should_rate_limit(keyed_request(Some(KEY), descriptors))
            .await
            .expect_err("invalid");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}: {e:?}");
        assert_eq!(bad_field(&e), field, "{e:?}");
    }
    for bad in ["u1\t", "u1\u{7f}", "", long.as_str()] {
        let r = c
            .should_rate_limit(keyed_request(
                Some(KEY),
                vec![u1(), desc(&[("user_id", bad)])],
            ))
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(code(&r), Code::OverLimit, "{bad:?}");
        assert!(
            r.statuses.iter().all(|s| s.code == Code::OverLimit as i32),
            "every descriptor refused: {r:?}"
        );
    }
    // Nothing was taken: u1 and the search bucket are full.
    assert_eq!(turns_left(&mut c, "u1").await, 5);
    let r = c
        .should_rate_limit(keyed_request(
            Some(KEY),
            vec![desc_hits(&[("generic_key", "search")], 0)],
        ))
        .await
        .expect("keyed")
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 4);

    // At the bounds: 16 descriptors (the first five of u1 granted, the rest
    // over the limit), one of 16 entries (no rule: OK), a 512-byte value.
    let r = c
        .should_rate_limit(keyed_request(Some(KEY), (0..16).map(|_| u1()).collect()))
        .await
        .expect("16 descriptors")
        .into_inner();
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(r.statuses.len(), 16);
    let r = c
        .should_rate_limit(keyed_request(Some(KEY), vec![desc(&entries(16))]))
        .await
        .expect("16 entries")
        .into_inner();
    assert_eq!(r.statuses, [status(Code::Ok, None, 0, None)]);
    let r = c
        .should_rate_limit(keyed_request(
            Some(KEY),
            vec![desc(&[("user_id", &"u".repeat(512))])],
        ))
        .await
        .expect("512 characters")
        .into_inner();
    assert_eq!(code(&r), Code::Ok);

    // Over 64 KiB: refused by the decoder, nothing taken.
    let big = vec![u1(), desc(&[("generic_key", &"g".repeat(65 * 1024))])];
    let e = c
        .should_rate_limit(keyed_request(Some(KEY), big))
        .await
        .expect_err("too large");
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    srv.clock.advance(3_000);
    assert_eq!(
        turns_left(&mut c, "u1").await,
        1,
        "one turn refilled, none taken"
    );
    let text = srv.metrics().await;
    assert_eq!(
        common::metric(
            &text,
            r#"tollgate_grpc_requests_total{method="ShouldRateLimit",code="INVALID_ARGUMENT"}"#
        ),
        Some(4.0),
        "{text}"
    );
    srv.shutdown().await;
}

/// The service's own in-flight cap: while its places are taken a call is
/// RESOURCE_EXHAUSTED `overloaded` (retry after 1 s) at once, and nothing
/// is taken; once a place is free it decides again. The API's cap is
/// another one.
#[tokio::test]
async fn the_in_flight_cap_is_resource_exhausted() {
    let (store, clock) = memory();
    let config = Config::parse(PLANS, "the test config", Path::new(".")).expect("config");
    let app = tollgate_server::app(&config, store, Arc::new(clock.clone())).expect("app");
    let server = RlsServer {
        max_in_flight: 2,
        ..RlsServer::default()
    };
    let mut rls = Rls::start_with(app, clock, RULES, server).await;
    let gate = rls.service.gate().clone();
    assert_eq!(gate.capacity(), 2);
    let held = [gate.try_acquire().unwrap(), gate.try_acquire().unwrap()];
    for _ in 0..3 {
        let e = rls
            .ask("agents", vec![desc(&[("user_id", "u1")])], 0)
            .await
            .expect_err("over the cap");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert_eq!(
            e.metadata()
                .get("x-tollgate-error")
                .map(|v| v.to_str().unwrap()),
            Some("overloaded")
        );
        assert_eq!(
            e.metadata()
                .get("retry-after-ms")
                .map(|v| v.to_str().unwrap()),
            Some("1000")
        );
    }
    assert_eq!(rls.app.gate().in_flight(), 0, "not the API's cap");
    drop(held);
    let r = rls.one(&[("user_id", "u1")], 0).await;
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    assert_eq!(gate.in_flight(), 0, "the place is freed after the answer");
    rls.stop().await;
}

/// A reload swaps the rules of the service on `rls_listen` (the same
/// budget as turn admission), and the key stays required.
#[tokio::test]
async fn rules_reload_on_the_rls_listener() {
    let dir = common::TempDir::new();
    let file = dir.path().join("tollgate.toml");
    let with_admin = |text: String| {
        // The first `listen` line (not `grpc_listen` or `rls_listen`).
        text.replacen(
            "listen = \"127.0.0.1:0\"\n",
            "listen = \"127.0.0.1:0\"\nadmin_token = \"admin-token-0123456789abcdef\"\n",
            1,
        )
    };
    std::fs::write(&file, with_admin(sidecar_config(true))).expect("write");
    let srv = Sidecar::start(Config::load(&file).expect("valid")).await;
    let mut c = Sidecar::client(srv.rls).await;
    let ask = |key: &str| keyed_request(Some(KEY), vec![desc(&[(key, "alice")])]);
    for n in 1..=6 {
        let r = c.should_rate_limit(ask("user_id")).await.expect("answer");
        let want = if n <= 5 { Code::Ok } else { Code::OverLimit };
        assert_eq!(code(r.get_ref()), want, "call {n}");
    }
    // The same bucket as turn admission: alice's turns are used up.
    srv.admit("alice", "r1").await.limited("turn_rate", 3_000);

    // A reload moves the user_turns rule to another descriptor key.
    let moved = sidecar_config(true).replace(
        "key = \"user_id\"\nlimit = \"user_turns\"",
        "key = \"account\"\nlimit = \"user_turns\"",
    );
    std::fs::write(&file, with_admin(moved)).expect("rewrite");
    let resp = srv
        .web
        .post(format!("http://{}/admin/reload", srv.http))
        .bearer_auth("admin-token-0123456789abcdef")
        .send()
        .await
        .expect("reload");
    assert_eq!(resp.status().as_u16(), 200);
    let r = c.should_rate_limit(ask("user_id")).await.expect("answer");
    assert_eq!(code(r.get_ref()), Code::Ok, "user_id is no longer limited");
    let r = c.should_rate_limit(ask("account")).await.expect("answer");
    assert_eq!(code(r.get_ref()), Code::OverLimit, "account is");
    let e = c
        .should_rate_limit(keyed_request(None, vec![desc(&[("account", "alice")])]))
        .await
        .expect_err("still keyed");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    srv.shutdown().await;
}

/// Without a key (allowed on loopback) the listener answers anyone who can
/// reach it, as before.
#[tokio::test]
async fn a_loopback_listener_without_a_key_answers() {
    let config = Config::parse(&sidecar_config(false), "test", Path::new(".")).expect("valid");
    assert_eq!(config.rls_server.key, None);
    let srv = Sidecar::start(config).await;
    let mut c = Sidecar::client(srv.rls).await;
    let r = c
        .should_rate_limit(keyed_request(None, vec![desc(&[("user_id", "u1")])]))
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(r.statuses, [status(Code::Ok, turns(), 4, ms(3_000))]);
    srv.shutdown().await;
}

/// `serve` binds `rls_listen` itself; `serve_with` refuses a listener on
/// an address other than loopback when the config has no key.
#[tokio::test]
async fn serve_binds_rls_listen_and_a_public_listener_needs_a_key() {
    let config = Config::parse(&sidecar_config(true), "t", Path::new(".")).expect("valid");
    assert_eq!(
        config.rls_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:0")
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (tx, rx) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve(
        config,
        listener,
        Some(Arc::new(FakeClock::new(T0))),
        move |r| {
            let _ = tx.send((r.grpc_addr, r.rls_addr));
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let (grpc, rls) = rx.await.expect("started");
    let (grpc, rls) = (grpc.expect("grpc"), rls.expect("rls"));
    assert!(rls.port() != 0 && rls != grpc);
    let mut c = Sidecar::client(rls).await;
    let r = c
        .should_rate_limit(keyed_request(Some(KEY), vec![desc(&[("user_id", "u1")])]))
        .await
        .expect("served");
    assert_eq!(code(r.get_ref()), Code::Ok);
    common::shutdown(Some(stop), task).await;

    // serve_with on a wildcard listener and no key: refused before serving.
    let config = Config::parse(&sidecar_config(false), "t", Path::new(".")).expect("valid");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let public = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let e = tollgate_server::serve_with(
        config,
        Listeners::new(http).with_rls(public),
        Some(Arc::new(FakeClock::new(T0))),
        |_| panic!("must not start"),
        std::future::pending(),
    )
    .await
    .expect_err("refused");
    assert!(
        matches!(e, tollgate_server::StartError::RlsKeyRequired { .. }),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// Config validation

fn parse_errors(text: &str, base: &Path) -> Vec<String> {
    Config::parse(text, "t", base)
        .expect_err("refused")
        .errors
        .iter()
        .map(|e| format!("{}: {}", e.path, e.reason))
        .collect()
}

/// PLANS with these top-level keys and `[rls]` lines.
fn with_rls(top: &str, rls: &str) -> String {
    PLANS.replace(
        "listen = \"127.0.0.1:0\"\n",
        &format!("listen = \"127.0.0.1:8787\"\n{top}\n"),
    ) + &format!("\n[rls]\n{rls}\n")
}

/// `rls_listen`: a non-loopback address needs a key; its own port; the
/// key's rules; the `[rls]` listener settings only with `rls_listen`;
/// `Debug` never shows the key; the embedded default and the bench configs.
#[test]
fn rls_listen_and_the_key_are_validated() {
    let dir = common::TempDir::new();
    let base = dir.path();
    let needs_key = "rls_listen: a non-loopback address needs [rls] key or key_file";
    for addr in ["0.0.0.0:8789", "10.0.0.5:8789", "[::]:8789"] {
        let e = parse_errors(&with_rls(&format!("rls_listen = \"{addr}\""), ""), base);
        assert_eq!(e, [needs_key], "{addr}");
    }
    for addr in ["127.0.0.1:8789", "[::1]:8789", "127.0.0.2:8789"] {
        let c = Config::parse(
            &with_rls(&format!("rls_listen = \"{addr}\""), ""),
            "t",
            base,
        )
        .expect("loopback needs no key");
        assert_eq!(c.rls_listen.map(|a| a.to_string()).as_deref(), Some(addr));
        assert_eq!(c.rls_server.key, None);
        assert_eq!(c.rls_server.max_in_flight, 1_024);
    }
    // With a key, or a key file relative to the config's directory.
    let c = Config::parse(
        &with_rls(
            "rls_listen = \"0.0.0.0:8789\"",
            &format!("key = \"{KEY}\"\nmax_in_flight = 7"),
        ),
        "t",
        base,
    )
    .expect("keyed");
    assert!(
        c.rls_server
            .key
            .as_ref()
            .is_some_and(|k| k.matches(KEY.as_bytes()))
    );
    assert_eq!(c.rls_server.max_in_flight, 7);
    assert!(!format!("{c:?}").contains(KEY), "Debug redacts the key");
    std::fs::write(base.join("rls.key"), format!("  {KEY}\n")).expect("write");
    let file = base.join("tollgate.toml");
    std::fs::write(
        &file,
        with_rls("rls_listen = \"0.0.0.0:8789\"", "key_file = \"rls.key\""),
    )
    .expect("write");
    let c = Config::load(&file).expect("key_file");
    assert!(
        c.rls_server
            .key
            .as_ref()
            .is_some_and(|k| k.matches(KEY.as_bytes()))
    );
    assert!(!format!("{c:?}").contains(KEY));
    let raw: tollgate_server::config::FileConfig =
        toml::from_str(&with_rls("", &format!("key = \"{KEY}\""))).expect("toml");
    assert!(!format!("{raw:?}").contains(KEY), "the file's Debug too");

    // Every other rule.
    let cases: Vec<(String, Vec<String>)> = vec![
        (
            with_rls("rls_listen = \"127.0.0.1:8787\"", ""),
            vec!["rls_listen: 127.0.0.1:8787 is also `listen`: Envoy's rate-limit service needs its own port".into()],
        ),
        (
            with_rls("grpc_listen = \"127.0.0.1:8788\"\nrls_listen = \"127.0.0.1:8788\"", ""),
            vec!["rls_listen: 127.0.0.1:8788 is also `grpc_listen`: Envoy's rate-limit service needs its own port".into()],
        ),
        (
            with_rls("rls_listen = \"localhost:8789\"", ""),
            vec!["rls_listen: \"localhost:8789\" is not an address like 127.0.0.1:8789".into()],
        ),
        (
            with_rls("rls_listen = \"0.0.0.0:8789\"", "key = \"short\""),
            vec!["rls.key: the key is 5 bytes; at least 32 are required (e.g. openssl rand -base64 48)".into()],
        ),
        (
            with_rls(
                "rls_listen = \"127.0.0.1:8789\"",
                "key = \"0123456789 0123456789 0123456789 0123456789\"",
            ),
            vec!["rls.key: the key must be printable ASCII without spaces (it is sent as gRPC metadata)".into()],
        ),
        (
            with_rls(
                "rls_listen = \"127.0.0.1:8789\"",
                &format!("key = \"{KEY}\"\nkey_file = \"rls.key\""),
            ),
            vec!["rls.key_file: set either key or key_file, not both".into()],
        ),
        (
            with_rls("rls_listen = \"127.0.0.1:8789\"", "max_in_flight = 0"),
            vec!["rls.max_in_flight: must be between 1 and 1000000 (got 0)".into()],
        ),
        (
            with_rls("", &format!("key = \"{KEY}\"\nmax_in_flight = 8")),
            vec![
                "rls.key: only applies when rls_listen is set".into(),
                "rls.max_in_flight: only applies when rls_listen is set".into(),
            ],
        ),
        (
            with_rls("grpc_listen = \"127.0.0.1:8788\"", "[[rls.descriptors]]\nkey = \"user_id\"\nlimit = \"user_turns\""),
            vec!["rls.descriptors: Envoy's rate-limit service is off without rls_listen (it is no longer served on grpc_listen): set rls_listen and point Envoy at it".into()],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(parse_errors(&text, base), want, "{text}");
    }
    let e = parse_errors(
        &with_rls(
            "rls_listen = \"0.0.0.0:8789\"",
            "key_file = \"missing.key\"",
        ),
        base,
    );
    assert!(
        e.len() == 1 && e[0].starts_with("rls.key_file: cannot read "),
        "{e:?}"
    );

    // The embedded default: loopback, no key, its own port.
    let d = Config::default_config().expect("default");
    assert_eq!(
        d.rls_listen.map(|a| a.to_string()).as_deref(),
        Some("127.0.0.1:8789")
    );
    assert_eq!(d.rls_server, RlsServer::default());
    // The bench configs: rls_listen on a port of its own, where loadgen
    // --mode rls looks by default.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for name in ["bench-memory.toml", "bench-redis.toml"] {
        let c = Config::load(&examples.join(name)).expect(name);
        let ports = [
            Some(c.listen.port()),
            c.grpc_listen.map(|a| a.port()),
            c.rls_listen.map(|a| a.port()),
        ];
        assert_eq!(ports, [Some(8788), Some(8789), Some(8790)], "{name}");
        assert!(!c.rls.rules().is_empty(), "{name}");
    }
}

/// `tollgate check-config` refuses a non-loopback `rls_listen` without a
/// key with its field path, and exits 64.
#[test]
fn check_config_refuses_a_public_rls_listen_without_a_key() {
    let dir = common::TempDir::new();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(&file, with_rls("rls_listen = \"0.0.0.0:8789\"", "")).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check-config")
        .arg(&file)
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("  - rls_listen: a non-loopback address needs [rls] key or key_file"),
        "{stderr}"
    );
    std::fs::write(
        &file,
        with_rls("rls_listen = \"0.0.0.0:8789\"", &format!("key = \"{KEY}\"")),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check-config")
        .arg(&file)
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// With `[audit]`, each refused descriptor is an audit line (op `rls`):
/// the user of a `user_turns` rule, none for a bucket (its rule name in
/// `plan`), and Envoy's `traceparent` from the call's metadata.
#[tokio::test]
async fn refusals_of_the_rate_limit_service_are_audited() {
    let dir = std::env::temp_dir().join(format!("tollgate-rls-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("audit.jsonl");
    let _ = std::fs::remove_file(&file);
    let plans = format!("{PLANS}\n[audit]\nfile = \"{}\"\n", file.display());
    let clock = FakeClock::new(T0);
    let mut rls = Rls::start(MemoryStore::new(clock.clone()), clock, &plans, RULES).await;
    // Five turns, then refused; the bucket "search" (burst 4) likewise.
    for _ in 0..5 {
        rls.one(&[("user_id", "ann")], 1).await;
    }
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: "agents".into(),
        descriptors: vec![desc(&[("user_id", "ann")])],
        hits_addend: 1,
    });
    req.metadata_mut().insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    rls.client.should_rate_limit(req).await.expect("answer");
    for _ in 0..5 {
        rls.one(&[("generic_key", "search")], 1).await;
    }
    let read = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let ok = tollgate_testkit::redis::wait_until(10, || async { read().len() >= 2 }).await;
    let lines = read();
    assert!(ok, "{lines:#?}");
    assert_eq!(
        lines,
        [
            serde_json::json!({"ts_ms": T0, "user": "ann", "plan": "support", "op": "rls",
                "limit": "turn_rate", "outcome": "denied", "retry_after_ms": 3_000,
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}),
            serde_json::json!({"ts_ms": T0, "user": null, "plan": "search", "op": "rls",
                "limit": "bucket", "outcome": "denied", "retry_after_ms": 500,
                "trace_id": null}),
        ]
    );
    rls.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
