//! Named keys: buckets, cooldowns and AIMD states. The rules are core's
//! pure transitions ([`take`], [`bucket`], [`aimd`](crate::aimd)); this file
//! looks the keys up under their shards' locks and applies them.

use super::MemoryStore;
use super::shards::{Expiring, Full};
use crate::aimd::{AimdParams, AimdState};
use crate::bucket::{BucketState, EXPIRY_GRACE_MS, MAX_SCALED};
use crate::fair::{self, FairState, Gate};
use crate::store::{
    BucketRef, BucketTake, CooldownCheck, FairCheck, MultiTake, ProviderCleared, TakeOutcome,
    TakeRequest,
};
use crate::take::{self, Cooldown};

/// What a named key holds, in three words (a bucket's state inline; rare
/// buckets and AIMD states boxed), so a named-key slot (with its two-word
/// key, 40 bytes) stays small: every keyed check reads one.
#[derive(Default)]
pub(super) enum KeyEntry {
    #[default]
    Empty,
    /// A bucket, packed: its period in 32 bits (up to 49 days: every
    /// rate's), `ts` in the low 48 bits of `ts_delta` (ms: until the year
    /// 10889) and its expiry as a 32-bit delta from `ts` (`delta_lo`, and
    /// the high 16 bits of `ts_delta`). See [`KeyEntry::bucket_of`].
    Bucket {
        period_ms: u32,
        delta_lo: u16,
        level: i64,
        ts_delta: u64,
    },
    /// A bucket that does not pack (a longer period, an expiry more than
    /// 49 days after `ts` or before it, a `ts` past 2^48), and its expiry.
    LongBucket(Box<(BucketState, u64)>),
    Cooldown(u64),
    Aimd(Box<(AimdState, u64)>),
    /// A provider key's fair-sharing state and its expiry.
    Fair(Box<(FairState, u64)>),
}

const _: () = assert!(std::mem::size_of::<KeyEntry>() == 24);

/// Bits of `ts` in a packed bucket.
const TS_BITS: u32 = 48;
const TS_MASK: u64 = (1 << TS_BITS) - 1;

impl Expiring for KeyEntry {
    fn expires_at(&self) -> u64 {
        match self {
            KeyEntry::Empty => 0,
            KeyEntry::Bucket {
                delta_lo, ts_delta, ..
            } => unpack_exp(*delta_lo, *ts_delta),
            KeyEntry::LongBucket(b) => b.1,
            KeyEntry::Aimd(a) => a.1,
            KeyEntry::Fair(f) => f.1,
            // Kept a grace period past its end, like Redis keeps the key
            // (by real time) while a stepped-back clock may still see it.
            KeyEntry::Cooldown(until) => until.saturating_add(EXPIRY_GRACE_MS),
        }
    }
}

/// A packed bucket's expiry: its `ts` plus the 32-bit delta.
#[inline]
fn unpack_exp(delta_lo: u16, ts_delta: u64) -> u64 {
    let delta = ((ts_delta >> TS_BITS) << 16) | u64::from(delta_lo);
    (ts_delta & TS_MASK) + delta
}

impl KeyEntry {
    /// A bucket's state with its expiry: packed in place when it fits
    /// (always, but for the cases [`KeyEntry::LongBucket`] names), else
    /// boxed. Either way [`bucket`](Self::bucket) and `expires_at` give
    /// back exactly what was stored.
    #[inline]
    fn bucket_of(state: BucketState, exp: u64) -> Self {
        let delta = exp
            .checked_sub(state.ts)
            .and_then(|d| u32::try_from(d).ok());
        match (u32::try_from(state.period_ms), delta) {
            (Ok(period_ms), Some(delta)) if state.ts <= TS_MASK => KeyEntry::Bucket {
                period_ms,
                delta_lo: delta as u16,
                level: state.level,
                ts_delta: state.ts | (u64::from(delta >> 16) << TS_BITS),
            },
            _ => KeyEntry::LongBucket(Box::new((state, exp))),
        }
    }

    /// The live bucket state held, if any.
    #[inline]
    fn bucket(&self, now: u64) -> Option<BucketState> {
        match *self {
            KeyEntry::Bucket {
                period_ms,
                delta_lo,
                level,
                ts_delta,
            } if unpack_exp(delta_lo, ts_delta) > now => Some(BucketState {
                level,
                ts: ts_delta & TS_MASK,
                period_ms: u64::from(period_ms),
            }),
            KeyEntry::LongBucket(ref b) if b.1 > now => Some(b.0),
            _ => None,
        }
    }

    /// The live fair-sharing state held, if any.
    pub(super) fn fair(&self, now: u64) -> Option<FairState> {
        match self {
            KeyEntry::Fair(f) if f.1 > now => Some(f.0.clone()),
            _ => None,
        }
    }

    /// The live AIMD state held, if any.
    fn aimd(&self, now: u64) -> Option<AimdState> {
        match self {
            KeyEntry::Aimd(a) if a.1 > now => Some(a.0),
            _ => None,
        }
    }
}

impl MemoryStore {
    /// One bucket: a single probe under a single lock, no allocation.
    #[inline]
    pub(super) fn take_single_now(&self, t: &BucketTake<'_>) -> Result<MultiTake, Full> {
        let now = self.now();
        self.inner.keys.with(t.key, now, |e| {
            let (outcome, (state, exp)) = take::take_single(t, e.bucket(now), now);
            *e = KeyEntry::bucket_of(state, exp);
            outcome
        })
    }

    pub(super) fn take_many_now(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
    ) -> Result<MultiTake, Full> {
        if let ([t], None) = (takes, cooldown) {
            return self.take_single_now(t);
        }
        let now = self.now();
        let mut keys: Vec<&str> = takes.iter().map(|t| t.key).collect();
        if let Some(c) = cooldown {
            keys.push(c.key);
        }
        let mut locked = self.inner.keys.lock_many(&keys);
        // Room for every new key first: a refusal must change nothing.
        locked.check_room(now)?;
        let states: Vec<Option<BucketState>> = (0..takes.len())
            .map(|n| locked.with(n, now, |e| e.bucket(now)))
            .collect::<Result<_, Full>>()?;
        let cooldown = match cooldown {
            Some(c) => Some(Cooldown {
                until_ms: locked.with(takes.len(), now, |e| match *e {
                    KeyEntry::Cooldown(u) => u.min(now.saturating_add(c.max_ms)),
                    _ => 0,
                })?,
                max_wait_ms: c.max_wait_ms,
            }),
            None => None,
        };
        let tr = take::take_many(takes, &states, cooldown, now);
        for (n, &(state, exp)) in tr.states.iter().enumerate() {
            locked.with(n, now, |e| *e = KeyEntry::bucket_of(state, exp))?;
        }
        Ok(tr.outcome)
    }

    pub(super) fn take_many_fair_now(
        &self,
        takes: &[BucketTake<'_>],
        cooldown: Option<CooldownCheck<'_>>,
        fair: FairCheck<'_>,
    ) -> Result<MultiTake, Full> {
        let now = self.now();
        let mut keys: Vec<&str> = takes.iter().map(|t| t.key).collect();
        if let Some(c) = cooldown {
            keys.push(c.key);
        }
        keys.push(fair.key);
        let at = keys.len() - 1;
        let mut locked = self.inner.keys.lock_many(&keys);
        locked.check_room(now)?;
        let state = locked.with(at, now, |e| e.fair(now))?.unwrap_or_default();
        let d = fair::decide(&state, &fair.take, now);
        // Kept while a tenant may still be active or ahead of the clock.
        let expires = now
            .saturating_add(fair.take.window_ms)
            .saturating_add(EXPIRY_GRACE_MS);
        let immediate = match d.gate {
            Gate::Open => false,
            Gate::ImmediateOnly => true,
            Gate::Closed { retry_after_ms } => {
                locked.with(at, now, |e| {
                    *e = KeyEntry::Fair(Box::new((d.refused, expires)));
                })?;
                return Ok(MultiTake::Refused {
                    index: Some(0),
                    retry_after_ms,
                });
            }
        };
        let gated: Vec<BucketTake<'_>> = takes
            .iter()
            .map(|t| BucketTake {
                max_wait_ms: if immediate { 0 } else { t.max_wait_ms },
                ..*t
            })
            .collect();
        let states: Vec<Option<BucketState>> = (0..takes.len())
            .map(|n| locked.with(n, now, |e| e.bucket(now)))
            .collect::<Result<_, Full>>()?;
        let cooldown = match cooldown {
            Some(c) => Some(Cooldown {
                until_ms: locked.with(takes.len(), now, |e| match *e {
                    KeyEntry::Cooldown(u) => u.min(now.saturating_add(c.max_ms)),
                    _ => 0,
                })?,
                max_wait_ms: if immediate { 0 } else { c.max_wait_ms },
            }),
            None => None,
        };
        let tr = take::take_many(&gated, &states, cooldown, now);
        for (n, &(state, exp)) in tr.states.iter().enumerate() {
            locked.with(n, now, |e| *e = KeyEntry::bucket_of(state, exp))?;
        }
        let saved = if matches!(tr.outcome, MultiTake::Granted { .. }) {
            d.granted
        } else {
            d.refused
        };
        locked.with(at, now, |e| *e = KeyEntry::Fair(Box::new((saved, expires))))?;
        Ok(tr.outcome)
    }

    pub(super) fn take_one_now(&self, req: TakeRequest<'_>) -> Result<TakeOutcome, Full> {
        let now = self.now();
        let spec = req.spec;
        match req.bucket {
            BucketRef::Turns(user) => self.take_turns(user, now, &spec, req.cost),
            BucketRef::Named(key) => self.inner.keys.with(key, now, |e| {
                let (outcome, save) = take::take_one(&spec, e.bucket(now), now, req.cost);
                if let Some((state, exp)) = save {
                    *e = KeyEntry::bucket_of(state, exp);
                }
                outcome
            }),
        }
    }

    pub(super) fn extend_cooldown_now(
        &self,
        key: &str,
        for_ms: u64,
        max_ms: u64,
    ) -> Result<u64, Full> {
        let now = self.now();
        let cap = now.saturating_add(max_ms).min(MAX_SCALED as u64);
        self.inner.keys.with(key, now, |e| {
            // As the Redis script: a cooldown that has passed counts as
            // none, one past the cap as ending at the cap.
            let current = match *e {
                KeyEntry::Cooldown(u) if u > now => u.min(cap),
                _ => 0,
            };
            let until = current.max(now.saturating_add(for_ms.min(max_ms)).min(cap));
            if until > now {
                *e = KeyEntry::Cooldown(until);
                until
            } else {
                *e = KeyEntry::Empty;
                0
            }
        })
    }

    pub(super) fn aimd_now(
        &self,
        key: &str,
        params: AimdParams,
        throttled: bool,
    ) -> Result<u32, Full> {
        let now = self.now();
        let p = params.clamped();
        self.inner.keys.with(key, now, |e| {
            let state = e.aimd(now).unwrap_or(AimdState::FULL_RATE);
            if !throttled {
                return state.effective(now, &p);
            }
            let next = state.throttled(now, &p);
            // Back at the configured rate, the state can be forgotten (after
            // a grace period, for a clock that steps back).
            let until = next
                .full_at(&p)
                .unwrap_or(now)
                .max(now.saturating_add(1))
                .saturating_add(EXPIRY_GRACE_MS);
            *e = KeyEntry::Aimd(Box::new((next, until)));
            next.effective(now, &p)
        })
    }

    pub(super) fn clear_provider_now(
        &self,
        cooldown: &str,
        aimd: &str,
        params: AimdParams,
    ) -> Result<ProviderCleared, Full> {
        let now = self.now();
        let p = params.clamped();
        // Both keys under their locks at once: one step, as the Redis script.
        let mut locked = self.inner.keys.lock_many(&[cooldown, aimd]);
        let cooldown_until_ms = locked.with(0, now, |e| {
            let until = match *e {
                KeyEntry::Cooldown(u) if u > now => Some(u),
                _ => None,
            };
            *e = KeyEntry::Empty;
            until
        })?;
        let effective_permille = locked.with(1, now, |e| {
            let state = e.aimd(now).unwrap_or(AimdState::FULL_RATE);
            *e = KeyEntry::Empty;
            state.effective(now, &p)
        })?;
        Ok(ProviderCleared {
            cooldown_until_ms,
            effective_permille,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed or boxed, a bucket gives back exactly the state and expiry
    /// stored, at the edges of what packs.
    #[test]
    fn a_bucket_entry_gives_back_what_was_stored() {
        let max32 = u64::from(u32::MAX);
        let cases = [
            (1_000_000, 60_000, 1_000_000 + 61_000, true),
            (0, 1, 1, true),
            (TS_MASK, max32, TS_MASK + max32, true),
            (TS_MASK + 1, 1_000, TS_MASK + 1 + 5, false),
            (5_000, max32 + 1, 6_000, false),
            (5_000, 1_000, 5_000 + max32, true),
            (5_000, 1_000, 5_000 + max32 + 1, false),
            (5_000, 1_000, 4_999, false),
            (u64::MAX - 10, 1_000, u64::MAX, false),
        ];
        for (ts, period_ms, exp, packs) in cases {
            for level in [i64::MIN, -MAX_SCALED, -1, 0, 1, MAX_SCALED, i64::MAX] {
                let state = BucketState {
                    level,
                    ts,
                    period_ms,
                };
                let e = KeyEntry::bucket_of(state, exp);
                assert_eq!(
                    matches!(e, KeyEntry::Bucket { .. }),
                    packs,
                    "{state:?} {exp}"
                );
                assert_eq!(e.expires_at(), exp, "{state:?}");
                assert_eq!(e.bucket(exp.saturating_sub(1)), (exp > 0).then_some(state));
                assert_eq!(e.bucket(exp), None);
            }
        }
    }
}
