//! What tollgate adds to an adk-rust agent, on the memory store.
//!
//! * `model_call/bare`: one `generate_content` of a fake model that answers
//!   one chunk with usage at once, the stream read to its end.
//! * `model_call/limited`: the same through `LimitedLlm` (identity in the
//!   request as `identify_calls` puts it; estimate, reserve, settle).
//! * `turn/bare`: one whole turn through `Runner::run` (in-memory sessions,
//!   an `LlmAgent` on the fake model), the event stream read to its end.
//! * `turn/limited`: the same with the `AdmissionPlugin` and `LimitedLlm`.
//! * `turn/executor_fenced`: the turn through `TurnExecutor` (replica gate,
//!   session lease, admission, renewal timer, release) with `LimitedLlm`,
//!   sessions kept in the memory store by `FencedSessionService`.
//!
//! Users rotate over 10,000 ids (one session each), so per-user state stays
//! small; the plan never refuses. A current-thread tokio runtime drives
//! every iteration (`block_on`), so the figures include one runtime entry.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use adk_agent::LlmAgentBuilder;
use adk_core::{
    Content, GenerateContentConfig, Llm, LlmRequest, LlmResponse, LlmResponseStream, SessionId,
    UsageMetadata, UserId, async_trait,
};
use adk_plugin::PluginManager;
use adk_runner::Runner;
use adk_session::{CreateRequest, InMemorySessionService, SessionService};
use criterion::Criterion;
use futures::StreamExt;
use tollgate_adk::{
    AdmissionPlugin, FencedSessionService, IDENTITY_EXTENSION, LimitedLlm, TurnExecutor,
    identify_calls,
};
use tollgate_core::{
    Limiter, MemoryStore, PlanConfig, PlansConfig, RateConfig, ReplicaGate, SystemClock,
};

const USERS: usize = 10_000;

struct Fake;

#[async_trait]
impl Llm for Fake {
    fn name(&self) -> &str {
        "fake"
    }
    async fn generate_content(
        &self,
        _req: LlmRequest,
        _stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        let response = LlmResponse {
            content: Some(Content::new("model").with_text("ok")),
            usage_metadata: Some(UsageMetadata {
                prompt_token_count: 50,
                candidates_token_count: 5,
                total_token_count: 55,
                ..UsageMetadata::default()
            }),
            turn_complete: true,
            ..LlmResponse::default()
        };
        Ok(Box::pin(futures::stream::once(async move { Ok(response) })))
    }
}

fn limiter() -> Arc<Limiter<MemoryStore>> {
    let huge = RateConfig {
        amount: 1_000_000_000,
        period_ms: 60_000,
        burst: Some(1_000_000_000),
    };
    let plan = PlanConfig {
        turns: huge,
        tokens: huge,
        max_wait_ms: 0,
        concurrent_runs: 1_000,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: None,
        estimate_tokens: Some(100),
        max_sessions: None,
        shadow: false,
        budgets: None,
    };
    let cfg = PlansConfig {
        default_plan: Some("p".into()),
        plans: [("p".to_owned(), plan)].into(),
        ..PlansConfig::default()
    };
    Arc::new(Limiter::new(
        MemoryStore::new(SystemClock),
        SystemClock,
        cfg.validate().expect("valid plan"),
    ))
}

async fn drain(stream: LlmResponseStream) {
    let mut stream = stream;
    while stream.next().await.is_some() {}
}

fn request(user: &str, invocation: &str) -> LlmRequest {
    let mut req = LlmRequest::new("fake", vec![Content::new("user").with_text("hello")]);
    let mut config = GenerateContentConfig::default();
    config.extensions.insert(
        IDENTITY_EXTENSION.to_owned(),
        serde_json::json!({"user": user, "invocation_id": invocation, "agent": "a", "config_was_none": true}),
    );
    req.config = Some(config);
    req
}

fn model_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let users: Vec<String> = (0..USERS).map(|u| format!("user-{u}")).collect();
    let mut g = c.benchmark_group("model_call");
    g.bench_function("bare", |b| {
        b.iter(|| {
            rt.block_on(async {
                drain(
                    Fake.generate_content(request("u", "i"), true)
                        .await
                        .expect("ok"),
                )
                .await;
            });
        });
    });
    let limited = LimitedLlm::new(Fake, limiter());
    let n = AtomicUsize::new(0);
    g.bench_function("limited", |b| {
        b.iter(|| {
            let i = n.fetch_add(1, Ordering::Relaxed);
            let user = &users[i % USERS];
            let invocation = format!("inv-{i}");
            rt.block_on(async {
                drain(
                    limited
                        .generate_content(request(user, &invocation), true)
                        .await
                        .expect("ok"),
                )
                .await;
            });
        });
    });
    g.finish();
}

fn runner(limited: bool) -> (Runner, Arc<dyn SessionService>) {
    let limiter = limiter();
    let builder = LlmAgentBuilder::new("assistant");
    let agent = if limited {
        builder
            .model(Arc::new(LimitedLlm::new(Fake, Arc::clone(&limiter))))
            .before_model_callback(identify_calls())
    } else {
        builder.model(Arc::new(Fake))
    }
    .build()
    .expect("agent");
    let sessions: Arc<dyn SessionService> = Arc::new(InMemorySessionService::new());
    let plugins = if limited {
        vec![AdmissionPlugin::new(limiter).into_plugin()]
    } else {
        vec![]
    };
    let runner = Runner::builder()
        .app_name("bench")
        .agent(Arc::new(agent))
        .session_service(Arc::clone(&sessions))
        .plugin_manager(Arc::new(PluginManager::new(plugins)))
        .build()
        .expect("runner");
    (runner, sessions)
}

fn turn(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let users: Vec<String> = (0..USERS).map(|u| format!("user-{u}")).collect();
    let mut g = c.benchmark_group("turn");
    for (name, limited) in [("bare", false), ("limited", true)] {
        let (runner, sessions) = runner(limited);
        create_sessions(&rt, &sessions, &users);
        let n = AtomicUsize::new(0);
        g.bench_function(name, |b| {
            b.iter(|| {
                let user = &users[n.fetch_add(1, Ordering::Relaxed) % USERS];
                rt.block_on(async {
                    let mut events = runner
                        .run(
                            UserId::new(user.as_str()).expect("id"),
                            SessionId::new(user.as_str()).expect("id"),
                            Content::new("user").with_text("hello"),
                        )
                        .await
                        .expect("run");
                    while let Some(e) = events.next().await {
                        e.expect("event");
                    }
                });
            });
        });
    }
    // The executor over fenced sessions in the store.
    let limiter = limiter();
    let agent = LlmAgentBuilder::new("assistant")
        .model(Arc::new(LimitedLlm::new(Fake, Arc::clone(&limiter))))
        .before_model_callback(identify_calls())
        .build()
        .expect("agent");
    let sessions: Arc<dyn SessionService> = Arc::new(FencedSessionService::new(
        limiter.store().clone(),
        SystemClock,
    ));
    let runner = Runner::builder()
        .app_name("bench")
        .agent(Arc::new(agent))
        .session_service(Arc::clone(&sessions))
        .build()
        .expect("runner");
    let executor = TurnExecutor::new(Arc::new(runner), limiter, ReplicaGate::new(1_000));
    create_sessions(&rt, &sessions, &users);
    let n = AtomicUsize::new(0);
    g.bench_function("executor_fenced", |b| {
        b.iter(|| {
            let user = &users[n.fetch_add(1, Ordering::Relaxed) % USERS];
            rt.block_on(async {
                let mut events = executor
                    .execute(
                        UserId::new(user.as_str()).expect("id"),
                        SessionId::new(user.as_str()).expect("id"),
                        Content::new("user").with_text("hello"),
                    )
                    .await
                    .expect("admitted");
                while let Some(e) = events.next().await {
                    e.expect("event");
                }
            });
        });
    });
    g.finish();
}

fn create_sessions(
    rt: &tokio::runtime::Runtime,
    sessions: &Arc<dyn SessionService>,
    users: &[String],
) {
    rt.block_on(async {
        for user in users {
            sessions
                .create(CreateRequest {
                    app_name: "bench".into(),
                    user_id: user.clone(),
                    session_id: Some(user.clone()),
                    state: HashMap::new(),
                })
                .await
                .expect("session");
        }
    });
}

// What `criterion_group!`/`criterion_main!` expand to, written out so no
// undocumented `pub fn` is generated (missing_docs).
fn main() {
    let mut c = Criterion::default().configure_from_args();
    model_call(&mut c);
    turn(&mut c);
    c.final_summary();
}
