//! AIMD for provider rates (SPEC §5): the effective rate starts at the
//! configured rate, a per-minute 429 halves it (at most once per decrease
//! interval, so a burst of 429s seen by many replicas counts once, never
//! below the floor), and each increase interval without a 429 adds a step,
//! up to the configured rate.
//!
//! The rate is kept as a share of the configured rate in permille
//! (integers, so the memory store and the Redis script agree exactly);
//! increases are computed lazily from the time of the last 429, so a
//! success writes nothing.

use serde::{Deserialize, Serialize};

use crate::bucket::BucketSpec;

/// The configured rate, in permille.
pub const FULL: u32 = 1_000;

/// AIMD parameters (SPEC §5 defaults). In config every field is optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AimdParams {
    /// The lowest effective rate, permille of configured (default 100: 10 %).
    pub floor_permille: u32,
    /// What each increase interval adds, permille (default 50: 5 %).
    pub step_permille: u32,
    /// At most one halving per this many ms (default 5,000).
    pub decrease_interval_ms: u64,
    /// One step up per this many ms without a 429 (default 10,000).
    pub increase_interval_ms: u64,
}

impl Default for AimdParams {
    fn default() -> Self {
        Self {
            floor_permille: 100,
            step_permille: 50,
            decrease_interval_ms: 5_000,
            increase_interval_ms: 10_000,
        }
    }
}

impl AimdParams {
    /// The parameters with every field in range: floor 1..=1000, step
    /// 1..=1000, intervals at least 1 ms.
    pub fn clamped(self) -> Self {
        Self {
            floor_permille: self.floor_permille.clamp(1, FULL),
            step_permille: self.step_permille.clamp(1, FULL),
            decrease_interval_ms: self.decrease_interval_ms.max(1),
            increase_interval_ms: self.increase_interval_ms.max(1),
        }
    }
}

/// One provider key's AIMD state. Missing state is [`AimdState::FULL_RATE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AimdState {
    /// The rate at `anchor_ms`, permille of configured.
    pub permille: u32,
    /// When the last 429 was seen: increases count from here.
    pub anchor_ms: u64,
    /// When the rate was last halved (`None`: never).
    pub decreased_ms: Option<u64>,
}

impl AimdState {
    /// The configured rate, no 429 seen.
    pub const FULL_RATE: AimdState = AimdState {
        permille: FULL,
        anchor_ms: 0,
        decreased_ms: None,
    };

    /// The effective rate at `now`, permille.
    pub fn effective(&self, now: u64, p: &AimdParams) -> u32 {
        if self.permille >= FULL {
            return FULL;
        }
        let steps = now.saturating_sub(self.anchor_ms) / p.increase_interval_ms.max(1);
        let up = steps.saturating_mul(u64::from(p.step_permille));
        (u64::from(self.permille).saturating_add(up)).min(u64::from(FULL)) as u32
    }

    /// A per-minute 429 seen at `now`: halves the effective rate unless it
    /// was halved less than a decrease interval ago (never below the
    /// floor), and restarts the increase clock. Answers the new state.
    pub fn throttled(&self, now: u64, p: &AimdParams) -> AimdState {
        let current = self.effective(now, p);
        let may_decrease = self
            .decreased_ms
            .is_none_or(|d| now >= d.saturating_add(p.decrease_interval_ms));
        if may_decrease {
            AimdState {
                permille: (current / 2).max(p.floor_permille.min(FULL)),
                anchor_ms: now,
                decreased_ms: Some(now),
            }
        } else {
            AimdState {
                permille: current,
                anchor_ms: now,
                decreased_ms: self.decreased_ms,
            }
        }
    }

    /// When this state is back at the configured rate (it can then be
    /// forgotten), or `None` if it already is.
    pub fn full_at(&self, p: &AimdParams) -> Option<u64> {
        if self.permille >= FULL {
            return None;
        }
        let missing = u64::from(FULL - self.permille);
        let steps = missing.div_ceil(u64::from(p.step_permille.max(1)));
        Some(
            self.anchor_ms
                .saturating_add(steps.saturating_mul(p.increase_interval_ms)),
        )
    }
}

/// `spec` at `permille` of its rate: amount and capacity scaled (rounded
/// down, at least 1), the period unchanged.
pub fn scale(spec: BucketSpec, permille: u32) -> BucketSpec {
    if permille >= FULL {
        return spec;
    }
    let f = |v: u64| (v.saturating_mul(u64::from(permille)) / u64::from(FULL)).max(1);
    BucketSpec::new(f(spec.amount()), spec.period_ms(), f(spec.capacity())).unwrap_or(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: AimdParams = AimdParams {
        floor_permille: 100,
        step_permille: 50,
        decrease_interval_ms: 5_000,
        increase_interval_ms: 10_000,
    };

    #[test]
    fn halves_once_per_decrease_interval_and_never_below_the_floor() {
        let s = AimdState::FULL_RATE.throttled(1_000, &P);
        assert_eq!(s.effective(1_000, &P), 500);
        // A burst of 429s within 5 s counts once.
        let s = s.throttled(2_000, &P).throttled(5_999, &P);
        assert_eq!(s.effective(5_999, &P), 500);
        let s = s.throttled(6_000, &P);
        assert_eq!(s.effective(6_000, &P), 250);
        let mut s = s;
        for t in 0..10 {
            s = s.throttled(11_000 + t * 5_000, &P);
        }
        assert_eq!(s.effective(56_000, &P), 100, "floor 10 %");
    }

    #[test]
    fn recovers_a_step_per_quiet_interval_up_to_full() {
        let s = AimdState::FULL_RATE.throttled(0, &P);
        assert_eq!(s.effective(9_999, &P), 500);
        assert_eq!(s.effective(10_000, &P), 550);
        assert_eq!(s.effective(95_000, &P), 950);
        assert_eq!(s.effective(100_000, &P), 1_000);
        assert_eq!(s.effective(10_000_000, &P), 1_000);
        assert_eq!(s.full_at(&P), Some(100_000));
        // A 429 restarts the increase clock (and, within 5 s, does not halve).
        let s = AimdState::FULL_RATE.throttled(0, &P).throttled(4_000, &P);
        assert_eq!(s.effective(13_999, &P), 500);
        assert_eq!(s.effective(14_000, &P), 550);
    }

    #[test]
    fn scales_amount_and_capacity() {
        let spec = BucketSpec::new(600, 60_000, 60).unwrap();
        let half = scale(spec, 500);
        assert_eq!(
            (half.amount(), half.capacity(), half.period_ms()),
            (300, 30, 60_000)
        );
        let tiny = scale(BucketSpec::new(5, 60_000, 1).unwrap(), 100);
        assert_eq!((tiny.amount(), tiny.capacity()), (1, 1));
        assert_eq!(scale(spec, FULL), spec);
    }
}
