//! `tollgate derive`: limits suggested from per-turn usage records.
//!
//! The input is JSON lines, one object per turn, sorted by time:
//! `{"t_ms": 0, "user": "u1", "plan": "support", "tokens": 5400,
//! "model_calls": 3, "duration_ms": 8000}` (`duration_ms` optional).
//!
//! Per user (and plan) it keeps a few counters, whatever the number of
//! records: the busiest calendar minute (turns and tokens started in it),
//! the busiest calendar 10 seconds, and, with durations, the most turns
//! running at once. Per plan it takes the **95th percentile over users by
//! nearest rank** (the value at rank ⌈0.95 × n⌉ of the n users' values in
//! ascending order) and suggests limits at a multiple of it (default 2.5×),
//! rounded up to two significant digits (37.5 → 38, 58,320 → 59,000):
//!
//! | setting | from |
//! |---|---|
//! | `turns.amount` (per minute) | p95 of the busiest minute's turns × multiple |
//! | `turns.burst` | p95 of the busiest 10 s's turns × multiple, at most `turns.amount` |
//! | `tokens.amount` (per minute; burst = amount) | p95 of the busiest minute's tokens × multiple |
//! | `concurrent_runs` | p95 of the most turns at once × multiple (2 without durations) |
//! | `max_llm_calls` | the most model calls of one turn × multiple |
//! | `estimate_tokens` | mean tokens per model call, at most `tokens.amount` |
//! | `max_wait_ms` | 2,000: not derived from usage |
//! | `budgets.monthly` (tokens) | p95 of each user's busiest calendar month's tokens (UTC) × multiple, a month the records cover only in part (they start or end inside it) scaled to the whole month first (× its length / the part covered, at least an hour) |
//!
//! ```
//! use tollgate_planner::derive::{DEFAULT_MULTIPLE, derive};
//!
//! let usage = r#"{"t_ms": 0, "user": "u1", "plan": "support", "tokens": 6000, "model_calls": 2}
//! {"t_ms": 1000, "user": "u1", "plan": "support", "tokens": 2000, "model_calls": 1}"#;
//! let report = derive(usage.as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
//! let plan = &report.plans["support"].suggested;
//! assert_eq!((plan.turns.amount, plan.tokens.amount), (5, 20_000));
//! assert!(report.to_toml().contains("[plans.support]"));
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tollgate_core::budget::{BudgetAmountConfig, BudgetsConfig};
use tollgate_core::calendar::{BudgetZone, Period, Window};
use tollgate_core::plan::toml_key;
use tollgate_core::{PlanConfig, RateConfig};

/// The suggested monthly token budget of `s`.
fn monthly_tokens(s: &PlanConfig) -> Option<i64> {
    s.budgets.as_ref()?.monthly.as_ref()?.tokens
}

use crate::jsonl::{self, Lines};
use crate::rational::group;
use crate::{PlanError, Rational};

/// The default multiple of the 95th percentile: 2.5×.
pub const DEFAULT_MULTIPLE: Rational = Rational::reduced(5, 2);
/// The `max_wait_ms` every suggested plan gets (not derived from usage).
pub const SUGGESTED_MAX_WAIT_MS: i64 = 2_000;
/// The `concurrent_runs` suggested when the records carry no durations.
pub const CONCURRENCY_WITHOUT_DURATIONS: i64 = 2;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUsage<'a> {
    t_ms: Option<u64>,
    #[serde(borrow)]
    user: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    plan: Option<std::borrow::Cow<'a, str>>,
    tokens: Option<u64>,
    model_calls: Option<u64>,
    duration_ms: Option<u64>,
}

/// One user's counters.
#[derive(Default)]
struct UserUsage {
    minute: Option<u64>,
    minute_turns: u64,
    minute_tokens: u64,
    peak_turns_min: u64,
    peak_tokens_min: u64,
    ten: Option<u64>,
    ten_turns: u64,
    peak_turns_10s: u64,
    running: BinaryHeap<Reverse<u64>>,
    peak_running: u64,
    month: Window,
    month_tokens: u64,
    peak_tokens_month: u64,
    peak_month: Window,
}

impl UserUsage {
    fn record(&mut self, t: u64, tokens: u64, duration: Option<u64>) {
        let m = t / 60_000;
        if self.minute != Some(m) {
            self.minute = Some(m);
            self.minute_turns = 0;
            self.minute_tokens = 0;
        }
        self.minute_turns += 1;
        self.minute_tokens = self.minute_tokens.saturating_add(tokens);
        self.peak_turns_min = self.peak_turns_min.max(self.minute_turns);
        self.peak_tokens_min = self.peak_tokens_min.max(self.minute_tokens);
        let ten = t / 10_000;
        if self.ten != Some(ten) {
            self.ten = Some(ten);
            self.ten_turns = 0;
        }
        self.ten_turns += 1;
        self.peak_turns_10s = self.peak_turns_10s.max(self.ten_turns);
        if t >= self.month.end_ms {
            // A new calendar month (UTC), computed once per month.
            self.month = month_of(t);
            self.month_tokens = 0;
        }
        self.month_tokens = self.month_tokens.saturating_add(tokens);
        if self.month_tokens > self.peak_tokens_month {
            self.peak_tokens_month = self.month_tokens;
            self.peak_month = self.month;
        }
        if let Some(d) = duration {
            while self.running.peek().is_some_and(|Reverse(end)| *end <= t) {
                self.running.pop();
            }
            self.running.push(Reverse(t.saturating_add(d)));
            self.peak_running = self.peak_running.max(self.running.len() as u64);
        }
    }
}

/// The calendar month (UTC) holding `t` (the window past the calendar's
/// range for an instant it cannot place).
fn month_of(t: u64) -> Window {
    BudgetZone::default().windows(Period::Monthly, t).map_or(
        Window {
            start_ms: t,
            end_ms: u64::MAX,
        },
        |w| w.current,
    )
}

/// The least part of a month a user's tokens are scaled from: an hour.
const MIN_COVERED_MS: u64 = 3_600_000;

/// `tokens` spent in `month`, of which the records cover `[first, last]`,
/// scaled to the whole month: × its length / the part covered (at least
/// [`MIN_COVERED_MS`]; never below the tokens themselves), rounded up.
fn whole_month(tokens: u64, month: Window, first: u64, last: u64) -> u64 {
    let len = month.end_ms.saturating_sub(month.start_ms);
    let covered = month
        .end_ms
        .min(last.saturating_add(1))
        .saturating_sub(month.start_ms.max(first))
        .max(MIN_COVERED_MS);
    if covered >= len {
        return tokens;
    }
    let scaled = (u128::from(tokens) * u128::from(len)).div_ceil(u128::from(covered));
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct PlanAcc {
    users: HashMap<String, UserUsage>,
    turns: u64,
    tokens: u64,
    calls: u64,
    max_calls: u64,
    without_duration: u64,
}

/// A distribution over a plan's users: nearest-rank percentiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Dist {
    /// The median user.
    pub p50: u64,
    /// The 95th percentile user.
    pub p95: u64,
    /// The busiest user.
    pub max: u64,
}

/// The nearest-rank percentile `pct` of ascending `sorted` (not empty).
fn nearest_rank(sorted: &[u64], pct: u64) -> u64 {
    let rank = (sorted.len() as u64 * pct).div_ceil(100).max(1);
    sorted[(rank - 1) as usize]
}

fn dist(mut values: Vec<u64>) -> Dist {
    values.sort_unstable();
    Dist {
        p50: nearest_rank(&values, 50),
        p95: nearest_rank(&values, 95),
        max: *values.last().unwrap_or(&0),
    }
}

/// `x` rounded up: to a whole number, then (from 100 on) to two
/// significant digits. 37.5 → 38, 125 → 130, 58,320 → 59,000.
pub fn round_up(x: Rational) -> u64 {
    let c = u64::try_from(x.ceil()).unwrap_or(u64::MAX);
    if c < 100 {
        return c;
    }
    let digits = c.ilog10() + 1;
    let step = 10u64.pow(digits - 2);
    c.div_ceil(step).saturating_mul(step)
}

/// What the usage says about one plan, and the limits suggested for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PlanUsage {
    /// Distinct users.
    pub users: u64,
    /// Turns (records).
    pub turns: u64,
    /// Tokens of all turns.
    pub tokens: u64,
    /// Model calls of all turns.
    pub model_calls: u64,
    /// Per user, turns in the busiest calendar minute.
    pub turns_per_min: Dist,
    /// Per user, turns in the busiest calendar 10 seconds.
    pub turns_per_10s: Dist,
    /// Per user, tokens in the busiest calendar minute.
    pub tokens_per_min: Dist,
    /// Per user, the most turns running at once; `None` unless every
    /// record has `duration_ms`.
    pub concurrent_turns: Option<Dist>,
    /// The most model calls of one turn.
    pub max_calls_per_turn: u64,
    /// Mean tokens per model call, rounded up; `None` without calls.
    pub tokens_per_call: Option<u64>,
    /// Per user, tokens in the busiest calendar month (UTC), scaled to the
    /// whole month when the records cover only part of it.
    pub tokens_per_month: Dist,
    /// The suggested plan.
    pub suggested: PlanConfig,
}

/// What `tollgate derive` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeriveReport {
    /// The input's name.
    pub source: String,
    /// The multiple applied to the 95th percentiles.
    #[serde(serialize_with = "ser_rational")]
    pub multiple: Rational,
    /// Records read.
    pub records: u64,
    /// From the first record's time to the last's, ms.
    pub span_ms: u64,
    /// Per plan, by name.
    pub plans: BTreeMap<String, PlanUsage>,
}

fn ser_rational<S: serde::Serializer>(r: &Rational, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(r.to_f64())
}

/// Reads usage records from `usage` (`source_name` names it in errors) and
/// suggests a plan per plan name at `multiple` × the 95th percentiles.
///
/// # Errors
///
/// [`PlanError::Line`] for a malformed record (its line and field) or one
/// earlier than the one before; [`PlanError::Input`] if `multiple` is 0.
pub fn derive<R: BufRead>(
    usage: R,
    source_name: &str,
    multiple: Rational,
) -> Result<DeriveReport, PlanError> {
    if multiple.is_zero() {
        return Err(PlanError::input("--multiple", "must be more than 0"));
    }
    let mut plans: BTreeMap<String, PlanAcc> = BTreeMap::new();
    let mut lines = Lines::new(usage, source_name);
    let mut records = 0u64;
    let mut last_t = None;
    let mut first_t = None;
    while let Some((line, text)) = lines.next_line()? {
        let raw: RawUsage<'_> = jsonl::parse(source_name, line, text)?;
        let err =
            |field: &str, reason: &str| PlanError::line(source_name, line, Some(field), reason);
        let t = raw.t_ms.ok_or_else(|| err("t_ms", "missing"))?;
        let user = raw.user.ok_or_else(|| err("user", "missing"))?;
        let plan = raw.plan.ok_or_else(|| err("plan", "missing"))?;
        if user.is_empty() {
            return Err(err("user", "must not be empty"));
        }
        if plan.is_empty() {
            return Err(err("plan", "must not be empty"));
        }
        let tokens = raw.tokens.ok_or_else(|| err("tokens", "missing"))?;
        let calls = raw
            .model_calls
            .ok_or_else(|| err("model_calls", "missing"))?;
        if let Some(last) = last_t
            && t < last
        {
            return Err(err(
                "t_ms",
                &format!(
                    "{t} is earlier than the previous record's {last}: records must be sorted by time"
                ),
            ));
        }
        last_t = Some(t);
        first_t.get_or_insert(t);
        records += 1;
        let acc = match plans.get_mut(&*plan) {
            Some(a) => a,
            None => plans.entry(plan.into_owned()).or_default(),
        };
        acc.turns += 1;
        acc.tokens = acc.tokens.saturating_add(tokens);
        acc.calls = acc.calls.saturating_add(calls);
        acc.max_calls = acc.max_calls.max(calls);
        if raw.duration_ms.is_none() {
            acc.without_duration += 1;
        }
        let u = match acc.users.get_mut(&*user) {
            Some(u) => u,
            None => acc.users.entry(user.into_owned()).or_default(),
        };
        u.record(t, tokens, raw.duration_ms);
    }
    let times = |v: u64| -> Result<u64, PlanError> {
        Rational::int(v)
            .try_mul(multiple)
            .map(round_up)
            .map_err(|_| PlanError::input("--multiple", "too large"))
    };
    let (first, last) = (first_t.unwrap_or(0), last_t.unwrap_or(0));
    let span_ms = last - first;
    let mut out = BTreeMap::new();
    for (name, p) in plans {
        let pick = |f: fn(&UserUsage) -> u64| dist(p.users.values().map(f).collect());
        let turns_per_min = pick(|u| u.peak_turns_min);
        let turns_per_10s = pick(|u| u.peak_turns_10s);
        let tokens_per_min = pick(|u| u.peak_tokens_min);
        let concurrent_turns = (p.without_duration == 0).then(|| pick(|u| u.peak_running));
        let tokens_per_call = (p.calls > 0).then(|| p.tokens.div_ceil(p.calls));
        let tokens_per_month = dist(
            p.users
                .values()
                .map(|u| whole_month(u.peak_tokens_month, u.peak_month, first, last))
                .collect(),
        );
        let monthly = times(tokens_per_month.p95)?.clamp(1, tollgate_core::spend::MAX_AMOUNT);
        let turns_amount = times(turns_per_min.p95)?.max(1);
        let tokens_amount = times(tokens_per_min.p95)?.max(1);
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let suggested = PlanConfig {
            turns: RateConfig {
                amount: to_i64(turns_amount),
                period_ms: 60_000,
                burst: Some(to_i64(times(turns_per_10s.p95)?.clamp(1, turns_amount))),
            },
            tokens: RateConfig {
                amount: to_i64(tokens_amount),
                period_ms: 60_000,
                burst: None,
            },
            max_wait_ms: SUGGESTED_MAX_WAIT_MS,
            concurrent_runs: match &concurrent_turns {
                Some(c) => to_i64(times(c.p95)?.max(1)),
                None => CONCURRENCY_WITHOUT_DURATIONS,
            },
            lease_ttl_ms: None,
            concurrency_retry_ms: None,
            max_llm_calls: match p.max_calls {
                0 => None,
                m => Some(to_i64(times(m)?)),
            },
            estimate_tokens: tokens_per_call
                .map(|e| to_i64(round_up(Rational::int(e)).clamp(1, tokens_amount))),
            max_sessions: None,
            shadow: false,
            budgets: Some(BudgetsConfig {
                monthly: Some(BudgetAmountConfig {
                    tokens: Some(to_i64(monthly)),
                    cost: None,
                }),
                ..BudgetsConfig::default()
            }),
        };
        out.insert(
            name,
            PlanUsage {
                users: p.users.len() as u64,
                turns: p.turns,
                tokens: p.tokens,
                model_calls: p.calls,
                turns_per_min,
                turns_per_10s,
                tokens_per_min,
                concurrent_turns,
                max_calls_per_turn: p.max_calls,
                tokens_per_call,
                tokens_per_month,
                suggested,
            },
        );
    }
    Ok(DeriveReport {
        source: source_name.to_owned(),
        multiple,
        records,
        span_ms,
        plans: out,
    })
}

/// [`derive()`] from the file at `path`.
///
/// # Errors
///
/// [`PlanError::Io`] if it cannot be read, else as [`derive()`].
pub fn derive_file(path: &Path, multiple: Rational) -> Result<DeriveReport, PlanError> {
    let f = std::fs::File::open(path).map_err(|e| PlanError::read(path, e))?;
    derive(
        BufReader::with_capacity(1 << 16, f),
        &path.display().to_string(),
        multiple,
    )
}

fn n(v: u64) -> String {
    group(u128::from(v))
}

impl DeriveReport {
    /// The suggested plans as `[plans.<name>]` sections, ready to paste
    /// into the config file; comments give the numbers behind each value.
    pub fn to_toml(&self) -> String {
        let m = self.multiple.display(2);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# Suggested by `tollgate derive` from {} ({} turns), at {m}× the 95th",
            self.source,
            n(self.records)
        );
        out.push_str(
            "# percentile over each plan's users (nearest rank). Per user: the busiest\n\
             # calendar minute (turns/min, tokens/min), the busiest 10 s (burst), the\n\
             # most turns at once (concurrency) and the busiest calendar month (a\n\
             # monthly token budget). Review before use.\n",
        );
        for (name, p) in &self.plans {
            let s = &p.suggested;
            let _ = writeln!(out, "\n[plans.{}]", toml_key(name));
            let _ = writeln!(
                out,
                "# {} users, {} turns; turns/min p95 {} (max {}), busiest 10 s p95 {}",
                n(p.users),
                n(p.turns),
                n(p.turns_per_min.p95),
                n(p.turns_per_min.max),
                n(p.turns_per_10s.p95)
            );
            let _ = writeln!(
                out,
                "turns = {{ amount = {}, period_ms = 60000, burst = {} }}",
                s.turns.amount,
                s.turns.burst.unwrap_or(s.turns.amount)
            );
            let _ = writeln!(
                out,
                "# tokens/min p95 {} (max {})",
                n(p.tokens_per_min.p95),
                n(p.tokens_per_min.max)
            );
            let _ = writeln!(
                out,
                "tokens = {{ amount = {}, period_ms = 60000 }}",
                s.tokens.amount
            );
            match &p.concurrent_turns {
                Some(c) => {
                    let _ = writeln!(out, "# turns at once p95 {} (max {})", n(c.p95), n(c.max));
                }
                None => out
                    .push_str("# no duration_ms in the usage: concurrent_runs is a placeholder\n"),
            }
            let _ = writeln!(out, "concurrent_runs = {}", s.concurrent_runs);
            out.push_str("# not derived from usage: the longest a model call waits for tokens\n");
            let _ = writeln!(out, "max_wait_ms = {}", s.max_wait_ms);
            if let Some(calls) = s.max_llm_calls {
                let _ = writeln!(
                    out,
                    "# most model calls in one turn: {}",
                    n(p.max_calls_per_turn)
                );
                let _ = writeln!(out, "max_llm_calls = {calls}");
            }
            if let (Some(e), Some(mean)) = (s.estimate_tokens, p.tokens_per_call) {
                let _ = writeln!(out, "# mean tokens per model call: {}", n(mean));
                let _ = writeln!(out, "estimate_tokens = {e}");
            }
            if let Some(tokens) = monthly_tokens(s) {
                let _ = writeln!(out, "\n[plans.{}.budgets]", toml_key(name));
                let _ = writeln!(
                    out,
                    "# tokens in the busiest calendar month (UTC), a month the records cover in\n\
                     # part scaled to the whole: p95 {} (max {})",
                    n(p.tokens_per_month.p95),
                    n(p.tokens_per_month.max),
                );
                let _ = writeln!(out, "monthly = {{ tokens = {tokens} }}");
            }
        }
        out
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The numbers behind the suggestions, as a table for people.
    pub fn to_table(&self) -> String {
        let m = self.multiple.display(2);
        let mut out = String::new();
        for (name, p) in &self.plans {
            let s = &p.suggested;
            let _ = writeln!(
                out,
                "plan {name}: {} users, {} turns, {} model calls",
                n(p.users),
                n(p.turns),
                n(p.model_calls)
            );
            let mut rows = vec![[
                "  per user".to_owned(),
                "p50".into(),
                "p95".into(),
                "max".into(),
                format!("suggested ({m}× p95)"),
            ]];
            let mut row = |label: &str, d: &Dist, suggestion: String| {
                rows.push([
                    format!("  {label}"),
                    n(d.p50),
                    n(d.p95),
                    n(d.max),
                    suggestion,
                ]);
            };
            row(
                "turns/min (busiest minute)",
                &p.turns_per_min,
                format!("turns.amount = {}", s.turns.amount),
            );
            row(
                "turns/10 s (busiest 10 s)",
                &p.turns_per_10s,
                format!("turns.burst = {}", s.turns.burst.unwrap_or(s.turns.amount)),
            );
            row(
                "tokens/min (busiest minute)",
                &p.tokens_per_min,
                format!("tokens.amount = {}", s.tokens.amount),
            );
            if let Some(tokens) = monthly_tokens(s) {
                row(
                    "tokens/month (busiest month)",
                    &p.tokens_per_month,
                    format!("budgets.monthly = {{ tokens = {tokens} }}"),
                );
            }
            if let Some(c) = &p.concurrent_turns {
                row(
                    "turns at once",
                    c,
                    format!("concurrent_runs = {}", s.concurrent_runs),
                );
            }
            let mut widths = [0usize; 5];
            for r in &rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            for r in &rows {
                let mut line = format!("{:<w$}", r[0], w = widths[0]);
                for (c, w) in r.iter().zip(widths).skip(1).take(3) {
                    let _ = write!(line, "  {c:>w$}");
                }
                let _ = write!(line, "  {}", r[4]);
                out.push_str(line.trim_end());
                out.push('\n');
            }
            if p.concurrent_turns.is_none() {
                let _ = writeln!(
                    out,
                    "  no duration_ms in the records: concurrent_runs = {} is a placeholder",
                    s.concurrent_runs
                );
            }
            let _ = writeln!(
                out,
                "  most model calls in one turn: {}{}",
                n(p.max_calls_per_turn),
                match s.max_llm_calls {
                    Some(c) => format!(" (max_llm_calls = {c})"),
                    None => String::new(),
                }
            );
            if let Some(mean) = p.tokens_per_call {
                let _ = writeln!(out, "  mean tokens per model call: {}", n(mean));
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_up_to_two_significant_digits() {
        let r = |s: &str| round_up(s.parse().unwrap());
        assert_eq!(r("0"), 0);
        assert_eq!(r("37.5"), 38);
        assert_eq!(r("99.1"), 100);
        assert_eq!(r("125"), 130);
        assert_eq!(r("58320"), 59_000);
        assert_eq!(r("150000"), 150_000);
        assert_eq!(r("150001"), 160_000);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=20).collect();
        assert_eq!(nearest_rank(&v, 95), 19);
        assert_eq!(nearest_rank(&v, 50), 10);
        assert_eq!(nearest_rank(&[7], 95), 7);
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(nearest_rank(&v, 95), 10);
    }

    #[test]
    fn concurrency_counts_overlapping_turns() {
        let mut u = UserUsage::default();
        u.record(0, 1, Some(10_000));
        u.record(1_000, 1, Some(2_000));
        u.record(3_000, 1, Some(1_000)); // the second ended at 3,000
        u.record(3_500, 1, Some(1_000));
        assert_eq!(u.peak_running, 3);
        assert_eq!(u.peak_turns_min, 4);
        u.record(60_000, 100, Some(1));
        assert_eq!((u.peak_turns_min, u.peak_tokens_min), (4, 100));
    }

    #[test]
    fn malformed_records_name_line_and_field() {
        let cases = [
            (
                r#"{"t_ms": 0, "plan": "p", "tokens": 1, "model_calls": 1}"#,
                r#"u.jsonl: line 2: field "user": missing"#,
            ),
            (
                r#"{"t_ms": 0, "user": "u", "plan": "p", "tokens": "many", "model_calls": 1}"#,
                r#"u.jsonl: line 2: field "tokens": invalid type: string "many", expected u64"#,
            ),
            (
                r#"{"t_ms": 0, "user": "u", "plan": "p", "tokens": 1}"#,
                r#"u.jsonl: line 2: field "model_calls": missing"#,
            ),
            (
                r#"{"t_ms": 0, "user": "u", "plan": "p", "tokens": 1, "model_calls": 1, "cost": 3}"#,
                r#"u.jsonl: line 2: field "cost": unknown field (expected one of `t_ms`, `user`, `plan`, `tokens`, `model_calls`, `duration_ms`)"#,
            ),
        ];
        for (text, want) in cases {
            let input = format!(
                "{{\"t_ms\": 0, \"user\": \"u\", \"plan\": \"p\", \"tokens\": 1, \"model_calls\": 1}}\n{text}\n"
            );
            let e = derive(input.as_bytes(), "u.jsonl", DEFAULT_MULTIPLE).unwrap_err();
            assert_eq!(e.to_string(), want);
            assert_eq!(e.exit_code(), 65);
        }
        let late = "{\"t_ms\": 5, \"user\": \"u\", \"plan\": \"p\", \"tokens\": 1, \"model_calls\": 1}\n\
                    {\"t_ms\": 4, \"user\": \"u\", \"plan\": \"p\", \"tokens\": 1, \"model_calls\": 1}\n";
        let e = derive(late.as_bytes(), "u.jsonl", DEFAULT_MULTIPLE).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(r#"u.jsonl: line 2: field "t_ms": 4 is earlier"#)
        );
        assert!(derive("".as_bytes(), "u", Rational::ZERO).is_err());
    }
}
