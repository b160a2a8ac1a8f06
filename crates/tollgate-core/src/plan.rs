//! Plans as data (SPEC §6): plain, deserializable config validated into
//! typed [`Plan`]s with clear, field-addressed errors.
//!
//! The core owns these types; the server owns loading them from a file.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::bucket::{BucketSpec, MAX_SCALED, MAX_TTL_MS};
use crate::budget::{BudgetContext, BudgetSettingsConfig, Budgets, BudgetsConfig};
use crate::calendar::BudgetZone;
use crate::money::{self, PriceBook, PricesConfig};

/// Default run lease TTL (SPEC §3): 120 s.
pub const DEFAULT_LEASE_TTL_MS: u64 = 120_000;
/// Default cap on the concurrency retry hint (SPEC §3): 1 s.
pub const DEFAULT_CONCURRENCY_RETRY_MS: u64 = 1_000;
/// Default model calls per run (SPEC §1): 500.
pub const DEFAULT_MAX_LLM_CALLS: u64 = 500;
/// Default live sessions per user (SPEC §4): 1,000.
pub const DEFAULT_MAX_SESSIONS: u32 = 1_000;
/// Most `max_sessions` a plan may set: 100,000 (each live session costs the
/// store a record and a claim).
pub const MAX_MAX_SESSIONS: u32 = 100_000;

/// Default tokens estimated for a model call before anything is known about
/// it: 1,000 (capped at the plan's token burst).
pub const DEFAULT_ESTIMATE_TOKENS: u64 = 1_000;

/// A rate as written in config: `amount` per `period_ms`, bursting to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    /// Tokens (or turns) per period.
    pub amount: i64,
    /// The period in ms (60,000 for "per minute").
    pub period_ms: i64,
    /// The burst: most the bucket holds. Defaults to `amount`.
    #[serde(default)]
    pub burst: Option<i64>,
}

impl RateConfig {
    /// Validates this rate as the bucket it describes: the one rate rule of
    /// every config (plans, Envoy RLS rules, provider quotas). `amount` and
    /// `period_ms` at least 1, `burst` (default `amount`) at least 1, and
    /// the 2^53 rule of [`BucketSpec::new`]. Each problem is pushed to
    /// `errors` under `path` (`plans.support.turns.amount: must be at least
    /// 1 (got 0)`); checks after a bad field go on with 1 in its place, so
    /// every problem is listed at once.
    ///
    /// Answers the bucket, or `None` if anything was wrong.
    pub fn validate(&self, path: &str, errors: &mut Vec<FieldError>) -> Option<BucketSpec> {
        let before = errors.len();
        let mut at_least_1 = |field: &str, v: i64, what: &str| -> u64 {
            if v < 1 {
                errors.push(FieldError {
                    path: format!("{path}.{field}"),
                    reason: format!("{what}must be at least 1 (got {v})"),
                });
                1
            } else {
                v as u64
            }
        };
        let amount = at_least_1("amount", self.amount, "");
        let period = at_least_1("period_ms", self.period_ms, "");
        let burst = match self.burst {
            Some(b) => at_least_1("burst", b, "capacity "),
            None => amount,
        };
        match BucketSpec::new(amount, period, burst) {
            Ok(spec) if errors.len() == before => Some(spec),
            Ok(_) => None,
            Err(_) => {
                errors.push(FieldError {
                    path: path.to_owned(),
                    reason: format!(
                        "burst × period_ms ({burst} × {period}) and amount × period_ms must not exceed 2^53"
                    ),
                });
                None
            }
        }
    }
}

/// A plan as written in config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// Turn rate per user.
    pub turns: RateConfig,
    /// Token rate per user.
    pub tokens: RateConfig,
    /// Longest a model call may wait for tokens, ms (0: refuse at once).
    #[serde(default)]
    pub max_wait_ms: i64,
    /// Concurrent runs per user.
    pub concurrent_runs: i64,
    /// Run lease TTL, ms (default 120,000).
    #[serde(default)]
    pub lease_ttl_ms: Option<i64>,
    /// Cap on the concurrency retry hint, ms (default 1,000).
    #[serde(default)]
    pub concurrency_retry_ms: Option<i64>,
    /// Model calls per run (default 500).
    #[serde(default)]
    pub max_llm_calls: Option<i64>,
    /// Tokens a model call is estimated at before anything is known about
    /// it (default 1,000, capped at `tokens.burst`). Estimators start here
    /// and learn from actual usage.
    #[serde(default)]
    pub estimate_tokens: Option<i64>,
    /// Live sessions per user in the sidecar (default 1,000; at most
    /// 100,000).
    #[serde(default)]
    pub max_sessions: Option<i64>,
    /// Shadow mode: decide and count, but never refuse.
    #[serde(default)]
    pub shadow: bool,
    /// Spend budgets per day, week and month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<BudgetsConfig>,
}

/// Per-user changes over the user's plan; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanOverride {
    /// Replaces the plan's turn rate.
    #[serde(default)]
    pub turns: Option<RateConfig>,
    /// Replaces the plan's token rate.
    #[serde(default)]
    pub tokens: Option<RateConfig>,
    /// Replaces `max_wait_ms`.
    #[serde(default)]
    pub max_wait_ms: Option<i64>,
    /// Replaces `concurrent_runs`.
    #[serde(default)]
    pub concurrent_runs: Option<i64>,
    /// Replaces `lease_ttl_ms`.
    #[serde(default)]
    pub lease_ttl_ms: Option<i64>,
    /// Replaces `concurrency_retry_ms`.
    #[serde(default)]
    pub concurrency_retry_ms: Option<i64>,
    /// Replaces `max_llm_calls`.
    #[serde(default)]
    pub max_llm_calls: Option<i64>,
    /// Replaces `estimate_tokens`.
    #[serde(default)]
    pub estimate_tokens: Option<i64>,
    /// Replaces `max_sessions`.
    #[serde(default)]
    pub max_sessions: Option<i64>,
    /// Replaces `shadow`.
    #[serde(default)]
    pub shadow: Option<bool>,
    /// Each field given replaces the plan's budget field (a window, the
    /// `on_exhausted` policy, the default price); the rest are the plan's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<BudgetsConfig>,
}

/// Plans, user assignments and overrides as written in config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlansConfig {
    /// The plan of users with no assignment; without it they are refused
    /// with [`LimiterError::UnknownUser`](crate::LimiterError::UnknownUser).
    #[serde(default)]
    pub default_plan: Option<String>,
    /// Plans by name.
    #[serde(default)]
    pub plans: BTreeMap<String, PlanConfig>,
    /// User id → plan name.
    #[serde(default)]
    pub users: BTreeMap<String, String>,
    /// User id → changes over that user's plan.
    #[serde(default)]
    pub overrides: BTreeMap<String, PlanOverride>,
    /// The one currency of every price and cost budget, an ISO 4217 code
    /// (`"USD"`); required when `prices` or a cost budget is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Prices by `"provider:model"`, per million tokens in `currency`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: PricesConfig,
    /// Settings of every plan's budgets: the time zone of their windows.
    #[serde(default)]
    pub budgets: BudgetSettingsConfig,
}

/// A validated plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The plan's name (`name+override` for a user with an override).
    pub name: Arc<str>,
    /// Turn bucket.
    pub turns: BucketSpec,
    /// Token bucket.
    pub tokens: BucketSpec,
    /// Longest token wait, ms.
    pub max_wait_ms: u64,
    /// Concurrent runs.
    pub concurrent_runs: u32,
    /// Run lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Cap on the concurrency retry hint, ms.
    pub concurrency_retry_ms: u64,
    /// Model calls per run.
    pub max_llm_calls: u64,
    /// Tokens a model call is estimated at before anything is known.
    pub estimate_tokens: u64,
    /// Live sessions per user (sidecar session leases).
    pub max_sessions: u32,
    /// Shadow mode.
    pub shadow: bool,
    /// Spend budgets, if any window is set.
    pub budgets: Option<Budgets>,
}

/// One problem in a config, addressed by its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where, e.g. `plans.support.turns.amount`.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

/// A key as TOML writes it: bare when it can be (ASCII letters, digits,
/// `-`, `_`), else a basic string with `"`, `\` and control characters
/// escaped. The one spelling of a key in config field paths and in the
/// TOML the planner writes.
pub fn toml_key(k: &str) -> String {
    use fmt::Write as _;
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return k.to_owned();
    }
    let mut s = String::from("\"");
    for c in k.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(s, "\\u{:04X}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// A field path as TOML writes it, for a [`FieldError`] of a config file:
/// keys by [`toml_key`] (`providers."openai:gpt-4o".requests.brust`, as
/// validation names them), array indexes in brackets. Empty for the whole
/// file. The server's config and the planner both name a serde error's
/// field with it.
pub fn toml_path(path: &serde_path_to_error::Path) -> String {
    use fmt::Write as _;
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        let key = match segment {
            Segment::Seq { index } => {
                let _ = write!(out, "[{index}]");
                continue;
            }
            Segment::Map { key } | Segment::Enum { variant: key } => key.as_str(),
            Segment::Unknown => "?",
        };
        if !out.is_empty() {
            out.push('.');
        }
        if key == "?" {
            out.push_str(key);
        } else {
            out.push_str(&toml_key(key));
        }
    }
    out
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// A config that failed validation: every problem found, not just the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid plans: {}", .errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidPlans {
    /// Each problem.
    pub errors: Vec<FieldError>,
}

/// Validated plans with every user's effective plan resolved.
#[derive(Debug, Clone, Default)]
pub struct PlanBook {
    plans: HashMap<String, Arc<Plan>>,
    users: HashMap<String, Arc<Plan>>,
    default: Option<Arc<Plan>>,
    currency: Option<Arc<str>>,
    prices: PriceBook,
    zone: BudgetZone,
    alerts: Arc<[u8]>,
}

struct Check {
    errors: Vec<FieldError>,
    budget: BudgetContext,
}

impl Check {
    fn err(&mut self, path: &str, reason: impl Into<String>) {
        self.errors.push(FieldError {
            path: path.to_owned(),
            reason: reason.into(),
        });
    }

    fn positive(&mut self, path: &str, v: i64) -> u64 {
        if v <= 0 {
            self.err(path, format!("must be at least 1 (got {v})"));
            1
        } else {
            v as u64
        }
    }

    fn ttl(&mut self, path: &str, v: i64) -> u64 {
        let v = self.positive(path, v);
        if v > MAX_TTL_MS {
            self.err(
                path,
                format!("must be at most {MAX_TTL_MS} (30 days; got {v})"),
            );
        }
        v
    }

    fn non_negative(&mut self, path: &str, v: i64) -> u64 {
        if v < 0 {
            self.err(path, format!("must not be negative (got {v})"));
            0
        } else {
            v as u64
        }
    }

    fn rate(&mut self, path: &str, r: &RateConfig) -> BucketSpec {
        // A placeholder after an error, so the checks that follow still run.
        r.validate(path, &mut self.errors)
            .unwrap_or_else(|| BucketSpec::new(1, 1, 1).expect("valid"))
    }

    fn plan(&mut self, path: &str, name: &str, c: &PlanConfig) -> Plan {
        let turns = self.rate(&format!("{path}.turns"), &c.turns);
        let tokens = self.rate(&format!("{path}.tokens"), &c.tokens);
        let max_wait_ms = self.non_negative(&format!("{path}.max_wait_ms"), c.max_wait_ms);
        // The largest grantable cost and the deepest debt a take can leave
        // must stay exact: burst × period + max_wait × amount <= 2^53.
        if u128::from(tokens.capacity()) * u128::from(tokens.period_ms())
            + u128::from(max_wait_ms) * u128::from(tokens.amount())
            > MAX_SCALED as u128
        {
            self.err(
                &format!("{path}.max_wait_ms"),
                "tokens.burst × tokens.period_ms + max_wait_ms × tokens.amount must not exceed 2^53",
            );
        }
        let runs = self.positive(&format!("{path}.concurrent_runs"), c.concurrent_runs);
        let concurrent_runs = u32::try_from(runs).unwrap_or_else(|_| {
            self.err(&format!("{path}.concurrent_runs"), "must fit in 32 bits");
            1
        });
        let lease_ttl_ms = self.ttl(
            &format!("{path}.lease_ttl_ms"),
            c.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS as i64),
        );
        let concurrency_retry_ms = self.ttl(
            &format!("{path}.concurrency_retry_ms"),
            c.concurrency_retry_ms
                .unwrap_or(DEFAULT_CONCURRENCY_RETRY_MS as i64),
        );
        let max_llm_calls = self.positive(
            &format!("{path}.max_llm_calls"),
            c.max_llm_calls.unwrap_or(DEFAULT_MAX_LLM_CALLS as i64),
        );
        let estimate_tokens = match c.estimate_tokens {
            Some(e) => {
                let path = format!("{path}.estimate_tokens");
                let e = self.positive(&path, e);
                if e > tokens.capacity() {
                    self.err(
                        &path,
                        format!(
                            "must not exceed tokens.burst ({}; got {e})",
                            tokens.capacity()
                        ),
                    );
                }
                e
            }
            None => DEFAULT_ESTIMATE_TOKENS.min(tokens.capacity()),
        };
        let sessions_path = format!("{path}.max_sessions");
        let sessions = self.positive(
            &sessions_path,
            c.max_sessions.unwrap_or(i64::from(DEFAULT_MAX_SESSIONS)),
        );
        let max_sessions = match u32::try_from(sessions) {
            Ok(n) if n <= MAX_MAX_SESSIONS => n,
            _ => {
                self.err(
                    &sessions_path,
                    format!("must be at most {MAX_MAX_SESSIONS} (got {sessions})"),
                );
                1
            }
        };
        let budgets = c
            .budgets
            .as_ref()
            .and_then(|b| b.validate(&format!("{path}.budgets"), self.budget, &mut self.errors));
        Plan {
            name: name.into(),
            turns,
            tokens,
            max_wait_ms,
            concurrent_runs,
            lease_ttl_ms,
            concurrency_retry_ms,
            max_llm_calls,
            estimate_tokens,
            max_sessions,
            shadow: c.shadow,
            budgets,
        }
    }
}

fn apply(base: &PlanConfig, o: &PlanOverride) -> PlanConfig {
    PlanConfig {
        turns: o.turns.unwrap_or(base.turns),
        tokens: o.tokens.unwrap_or(base.tokens),
        max_wait_ms: o.max_wait_ms.unwrap_or(base.max_wait_ms),
        concurrent_runs: o.concurrent_runs.unwrap_or(base.concurrent_runs),
        lease_ttl_ms: o.lease_ttl_ms.or(base.lease_ttl_ms),
        concurrency_retry_ms: o.concurrency_retry_ms.or(base.concurrency_retry_ms),
        max_llm_calls: o.max_llm_calls.or(base.max_llm_calls),
        estimate_tokens: o.estimate_tokens.or(base.estimate_tokens),
        max_sessions: o.max_sessions.or(base.max_sessions),
        shadow: o.shadow.unwrap_or(base.shadow),
        budgets: match (&base.budgets, &o.budgets) {
            (Some(b), Some(o)) => Some(b.merged(o)),
            (b, o) => o.clone().or_else(|| b.clone()),
        },
    }
}

impl PlansConfig {
    /// Validates every plan, assignment and override.
    ///
    /// # Errors
    ///
    /// Every problem found, each with its field path: zero or negative
    /// amounts or periods, a burst below 1, a negative `max_wait_ms`, scaled
    /// values past 2^53, a reference to an unknown plan, a bad `currency`,
    /// price, budget or `budgets.time_zone`.
    pub fn validate(&self) -> Result<PlanBook, InvalidPlans> {
        let mut errors = Vec::new();
        let currency = match &self.currency {
            Some(code) => match money::validate_currency(code) {
                Ok(()) => Some(Arc::<str>::from(code.as_str())),
                Err(reason) => {
                    errors.push(FieldError {
                        path: "currency".into(),
                        reason,
                    });
                    None
                }
            },
            None => None,
        };
        if self.currency.is_none() && !self.prices.is_empty() {
            errors.push(FieldError {
                path: "currency".into(),
                reason: "must be set when [prices] is: prices are in the config's one currency"
                    .into(),
            });
        }
        let prices = money::validate_prices(&self.prices, &mut errors);
        let zone = match &self.budgets.time_zone {
            Some(name) => BudgetZone::new(name).unwrap_or_else(|e| {
                errors.push(FieldError {
                    path: "budgets.time_zone".into(),
                    reason: e.to_string(),
                });
                BudgetZone::default()
            }),
            None => BudgetZone::default(),
        };
        let alerts: Arc<[u8]> = match self.budgets.alerts() {
            Ok(a) => a.into(),
            Err(reason) => {
                errors.push(FieldError {
                    path: "budgets.alert_percent".into(),
                    reason,
                });
                Arc::from([])
            }
        };
        let mut c = Check {
            errors,
            budget: BudgetContext {
                // A bad currency is reported once, at `currency`.
                currency: self.currency.is_some(),
                prices: !self.prices.is_empty(),
            },
        };
        let mut plans = HashMap::new();
        for (name, p) in &self.plans {
            let plan = c.plan(&format!("plans.{name}"), name, p);
            plans.insert(name.clone(), Arc::new(plan));
        }
        let default = match &self.default_plan {
            Some(name) => match plans.get(name) {
                Some(p) => Some(p.clone()),
                None => {
                    c.err("default_plan", format!("unknown plan {name:?}"));
                    None
                }
            },
            None => None,
        };
        let mut users = HashMap::new();
        for (user, name) in &self.users {
            match plans.get(name) {
                Some(p) => {
                    users.insert(user.clone(), p.clone());
                }
                None => c.err(&format!("users.{user}"), format!("unknown plan {name:?}")),
            }
        }
        for (user, o) in &self.overrides {
            let base_name = self.users.get(user).or(self.default_plan.as_ref());
            let Some(base_name) = base_name else {
                c.err(
                    &format!("overrides.{user}"),
                    "user has no plan (no assignment and no default_plan)",
                );
                continue;
            };
            let Some(base) = self.plans.get(base_name) else {
                continue; // reported above
            };
            let merged = apply(base, o);
            let plan = c.plan(
                &format!("overrides.{user}"),
                &format!("{base_name}+override"),
                &merged,
            );
            users.insert(user.clone(), Arc::new(plan));
        }
        if c.errors.is_empty() {
            Ok(PlanBook {
                plans,
                users,
                default,
                currency,
                prices,
                zone,
                alerts,
            })
        } else {
            Err(InvalidPlans { errors: c.errors })
        }
    }
}

impl PlanBook {
    /// The effective plan of `user`: override, assignment or default.
    pub fn resolve(&self, user: &str) -> Option<&Arc<Plan>> {
        self.users.get(user).or(self.default.as_ref())
    }

    /// A plan by name.
    pub fn plan(&self, name: &str) -> Option<&Arc<Plan>> {
        self.plans.get(name)
    }

    /// The plan names.
    pub fn plan_names(&self) -> impl Iterator<Item = &str> {
        self.plans.keys().map(String::as_str)
    }

    /// The config's currency (`"USD"`), if set.
    pub fn currency(&self) -> Option<&str> {
        self.currency.as_deref()
    }

    /// The validated `[prices]`.
    pub fn prices(&self) -> &PriceBook {
        &self.prices
    }

    /// The time zone of budget windows (`[budgets] time_zone`, default
    /// UTC).
    pub fn budget_zone(&self) -> &BudgetZone {
        &self.zone
    }

    /// The budgets' alert thresholds, percent (`[budgets] alert_percent`,
    /// default 80 and 100).
    pub fn budget_alerts(&self) -> &[u8] {
        &self.alerts
    }
}

impl PlansConfig {}

#[cfg(test)]
pub(crate) mod tests;
