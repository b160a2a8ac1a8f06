//! Each [`Store`] operation under the failure policy: which ones the local
//! store may decide (scaled by the fallback share), which are journalled,
//! and which always fail closed (SPEC §6).

use crate::aimd::AimdParams;
use crate::calendar::Period;
use crate::lease::{Admit, SessionAcquire, SessionGrant, TurnParams};
use crate::spend::{self, BudgetAdjust, BudgetCheck, BudgetRequest, Charged, Spend, SpentNow};
use crate::store::{
    AppendOutcome, BucketRef, BucketTake, Claim, ClaimRequest, CooldownCheck, FenceCheck,
    MultiTake, ProviderCleared, ReconcileRequest, Reconciled, Release, ReservationId,
    ReserveOutcome, ReserveRequest, SessionAppend, SessionAppended, SessionCreate, SessionCreated,
    SessionDelete, SettleOutcome, SettleRequest, TakeOutcome, TakeRequest, TopUser, TurnOutcome,
    TurnRequest, UserState,
};
use crate::{BucketSpec, Store, StoreError};

use super::journal::{Close, JournalledBudget};
use super::reconcile::{LocalOpen, Owed};
use super::{Attempt, Failover};

fn scale(v: u64, share: f64) -> u64 {
    ((v as f64 * share).floor() as u64).max(1)
}

/// `spec` with amount and capacity scaled by `share` (at least 1 each).
pub(super) fn scale_spec(spec: &BucketSpec, share: f64) -> BucketSpec {
    if share >= 1.0 {
        return *spec;
    }
    BucketSpec::new(
        scale(spec.amount(), share),
        spec.period_ms(),
        scale(spec.capacity(), share),
    )
    .unwrap_or(*spec)
}

/// `checks` with their limits scaled by `share` (at least 1 each): the
/// fallback's part of each budget.
fn scale_checks(checks: &[BudgetCheck], share: f64) -> Vec<BudgetCheck> {
    checks
        .iter()
        .map(|c| BudgetCheck {
            limit: if share >= 1.0 {
                c.limit
            } else {
                scale(c.limit, share)
            },
            ..*c
        })
        .collect()
}

/// Whether a request naming `checks` must fail closed while the shared
/// store fails: it names a budget whose plan does not let the fallback
/// decide it.
fn closed_budgets(checks: &[BudgetCheck]) -> bool {
    checks.iter().any(|c| !c.fallback)
}

fn scale_turn(p: &TurnParams, share: f64) -> TurnParams {
    TurnParams {
        turns: scale_spec(&p.turns, share),
        max_runs: u32::try_from(scale(u64::from(p.max_runs), share)).unwrap_or(p.max_runs),
        ..*p
    }
}

impl<S: Store + Clone> Store for Failover<S> {
    async fn admit_turn(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        let attempt = self
            .attempt("admit_turn", self.primary.admit_turn(req))
            .await;
        let (out, local) = self
            .decide_budgeted(
                "admit_turn",
                attempt,
                closed_budgets(req.budgets),
                |m, share| async move {
                    let budgets = scale_checks(req.budgets, share);
                    m.admit_turn(TurnRequest {
                        params: scale_turn(&req.params, share),
                        budgets: &budgets,
                        ..req
                    })
                    .await
                },
            )
            .await?;
        if let Some(ambiguous) = local
            && let Admit::Admitted {
                refreshed: false, ..
            } = out.admit
        {
            self.owe(req.user, |o| {
                o.turns = Some(req.params.turns);
                o.turns_taken += 1;
                if ambiguous {
                    Owed::push_bounded(&mut o.ambiguous_admissions, req.invocation_id.to_owned());
                }
            });
        }
        Ok(out)
    }

    async fn release_run(&self, user: &str, invocation_id: &str) -> Result<Release, StoreError> {
        let shared = match self
            .attempt("release_run", self.primary.release_run(user, invocation_id))
            .await
        {
            Attempt::Done(r) => Some(r?),
            Attempt::Failed(_) => None,
        };
        // A run admitted locally during an outage holds its lease here.
        let local = if self.local_used() {
            self.inner.fallback.release_run(user, invocation_id).await?
        } else {
            Release::NotHeld
        };
        match shared {
            Some(Release::Released) => Ok(Release::Released),
            Some(_) => Ok(local),
            None => {
                let journalled = self.journal(
                    "release_run",
                    Close::Release {
                        user: user.to_owned(),
                        invocation_id: invocation_id.to_owned(),
                    },
                );
                match (local, journalled) {
                    (Release::Released, _) => Ok(Release::Released),
                    (_, Ok(())) => Ok(Release::Pending),
                    (_, Err(e)) => Err(e),
                }
            }
        }
    }

    async fn renew_run(
        &self,
        user: &str,
        invocation_id: &str,
        ttl_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let cause = match self
            .attempt(
                "renew_run",
                self.primary.renew_run(user, invocation_id, ttl_ms),
            )
            .await
        {
            Attempt::Done(Ok(Some(exp))) => return Ok(Some(exp)),
            Attempt::Done(Ok(None)) if self.local_used() => {
                // Maybe admitted locally during an outage.
                return self
                    .inner
                    .fallback
                    .renew_run(user, invocation_id, ttl_ms)
                    .await;
            }
            Attempt::Done(Ok(None)) => return Ok(None),
            Attempt::Done(Err(e)) => return Err(e),
            Attempt::Failed(cause) => cause,
        };
        // A lease the local store holds can be renewed here; one in the
        // shared store cannot: the client must not believe it holds a lease
        // that is expiring there.
        if self.local_used()
            && let Some(exp) = self
                .inner
                .fallback
                .renew_run(user, invocation_id, ttl_ms)
                .await?
        {
            self.event("renew_run", true, cause.as_ref());
            return Ok(Some(exp));
        }
        self.event("renew_run", false, cause.as_ref());
        Err(Self::closed("renew_run", cause))
    }

    async fn reserve_tokens(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        // A retry of a request the local store answered during an outage
        // gets that answer again, wherever the shared store is now.
        if let Some(rid) = req.request_id
            && self.local_used()
            && let Some(out) = self
                .inner
                .fallback
                .repeat_of(req.user, req.invocation_id, rid)
        {
            return Ok(self.tag_outcome(out));
        }
        let generated;
        let own_id = req.request_id.is_none();
        let rid = match req.request_id {
            Some(r) => r,
            None => {
                generated = self.request_id();
                &generated
            }
        };
        let req = ReserveRequest {
            request_id: Some(rid),
            ..req
        };
        let attempt = self
            .attempt("reserve_tokens", self.primary.reserve_tokens(req))
            .await;
        let sent_and_failed = matches!(attempt, Attempt::Failed(Some(_)));
        let closed = req.budget.is_some_and(|b| closed_budgets(b.checks));
        let decided = self
            .decide_budgeted("reserve_tokens", attempt, closed, |m, share| async move {
                let checks = req.budget.map(|b| scale_checks(b.checks, share));
                m.reserve_tokens(ReserveRequest {
                    tokens: scale_spec(&req.tokens, share),
                    budget: req.budget.map(|b| BudgetRequest {
                        checks: checks.as_deref().unwrap_or_default(),
                        // The fallback counts from a fresh window against
                        // its share of each limit: its crossings would say
                        // nothing of the user's real spend.
                        alerts: &[],
                        ..b
                    }),
                    ..req
                })
                .await
            })
            .await;
        let (out, local) = match decided {
            Ok(v) => v,
            Err(e) => {
                // Refused (fail_closed, or the local store failed) after
                // the call was sent: it may still run in the shared store
                // (queued behind a pause), charging a reservation the
                // caller never got. Reconciliation finds it by its id and
                // refunds it (or marks the id so a late copy takes
                // nothing). Only for an id this replica generated: a
                // caller's own id is the caller's to retry, and a retry
                // answers that grant.
                if sent_and_failed && own_id {
                    self.owe(req.user, |o| {
                        o.tokens = Some(req.tokens);
                        Owed::push_bounded(
                            &mut o.ambiguous_reserves,
                            (req.invocation_id.to_owned(), rid.to_owned()),
                        );
                    });
                }
                return Err(e);
            }
        };
        let Some(ambiguous) = local else {
            return Ok(out);
        };
        let now = self.inner.clock.now_ms();
        let budget = req.budget.filter(|b| !b.checks.is_empty());
        // What the fallback charged: the estimate, and each budget its
        // amount (a shadow reservation: nothing), to be charged to the
        // shared store's windows.
        let charged = match &out {
            ReserveOutcome::Granted { reservation, .. } => Some((
                reservation.call,
                req.estimate,
                budget.and_then(|b| Spend::default().decide(&b, now, req.estimate).ok()),
            )),
            ReserveOutcome::Denied {
                shadow_reservation: Some(r),
                ..
            } => Some((r.call, 0, budget.map(|b| Charged::nothing(&b, now)))),
            _ => None,
        };
        if charged.is_some() || ambiguous {
            self.owe(req.user, |o| {
                o.tokens = Some(req.tokens);
                if let Some((call, estimate, budget)) = charged {
                    o.tokens_net = o.tokens_net.saturating_add(estimate as i64);
                    if let (Some(ch), Some(b)) = (&budget, &req.budget) {
                        for (c, charge) in b.checks.iter().zip(&ch.charges) {
                            o.owe_spend(c.period, c.unit, c.window(now), i128::from(charge.amount));
                        }
                    }
                    o.open.insert(
                        (req.invocation_id.to_owned(), call),
                        LocalOpen {
                            estimate,
                            at: now,
                            budget: budget.map(Box::new),
                        },
                    );
                }
                if ambiguous {
                    Owed::push_bounded(
                        &mut o.ambiguous_reserves,
                        (req.invocation_id.to_owned(), rid.to_owned()),
                    );
                }
            });
        }
        Ok(self.tag_outcome(out))
    }

    async fn settle(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        match req.reservation.fallback {
            Some(tag) if tag == self.inner.tag => return self.settle_local(req).await,
            // Issued by another replica's local store: unknown here.
            Some(_) => return Ok(SettleOutcome::Unknown),
            None => {}
        }
        match self.attempt("settle", self.primary.settle(req)).await {
            Attempt::Done(r) => r,
            Attempt::Failed(_) => {
                self.journal(
                    "settle",
                    Close::Settle {
                        user: req.user.to_owned(),
                        tokens: req.tokens,
                        reservation: req.reservation.clone(),
                        actual: req.actual,
                        budget: req.budget.filter(|b| !b.checks.is_empty()).map(|b| {
                            Box::new(JournalledBudget {
                                checks: b.checks.to_vec(),
                                split: b.split,
                            })
                        }),
                    },
                )?;
                Ok(SettleOutcome::Pending)
            }
        }
    }

    async fn take_many(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, StoreError> {
        self.decide_value(
            "take_many",
            self.primary.take_many(takes, cooldown),
            |m, share| async move {
                let scaled: Vec<BucketTake<'_>> = takes
                    .iter()
                    .map(|t| BucketTake {
                        spec: scale_spec(&t.spec, share),
                        ..*t
                    })
                    .collect();
                m.take_many(&scaled, cooldown).await
            },
        )
        .await
    }

    async fn take_one(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, StoreError> {
        let (out, local) = self
            .decide("take_one", self.primary.take_one(req), |m, share| {
                m.take_one(TakeRequest {
                    spec: scale_spec(&req.spec, share),
                    ..req
                })
            })
            .await?;
        // A user's turns taken locally are owed. An ambiguous take is not
        // (it has no id to check): it may be counted once too few, never
        // twice.
        if local == Some(false)
            && let BucketRef::Turns(user) = req.bucket
            && matches!(out.take, crate::bucket::Take::Granted { .. })
            && req.cost > 0
        {
            self.owe(user, |o| {
                o.turns = Some(req.spec);
                o.turns_taken = o.turns_taken.saturating_add(req.cost);
            });
        }
        Ok(out)
    }

    async fn extend_cooldown(&self, key: &str, until_ms: u64) -> Result<u64, StoreError> {
        self.decide_value(
            "extend_cooldown",
            self.primary.extend_cooldown(key, until_ms),
            |m, _| m.extend_cooldown(key, until_ms),
        )
        .await
    }

    async fn aimd(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, StoreError> {
        self.decide_value("aimd", self.primary.aimd(key, params, throttled), |m, _| {
            m.aimd(key, params, throttled)
        })
        .await
    }

    async fn clear_provider(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, StoreError> {
        let cleared = self
            .closed_only(
                "clear_provider",
                self.primary.clear_provider(cooldown, aimd, params),
            )
            .await?;
        self.inner
            .fallback
            .clear_provider(cooldown, aimd, params)
            .await?;
        Ok(cleared)
    }

    async fn claim_session(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.closed_only("claim_session", self.primary.claim_session(req))
            .await
    }

    async fn session_acquire(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<SessionAcquire, StoreError> {
        self.closed_only(
            "session_acquire",
            self.primary.session_acquire(session, holder, ttl_ms),
        )
        .await
    }

    async fn session_renew(
        &self,
        session: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<Option<SessionGrant>, StoreError> {
        self.closed_only(
            "session_renew",
            self.primary.session_renew(session, holder, ttl_ms),
        )
        .await
    }

    async fn session_release(&self, session: &str, holder: &str) -> Result<bool, StoreError> {
        self.closed_only(
            "session_release",
            self.primary.session_release(session, holder),
        )
        .await
    }

    async fn fence_check(&self, session: &str, fence: u64) -> Result<FenceCheck, StoreError> {
        self.closed_only("fence_check", self.primary.fence_check(session, fence))
            .await
    }

    async fn append_fenced(
        &self,
        session: &str,
        fence: u64,
        record: &[u8],
    ) -> Result<AppendOutcome, StoreError> {
        self.closed_only(
            "append_fenced",
            self.primary.append_fenced(session, fence, record),
        )
        .await
    }

    async fn read_records(
        &self,
        session: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.closed_only(
            "read_records",
            self.primary.read_records(session, from, limit),
        )
        .await
    }

    async fn delete_records(&self, session: &str) -> Result<u64, StoreError> {
        self.closed_only("delete_records", self.primary.delete_records(session))
            .await
    }

    /// Fails closed: the fallback's spend is not the user's.
    async fn budget_spent(
        &self,
        user: &str,
        checks: &[BudgetCheck],
        adjust: Option<(Period, BudgetAdjust)>,
    ) -> Result<Vec<SpentNow>, StoreError> {
        self.closed_only(
            "budget_spent",
            self.primary.budget_spent(user, checks, adjust),
        )
        .await
    }

    async fn user_state(
        &self,
        user: &str,
        turns: BucketSpec,
        tokens: BucketSpec,
    ) -> Result<UserState, StoreError> {
        self.decide_value(
            "user_state",
            self.primary.user_state(user, turns, tokens),
            |m, share| m.user_state(user, scale_spec(&turns, share), scale_spec(&tokens, share)),
        )
        .await
    }

    async fn top_users(&self, n: usize) -> Result<Vec<TopUser>, StoreError> {
        self.decide_value("top_users", self.primary.top_users(n), |m, _| {
            m.top_users(n)
        })
        .await
    }

    async fn reset_user(&self, user: &str) -> Result<bool, StoreError> {
        self.decide_value("reset_user", self.primary.reset_user(user), |m, _| {
            m.reset_user(user)
        })
        .await
    }

    async fn session_create(&self, req: SessionCreate<'_>) -> Result<SessionCreated, StoreError> {
        self.closed_only("session_create", self.primary.session_create(req))
            .await
    }

    async fn session_append(&self, req: SessionAppend<'_>) -> Result<SessionAppended, StoreError> {
        self.closed_only("session_append", self.primary.session_append(req))
            .await
    }

    async fn session_delete(&self, req: SessionDelete<'_>) -> Result<u64, StoreError> {
        self.closed_only("session_delete", self.primary.session_delete(req))
            .await
    }

    async fn reconcile(&self, req: ReconcileRequest<'_>) -> Result<Reconciled, StoreError> {
        self.closed_only("reconcile", self.primary.reconcile(req))
            .await
    }
}

impl<S: Store + Clone> Failover<S> {
    /// A fallback's answer, its reservation ids tagged as this replica's.
    fn tag_outcome(&self, out: ReserveOutcome) -> ReserveOutcome {
        match out {
            ReserveOutcome::Granted {
                reservation,
                wait_ms,
                crossed,
            } => ReserveOutcome::Granted {
                reservation: self.local_id(reservation),
                wait_ms,
                crossed,
            },
            ReserveOutcome::Denied {
                denial,
                shadow_reservation,
            } => ReserveOutcome::Denied {
                denial,
                shadow_reservation: shadow_reservation.map(|r| self.local_id(r)),
            },
            other => other,
        }
    }

    /// Closes a reservation the local store issued, there (whatever the
    /// shared store's state), and owes the shared store its adjustment.
    async fn settle_local(&self, req: SettleRequest<'_>) -> Result<SettleOutcome, StoreError> {
        let id = ReservationId {
            fallback: None,
            ..req.reservation.clone()
        };
        let share = self.share().unwrap_or(1.0);
        let out = self
            .inner
            .fallback
            .settle(SettleRequest {
                tokens: scale_spec(&req.tokens, share),
                reservation: &id,
                // No crossings from the fallback (see reserve_tokens).
                budget: req.budget.map(|b| BudgetRequest { alerts: &[], ..b }),
                ..req
            })
            .await?;
        if let SettleOutcome::Applied { .. } = out {
            let now = self.inner.clock.now_ms();
            self.owe(req.user, |o| {
                o.tokens = Some(req.tokens);
                let (estimate, charged) = o
                    .open
                    .remove(&(id.invocation_id.clone(), id.call))
                    .map_or((0, None), |l| (l.estimate, l.budget));
                if let (Some(charged), Some(b)) = (charged, &req.budget) {
                    for (period, unit, window, delta) in
                        // The fallback's windows are never reset: epoch 0.
                        spend::close_deltas(&charged, b, now, req.actual, |_, _, _| 0)
                    {
                        o.owe_spend(period, unit, window, delta);
                    }
                }
                let delta = match req.actual {
                    Some(a) => i128::from(a) - i128::from(estimate),
                    None => -i128::from(estimate),
                };
                let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
                o.tokens_net = o.tokens_net.saturating_add(delta);
            });
        }
        Ok(out)
    }
}
