//! adk's `Llm` over [`LimitedLlm`]: reserve, call the inner model (retrying by the provider's answers), settle or refund exactly once.

use super::*;

#[async_trait]
impl<L: Llm, S: Store + Clone> Llm for LimitedLlm<L, S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn generate_content(
        &self,
        mut request: LlmRequest,
        stream: bool,
    ) -> adk_core::Result<LlmResponseStream> {
        let Some(who) = CallIdentity::detach(&mut request) else {
            return Err(AdkError::new(
                ErrorComponent::Model,
                ErrorCategory::InvalidInput,
                "tollgate.unidentified",
                "LimitedLlm needs the caller's identity: add \
                 tollgate_adk::identify_calls() as a before_model_callback of the agent",
            ));
        };
        // The caller's ids, checked once, and one snapshot of its plan for
        // the estimate and the reservation.
        let invocation_id = Id::new(&who.invocation_id)
            .map_err(|e| unavailable(&LimiterError::invalid("invocation_id", e.to_string())))?;
        let user = self.limiter.user(&who.user).map_err(|e| unavailable(&e))?;
        let shape = CallShape::of(
            &who.agent,
            self.inner.name(),
            &request,
            user.plan().estimate_tokens,
        );
        let estimate = self.estimator.estimate(&shape).max(1);
        let request_bytes = shape.request_bytes;
        let max_output_tokens = shape.max_output_tokens;

        let decision = user
            .reserve(Reserve {
                invocation_id,
                estimate,
                request_id: None,
                wait: true,
                model: None,
                split: None,
            })
            .await
            .map_err(|e| unavailable(&e))?;
        let plan = Arc::clone(user.plan());
        drop(user);
        let (reservation, waited_ms, shadow_denied) = match decision {
            Decision::Allowed {
                grant,
                shadow_denied,
            } => (grant.id, grant.waited_ms, shadow_denied),
            Decision::Denied(denial) => {
                tracing::debug!(user = who.user, invocation = who.invocation_id, estimate, %denial, "model call refused");
                self.emit(&ModelCallEvent::Refused {
                    user: who.user.clone(),
                    invocation_id: who.invocation_id.clone(),
                    estimate,
                    denial,
                });
                let response = LlmResponse {
                    content: Some(Content::new("model").with_text(stopped_early_message(&denial))),
                    turn_complete: true,
                    ..LlmResponse::default()
                };
                return Ok(Box::pin(futures::stream::once(async move { Ok(response) })));
            }
        };
        if let Some(denial) = shadow_denied {
            tracing::info!(user = who.user, reservation = %reservation, %denial, "model call allowed by shadow mode");
        }
        self.emit(&ModelCallEvent::Reserved {
            user: who.user.clone(),
            reservation: reservation.clone(),
            estimate,
            waited_ms,
            shadow_denied,
        });

        let mut ticket = Ticket {
            closing: Some(Closing {
                limiter: Arc::clone(&self.limiter),
                estimator: Arc::clone(&self.estimator),
                observer: self.observer.clone(),
                user: who.user,
                agent: who.agent,
                model: self.inner.name().to_owned(),
                request_bytes,
                max_output_tokens,
                plan_estimate: plan.estimate_tokens,
                reservation,
                estimate,
                usage: None,
                how: Close::Settle,
            }),
        };
        // One deadline for the user's wait and the provider's.
        let deadline = self
            .limiter
            .clock()
            .now_ms()
            .saturating_sub(waited_ms)
            .saturating_add(plan.max_wait_ms);
        let tenant = self
            .provider
            .as_ref()
            .and_then(|b| b.tenant_of.as_ref())
            .and_then(|f| ticket.user().and_then(|u| f(u)));
        let retrying = self.retrier.is_some();
        let mut request = Some(request);
        let attempt = |_n: u32| {
            // The request is cloned only when it may be sent again.
            let req = if retrying {
                request.clone()
            } else {
                request.take()
            };
            let tenant = tenant.as_deref();
            async move {
                let req = req.ok_or_else(|| {
                    AttemptError::Stop(Failure::Failed(AdkError::internal(
                        ErrorComponent::Model,
                        "tollgate.internal",
                        "model call attempted twice without a retrier",
                    )))
                })?;
                if let Some(b) = &self.provider {
                    let left = deadline.saturating_sub(self.limiter.clock().now_ms());
                    match self.provider_permit(b, tenant, estimate, left).await {
                        Permit::Go => {}
                        Permit::Refused(text) => {
                            return Err(AttemptError::Stop(Failure::Refused(text)));
                        }
                        Permit::Failed(e) => return Err(AttemptError::Stop(Failure::Failed(e))),
                    }
                }
                match self.inner.generate_content(req, stream).await {
                    Ok(inner) => Ok(inner),
                    Err(error) => {
                        let mut feedback = feedback_of(&error);
                        if let Some(b) = &self.provider {
                            feedback = b.report(feedback).await;
                        }
                        Err(AttemptError::Answered {
                            error: Failure::Model(error),
                            feedback,
                        })
                    }
                }
            }
        };
        let result = match &self.retrier {
            Some(retrier) => retrier.run(attempt).await.map_err(RetryError::into_inner),
            None => {
                let mut attempt = attempt;
                attempt(1).await.map_err(|e| match e {
                    AttemptError::Answered { error, .. } | AttemptError::Stop(error) => error,
                })
            }
        };
        let (reason, outcome) = match result {
            Ok(inner) => {
                return Ok(Box::pin(Metered {
                    inner,
                    ticket,
                    closing: None,
                    done: false,
                }));
            }
            Err(Failure::Model(error)) => (RefundReason::ModelError, Err(error)),
            Err(Failure::Failed(error)) => (RefundReason::ProviderRefused, Err(error)),
            Err(Failure::Refused(text)) => {
                let response = LlmResponse {
                    content: Some(Content::new("model").with_text(text)),
                    turn_complete: true,
                    ..LlmResponse::default()
                };
                let refusal: LlmResponseStream =
                    Box::pin(futures::stream::once(async move { Ok(response) }));
                (RefundReason::ProviderRefused, Ok(refusal))
            }
        };
        // On its own task: the refund completes even if this call is
        // dropped meanwhile.
        if let Some(pending) = ticket.close(Close::Refund(reason)) {
            detach(pending).await;
        }
        outcome
    }
}
