//! The integer codes the Lua scripts answer with, defined once for both
//! sides: each is a Rust constant here, and the same name is a Lua local
//! that [`crate::scripts`] composes into every script whose code names it
//! (one prelude block per code). A script answers `GRANTED`, never `1`, and
//! `RedisStore` matches `GRANTED`: a code cannot mean one thing in a script
//! and another in Rust.

macro_rules! codes {
    ($( $(#[doc = $doc:literal])* $name:ident = $v:literal; )*) => {
        $( $(#[doc = $doc])* pub(crate) const $name: i64 = $v; )*

        /// Every code as a Lua prelude block of its own (`local NAME = v`).
        pub(crate) const LUA: &str = concat!($("local ", stringify!($name), " = ", stringify!($v), "\n\n",)*);
    };
}

codes! {
    /// A reply's first value: the request was refused (admit, reserve).
    DENIED = 0;
    /// A reply's first value: the request was granted (admit, reserve).
    GRANTED = 1;
    /// Reserve: the request id was answered by a fallback and reconciled since.
    SUPERSEDED = 2;
    /// Reserve: a repeat of the request id's grant (the first grant's call).
    REPEATED = 3;
    /// Admit refused by the turn bucket.
    ADMIT_TURN_RATE = 1;
    /// Admit refused by the run leases (`concurrent_runs`).
    ADMIT_CONCURRENCY = 2;
    /// Admit refused by a budget (`deny_turns`): this plus the budget's period index.
    ADMIT_BUDGET = 3;
    /// Reserve refused by the run's `max_llm_calls`.
    RESERVE_MAX_CALLS = 3;
    /// Reserve refused by the token bucket, until it refills.
    RESERVE_TOKEN_RATE = 4;
    /// Reserve refused: the estimate exceeds the token bucket for good.
    RESERVE_EXCEEDS = 5;
    /// Reserve refused by a budget until its window ends: this plus the period index.
    RESERVE_BUDGET = 6;
    /// Reserve refused: the charge exceeds a budget's whole limit: this plus the period index.
    RESERVE_BUDGET_EXCEEDS = 9;
    /// Settle: no such open reservation.
    SETTLE_UNKNOWN = 0;
    /// Settle: applied.
    SETTLE_APPLIED = 1;
    /// Settle: the reservation was already closed.
    SETTLE_CLOSED = 2;
    /// A bucket take (prelude `take`/`take_now`, take_one, take_many): granted.
    TAKE_GRANTED = 1;
    /// A bucket take: refused until the bucket refills.
    TAKE_REFUSED = 2;
    /// A bucket take: the cost exceeds the bucket for good.
    TAKE_EXCEEDS = 3;
}

/// The budget periods a code carries an index of (daily, weekly, monthly):
/// `ADMIT_BUDGET`, `RESERVE_BUDGET` and `RESERVE_BUDGET_EXCEEDS` each span
/// this many codes.
pub(crate) const BUDGET_PERIODS: i64 = 3;
