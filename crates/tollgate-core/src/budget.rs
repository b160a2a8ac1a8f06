//! Spend budgets as plan data: per-user caps
//! on a calendar day, week and month, in tokens or in money.
//!
//! This module holds the config (`[plans.<name>.budgets]`, the top-level
//! `[budgets]`) and its validation into [`Budgets`]; prices are in
//! [`crate::money`], windows in [`crate::calendar`], what a store does
//! with a budget in [`crate::spend`]. **The server does not pass budgets to
//! the stores yet**: it refuses a config that sets one (docs/spec.md §6).
//!
//! ```toml
//! currency = "USD"
//!
//! [budgets]
//! time_zone = "Europe/Paris"
//!
//! [plans.pro.budgets]
//! daily = { tokens = 2000000 }
//! monthly = { cost = "50.00" }
//! on_exhausted = "deny_model_calls"
//! default_price = { input = "3.00", output = "15.00" }
//! ```

use serde::{Deserialize, Serialize};

use crate::calendar::Period;
use crate::money::{self, Price, PriceBook, PriceConfig};
use crate::plan::FieldError;

/// One window's budget as written: exactly one of `{ tokens = N }` or
/// `{ cost = "50.00" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetAmountConfig {
    /// Tokens the user may spend in the window (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<i64>,
    /// Money the user may spend in the window: a decimal string in the
    /// config's `currency`, more than 0, at most 6 decimals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
}

/// What is refused once a budget is spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// Refuse token reservations (model calls); turns are still admitted,
    /// so an agent can answer without a model. The default.
    #[default]
    DenyModelCalls,
    /// Refuse new turns too.
    DenyTurns,
}

/// What decides a budget while the shared store fails under `fail_open`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOutage {
    /// Nothing: a request naming the budget fails (503) until the store
    /// answers, as a fresh window would forget what the user spent. The
    /// default.
    #[default]
    FailClosed,
    /// The replica's fallback, like the rates: at its `fallback_share` of
    /// the limit, from a fresh window (what was spent before the outage is
    /// not known there), its charges added to the shared store's window
    /// when it answers again.
    Fallback,
}

/// `[plans.<name>.budgets]` (and `[overrides.<user>.budgets]`) as written.
/// In an override, each field given replaces the plan's; the others are
/// the plan's (an override cannot remove a window, only set another).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsConfig {
    /// Budget of each local day (from midnight in `[budgets] time_zone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily: Option<BudgetAmountConfig>,
    /// Budget of each week (from Monday 00:00 local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekly: Option<BudgetAmountConfig>,
    /// Budget of each calendar month (from the 1st 00:00 local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly: Option<BudgetAmountConfig>,
    /// What is refused once a budget is spent (default
    /// `deny_model_calls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exhausted: Option<OnExhausted>,
    /// What decides the budgets while the shared store fails under
    /// `fail_open` (default `fail_closed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_outage: Option<OnOutage>,
    /// The price of a model `[prices]` does not name; without it, a call
    /// to such a model cannot be charged to a cost budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_price: Option<PriceConfig>,
}

/// The top-level `[budgets]` table: settings shared by every plan's
/// budgets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettingsConfig {
    /// The IANA time zone of the calendar windows (default `"UTC"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Alert thresholds, percent of a budget's limit (default `[80, 100]`):
    /// a user whose spend in a window first reaches one is counted and
    /// logged once for that window. Each 1 to 100, ascending, at most 8;
    /// `[]` for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_percent: Option<Vec<u8>>,
}

/// The alert thresholds when `[budgets]` names none.
pub const DEFAULT_ALERT_PERCENT: [u8; 2] = [80, 100];

impl BudgetSettingsConfig {
    /// The alert thresholds, or why they are invalid.
    pub fn alerts(&self) -> Result<Vec<u8>, String> {
        let Some(a) = &self.alert_percent else {
            return Ok(DEFAULT_ALERT_PERCENT.to_vec());
        };
        if a.len() > crate::spend::MAX_ALERTS {
            return Err(format!(
                "at most {} thresholds (got {})",
                crate::spend::MAX_ALERTS,
                a.len()
            ));
        }
        if let Some(bad) = a.iter().find(|p| !(1..=100).contains(*p)) {
            return Err(format!("each must be 1 to 100 (got {bad})"));
        }
        if a.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("must be ascending without repeats (got {a:?})"));
        }
        Ok(a.clone())
    }
}

/// A validated budget of one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetAmount {
    /// Tokens per window.
    Tokens(u64),
    /// Micro-units of the currency per window.
    Cost(u64),
}

/// A plan's validated budgets: at least one window is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    /// Per local day.
    pub daily: Option<BudgetAmount>,
    /// Per week from Monday.
    pub weekly: Option<BudgetAmount>,
    /// Per calendar month.
    pub monthly: Option<BudgetAmount>,
    /// What is refused once one is spent.
    pub on_exhausted: OnExhausted,
    /// What decides them while the shared store fails under `fail_open`.
    pub on_outage: OnOutage,
    /// The price of a model with no `[prices]` entry.
    pub default_price: Option<Price>,
}

impl Budgets {
    /// The budget of `period`, if set.
    pub fn get(&self, period: Period) -> Option<BudgetAmount> {
        match period {
            Period::Daily => self.daily,
            Period::Weekly => self.weekly,
            Period::Monthly => self.monthly,
        }
    }

    /// The windows set, shortest first.
    pub fn iter(&self) -> impl Iterator<Item = (Period, BudgetAmount)> + '_ {
        Period::ALL
            .into_iter()
            .filter_map(|p| self.get(p).map(|a| (p, a)))
    }

    /// Whether any window is a money amount (calls must then be priced).
    pub fn has_cost(&self) -> bool {
        self.iter().any(|(_, a)| matches!(a, BudgetAmount::Cost(_)))
    }

    /// The price a call to `provider`'s `model` is charged at: the model's
    /// `[prices]` entry, else the plan's `default_price`, else none (such a
    /// call cannot be charged to a cost budget).
    pub fn price<'a>(
        &'a self,
        prices: &'a PriceBook,
        provider: &str,
        model: &str,
    ) -> Option<&'a Price> {
        prices.get(provider, model).or(self.default_price.as_ref())
    }
}

impl BudgetsConfig {
    /// This plan's budgets with `over`'s fields in place of its own.
    pub fn merged(&self, over: &BudgetsConfig) -> BudgetsConfig {
        BudgetsConfig {
            daily: over.daily.clone().or_else(|| self.daily.clone()),
            weekly: over.weekly.clone().or_else(|| self.weekly.clone()),
            monthly: over.monthly.clone().or_else(|| self.monthly.clone()),
            on_exhausted: over.on_exhausted.or(self.on_exhausted),
            on_outage: over.on_outage.or(self.on_outage),
            default_price: over
                .default_price
                .clone()
                .or_else(|| self.default_price.clone()),
        }
    }

    /// Whether a daily, weekly or monthly window is set.
    pub fn has_window(&self) -> bool {
        self.daily.is_some() || self.weekly.is_some() || self.monthly.is_some()
    }
}

/// What budget validation needs from the rest of the config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BudgetContext {
    /// The top-level `currency` is set (and valid).
    pub(crate) currency: bool,
    /// `[prices]` has at least one valid entry.
    pub(crate) prices: bool,
}

impl BudgetsConfig {
    /// Validates the budgets at `path` (`plans.pro.budgets`); each problem
    /// is pushed to `errors` with its field path.
    pub(crate) fn validate(
        &self,
        path: &str,
        ctx: BudgetContext,
        errors: &mut Vec<FieldError>,
    ) -> Option<Budgets> {
        let before = errors.len();
        let mut err = |p: String, reason: String| errors.push(FieldError { path: p, reason });
        if !self.has_window() {
            err(
                path.to_owned(),
                "sets no daily, weekly or monthly budget".into(),
            );
        }
        let mut amount = |period: Period, c: &Option<BudgetAmountConfig>| {
            let c = c.as_ref()?;
            let p = format!("{path}.{period}");
            match (c.tokens, &c.cost) {
                (Some(_), Some(_)) | (None, None) => {
                    err(
                        p,
                        "must be exactly one of { tokens = N } or { cost = \"50.00\" }".into(),
                    );
                    None
                }
                (Some(t), None) if t < 1 => {
                    err(
                        format!("{p}.tokens"),
                        format!("must be at least 1 (got {t})"),
                    );
                    None
                }
                (Some(t), None) if t as u64 > money::MAX_PRICED => {
                    err(
                        format!("{p}.tokens"),
                        format!("must be at most {} (got {t})", money::MAX_PRICED),
                    );
                    None
                }
                (Some(t), None) => Some(BudgetAmount::Tokens(t as u64)),
                (None, Some(text)) => {
                    let p = format!("{p}.cost");
                    if !ctx.currency {
                        err(
                            p.clone(),
                            "a cost budget needs the top-level `currency` (e.g. currency = \
                             \"USD\")"
                                .into(),
                        );
                    }
                    match money::parse_micros(text) {
                        Ok(0) => {
                            err(p, format!("must be more than 0 (got {text:?})"));
                            None
                        }
                        Ok(m) if m > money::MAX_PRICED => {
                            err(
                                p,
                                format!(
                                    "must be at most {} (got {text:?})",
                                    money::format_micros(money::MAX_PRICED)
                                ),
                            );
                            None
                        }
                        Ok(m) => Some(BudgetAmount::Cost(m)),
                        Err(e) => {
                            err(p, e.to_string());
                            None
                        }
                    }
                }
            }
        };
        let daily = amount(Period::Daily, &self.daily);
        let weekly = amount(Period::Weekly, &self.weekly);
        let monthly = amount(Period::Monthly, &self.monthly);
        let default_price = self
            .default_price
            .as_ref()
            .and_then(|c| c.validate(&format!("{path}.default_price"), errors));
        let budgets = Budgets {
            daily,
            weekly,
            monthly,
            on_exhausted: self.on_exhausted.unwrap_or_default(),
            on_outage: self.on_outage.unwrap_or_default(),
            default_price,
        };
        if budgets.has_cost() && !ctx.prices && self.default_price.is_none() {
            errors.push(FieldError {
                path: path.to_owned(),
                reason: "a cost budget needs [prices] or a default_price: no model call could \
                         be priced"
                    .into(),
            });
        }
        (errors.len() == before).then_some(budgets)
    }
}

#[cfg(test)]
mod tests;
