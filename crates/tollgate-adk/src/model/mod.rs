//! [`LimitedLlm`]: the per-user token rate and `max_llm_calls` around any
//! adk [`Llm`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use adk_core::{
    AdkError, BeforeModelCallback, BeforeModelResult, CallbackContext, Content, ErrorCategory,
    ErrorComponent, Llm, LlmRequest, LlmResponse, LlmResponseStream, async_trait,
};
use futures::Stream;
use tollgate_core::{
    Decision, Denial, Id, Limit, Limiter, LimiterError, ReservationId, Reserve, Store,
};
use tollgate_provider::{
    AttemptError, Feedback, PermitRequest, ProviderError, ProviderGovernor, Retrier, RetryError,
    ThrottleScope,
};

use crate::estimator::{CallShape, Estimator, MovingAverage, Usage};

mod llm;

/// The key under `LlmRequest.config.extensions` where [`identify_calls`]
/// puts the caller's identity for [`LimitedLlm`] (which removes it before
/// the inner model sees the request).
pub const IDENTITY_EXTENSION: &str = "tollgate";

/// What [`LimitedLlm`] decided about one model call, for logs, metrics and
/// tests ([`LimitedLlm::on_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelCallEvent {
    /// Tokens were reserved (after waiting `waited_ms` on the clock) and
    /// the model is being called.
    Reserved {
        /// The user.
        user: String,
        /// The reservation, `"{call}.{invocation_id}"`.
        reservation: ReservationId,
        /// The tokens reserved.
        estimate: u64,
        /// How long the call waited for them, ms.
        waited_ms: u64,
        /// Set in shadow mode when enforcement would have refused.
        shadow_denied: Option<Denial>,
    },
    /// The call was refused; the model was not called and the run was told
    /// it stopped early.
    Refused {
        /// The user.
        user: String,
        /// The run.
        invocation_id: String,
        /// The tokens asked for.
        estimate: u64,
        /// Why.
        denial: Denial,
    },
    /// The call ended and its reservation was settled with `actual` tokens
    /// (the estimate when the model reported no usage).
    Settled {
        /// The user.
        user: String,
        /// The reservation.
        reservation: ReservationId,
        /// The tokens reserved.
        estimate: u64,
        /// The tokens charged.
        actual: u64,
        /// Whether usage metadata was reported (else `actual` is the
        /// estimate).
        reported: bool,
    },
    /// The reservation was given back: the model failed, or its stream was
    /// dropped before any usage was seen.
    Refunded {
        /// The user.
        user: String,
        /// The reservation.
        reservation: ReservationId,
        /// The tokens given back.
        estimate: u64,
        /// Why.
        reason: RefundReason,
    },
}

/// Why a reservation was refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefundReason {
    /// The model answered an error (at the call, in the stream, or as an
    /// `error_code` in a response).
    ModelError,
    /// The response stream was dropped before it ended and before any
    /// usage was reported.
    Dropped,
    /// The model provider's quota refused the call (rate, cooldown or
    /// exhaustion): the model was not called.
    ProviderRefused,
}

type Observer = Arc<dyn Fn(&ModelCallEvent) + Send + Sync>;

/// Wraps an adk [`Llm`] so that every model call is admitted by a tollgate
/// [`Limiter`]: the user's token rate and the run's `max_llm_calls`
/// (SPEC §1–2).
///
/// Before each call it estimates the tokens ([`Estimator`]; by default a
/// per-agent [`MovingAverage`] seeded by the plan's `estimate_tokens`),
/// reserves them — waiting on the limiter's clock up to the plan's
/// `max_wait_ms`, or refusing — and counts the call against the run's
/// `max_llm_calls`. A refused call does not reach the model: the run gets a
/// plain response saying the work stopped early and why, which ends the
/// agent's turn.
///
/// The reservation is closed exactly once on every path:
/// - after the final non-partial chunk (`turn_complete`, or the end of the
///   stream) it is **settled** with the usage metadata (prompt + output);
///   with no usage reported, with the estimate;
/// - on a model error (the call fails, the stream yields an error, or a
///   response carries an `error_code`) it is **refunded**;
/// - if the stream is dropped before its end, it is settled with the usage
///   seen so far, or refunded if none was seen (on a spawned task: a tokio
///   runtime must be running).
///
/// # Identity
///
/// adk's [`Llm::generate_content`] receives only the request, so the
/// caller's identity travels in it: add [`identify_calls`] as a
/// `before_model_callback` of every agent using this model. It copies the
/// invocation context's user id (which the host must set from a verified
/// principal), invocation id and agent name into the request; this wrapper
/// takes them out again before calling the inner model. A request without
/// them fails with the error code `tollgate.unidentified` rather than run
/// unlimited.
///
/// # Errors
///
/// A limiter failure (store down under `fail_closed`, no plan for the user)
/// fails the call with `tollgate.unavailable` (category `Unavailable`); the
/// model is not called.
pub struct LimitedLlm<L, S> {
    inner: L,
    limiter: Arc<Limiter<S>>,
    estimator: Arc<dyn Estimator>,
    observer: Option<Observer>,
    provider: Option<ProviderBinding<S>>,
    retrier: Option<Arc<Retrier>>,
}

/// Picks the tenant of a user's calls (its share of a provider key).
type TenantOf = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The provider key a [`LimitedLlm`]'s calls are governed by.
struct ProviderBinding<S> {
    governor: Arc<ProviderGovernor<S>>,
    provider: String,
    model: String,
    tenant_of: Option<TenantOf>,
}

impl<L, S> std::fmt::Debug for LimitedLlm<L, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedLlm").finish_non_exhaustive()
    }
}

impl<L: Llm, S: Store + Clone> LimitedLlm<L, S> {
    /// `inner`, limited by `limiter`, with a [`MovingAverage`] estimator.
    pub fn new(inner: L, limiter: Arc<Limiter<S>>) -> Self {
        Self {
            inner,
            limiter,
            estimator: Arc::new(MovingAverage::new()),
            observer: None,
            provider: None,
            retrier: None,
        }
    }

    /// Retries failed model calls with `retrier` — the one retry layer
    /// (SPEC §5): full-jitter exponential backoff on the limiter's clock,
    /// the provider's hint honoured, a max attempt count and a retry
    /// budget. Only answers that can pass are retried (rate-limited,
    /// unavailable, timed out, upstream 5xx — see [`feedback_of`]). Each
    /// retry takes a new provider permit (with
    /// [`with_provider`](Self::with_provider)) but is not charged to the
    /// user again: the user's reservation is made once. Share one retrier
    /// per provider key per replica.
    pub fn with_retries(mut self, retrier: Arc<Retrier>) -> Self {
        self.retrier = Some(retrier);
        self
    }

    /// Governs every call by `provider`'s `model` quota too (SPEC §5): after
    /// the user's tokens are reserved, the call takes a provider permit
    /// within what is left of the plan's `max_wait_ms` (one deadline for
    /// both waits). If the provider's quota refuses, the user's reservation
    /// is refunded and the run is told it stopped early. A model error is
    /// reported to the governor as the provider's answer (a rate-limited
    /// error counts as a 429: cooldown and AIMD). A key the governor does
    /// not know is not limited.
    pub fn with_provider(
        mut self,
        governor: Arc<ProviderGovernor<S>>,
        provider: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        self.provider = Some(ProviderBinding {
            governor,
            provider: provider.into(),
            model: model.into(),
            tenant_of: None,
        });
        self
    }

    /// With [`with_provider`](Self::with_provider): `tenant_of(user)`
    /// names the tenant whose share of the provider key a user's calls
    /// use (`None`: the pool alone).
    pub fn with_tenant(
        mut self,
        tenant_of: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        if let Some(b) = &mut self.provider {
            b.tenant_of = Some(Arc::new(tenant_of));
        }
        self
    }

    /// Replaces the estimator.
    pub fn with_estimator(mut self, estimator: impl Estimator) -> Self {
        self.estimator = Arc::new(estimator);
        self
    }

    /// Calls `observer` with every decision (reserve, refuse, settle,
    /// refund). It runs inline on the model call's path: keep it cheap.
    pub fn on_event(mut self, observer: impl Fn(&ModelCallEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The wrapped model.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The estimator in use.
    pub fn estimator(&self) -> &Arc<dyn Estimator> {
        &self.estimator
    }
}

/// The identity [`identify_calls`] stores in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CallIdentity {
    user: String,
    invocation_id: String,
    agent: String,
    /// Whether the request had no `config` before the identity was added
    /// (so the inner model gets the request exactly as the agent built it).
    config_was_none: bool,
}

impl CallIdentity {
    fn attach(self, request: &mut LlmRequest) {
        let value = serde_json::json!({
            "user": self.user,
            "invocation_id": self.invocation_id,
            "agent": self.agent,
            "config_was_none": self.config_was_none,
        });
        request
            .config
            .get_or_insert_with(Default::default)
            .extensions
            .insert(IDENTITY_EXTENSION.to_owned(), value);
    }

    /// Removes the identity from `request`, restoring it as it was.
    fn detach(request: &mut LlmRequest) -> Option<Self> {
        let value = request
            .config
            .as_mut()?
            .extensions
            .remove(IDENTITY_EXTENSION)?;
        let text = |k: &str| value.get(k)?.as_str().map(str::to_owned);
        let identity = Self {
            user: text("user")?,
            invocation_id: text("invocation_id")?,
            agent: text("agent")?,
            config_was_none: value
                .get("config_was_none")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        };
        if identity.config_was_none
            && request.config.as_ref().is_some_and(|c| {
                c.extensions.is_empty()
                    && serde_json::to_value(c).ok()
                        == serde_json::to_value(adk_core::GenerateContentConfig::default()).ok()
            })
        {
            request.config = None;
        }
        Some(identity)
    }
}

/// The `before_model_callback` that tells [`LimitedLlm`] who is calling:
/// add it to every agent whose model is a `LimitedLlm`
/// (`LlmAgentBuilder::before_model_callback(tollgate_adk::identify_calls())`).
pub fn identify_calls() -> BeforeModelCallback {
    Box::new(|ctx: Arc<dyn CallbackContext>, mut request: LlmRequest| {
        let identity = CallIdentity {
            user: ctx.user_id().to_owned(),
            invocation_id: ctx.invocation_id().to_owned(),
            agent: ctx.agent_name().to_owned(),
            config_was_none: request.config.is_none(),
        };
        identity.attach(&mut request);
        Box::pin(async move { Ok(BeforeModelResult::Continue(request)) })
    })
}

/// The plain text a run gets when its model call is refused: the work
/// stopped early, and why.
pub fn stopped_early_message(denial: &Denial) -> String {
    match *denial {
        Denial::Limited { limit, .. } => {
            let secs = denial.retry_after_secs().unwrap_or(1).max(1);
            let what = match limit {
                Limit::TokenRate => "your per-minute token limit".to_owned(),
                Limit::Bucket | Limit::Cooldown => "the model provider's rate limit".to_owned(),
                other => format!("the {other} limit"),
            };
            format!("I stopped early because {what} was reached. Please try again in {secs} s.")
        }
        Denial::CapReached {
            limit: Limit::MaxLlmCalls,
            cap,
        } => format!(
            "I stopped early because this turn reached its limit of {cap} model calls. \
             Please rephrase or split the request."
        ),
        Denial::ExceedsCapacity { cost, max_cost, .. } => format!(
            "I stopped early because this request needs about {cost} tokens, more than the \
             {max_cost} your per-minute token limit allows at once. Please shorten it."
        ),
        Denial::CapReached { limit, cap } => {
            format!("I stopped early because the {limit} limit of {cap} was reached.")
        }
        // `Denial` is non-exhaustive.
        _ => format!("I stopped early because a limit was reached ({denial})."),
    }
}

fn unavailable(error: &LimiterError) -> AdkError {
    AdkError::new(
        ErrorComponent::Model,
        ErrorCategory::Unavailable,
        "tollgate.unavailable",
        format!("model call not admitted: {error}"),
    )
}

/// Why a model call (all its attempts) failed.
enum Failure {
    /// The model answered an error.
    Model(AdkError),
    /// The provider's quota refused; answer this text.
    Refused(String),
    /// The governor failed.
    Failed(AdkError),
}

/// A provider permit's outcome.
enum Permit {
    /// Granted (and waited for).
    Go,
    /// Refused: the text to answer.
    Refused(String),
    /// The governor failed.
    Failed(AdkError),
}

impl<S: Store> ProviderBinding<S> {
    /// Reports a provider's answer to the governor (errors are logged) and
    /// answers it with its retry hint cut to the key's maximum
    /// ([`Provider::bound`](tollgate_provider::Provider::bound)), so
    /// the retry layer never waits out a hint the governor would not take.
    /// An unconfigured key answers it as read.
    async fn report(&self, feedback: Feedback) -> Feedback {
        let bounded = match self.governor.book().get(&self.provider, &self.model) {
            Some(p) => p.bound(feedback),
            None => feedback,
        };
        if let Err(error) = self
            .governor
            .observe(&self.provider, &self.model, bounded.clone())
            .await
            && !matches!(error, ProviderError::Unknown { .. })
        {
            tracing::warn!(provider = self.provider, model = self.model, %error, "provider feedback not recorded");
        }
        bounded
    }
}

/// What a model error says about the provider's quota: a rate-limited
/// error is a throttle (with its retry hint), an unavailable or timed-out
/// one or an upstream 5xx a server error, anything else a client error.
pub fn feedback_of(error: &AdkError) -> Feedback {
    let hint = error.retry.retry_after_ms;
    match (error.category, error.details.upstream_status_code) {
        (ErrorCategory::RateLimited, _) | (_, Some(429)) => Feedback::Throttled {
            retry_after_ms: hint,
            scope: ThrottleScope::Unknown,
        },
        (ErrorCategory::Unavailable | ErrorCategory::Timeout, _) => Feedback::ServerError {
            retry_after_ms: hint,
        },
        (_, Some(status)) if status >= 500 => Feedback::ServerError {
            retry_after_ms: hint,
        },
        _ => Feedback::ClientError,
    }
}

impl<L: Llm, S: Store + Clone> LimitedLlm<L, S> {
    /// Takes a provider permit for a call of `estimate` tokens, waiting at
    /// most `left` ms (on the limiter's clock).
    async fn provider_permit(
        &self,
        b: &ProviderBinding<S>,
        tenant: Option<&str>,
        estimate: u64,
        left: u64,
    ) -> Permit {
        let req = PermitRequest {
            tenant,
            max_wait_ms: Some(left),
            ..PermitRequest::new(&b.provider, &b.model, estimate)
        };
        match b.governor.permit(req).await {
            Ok(Decision::Allowed { grant, .. }) => {
                if grant.wait_ms > 0 {
                    // Dropped while waiting: the ticket refunds.
                    let clock = self.limiter.clock();
                    clock
                        .sleep_until(clock.now_ms().saturating_add(grant.wait_ms))
                        .await;
                }
                Permit::Go
            }
            Ok(Decision::Denied(denial)) => Permit::Refused(stopped_early_message(&denial)),
            Err(ProviderError::Unknown { .. }) => Permit::Go,
            Err(ProviderError::Exhausted { reason, .. }) => {
                tracing::warn!(
                    provider = b.provider,
                    model = b.model,
                    reason,
                    "provider quota exhausted"
                );
                Permit::Refused(
                    "I stopped early because the model provider's quota is used up for now. \
                     Please try again later."
                        .to_owned(),
                )
            }
            Err(ProviderError::Store(e)) => Permit::Failed(unavailable(&LimiterError::Store(e))),
            Err(other) => Permit::Failed(AdkError::new(
                ErrorComponent::Model,
                ErrorCategory::Unavailable,
                "tollgate.unavailable",
                format!("model call not admitted: {other}"),
            )),
        }
    }
}

impl<L, S> LimitedLlm<L, S> {
    fn emit(&self, event: &ModelCallEvent) {
        if let Some(observer) = &self.observer {
            observer(event);
        }
    }
}

/// How a reservation is closed.
#[derive(Debug, Clone, Copy)]
enum Close {
    /// Settle with the usage seen (the estimate if none).
    Settle,
    /// Give the estimate back.
    Refund(RefundReason),
}

/// A boxed close in progress.
type Pending = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One open reservation and what is needed to close it once.
struct Ticket<S: Store> {
    closing: Option<Closing<S>>,
}

impl<S: Store> Ticket<S> {
    /// The user, while the reservation is open.
    fn user(&self) -> Option<&str> {
        self.closing.as_ref().map(|c| c.user.as_str())
    }

    /// Notes what `chunk` reports and whether it ends the call: `Some` with
    /// the way to close it, or `None` to go on.
    fn see(&mut self, chunk: &LlmResponse) -> Option<Close> {
        let closing = self.closing.as_mut()?;
        if let Some(usage) = chunk.usage_metadata.as_ref().and_then(Usage::from_metadata) {
            closing.usage = Some(usage);
        }
        if chunk.error_code.is_some() {
            Some(Close::Refund(RefundReason::ModelError))
        } else if !chunk.partial && chunk.turn_complete {
            Some(Close::Settle)
        } else {
            None
        }
    }

    /// The close of the reservation `how`, to be awaited (or, if it cannot
    /// be, handed to [`detach`]); `None` if it was already closed.
    fn close(&mut self, how: Close) -> Option<Pending> {
        let mut closing = self.closing.take()?;
        closing.how = how;
        Some(Box::pin(closing.run()))
    }
}

impl<S: Store> Drop for Ticket<S> {
    fn drop(&mut self) {
        // Dropped before the end: settle what was seen, or refund.
        let Some(seen) = self.closing.as_ref().map(|c| c.usage.is_some()) else {
            return;
        };
        let how = if seen {
            Close::Settle
        } else {
            Close::Refund(RefundReason::Dropped)
        };
        if let Some(pending) = self.close(how) {
            drop(detach(pending));
        }
    }
}

/// Runs `future` on its own task when a tokio runtime is present (the
/// returned future then only waits for it, and dropping it does not cancel
/// the close), else in place.
fn detach(future: Pending) -> Pending {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let task = handle.spawn(future);
            Box::pin(async move {
                if let Err(error) = task.await {
                    tracing::warn!(%error, "closing a model call's reservation failed");
                }
            })
        }
        Err(_) => {
            tracing::warn!(
                "no tokio runtime: a model call's reservation is closed only if its close is awaited"
            );
            Box::pin(future)
        }
    }
}

/// Everything needed to close a reservation, detached from the stream.
struct Closing<S: Store> {
    limiter: Arc<Limiter<S>>,
    estimator: Arc<dyn Estimator>,
    observer: Option<Observer>,
    user: String,
    agent: String,
    model: String,
    request_bytes: u64,
    max_output_tokens: Option<u64>,
    plan_estimate: u64,
    reservation: ReservationId,
    estimate: u64,
    /// The latest usage reported by any chunk.
    usage: Option<Usage>,
    how: Close,
}

impl<S: Store> Closing<S> {
    async fn run(self) {
        let event = match self.how {
            Close::Settle => {
                let actual = self.usage.map_or(self.estimate, |u| u.total());
                let result = self
                    .limiter
                    .settle(&self.user, &self.reservation, actual)
                    .await;
                if let Err(error) = result {
                    tracing::warn!(user = self.user, reservation = %self.reservation, %error, "settling a model call failed; its estimate stays charged");
                    return;
                }
                if let Some(usage) = self.usage {
                    let shape = CallShape {
                        agent: &self.agent,
                        model: &self.model,
                        request_bytes: self.request_bytes,
                        max_output_tokens: self.max_output_tokens,
                        plan_estimate: self.plan_estimate,
                    };
                    self.estimator.observe(&shape, usage);
                }
                ModelCallEvent::Settled {
                    user: self.user,
                    reservation: self.reservation,
                    estimate: self.estimate,
                    actual,
                    reported: self.usage.is_some(),
                }
            }
            Close::Refund(reason) => {
                if let Err(error) = self.limiter.refund(&self.user, &self.reservation).await {
                    tracing::warn!(user = self.user, reservation = %self.reservation, %error, "refunding a model call failed; its estimate stays charged");
                    return;
                }
                ModelCallEvent::Refunded {
                    user: self.user,
                    reservation: self.reservation,
                    estimate: self.estimate,
                    reason,
                }
            }
        };
        if let Some(observer) = &self.observer {
            observer(&event);
        }
    }
}

/// The inner model's stream, closing the reservation once.
struct Metered<S: Store> {
    inner: LlmResponseStream,
    ticket: Ticket<S>,
    /// The close in progress and the item to pass on once it is done: the
    /// chunk that ended the call, or the end of the stream.
    closing: Option<(Pending, Option<adk_core::Result<LlmResponse>>)>,
    done: bool,
}

impl<S: Store> Drop for Metered<S> {
    fn drop(&mut self) {
        // A close in progress is finished on its own task.
        if let Some((pending, _)) = self.closing.take() {
            drop(detach(pending));
        }
    }
}

impl<S: Store> Stream for Metered<S> {
    type Item = adk_core::Result<LlmResponse>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some((pending, _)) = &mut this.closing {
                std::task::ready!(pending.as_mut().poll(cx));
                let (_, item) = this.closing.take().expect("a close in progress");
                this.done |= item.is_none();
                return Poll::Ready(item);
            }
            if this.done {
                return Poll::Ready(None);
            }
            let item = std::task::ready!(this.inner.as_mut().poll_next(cx));
            let how = match &item {
                Some(Ok(chunk)) => this.ticket.see(chunk),
                Some(Err(_)) => Some(Close::Refund(RefundReason::ModelError)),
                None => Some(Close::Settle),
            };
            match how.and_then(|how| this.ticket.close(how)) {
                Some(pending) => this.closing = Some((pending, item)),
                None => {
                    this.done |= item.is_none();
                    return Poll::Ready(item);
                }
            }
        }
    }
}
