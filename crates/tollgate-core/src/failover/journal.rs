//! The journal of closes (settles, refunds, releases) of what the shared
//! store issued, kept while it fails and replayed when it answers (SPEC §6).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crate::money::TokenSplit;
use crate::spend::{BudgetCheck, BudgetRequest};
use crate::store::{RESERVATION_RETENTION_MS, ReservationId, SettleOutcome, SettleRequest};
use crate::{BucketSpec, Store, StoreError, StoreErrorKind};

use super::{Attempt, Failover, Recovery};

/// A journalled settle's budgets: the checks as the caller named them
/// (their windows cover the journal's life, the reservation retention)
/// and the usage split.
#[derive(Debug)]
pub(super) struct JournalledBudget {
    pub(super) checks: Vec<BudgetCheck>,
    pub(super) split: Option<TokenSplit>,
}

/// A close waiting for the shared store.
#[derive(Debug)]
pub(super) enum Close {
    Settle {
        user: String,
        tokens: BucketSpec,
        reservation: ReservationId,
        actual: Option<u64>,
        budget: Option<Box<JournalledBudget>>,
    },
    Release {
        user: String,
        invocation_id: String,
    },
    /// The release of an admission the caller was refused after it was
    /// sent to the shared store (it may still run there): replayed as a
    /// release, dropped if this replica admits the run meanwhile.
    Abandoned {
        user: String,
        invocation_id: String,
    },
}

/// The operation an abandoned admission's release is counted under when
/// the journal is full.
const ABANDONED: &str = "admit_turn";

fn is_abandoned(c: &Close, user: &str, invocation_id: &str) -> bool {
    matches!(c, Close::Abandoned { user: u, invocation_id: i } if u == user && i == invocation_id)
}

#[derive(Debug, Default)]
pub(super) struct Journal {
    pub(super) entries: VecDeque<(u64, Close)>,
    pub(super) expired: u64,
}

impl<S: Store + Clone> Failover<S> {
    /// Keeps a close for the shared store; `Err` when the journal is full.
    pub(super) fn journal(&self, op: &'static str, close: Close) -> Result<(), StoreError> {
        let mut j = self.inner.journal.lock();
        self.push(&mut j, op, close)
    }

    /// [`journal`](Self::journal) under the journal's lock.
    fn push(&self, j: &mut Journal, op: &'static str, close: Close) -> Result<(), StoreError> {
        let now = self.inner.clock.now_ms();
        Self::expire(j, now);
        if j.entries.len() >= self.inner.journal_capacity {
            self.count_full(op);
            return Err(StoreError::new(
                StoreErrorKind::Full,
                format!(
                    "close journal full ({} closes wait for the shared store): retry later",
                    self.inner.journal_capacity
                ),
            ));
        }
        j.entries.push_back((now, close));
        self.inner.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Journals the release of an admission the caller was refused after
    /// it was sent ([`Close::Abandoned`]), once per run. With the journal
    /// full it is not kept: the lease, if the store took one, ends by its
    /// TTL.
    pub(super) fn abandon(&self, user: &str, invocation_id: &str) {
        let mut j = self.inner.journal.lock();
        if j.entries
            .iter()
            .any(|(_, c)| is_abandoned(c, user, invocation_id))
        {
            return;
        }
        let close = Close::Abandoned {
            user: user.to_owned(),
            invocation_id: invocation_id.to_owned(),
        };
        match self.push(&mut j, ABANDONED, close) {
            // Set under the lock, with the entry there: a look that finds
            // the flag set finds the entry.
            Ok(()) => self.inner.abandoned.store(true, Ordering::Relaxed),
            Err(_) => tracing::warn!(
                user,
                invocation_id,
                "journal full: a refused admission the store may still run keeps its lease to its TTL"
            ),
        }
    }

    /// Takes the journalled release of an abandoned admission of this run
    /// out of the journal, if one waits: `true` if it did. A new
    /// admission of the run takes it out before it is sent (the store may
    /// refresh the lease for it) and puts it back unless the store
    /// admitted the run. One the recovery already took out and is sending
    /// is not seen.
    pub(super) fn take_abandoned(&self, user: &str, invocation_id: &str) -> bool {
        if !self.inner.abandoned.load(Ordering::Relaxed) {
            return false;
        }
        let mut j = self.inner.journal.lock();
        let before = j.entries.len();
        j.entries
            .retain(|(_, c)| !is_abandoned(c, user, invocation_id));
        let taken = j.entries.len() < before;
        if !j
            .entries
            .iter()
            .any(|(_, c)| matches!(c, Close::Abandoned { .. }))
        {
            self.inner.abandoned.store(false, Ordering::Relaxed);
        }
        taken
    }

    fn expire(j: &mut Journal, now: u64) {
        while let Some((at, close)) = j.entries.front() {
            if now.saturating_sub(*at) < RESERVATION_RETENTION_MS {
                break;
            }
            tracing::warn!(
                ?close,
                "journalled close outlived the reservation retention: dropped"
            );
            j.entries.pop_front();
            j.expired += 1;
        }
    }

    pub(super) async fn replay(&self, out: &mut Recovery) {
        loop {
            let next = {
                let mut j = self.inner.journal.lock();
                Self::expire(&mut j, self.inner.clock.now_ms());
                j.entries.pop_front()
            };
            let Some((at, close)) = next else { return };
            let done = match &close {
                Close::Settle {
                    user,
                    tokens,
                    reservation,
                    actual,
                    budget,
                } => {
                    // Alerts a replayed settle crosses are not reported
                    // (the caller was answered long ago).
                    let req = SettleRequest {
                        user,
                        tokens: *tokens,
                        reservation,
                        actual: *actual,
                        budget: budget.as_deref().map(|b| BudgetRequest {
                            checks: &b.checks,
                            price: None,
                            split: b.split,
                            alerts: &[],
                        }),
                    };
                    match self.attempt("settle", self.primary.settle(req)).await {
                        Attempt::Done(r) => {
                            if let Ok(SettleOutcome::Unknown) = r {
                                tracing::warn!(user, %reservation, "journalled close of a reservation the shared store no longer knows");
                            }
                            true
                        }
                        Attempt::Failed(_) => false,
                    }
                }
                Close::Release {
                    user,
                    invocation_id,
                }
                | Close::Abandoned {
                    user,
                    invocation_id,
                } => matches!(
                    self.attempt("release_run", self.primary.release_run(user, invocation_id))
                        .await,
                    Attempt::Done(_)
                ),
            };
            if !done {
                self.inner.journal.lock().entries.push_front((at, close));
                return;
            }
            out.replayed += 1;
        }
    }
}
