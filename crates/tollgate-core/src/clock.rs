//! Time, injected.
//!
//! Every decision in tollgate is a function of `now`, and `now` always comes
//! from a [`Clock`]. Production code uses [`SystemClock`]; tests use
//! [`FakeClock`], whose [`advance`](FakeClock::advance) moves every clone and
//! completes the sleeps it passes, so no test ever sleeps for real.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;

/// A boxed future returned by [`Clock::sleep_until`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of time in milliseconds, and a way to wait for a point in it.
///
/// Times are milliseconds on the clock's own timeline ([`SystemClock`]: the
/// Unix epoch). A clock may step back (NTP); the bucket arithmetic tolerates it.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time in milliseconds.
    fn now_ms(&self) -> u64;

    /// A future that completes once [`now_ms`](Clock::now_ms) has reached
    /// `deadline_ms`. It completes at once if that time has already come.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the wait and has no other effect.
    fn sleep_until(&self, deadline_ms: u64) -> Sleep;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        (**self).sleep_until(deadline_ms)
    }
}

/// The wall clock: milliseconds since the Unix epoch, waits on tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() * 1_000 + u64::from(d.subsec_millis()))
            .unwrap_or(0)
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let delta = deadline_ms.saturating_sub(self.now_ms());
        Box::pin(async move {
            if delta > 0 {
                tokio::time::sleep(Duration::from_millis(delta)).await;
            }
        })
    }
}

/// Wall time read once, then advanced by a monotonic TSC-based counter
/// (`quanta`): about 10 ns a read instead of `SystemTime::now`'s 30, and it
/// never steps back. It does not follow wall-clock steps made after it was
/// created (NTP corrections), so its readings can drift from the host's wall
/// clock by the TSC calibration error (parts per million) over a long run;
/// decisions only use differences of its readings. Cloning shares the anchor.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    wall_ms: u64,
    counter: quanta::Clock,
    start: u64,
}

impl MonotonicClock {
    /// A clock anchored to the wall clock now.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        Self {
            wall_ms: SystemClock.now_ms(),
            start: counter.raw(),
            counter,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let nanos = self.counter.delta_as_nanos(self.start, self.counter.raw());
        self.wall_ms + nanos / 1_000_000
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let delta = deadline_ms.saturating_sub(self.now_ms());
        Box::pin(async move {
            if delta > 0 {
                tokio::time::sleep(Duration::from_millis(delta)).await;
            }
        })
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
///
/// ```
/// use tollgate_core::{Clock, FakeClock};
/// let clock = FakeClock::new(1_000);
/// let other = clock.clone();
/// clock.advance(500);
/// assert_eq!(other.now_ms(), 1_500);
/// ```
#[derive(Clone, Default)]
pub struct FakeClock {
    inner: Arc<Mutex<FakeInner>>,
}

#[derive(Default)]
struct FakeInner {
    now: u64,
    next_id: u64,
    /// Sleeps not yet due, by (deadline, id), with the waker of their
    /// last poll. A due sleep is removed (and woken): its absence is what
    /// completes it.
    sleepers: BTreeMap<(u64, u64), Option<Waker>>,
}

impl FakeClock {
    /// A fake clock that reads `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        let clock = Self::default();
        clock.inner.lock().now = start_ms;
        clock
    }

    /// Moves time forward by `ms` for every clone and completes every sleep
    /// whose deadline has been reached.
    pub fn advance(&self, ms: u64) {
        let due = {
            let mut inner = self.inner.lock();
            inner.now = inner.now.saturating_add(ms);
            Self::take_due(&mut inner)
        };
        due.into_iter().for_each(Waker::wake);
    }

    /// Sets the time to `ms`, which may be earlier than now (a clock that
    /// steps back). Sleeps whose deadline is reached complete.
    pub fn set(&self, ms: u64) {
        let due = {
            let mut inner = self.inner.lock();
            inner.now = ms;
            Self::take_due(&mut inner)
        };
        due.into_iter().for_each(Waker::wake);
    }

    /// How many sleeps are waiting for the clock to advance.
    pub fn pending_sleeps(&self) -> usize {
        self.inner.lock().sleepers.len()
    }

    /// Removes the sleeps that are due (which completes them) and answers
    /// the wakers of those polled already, to wake once the lock is let go.
    fn take_due(inner: &mut FakeInner) -> Vec<Waker> {
        let now = inner.now;
        let later = inner.sleepers.split_off(&(now.saturating_add(1), 0));
        std::mem::replace(&mut inner.sleepers, later)
            .into_values()
            .flatten()
            .collect()
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock")
            .field("now_ms", &self.now_ms())
            .finish()
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.inner.lock().now
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let mut inner = self.inner.lock();
        if deadline_ms <= inner.now {
            return Box::pin(std::future::ready(()));
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.sleepers.insert((deadline_ms, id), None);
        Box::pin(FakeSleep {
            clock: self.inner.clone(),
            key: (deadline_ms, id),
        })
    }
}

/// A sleep on a [`FakeClock`]: done once the clock has removed it from its
/// sleepers (its deadline was reached); dropping it cancels it. It holds
/// only its key and the clock (no channel): a test with many sleepers
/// pays a few dozen bytes for each.
struct FakeSleep {
    clock: Arc<Mutex<FakeInner>>,
    key: (u64, u64),
}

impl Future for FakeSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut inner = self.clock.lock();
        match inner.sleepers.get_mut(&self.key) {
            None => Poll::Ready(()),
            Some(waker) => {
                match waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for FakeSleep {
    fn drop(&mut self) {
        self.clock.lock().sleepers.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn advance_completes_due_sleeps_only() {
        let clock = FakeClock::new(0);
        let early = tokio::spawn(clock.sleep_until(100));
        let late = tokio::spawn(clock.sleep_until(300));
        tokio::task::yield_now().await;
        clock.advance(100);
        early.await.unwrap();
        assert!(!late.is_finished());
        assert_eq!(clock.pending_sleeps(), 1);
        clock.clone().advance(200);
        late.await.unwrap();
        assert_eq!(clock.pending_sleeps(), 0);
    }

    #[tokio::test]
    async fn past_deadline_is_ready() {
        let clock = FakeClock::new(50);
        clock.sleep_until(50).await;
        clock.sleep_until(0).await;
    }

    #[test]
    fn set_can_step_back() {
        let clock = FakeClock::new(1_000);
        clock.set(400);
        assert_eq!(clock.now_ms(), 400);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn monotonic_clock_starts_at_wall_time_and_never_goes_back() {
        let wall = SystemClock.now_ms();
        let m = MonotonicClock::new();
        let a = m.now_ms();
        assert!(a >= wall && a < wall + 60_000);
        let b = m.clone().now_ms();
        assert!(b >= a);
    }
}
