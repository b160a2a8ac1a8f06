//! The hints' grammars: delay seconds, HTTP-dates, RFC 3339 and Go
//! durations.

use super::*;

// 2024-05-01T12:00:00Z
const NOW: u64 = 1_714_564_800_000;

const MS_PER_DAY: i64 = 86_400_000;

/// Days from 1970-01-01 to a date, as the RFC 3339 reader counts them.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let at = parse_rfc3339_ms(&format!("{y:04}-{m:02}-{d:02}T00:00:00Z"))
        .unwrap_or_else(|| panic!("{y}-{m}-{d}"));
    assert_eq!(at.rem_euclid(MS_PER_DAY), 0, "{y}-{m}-{d}");
    at.div_euclid(MS_PER_DAY)
}

/// The Gregorian month lengths, written out to walk the calendar.
fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 0,
    }
}

#[test]
fn retry_after_seconds_and_decimals() {
    assert_eq!(parse_retry_after("30", NOW), Some(30_000));
    assert_eq!(parse_retry_after(" 0 ", NOW), Some(0));
    assert_eq!(parse_retry_after("1.5", NOW), Some(1_500));
    assert_eq!(parse_retry_after("0.0001", NOW), Some(1)); // rounded up
    assert_eq!(parse_retry_after(".5", NOW), Some(500));
    assert_eq!(parse_retry_after("2.", NOW), Some(2_000));
    assert_eq!(
        parse_retry_after("99999999999999999999999999999999999999999", NOW),
        Some(u64::MAX)
    );
}

#[test]
fn retry_after_malformed_is_none() {
    for bad in [
        "",
        "   ",
        "-1",
        "+5",
        "1e3",
        "1.2.3",
        ".",
        "30s",
        "abc",
        "NaN",
        "inf",
        "١٢",
        "3 0",
        "Wed, 21 Oct 2015 07:28:00",
        "Wed, 32 Oct 2015 07:28:00 GMT",
        "Wed, 21 Foo 2015 07:28:00 GMT",
        "Wed, 21 Oct 2015 24:00:00 GMT",
        "Wed, 21 Oct 2015 07:28:00 PST",
        "Wed 21 Oct 2015 07:28:00 GMT",
        "Thu, 29 Feb 2015 00:00:00 GMT",
        "Wed, 21 Oct 15 07:28:00 GMT",
        "Wed, 21 Oct 2015 07:28 GMT",
        "Wed, 21 Oct 2015 07:28:00 GMT extra",
    ] {
        assert_eq!(parse_retry_after(bad, NOW), None, "{bad:?}");
    }
}

#[test]
fn retry_after_http_dates() {
    let at = 1_445_412_480_000; // Wed, 21 Oct 2015 07:28:00 GMT
    let now = at - 30_000;
    assert_eq!(
        parse_http_date_ms("Wed, 21 Oct 2015 07:28:00 GMT"),
        Some(at as i64)
    );
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
        Some(30_000)
    );
    assert_eq!(
        parse_retry_after("wed, 21 oct 2015 07:28:00 gmt", now),
        Some(30_000)
    );
    // Past dates: no wait.
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", at + 5_000),
        Some(0)
    );
    assert_eq!(
        parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", NOW),
        Some(0)
    );
    // The obsolete forms (RFC 9110 §5.6.7).
    assert_eq!(
        parse_http_date_ms("Sunday, 06-Nov-94 08:49:37 GMT"),
        Some(784_111_777_000)
    );
    assert_eq!(
        parse_http_date_ms("Sun Nov  6 08:49:37 1994"),
        Some(784_111_777_000)
    );
    assert_eq!(
        parse_http_date_ms("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(784_111_777_000)
    );
    // Leap day, century rules.
    assert_eq!(
        parse_http_date_ms("Tue, 29 Feb 2000 23:59:59 GMT"),
        Some(951_868_799_000)
    );
    assert_eq!(parse_http_date_ms("Mon, 29 Feb 2100 00:00:00 GMT"), None);
    assert_eq!(
        parse_http_date_ms("Mon, 01 Mar 2100 00:00:00 GMT"),
        Some(4_107_542_400_000)
    );
}

#[test]
fn civil_arithmetic_matches_known_days() {
    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(1969, 12, 31), -1);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    assert_eq!(
        days_from_civil(2024, 5, 1) * MS_PER_DAY + 12 * 3_600_000,
        NOW as i64
    );
    // Every day from 1960 to 2100 follows the one before, and the day after
    // each month's last is refused.
    let mut expected = days_from_civil(1960, 1, 1);
    for y in 1960..2100 {
        for m in 1..=12 {
            for d in 1..=days_in_month(y, m) {
                assert_eq!(days_from_civil(y, m, d), expected, "{y}-{m}-{d}");
                expected += 1;
            }
            let past = days_in_month(y, m) + 1;
            assert_eq!(
                parse_rfc3339_ms(&format!("{y:04}-{m:02}-{past:02}T00:00:00Z")),
                None,
                "{y}-{m}-{past}"
            );
        }
    }
}

#[test]
fn go_durations() {
    let cases = [
        ("1s", 1_000),
        ("6m0s", 360_000),
        ("1m30.5s", 90_500),
        ("20ms", 20),
        ("1.002s", 1_002),
        ("7m12s", 432_000),
        ("2h0m0s", 7_200_000),
        ("1h2m3.5s", 3_723_500),
        ("0", 0),
        ("0s", 0),
        ("+3s", 3_000),
        ("500us", 1),
        ("500µs", 1),
        ("1500000ns", 2),
        (" 59.56s ", 59_560),
    ];
    for (s, ms) in cases {
        assert_eq!(parse_go_duration_ms(s), Some(ms), "{s:?}");
    }
    for bad in [
        "", "s", "1", "-1s", "1x", "1S", "1.2.3s", "ms", "1s2", "1 s", "1d", "m1", "..s",
    ] {
        assert_eq!(parse_go_duration_ms(bad), None, "{bad:?}");
    }
    let huge = format!("{}h", "9".repeat(60));
    assert_eq!(parse_go_duration_ms(&huge), Some(u64::MAX));
}

#[test]
fn rfc3339_times() {
    let at = NOW as i64 + 30_000;
    assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30Z"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01t12:00:30z"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01 12:00:30Z"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30+00:00"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01T14:00:30+02:00"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01T07:00:30-0500"), Some(at));
    assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30.250Z"), Some(at + 250));
    assert_eq!(parse_rfc3339_ms("2024-05-01T12:00:30.5Z"), Some(at + 500));
    assert_eq!(
        parse_rfc3339_ms("2024-05-01T12:00:30.000000001Z"),
        Some(at + 1)
    );
    assert_eq!(
        parse_rfc3339_ms("2024-05-01T12:00:30.999999Z"),
        Some(at + 1_000)
    );
    assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
    for bad in [
        "",
        "2024-05-01",
        "2024-05-01T12:00:30",
        "2024-05-01T12:00:30.Z",
        "2024-13-01T12:00:30Z",
        "2024-02-30T12:00:30Z",
        "2024-05-01T25:00:30Z",
        "2024-05-01T12:00:30+24:00",
        "2024-05-01T12:00:30+2:00",
        "2024-05-01T12:00:30ZZ",
        "2024/05/01T12:00:30Z",
        "2024-05-01T12:00:3éZ",
        "é024-05-01T12:00:30Z",
        "1714564830",
    ] {
        assert_eq!(parse_rfc3339_ms(bad), None, "{bad:?}");
    }
}
