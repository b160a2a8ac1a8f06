//! What the local store decided under fail-open, owed to the shared store
//! and charged there when it answers again (SPEC §6): per user, in numbered
//! batches the store applies once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;

use crate::calendar::{Period, Window};
use crate::spend::{BudgetUnit, Charged};
use crate::store::{BudgetNet, RESERVATION_RETENTION_MS, ReconcileRequest, Reconciled};
use crate::{BucketSpec, Store};

use super::{Attempt, Failover, Recovery};

/// Most ambiguous calls remembered per user until reconciliation; past it
/// the oldest is forgotten (it may then be charged twice).
const MAX_AMBIGUOUS_PER_USER: usize = 1_024;

/// What the local store charged one user, owed to the shared store.
#[derive(Debug, Default)]
pub(super) struct Owed {
    pub(super) turns: Option<BucketSpec>,
    pub(super) tokens: Option<BucketSpec>,
    pub(super) turns_taken: u64,
    pub(super) tokens_net: i64,
    pub(super) ambiguous_reserves: VecDeque<(String, String)>,
    pub(super) ambiguous_admissions: VecDeque<String>,
    /// Open local reservations: (invocation, call) → (estimate charged,
    /// when, what it charged the budgets). Forgotten after the reservation
    /// retention, as the local store forgets them.
    pub(super) open: HashMap<(String, u64), LocalOpen>,
    /// What the fallback charged the user's budgets, net, per window: to
    /// be added to the shared store's spend.
    pub(super) spend: HashMap<(Period, BudgetUnit, u64, u64), i128>,
    /// Charges sent to the shared store whose answer never came: retried
    /// as they are, under their batch number, before anything newer (the
    /// store applies a batch once, so a lost answer charges once).
    inflight: Option<Batch>,
}

/// A reservation the fallback made and has not closed.
#[derive(Debug)]
pub(super) struct LocalOpen {
    /// The tokens it charged.
    pub(super) estimate: u64,
    /// When, ms.
    pub(super) at: u64,
    /// What it charged the budgets.
    pub(super) budget: Option<Box<Charged>>,
}

/// One reconciliation of one user's charges.
#[derive(Debug, Clone)]
struct Batch {
    number: u64,
    turns: BucketSpec,
    tokens: BucketSpec,
    turns_taken: u64,
    tokens_net: i64,
    reserves: Vec<(String, String)>,
    admissions: Vec<String>,
    spend: Vec<BudgetNet>,
}

impl Owed {
    pub(super) fn is_settled(&self) -> bool {
        self.turns_taken == 0
            && self.tokens_net == 0
            && self.ambiguous_reserves.is_empty()
            && self.ambiguous_admissions.is_empty()
            && self.spend.is_empty()
            && self.inflight.is_none()
    }

    /// Owes `delta` to `period`'s budget in `window`.
    pub(super) fn owe_spend(
        &mut self,
        period: Period,
        unit: BudgetUnit,
        window: Window,
        delta: i128,
    ) {
        if delta != 0 {
            *self
                .spend
                .entry((period, unit, window.start_ms, window.end_ms))
                .or_default() += delta;
        }
    }

    pub(super) fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
        if q.len() >= MAX_AMBIGUOUS_PER_USER {
            q.pop_front();
        }
        q.push_back(v);
    }
}

impl<S: Store + Clone> Failover<S> {
    pub(super) fn owe(&self, user: &str, f: impl FnOnce(&mut Owed)) {
        let mut owed = self.inner.owed.lock();
        let entry = match owed.get_mut(user) {
            Some(e) => e,
            None => owed.entry(user.to_owned()).or_default(),
        };
        f(entry);
        self.inner.dirty.store(true, Ordering::Relaxed);
    }

    pub(super) fn spawn_recovery(&self) {
        if self.inner.recovering.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let this = self.clone();
                handle.spawn(async move {
                    let r = this.recover().await;
                    if r.users > 0 || r.replayed > 0 {
                        tracing::info!(
                            ?r,
                            "reconciled the fallback's decisions with the shared store"
                        );
                    }
                    this.inner.recovering.store(false, Ordering::Release);
                });
            }
            Err(_) => self.inner.recovering.store(false, Ordering::Release),
        }
    }

    /// Whether closes or charges wait for the shared store.
    pub fn needs_recovery(&self) -> bool {
        self.inner.dirty.load(Ordering::Relaxed)
    }

    /// Charges what the local store decided to the shared store
    /// ([`Store::reconcile`], first) and applies the journalled closes
    /// (then), as far as the shared store answers; what it does not is kept
    /// for the next call. Goes through the breaker like any operation (a
    /// call while it is open does nothing; one after `open_ms` probes).
    /// Runs by itself after an operation succeeds while anything waits;
    /// the server also calls it periodically so an idle replica recovers.
    pub async fn recover(&self) -> Recovery {
        let _one = self.inner.recovery.lock().await;
        let mut out = Recovery::default();
        self.inner.dirty.store(false, Ordering::Relaxed);
        self.forget_old();
        if !self.reconcile_owed(&mut out).await {
            self.inner.dirty.store(true, Ordering::Relaxed);
            out.remaining = self.inner.journal.lock().entries.len();
            return out;
        }
        self.replay(&mut out).await;
        out.remaining = self.inner.journal.lock().entries.len();
        if out.remaining > 0 {
            self.inner.dirty.store(true, Ordering::Relaxed);
        }
        out
    }

    /// Drops local reservations older than the retention (the local store
    /// has forgotten them too) and users who owe nothing.
    fn forget_old(&self) {
        let now = self.inner.clock.now_ms();
        let mut owed = self.inner.owed.lock();
        owed.retain(|_, o| {
            o.open
                .retain(|_, o| now.saturating_sub(o.at) < RESERVATION_RETENTION_MS);
            !(o.is_settled() && o.open.is_empty())
        });
    }

    /// Answers `false` if the shared store failed (what is left is kept).
    async fn reconcile_owed(&self, out: &mut Recovery) -> bool {
        let users: Vec<String> = {
            let owed = self.inner.owed.lock();
            owed.iter()
                .filter(|(_, o)| !o.is_settled())
                .map(|(u, _)| u.clone())
                .collect()
        };
        for user in users {
            if !self.reconcile_user(&user, out).await {
                return false;
            }
        }
        true
    }

    /// Sends `user`'s batch the store has not answered yet, if any, then
    /// the charges since as a new one. `false` if the store failed.
    async fn reconcile_user(&self, user: &str, out: &mut Recovery) -> bool {
        loop {
            // The batch the store has not answered yet, or the user's
            // charges taken out as a new one (what arrives meanwhile adds
            // up in the entry, for the next batch).
            let (batch, resent) = {
                let mut owed = self.inner.owed.lock();
                let Some(o) = owed.get_mut(user) else {
                    return true;
                };
                match &o.inflight {
                    Some(b) => (b.clone(), true),
                    None if o.is_settled() => return true,
                    None => {
                        let Some(tokens) = o.tokens.or(o.turns) else {
                            return true;
                        };
                        let b = Batch {
                            number: self.inner.next_batch.fetch_add(1, Ordering::Relaxed),
                            turns: o.turns.unwrap_or(tokens),
                            tokens,
                            turns_taken: std::mem::take(&mut o.turns_taken),
                            tokens_net: std::mem::take(&mut o.tokens_net),
                            reserves: std::mem::take(&mut o.ambiguous_reserves).into(),
                            admissions: std::mem::take(&mut o.ambiguous_admissions).into(),
                            spend: std::mem::take(&mut o.spend)
                                .into_iter()
                                .filter(|(_, d)| *d != 0)
                                .map(|((period, unit, start_ms, end_ms), delta)| BudgetNet {
                                    period,
                                    unit,
                                    window: Window { start_ms, end_ms },
                                    delta: delta.clamp(-(1 << 53), 1 << 53) as i64,
                                })
                                .collect(),
                        };
                        o.inflight = Some(b.clone());
                        (b, false)
                    }
                }
            };
            let reserve_refs: Vec<(&str, &str)> = batch
                .reserves
                .iter()
                .map(|(i, r)| (i.as_str(), r.as_str()))
                .collect();
            let admission_refs: Vec<&str> = batch.admissions.iter().map(String::as_str).collect();
            let req = ReconcileRequest {
                user,
                turns: batch.turns,
                tokens: batch.tokens,
                turns_taken: batch.turns_taken,
                tokens_net: batch.tokens_net,
                ambiguous_reserves: &reserve_refs,
                ambiguous_admissions: &admission_refs,
                budgets: &batch.spend,
                replica: self.inner.tag,
                batch: batch.number,
            };
            match self.attempt("reconcile", self.primary.reconcile(req)).await {
                Attempt::Done(Ok(Reconciled {
                    turns,
                    tokens,
                    refunded,
                })) => {
                    out.users += 1;
                    out.turns += turns;
                    out.tokens = out.tokens.saturating_add(tokens);
                    out.refunded += refunded;
                    let mut owed = self.inner.owed.lock();
                    if let Some(o) = owed.get_mut(user) {
                        if o.inflight
                            .as_ref()
                            .is_some_and(|b| b.number == batch.number)
                        {
                            o.inflight = None;
                        }
                        if o.is_settled() && o.open.is_empty() {
                            owed.remove(user);
                        }
                    }
                }
                failed => {
                    // Kept as it is: it may have been applied (a timeout
                    // after it was sent), so it is retried as the same
                    // batch, never merged into a new one.
                    if let Attempt::Done(Err(e)) = &failed {
                        tracing::error!(user, error = %e, "reconciliation refused; charges kept");
                    }
                    return false;
                }
            }
            // A new batch took everything owed when it was sent (what came
            // since marked the store dirty); a batch sent again did not:
            // the charges made since it was first sent follow now.
            if !resent {
                return true;
            }
        }
    }
}
