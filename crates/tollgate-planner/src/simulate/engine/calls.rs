//! The replay's model calls: token reservations, provider permits and the provider's answers.

use super::*;

/// One `model_call` event of a trace, as [`Event::ModelCall`] carries it.
pub(super) struct ModelCall<'a> {
    pub(super) user: &'a str,
    pub(super) invocation: &'a str,
    pub(super) estimate: Option<u64>,
    pub(super) actual: Option<u64>,
    pub(super) duration_ms: u64,
    pub(super) provider: Option<ProviderRef<'a>>,
}

impl Engine {
    pub(super) fn model_call(
        &mut self,
        line: u64,
        t: u64,
        call: ModelCall<'_>,
    ) -> Result<(), PlanError> {
        let (invocation, duration_ms, provider) =
            (call.invocation, call.duration_ms, call.provider);
        let Some(run) = self.runs.get(&run_key(call.user, invocation)) else {
            self.skipped.not_running += 1;
            return Ok(());
        };
        let (user, plan) = (Arc::clone(&run.user), Arc::clone(&run.plan));
        let estimate = call.estimate.unwrap_or(plan.estimate_tokens);
        let actual = call.actual.unwrap_or(estimate);
        // The model prices the call for the plan's cost budgets.
        let id = |field: &'static str, v| {
            Id::new(v)
                .map_err(|e| self.limiter_err(line, LimiterError::invalid(field, e.to_string())))
        };
        let model = match provider.as_ref() {
            Some(p) => Some(ModelRef {
                provider: id("provider", &p.provider)?,
                model: id("model", &p.model)?,
            }),
            None => None,
        };
        let call = Reserve {
            invocation_id: id("invocation", invocation)?,
            estimate,
            request_id: None,
            wait: false,
            model,
            split: None,
        };
        let decision =
            ready(self.limiter.reserve(&*user, call))?.map_err(|e| self.limiter_err(line, e))?;
        self.decided(t, decision.outcome());
        self.touch(&user)?;
        let (grant, user_shadow) = match decision {
            Decision::Denied(d) => {
                self.record_denial(&plan, label(&d, false), d.retry_after_ms(), false);
                self.record_call(&plan, &user, Outcome::Denied, 0, 0);
                return Ok(());
            }
            Decision::Allowed {
                grant,
                shadow_denied,
            } => {
                if let Some(d) = &shadow_denied {
                    self.record_denial(&plan, label(d, false), d.retry_after_ms(), true);
                }
                (grant, shadow_denied.is_some())
            }
        };
        let wait = grant.wait_ms;
        match provider {
            Some(p) if self.governor.book().get(&p.provider, &p.model).is_some() => {
                self.schedule(
                    t + wait,
                    Action::Permit(Box::new(CallInFlight {
                        user,
                        plan,
                        reservation: grant.id,
                        estimate,
                        actual,
                        duration_ms,
                        provider: p.provider.into_owned(),
                        model: p.model.into_owned(),
                        tenant: p.tenant.map(|t| t.into_owned()),
                        user_wait: wait,
                        user_shadow,
                        line,
                    })),
                );
            }
            other => {
                if other.is_some() {
                    self.skipped.unknown_provider += 1;
                }
                let o = match (user_shadow, wait) {
                    (true, _) => Outcome::ShadowDenied,
                    (false, 0) => Outcome::Allowed,
                    (false, _) => Outcome::Waited,
                };
                self.record_call(&plan, &user, o, wait, actual);
                self.schedule(
                    t + wait + duration_ms,
                    Action::Settle {
                        user,
                        reservation: grant.id,
                        actual,
                        line,
                    },
                );
            }
        }
        Ok(())
    }

    /// The provider step of a model call, at `now` (after the user's wait),
    /// within what is left of the plan's `max_wait_ms` (one deadline).
    pub(super) fn call_permit(&mut self, now: u64, c: CallInFlight) -> Result<(), PlanError> {
        let key = format!("{}:{}", c.provider, c.model);
        let req = PermitRequest {
            tenant: c.tenant.as_deref(),
            max_wait_ms: Some(c.plan.max_wait_ms.saturating_sub(c.user_wait)),
            ..PermitRequest::new(&c.provider, &c.model, c.estimate)
        };
        let (o, wait) = match self.permit(now, &key, req)? {
            PermitResult::Granted { wait_ms } => {
                let wait = c.user_wait + wait_ms;
                let o = match (c.user_shadow, wait) {
                    (true, _) => Outcome::ShadowDenied,
                    (false, 0) => Outcome::Allowed,
                    (false, _) => Outcome::Waited,
                };
                (o, wait)
            }
            PermitResult::Unconfigured => {
                self.skipped.unknown_provider += 1;
                let o = match (c.user_shadow, c.user_wait) {
                    (true, _) => Outcome::ShadowDenied,
                    (false, 0) => Outcome::Allowed,
                    (false, _) => Outcome::Waited,
                };
                (o, c.user_wait)
            }
            PermitResult::Refused {
                label,
                retry,
                shadow,
            } => {
                self.record_denial(&c.plan, label, retry, shadow);
                if !shadow {
                    match ready(self.limiter.refund(&*c.user, &c.reservation))? {
                        Ok(_) => {}
                        Err(LimiterError::UnknownReservation(_)) => {
                            self.skipped.unknown_reservation += 1;
                        }
                        Err(e) => return Err(self.limiter_err(c.line, e)),
                    }
                    self.touch(&c.user)?;
                    self.record_call(&c.plan, &c.user, Outcome::Denied, 0, 0);
                    return Ok(());
                }
                (Outcome::ShadowDenied, c.user_wait)
            }
        };
        self.record_call(&c.plan, &c.user, o, wait, c.actual);
        let provider_wait = wait - c.user_wait;
        self.schedule(
            now + provider_wait + c.duration_ms,
            Action::Settle {
                user: c.user,
                reservation: c.reservation,
                actual: c.actual,
                line: c.line,
            },
        );
        Ok(())
    }

    /// Takes a provider permit and counts it under the provider key.
    pub(super) fn permit(
        &mut self,
        t: u64,
        key: &str,
        req: PermitRequest<'_>,
    ) -> Result<PermitResult, PlanError> {
        let tenant = req.tenant;
        let (outcome, result) = match ready(self.governor.permit(req))? {
            Ok(Decision::Allowed { grant, .. }) => {
                let o = if grant.wait_ms > 0 {
                    Outcome::Waited
                } else {
                    Outcome::Allowed
                };
                (
                    o,
                    PermitResult::Granted {
                        wait_ms: grant.wait_ms,
                    },
                )
            }
            Ok(Decision::Denied(d)) => (
                Outcome::Denied,
                PermitResult::Refused {
                    label: label(&d, true),
                    retry: d.retry_after_ms(),
                    shadow: self.shadow,
                },
            ),
            Err(ProviderError::Exhausted { .. }) => (
                Outcome::Denied,
                PermitResult::Refused {
                    label: "provider_exhausted",
                    retry: None,
                    shadow: self.shadow,
                },
            ),
            Err(ProviderError::Unknown { .. }) => return Ok(PermitResult::Unconfigured),
            Err(e) => return Err(replay_err(e)),
        };
        let acc = self.providers.entry(key.to_owned()).or_default();
        let outcome = match (&result, outcome) {
            (PermitResult::Refused { shadow: true, .. }, _) => Outcome::ShadowDenied,
            (_, o) => o,
        };
        acc.permits.add(outcome);
        if let PermitResult::Granted { wait_ms } = &result {
            let start = t.saturating_add(*wait_ms);
            acc.last_start = Some(acc.last_start.map_or(start, |s| s.max(start)));
            if let (Some(c), Some(tenant)) = (&mut self.chart, tenant) {
                c.tenant_permit(start, key, tenant);
            }
        }
        let ten = acc.tenant(tenant);
        ten.permits.add(outcome);
        if let PermitResult::Granted { wait_ms } = &result {
            ten.waits.record(*wait_ms);
        }
        match &result {
            PermitResult::Granted { wait_ms } => acc.waits.record(*wait_ms),
            PermitResult::Refused {
                label,
                retry,
                shadow,
            } => add_denial(&mut acc.limits, label, *retry, *shadow),
            PermitResult::Unconfigured => {}
        }
        self.decided(t, outcome);
        Ok(result)
    }

    pub(super) fn provider_response(
        &mut self,
        p: &ProviderRef<'_>,
        status: u16,
        headers: &BTreeMap<String, String>,
        body: Option<&str>,
    ) -> Result<(), PlanError> {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match ready(
            self.governor
                .feedback(&p.provider, &p.model, status, &headers, body),
        )? {
            Ok(out) => {
                let acc = self
                    .providers
                    .entry(format!("{}:{}", p.provider, p.model))
                    .or_default();
                *acc.responses.entry(out.feedback.class()).or_default() += 1;
                if out.cooldown_until_ms.is_some() {
                    acc.cooldowns += 1;
                }
            }
            Err(ProviderError::Unknown { .. }) => self.skipped.unknown_provider += 1,
            Err(e) => return Err(replay_err(e)),
        }
        Ok(())
    }
}
