//! Spend budgets in a store: a user's spend per calendar
//! window, checked and charged by a reserve in the same step as its token
//! take, adjusted by the settle with the real usage, given back by a
//! refund. Pure transitions like [`crate::reserve`]: given `now` and the
//! state, they answer the decision and leave the new state in the value
//! given.
//!
//! The caller (who knows the plan, the prices and the time zone) passes one
//! [`BudgetCheck`] per budget: its unit, its limit and the boundaries of the
//! current and the next window as computed from the zone rules at the
//! caller's clock. The store picks the window by its own clock
//! ([`BudgetCheck::window`]), so replicas whose clocks differ near midnight
//! still charge one window.

use crate::calendar::{Period, Window};
use crate::decision::{Denial, Limit};
use crate::money::{CostOverflow, Price, TokenSplit};

/// The largest amount a budget counts exactly (2^53: what the Redis
/// scripts' numbers hold). A charge past it counts as this much.
pub const MAX_AMOUNT: u64 = 1 << 53;

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetUnit {
    /// Tokens (input, output and cached alike).
    Tokens,
    /// Micro-units of the config's currency, at the call's price.
    Cost,
}

/// One budget a store checks and charges: a window length, its unit and
/// limit, and the windows around the caller's now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BudgetCheck {
    /// The window length.
    pub period: Period,
    /// What it counts.
    pub unit: BudgetUnit,
    /// The most it lets a user spend per window (tokens or micro-units).
    pub limit: u64,
    /// The window containing the caller's now.
    pub current: Window,
    /// The window after it.
    pub next: Window,
    /// While the shared store fails under `fail_open`, the replica's
    /// fallback may decide it (the plan's `on_outage = "fallback"`), at its
    /// share of the limit and from a fresh window, its charges reconciled
    /// after; `false`: a request naming it fails closed.
    pub fallback: bool,
}

impl BudgetCheck {
    /// The window a store whose clock reads `now` charges: `current`
    /// until its end, then `next`.
    pub fn window(&self, now: u64) -> Window {
        if now >= self.current.end_ms {
            self.next
        } else {
            self.current
        }
    }

    /// The limit a refusal names: `budget_daily`, `budget_weekly` or
    /// `budget_monthly`.
    pub fn limit_name(&self) -> Limit {
        match self.period {
            Period::Daily => Limit::BudgetDaily,
            Period::Weekly => Limit::BudgetWeekly,
            Period::Monthly => Limit::BudgetMonthly,
        }
    }
}

/// The budgets of one reserve or settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRequest<'a> {
    /// One per budget of the user's plan (at most one per period).
    pub checks: &'a [BudgetCheck],
    /// The price of the call's model, kept with the reservation (a settle
    /// prices its usage at the reservation's price, not this one). Needed
    /// when a check counts cost.
    pub price: Option<Price>,
    /// The tokens split by how they are priced: the estimate (reserve) or
    /// the usage (settle). Without it, tokens are priced at the higher of
    /// the input and output prices.
    pub split: Option<TokenSplit>,
    /// Alert thresholds, percent of each budget's limit (ascending, at
    /// most [`MAX_ALERTS`], each 1 to 100): a charge that brings a
    /// window's peak spend to one of them for the first time in that
    /// window reports it ([`Crossed`]). Empty: none reported.
    pub alerts: &'a [u8],
}

/// The most alert thresholds a request may carry.
pub const MAX_ALERTS: usize = 8;

/// Which alert thresholds a charge crossed, one bit per budget period and
/// threshold: bit `8 × period + i` for the `i`-th of the request's
/// [`BudgetRequest::alerts`] (period 0 daily, 1 weekly, 2 monthly). A
/// window's threshold is crossed once: when its peak spend first reaches
/// it (a refund lowers the spend, not the peak).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Crossed(pub u32);

impl Crossed {
    /// Nothing crossed.
    pub const NONE: Crossed = Crossed(0);

    /// Whether nothing was crossed.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Each crossing as (period, percent), given the request's `alerts`.
    pub fn iter(self, alerts: &[u8]) -> impl Iterator<Item = (Period, u8)> + '_ {
        Period::ALL.into_iter().flat_map(move |p| {
            alerts
                .iter()
                .enumerate()
                .filter(move |(i, _)| self.0 & (1 << (8 * p.index() + i)) != 0)
                .map(move |(_, pct)| (p, *pct))
        })
    }
}

/// The spend at which `percent` of `limit` is reached: ⌈limit × percent /
/// 100⌉, computed as the Redis scripts do (exact for a limit up to 2^53).
pub fn threshold(limit: u64, percent: u8) -> u64 {
    let (q, r) = (limit / 100, limit % 100);
    q * u64::from(percent) + (r * u64::from(percent)).div_ceil(100)
}

/// An operator's change to one budget's current window (the admin
/// endpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetAdjust<'a> {
    /// Start the window afresh: nothing spent, no top-up, no threshold
    /// crossed.
    Reset,
    /// Raise the window's limit by `amount`, for this window only.
    TopUp {
        /// How much more the window may spend (tokens or micro-units).
        amount: u64,
        /// The top-up's id: a top-up whose id the store applied within
        /// [`TOP_UP_ID_RETENTION_MS`] is not applied again (a retry after
        /// a lost answer grants once). `None`: applied every time.
        request_id: Option<&'a str>,
    },
}

/// How long a store remembers a top-up's request id, ms (a day).
pub const TOP_UP_ID_RETENTION_MS: u64 = 86_400_000;

/// How many top-up request ids a store remembers per user: past it the
/// oldest is forgotten first.
pub const MAX_TOP_UP_IDS: usize = 256;

/// The request ids of a user's recent top-ups, each with when it was
/// applied (the store's clock): at most [`MAX_TOP_UP_IDS`], none older
/// than [`TOP_UP_ID_RETENTION_MS`]. The Redis store keeps the same in a
/// sorted set scored by that time (scripts/budget_spent.lua), and forgets
/// in the same order: the least time first, of equal times the least id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopUpIds {
    ids: Vec<(u64, Box<str>)>,
}

impl TopUpIds {
    /// Records `id` as applied at `now` unless it already is (within
    /// [`TOP_UP_ID_RETENTION_MS`]): `true` if it is new, so the top-up is
    /// to be applied.
    pub fn first(&mut self, id: &str, now: u64) -> bool {
        self.ids
            .retain(|(at, _)| at.saturating_add(TOP_UP_ID_RETENTION_MS) > now);
        if self.ids.iter().any(|(_, i)| &**i == id) {
            return false;
        }
        self.ids.push((now, id.into()));
        if self.ids.len() > MAX_TOP_UP_IDS
            && let Some(oldest) = (0..self.ids.len()).min_by(|a, b| self.ids[*a].cmp(&self.ids[*b]))
        {
            self.ids.swap_remove(oldest);
        }
        true
    }

    /// When the last id is forgotten (0: none held).
    pub fn expires_at(&self) -> u64 {
        self.ids
            .iter()
            .map(|(at, _)| at.saturating_add(TOP_UP_ID_RETENTION_MS))
            .max()
            .unwrap_or(0)
    }
}

/// What a reservation charged one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The budget's window length.
    pub period: Period,
    /// Its unit.
    pub unit: BudgetUnit,
    /// The start of the window charged.
    pub window_start: u64,
    /// The window's resets before the charge ([`Spent::epoch`]): a charge
    /// of another epoch is of a window an operator reset since.
    pub epoch: u64,
    /// The amount charged.
    pub amount: u64,
}

/// What a reservation charged its budgets, kept with it until it closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charged {
    /// The price it was made at.
    pub price: Option<Price>,
    /// One per budget checked.
    pub charges: Vec<Charge>,
}

impl Charged {
    /// A reservation that charged nothing (a shadow one): its budgets'
    /// windows at `now` and the request's price, so its settle charges the
    /// actual usage.
    pub fn nothing(req: &BudgetRequest<'_>, now: u64) -> Self {
        Charged {
            price: req.price,
            charges: req
                .checks
                .iter()
                .map(|c| Charge {
                    period: c.period,
                    unit: c.unit,
                    window_start: c.window(now).start_ms,
                    // Nothing to give back: a settle charges the usage
                    // whatever the epoch.
                    epoch: 0,
                    amount: 0,
                })
                .collect(),
        }
    }
}

/// A user's spend in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    /// The window.
    pub window: Window,
    /// Its unit.
    pub unit: BudgetUnit,
    /// Spent so far in it.
    pub amount: u64,
    /// Top-ups granted for it: the limit is the budget's plus this.
    pub granted: u64,
    /// The most it has been spent at (alert thresholds are crossed by the
    /// peak, once).
    pub peak: u64,
    /// How many times an operator reset it: a reservation charged in an
    /// earlier epoch closes as one of an ended window (a refund gives
    /// nothing back, a settle charges its whole usage).
    pub epoch: u64,
}

/// One budget's window as a store answers it ([`crate::Store::budget_spent`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpentNow {
    /// Spent in the window the store's clock picks.
    pub spent: u64,
    /// Top-ups granted for that window.
    pub granted: u64,
}

/// A user's spend, one entry per period.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spend {
    /// Indexed by period: daily, weekly, monthly.
    pub windows: [Option<Spent>; 3],
}

fn clamp(c: Result<u64, CostOverflow>) -> u64 {
    c.map_or(MAX_AMOUNT, |c| c.min(MAX_AMOUNT))
}

/// The amount `tokens` count against a budget of `unit` at `price`: the
/// tokens themselves, or their cost rounded up to the micro-unit once: of
/// their `split` if given (each part at its own price; the split prices
/// the call, it is not checked against `tokens`), else of all of them at
/// the higher of the input and output prices. At most
/// [`MAX_AMOUNT`]. A cost without a price counts [`MAX_AMOUNT`] (the caller
/// refuses such a reserve before it gets here). Each token count past
/// [`MAX_AMOUNT`] counts as [`MAX_AMOUNT`].
pub fn amount(
    unit: BudgetUnit,
    price: Option<&Price>,
    tokens: u64,
    split: Option<TokenSplit>,
) -> u64 {
    // Counts past 2^53 are taken as 2^53, as the Redis scripts get them.
    let tokens = tokens.min(MAX_AMOUNT);
    let split = split.map(|s| {
        TokenSplit::new(
            s.input.min(MAX_AMOUNT),
            s.output.min(MAX_AMOUNT),
            s.cached_input.min(MAX_AMOUNT),
        )
    });
    match unit {
        BudgetUnit::Tokens => tokens,
        BudgetUnit::Cost => match (price, split) {
            (None, _) => MAX_AMOUNT,
            (Some(p), Some(s)) => clamp(p.cost(s)),
            (Some(p), None) => clamp(p.cost_unsplit(tokens)),
        },
    }
}

impl Spend {
    /// Spent in `check`'s window at `now` (0 in a window not seen yet or
    /// counted in another unit).
    pub fn spent(&self, check: &BudgetCheck, now: u64) -> u64 {
        self.slot(check.period, check.unit, check.window(now))
            .map_or(0, |s| s.amount)
    }

    /// The spend of `period` if it is of `window` and `unit`.
    fn slot(&self, period: Period, unit: BudgetUnit, window: Window) -> Option<&Spent> {
        self.windows[period.index()]
            .as_ref()
            .filter(|s| s.window.start_ms == window.start_ms && s.unit == unit)
    }

    /// `check`'s window at `now` as a store answers it: spent and granted.
    pub fn now(&self, check: &BudgetCheck, now: u64) -> SpentNow {
        self.slot(check.period, check.unit, check.window(now))
            .map_or(SpentNow::default(), |s| SpentNow {
                spent: s.amount,
                granted: s.granted,
            })
    }

    /// `check`'s limit in its window at `now`: the budget's plus the
    /// window's top-ups, at most [`MAX_AMOUNT`].
    pub fn limit(&self, check: &BudgetCheck, now: u64) -> u64 {
        let granted = self
            .slot(check.period, check.unit, check.window(now))
            .map_or(0, |s| s.granted);
        check.limit.saturating_add(granted).min(MAX_AMOUNT)
    }

    /// The peak of `period` in `window` and `unit` (0: not seen).
    fn peak(&self, period: Period, unit: BudgetUnit, window: Window) -> u64 {
        self.slot(period, unit, window).map_or(0, |s| s.peak)
    }

    /// The epoch of `period` in `window` and `unit` (0: not seen).
    pub fn epoch(&self, period: Period, unit: BudgetUnit, window: Window) -> u64 {
        self.slot(period, unit, window).map_or(0, |s| s.epoch)
    }

    /// Applies an operator's `adjust` to `check`'s window at `now`, and
    /// answers that window after it.
    /// A top-up's request id is not looked at here: the store checks it
    /// first ([`TopUpIds::first`]).
    pub fn adjust(&mut self, check: &BudgetCheck, now: u64, adjust: BudgetAdjust<'_>) -> SpentNow {
        let w = check.window(now);
        let held = self.slot(check.period, check.unit, w).copied();
        let fresh = |epoch| Spent {
            window: w,
            unit: check.unit,
            amount: 0,
            granted: 0,
            peak: 0,
            epoch,
        };
        self.windows[check.period.index()] = Some(match (adjust, held) {
            // A new epoch: what was charged before the reset no longer
            // moves this window's spend.
            (BudgetAdjust::Reset, Some(s)) => fresh(s.epoch + 1),
            (BudgetAdjust::Reset, None) => fresh(1),
            (BudgetAdjust::TopUp { amount, .. }, held) => {
                let mut s = held.unwrap_or(fresh(0));
                s.granted = s.granted.saturating_add(amount).min(MAX_AMOUNT);
                s
            }
        });
        self.now(check, now)
    }

    /// The alert thresholds of `req` that `self`'s peaks reach and
    /// `before`'s did not, at `now`, against each budget's limit then.
    pub fn crossed(&self, before: &Spend, req: &BudgetRequest<'_>, now: u64) -> Crossed {
        let mut bits = 0;
        for c in req.checks {
            let w = c.window(now);
            let (was, is) = (
                before.peak(c.period, c.unit, w),
                self.peak(c.period, c.unit, w),
            );
            if is <= was {
                continue;
            }
            let limit = self.limit(c, now);
            for (i, pct) in req.alerts.iter().take(MAX_ALERTS).enumerate() {
                let t = threshold(limit, *pct);
                if was < t && t <= is {
                    bits |= 1 << (8 * c.period.index() + i);
                }
            }
        }
        Crossed(bits)
    }

    /// Adds `delta` (negative gives back; never below 0, never past
    /// [`MAX_AMOUNT`]) to the spend of `period` in `window`, counted in
    /// `unit`; a window not seen yet starts from 0.
    pub fn add(&mut self, period: Period, unit: BudgetUnit, window: Window, delta: i128) {
        let slot = &mut self.windows[period.index()];
        let (before, granted, peak, epoch) = match *slot {
            Some(s) if s.window.start_ms == window.start_ms && s.unit == unit => {
                (s.amount, s.granted, s.peak, s.epoch)
            }
            _ => (0, 0, 0, 0),
        };
        let after = (i128::from(before) + delta).clamp(0, i128::from(MAX_AMOUNT)) as u64;
        *slot = Some(Spent {
            window,
            unit,
            amount: after,
            granted,
            peak: peak.max(after),
            epoch,
        });
    }

    /// When the spend stops mattering, ms: the end of its latest window
    /// (0: nothing spent).
    pub fn expires_at(&self) -> u64 {
        self.windows
            .iter()
            .flatten()
            .map(|s| s.window.end_ms)
            .max()
            .unwrap_or(0)
    }

    /// The first budget already spent at `now` (spent at least its limit
    /// and the window's top-ups):
    /// a turn admission's check under `on_exhausted = "deny_turns"`. The
    /// refusal's hint is the time until that window ends; of several, the
    /// one that resets last.
    pub fn exhausted(&self, checks: &[BudgetCheck], now: u64) -> Option<Denial> {
        let mut out: Option<Denial> = None;
        for c in checks
            .iter()
            .filter(|c| self.spent(c, now) >= self.limit(c, now))
        {
            let d = Denial::Limited {
                limit: c.limit_name(),
                retry_after_ms: c.window(now).end_ms.saturating_sub(now).max(1),
            };
            // Of equal hints, the first.
            if out.is_none_or(|o| d.retry_after_ms() > o.retry_after_ms()) {
                out = Some(d);
            }
        }
        out
    }

    /// What a reserve of `estimate` tokens would charge each budget of
    /// `req`, or why it is refused: a charge larger than a budget's whole
    /// limit can never fit ([`Denial::ExceedsCapacity`]); one past what is
    /// left is refused until the window ends ([`Denial::Limited`], the
    /// latest reset of several). A window's limit includes its top-ups.
    pub fn decide(
        &self,
        req: &BudgetRequest<'_>,
        now: u64,
        estimate: u64,
    ) -> Result<Charged, Denial> {
        let mut charges = Vec::with_capacity(req.checks.len());
        let mut refusal: Option<Denial> = None;
        for c in req.checks {
            let amount = amount(c.unit, req.price.as_ref(), estimate, req.split);
            let limit = self.limit(c, now);
            if amount > limit {
                return Err(Denial::ExceedsCapacity {
                    limit: c.limit_name(),
                    cost: amount,
                    max_cost: limit,
                });
            }
            let w = c.window(now);
            if self.spent(c, now).saturating_add(amount) > limit {
                let d = Denial::Limited {
                    limit: c.limit_name(),
                    retry_after_ms: w.end_ms.saturating_sub(now).max(1),
                };
                if refusal.is_none_or(|r| d.retry_after_ms() > r.retry_after_ms()) {
                    refusal = Some(d);
                }
            }
            charges.push(Charge {
                period: c.period,
                unit: c.unit,
                window_start: w.start_ms,
                epoch: self.epoch(c.period, c.unit, w),
                amount,
            });
        }
        match refusal {
            Some(d) => Err(d),
            None => Ok(Charged {
                price: req.price,
                charges,
            }),
        }
    }

    /// Applies a granted reserve's charges (their windows as `checks` pick
    /// them at `now`).
    pub fn charge(&mut self, checks: &[BudgetCheck], charged: &Charged, now: u64) {
        for (c, ch) in checks.iter().zip(&charged.charges) {
            self.add(c.period, c.unit, c.window(now), i128::from(ch.amount));
        }
    }

    /// Closes a reservation that charged `charged`: a settle (`actual`
    /// tokens, or their `req.split`, priced at the reservation's price)
    /// moves each budget by actual − charged in the window it charged, if
    /// that window is still the current one, else charges the actual
    /// amount to the current window; a refund (`actual` `None`) gives the
    /// charge back to a window still current and changes nothing in one
    /// that has ended. Budgets `req` no longer names (a reload removed
    /// them, or changed their unit) are left alone.
    pub fn close(
        &mut self,
        charged: &Charged,
        req: &BudgetRequest<'_>,
        now: u64,
        actual: Option<u64>,
    ) {
        let deltas = close_deltas(charged, req, now, actual, |p, u, w| self.epoch(p, u, w));
        for (period, unit, window, delta) in deltas {
            self.add(period, unit, window, delta);
        }
    }

    /// Gives back what a reservation charged, to each window still held
    /// (a reserve reconciliation found ambiguous: the fallback's charge
    /// replaces it). Nothing changes in a window that has ended or was
    /// replaced.
    pub fn give_back(&mut self, charged: &Charged) {
        for ch in &charged.charges {
            if let Some(s) = self.windows[ch.period.index()].as_mut().filter(|s| {
                s.window.start_ms == ch.window_start && s.unit == ch.unit && s.epoch == ch.epoch
            }) {
                s.amount = s.amount.saturating_sub(ch.amount);
            }
        }
    }
}

/// What closing a reservation that charged `charged` moves, per budget:
/// (period, unit, window, delta), as [`Spend::close`] applies it.
/// `epoch` answers a window's epoch now ([`Spend::epoch`]): a charge of
/// another epoch closes as one of an ended window.
pub fn close_deltas(
    charged: &Charged,
    req: &BudgetRequest<'_>,
    now: u64,
    actual: Option<u64>,
    epoch: impl Fn(Period, BudgetUnit, Window) -> u64,
) -> Vec<(Period, BudgetUnit, Window, i128)> {
    let mut out = Vec::with_capacity(charged.charges.len());
    for ch in &charged.charges {
        let Some(c) = req
            .checks
            .iter()
            .find(|c| c.period == ch.period && c.unit == ch.unit)
        else {
            continue;
        };
        let w = c.window(now);
        let same = w.start_ms == ch.window_start && epoch(c.period, c.unit, w) == ch.epoch;
        let delta = match actual {
            None if same => -i128::from(ch.amount),
            None => continue,
            Some(tokens) => {
                let real = amount(ch.unit, charged.price.as_ref(), tokens, req.split);
                if same {
                    i128::from(real) - i128::from(ch.amount)
                } else {
                    i128::from(real)
                }
            }
        };
        out.push((c.period, c.unit, w, delta));
    }
    out
}

#[cfg(test)]
mod tests;
