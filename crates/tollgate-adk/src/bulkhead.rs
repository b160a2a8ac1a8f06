//! A per-replica bulkhead around an adk [`Tool`] (issue 6, item 3).

use std::sync::Arc;

use adk_core::{AdkError, Tool, ToolContext, async_trait};
use serde_json::Value;
use tokio::sync::Semaphore;
use tollgate_core::Clock;

/// Limits the concurrent calls of one tool on this replica, so one slow
/// tool cannot take every slot of the process.
///
/// A call takes one of `limit` slots for its whole execution. When all are
/// taken it waits up to `max_wait_ms` for one, measured on the injected
/// tollgate [`Clock`] (the limiter's clock, so a fake clock drives it in
/// tests); past that it fails with a tool error
/// ([`AdkError::tool`]) saying the tool is busy. Waiters are served in
/// arrival order (tokio's fair [`Semaphore`]). A `limit` of 0 is treated
/// as a limit of 1. The bound is per replica and per wrapper: wrap a tool
/// once and share the wrapper (`Arc`) among the agents of the process.
///
/// Every other [`Tool`] method is forwarded to the wrapped tool.
pub struct ToolBulkhead<T> {
    inner: T,
    slots: Arc<Semaphore>,
    limit: usize,
    max_wait_ms: u64,
    clock: Arc<dyn Clock>,
}

impl<T> std::fmt::Debug for ToolBulkhead<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBulkhead")
            .field("limit", &self.limit)
            .field("in_flight", &self.in_flight())
            .field("max_wait_ms", &self.max_wait_ms)
            .finish_non_exhaustive()
    }
}

impl<T> ToolBulkhead<T> {
    /// Wraps `inner`: at most `limit` concurrent calls, each waiting at most
    /// `max_wait_ms` on `clock` for a slot.
    pub fn new(inner: T, limit: usize, max_wait_ms: u64, clock: Arc<dyn Clock>) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            max_wait_ms,
            clock,
        }
    }

    /// The maximum number of concurrent calls.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.limit.saturating_sub(self.slots.available_permits())
    }

    /// The wrapped tool.
    pub fn inner(&self) -> &T {
        &self.inner
    }
}

#[async_trait]
impl<T: Tool> Tool for ToolBulkhead<T> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn declaration(&self) -> Value {
        self.inner.declaration()
    }

    fn enhanced_description(&self) -> String {
        self.inner.enhanced_description()
    }

    fn is_long_running(&self) -> bool {
        self.inner.is_long_running()
    }

    fn is_builtin(&self) -> bool {
        self.inner.is_builtin()
    }

    fn parameters_schema(&self) -> Option<Value> {
        self.inner.parameters_schema()
    }

    fn response_schema(&self) -> Option<Value> {
        self.inner.response_schema()
    }

    fn required_scopes(&self) -> &[&str] {
        self.inner.required_scopes()
    }

    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }

    fn is_concurrency_safe(&self) -> bool {
        self.inner.is_concurrency_safe()
    }

    fn is_agent_delegation(&self) -> bool {
        self.inner.is_agent_delegation()
    }

    async fn execute(&self, ctx: Arc<dyn ToolContext>, args: Value) -> adk_core::Result<Value> {
        let deadline = self.clock.now_ms().saturating_add(self.max_wait_ms);
        let permit = tokio::select! {
            biased;
            permit = Arc::clone(&self.slots).acquire_owned() => permit.map_err(|_| {
                AdkError::tool(format!("tool {} is shutting down", self.inner.name()))
            })?,
            () = self.clock.sleep_until(deadline) => {
                tracing::debug!(tool = self.inner.name(), limit = self.limit, "tool bulkhead full");
                return Err(AdkError::tool(format!(
                    "tool {} is busy: {} calls already running on this replica and no slot \
                     freed within {} ms; try again later",
                    self.inner.name(),
                    self.limit,
                    self.max_wait_ms
                )));
            }
        };
        let result = self.inner.execute(ctx, args).await;
        drop(permit);
        result
    }
}
