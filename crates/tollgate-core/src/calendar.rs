//! Calendar windows of spend budgets: the day, the week
//! (from Monday) and the month (from the 1st), each starting at local
//! midnight in the configured IANA time zone, as `[start, end)` instants
//! in ms since the Unix epoch.
//!
//! Pure functions of the zone and an instant: nothing here reads a clock.
//! The zone rules come from the tz database compiled into tollgate (the
//! `jiff` crate's bundled copy), so every replica of one build computes the
//! same boundaries whatever the host's `/usr/share/zoneinfo` holds.
//!
//! A window starts at the **first valid instant** of its first day: local
//! midnight, or, where a DST change skips midnight (`America/Sao_Paulo` on
//! 18 October 2015 went from 00:00 straight to 01:00), the instant right
//! after the gap. Where local midnight occurs twice, the first one. So a
//! local day lasts 23 or 25 hours across a DST change, and a week or month
//! containing one is an hour shorter or longer.
//!
//! ```
//! use tollgate_core::calendar::{BudgetZone, Period};
//!
//! let paris = BudgetZone::new("Europe/Paris").unwrap();
//! // 2027-03-28 12:00 UTC, the day Paris moves to summer time.
//! let at = 1_806_235_200_000;
//! let day = paris.window(Period::Daily, at).unwrap();
//! assert_eq!(day.len_ms(), 23 * 3_600_000);
//! ```

use std::fmt;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// The length of a budget window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From local midnight to the next.
    Daily,
    /// From Monday 00:00 local to the next Monday.
    Weekly,
    /// From the 1st 00:00 local to the next month's 1st.
    Monthly,
}

impl Period {
    /// Every period, shortest first.
    pub const ALL: [Period; 3] = [Period::Daily, Period::Weekly, Period::Monthly];

    /// Its place in [`Period::ALL`] (shortest first): 0 daily, 1 weekly, 2
    /// monthly, as a user's spend is laid out in memory and in Redis.
    pub fn index(self) -> usize {
        match self {
            Period::Daily => 0,
            Period::Weekly => 1,
            Period::Monthly => 2,
        }
    }

    /// The config key of the period: `daily`, `weekly` or `monthly`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Daily => "daily",
            Period::Weekly => "weekly",
            Period::Monthly => "monthly",
        }
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A window `[start_ms, end_ms)`: ms since the Unix epoch, start included,
/// end excluded (the end is the next window's start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// The first instant in the window.
    pub start_ms: u64,
    /// The first instant after it.
    pub end_ms: u64,
}

impl Window {
    /// Its length in ms.
    pub fn len_ms(&self) -> u64 {
        self.end_ms - self.start_ms
    }

    /// Whether `at_ms` falls in it.
    pub fn contains(&self, at_ms: u64) -> bool {
        (self.start_ms..self.end_ms).contains(&at_ms)
    }
}

/// The current window and the one after it, as a store needs them to pick
/// the window by its own clock near a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Windows {
    /// The window containing the instant asked about.
    pub current: Window,
    /// The window starting where `current` ends.
    pub next: Window,
}

/// An instant whose windows fall outside what the calendar represents: a
/// window starting before the Unix epoch (the first days of 1970) or
/// ending after the year 9999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the windows of {at_ms} ms fall outside the calendar's range (1970 to 9999)")]
pub struct OutOfRange {
    /// The instant asked about.
    pub at_ms: u64,
}

/// An unknown time-zone name (see [`BudgetZone::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0:?}: an IANA name such as \"Europe/Paris\" or \"UTC\"")]
pub struct UnknownZone(pub String);

/// The time zone budget windows are computed in: `[budgets] time_zone`.
#[derive(Clone, PartialEq, Eq)]
pub struct BudgetZone {
    name: String,
    tz: TimeZone,
}

impl Default for BudgetZone {
    /// UTC.
    fn default() -> Self {
        Self {
            name: "UTC".to_owned(),
            tz: TimeZone::UTC,
        }
    }
}

impl fmt::Debug for BudgetZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BudgetZone").field(&self.name).finish()
    }
}

impl BudgetZone {
    /// The zone of an IANA name (`"Europe/Paris"`, `"UTC"`), looked up,
    /// without regard to case, in the tz database compiled into tollgate.
    ///
    /// # Errors
    ///
    /// [`UnknownZone`] if the database has no such name.
    pub fn new(name: &str) -> Result<Self, UnknownZone> {
        let tz = TimeZone::get(name).map_err(|_| UnknownZone(name.to_owned()))?;
        Ok(Self {
            name: tz.iana_name().unwrap_or(name).to_owned(),
            tz,
        })
    }

    /// The zone's name as the database spells it (names are matched
    /// without regard to case: `"europe/paris"` is `"Europe/Paris"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The local date of an instant.
    fn date_of(&self, at_ms: u64) -> Result<Date, OutOfRange> {
        let ms = i64::try_from(at_ms).map_err(|_| OutOfRange { at_ms })?;
        let ts = Timestamp::from_millisecond(ms).map_err(|_| OutOfRange { at_ms })?;
        Ok(ts.to_zoned_datetime(self.tz.clone()).date())
    }

    /// The first valid instant of a local date: midnight, or the end of a
    /// DST gap that skips it (jiff's "compatible" disambiguation: in a gap,
    /// the later offset; in a fold, the earlier occurrence).
    fn start_of(&self, date: Date, at_ms: u64) -> Result<u64, OutOfRange> {
        let zdt = date
            .to_zoned_datetime(self.tz.clone())
            .map_err(|_| OutOfRange { at_ms })?;
        u64::try_from(zdt.timestamp().as_millisecond()).map_err(|_| OutOfRange { at_ms })
    }

    /// The first local date of the window of `period` containing `date`,
    /// and the first date of the window after it.
    fn dates(period: Period, date: Date, at_ms: u64) -> Result<(Date, Date), OutOfRange> {
        let oor = |_| OutOfRange { at_ms };
        let first = match period {
            Period::Daily => date,
            Period::Weekly => date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .map_err(oor)?,
            Period::Monthly => date.first_of_month(),
        };
        let next = match period {
            Period::Daily => first.tomorrow().map_err(oor)?,
            Period::Weekly => first.checked_add(7.days()).map_err(oor)?,
            Period::Monthly => first.checked_add(1.month()).map_err(oor)?,
        };
        Ok((first, next))
    }

    /// The window of `period` containing the instant `at_ms`.
    ///
    /// # Errors
    ///
    /// [`OutOfRange`] before 1970 or past the year 9999.
    pub fn window(&self, period: Period, at_ms: u64) -> Result<Window, OutOfRange> {
        Ok(self.windows(period, at_ms)?.current)
    }

    /// The window of `period` containing `at_ms` and the window after it.
    ///
    /// # Errors
    ///
    /// [`OutOfRange`] before 1970 or past the year 9999.
    pub fn windows(&self, period: Period, at_ms: u64) -> Result<Windows, OutOfRange> {
        let date = self.date_of(at_ms)?;
        let (first, mut next) = Self::dates(period, date, at_ms)?;
        let mut start = self.start_of(first, at_ms)?;
        let mut mid = self.start_of(next, at_ms)?;
        // Where clocks go back across midnight (a fold that repeats the end
        // of the previous day after the new day began), an instant's local
        // date may be the day before the window it falls in: the windows
        // are cut at the first midnight, so move on to the window holding
        // it.
        while at_ms >= mid {
            next = Self::dates(period, next, at_ms)?.1;
            start = mid;
            mid = self.start_of(next, at_ms)?;
        }
        let after = Self::dates(period, next, at_ms)?.1;
        let end = self.start_of(after, at_ms)?;
        Ok(Windows {
            current: Window {
                start_ms: start,
                end_ms: mid,
            },
            next: Window {
                start_ms: mid,
                end_ms: end,
            },
        })
    }
}

#[cfg(test)]
mod tests;
