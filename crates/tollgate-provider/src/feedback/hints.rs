//! The grammars of the providers' retry hints and reset times: delay
//! seconds and `retry-after-ms` (decimals), HTTP-dates (the `httpdate`
//! crate), RFC 3339 date-times (`chrono`) and Go durations (by hand: see
//! docs/architecture.md, "Hand-written where a crate exists").

use std::borrow::Cow;
use std::time::UNIX_EPOCH;

use chrono::DateTime;

#[cfg(test)]
mod tests;

/// Nanoseconds per millisecond.
pub(super) const NS_PER_MS: u128 = 1_000_000;
/// Nanoseconds per second.
pub(super) const NS_PER_S: u128 = 1_000_000_000;

/// Parses a `Retry-After` value into ms from `now_ms`: delay seconds
/// (`"30"`, or a decimal such as `"1.5"`, rounded up to the ms) or an
/// HTTP-date (IMF-fixdate `"Wed, 21 Oct 2015 07:28:00 GMT"`, and the
/// obsolete RFC 850 and asctime forms) made relative to `now_ms` (`Some(0)`
/// if already past). Anything else, negative numbers included, is `None`.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    match v.bytes().next()? {
        b'0'..=b'9' | b'.' => decimal_ns(v, NS_PER_S).map(ns_to_ms_ceil),
        _ => parse_http_date_ms(v).map(|at| relative_ms(at, now_ms)),
    }
}

/// `int[.frac]` times `scale` ns, in ns. At least one digit; no sign, no
/// exponent. Saturates instead of overflowing; digits past the 18th of the
/// fraction are ignored.
pub(super) fn decimal_ns(s: &str, scale: u128) -> Option<u128> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut whole: u128 = 0;
    for b in int.bytes() {
        whole = whole
            .saturating_mul(10)
            .saturating_add(u128::from(b - b'0'));
    }
    let frac = &frac[..frac.len().min(18)];
    let mut num: u128 = 0;
    let mut den: u128 = 1;
    for b in frac.bytes() {
        num = num * 10 + u128::from(b - b'0');
        den *= 10;
    }
    // num < 10^18 and scale <= 3.6e12, so num * scale fits in a u128.
    Some(
        whole
            .saturating_mul(scale)
            .saturating_add((num * scale).div_ceil(den)),
    )
}

/// ns in ms, rounded up, saturating.
pub(super) fn ns_to_ms_ceil(ns: u128) -> u64 {
    u64::try_from(ns.div_ceil(NS_PER_MS)).unwrap_or(u64::MAX)
}

/// `at_ms − now_ms`, 0 if already past.
pub(super) fn relative_ms(at_ms: i64, now_ms: u64) -> u64 {
    let now = i128::from(now_ms);
    u64::try_from((i128::from(at_ms) - now).max(0)).unwrap_or(u64::MAX)
}

/// A Go `time.Duration` string (`"1s"`, `"6m0s"`, `"1m30.5s"`, `"20ms"`,
/// `"1h2m3.5s"`, `"0"`), in ms rounded up. Units `ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`; a leading `+` is allowed; negative or malformed is `None`; a
/// duration past `u64::MAX` ms saturates.
///
/// Written here, not taken from a crate: docs/architecture.md, "Hand-written
/// where a crate exists", says why.
pub(super) fn parse_go_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => NS_PER_MS,
            "s" => NS_PER_S,
            "m" => 60 * NS_PER_S,
            "h" => 3_600 * NS_PER_S,
            _ => return None,
        };
        total = total.saturating_add(decimal_ns(num, scale)?);
        rest = next;
    }
    Some(ns_to_ms_ceil(total))
}

/// An HTTP-date (RFC 9110 §5.6.7), as Unix ms, read by `httpdate`:
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850
/// `Sunday, 06-Nov-94 08:49:37 GMT` (two-digit years below 70 are 20xx) or
/// asctime `Sun Nov  6 08:49:37 1994`, years 1970 to 9999, the weekday
/// matching the date. Names are read in any case, and `UTC` as `GMT`
/// (RFC 9110 writes them case-sensitively; some servers do not).
pub(super) fn parse_http_date_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    if !s.is_ascii() {
        return None;
    }
    // Each name as httpdate expects it: "Wed", "Wednesday", "Oct", "GMT".
    let mut canonical = String::with_capacity(s.len());
    let mut in_word = false;
    for c in s.chars() {
        canonical.push(if in_word {
            c.to_ascii_lowercase()
        } else {
            c.to_ascii_uppercase()
        });
        in_word = c.is_ascii_alphabetic();
    }
    if let Some(stem) = canonical
        .strip_suffix(" Gmt")
        .or_else(|| canonical.strip_suffix(" Utc"))
    {
        canonical = format!("{stem} GMT");
    }
    let at = httpdate::parse_http_date(&canonical).ok()?;
    // httpdate's years are 1970..=9999: never before the epoch.
    i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()
}

/// An RFC 3339 date-time (`2024-05-01T12:00:30Z`,
/// `2024-05-01T12:00:30.250+02:00`), as Unix ms, read by `chrono`;
/// fractional seconds are rounded up to the ms, a leap second `:60` lands
/// on the next second. The offset is required (`Z`, `+HH:MM`, or `+HHMM`:
/// the colon is added before chrono reads it); `T` or a space between date
/// and time, in any case.
pub(super) fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let at = DateTime::parse_from_rfc3339(&with_offset_colon(s)).ok()?;
    // chrono keeps a leap second as nanoseconds past 10^9.
    let frac_ms = i64::try_from(ns_to_ms_ceil(u128::from(at.timestamp_subsec_nanos()))).ok()?;
    at.timestamp().checked_mul(1_000)?.checked_add(frac_ms)
}

/// `…+HHMM` as `…+HH:MM` (the form RFC 3339 and chrono require); anything
/// else unchanged.
fn with_offset_colon(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    match b.len().checked_sub(5).map(|i| &b[i..]) {
        Some([b'+' | b'-', tail @ ..]) if tail.iter().all(u8::is_ascii_digit) => {
            let (head, minutes) = s.split_at(s.len() - 2);
            Cow::Owned(format!("{head}:{minutes}"))
        }
        _ => Cow::Borrowed(s),
    }
}
