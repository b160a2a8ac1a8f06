//! The token bucket with debt (SPEC §2): one pure transition for every rate.
//!
//! A rate is `amount` per `period_ms`, with a `capacity` (the burst). The
//! level is kept as an integer scaled by `period_ms` (token·ms), so refilling
//! over `elapsed` ms adds exactly `elapsed * amount` and every division is an
//! integer ceiling. The same arithmetic runs in Redis Lua, where doubles are
//! exact below 2^53; [`BucketSpec::new`] rejects limits whose scaled values
//! could exceed [`MAX_SCALED`].
//!
//! Nothing here reads a clock or touches a store: each function maps
//! `(spec, state, now, request)` to `(outcome, new state, expiry)`.

use serde::{Deserialize, Serialize};

/// The largest scaled value (token·ms) a bucket may hold: 2^53, the limit of
/// exact integer arithmetic in IEEE doubles (Redis Lua numbers).
pub const MAX_SCALED: i64 = 1 << 53;

/// How long past "full again" an idle key is kept, in ms (SPEC §2 rule 6).
pub const EXPIRY_GRACE_MS: u64 = 60_000;

/// A validated rate: `amount` per `period_ms`, bursting to `capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawSpec", into = "RawSpec")]
pub struct BucketSpec {
    amount: u64,
    period_ms: u64,
    capacity: u64,
}

#[derive(Serialize, Deserialize)]
struct RawSpec {
    amount: u64,
    period_ms: u64,
    capacity: u64,
}

impl TryFrom<RawSpec> for BucketSpec {
    type Error = InvalidSpec;
    fn try_from(r: RawSpec) -> Result<Self, InvalidSpec> {
        BucketSpec::new(r.amount, r.period_ms, r.capacity)
    }
}

impl From<BucketSpec> for RawSpec {
    fn from(s: BucketSpec) -> Self {
        RawSpec {
            amount: s.amount,
            period_ms: s.period_ms,
            capacity: s.capacity,
        }
    }
}

/// Why a rate cannot be a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidSpec {
    /// `amount` was zero.
    #[error("amount must be at least 1")]
    ZeroAmount,
    /// `period_ms` was zero.
    #[error("period_ms must be at least 1")]
    ZeroPeriod,
    /// `capacity` was zero.
    #[error("capacity (burst) must be at least 1")]
    ZeroCapacity,
    /// `capacity * period_ms` or `amount * period_ms` is past 2^53.
    #[error("capacity × period_ms and amount × period_ms must not exceed 2^53 (exact arithmetic)")]
    TooLarge,
}

impl BucketSpec {
    /// A bucket that refills `amount` every `period_ms` and holds at most
    /// `capacity`.
    ///
    /// # Errors
    ///
    /// Any of the three is zero, or a scaled value would exceed [`MAX_SCALED`].
    pub fn new(amount: u64, period_ms: u64, capacity: u64) -> Result<Self, InvalidSpec> {
        if amount == 0 {
            return Err(InvalidSpec::ZeroAmount);
        }
        if period_ms == 0 {
            return Err(InvalidSpec::ZeroPeriod);
        }
        if capacity == 0 {
            return Err(InvalidSpec::ZeroCapacity);
        }
        let max = MAX_SCALED as u128;
        if u128::from(capacity) * u128::from(period_ms) > max
            || u128::from(amount) * u128::from(period_ms) > max
        {
            return Err(InvalidSpec::TooLarge);
        }
        Ok(Self {
            amount,
            period_ms,
            capacity,
        })
    }

    /// Tokens added per period.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The period in ms.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The burst: most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The capacity in scaled units (token·ms).
    pub fn capacity_scaled(&self) -> i64 {
        (self.capacity * self.period_ms) as i64
    }

    /// `tokens` in scaled units (exact, in i128).
    pub fn scale(&self, tokens: i64) -> i128 {
        i128::from(tokens) * i128::from(self.period_ms)
    }

    /// Whole tokens in a scaled level, rounded toward negative infinity.
    pub fn unscale(&self, level: i64) -> i64 {
        level.div_euclid(self.period_ms as i64)
    }

    /// The longest wait a take may be granted with:
    /// `(2^53 - capacity × period) / amount`, so the debt it leaves stays
    /// exact. Longer `max_wait_ms` values are cut to it.
    pub fn max_wait_limit(&self) -> u64 {
        (MAX_SCALED as u64 - self.capacity * self.period_ms) / self.amount
    }

    /// Whether a take of `cost` waiting at most `max_wait_ms` can never be
    /// granted, whatever the level (rule 4's second case):
    /// `cost > capacity + max_wait_ms × rate`, with `max_wait_ms` cut to
    /// [`max_wait_limit`](Self::max_wait_limit). Exact, in 128 bits; every
    /// store asks this one question ([`take`] here, the Redis store before
    /// it calls a script).
    pub fn exceeds(&self, cost: u64, max_wait_ms: u64) -> bool {
        self.exceeds_capped(cost, self.capped_wait(max_wait_ms))
    }

    /// `max_wait_ms.min(self.max_wait_limit())`, dividing only when the
    /// wait is past the limit (`max_wait_ms × amount` is compared with the
    /// room under 2^53 instead): a take's hot path asks this every time.
    fn capped_wait(&self, max_wait_ms: u64) -> u64 {
        let room = MAX_SCALED as u64 - self.capacity * self.period_ms;
        if u128::from(max_wait_ms) * u128::from(self.amount) <= u128::from(room) {
            max_wait_ms
        } else {
            self.max_wait_limit()
        }
    }

    /// [`exceeds`](Self::exceeds) of a wait already capped by
    /// [`capped_wait`](Self::capped_wait).
    fn exceeds_capped(&self, cost: u64, max_wait_ms: u64) -> bool {
        i128::from(cost) * i128::from(self.period_ms)
            > i128::from(self.capacity_scaled()) + i128::from(max_wait_ms) * i128::from(self.amount)
    }

    /// The largest cost a take with `max_wait_ms` can ever be granted:
    /// `capacity + max_wait_ms × rate`, in whole tokens (rounded down).
    pub fn max_cost(&self, max_wait_ms: u64) -> u64 {
        let max_wait_ms = self.capped_wait(max_wait_ms);
        let scaled = u128::from(self.capacity) * u128::from(self.period_ms)
            + u128::from(max_wait_ms) * u128::from(self.amount);
        u64::try_from(scaled / u128::from(self.period_ms)).unwrap_or(u64::MAX)
    }
}

/// The longest TTL tollgate accepts for a lease, ms (30 days); longer ones
/// are cut to it, and 0 counts as 1.
pub const MAX_TTL_MS: u64 = 30 * 24 * 3_600_000;

/// Clamps a TTL to `1..=MAX_TTL_MS`.
pub fn clamp_ttl(ttl_ms: u64) -> u64 {
    ttl_ms.clamp(1, MAX_TTL_MS)
}

/// A bucket's stored state: the scaled level (negative is debt), the time of
/// the last refill, and the period the level is scaled by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BucketState {
    /// Level in token·ms (tokens × `period_ms`); negative while in debt.
    pub level: i64,
    /// Time of the last refill, ms.
    pub ts: u64,
    /// The period `level` is scaled by. When a reloaded plan changes the
    /// period, the level is rescaled in whole tokens (a fraction of a token
    /// is dropped: never more credit than before).
    pub period_ms: u64,
}

/// The answer to a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum Take {
    /// Granted; the caller waits `wait_ms` before acting (0: act now).
    Granted {
        /// How long to wait before acting, ms.
        wait_ms: u64,
    },
    /// Refused, nothing taken. Retried after `retry_after_ms`, the same take
    /// is granted with at most `max_wait_ms` of wait.
    Refused {
        /// When to retry, ms from now (at least 1).
        retry_after_ms: u64,
    },
    /// `cost > capacity + max_wait × rate`: can never be granted.
    ExceedsCapacity,
}

/// A transition's result: the answer, the state to save and the time after
/// which the saved state may be dropped (a missing state is a full bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Transition<T> {
    /// The answer.
    pub outcome: T,
    /// The state to save.
    pub state: BucketState,
    /// When the key may expire, ms on the same clock as `now`.
    pub expires_at: u64,
}

/// `ceil(n / d)` for `d > 0`, in 64 bits (every bucket quantity is within
/// ±2^55, so 128-bit division is never needed).
#[inline(always)]
fn ceil_div(n: i64, d: i64) -> i64 {
    debug_assert!(d > 0);
    if n <= 0 { n / d } else { (n - 1) / d + 1 }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(-i128::from(MAX_SCALED), i128::from(MAX_SCALED)) as i64
}

/// Rules 1–2: a missing state is a full bucket; refill by elapsed time, capped
/// at capacity; a clock that steps back never refills twice.
#[inline(always)]
pub fn refill(spec: &BucketSpec, state: Option<BucketState>, now: u64) -> BucketState {
    let cap = spec.capacity_scaled();
    match state {
        None => BucketState {
            level: cap,
            ts: now,
            period_ms: spec.period_ms,
        },
        Some(s) => {
            let elapsed = now.saturating_sub(s.ts);
            // The common case in 64 bits: same period, a refill below 2^62
            // (then `level + add` overflows only upward, where the cap
            // takes over, so saturating is exact).
            if (s.period_ms == spec.period_ms || s.period_ms == 0)
                && let Some(add) = elapsed.checked_mul(spec.amount).filter(|a| *a <= 1 << 62)
            {
                return BucketState {
                    level: s.level.saturating_add(add as i64).min(cap).max(-MAX_SCALED),
                    ts: s.ts.max(now),
                    period_ms: spec.period_ms,
                };
            }
            let mut level = i128::from(s.level);
            if s.period_ms != spec.period_ms && s.period_ms > 0 {
                // A reloaded plan changed the period: rescale in whole
                // tokens, rounding toward less credit.
                level = level.div_euclid(i128::from(s.period_ms)) * i128::from(spec.period_ms);
                level = level.max(-i128::from(MAX_SCALED));
            }
            let level = level + i128::from(elapsed) * i128::from(spec.amount);
            BucketState {
                level: clamp_i64(level.min(i128::from(cap))),
                ts: s.ts.max(now),
                period_ms: spec.period_ms,
            }
        }
    }
}

/// How long a bucket holding the scaled `level` takes to refill to its
/// capacity, ms (0 when full): the "reset" of rate-limit headers.
#[inline(always)]
pub fn full_in_ms(spec: &BucketSpec, level: i64) -> u64 {
    // level >= -2^53 and capacity_scaled <= 2^53: no overflow.
    let missing = spec.capacity_scaled() - level;
    ceil_div(missing, spec.amount as i64).max(0) as u64
}

/// A saved state with its expiry (ms) as of `now`: `None` once expired (a
/// missing state is a full bucket, rule 1).
pub fn live(saved: Option<(BucketState, u64)>, now: u64) -> Option<BucketState> {
    saved.filter(|(_, exp)| *exp > now).map(|(s, _)| s)
}

/// Rule 6: when a key holding `level` may be dropped, written at `now`.
#[inline(always)]
pub fn expires_at(spec: &BucketSpec, level: i64, now: u64) -> u64 {
    now.saturating_add(full_in_ms(spec, level))
        .saturating_add(EXPIRY_GRACE_MS)
}

/// Rules 1–5: take `cost` tokens, waiting at most `max_wait_ms`.
///
/// A refusal (and an exceeds-capacity answer) takes nothing: the returned
/// state is only the refilled one.
#[inline(always)]
pub fn take(
    spec: &BucketSpec,
    state: Option<BucketState>,
    now: u64,
    cost: u64,
    max_wait_ms: u64,
) -> Transition<Take> {
    let s = refill(spec, state, now);
    let amount = spec.amount as i64;
    // Debt past 2^53 could not be kept exactly: cap the wait a take may be
    // granted with so that capacity + max_wait × rate stays within it.
    let max_wait_ms = spec.capped_wait(max_wait_ms);
    if spec.exceeds_capped(cost, max_wait_ms) {
        // Rule 4's second case: never grantable (and so its wait is past
        // max_wait whatever the level).
        return Transition {
            outcome: Take::ExceedsCapacity,
            state: s,
            expires_at: expires_at(spec, s.level, now),
        };
    }
    let cost_scaled = i128::from(cost) * i128::from(spec.period_ms);
    // cost_scaled <= 2^53 + max_wait × amount; with level >= -2^53 the
    // difference fits in i64 unless max_wait is absurd, so saturate.
    let after = (i128::from(s.level) - cost_scaled).max(i128::from(i64::MIN + 1)) as i64;
    let wait = if after < 0 {
        ceil_div(-after, amount) as u64
    } else {
        0
    };
    if wait > max_wait_ms {
        return Transition {
            outcome: Take::Refused {
                retry_after_ms: (wait - max_wait_ms).max(1),
            },
            state: s,
            expires_at: expires_at(spec, s.level, now),
        };
    }
    let level = after.max(-MAX_SCALED);
    Transition {
        outcome: Take::Granted { wait_ms: wait },
        state: BucketState { level, ..s },
        expires_at: expires_at(spec, level, now),
    }
}

/// Adjust by a signed `delta` of tokens (positive takes, negative gives back):
/// rules 1–2, then `level = min(capacity, level - delta)`. Never refuses;
/// debt is bounded only by [`MAX_SCALED`] (the next take waits for it).
///
/// Settle is `adjust(actual - estimate)`; refund is `adjust(-estimate)`.
pub fn adjust(
    spec: &BucketSpec,
    state: Option<BucketState>,
    now: u64,
    delta: i64,
) -> Transition<()> {
    let s = refill(spec, state, now);
    let level = (i128::from(s.level) - spec.scale(delta)).min(i128::from(spec.capacity_scaled()));
    let level = clamp_i64(level);
    Transition {
        outcome: (),
        state: BucketState { level, ..s },
        expires_at: expires_at(spec, level, now),
    }
}

#[cfg(test)]
mod tests;
