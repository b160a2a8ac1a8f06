//! An adk-rust `LlmAgent` under tollgate, offline: the `TurnExecutor`
//! takes a replica place, the session lease (with its fencing number) and
//! admits each turn; sessions live in the tollgate store
//! (`FencedSessionService`, every append fenced); `LimitedLlm` reserves and
//! settles the tokens of each model call; a `ToolBulkhead` caps a tool's
//! concurrent calls. The model is a scripted fake, so this runs without a
//! network or an API key. (Without the executor, the runner-level
//! `AdmissionPlugin` admits turns instead.)
//!
//! ```text
//! cargo run -p tollgate-adk --example agent
//! ```
//!
//! It prints every decision the limiter takes and each turn's answer.

#![allow(clippy::print_stdout)] // a demonstration: printing is its job

use std::collections::HashMap;
use std::sync::Arc;

use adk_agent::LlmAgentBuilder;
use adk_core::{
    Content, Llm, LlmRequest, LlmResponse, LlmResponseStream, Part, SessionId, Tool, ToolContext,
    UsageMetadata, UserId, async_trait,
};
use adk_runner::Runner;
use adk_session::{CreateRequest, SessionService};
use futures::StreamExt;
use serde_json::{Value, json};
use tollgate_adk::{
    FencedSessionService, LimitedLlm, ModelCallEvent, ToolBulkhead, TurnError, TurnExecutor,
    TurnStream, denial_message, identify_calls,
};
use tollgate_core::{
    Clock, Limiter, MemoryStore, PlanConfig, PlansConfig, RateConfig, ReplicaGate, Store,
    SystemClock,
};

/// A scripted model: asked about the weather it calls the `get_weather`
/// tool, then answers from the tool's result; asked for an essay it writes
/// a long one (11,000 output tokens); otherwise it answers briefly. Usage
/// metadata: one prompt token per 4 bytes of request.
struct ScriptedModel;

#[async_trait]
impl Llm for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn generate_content(
        &self,
        req: LlmRequest,
        _stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        let prompt = serde_json::to_vec(&req.contents).map_or(0, |v| v.len()) as i32 / 4;
        let last = req.contents.last().map(text_of).unwrap_or_default();
        let tool_result = req.contents.last().is_some_and(|c| {
            c.parts
                .iter()
                .any(|p| matches!(p, Part::FunctionResponse { .. }))
        });
        let (content, output) = if tool_result {
            (text("It is sunny in Paris, 21 °C."), 120)
        } else if last.contains("weather") {
            let call = Part::FunctionCall {
                name: "get_weather".into(),
                args: json!({ "city": "Paris" }),
                id: Some("call-1".into()),
                thought_signature: None,
            };
            (
                Content {
                    role: "model".into(),
                    parts: vec![call],
                },
                30,
            )
        } else if last.contains("essay") {
            (text("A very long essay …"), 11_000)
        } else {
            (text("Here is a short answer."), 80)
        };
        let response = LlmResponse {
            content: Some(content),
            usage_metadata: Some(UsageMetadata {
                prompt_token_count: prompt,
                candidates_token_count: output,
                total_token_count: prompt + output,
                ..UsageMetadata::default()
            }),
            turn_complete: true,
            ..LlmResponse::default()
        };
        Ok(Box::pin(futures::stream::once(async move { Ok(response) })))
    }
}

fn text(t: &str) -> Content {
    Content::new("model").with_text(t)
}

fn text_of(c: &Content) -> String {
    c.parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The tool behind the bulkhead.
struct Weather;

#[async_trait]
impl Tool for Weather {
    fn name(&self) -> &str {
        "get_weather"
    }
    fn description(&self) -> &str {
        "The current weather in a city."
    }
    async fn execute(&self, _ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        Ok(json!({ "city": args["city"], "sky": "sunny", "celsius": 21 }))
    }
}

/// The demo plan: 3 turns at once (then 4 per minute), 12,000 tokens per
/// minute, a model call may wait 1.5 s for tokens, an unknown call is
/// estimated at 3,000 tokens.
fn plans() -> PlansConfig {
    let demo = PlanConfig {
        turns: RateConfig {
            amount: 4,
            period_ms: 60_000,
            burst: Some(3),
        },
        tokens: RateConfig {
            amount: 12_000,
            period_ms: 60_000,
            burst: Some(12_000),
        },
        max_wait_ms: 1_500,
        concurrent_runs: 2,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: Some(4),
        estimate_tokens: Some(3_000),
        max_sessions: None,
        shadow: false,
        budgets: None,
    };
    PlansConfig {
        default_plan: Some("demo".into()),
        plans: [("demo".to_owned(), demo)].into(),
        ..PlansConfig::default()
    }
}

fn describe(e: &ModelCallEvent) -> String {
    match e {
        ModelCallEvent::Reserved {
            reservation,
            estimate,
            waited_ms,
            ..
        } => format!(
            "reserve  call {}: {estimate} tokens estimated, waited {waited_ms} ms",
            reservation.call
        ),
        ModelCallEvent::Refused {
            estimate, denial, ..
        } => format!("refuse   a call of {estimate} tokens: {denial}"),
        ModelCallEvent::Settled {
            reservation,
            estimate,
            actual,
            ..
        } => format!(
            "settle   call {}: {actual} tokens used ({:+} against the estimate)",
            reservation.call,
            *actual as i64 - *estimate as i64
        ),
        ModelCallEvent::Refunded {
            reservation,
            reason,
            ..
        } => format!("refund   call {}: {reason:?}", reservation.call),
        other => format!("{other:?}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = MemoryStore::new(SystemClock);
    let limiter = Arc::new(Limiter::new(
        store.clone(),
        SystemClock,
        plans().validate()?,
    ));

    let model = LimitedLlm::new(ScriptedModel, Arc::clone(&limiter))
        .on_event(|e| println!("    limiter: {}", describe(e)));
    let agent = LlmAgentBuilder::new("assistant")
        .instruction("Answer briefly.")
        .model(Arc::new(model))
        .before_model_callback(identify_calls())
        .tool(Arc::new(ToolBulkhead::new(Weather, 4, 500, clock)))
        .build()?;
    // Sessions live in the tollgate store; every append is fenced.
    let sessions = Arc::new(FencedSessionService::new(store, SystemClock));
    let runner = Runner::builder()
        .app_name("demo")
        .agent(Arc::new(agent))
        .session_service(Arc::clone(&sessions) as Arc<dyn SessionService>)
        .build()?;
    // The executor takes a replica place, the session lease, then admits
    // the turn (so the runner needs no admission plugin).
    let executor = TurnExecutor::new(Arc::new(runner), Arc::clone(&limiter), ReplicaGate::new(8));

    let turns = [
        ("alice", "What's the weather in Paris?"),
        ("alice", "Write me an essay on rate limiting."),
        ("alice", "And a summary of it?"),
        ("bob", "Hi!"),
        ("bob", "Hi again!"),
        ("bob", "Still there?"),
        ("bob", "One more?"),
    ];
    for (user, message) in turns {
        chat(&sessions, user).await?;
        println!("{user}: {message}");
        match turn(&executor, user, message).await {
            Ok(mut events) => {
                println!(
                    "  [turn {} holds session fence {}]",
                    events.invocation_id().unwrap_or("?"),
                    events.fence().fence
                );
                while let Some(event) = events.next().await {
                    let event = event?;
                    if let Some(content) = &event.llm_response.content {
                        let said = text_of(content);
                        if !said.is_empty() {
                            println!("  {}: {said}", event.author);
                        }
                    }
                }
            }
            Err(e) => println!("  refused: {}", refusal(&e)),
        }
        let plan = limiter.plan_for(user)?;
        let state = limiter
            .store()
            .user_state(user, plan.turns, plan.tokens)
            .await?;
        println!(
            "  [{user} now has {} turns and {} tokens available]\n",
            state.turns_available, state.tokens_available
        );
    }

    // Two turns of one conversation never interleave: while carol's first
    // turn holds her session, a second one is refused.
    chat(&sessions, "carol").await?;
    println!("carol: (two messages at once)");
    let first = turn(&executor, "carol", "First question").await?;
    match turn(&executor, "carol", "Second question").await {
        Ok(_) => println!("  the second turn ran too (unexpected)"),
        Err(e) => println!("  second turn refused: {}", refusal(&e)),
    }
    // The first turn runs to its end, which frees the session at once (a
    // client that disconnects, dropping the stream, frees it too).
    let mut first = first;
    while let Some(event) = first.next().await {
        event?;
    }
    let again = turn(&executor, "carol", "Second question").await?;
    println!(
        "  after the first ended, the second runs with fence {}",
        again.fence().fence
    );
    Ok(())
}

/// Creates `user`'s chat session if it does not exist yet.
async fn chat(sessions: &FencedSessionService<MemoryStore>, user: &str) -> adk_core::Result<()> {
    let exists = sessions
        .get(adk_session::GetRequest {
            app_name: "demo".into(),
            user_id: user.into(),
            session_id: format!("{user}-chat"),
            num_recent_events: None,
            after: None,
        })
        .await
        .is_ok();
    if !exists {
        sessions
            .create(CreateRequest {
                app_name: "demo".into(),
                user_id: user.into(),
                session_id: Some(format!("{user}-chat")),
                state: HashMap::new(),
            })
            .await?;
    }
    Ok(())
}

/// Starts a turn of `user` (whose id, in a real host, comes from a verified
/// principal) in their chat session.
async fn turn(
    executor: &TurnExecutor<MemoryStore>,
    user: &str,
    message: &str,
) -> Result<TurnStream<MemoryStore>, TurnError> {
    let user_id = UserId::new(user).map_err(|e| TurnError::Runner(e.into()))?;
    let session_id =
        SessionId::new(format!("{user}-chat")).map_err(|e| TurnError::Runner(e.into()))?;
    executor
        .execute(user_id, session_id, Content::new("user").with_text(message))
        .await
}

/// What to tell the user about a refused turn.
fn refusal(e: &TurnError) -> String {
    match e {
        TurnError::Denied(denial) => denial_message(denial),
        other => other.to_string(),
    }
}
