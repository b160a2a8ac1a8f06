//! The circuit breaker [`Failover`](super::Failover) puts in front of the
//! shared store (SPEC §6).
//!
//! Closed: every operation goes to the store. It opens after
//! `consecutive_failures` transient faults in a row, or when at least
//! `min_calls` operations were tried in the current `window_ms` and the
//! share of them that failed reaches `failure_ratio_permille`. Open: no
//! operation is sent for `open_ms`; each is answered by the failure policy
//! at once instead of waiting out a timeout. Then half-open: one operation
//! at a time probes the store (the rest are answered by the policy); a
//! success closes the breaker, a failure opens it again for `open_ms`.
//!
//! One slow or failed operation therefore no longer sends a replica's every
//! user to the policy for a second: the failure ratio and the count in a row
//! must say the store is really failing. Time is the injected clock's.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::Clock;

/// When the breaker opens and for how long (`[store.breaker]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Transient faults in a row that open the breaker (default 5).
    pub consecutive_failures: u32,
    /// Share of failed operations in the window that opens it, permille
    /// (default 500: half).
    pub failure_ratio_permille: u32,
    /// The window the ratio is counted over, ms (default 10,000).
    pub window_ms: u64,
    /// Operations in the window before the ratio counts (default 20).
    pub min_calls: u32,
    /// How long the breaker stays open before a probe, ms (default 1,000).
    pub open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            failure_ratio_permille: 500,
            window_ms: 10_000,
            min_calls: 20,
            open_ms: 1_000,
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Operations go to the shared store.
    Closed,
    /// Operations are answered by the failure policy without asking it.
    Open,
    /// One probe at a time asks the store; the rest take the policy.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open` or `half_open` (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// What the breaker allows an operation to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Ask the store.
    Call,
    /// Ask the store as the half-open probe: report the result.
    Probe,
    /// Do not ask the store.
    Skip,
}

/// A state change: `(from, to)`.
pub(crate) type Transition = (BreakerState, BreakerState);

/// Lock-free breaker state. The counters are approximate under races (two
/// threads may both reset a window), never unsafe: the worst case opens a
/// moment early or late.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    state: AtomicU8,
    open_until: AtomicU64,
    in_a_row: AtomicU32,
    window_start: AtomicU64,
    calls: AtomicU32,
    failures: AtomicU32,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: AtomicU8::new(0),
            open_until: AtomicU64::new(0),
            in_a_row: AtomicU32::new(0),
            window_start: AtomicU64::new(0),
            calls: AtomicU32::new(0),
            failures: AtomicU32::new(0),
        }
    }

    pub(crate) fn config(&self) -> BreakerConfig {
        self.config
    }

    pub(crate) fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn cas(&self, from: BreakerState, to: BreakerState) -> bool {
        self.state
            .compare_exchange(
                from.as_u8(),
                to.as_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether an operation may ask the store now; may move Open to
    /// HalfOpen (reported in the second value).
    pub(crate) fn pass(&self, clock: &dyn Clock) -> (Pass, Option<Transition>) {
        match self.state() {
            BreakerState::Closed => (Pass::Call, None),
            BreakerState::HalfOpen => (Pass::Skip, None),
            BreakerState::Open => {
                if clock.now_ms() < self.open_until.load(Ordering::Acquire) {
                    return (Pass::Skip, None);
                }
                if self.cas(BreakerState::Open, BreakerState::HalfOpen) {
                    (
                        Pass::Probe,
                        Some((BreakerState::Open, BreakerState::HalfOpen)),
                    )
                } else {
                    (Pass::Skip, None)
                }
            }
        }
    }

    fn count(&self, now: u64, failed: bool) -> (u32, u32) {
        let start = self.window_start.load(Ordering::Relaxed);
        if now >= start.saturating_add(self.config.window_ms) || now < start {
            self.window_start.store(now, Ordering::Relaxed);
            self.calls.store(0, Ordering::Relaxed);
            self.failures.store(0, Ordering::Relaxed);
        }
        let calls = self.calls.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let failures = if failed {
            self.failures
                .fetch_add(1, Ordering::Relaxed)
                .saturating_add(1)
        } else {
            self.failures.load(Ordering::Relaxed)
        };
        (calls, failures)
    }

    fn reset(&self, now: u64) {
        self.in_a_row.store(0, Ordering::Relaxed);
        self.window_start.store(now, Ordering::Relaxed);
        self.calls.store(0, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
    }

    /// The store answered an operation that `pass` let through.
    pub(crate) fn success(&self, clock: &dyn Clock, pass: Pass) -> Option<Transition> {
        let now = clock.now_ms();
        if pass == Pass::Probe {
            if self.cas(BreakerState::HalfOpen, BreakerState::Closed) {
                self.reset(now);
                return Some((BreakerState::HalfOpen, BreakerState::Closed));
            }
            return None;
        }
        if self.in_a_row.load(Ordering::Relaxed) != 0 {
            self.in_a_row.store(0, Ordering::Relaxed);
        }
        self.count(now, false);
        None
    }

    /// The store failed (transiently) an operation that `pass` let through.
    pub(crate) fn failure(&self, clock: &dyn Clock, pass: Pass) -> Option<Transition> {
        let now = clock.now_ms();
        let open = |from| {
            self.open_until
                .store(now.saturating_add(self.config.open_ms), Ordering::Release);
            self.cas(from, BreakerState::Open)
                .then_some((from, BreakerState::Open))
        };
        if pass == Pass::Probe {
            return open(BreakerState::HalfOpen);
        }
        let in_a_row = self
            .in_a_row
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        let (calls, failures) = self.count(now, true);
        let ratio_hit = calls >= self.config.min_calls
            && u64::from(failures) * 1_000
                >= u64::from(calls) * u64::from(self.config.failure_ratio_permille);
        if in_a_row >= self.config.consecutive_failures || ratio_hit {
            let t = open(BreakerState::Closed);
            if t.is_some() {
                self.reset(now);
            }
            return t;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeClock;

    fn breaker(consecutive: u32) -> Breaker {
        Breaker::new(BreakerConfig {
            consecutive_failures: consecutive,
            failure_ratio_permille: 500,
            window_ms: 10_000,
            min_calls: 20,
            open_ms: 1_000,
        })
    }

    #[test]
    fn one_failure_does_not_open_but_k_in_a_row_do() {
        let clock = FakeClock::new(0);
        let b = breaker(3);
        assert_eq!(b.failure(&clock, Pass::Call), None);
        assert_eq!(b.state(), BreakerState::Closed);
        b.success(&clock, Pass::Call);
        assert_eq!(b.failure(&clock, Pass::Call), None);
        assert_eq!(b.failure(&clock, Pass::Call), None);
        assert_eq!(
            b.failure(&clock, Pass::Call),
            Some((BreakerState::Closed, BreakerState::Open))
        );
        assert_eq!(b.pass(&clock).0, Pass::Skip);
    }

    #[test]
    fn the_failure_ratio_opens_it_without_a_run_in_a_row() {
        let clock = FakeClock::new(0);
        let b = breaker(100);
        // Alternate: never two in a row, but half of the calls fail.
        let mut opened = None;
        for i in 0..40 {
            let t = if i % 2 == 0 {
                b.success(&clock, Pass::Call)
            } else {
                b.failure(&clock, Pass::Call)
            };
            if t.is_some() {
                opened = Some(i);
                break;
            }
        }
        // The 20th call (index 19) is the first with min_calls counted.
        assert_eq!(opened, Some(19));
        // A new window forgets old failures.
        let b = breaker(100);
        for _ in 0..9 {
            b.failure(&clock, Pass::Call);
            b.success(&clock, Pass::Call);
        }
        clock.advance(10_000);
        for _ in 0..15 {
            b.success(&clock, Pass::Call);
        }
        assert_eq!(b.failure(&clock, Pass::Call), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn half_open_lets_one_probe_through_and_its_answer_decides() {
        let clock = FakeClock::new(0);
        let b = breaker(1);
        b.failure(&clock, Pass::Call);
        assert_eq!(b.pass(&clock).0, Pass::Skip);
        clock.advance(1_000);
        let (p, t) = b.pass(&clock);
        assert_eq!(p, Pass::Probe);
        assert_eq!(t, Some((BreakerState::Open, BreakerState::HalfOpen)));
        // Others skip while the probe is out.
        assert_eq!(b.pass(&clock).0, Pass::Skip);
        // The probe fails: open again for open_ms.
        assert_eq!(
            b.failure(&clock, Pass::Probe),
            Some((BreakerState::HalfOpen, BreakerState::Open))
        );
        clock.advance(999);
        assert_eq!(b.pass(&clock).0, Pass::Skip);
        clock.advance(1);
        assert_eq!(b.pass(&clock).0, Pass::Probe);
        assert_eq!(
            b.success(&clock, Pass::Probe),
            Some((BreakerState::HalfOpen, BreakerState::Closed))
        );
        assert_eq!(b.pass(&clock).0, Pass::Call);
    }
}
