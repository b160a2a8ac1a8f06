//! [`Rational`]: exact non-negative fractions, parsed from decimals. The
//! arithmetic (reduced fractions, checked products and sums, comparison) is
//! `num-rational`'s `Ratio<u128>`; decimal parsing, rounding halves up and
//! display are here, since `num-rational` neither parses nor writes
//! decimals.

use std::fmt;
use std::str::FromStr;

use num_rational::Ratio;
use num_traits::{CheckedAdd, CheckedDiv, CheckedMul};

/// An exact non-negative number: a fraction of two integers, parsed from a
/// plain decimal (`40`, `5.5`, `3.2`, `10_000`). Planning arithmetic stays
/// exact with it: 40 × 5.5 is 220, not 219.99999999999997.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rational(Ratio<u128>);

/// Why a number could not be parsed or computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RationalError {
    /// Not a plain non-negative decimal.
    #[error("{0:?} is not a non-negative decimal number like 40 or 5.5")]
    Malformed(String),
    /// Too many digits, or a result too large to compute exactly.
    #[error("number too large to compute exactly")]
    Overflow,
}

impl Rational {
    /// Zero.
    pub const ZERO: Rational = Rational(Ratio::new_raw(0, 1));

    /// `num / den` for constants: both must already be reduced and `den`
    /// not 0.
    pub(crate) const fn reduced(num: u128, den: u128) -> Self {
        Rational(Ratio::new_raw(num, den))
    }

    /// The integer `n`.
    pub fn int(n: u64) -> Self {
        Rational(Ratio::from_integer(u128::from(n)))
    }

    /// `num / den`, reduced. `None` if `den` is 0.
    pub fn new(num: u128, den: u128) -> Option<Self> {
        (den != 0).then(|| Rational(Ratio::new(num, den)))
    }

    /// The numerator (reduced).
    pub fn numer(&self) -> u128 {
        *self.0.numer()
    }

    /// The denominator (reduced, at least 1).
    pub fn denom(&self) -> u128 {
        *self.0.denom()
    }

    /// Whether it is 0.
    pub fn is_zero(&self) -> bool {
        self.numer() == 0
    }

    /// Whether it is a whole number.
    pub fn is_integer(&self) -> bool {
        self.0.is_integer()
    }

    /// The smallest integer not below it.
    pub fn ceil(&self) -> u128 {
        self.numer().div_ceil(self.denom())
    }

    /// Rounded to the nearest integer, halves up.
    pub fn round(&self) -> u128 {
        self.scaled(1)
    }

    /// `self × scale`, rounded halves up, without overflowing (saturating
    /// past `u128::MAX`).
    fn scaled(&self, scale: u128) -> u128 {
        let (num, den) = (self.numer(), self.denom());
        let (q, r) = (num / den, num % den);
        let frac = match r.checked_mul(scale).and_then(|x| x.checked_mul(2)) {
            Some(x) => x.saturating_add(den) / den.saturating_mul(2).max(1),
            None => ((r as f64 / den as f64) * scale as f64).round() as u128,
        };
        q.saturating_mul(scale).saturating_add(frac)
    }

    /// The nearest `f64` (for JSON).
    pub fn to_f64(&self) -> f64 {
        self.numer() as f64 / self.denom() as f64
    }

    /// `self × other`, exactly.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_mul(self, other: Rational) -> Result<Rational, RationalError> {
        self.0
            .checked_mul(&other.0)
            .map(Rational)
            .ok_or(RationalError::Overflow)
    }

    /// `self / other`, exactly; `None` if `other` is 0.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_div(self, other: Rational) -> Result<Option<Rational>, RationalError> {
        if other.is_zero() {
            return Ok(None);
        }
        self.0
            .checked_div(&other.0)
            .map(|q| Some(Rational(q)))
            .ok_or(RationalError::Overflow)
    }

    /// `self + other`, exactly.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_add(self, other: Rational) -> Result<Rational, RationalError> {
        self.0
            .checked_add(&other.0)
            .map(Rational)
            .ok_or(RationalError::Overflow)
    }

    /// Written with at most `places` decimals, rounded halves up, trailing
    /// zeros dropped, thousands grouped with commas (`49,920,000`, `32.05`).
    pub fn display(&self, places: u32) -> String {
        let scale = 10u128.pow(places);
        let scaled = self.scaled(scale);
        let (int, frac) = (scaled / scale, scaled % scale);
        let mut s = group(int);
        if frac != 0 {
            let digits = format!("{frac:0width$}", width = places as usize);
            s.push('.');
            s.push_str(digits.trim_end_matches('0'));
        }
        s
    }
}

/// `n` with thousands grouped by commas.
pub(crate) fn group(n: u128) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Digits accepted in one number, so that products of a few stay exact.
const MAX_DIGITS: usize = 24;

impl FromStr for Rational {
    type Err = RationalError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || RationalError::Malformed(s.to_owned());
        let t = s.trim();
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        let clean = |p: &str| p.replace('_', "");
        let (int, frac) = (clean(int), clean(frac));
        if (int.is_empty() && frac.is_empty())
            || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
            || t.starts_with('_')
            || t.ends_with('.')
        {
            return Err(bad());
        }
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS || frac.len() > MAX_DIGITS {
            return Err(RationalError::Overflow);
        }
        let num: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| bad())?
        };
        Rational::new(num, 10u128.pow(frac.len() as u32)).ok_or_else(bad)
    }
}

impl fmt::Display for Rational {
    /// Exact when it has at most 6 decimals; otherwise rounded to 6. No
    /// grouping (so it parses back).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scaled = self.scaled(1_000_000);
        let (int, frac) = (scaled / 1_000_000, scaled % 1_000_000);
        if frac == 0 {
            write!(f, "{int}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{int}.{}", digits.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Rational {
        s.parse().unwrap()
    }

    #[test]
    fn parses_decimals_exactly() {
        assert_eq!(r("5.5"), Rational::new(11, 2).unwrap());
        assert_eq!(r("3.20"), Rational::new(16, 5).unwrap());
        assert_eq!(r("10_000"), Rational::int(10_000));
        assert_eq!(r(".5"), Rational::new(1, 2).unwrap());
        assert_eq!(r("0"), Rational::ZERO);
        for bad in ["", "-1", "1e3", "abc", "1.2.3", "NaN", "5.", "_1"] {
            assert!(bad.parse::<Rational>().is_err(), "{bad}");
        }
        assert_eq!(
            "1".repeat(30).parse::<Rational>(),
            Err(RationalError::Overflow)
        );
    }

    #[test]
    fn arithmetic_is_exact() {
        let in_flight = r("40").try_mul(r("5.5")).unwrap();
        assert_eq!(in_flight, Rational::int(220));
        let per_min = r("40")
            .try_mul(r("3.2"))
            .unwrap()
            .try_mul(Rational::int(60))
            .unwrap();
        assert_eq!(per_min, Rational::int(7_680));
        let pct = per_min
            .try_div(r("10000"))
            .unwrap()
            .unwrap()
            .try_mul(Rational::int(100))
            .unwrap();
        assert_eq!(pct.to_string(), "76.8");
        assert_eq!(pct.round(), 77);
        assert_eq!(Rational::new(220, 60).unwrap().ceil(), 4);
        assert_eq!(r("0.1").try_add(r("0.2")).unwrap(), r("0.3"));
        assert!(r("0.3") > r("0.29999"));
        assert!(r("1").try_div(Rational::ZERO).unwrap().is_none());
        assert_eq!(r("32.0512").display(2), "32.05");
        assert_eq!(Rational::int(49_920_000).display(2), "49,920,000");
        assert_eq!(r("2.5").display(0), "3");
        assert_eq!(Rational::new(1, 3).unwrap().to_string(), "0.333333");
    }
}
