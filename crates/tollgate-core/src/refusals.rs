//! Refusals answered locally (SPEC §3): a replica the store has just told
//! that a bucket is empty until a time answers the same request locally
//! until then, so a flooding user costs the shared store one call per
//! refill instead of one per request.
//!
//! Only rate refusals are kept — a user's turn bucket (`turn_rate`, from an
//! admission or a take of turns) and a named bucket (`bucket`, the
//! rate-limit service's) — each with the cost refused: a request of that
//! cost is refused by that bucket until the store's hint ends (its level
//! only grows until then), so the local answer is the store's, with a hint
//! that ends when the store's does. A request of another cost asks the
//! store.
//!
//! The table has a fixed number of slots of a fixed size; an entry goes in
//! the slot its key hashes to, replacing the older one there. A run this replica
//! admitted is remembered the same way (by a keyed hash of user and
//! invocation, in a fixed array) so a retry of its admission still asks the
//! store (a live holder's retry is admitted with an empty bucket).

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::decision::{Denial, Limit};

/// The table's default size, entries (`[limits] refusal_cache`).
pub const DEFAULT_REFUSAL_CACHE_ENTRIES: usize = 65_536;

/// What a kept refusal is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bucket {
    /// A user's turn bucket (key: the user).
    Turns,
    /// A named bucket (key: its name and spec, so a refusal under a
    /// spec a reload replaced is not found).
    Named,
}

impl Bucket {
    fn limit(self) -> Limit {
        match self {
            Self::Turns => Limit::TurnRate,
            Self::Named => Limit::Bucket,
        }
    }
}

/// One kept refusal. The key is kept as its hash under this process's
/// random key (64 bits: two keys that share a slot and a hash are
/// 2^-64 odds, and no client can aim for them), so the table's size is
/// fixed whatever the ids' lengths.
#[derive(Debug, Clone, Copy)]
struct Slot {
    bucket: Bucket,
    key: u64,
    cost: u64,
    until_ms: u64,
}

/// The refusals a replica answers locally, and the runs it admitted.
pub(crate) struct Refusals {
    slots: Box<[Mutex<Option<Slot>>]>,
    admitted: Box<[AtomicU64]>,
    hasher: std::hash::RandomState,
    /// Advanced by every [`clear`](Self::clear) and
    /// [`forget`](Self::forget): a refusal decided before it is not kept.
    epoch: AtomicU64,
    answered: AtomicU64,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refusals")
            .field("entries", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Refusals {
    /// A table of `entries` slots (0: nothing is kept, every request asks
    /// the store).
    pub(crate) fn new(entries: usize) -> Self {
        Self {
            slots: (0..entries).map(|_| Mutex::new(None)).collect(),
            admitted: (0..entries).map(|_| AtomicU64::new(0)).collect(),
            hasher: std::hash::RandomState::new(),
            epoch: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        }
    }

    fn hash(&self, v: impl Hash) -> u64 {
        self.hasher.hash_one(v)
    }

    /// The slot of `bucket` `key`, and the key's hash.
    fn slot<K: Hash + ?Sized>(
        &self,
        bucket: Bucket,
        key: &K,
    ) -> Option<(&Mutex<Option<Slot>>, u64)> {
        if self.slots.is_empty() {
            return None;
        }
        let h = self.hash((bucket, key));
        let i = h % self.slots.len() as u64;
        Some((self.slots.get(i as usize)?, h))
    }

    /// The epoch to pass to [`refused`](Self::refused): read before the
    /// store is asked.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The refusal of a request of `cost` from `bucket` `key` at `now`, if
    /// one is kept: the store refused that cost until a time still ahead.
    pub(crate) fn check<K: Hash + ?Sized>(
        &self,
        bucket: Bucket,
        key: &K,
        cost: u64,
        now: u64,
    ) -> Option<Denial> {
        let (slot, h) = self.slot(bucket, key)?;
        let mut s = slot.lock();
        let held = s.as_ref()?;
        if held.bucket != bucket || held.key != h {
            return None;
        }
        if now >= held.until_ms {
            *s = None;
            return None;
        }
        if held.cost != cost {
            return None;
        }
        let retry_after_ms = held.until_ms - now;
        Some(Denial::Limited {
            limit: bucket.limit(),
            retry_after_ms,
        })
    }

    /// Keeps the store's refusal of `cost` from `bucket` `key` until
    /// `until_ms`, unless the table was cleared since `epoch`.
    pub(crate) fn refused<K: Hash + ?Sized>(
        &self,
        bucket: Bucket,
        key: &K,
        cost: u64,
        until_ms: u64,
        epoch: u64,
    ) {
        let Some((slot, h)) = self.slot(bucket, key) else {
            return;
        };
        let mut s = slot.lock();
        // Under the slot's lock: a clear that advanced the epoch before
        // this takes the lock after it, so it removes what this keeps.
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        *s = Some(Slot {
            bucket,
            key: h,
            cost,
            until_ms,
        });
    }

    fn run(&self, user: &str, invocation_id: &str) -> Option<(usize, u64)> {
        if self.admitted.is_empty() {
            return None;
        }
        // 0 marks an empty place.
        let h = self.hash((user, invocation_id)).max(1);
        Some(((h % self.admitted.len() as u64) as usize, h))
    }

    /// Remembers that this replica admitted `invocation_id` of `user`.
    pub(crate) fn admitted(&self, user: &str, invocation_id: &str) {
        if let Some((i, h)) = self.run(user, invocation_id) {
            self.admitted[i].store(h, Ordering::Relaxed);
        }
    }

    /// Whether this replica admitted `invocation_id` of `user` (and has
    /// not since put another run in its place).
    pub(crate) fn was_admitted(&self, user: &str, invocation_id: &str) -> bool {
        self.run(user, invocation_id)
            .is_some_and(|(i, h)| self.admitted[i].load(Ordering::Relaxed) == h)
    }

    /// Drops every kept refusal (a reload).
    pub(crate) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for s in &self.slots {
            *s.lock() = None;
        }
    }

    /// Drops the kept refusal of `bucket` `key` (an admin reset).
    pub(crate) fn forget<K: Hash + ?Sized>(&self, bucket: Bucket, key: &K) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if let Some((slot, h)) = self.slot(bucket, key) {
            let mut s = slot.lock();
            if s.is_some_and(|held| held.bucket == bucket && held.key == h) {
                *s = None;
            }
        }
    }

    /// Counts a refusal answered locally ([`check`](Self::check)'s, given).
    pub(crate) fn count_answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals answered locally so far.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_answered_until_its_end_for_its_cost_only() {
        let r = Refusals::new(16);
        let e = r.epoch();
        r.refused(Bucket::Turns, "u", 1, 1_000, e);
        assert_eq!(
            r.check(Bucket::Turns, "u", 1, 400),
            Some(Denial::Limited {
                limit: Limit::TurnRate,
                retry_after_ms: 600
            })
        );
        assert_eq!(r.check(Bucket::Turns, "u", 2, 400), None, "another cost");
        assert_eq!(r.check(Bucket::Named, "u", 1, 400), None, "another bucket");
        assert_eq!(r.check(Bucket::Turns, "v", 1, 400), None, "another user");
        assert_eq!(r.check(Bucket::Turns, "u", 1, 1_000), None, "ended");
        assert_eq!(r.check(Bucket::Turns, "u", 1, 500), None, "and dropped");
    }

    #[test]
    fn a_clear_or_forget_drops_refusals_and_refuses_older_ones() {
        let r = Refusals::new(16);
        let e = r.epoch();
        r.refused(Bucket::Named, "k", 3, 1_000, e);
        r.clear();
        assert_eq!(r.check(Bucket::Named, "k", 3, 0), None);
        r.refused(Bucket::Named, "k", 3, 1_000, e);
        assert_eq!(
            r.check(Bucket::Named, "k", 3, 0),
            None,
            "decided before the clear"
        );
        let e = r.epoch();
        r.refused(Bucket::Turns, "u", 1, 1_000, e);
        r.forget(Bucket::Turns, "u");
        assert_eq!(r.check(Bucket::Turns, "u", 1, 0), None);
    }

    #[test]
    fn the_table_is_bounded_and_an_empty_one_keeps_nothing() {
        let r = Refusals::new(4);
        let e = r.epoch();
        for i in 0..100 {
            r.refused(Bucket::Turns, &format!("u{i}"), 1, 1_000, e);
        }
        let kept = (0..100)
            .filter(|i| r.check(Bucket::Turns, &format!("u{i}"), 1, 0).is_some())
            .count();
        assert!((1..=4).contains(&kept), "{kept}");
        let none = Refusals::new(0);
        none.refused(Bucket::Turns, "u", 1, 1_000, none.epoch());
        assert_eq!(none.check(Bucket::Turns, "u", 1, 0), None);
        none.admitted("u", "r");
        assert!(!none.was_admitted("u", "r"));
    }

    #[test]
    fn admitted_runs_are_remembered() {
        let r = Refusals::new(1_024);
        r.admitted("u", "r1");
        assert!(r.was_admitted("u", "r1"));
        assert!(!r.was_admitted("u", "r2"));
        assert!(!r.was_admitted("v", "r1"));
    }
}
