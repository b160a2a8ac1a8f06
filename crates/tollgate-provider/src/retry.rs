//! The one retry layer for provider calls (SPEC §5): full-jitter exponential
//! backoff, a maximum attempt count, the provider's hint honoured, and a
//! retry budget over a sliding minute.
//!
//! [`Retrier::run`] drives a call: it runs the caller's attempt function,
//! asks [`Retrier::decide`] whether a failed attempt may be retried and
//! sleeps on the injected [`Clock`] in between. Each attempt is the caller's
//! whole round trip: take a provider permit
//! ([`ProviderGovernor::permit`](super::ProviderGovernor::permit)), wait it
//! out, call, read the answer into a [`Feedback`] and report it
//! ([`ProviderGovernor::observe`](super::ProviderGovernor::observe)). So a
//! retry takes a new provider permit; the user's tokens are reserved once,
//! outside the retry loop, and a retry is not charged to the user again.
//!
//! Nothing else may retry the same call (not the HTTP client, not the SDK):
//! retries multiply across layers.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use tollgate_core::clock::Clock;
use tollgate_core::plan::{FieldError, InvalidPlans};

use super::feedback::Feedback;

/// The retry budget's window: the last minute, ms.
pub const RETRY_BUDGET_WINDOW_MS: u64 = 60_000;

/// The budget's resolution: it counts per second, so an event leaves the
/// window between 59 and 60 s after it was counted.
const SLOT_MS: u64 = 1_000;

/// Seconds in the window.
const SLOTS: usize = (RETRY_BUDGET_WINDOW_MS / SLOT_MS) as usize;

/// `budget_ratio` is applied in parts per million, in integers.
const PPM: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------

/// How a provider call is retried (SPEC §5). Every field has a default, so
/// `{}` in config is the default policy.
///
/// ```
/// use tollgate_provider::RetryPolicy;
///
/// let policy: RetryPolicy = serde_json::from_str(r#"{"max_attempts": 3}"#).unwrap();
/// assert_eq!(policy.max_attempts, 3);
/// assert_eq!(policy.base_delay_ms, 200);
/// policy.validate().unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 4: up to 3 retries).
    /// 1 turns retries off.
    pub max_attempts: u32,
    /// The backoff cap after the first failed attempt, ms (default 200); it
    /// doubles with every attempt.
    pub base_delay_ms: u64,
    /// The most any backoff cap grows to, ms (default 20,000). It bounds the
    /// jitter only: a longer provider hint is still honoured.
    pub max_delay_ms: u64,
    /// Retries may be at most this fraction of the calls over the last
    /// minute (default 0.1), from 0 to 1. Applied to six decimal places.
    pub budget_ratio: f64,
    /// Retries allowed per minute whatever the ratio says (default 10), so a
    /// quiet replica can still retry.
    pub min_retries_per_minute: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay_ms: 200,
            max_delay_ms: 20_000,
            budget_ratio: 0.1,
            min_retries_per_minute: 10,
        }
    }
}

impl RetryPolicy {
    /// Checks the policy as config: `max_attempts` at least 1,
    /// `budget_ratio` a number from 0 to 1. Paths in the error are the field
    /// names. (A [`Retrier`] given an invalid policy still works: it makes at
    /// least one attempt and clamps the ratio into [0, 1], NaN to 0.)
    ///
    /// # Errors
    ///
    /// [`InvalidPlans`] listing every problem.
    pub fn validate(&self) -> Result<(), InvalidPlans> {
        let mut errors = Vec::new();
        if self.max_attempts == 0 {
            errors.push(FieldError {
                path: "max_attempts".to_owned(),
                reason: "must be at least 1 (the first attempt counts)".to_owned(),
            });
        }
        if !(0.0..=1.0).contains(&self.budget_ratio) {
            errors.push(FieldError {
                path: "budget_ratio".to_owned(),
                reason: format!("must be from 0 to 1, got {}", self.budget_ratio),
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(InvalidPlans { errors })
        }
    }

    /// The backoff cap after failed attempt number `attempt` (1-based; 0
    /// counts as 1): `min(max_delay_ms, base_delay_ms · 2^(attempt-1))`,
    /// saturating.
    ///
    /// ```
    /// use tollgate_provider::RetryPolicy;
    ///
    /// let p = RetryPolicy::default();
    /// assert_eq!(
    ///     (1..=9).map(|a| p.backoff_cap_ms(a)).collect::<Vec<_>>(),
    ///     [200, 400, 800, 1_600, 3_200, 6_400, 12_800, 20_000, 20_000]
    /// );
    /// ```
    pub fn backoff_cap_ms(&self, attempt: u32) -> u64 {
        let factor = 1u64
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u64::MAX);
        self.base_delay_ms
            .saturating_mul(factor)
            .min(self.max_delay_ms)
    }

    /// `max_attempts`, at least 1.
    fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// `budget_ratio` in parts per million, clamped into [0, 1] (NaN: 0).
    fn ratio_ppm(&self) -> u64 {
        let r = self.budget_ratio;
        if r.is_nan() || r <= 0.0 {
            0
        } else if r >= 1.0 {
            PPM
        } else {
            // In (0, 1e6): the cast cannot truncate.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ppm = (r * PPM as f64).round() as u64;
            ppm
        }
    }
}

// ---------------------------------------------------------------------------
// Backoff
// ---------------------------------------------------------------------------

/// How long to wait after failed attempt number `attempt` (1-based), ms:
/// full jitter, a uniform draw from `[0, policy.backoff_cap_ms(attempt)]`,
/// then at least the provider's hint — never earlier than the provider
/// said, even if the hint is beyond `max_delay_ms`.
///
/// `rng` is a source of uniform `u64`s (e.g. `fastrand::Rng::u64(..)`, what
/// [`Retrier`] draws from); one value is drawn, and mapped onto the range
/// so that 0 gives 0 and `u64::MAX` the cap.
///
/// ```
/// use tollgate_provider::{RetryPolicy, backoff_ms};
///
/// let policy = RetryPolicy::default();
/// let mut rng = fastrand::Rng::with_seed(7);
/// let d = backoff_ms(&policy, 3, None, &mut || rng.u64(..));
/// assert!(d <= 800);
/// // The provider said 1.5 s: never earlier.
/// assert!(backoff_ms(&policy, 1, Some(1_500), &mut || rng.u64(..)) >= 1_500);
/// ```
pub fn backoff_ms(
    policy: &RetryPolicy,
    attempt: u32,
    hint_ms: Option<u64>,
    rng: &mut impl FnMut() -> u64,
) -> u64 {
    let jitter = uniform_inclusive(rng(), policy.backoff_cap_ms(attempt));
    jitter.max(hint_ms.unwrap_or(0))
}

/// Maps a uniform `u64` onto `[0, max]` (multiply-shift; the bias is below
/// `max / 2^64`).
fn uniform_inclusive(r: u64, max: u64) -> u64 {
    if max == u64::MAX {
        return r;
    }
    // The product is below 2^64 · 2^64, so its high half fits a u64.
    #[allow(clippy::cast_possible_truncation)]
    let v = ((u128::from(r) * (u128::from(max) + 1)) >> 64) as u64;
    v
}

// ---------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------

/// Calls and retries over a sliding minute: retries may be at most
/// `max(min_retries_per_minute, ⌊budget_ratio · calls⌋)` of the last minute
/// (SPEC §5). When a provider is failing, this keeps retries from
/// multiplying the load on it.
///
/// The budget counts what it is told, on this replica only (it is not
/// shared through the store). A [`Retrier`] owns one; the intended use is
/// one `Retrier` per provider key (provider, model) per replica, so a
/// failing model does not spend another's budget.
///
/// It counts per second of the caller's clock: an event leaves the window
/// between 59 and 60 s after it was counted. Times that step back count in
/// the newest second seen. Thread-safe; memory is fixed (two arrays of 60
/// counters).
///
/// ```
/// use tollgate_provider::{RetryBudget, RetryPolicy};
///
/// let budget = RetryBudget::new(&RetryPolicy { min_retries_per_minute: 1, ..RetryPolicy::default() });
/// for _ in 0..20 {
///     budget.record_request(0);
/// }
/// assert!(budget.try_retry(0) && budget.try_retry(0)); // 10 % of 20
/// assert!(!budget.try_retry(0));
/// assert!(budget.try_retry(60_000)); // a minute later
/// ```
pub struct RetryBudget {
    ratio_ppm: u64,
    min_retries: u64,
    window: Mutex<Window>,
}

/// Per-second counts, a ring indexed by `second % SLOTS`.
struct Window {
    /// The newest second counted (`now_ms / SLOT_MS`).
    latest: u64,
    requests: [u64; SLOTS],
    retries: [u64; SLOTS],
}

impl Window {
    /// Moves the window to `now_ms` (clearing the seconds that left it) and
    /// returns the slot to count in.
    fn roll(&mut self, now_ms: u64) -> usize {
        let second = now_ms / SLOT_MS;
        if second > self.latest {
            if second - self.latest >= SLOTS as u64 {
                self.requests = [0; SLOTS];
                self.retries = [0; SLOTS];
            } else {
                for s in self.latest + 1..=second {
                    let i = Self::slot(s);
                    self.requests[i] = 0;
                    self.retries[i] = 0;
                }
            }
            self.latest = second;
        }
        Self::slot(self.latest)
    }

    fn slot(second: u64) -> usize {
        // The remainder is below SLOTS.
        #[allow(clippy::cast_possible_truncation)]
        let i = (second % SLOTS as u64) as usize;
        i
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio_ppm", &self.ratio_ppm)
            .field("min_retries", &self.min_retries)
            .finish_non_exhaustive()
    }
}

/// What a [`RetryBudget`] holds at one time (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetSnapshot {
    /// Calls counted over the window.
    pub requests: u64,
    /// Retries taken over the window.
    pub retries: u64,
    /// Retries the window allows in all.
    pub allowed: u64,
}

impl RetryBudget {
    /// An empty budget with `policy`'s ratio and floor.
    pub fn new(policy: &RetryPolicy) -> Self {
        Self {
            ratio_ppm: policy.ratio_ppm(),
            min_retries: u64::from(policy.min_retries_per_minute),
            window: Mutex::new(Window {
                latest: 0,
                requests: [0; SLOTS],
                retries: [0; SLOTS],
            }),
        }
    }

    /// Counts one call (its first attempt; retries are not calls) at
    /// `now_ms`.
    pub fn record_request(&self, now_ms: u64) {
        let mut w = self.window.lock();
        let i = w.roll(now_ms);
        w.requests[i] = w.requests[i].saturating_add(1);
    }

    /// Takes one retry at `now_ms` if the window allows another: `true` if
    /// taken (and counted), `false` if the budget is spent.
    pub fn try_retry(&self, now_ms: u64) -> bool {
        let mut w = self.window.lock();
        let i = w.roll(now_ms);
        let (requests, retries) = Self::sums(&w);
        if retries < self.allowed(requests) {
            w.retries[i] = w.retries[i].saturating_add(1);
            true
        } else {
            false
        }
    }

    /// The counts at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> BudgetSnapshot {
        let mut w = self.window.lock();
        w.roll(now_ms);
        let (requests, retries) = Self::sums(&w);
        BudgetSnapshot {
            requests,
            retries,
            allowed: self.allowed(requests),
        }
    }

    fn sums(w: &Window) -> (u64, u64) {
        (
            w.requests.iter().fold(0, |a: u64, &n| a.saturating_add(n)),
            w.retries.iter().fold(0, |a: u64, &n| a.saturating_add(n)),
        )
    }

    fn allowed(&self, requests: u64) -> u64 {
        let by_ratio = u128::from(requests) * u128::from(self.ratio_ppm) / u128::from(PPM);
        u64::try_from(by_ratio)
            .unwrap_or(u64::MAX)
            .max(self.min_retries)
    }
}

// ---------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------

/// Whether to retry after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Retry after waiting `delay_ms` (a retry token has been taken from the
    /// budget).
    Retry {
        /// How long to wait first, ms.
        delay_ms: u64,
    },
    /// Do not retry.
    GiveUp(GiveUpReason),
}

/// Why a call was not retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The answer cannot improve with a retry: the quota is exhausted, a
    /// client error, or (oddly) a success.
    NotRetryable,
    /// The policy's `max_attempts` were made.
    AttemptsExhausted,
    /// The retry budget of the last minute is spent (named apart from a
    /// user's spend budget, `budget_exhausted`).
    RetryBudgetExhausted,
    /// The provider's hint ends after the call's deadline.
    HintTooLong,
    /// The call's deadline has come.
    DeadlineReached,
    /// The attempt function asked to stop ([`AttemptError::Stop`]): no
    /// provider answer to judge.
    Stopped,
}

impl GiveUpReason {
    /// The stable snake_case name, for metrics and logs:
    /// `not_retryable`, `attempts_exhausted`, `retry_budget_exhausted`,
    /// `hint_too_long`, `deadline_reached`, `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            GiveUpReason::NotRetryable => "not_retryable",
            GiveUpReason::AttemptsExhausted => "attempts_exhausted",
            GiveUpReason::RetryBudgetExhausted => "retry_budget_exhausted",
            GiveUpReason::HintTooLong => "hint_too_long",
            GiveUpReason::DeadlineReached => "deadline_reached",
            GiveUpReason::Stopped => "stopped",
        }
    }
}

impl fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt failed, as the attempt function of [`Retrier::run`]
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptError<E> {
    /// The provider answered, and the answer reads as `feedback`: retried
    /// if [`Feedback::is_retryable`] and the policy and budget allow. A
    /// transport failure worth retrying (a reset connection, a timeout) can
    /// be reported as [`Feedback::ServerError`] without a hint.
    Answered {
        /// The caller's error for this attempt.
        error: E,
        /// What the answer says about the quota.
        feedback: Feedback,
    },
    /// Stop without judging (a refused permit, a local failure): `run`
    /// returns at once with [`GiveUpReason::Stopped`].
    Stop(E),
}

impl<E> From<(E, Feedback)> for AttemptError<E> {
    fn from((error, feedback): (E, Feedback)) -> Self {
        AttemptError::Answered { error, feedback }
    }
}

/// A call that failed for good: the last attempt's error and why it was not
/// retried.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryError<E> {
    /// The last attempt's error.
    pub error: E,
    /// The last answer's feedback (`None` for [`GiveUpReason::Stopped`]).
    pub feedback: Option<Feedback>,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Why there was no further attempt.
    pub reason: GiveUpReason,
}

impl<E> RetryError<E> {
    /// The last attempt's error.
    pub fn into_inner(self) -> E {
        self.error
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "provider call failed after {} attempt(s), not retried ({}): {}",
            self.attempts, self.reason, self.error
        )
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RetryError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

// ---------------------------------------------------------------------------
// Retrier
// ---------------------------------------------------------------------------

/// The one retry layer (SPEC §5): a [`RetryPolicy`], its [`RetryBudget`], a
/// jitter generator and the clock it sleeps on. Share one per provider key
/// per replica (behind an `Arc`); every method takes `&self`.
///
/// ```
/// use std::sync::Arc;
/// use tollgate_core::FakeClock;
/// use tollgate_provider::{AttemptError, Feedback, RetryPolicy, Retrier};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let clock = FakeClock::new(0);
/// let retrier = Arc::new(Retrier::with_seed(RetryPolicy::default(), clock.clone(), 42));
/// let call = tokio::spawn({
///     let retrier = Arc::clone(&retrier);
///     async move {
///         retrier
///             .run(|attempt| async move {
///                 // Take a provider permit, call, classify the answer …
///                 if attempt == 1 {
///                     Err(AttemptError::from(("503", Feedback::ServerError { retry_after_ms: Some(1_000) })))
///                 } else {
///                     Ok("answer")
///                 }
///             })
///             .await
///     }
/// });
/// while clock.pending_sleeps() == 0 {
///     tokio::task::yield_now().await;
/// }
/// clock.advance(1_000); // the hint; the jitter after one failure is at most 200 ms
/// assert_eq!(call.await.unwrap(), Ok("answer"));
/// # });
/// ```
pub struct Retrier {
    policy: RetryPolicy,
    budget: RetryBudget,
    rng: Mutex<fastrand::Rng>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Retrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retrier")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Retrier {
    /// A retrier whose jitter is seeded afresh (differently in every process
    /// and every call of `new`: forked from `fastrand`'s per-thread
    /// generator, itself seeded from the monotonic time and the thread).
    pub fn new(policy: RetryPolicy, clock: impl Clock) -> Self {
        Self::with_rng(policy, clock, fastrand::Rng::new())
    }

    /// A retrier whose jitter is seeded with `seed`: the same seed, policy
    /// and answers give the same delays (for tests).
    /// The draws are those of `fastrand::Rng::with_seed(seed)`.
    pub fn with_seed(policy: RetryPolicy, clock: impl Clock, seed: u64) -> Self {
        Self::with_rng(policy, clock, fastrand::Rng::with_seed(seed))
    }

    fn with_rng(policy: RetryPolicy, clock: impl Clock, rng: fastrand::Rng) -> Self {
        Self {
            budget: RetryBudget::new(&policy),
            policy,
            rng: Mutex::new(rng),
            clock: Arc::new(clock),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The retry budget.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Counts one call in the budget, now. [`run`](Self::run) does this
    /// itself; call it once per call when driving attempts with
    /// [`decide`](Self::decide).
    pub fn record_call(&self) {
        self.budget.record_request(self.clock.now_ms());
    }

    /// Whether to retry after failed attempt number `attempt` (1-based)
    /// answered `feedback`, with no deadline. In order: an answer that is
    /// not retryable gives up ([`GiveUpReason::NotRetryable`]), then the
    /// attempt count, then the budget; a retry takes a budget token. The
    /// delay is [`backoff_ms`] with the answer's hint.
    pub fn decide(&self, attempt: u32, feedback: &Feedback) -> RetryDecision {
        self.decide_at(attempt, feedback, self.clock.now_ms(), None)
    }

    /// As [`decide`](Self::decide), for a call whose one deadline is
    /// `deadline_ms` (clock time): gives up with
    /// [`GiveUpReason::DeadlineReached`] once it has come, or
    /// [`GiveUpReason::HintTooLong`] if the provider's hint ends after it.
    /// Otherwise the jitter is cut to end by the deadline (the hint, which
    /// fits, is still honoured).
    pub fn decide_until(
        &self,
        attempt: u32,
        feedback: &Feedback,
        deadline_ms: u64,
    ) -> RetryDecision {
        self.decide_at(attempt, feedback, self.clock.now_ms(), Some(deadline_ms))
    }

    fn decide_at(
        &self,
        attempt: u32,
        feedback: &Feedback,
        now: u64,
        deadline_ms: Option<u64>,
    ) -> RetryDecision {
        if !feedback.is_retryable() {
            return RetryDecision::GiveUp(GiveUpReason::NotRetryable);
        }
        if attempt >= self.policy.attempts() {
            return RetryDecision::GiveUp(GiveUpReason::AttemptsExhausted);
        }
        let hint = feedback.retry_after_ms();
        let mut delay_ms = {
            let mut rng = self.rng.lock();
            backoff_ms(&self.policy, attempt, hint, &mut || rng.u64(..))
        };
        if let Some(deadline) = deadline_ms {
            let remaining = deadline.saturating_sub(now);
            if remaining == 0 {
                return RetryDecision::GiveUp(GiveUpReason::DeadlineReached);
            }
            if hint.is_some_and(|h| h > remaining) {
                return RetryDecision::GiveUp(GiveUpReason::HintTooLong);
            }
            delay_ms = delay_ms.min(remaining);
        }
        if !self.budget.try_retry(now) {
            return RetryDecision::GiveUp(GiveUpReason::RetryBudgetExhausted);
        }
        RetryDecision::Retry { delay_ms }
    }

    /// Runs one call through the retry layer, with no deadline: counts it in
    /// the budget, then runs `attempt_fn(1)`, `attempt_fn(2)`, … until an
    /// attempt succeeds, stops ([`AttemptError::Stop`]) or
    /// [`decide`](Self::decide) gives up, sleeping the decided delay on the
    /// clock between attempts.
    ///
    /// Each attempt is the caller's whole round trip, and so takes its own
    /// provider permit: `permit` (a refusal is [`AttemptError::Stop`]),
    /// wait, call, classify, `observe`, and return the answer's
    /// [`Feedback`] with the error. Reserve the user's tokens once, before
    /// `run`: a retry is not charged to the user again.
    ///
    /// # Errors
    ///
    /// [`RetryError`] with the last attempt's error, its feedback, the
    /// attempts made and why there was no further one.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the attempt or sleep in progress; retry
    /// tokens already taken stay taken.
    pub async fn run<T, E, F, Fut>(&self, attempt_fn: F) -> Result<T, RetryError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, AttemptError<E>>>,
    {
        self.run_inner(None, attempt_fn).await
    }

    /// As [`run`](Self::run), for a call whose one deadline is `deadline_ms`
    /// (clock time), decided by [`decide_until`](Self::decide_until). The
    /// attempts themselves should fit their waits to it too (a permit's
    /// `max_wait_ms`).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    pub async fn run_until<T, E, F, Fut>(
        &self,
        deadline_ms: u64,
        attempt_fn: F,
    ) -> Result<T, RetryError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, AttemptError<E>>>,
    {
        self.run_inner(Some(deadline_ms), attempt_fn).await
    }

    async fn run_inner<T, E, F, Fut>(
        &self,
        deadline_ms: Option<u64>,
        mut attempt_fn: F,
    ) -> Result<T, RetryError<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, AttemptError<E>>>,
    {
        self.record_call();
        let mut attempt = 1u32;
        loop {
            let (error, feedback) = match attempt_fn(attempt).await {
                Ok(value) => return Ok(value),
                Err(AttemptError::Stop(error)) => {
                    return Err(RetryError {
                        error,
                        feedback: None,
                        attempts: attempt,
                        reason: GiveUpReason::Stopped,
                    });
                }
                Err(AttemptError::Answered { error, feedback }) => (error, feedback),
            };
            let now = self.clock.now_ms();
            match self.decide_at(attempt, &feedback, now, deadline_ms) {
                RetryDecision::Retry { delay_ms } => {
                    tracing::debug!(
                        attempt,
                        delay_ms,
                        class = feedback.class(),
                        "retrying provider call"
                    );
                    self.clock.sleep_until(now.saturating_add(delay_ms)).await;
                    attempt = attempt.saturating_add(1);
                }
                RetryDecision::GiveUp(reason) => {
                    tracing::debug!(
                        attempt,
                        %reason,
                        class = feedback.class(),
                        "provider call not retried"
                    );
                    return Err(RetryError {
                        error,
                        feedback: Some(feedback),
                        attempts: attempt,
                        reason,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
