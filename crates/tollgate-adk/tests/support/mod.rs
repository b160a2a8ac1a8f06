//! Shared test harness: a scripted fake model and a real adk `Runner` with
//! the admission plugin and the `LimitedLlm` wrapper, over any store.

#![allow(dead_code, unreachable_pub)] // a test helper module: each test file uses part of it

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use adk_agent::LlmAgentBuilder;
use adk_core::EventStream;
use adk_core::{
    AdkError, Content, Llm, LlmRequest, LlmResponse, LlmResponseStream, Part, SessionId, Tool,
    ToolContext, UsageMetadata, UserId, async_trait,
};
use adk_plugin::PluginManager;
use adk_runner::Runner;
use adk_session::{CreateRequest, InMemorySessionService, SessionService};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tollgate_adk::{AdmissionPlugin, LimitedLlm, ModelCallEvent, identify_calls};
use tollgate_core::{FakeClock, Limiter, PlanConfig, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{shared_cluster, shared_url, unique_prefix};
use tollgate_testkit::scenarios::limiter_with;

pub const APP: &str = "app";
pub const REPLY: &str = "scripted reply";

/// One step of a scripted model stream.
#[allow(clippy::large_enum_variant)] // test scripts: a few values, size is irrelevant
pub enum Step {
    /// Yield this chunk.
    Chunk(LlmResponse),
    /// Yield this error.
    Error(&'static str),
    /// Wait for one permit of the gate (consumed).
    Gate(Arc<Semaphore>),
    /// Signal `Notify`, then never yield again.
    Hang(Arc<Notify>),
    /// Signal `Notify` (the model was reached), then go on.
    Signal(Arc<Notify>),
}

/// One scripted model call.
pub enum Reply {
    /// `generate_content` itself fails.
    Fail(&'static str),
    /// `generate_content` fails as a provider's 429 would (rate limited,
    /// with this retry hint in ms).
    RateLimited(u64),
    /// `generate_content` answers this stream.
    Stream(Vec<Step>),
}

/// A text chunk.
pub fn chunk(text: &str, partial: bool, usage: Option<(i32, i32)>) -> LlmResponse {
    LlmResponse {
        content: Some(Content::new("model").with_text(text)),
        usage_metadata: usage.map(|(prompt, output)| UsageMetadata {
            prompt_token_count: prompt,
            candidates_token_count: output,
            total_token_count: prompt + output,
            ..UsageMetadata::default()
        }),
        partial,
        turn_complete: !partial,
        ..LlmResponse::default()
    }
}

/// A final answer of [`REPLY`] with this usage.
pub fn answer(usage: Option<(i32, i32)>) -> Reply {
    Reply::Stream(vec![Step::Chunk(chunk(REPLY, false, usage))])
}

/// A final chunk calling the tool `name`.
pub fn tool_call(name: &str) -> Reply {
    let content = Content {
        role: "model".into(),
        parts: vec![Part::FunctionCall {
            name: name.into(),
            args: serde_json::json!({}),
            id: Some("call-1".into()),
            thought_signature: None,
        }],
    };
    Reply::Stream(vec![Step::Chunk(LlmResponse {
        content: Some(content),
        usage_metadata: Some(UsageMetadata {
            prompt_token_count: 100,
            candidates_token_count: 10,
            total_token_count: 110,
            ..UsageMetadata::default()
        }),
        turn_complete: true,
        ..LlmResponse::default()
    })])
}

type Script = dyn Fn(&LlmRequest) -> Reply + Send + Sync;

/// A model answering from a queue of scripted replies, then from a default
/// script. Records the requests it got.
pub struct FakeLlm {
    queue: Mutex<VecDeque<Reply>>,
    default: Box<Script>,
    pub calls: AtomicUsize,
    pub requests: Mutex<Vec<LlmRequest>>,
}

impl FakeLlm {
    pub fn new(default: impl Fn(&LlmRequest) -> Reply + Send + Sync + 'static) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            default: Box::new(default),
            calls: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Answers [`REPLY`] with 500 + 500 tokens of usage.
    pub fn replying() -> Self {
        Self::new(|_| answer(Some((500, 500))))
    }

    pub fn push(&self, reply: Reply) {
        self.queue.lock().push_back(reply);
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Llm for FakeLlm {
    fn name(&self) -> &str {
        "fake"
    }

    async fn generate_content(
        &self,
        req: LlmRequest,
        _stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let reply = self
            .queue
            .lock()
            .pop_front()
            .unwrap_or_else(|| (self.default)(&req));
        self.requests.lock().push(req);
        let steps = match reply {
            Reply::Fail(message) => return Err(AdkError::model(message)),
            Reply::RateLimited(hint) => {
                return Err(AdkError::new(
                    adk_core::ErrorComponent::Model,
                    adk_core::ErrorCategory::RateLimited,
                    "model.rate_limited",
                    "429 Too Many Requests",
                )
                .with_retry(adk_core::RetryHint {
                    should_retry: true,
                    retry_after_ms: Some(hint),
                    max_attempts: None,
                }));
            }
            Reply::Stream(steps) => steps,
        };
        let stream = futures::stream::unfold(steps.into_iter(), |mut steps| async move {
            loop {
                match steps.next()? {
                    Step::Chunk(c) => return Some((Ok(c), steps)),
                    Step::Error(m) => return Some((Err(AdkError::model(m)), steps)),
                    Step::Gate(g) => g.acquire().await.expect("gate open").forget(),
                    Step::Hang(n) => {
                        n.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Step::Signal(n) => n.notify_one(),
                }
            }
        });
        Ok(Box::pin(stream))
    }
}

/// A tool that answers `{}` at once.
pub struct EchoTool;

#[async_trait]
impl Tool for EchoTool {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "answers its arguments"
    }
    async fn execute(&self, _ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        Ok(args)
    }
}

/// A real runner over `store`: an LlmAgent whose model is `LimitedLlm`
/// around `model`, the admission plugin, in-memory sessions.
pub struct Harness<S> {
    pub clock: FakeClock,
    pub limiter: Arc<Limiter<S>>,
    pub runner: Arc<Runner>,
    pub sessions: Arc<dyn SessionService>,
    pub model: Arc<FakeLlm>,
    pub events: Arc<Mutex<Vec<ModelCallEvent>>>,
    /// Notified on each recorded event.
    pub recorded: Arc<Notify>,
}

/// Lets an `Arc<FakeLlm>` be the inner model.
pub struct Shared(pub Arc<FakeLlm>);

#[async_trait]
impl Llm for Shared {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn generate_content(
        &self,
        req: LlmRequest,
        stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        self.0.generate_content(req, stream).await
    }
}

impl<S: Store + Clone> Harness<S> {
    pub fn new(store: S, clock: FakeClock, plan: PlanConfig, model: FakeLlm) -> Self {
        Self::build(store, clock, plan, model, |m| m)
    }

    /// Like [`new`](Self::new), with a hook to configure the wrapper (an
    /// estimator).
    pub fn build(
        store: S,
        clock: FakeClock,
        plan: PlanConfig,
        model: FakeLlm,
        configure: impl FnOnce(LimitedLlm<Shared, S>) -> LimitedLlm<Shared, S>,
    ) -> Self {
        Self::assemble(
            store,
            clock,
            plan,
            model,
            Arc::new(InMemorySessionService::new()),
            true,
            configure,
        )
    }

    /// A harness whose runner keeps sessions in `sessions` and, if
    /// `plugin`, admits turns with the `AdmissionPlugin` (without it, turns
    /// are admitted by whoever runs them: a `TurnExecutor`).
    pub fn assemble(
        store: S,
        clock: FakeClock,
        plan: PlanConfig,
        model: FakeLlm,
        sessions: Arc<dyn SessionService>,
        plugin: bool,
        configure: impl FnOnce(LimitedLlm<Shared, S>) -> LimitedLlm<Shared, S>,
    ) -> Self {
        let limiter = Arc::new(limiter_with(store, &clock, plan));
        let model = Arc::new(model);
        let events = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::new(Notify::new());
        let sink = Arc::clone(&events);
        let bell = Arc::clone(&recorded);
        let limited = configure(
            LimitedLlm::new(Shared(Arc::clone(&model)), Arc::clone(&limiter)).on_event(move |e| {
                sink.lock().push(e.clone());
                bell.notify_waiters();
            }),
        );
        let agent = LlmAgentBuilder::new("assistant")
            .model(Arc::new(limited))
            .before_model_callback(identify_calls())
            .tool(Arc::new(EchoTool))
            .build()
            .expect("agent");
        let plugins = if plugin {
            vec![AdmissionPlugin::new(Arc::clone(&limiter)).into_plugin()]
        } else {
            Vec::new()
        };
        let runner = Runner::builder()
            .app_name(APP)
            .agent(Arc::new(agent))
            .session_service(Arc::clone(&sessions))
            .plugin_manager(Arc::new(PluginManager::new(plugins)))
            .build()
            .expect("runner");
        Self {
            clock,
            limiter,
            runner: Arc::new(runner),
            sessions,
            model,
            events,
            recorded,
        }
    }

    pub async fn session(&self, user: &str, session: &str) {
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

    /// Starts a turn of `user` in `session` (created if needed).
    pub async fn start(&self, user: &str, session: &str, text: &str) -> EventStream {
        if self
            .sessions
            .get(adk_session::GetRequest {
                app_name: APP.into(),
                user_id: user.into(),
                session_id: session.into(),
                num_recent_events: None,
                after: None,
            })
            .await
            .is_err()
        {
            self.session(user, session).await;
        }
        self.runner
            .run(
                UserId::new(user).expect("user id"),
                SessionId::new(session).expect("session id"),
                Content::new("user").with_text(text),
            )
            .await
            .expect("run")
    }

    /// Runs one turn to the end: the texts of its events, or the error it
    /// ended with.
    pub async fn turn(&self, user: &str, session: &str) -> Result<Vec<String>, AdkError> {
        let stream = self
            .start(user, session, &format!("hello from {user}"))
            .await;
        collect(stream).await
    }

    pub async fn tokens(&self, user: &str) -> i64 {
        self.state(user).await.tokens_available
    }

    pub async fn leases(&self, user: &str) -> usize {
        self.state(user).await.leases.len()
    }

    pub async fn state(&self, user: &str) -> tollgate_core::store::UserState {
        let plan = self.limiter.plan_for(user).expect("plan");
        self.limiter
            .store()
            .user_state(user, plan.turns, plan.tokens)
            .await
            .expect("state")
    }

    pub fn events(&self) -> Vec<ModelCallEvent> {
        self.events.lock().clone()
    }

    /// Waits (real time, bounded) until `n` events were recorded: closes
    /// after a dropped stream run on a spawned task.
    pub async fn wait_events(&self, n: usize) -> Vec<ModelCallEvent> {
        // Woken by each event as it is recorded; bounded so a missing event
        // fails the test instead of hanging it.
        let arrived = async {
            loop {
                let next = self.recorded.notified();
                if self.events.lock().len() >= n {
                    return;
                }
                next.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), arrived).await;
        self.events()
    }
}

/// The texts of a turn's events, or its error.
pub async fn collect(mut stream: EventStream) -> Result<Vec<String>, AdkError> {
    let mut texts = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event?;
        if let Some(content) = event.llm_response.content {
            for part in content.parts {
                if let Part::Text { text } = part {
                    texts.push(text);
                }
            }
        }
    }
    Ok(texts)
}

pub fn is_reply(texts: &[String]) -> bool {
    texts.iter().any(|t| t == REPLY)
}

/// A Redis store on the shared single node (or cluster), on `clock`, with
/// its own key prefix.
pub async fn redis(clock: FakeClock, cluster: bool) -> RedisStore {
    let config = if cluster {
        RedisConfig::cluster(shared_cluster())
    } else {
        RedisConfig::standalone(shared_url())
    };
    RedisStore::connect(
        config
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect to the test redis")
    .with_clock_override(clock)
}

/// Instantiates each listed `async fn name<S: Store + Clone>(store: S,
/// clock: FakeClock)` as a test on the memory store, a Redis node and a
/// Redis cluster.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let clock = tollgate_testkit::clock();
                    super::$name(tollgate_core::MemoryStore::new(clock.clone()), clock).await;
                }
            )*
        }
        mod redis_node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let clock = tollgate_testkit::clock();
                    super::$name(super::support::redis(clock.clone(), false).await, clock).await;
                }
            )*
        }
        mod redis_cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let clock = tollgate_testkit::clock();
                    super::$name(super::support::redis(clock.clone(), true).await, clock).await;
                }
            )*
        }
    };
}

/// A model whose next reply waits for `gate`, then answers.
pub fn gated(gate: &Arc<Semaphore>) -> Reply {
    Reply::Stream(vec![
        Step::Gate(Arc::clone(gate)),
        Step::Chunk(chunk(REPLY, false, Some((100, 100)))),
    ])
}

/// Runs a turn to its end (past an error, so the stream's end releases its
/// leases inline): its texts, and the first error it yielded.
pub async fn outcome<S: Store>(
    mut stream: tollgate_adk::TurnStream<S>,
) -> (Vec<String>, Option<adk_core::AdkError>) {
    let mut out = Vec::new();
    let mut error = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if let Some(content) = event.llm_response.content {
                    for part in content.parts {
                        if let adk_core::Part::Text { text } = part {
                            out.push(text);
                        }
                    }
                }
            }
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (out, error)
}
