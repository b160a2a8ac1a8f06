//! Each [`Store`] operation under the failure policy: which ones the local
//! store may decide (scaled by the fallback share), which are journalled,
//! and which always fail closed (SPEC §6).

use std::future::Future;
use std::sync::atomic::Ordering;

use crate::lease::{Admit, TurnParams};
use crate::spend::{self, BudgetCheck, BudgetRequest, Charged, Spend};
use crate::store::{
    BucketRef, ClearProvider, Op, Outage, ProviderCleared, Release, ReleaseRun, RenewRun,
    ReservationId, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest, TakeOutcome,
    TakeRequest, TurnOutcome, TurnRequest,
};
use crate::{BucketSpec, Store, StoreError};

use super::journal::{Close, JournalledBudget};
use super::reconcile::{LocalOpen, Owed};
use super::{Attempt, Failover};

fn scale(v: u64, share: f64) -> u64 {
    ((v as f64 * share).floor() as u64).max(1)
}

/// `spec` with amount and capacity scaled by `share` (at least 1 each).
pub(crate) fn scale_spec(spec: &BucketSpec, share: f64) -> BucketSpec {
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
pub(crate) fn scale_checks(checks: &[BudgetCheck], share: f64) -> Vec<BudgetCheck> {
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

pub(crate) fn scale_turn(p: &TurnParams, share: f64) -> TurnParams {
    TurnParams {
        turns: scale_spec(&p.turns, share),
        max_runs: u32::try_from(scale(u64::from(p.max_runs), share)).unwrap_or(p.max_runs),
        ..*p
    }
}

impl<S: Store + Clone> Store for Failover<S> {
    fn call<O: Op>(&self, op: O) -> impl Future<Output = Result<O::Reply, StoreError>> + Send {
        op.failover(self)
    }

    fn fallback_decisions(&self) -> u64 {
        self.inner.local_decisions.load(Ordering::Relaxed)
    }
}

/// The operations' outage policies ([`Op::OUTAGE`]): the two that keep no
/// books in one place, and those that do, one function each.
impl<S: Store + Clone> Failover<S> {
    /// An operation under its stated policy: [`Outage::FailClosed`] (and,
    /// safe by default, one that keeps books but wrote none) refused while
    /// the shared store fails, [`Outage::Fallback`] decided by the local
    /// store on its share.
    pub(crate) async fn by_policy<O: Op>(&self, op: O) -> Result<O::Reply, StoreError> {
        match O::OUTAGE {
            Outage::Fallback => {
                self.decide_value(O::NAME, self.primary.call(op), |m, share| {
                    op.on_fallback(m, share)
                })
                .await
            }
            Outage::FailClosed | Outage::Owed | Outage::Journalled => {
                self.closed_only(O::NAME, self.primary.call(op)).await
            }
        }
    }

    /// Turn admission ([`Outage::Owed`]): a turn the local store admitted
    /// is owed, and an ambiguous one remembered.
    pub(crate) async fn admit_owed(&self, req: TurnRequest<'_>) -> Result<TurnOutcome, StoreError> {
        // A release journalled for an earlier attempt of this run, refused
        // after it was sent, would end the lease the store may refresh
        // for this one: out while this one is decided, back unless the
        // store admits the run. The recovery starts after that (below).
        let had = self.take_abandoned(req.user, req.invocation_id);
        let attempt = self
            .attempt_only(TurnRequest::NAME, self.primary.call(req))
            .await;
        let sent_and_failed = matches!(attempt, Attempt::Failed(Some(_)));
        let answered = matches!(attempt, Attempt::Done(_));
        let decided = self
            .decide_budgeted(
                TurnRequest::NAME,
                attempt,
                closed_budgets(req.budgets),
                |m, share| req.on_fallback(m, share),
            )
            .await;
        let admitted = matches!(
            &decided,
            Ok((
                TurnOutcome {
                    admit: Admit::Admitted { .. },
                    ..
                },
                _
            ))
        );
        if answered && admitted {
            // The store admitted the run: its lease is the caller's.
        } else if had || (sent_and_failed && !admitted) {
            // The caller is refused (or decided locally), but the shared
            // store may still run this admission, or ran an earlier one
            // (queued behind a pause): its lease would hold one of the
            // user's runs until its TTL with nobody to release it.
            // Release it when the store answers again.
            self.abandon(req.user, req.invocation_id);
        }
        if answered {
            self.recover_if_dirty();
        }
        let (out, local) = decided?;
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

    /// A run release ([`Outage::Journalled`]): a lease the local store
    /// issued is released there; one of the shared store's is journalled.
    pub(crate) async fn release_journalled(
        &self,
        req: ReleaseRun<'_>,
    ) -> Result<Release, StoreError> {
        let shared = match self.attempt(ReleaseRun::NAME, self.primary.call(req)).await {
            Attempt::Done(r) => Some(r?),
            Attempt::Failed(_) => None,
        };
        // A run admitted locally during an outage holds its lease here.
        let local = if self.local_used() {
            self.inner.fallback.call(req).await?
        } else {
            Release::NotHeld
        };
        match shared {
            Some(Release::Released) => Ok(Release::Released),
            Some(_) => Ok(local),
            None => {
                let journalled = self.journal(
                    ReleaseRun::NAME,
                    Close::Release {
                        user: req.user.to_owned(),
                        invocation_id: req.invocation_id.to_owned(),
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

    /// A run renewal ([`Outage::FailClosed`] but for a lease the local
    /// store issued, renewed there).
    pub(crate) async fn renew_local(&self, req: RenewRun<'_>) -> Result<Option<u64>, StoreError> {
        let cause = match self.attempt(RenewRun::NAME, self.primary.call(req)).await {
            Attempt::Done(Ok(Some(exp))) => return Ok(Some(exp)),
            // Maybe admitted locally during an outage.
            Attempt::Done(Ok(None)) if self.local_used() => {
                return self.inner.fallback.call(req).await;
            }
            Attempt::Done(Ok(None)) => return Ok(None),
            Attempt::Done(Err(e)) => return Err(e),
            Attempt::Failed(cause) => cause,
        };
        // A lease the local store holds can be renewed here; one in the
        // shared store cannot: the client must not believe it holds a lease
        // that is expiring there.
        if self.local_used()
            && let Some(exp) = self.inner.fallback.call(req).await?
        {
            self.event(RenewRun::NAME, true, cause.as_ref());
            return Ok(Some(exp));
        }
        self.event(RenewRun::NAME, false, cause.as_ref());
        Err(Self::closed(RenewRun::NAME, cause))
    }

    /// A token reservation ([`Outage::Owed`]): the local store's charge
    /// (and budgets) owed, a reservation sent and failed remembered as
    /// ambiguous, a retry of a local answer answered again.
    pub(crate) async fn reserve_owed(
        &self,
        req: ReserveRequest<'_>,
    ) -> Result<ReserveOutcome, StoreError> {
        const NAME: &str = ReserveRequest::NAME;
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
        let attempt = self.attempt(NAME, self.primary.call(req)).await;
        let sent_and_failed = matches!(attempt, Attempt::Failed(Some(_)));
        let closed = req.budget.is_some_and(|b| closed_budgets(b.checks));
        let decided = self
            .decide_budgeted(NAME, attempt, closed, |m, share| req.on_fallback(m, share))
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

    /// A settle or refund ([`Outage::Journalled`]): of a reservation the
    /// local store issued, there; of the shared store's, journalled.
    pub(crate) async fn settle_journalled(
        &self,
        req: SettleRequest<'_>,
    ) -> Result<SettleOutcome, StoreError> {
        match req.reservation.fallback {
            Some(tag) if tag == self.inner.tag => return self.settle_local(req).await,
            // Issued by another replica's local store: unknown here.
            Some(_) => return Ok(SettleOutcome::Unknown),
            None => {}
        }
        match self
            .attempt(SettleRequest::NAME, self.primary.call(req))
            .await
        {
            Attempt::Done(r) => r,
            Attempt::Failed(_) => {
                self.journal(
                    SettleRequest::NAME,
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

    /// A single take ([`Outage::Owed`]): a user's turns the local store
    /// took are owed.
    pub(crate) async fn take_one_owed(
        &self,
        req: TakeRequest<'_>,
    ) -> Result<TakeOutcome, StoreError> {
        let (out, local) = self
            .decide(TakeRequest::NAME, self.primary.call(req), |m, share| {
                req.on_fallback(m, share)
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

    /// Clearing a provider key ([`Outage::FailClosed`]): once the shared
    /// store cleared it, this replica's fallback state for it too.
    pub(crate) async fn clear_both(
        &self,
        req: ClearProvider<'_>,
    ) -> Result<ProviderCleared, StoreError> {
        let cleared = self
            .closed_only(ClearProvider::NAME, self.primary.call(req))
            .await?;
        self.inner.fallback.call(req).await?;
        Ok(cleared)
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
