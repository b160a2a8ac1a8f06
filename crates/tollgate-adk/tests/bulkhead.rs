//! The tool bulkhead: never more than its limit of concurrent calls; a call
//! waits up to its bound on the (fake) clock, then fails clearly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use adk_core::{
    CallbackContext, Content, EventActions, ReadonlyContext, Tool, ToolContext, async_trait,
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tollgate_adk::ToolBulkhead;
use tollgate_core::Clock;

struct Ctx {
    content: Content,
    actions: Mutex<EventActions>,
}

#[async_trait]
impl ReadonlyContext for Ctx {
    fn invocation_id(&self) -> &str {
        "inv"
    }
    fn agent_name(&self) -> &str {
        "agent"
    }
    fn user_id(&self) -> &str {
        "u1"
    }
    fn app_name(&self) -> &str {
        "app"
    }
    fn session_id(&self) -> &str {
        "s1"
    }
    fn branch(&self) -> &str {
        ""
    }
    fn user_content(&self) -> &Content {
        &self.content
    }
}

#[async_trait]
impl CallbackContext for Ctx {
    fn artifacts(&self) -> Option<Arc<dyn adk_core::Artifacts>> {
        None
    }
}

#[async_trait]
impl ToolContext for Ctx {
    fn function_call_id(&self) -> &str {
        "call"
    }
    fn actions(&self) -> EventActions {
        self.actions.lock().clone()
    }
    fn set_actions(&self, actions: EventActions) {
        *self.actions.lock() = actions;
    }
    async fn search_memory(&self, _query: &str) -> adk_core::Result<Vec<adk_core::MemoryEntry>> {
        Ok(vec![])
    }
}

fn ctx() -> Arc<dyn ToolContext> {
    Arc::new(Ctx {
        content: Content::new("user"),
        actions: Mutex::new(EventActions::default()),
    })
}

/// A slow tool: each call records the concurrency it sees, then waits for
/// one permit of `gate`.
struct SlowTool {
    running: AtomicUsize,
    max_seen: AtomicUsize,
    started: AtomicUsize,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl Tool for SlowTool {
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "a slow tool"
    }
    async fn execute(&self, _ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_seen.fetch_max(now, Ordering::SeqCst);
        self.gate.acquire().await.expect("gate").forget();
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(args)
    }
}

fn slow_tool(gate: &Arc<Semaphore>) -> SlowTool {
    SlowTool {
        running: AtomicUsize::new(0),
        max_seen: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        gate: Arc::clone(gate),
    }
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// 20 concurrent calls through a bulkhead of 3: at most 3 ever run inside
/// the tool, the others wait (no timeout: the clock does not move), and all
/// 20 complete with their own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_the_limit_run() {
    let clock = tollgate_testkit::clock();
    let gate = Arc::new(Semaphore::new(0));
    let tool = Arc::new(ToolBulkhead::new(
        slow_tool(&gate),
        3,
        1_000,
        Arc::new(clock.clone()),
    ));
    assert_eq!(tool.name(), "slow", "metadata is forwarded");
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let tool = Arc::clone(&tool);
            tokio::spawn(async move { tool.execute(ctx(), json!(i)).await })
        })
        .collect();
    while tool.inner().started.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    settle().await;
    assert_eq!(tool.inner().started.load(Ordering::SeqCst), 3);
    assert_eq!(tool.in_flight(), 3);
    for _ in 0..20 {
        gate.add_permits(1);
        settle().await;
        assert!(tool.inner().max_seen.load(Ordering::SeqCst) <= 3);
    }
    for (i, call) in calls.into_iter().enumerate() {
        let out = call.await.expect("join").expect("call succeeds");
        assert_eq!(out, json!(i));
    }
    assert_eq!(tool.inner().max_seen.load(Ordering::SeqCst), 3);
    assert_eq!(tool.inner().started.load(Ordering::SeqCst), 20);
    assert_eq!(tool.in_flight(), 0);
}

/// Limit 1, bound 500 ms: a second call waits on the clock; at 499 ms it
/// is still waiting, at 500 ms it fails with a "busy" tool error, and the
/// tool never ran for it. A slot freed in time is taken instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_bound_fails_clearly() {
    let clock = tollgate_testkit::clock();
    let gate = Arc::new(Semaphore::new(0));
    let tool = Arc::new(ToolBulkhead::new(
        slow_tool(&gate),
        1,
        500,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
    ));
    let first = tokio::spawn({
        let tool = Arc::clone(&tool);
        async move { tool.execute(ctx(), json!("first")).await }
    });
    while tool.inner().started.load(Ordering::SeqCst) < 1 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn({
        let tool = Arc::clone(&tool);
        async move { tool.execute(ctx(), json!("second")).await }
    });
    while clock.pending_sleeps() < 1 {
        tokio::task::yield_now().await;
    }
    clock.advance(499);
    settle().await;
    assert!(!second.is_finished(), "still within the bound");
    clock.advance(1);
    let err = second.await.expect("join").expect_err("past the bound");
    let msg = err.to_string();
    assert!(msg.contains("tool slow is busy"), "{msg}");
    assert!(msg.contains("500 ms"), "{msg}");
    assert_eq!(tool.inner().started.load(Ordering::SeqCst), 1);

    // A third call waits; the first finishing in time lets it run.
    let third = tokio::spawn({
        let tool = Arc::clone(&tool);
        async move { tool.execute(ctx(), json!("third")).await }
    });
    while clock.pending_sleeps() < 1 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(2);
    assert_eq!(first.await.expect("join").expect("ok"), json!("first"));
    assert_eq!(third.await.expect("join").expect("ok"), json!("third"));
    assert_eq!(tool.in_flight(), 0);
}
