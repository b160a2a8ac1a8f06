//! Run leases, turn admission (SPEC §3) and session leases with fencing
//! (SPEC §4), as pure transitions on plain state.

use serde::{Deserialize, Serialize};

use crate::bucket::{self, BucketSpec, BucketState, Take, clamp_ttl};
use crate::decision::{Denial, Limit};

/// A user's live run leases: invocation id → expiry (ms).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseSet {
    members: Vec<(Box<str>, u64)>,
}

/// The answer to a lease acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Acquire {
    /// Held until `expires_at`. `refreshed`: the invocation already held a
    /// live lease (an idempotent retry; nothing is charged again).
    Acquired {
        /// New expiry, ms.
        expires_at: u64,
        /// Whether this was a refresh of a live lease.
        refreshed: bool,
    },
    /// The set is full.
    Full {
        /// `min(earliest expiry - now, concurrency_retry_ms)`, at least 1.
        retry_after_ms: u64,
    },
}

impl LeaseSet {
    /// Drops expired members (expiry `<= now`); returns how many were
    /// reclaimed.
    pub fn purge(&mut self, now: u64) -> usize {
        let before = self.members.len();
        self.members.retain(|(_, exp)| *exp > now);
        self.shrink();
        before - self.members.len()
    }

    /// An empty set holds no allocation (idle users cost little).
    fn shrink(&mut self) {
        if self.members.is_empty() {
            self.members = Vec::new();
        }
    }

    /// Live members (call [`purge`](Self::purge) first for an exact count).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members and their expiries.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.members.iter().map(|(id, exp)| (&**id, *exp))
    }

    /// The latest expiry: the set's key expires with it.
    pub fn expires_at(&self) -> Option<u64> {
        self.members.iter().map(|(_, e)| *e).max()
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.members.iter().position(|(m, _)| &**m == id)
    }

    /// What [`acquire`](Self::acquire) would answer, without changing
    /// anything. Expects a purged set.
    pub fn check(&self, now: u64, id: &str, ttl_ms: u64, cap: u32, retry_ms: u64) -> Acquire {
        let expires_at = now.saturating_add(clamp_ttl(ttl_ms));
        if let Some(i) = self.position(id) {
            return Acquire::Acquired {
                // A refresh pushes the expiry; it never shortens it.
                expires_at: expires_at.max(self.members[i].1),
                refreshed: true,
            };
        }
        if self.members.len() < cap as usize {
            return Acquire::Acquired {
                expires_at,
                refreshed: false,
            };
        }
        let earliest = self.members.iter().map(|(_, e)| *e).min().unwrap_or(now);
        Acquire::Full {
            retry_after_ms: earliest.saturating_sub(now).min(retry_ms).max(1),
        }
    }

    /// Acquire a lease for `id`: refresh a live one, else add it below `cap`,
    /// else answer full. Purges expired members first.
    pub fn acquire(&mut self, now: u64, id: &str, ttl_ms: u64, cap: u32, retry_ms: u64) -> Acquire {
        self.purge(now);
        let answer = self.check(now, id, ttl_ms, cap, retry_ms);
        if let Acquire::Acquired { expires_at, .. } = answer {
            self.put(id, expires_at);
        }
        answer
    }

    fn put(&mut self, id: &str, expires_at: u64) {
        match self.position(id) {
            Some(i) => self.members[i].1 = expires_at,
            None => self.members.push((id.into(), expires_at)),
        }
    }

    /// Push the expiry of a live member to `now + ttl_ms` (never earlier
    /// than it was). `None`: the lease is gone (lost); it is never re-added.
    pub fn renew(&mut self, now: u64, id: &str, ttl_ms: u64) -> Option<u64> {
        self.purge(now);
        let i = self.position(id)?;
        let expires_at = now.saturating_add(clamp_ttl(ttl_ms)).max(self.members[i].1);
        self.members[i].1 = expires_at;
        Some(expires_at)
    }

    /// Remove the lease of `id`, and only that one. `false`: it held nothing.
    pub fn release(&mut self, now: u64, id: &str) -> bool {
        self.purge(now);
        match self.position(id) {
            Some(i) => {
                self.members.swap_remove(i);
                self.shrink();
                true
            }
            None => false,
        }
    }
}

/// Parameters of a turn admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnParams {
    /// The turn bucket (taken with cost 1, max wait 0).
    pub turns: BucketSpec,
    /// Concurrent runs allowed.
    pub max_runs: u32,
    /// Run lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Cap on the concurrency retry hint, ms.
    pub concurrency_retry_ms: u64,
}

/// The answer to a turn admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Admit {
    /// Admitted; the run lease expires at `lease_expires_at`.
    Admitted {
        /// Run lease expiry, ms.
        lease_expires_at: u64,
        /// The invocation already held a live lease: nothing charged.
        refreshed: bool,
    },
    /// Denied; nothing taken.
    Denied(Denial),
}

/// A turn admission's result: the answer, the turn bucket's state to save
/// (with its expiry) and how many leaked leases expiry reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct AdmitTransition {
    /// The answer.
    pub outcome: Admit,
    /// Turn bucket state to save and its expiry; `None`: leave it as it is.
    pub bucket: Option<(BucketState, u64)>,
    /// Leases dropped because they had expired.
    pub reclaimed: usize,
}

/// Atomic, all-or-nothing turn admission: turn bucket (cost 1, no wait) and
/// run lease. If either fails nothing is taken; if both fail the one with the
/// larger hint is reported (ties: concurrency). A live holder retrying is
/// refreshed and charged nothing.
pub fn admit_turn(
    p: &TurnParams,
    bucket: Option<BucketState>,
    leases: &mut LeaseSet,
    now: u64,
    invocation_id: &str,
) -> AdmitTransition {
    let reclaimed = leases.purge(now);
    let lease = leases.check(
        now,
        invocation_id,
        p.lease_ttl_ms,
        p.max_runs,
        p.concurrency_retry_ms,
    );
    if let Acquire::Acquired {
        expires_at,
        refreshed: true,
    } = lease
    {
        leases.put(invocation_id, expires_at);
        return AdmitTransition {
            outcome: Admit::Admitted {
                lease_expires_at: expires_at,
                refreshed: true,
            },
            bucket: None,
            reclaimed,
        };
    }
    let t = bucket::take(&p.turns, bucket, now, 1, 0);
    let saved = Some((t.state, t.expires_at));
    let turn_hint = match t.outcome {
        Take::Granted { .. } => None,
        Take::Refused { retry_after_ms } => Some(retry_after_ms),
        // cost 1 <= capacity: unreachable for a valid spec; treat as a
        // refusal with a one-period hint rather than panic.
        Take::ExceedsCapacity => Some(p.turns.period_ms()),
    };
    let outcome = match (lease, turn_hint) {
        (Acquire::Acquired { expires_at, .. }, None) => {
            leases.put(invocation_id, expires_at);
            Admit::Admitted {
                lease_expires_at: expires_at,
                refreshed: false,
            }
        }
        (Acquire::Acquired { .. }, Some(retry_after_ms)) => Admit::Denied(Denial::Limited {
            limit: Limit::TurnRate,
            retry_after_ms,
        }),
        (Acquire::Full { retry_after_ms }, None) => Admit::Denied(Denial::Limited {
            limit: Limit::Concurrency,
            retry_after_ms,
        }),
        (Acquire::Full { retry_after_ms: c }, Some(r)) => Admit::Denied(if r > c {
            Denial::Limited {
                limit: Limit::TurnRate,
                retry_after_ms: r,
            }
        } else {
            Denial::Limited {
                limit: Limit::Concurrency,
                retry_after_ms: c,
            }
        }),
    };
    let bucket = match outcome {
        Admit::Admitted { .. } => saved,
        // Take nothing: keep only the refilled level (same observable state).
        Admit::Denied(_) => t_refilled(&p.turns, bucket, now),
    };
    AdmitTransition {
        outcome,
        bucket,
        reclaimed,
    }
}

fn t_refilled(
    spec: &BucketSpec,
    state: Option<BucketState>,
    now: u64,
) -> Option<(BucketState, u64)> {
    state.map(|s| {
        let r = bucket::refill(spec, Some(s), now);
        (r, bucket::expires_at(spec, r.level, now))
    })
}

/// A session's lease and fencing counter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLease {
    /// The current holder token and its expiry, if any (may have expired).
    pub holder: Option<(Box<str>, u64)>,
    /// The latest issued fencing number (0: never granted).
    pub fence: u64,
}

/// A granted session lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionGrant {
    /// The fencing number: appends must carry it.
    pub fence: u64,
    /// Lease expiry, ms.
    pub expires_at_ms: u64,
}

/// The answer to a session lease acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SessionAcquire {
    /// Granted (a new holder gets a new fence; a live holder keeps its own).
    Acquired(SessionGrant),
    /// Another holder has it live.
    Busy {
        /// Its remaining TTL, ms (at least 1).
        retry_after_ms: u64,
    },
}

impl SessionLease {
    fn live_holder(&self, now: u64) -> Option<(&str, u64)> {
        match &self.holder {
            Some((h, exp)) if *exp > now => Some((h, *exp)),
            _ => None,
        }
    }

    /// Acquire for `holder`: refresh a live lease it holds (same fence),
    /// grant to a new holder when free (fence + 1), else busy.
    pub fn acquire(&mut self, now: u64, holder: &str, ttl_ms: u64) -> SessionAcquire {
        let mut expires_at_ms = now.saturating_add(clamp_ttl(ttl_ms));
        match self.live_holder(now) {
            Some((h, exp)) if h == holder => expires_at_ms = expires_at_ms.max(exp),
            Some((_, exp)) => {
                return SessionAcquire::Busy {
                    retry_after_ms: (exp - now).max(1),
                };
            }
            None => self.fence += 1,
        }
        self.holder = Some((holder.into(), expires_at_ms));
        SessionAcquire::Acquired(SessionGrant {
            fence: self.fence,
            expires_at_ms,
        })
    }

    /// Renew: only the live holder's token works. `None`: not the holder.
    pub fn renew(&mut self, now: u64, holder: &str, ttl_ms: u64) -> Option<SessionGrant> {
        match self.live_holder(now) {
            Some((h, exp)) if h == holder => {
                let expires_at_ms = now.saturating_add(clamp_ttl(ttl_ms)).max(exp);
                self.holder = Some((holder.into(), expires_at_ms));
                Some(SessionGrant {
                    fence: self.fence,
                    expires_at_ms,
                })
            }
            _ => None,
        }
    }

    /// Release: only the live holder's token works. The fence is kept.
    pub fn release(&mut self, now: u64, holder: &str) -> bool {
        match self.live_holder(now) {
            Some((h, _)) if h == holder => {
                self.holder = None;
                true
            }
            _ => false,
        }
    }

    /// Whether an append carrying `fence` is accepted: it must equal the
    /// latest issued number.
    pub fn fence_is_current(&self, fence: u64) -> bool {
        self.fence != 0 && fence == self.fence
    }
}

#[cfg(test)]
mod tests;
