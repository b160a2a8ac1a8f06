//! The admission plugin through the real adk-runner, with a scripted fake
//! model, on a `MemoryStore` with a fake clock (SPEC §7 examples 1 and 4).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use adk_agent::LlmAgentBuilder;
use adk_core::{
    Content, Llm, LlmRequest, LlmResponse, LlmResponseStream, Part, SessionId, UserId, async_trait,
};
use adk_plugin::PluginManager;
use adk_runner::Runner;
use adk_session::{CreateRequest, InMemorySessionService, SessionService};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tollgate_adk::AdmissionPlugin;
use tollgate_core::{FakeClock, Limiter, MemoryStore, Store};
use tollgate_testkit::scenarios::{limiter_with, support};

const APP: &str = "app";
const REPLY: &str = "scripted reply";

/// A model that counts its calls and answers one scripted text. With a
/// gate, each call first takes (and consumes) one permit, so runs can be
/// held in flight.
struct FakeLlm {
    calls: Arc<AtomicUsize>,
    gate: Option<Arc<Semaphore>>,
}

#[async_trait]
impl Llm for FakeLlm {
    fn name(&self) -> &str {
        "fake"
    }

    async fn generate_content(
        &self,
        _req: LlmRequest,
        _stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let response = LlmResponse {
            content: Some(Content::new("model").with_text(REPLY)),
            turn_complete: true,
            ..LlmResponse::default()
        };
        Ok(Box::pin(futures::stream::once(async move { Ok(response) })))
    }
}

struct Harness {
    clock: FakeClock,
    limiter: Arc<Limiter<MemoryStore>>,
    runner: Arc<Runner>,
    sessions: Arc<InMemorySessionService>,
    calls: Arc<AtomicUsize>,
}

impl Harness {
    fn new(gate: Option<Arc<Semaphore>>) -> Self {
        let clock = tollgate_testkit::clock();
        let limiter = Arc::new(limiter_with(
            MemoryStore::new(clock.clone()),
            &clock,
            support(),
        ));
        let calls = Arc::new(AtomicUsize::new(0));
        let model = FakeLlm {
            calls: Arc::clone(&calls),
            gate,
        };
        let agent = LlmAgentBuilder::new("assistant")
            .model(Arc::new(model))
            .build()
            .expect("agent");
        let sessions = Arc::new(InMemorySessionService::new());
        let plugin = AdmissionPlugin::new(Arc::clone(&limiter)).into_plugin();
        let runner = Runner::builder()
            .app_name(APP)
            .agent(Arc::new(agent))
            .session_service(Arc::clone(&sessions) as Arc<dyn SessionService>)
            .plugin_manager(Arc::new(PluginManager::new(vec![plugin])))
            .build()
            .expect("runner");
        Self {
            clock,
            limiter,
            runner: Arc::new(runner),
            sessions,
            calls,
        }
    }

    async fn session(&self, user: &str, session: &str) {
        self.sessions
            .create(CreateRequest {
                app_name: APP.into(),
                user_id: user.into(),
                session_id: Some(session.into()),
                state: HashMap::new(),
            })
            .await
            .expect("session");
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn leases(&self, user: &str) -> Vec<(String, u64)> {
        let plan = self.limiter.plan_for(user).expect("plan");
        self.limiter
            .store()
            .user_state(user, plan.turns, plan.tokens)
            .await
            .expect("state")
            .leases
    }
}

/// Runs one turn to the end and returns the texts of its events.
async fn turn(runner: &Runner, user: &str, session: &str) -> Vec<String> {
    let mut stream = runner
        .run(
            UserId::new(user).expect("user id"),
            SessionId::new(session).expect("session id"),
            Content::new("user").with_text("hello"),
        )
        .await
        .expect("run");
    let mut texts = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.expect("event");
        if let Some(content) = event.llm_response.content {
            for part in content.parts {
                if let Part::Text { text } = part {
                    texts.push(text);
                }
            }
        }
    }
    texts
}

fn is_reply(texts: &[String]) -> bool {
    texts.iter().any(|t| t == REPLY)
}

/// SPEC §7 example 1: turns 1–5 at t = 0 run the model; turns 6–10 at
/// t = 1,000 are answered with the turn-rate message and "2 s", and the
/// model is not called. Every completed turn released its lease.
#[tokio::test]
async fn example_1_turn_burst_through_the_runner() {
    let h = Harness::new(None);
    h.session("u1", "s1").await;
    for n in 1..=5 {
        let texts = turn(&h.runner, "u1", "s1").await;
        assert!(is_reply(&texts), "turn {n} should run the model: {texts:?}");
        assert_eq!(h.calls(), n);
        assert!(h.leases("u1").await.is_empty(), "turn {n} released");
    }
    h.clock.advance(1_000);
    for n in 6..=10 {
        let texts = turn(&h.runner, "u1", "s1").await;
        assert!(!is_reply(&texts), "turn {n} must not run: {texts:?}");
        assert_eq!(texts.len(), 1, "one denial event: {texts:?}");
        assert!(texts[0].contains("too many turns"), "{texts:?}");
        assert!(texts[0].contains("try again in 2 s"), "{texts:?}");
        assert_eq!(h.calls(), 5, "the model is not called on a denial");
        assert!(h.leases("u1").await.is_empty());
    }
}

/// SPEC §7 example 4 through the runner: two turns held in flight by the
/// fake model, the third is denied with the concurrency message without a
/// model call; once one finishes, the next is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_4_concurrency_through_the_runner() {
    let gate = Arc::new(Semaphore::new(0));
    let h = Harness::new(Some(Arc::clone(&gate)));
    for s in ["s1", "s2", "s3", "s4"] {
        h.session("u1", s).await;
    }
    let r1 = tokio::spawn({
        let runner = Arc::clone(&h.runner);
        async move { turn(&runner, "u1", "s1").await }
    });
    let r2 = tokio::spawn({
        let runner = Arc::clone(&h.runner);
        async move { turn(&runner, "u1", "s2").await }
    });
    while h.calls() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(h.leases("u1").await.len(), 2, "two runs in flight");

    let texts = turn(&h.runner, "u1", "s3").await;
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("maximum number of turns running at once"));
    assert!(texts[0].contains("try again in 1 s"), "{texts:?}");
    assert_eq!(h.calls(), 2, "the model is not called on a denial");
    assert_eq!(
        h.leases("u1").await.len(),
        2,
        "the denied turn released nothing"
    );

    // One run finishes; its lease is released and the next turn is admitted.
    gate.add_permits(1);
    let first = tokio::select! {
        t = r1 => t,
        t = r2 => t,
    };
    assert!(is_reply(&first.expect("join")));
    assert_eq!(h.leases("u1").await.len(), 1);
    gate.add_permits(2);
    let texts = turn(&h.runner, "u1", "s4").await;
    assert!(is_reply(&texts), "{texts:?}");
    assert_eq!(h.calls(), 3);
}

/// The plugin's hooks driven directly: `after_run` of a denied turn
/// releases nothing and does not panic; a second release is a no-op.
#[tokio::test]
async fn release_tolerates_denied_and_repeated_turns() {
    let clock = tollgate_testkit::clock();
    let limiter = Arc::new(limiter_with(
        MemoryStore::new(clock.clone()),
        &clock,
        support(),
    ));
    let plugin = AdmissionPlugin::new(Arc::clone(&limiter));
    assert!(plugin.admit("u1", "r1").await.is_none());
    assert!(plugin.admit("u1", "r2").await.is_none());
    let denied = plugin.admit("u1", "r3").await.expect("denied");
    assert_eq!(denied.role, "model");
    assert!(
        !plugin.release("u1", "r3").await,
        "a denied turn holds no lease"
    );
    assert!(plugin.release("u1", "r1").await);
    assert!(
        !plugin.release("u1", "r1").await,
        "second release is a no-op"
    );
    assert!(!plugin.release("u1", "never-admitted").await);
    assert!(
        plugin.admit("u1", "r3").await.is_none(),
        "a slot is free again"
    );
}

/// A limiter error (here: an invalid, empty invocation id) denies the turn
/// with the plain "temporarily unavailable" text.
#[tokio::test]
async fn limiter_error_denies_with_unavailable() {
    let clock = tollgate_testkit::clock();
    let limiter = Arc::new(limiter_with(
        MemoryStore::new(clock.clone()),
        &clock,
        support(),
    ));
    let plugin = AdmissionPlugin::new(limiter);
    let content = plugin.admit("u1", "").await.expect("denied");
    let text = match &content.parts[..] {
        [Part::Text { text }] => text.clone(),
        other => panic!("one text part expected, got {other:?}"),
    };
    assert_eq!(text, tollgate_adk::UNAVAILABLE_MESSAGE);
    assert!(!plugin.release("u1", "").await);
}

/// Shadow mode: a turn that enforcement would deny proceeds.
#[tokio::test]
async fn shadow_denied_turns_proceed() {
    let clock = tollgate_testkit::clock();
    let mut plan = support();
    plan.shadow = true;
    plan.concurrent_runs = 1;
    let limiter = Arc::new(limiter_with(MemoryStore::new(clock.clone()), &clock, plan));
    let plugin = AdmissionPlugin::new(limiter);
    assert!(plugin.admit("u1", "r1").await.is_none());
    assert!(plugin.admit("u1", "r2").await.is_none(), "shadow: proceeds");
}
