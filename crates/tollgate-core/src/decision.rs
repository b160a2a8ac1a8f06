//! Decisions: a limit answer is data, not an error (STYLE §1.1).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which limit answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Limit {
    /// Per-user turn rate.
    TurnRate,
    /// Per-user concurrent runs.
    Concurrency,
    /// Per-user token rate.
    TokenRate,
    /// Model calls per run (`max_llm_calls`).
    MaxLlmCalls,
    /// A named bucket taken through the multi-bucket take (provider, tool).
    Bucket,
    /// A provider cooldown after a 429.
    Cooldown,
    /// Live sessions per user (`max_sessions`, SPEC §4).
    Sessions,
    /// A user's spend budget of the local day.
    BudgetDaily,
    /// A user's spend budget of the week (from Monday).
    BudgetWeekly,
    /// A user's spend budget of the calendar month.
    BudgetMonthly,
}

impl Limit {
    /// The stable snake_case name used on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::TurnRate => "turn_rate",
            Limit::Concurrency => "concurrency",
            Limit::TokenRate => "token_rate",
            Limit::MaxLlmCalls => "max_llm_calls",
            Limit::Bucket => "bucket",
            Limit::Cooldown => "cooldown",
            Limit::Sessions => "sessions",
            Limit::BudgetDaily => "budget_daily",
            Limit::BudgetWeekly => "budget_weekly",
            Limit::BudgetMonthly => "budget_monthly",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request was refused. Only [`Denial::Limited`] is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Denial {
    /// Over a rate or a cap for now; retried after `retry_after_ms` the same
    /// request fits.
    Limited {
        /// The limit that refused.
        limit: Limit,
        /// When to retry, ms from the decision (at least 1).
        retry_after_ms: u64,
    },
    /// The cost is larger than the bucket can ever grant
    /// (`cost > capacity + max_wait × rate`). Not retryable.
    ExceedsCapacity {
        /// The limit that refused.
        limit: Limit,
        /// The cost asked for.
        cost: u64,
        /// The largest cost this limit can grant.
        max_cost: u64,
    },
    /// A count cap was reached for good (e.g. `max_llm_calls` for this run).
    /// Not retryable.
    CapReached {
        /// The limit that refused.
        limit: Limit,
        /// The cap.
        cap: u64,
    },
}

impl Denial {
    /// The limit that refused.
    pub fn limit(&self) -> Limit {
        match *self {
            Denial::Limited { limit, .. }
            | Denial::ExceedsCapacity { limit, .. }
            | Denial::CapReached { limit, .. } => limit,
        }
    }

    /// The retry hint in ms, or `None` if retrying cannot help.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match *self {
            Denial::Limited { retry_after_ms, .. } => Some(retry_after_ms),
            _ => None,
        }
    }

    /// Whether the same request can succeed later.
    pub fn is_retryable(&self) -> bool {
        self.retry_after_ms().is_some()
    }

    /// The retry hint in whole seconds, rounded up (`Retry-After`).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after_ms().map(|ms| ms.div_ceil(1_000))
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Denial::Limited {
                limit,
                retry_after_ms,
            } => write!(f, "{limit} limit reached; retry after {retry_after_ms} ms"),
            Denial::ExceedsCapacity {
                limit,
                cost,
                max_cost,
            } => write!(
                f,
                "{limit}: a cost of {cost} can never be granted (at most {max_cost})"
            ),
            Denial::CapReached { limit, cap } => write!(f, "{limit}: cap of {cap} reached"),
        }
    }
}

/// A limiter's answer: allowed (possibly after a wait, possibly only because
/// the plan is in shadow mode) or denied.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Decision<T> {
    /// Go ahead with `grant`.
    Allowed {
        /// What was granted (a run lease, a reservation).
        grant: T,
        /// In shadow mode, the denial that enforcement would have answered.
        shadow_denied: Option<Denial>,
    },
    /// Refused; nothing was taken.
    Denied(Denial),
}

impl<T> Decision<T> {
    /// Whether the caller may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    /// The grant, if allowed.
    pub fn grant(&self) -> Option<&T> {
        match self {
            Decision::Allowed { grant, .. } => Some(grant),
            Decision::Denied(_) => None,
        }
    }

    /// The denial: the enforcing one, or in shadow mode the one that would
    /// have been answered.
    pub fn denial(&self) -> Option<&Denial> {
        match self {
            Decision::Allowed { shadow_denied, .. } => shadow_denied.as_ref(),
            Decision::Denied(d) => Some(d),
        }
    }

    /// The metrics outcome of this decision.
    pub fn outcome(&self) -> Outcome
    where
        T: Waited,
    {
        match self {
            Decision::Allowed {
                shadow_denied: Some(_),
                ..
            } => Outcome::ShadowDenied,
            Decision::Allowed { grant, .. } if grant.wait_ms() > 0 => Outcome::Waited,
            Decision::Allowed { .. } => Outcome::Allowed,
            Decision::Denied(_) => Outcome::Denied,
        }
    }
}

/// Grants that may come with a wait.
pub trait Waited {
    /// How long the caller waits (or waited) before acting, ms.
    fn wait_ms(&self) -> u64;
}

/// The outcome label of a decision (SPEC §6 metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Allowed at once.
    Allowed,
    /// Allowed after a wait.
    Waited,
    /// Denied.
    Denied,
    /// Allowed because the plan is in shadow mode; enforcement would deny.
    ShadowDenied,
}

impl Outcome {
    /// The stable metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Waited => "waited",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_seconds() {
        let d = Denial::Limited {
            limit: Limit::TurnRate,
            retry_after_ms: 2_000,
        };
        assert_eq!(d.retry_after_secs(), Some(2));
        let d = Denial::Limited {
            limit: Limit::TurnRate,
            retry_after_ms: 2_001,
        };
        assert_eq!(d.retry_after_secs(), Some(3));
        let d = Denial::CapReached {
            limit: Limit::MaxLlmCalls,
            cap: 500,
        };
        assert!(!d.is_retryable());
        assert_eq!(d.limit(), Limit::MaxLlmCalls);
    }
}
