//! # tollgate-adk
//!
//! Admission control for [adk-rust](https://crates.io/crates/adk-runner)
//! agents (version 2.3), on a [`tollgate_core::Limiter`]:
//!
//! - [`AdmissionPlugin`]: a runner-level [`adk_plugin::Plugin`] whose
//!   `before_run` hook admits each turn (turn bucket and run lease, SPEC §3)
//!   and whose `after_run` hook releases the run lease;
//! - [`LimitedLlm`]: any adk [`Llm`](adk_core::Llm) under the user's token
//!   rate and the run's `max_llm_calls` (SPEC §1–2), with a pluggable
//!   [`Estimator`] (default [`MovingAverage`]) and exactly-once settlement;
//!   pair it with the [`identify_calls`] callback on each agent;
//! - [`ToolBulkhead`]: a cap on the concurrent calls of one adk tool on this
//!   replica;
//! - [`TurnExecutor`]: `Runner` turns under the replica gate, the session
//!   lease (taken before admission, renewed every ttl/3, fencing number)
//!   and the run lease, all freed exactly once when the stream ends or is
//!   dropped;
//! - [`FencedSessionService`]: an adk-session `SessionService` kept in the
//!   tollgate store, whose every event append is checked against the
//!   session's latest fence ([`TurnFence`]), so a turn whose lease was
//!   taken over cannot write.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use adk_core::Llm;
//! # use tollgate_core::{Limiter, MemoryStore};
//! # fn wire(model: impl Llm + 'static, limiter: Arc<Limiter<MemoryStore>>) -> adk_core::Result<()> {
//! use tollgate_adk::{AdmissionPlugin, LimitedLlm, identify_calls};
//!
//! let agent = adk_agent::LlmAgentBuilder::new("assistant")
//!     .model(Arc::new(LimitedLlm::new(model, Arc::clone(&limiter))))
//!     .before_model_callback(identify_calls())
//!     .build()?;
//! let plugins = adk_plugin::PluginManager::new(vec![AdmissionPlugin::new(limiter).into_plugin()]);
//! // Runner::builder().agent(Arc::new(agent)).plugin_manager(Arc::new(plugins))…
//! # let _ = (agent, plugins); Ok(())
//! # }
//! ```
//!
//! `examples/agent.rs` runs a whole agent offline and prints every
//! decision.
//!
//! ## Identity
//!
//! The limiter key is the invocation context's **user id**, which is the
//! `user_id` the host passes to `Runner::run`. The host must set it from a
//! *verified* principal (an authenticated session, a validated token), never
//! from anything the end user can choose freely; otherwise a user can spread
//! turns over made-up ids and escape every per-user limit.
//!
//! ## What adk-runner 2.3 calls
//!
//! `Runner::run` calls only the runner-level hooks `before_run`,
//! `on_user_message`, `on_event` and `after_run`. When `before_run` returns
//! content, the agent is skipped, that content is emitted as an event
//! authored by the agent, and `after_run` still runs. If the caller drops
//! the event stream mid-run, `after_run` never runs: the run lease is then
//! reclaimed only when it expires (the plan's `lease_ttl_ms`). Hosts that may
//! drop streams should drain them, or release with
//! [`AdmissionPlugin::release`] themselves.

use std::sync::Arc;

mod bulkhead;
mod estimator;
mod executor;
mod fence;
mod model;
#[cfg(feature = "postgres")]
pub mod postgres;
mod sessions;

pub use bulkhead::ToolBulkhead;
pub use estimator::{CallShape, Estimator, MovingAverage, Usage};
pub use executor::{TurnError, TurnExecutor, TurnStream};
pub use fence::{DbFence, TurnFence, session_key, with_fence};
pub use model::{
    IDENTITY_EXTENSION, LimitedLlm, ModelCallEvent, RefundReason, feedback_of, identify_calls,
    stopped_early_message,
};
pub use sessions::{FenceError, FencedSessionService};

use adk_core::{Content, InvocationContext};
use adk_plugin::{Plugin, PluginConfig};
use tollgate_core::{Decision, Denial, Limit, Limiter, Store};

/// The role of the content returned on a denial: it is shown as the
/// agent's (model's) reply.
const DENIAL_ROLE: &str = "model";

/// The name the plugin registers under.
pub const PLUGIN_NAME: &str = "tollgate-admission";

/// The text returned when the limiter itself fails (store unreachable, no
/// plan for the user, invalid ids).
pub const UNAVAILABLE_MESSAGE: &str =
    "The service is temporarily unavailable; please try again in a moment.";

/// Admits adk-rust turns through a tollgate [`Limiter`].
///
/// Register it on a runner with [`into_plugin`](Self::into_plugin) and an
/// `adk_plugin::PluginManager`. See the [crate docs](crate) on identity:
/// the context's user id is the limiter key and must come from a verified
/// principal.
///
/// On a denial the turn is answered with plain text naming the limit and
/// when to retry ([`denial_message`]); the model is not called. In shadow
/// mode a turn that enforcement would deny proceeds (and is logged at
/// `info`). If the limiter errors, the turn is denied with
/// [`UNAVAILABLE_MESSAGE`] and the error is logged at `warn`: whether a
/// store outage fails open or closed is decided by the store, and an error
/// reaching this plugin means the store chose to fail.
pub struct AdmissionPlugin<S> {
    limiter: Arc<Limiter<S>>,
}

impl<S> Clone for AdmissionPlugin<S> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S> std::fmt::Debug for AdmissionPlugin<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionPlugin").finish_non_exhaustive()
    }
}

impl<S: Store> AdmissionPlugin<S> {
    /// A plugin admitting turns through `limiter`.
    pub fn new(limiter: Arc<Limiter<S>>) -> Self {
        Self { limiter }
    }

    /// The limiter this plugin admits through.
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.limiter
    }

    /// The `before_run` decision for a turn of `user_id` with
    /// `invocation_id`: `None` to proceed, or the content to answer instead
    /// of running the agent.
    pub async fn admit(&self, user_id: &str, invocation_id: &str) -> Option<Content> {
        match self.limiter.admit_turn(user_id, invocation_id).await {
            Ok(Decision::Allowed {
                shadow_denied: Some(denial),
                ..
            }) => {
                tracing::info!(
                    user = user_id,
                    invocation = invocation_id,
                    %denial,
                    "turn allowed by shadow mode"
                );
                None
            }
            Ok(Decision::Allowed { .. }) => None,
            Ok(Decision::Denied(denial)) => {
                tracing::debug!(
                    user = user_id,
                    invocation = invocation_id,
                    %denial,
                    "turn denied"
                );
                Some(Content::new(DENIAL_ROLE).with_text(denial_message(&denial)))
            }
            Err(error) => {
                tracing::warn!(
                    user = user_id,
                    invocation = invocation_id,
                    %error,
                    "turn admission failed; denying"
                );
                Some(Content::new(DENIAL_ROLE).with_text(UNAVAILABLE_MESSAGE))
            }
        }
    }

    /// The `after_run` action: releases the run lease of `invocation_id`.
    /// Returns whether a lease was released; `false` for a turn that was
    /// denied (it never took one) or already released, and for a release
    /// the store journalled while the shared store is down (applied when
    /// it answers). Errors are logged, not returned: the lease then expires
    /// by its TTL.
    pub async fn release(&self, user_id: &str, invocation_id: &str) -> bool {
        match self.limiter.release_run(user_id, invocation_id).await {
            Ok(released) => released.released(),
            Err(error) => {
                tracing::warn!(
                    user = user_id,
                    invocation = invocation_id,
                    %error,
                    "run lease release failed; it will expire by its TTL"
                );
                false
            }
        }
    }

    /// [`admit`](Self::admit) for an invocation context (its user id and
    /// invocation id).
    pub async fn before_run(&self, ctx: &dyn InvocationContext) -> Option<Content> {
        self.admit(ctx.user_id(), ctx.invocation_id()).await
    }

    /// [`release`](Self::release) for an invocation context.
    pub async fn after_run(&self, ctx: &dyn InvocationContext) -> bool {
        self.release(ctx.user_id(), ctx.invocation_id()).await
    }

    /// The adk-plugin [`Plugin`] (named [`PLUGIN_NAME`]) with the
    /// `before_run` and `after_run` hooks.
    pub fn into_plugin(self) -> Plugin {
        let before = self.clone();
        let after = self;
        Plugin::new(PluginConfig {
            name: PLUGIN_NAME.to_string(),
            before_run: Some(Box::new(move |ctx: Arc<dyn InvocationContext>| {
                let plugin = before.clone();
                Box::pin(async move { Ok(plugin.before_run(ctx.as_ref()).await) })
            })),
            after_run: Some(Box::new(move |ctx: Arc<dyn InvocationContext>| {
                let plugin = after.clone();
                Box::pin(async move {
                    plugin.after_run(ctx.as_ref()).await;
                })
            })),
            ..PluginConfig::default()
        })
    }
}

/// The plain-language text answered for `denial`: which limit was hit and,
/// if retrying can help, when to retry (whole seconds, rounded up).
pub fn denial_message(denial: &Denial) -> String {
    match denial.retry_after_secs() {
        Some(secs) => {
            let secs = secs.max(1);
            match denial.limit() {
                Limit::TurnRate => format!(
                    "You have started too many turns in the last minute; try again in {secs} s."
                ),
                Limit::Concurrency => format!(
                    "You already have the maximum number of turns running at once; \
                     wait for one to finish and try again in {secs} s."
                ),
                other => format!("The {other} limit was reached; try again in {secs} s."),
            }
        }
        None => format!(
            "This request cannot be admitted: it exceeds the {} limit, and retrying will not help.",
            denial.limit()
        ),
    }
}
