//! Takes from named buckets (SPEC §2, §5), as pure transitions: the
//! multi-bucket take (several buckets and a cooldown, all or nothing, the
//! wait the largest of theirs) and the single take that never waits.
//!
//! Nothing here reads a clock or touches a store: each function is given
//! `now` and the saved states, and answers the decision with the states to
//! save. `MemoryStore` reads the states under the keys' locks, calls these
//! and writes back what they answer; the Redis scripts `take_many.lua` and
//! `take_one.lua` restate them (checked by
//! `crates/tollgate-redis/tests/differential.rs`).

use crate::bucket::{self, BucketSpec, BucketState, Take, Transition};
use crate::store::{BucketTake, MultiTake, TakeOutcome};

/// A cooldown checked with a multi-bucket take: when it ends, and how long
/// the take may wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooldown {
    /// Its end, ms (0, or a past time: none).
    pub until_ms: u64,
    /// Longest acceptable wait for it to pass, ms.
    pub max_wait_ms: u64,
}

/// What a multi-bucket take answers and saves.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct MultiTransition {
    /// The answer.
    pub outcome: MultiTake,
    /// The state to save for each take, in the order of the takes, with its
    /// expiry (ms): after a grant each bucket's state after its take, after
    /// any refusal each bucket only refilled. A key named twice appears
    /// twice; its last entry is the one to keep.
    pub states: Vec<(BucketState, u64)>,
}

/// Takes from every bucket of `takes` at once, or from none.
///
/// `states[i]` is the saved (live) state of `takes[i]`'s key before the
/// take (`None`: a full bucket). A key named twice is taken twice, in
/// order: each take starts from the state the previous take of that key
/// left. Granted when every take is granted and the cooldown (if any) ends
/// within its `max_wait_ms`; the wait is then the largest of the takes'
/// waits and the cooldown's remainder. Otherwise nothing is taken: the
/// first bucket that can never grant its cost is named
/// ([`MultiTake::ExceedsCapacity`]), else the refusal with the largest
/// retry hint (the first of equal ones; `None` for the cooldown).
///
/// # Panics
///
/// If `states` and `takes` differ in length.
pub fn take_many(
    takes: &[BucketTake<'_>],
    states: &[Option<BucketState>],
    cooldown: Option<Cooldown>,
    now: u64,
) -> MultiTransition {
    assert_eq!(takes.len(), states.len(), "one state per take");
    let mut transitions: Vec<Transition<Take>> = Vec::with_capacity(takes.len());
    for (i, t) in takes.iter().enumerate() {
        let before = takes[..i]
            .iter()
            .rposition(|p| p.key == t.key)
            .map_or(states[i], |j| Some(transitions[j].state));
        transitions.push(bucket::take(&t.spec, before, now, t.cost, t.max_wait_ms));
    }
    let mut wait = 0u64;
    let mut refused: Option<(Option<usize>, u64)> = None;
    let mut exceeds = None;
    for (i, t) in transitions.iter().enumerate() {
        match t.outcome {
            Take::Granted { wait_ms } => wait = wait.max(wait_ms),
            Take::Refused { retry_after_ms } => {
                if refused.is_none_or(|(_, r)| retry_after_ms > r) {
                    refused = Some((Some(i), retry_after_ms));
                }
            }
            Take::ExceedsCapacity => {
                exceeds.get_or_insert(i);
            }
        }
    }
    if let Some(c) = cooldown {
        let remaining = c.until_ms.saturating_sub(now);
        if remaining > c.max_wait_ms {
            let hint = remaining - c.max_wait_ms;
            if refused.is_none_or(|(_, r)| hint > r) {
                refused = Some((None, hint));
            }
        } else {
            wait = wait.max(remaining);
        }
    }
    let granted = exceeds.is_none() && refused.is_none();
    let states = takes
        .iter()
        .zip(states)
        .zip(&transitions)
        .map(|((t, s), tr)| {
            if granted {
                (tr.state, tr.expires_at)
            } else {
                let r = bucket::refill(&t.spec, *s, now);
                (r, bucket::expires_at(&t.spec, r.level, now))
            }
        })
        .collect();
    let outcome = if let Some(index) = exceeds {
        MultiTake::ExceedsCapacity { index }
    } else if let Some((index, retry_after_ms)) = refused {
        MultiTake::Refused {
            index,
            retry_after_ms,
        }
    } else {
        MultiTake::Granted { wait_ms: wait }
    };
    MultiTransition { outcome, states }
}

/// [`take_many`] of the single take `take` without a cooldown, without
/// allocating: the same outcome, and the one state to save with its expiry
/// (after a refusal, the bucket only refilled). `state` is the saved (live)
/// state of `take`'s key.
#[inline]
pub fn take_single(
    take: &BucketTake<'_>,
    state: Option<BucketState>,
    now: u64,
) -> (MultiTake, (BucketState, u64)) {
    let t = bucket::take(&take.spec, state, now, take.cost, take.max_wait_ms);
    let outcome = match t.outcome {
        Take::Granted { wait_ms } => {
            return (MultiTake::Granted { wait_ms }, (t.state, t.expires_at));
        }
        Take::Refused { retry_after_ms } => MultiTake::Refused {
            index: Some(0),
            retry_after_ms,
        },
        Take::ExceedsCapacity => MultiTake::ExceedsCapacity { index: 0 },
    };
    let r = bucket::refill(&take.spec, state, now);
    (outcome, (r, bucket::expires_at(&take.spec, r.level, now)))
}

/// Takes `cost` from a bucket of `spec` without waiting, or nothing.
/// `state` is the saved (live) state, `None` if the bucket does not exist
/// (a full bucket). Answers the outcome, and the state to save with its
/// expiry: after a grant, or after a refusal of a bucket that exists (its
/// refilled level); a refusal of a missing bucket saves nothing (as turn
/// admission does).
pub fn take_one(
    spec: &BucketSpec,
    state: Option<BucketState>,
    now: u64,
    cost: u64,
) -> (TakeOutcome, Option<(BucketState, u64)>) {
    let t = bucket::take(spec, state, now, cost, 0);
    let save = (matches!(t.outcome, Take::Granted { .. }) || state.is_some())
        .then_some((t.state, t.expires_at));
    (TakeOutcome::new(t.outcome, spec, t.state.level), save)
}
