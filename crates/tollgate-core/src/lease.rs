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
mod tests {
    use super::*;

    fn params() -> TurnParams {
        TurnParams {
            turns: BucketSpec::new(20, 60_000, 5).unwrap(),
            max_runs: 2,
            lease_ttl_ms: 120_000,
            concurrency_retry_ms: 1_000,
        }
    }

    #[test]
    fn lease_acquire_refresh_full_and_release_by_id() {
        let mut s = LeaseSet::default();
        assert_eq!(
            s.acquire(0, "a", 100, 2, 1_000),
            Acquire::Acquired {
                expires_at: 100,
                refreshed: false
            }
        );
        assert_eq!(
            s.acquire(10, "a", 100, 2, 1_000),
            Acquire::Acquired {
                expires_at: 110,
                refreshed: true
            }
        );
        let _ = s.acquire(20, "b", 100, 2, 1_000);
        // Full: earliest expiry 110 - 30 = 80 < 1,000.
        assert_eq!(
            s.acquire(30, "c", 100, 2, 1_000),
            Acquire::Full { retry_after_ms: 80 }
        );
        // Hint capped at concurrency_retry_ms.
        assert_eq!(
            s.acquire(30, "c", 100, 2, 50),
            Acquire::Full { retry_after_ms: 50 }
        );
        assert!(!s.release(30, "c"));
        assert!(s.release(30, "a"));
        assert!(!s.release(30, "a"));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn renew_only_live_members_and_expiry_reclaims() {
        let mut s = LeaseSet::default();
        let _ = s.acquire(0, "a", 100, 1, 1_000);
        assert_eq!(s.renew(50, "a", 100), Some(150));
        assert_eq!(s.renew(50, "zz", 100), None);
        assert_eq!(s.renew(150, "a", 100), None, "expired at 150: lost");
        assert_eq!(s.len(), 0, "never re-added");
        let _ = s.acquire(200, "b", 100, 1, 1_000);
        assert_eq!(s.purge(300), 1);
        assert_eq!(s.expires_at(), None);
    }

    #[test]
    fn admission_example_4_concurrency_charges_nothing() {
        let p = params();
        let mut leases = LeaseSet::default();
        let mut bucket = None;
        for id in ["r1", "r2"] {
            let t = admit_turn(&p, bucket, &mut leases, 0, id);
            assert!(matches!(t.outcome, Admit::Admitted { .. }));
            bucket = t.bucket.map(|b| b.0).or(bucket);
        }
        let level = bucket.unwrap().level;
        let t = admit_turn(&p, bucket, &mut leases, 0, "r3");
        assert_eq!(
            t.outcome,
            Admit::Denied(Denial::Limited {
                limit: Limit::Concurrency,
                retry_after_ms: 1_000
            })
        );
        assert_eq!(t.bucket.unwrap().0.level, level, "turn bucket not charged");
        assert!(leases.release(0, "r1"));
        let t = admit_turn(&p, bucket, &mut leases, 0, "r3");
        assert!(matches!(t.outcome, Admit::Admitted { .. }));
        // r2 abandoned: after its TTL a new turn gets in and it is reclaimed.
        let b = t.bucket.map(|b| b.0);
        let t = admit_turn(&p, b, &mut leases, 119_999, "r4");
        assert!(matches!(t.outcome, Admit::Denied(_)));
        leases.release(0, "r3");
        let t = admit_turn(&p, b, &mut leases, 120_000, "r4");
        assert!(matches!(t.outcome, Admit::Admitted { .. }));
        assert_eq!(t.reclaimed, 1);
    }

    #[test]
    fn admission_refresh_is_not_charged() {
        let p = params();
        let mut leases = LeaseSet::default();
        let t = admit_turn(&p, None, &mut leases, 0, "r1");
        let b = t.bucket.unwrap().0;
        let t2 = admit_turn(&p, Some(b), &mut leases, 5, "r1");
        assert_eq!(
            t2.outcome,
            Admit::Admitted {
                lease_expires_at: 120_005,
                refreshed: true
            }
        );
        assert_eq!(t2.bucket, None);
    }

    #[test]
    fn both_fail_reports_larger_hint_ties_concurrency() {
        let mut p = params();
        p.max_runs = 1;
        let mut leases = LeaseSet::default();
        let empty = Some(BucketState {
            level: 0,
            ts: 0,
            period_ms: 60_000,
        });
        let _ = leases.acquire(0, "x", 120_000, 1, 1_000);
        // Turn hint 3,000 > concurrency hint 1,000.
        let t = admit_turn(&p, empty, &mut leases, 0, "y");
        assert_eq!(t.outcome.denial_limit(), Some(Limit::TurnRate));
        // Tie: turn hint 1,000 (2/3 token refilled) vs concurrency 1,000.
        let t = admit_turn(&p, empty, &mut leases, 2_000, "y");
        assert_eq!(t.outcome.denial_limit(), Some(Limit::Concurrency));
        assert_eq!(t.bucket.unwrap().0.level, 40_000, "nothing taken");
    }

    impl Admit {
        fn denial_limit(&self) -> Option<Limit> {
            match self {
                Admit::Denied(d) => Some(d.limit()),
                _ => None,
            }
        }
    }

    #[test]
    fn session_fencing() {
        let mut s = SessionLease::default();
        assert!(!s.fence_is_current(0));
        let g = s.acquire(0, "h1", 100);
        assert_eq!(
            g,
            SessionAcquire::Acquired(SessionGrant {
                fence: 1,
                expires_at_ms: 100
            })
        );
        // Refresh by the live holder keeps the number.
        assert!(matches!(s.acquire(10, "h1", 100), SessionAcquire::Acquired(g) if g.fence == 1));
        assert_eq!(
            s.acquire(20, "h2", 100),
            SessionAcquire::Busy { retry_after_ms: 90 }
        );
        assert_eq!(s.renew(20, "h2", 100), None);
        assert!(!s.release(20, "h2"));
        // h1's lease lapses; h2 takes over with a new number.
        assert!(matches!(s.acquire(110, "h2", 100), SessionAcquire::Acquired(g) if g.fence == 2));
        assert!(!s.fence_is_current(1));
        assert!(s.fence_is_current(2));
        assert_eq!(s.renew(120, "h1", 100), None);
        assert!(s.release(120, "h2"));
        // The same holder acquiring again after release is a new grant.
        assert!(matches!(s.acquire(130, "h2", 100), SessionAcquire::Acquired(g) if g.fence == 3));
    }
}
