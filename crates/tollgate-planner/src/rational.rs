//! [`Rational`]: exact non-negative fractions, parsed from decimals.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// An exact non-negative number: a fraction of two integers, parsed from a
/// plain decimal (`40`, `5.5`, `3.2`, `10_000`). Planning arithmetic stays
/// exact with it: 40 × 5.5 is 220, not 219.99999999999997.
#[derive(Debug, Clone, Copy)]
pub struct Rational {
    num: u128,
    den: u128,
}

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

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rational {
    /// Zero.
    pub const ZERO: Rational = Rational { num: 0, den: 1 };

    /// `num / den` for constants: both must already be reduced and `den`
    /// not 0.
    pub(crate) const fn reduced(num: u128, den: u128) -> Self {
        Rational { num, den }
    }

    /// The integer `n`.
    pub fn int(n: u64) -> Self {
        Rational {
            num: u128::from(n),
            den: 1,
        }
    }

    /// `num / den`, reduced. `None` if `den` is 0.
    pub fn new(num: u128, den: u128) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        Some(Rational {
            num: num / g,
            den: den / g,
        })
    }

    /// The numerator (reduced).
    pub fn numer(&self) -> u128 {
        self.num
    }

    /// The denominator (reduced, at least 1).
    pub fn denom(&self) -> u128 {
        self.den
    }

    /// Whether it is 0.
    pub fn is_zero(&self) -> bool {
        self.num == 0
    }

    /// Whether it is a whole number.
    pub fn is_integer(&self) -> bool {
        self.den == 1
    }

    /// The smallest integer not below it.
    pub fn ceil(&self) -> u128 {
        self.num.div_ceil(self.den)
    }

    /// Rounded to the nearest integer, halves up.
    pub fn round(&self) -> u128 {
        self.scaled(1)
    }

    /// `self × scale`, rounded halves up, without overflowing (saturating
    /// past `u128::MAX`).
    fn scaled(&self, scale: u128) -> u128 {
        let (q, r) = (self.num / self.den, self.num % self.den);
        let frac = match r.checked_mul(scale).and_then(|x| x.checked_mul(2)) {
            Some(x) => x.saturating_add(self.den) / self.den.saturating_mul(2).max(1),
            None => ((r as f64 / self.den as f64) * scale as f64).round() as u128,
        };
        q.saturating_mul(scale).saturating_add(frac)
    }

    /// The nearest `f64` (for JSON).
    pub fn to_f64(&self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `self × other`, exactly.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_mul(self, other: Rational) -> Result<Rational, RationalError> {
        let g1 = gcd(self.num, other.den).max(1);
        let g2 = gcd(other.num, self.den).max(1);
        let num = (self.num / g1)
            .checked_mul(other.num / g2)
            .ok_or(RationalError::Overflow)?;
        let den = (self.den / g2)
            .checked_mul(other.den / g1)
            .ok_or(RationalError::Overflow)?;
        Ok(Rational::new(num, den).unwrap_or(Rational::ZERO))
    }

    /// `self / other`, exactly; `None` if `other` is 0.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_div(self, other: Rational) -> Result<Option<Rational>, RationalError> {
        if other.num == 0 {
            return Ok(None);
        }
        self.try_mul(Rational {
            num: other.den,
            den: other.num,
        })
        .map(Some)
    }

    /// `self + other`, exactly.
    ///
    /// # Errors
    ///
    /// [`RationalError::Overflow`] if it does not fit.
    pub fn try_add(self, other: Rational) -> Result<Rational, RationalError> {
        let g = gcd(self.den, other.den).max(1);
        let den = (self.den / g)
            .checked_mul(other.den)
            .ok_or(RationalError::Overflow)?;
        let a = self
            .num
            .checked_mul(den / self.den)
            .ok_or(RationalError::Overflow)?;
        let b = other
            .num
            .checked_mul(den / other.den)
            .ok_or(RationalError::Overflow)?;
        Ok(
            Rational::new(a.checked_add(b).ok_or(RationalError::Overflow)?, den)
                .unwrap_or(Rational::ZERO),
        )
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

impl PartialEq for Rational {
    fn eq(&self, other: &Self) -> bool {
        self.num == other.num && self.den == other.den
    }
}

impl Eq for Rational {}

impl PartialOrd for Rational {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rational {
    fn cmp(&self, other: &Self) -> Ordering {
        // Both are below 2^100 in practice (parsing caps digits); compare
        // by cross-multiplying in 256 bits made of two u128 halves.
        let (a_hi, a_lo) = widening_mul(self.num, other.den);
        let (b_hi, b_lo) = widening_mul(other.num, self.den);
        (a_hi, a_lo).cmp(&(b_hi, b_lo))
    }
}

fn widening_mul(a: u128, b: u128) -> (u128, u128) {
    const MASK: u128 = u64::MAX as u128;
    let (a1, a0) = (a >> 64, a & MASK);
    let (b1, b0) = (b >> 64, b & MASK);
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 64) + (p01 & MASK) + (p10 & MASK);
    let lo = (p00 & MASK) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (hi, lo)
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
