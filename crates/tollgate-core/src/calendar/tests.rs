//! Windows on explicit instants (no clock). The expected instants were
//! computed independently (Python's `zoneinfo` on the system tz database)
//! and are written here as numbers.

use super::*;

const H: u64 = 3_600_000;
const DAY: u64 = 24 * H;

fn paris() -> BudgetZone {
    BudgetZone::new("Europe/Paris").unwrap()
}

fn w(start_ms: u64, end_ms: u64) -> Window {
    Window { start_ms, end_ms }
}

/// Every instant from `start` to `end - 1` (ends and a few inside) is in
/// `[start, end)`, and `end` is in the next window, starting at `end`.
fn holds(zone: &BudgetZone, period: Period, start: u64, end: u64) {
    for at in [start, start + 1, (start + end) / 2, end - 1] {
        assert_eq!(
            zone.window(period, at).unwrap(),
            w(start, end),
            "{period} at {at}"
        );
    }
    let after = zone.windows(period, end).unwrap();
    assert_eq!(after.current.start_ms, end, "{period} at {end}");
    let before = zone.windows(period, end - 1).unwrap();
    assert_eq!(before.next, after.current, "{period}: next of {end} - 1");
}

// UTC (the default zone).
const UTC_2027_01_01: u64 = 1_798_761_600_000;
const UTC_2027_01_31: u64 = 1_801_353_600_000;
const UTC_2027_02_01: u64 = 1_801_440_000_000;
const UTC_2027_03_01: u64 = 1_803_859_200_000;
const UTC_2027_04_01: u64 = 1_806_537_600_000;
const UTC_2027_05_01: u64 = 1_809_129_600_000;

// Europe/Paris, local midnights.
const PARIS_2027_03_01: u64 = 1_803_855_600_000;
const PARIS_2027_03_15: u64 = 1_805_065_200_000; // a Monday
const PARIS_2027_03_22: u64 = 1_805_670_000_000; // a Monday
const PARIS_2027_03_27: u64 = 1_806_102_000_000;
const PARIS_2027_03_28: u64 = 1_806_188_400_000; // Sunday: 02:00 → 03:00
const PARIS_2027_03_29: u64 = 1_806_271_200_000; // a Monday
const PARIS_2027_04_01: u64 = 1_806_530_400_000;
const PARIS_2027_04_05: u64 = 1_806_876_000_000; // a Monday
const PARIS_2027_10_25: u64 = 1_824_415_200_000; // a Monday
const PARIS_2027_10_31: u64 = 1_824_933_600_000; // Sunday: 03:00 → 02:00
const PARIS_2027_11_01: u64 = 1_825_023_600_000; // a Monday
const PARIS_2028_02_01: u64 = 1_832_972_400_000;
const PARIS_2028_02_29: u64 = 1_835_391_600_000; // a Tuesday
const PARIS_2028_03_01: u64 = 1_835_478_000_000;
const PARIS_2028_04_01: u64 = 1_838_152_800_000;

#[test]
fn the_default_zone_is_utc() {
    let utc = BudgetZone::default();
    assert_eq!(utc.name(), "UTC");
    assert_eq!(utc, BudgetZone::new("UTC").unwrap());
    // The last millisecond of January 2027.
    let last = UTC_2027_02_01 - 1;
    let month = utc.windows(Period::Monthly, last).unwrap();
    assert_eq!(month.current, w(UTC_2027_01_01, UTC_2027_02_01));
    assert_eq!(month.next, w(UTC_2027_02_01, UTC_2027_03_01));
    assert_eq!(month.next.len_ms(), 28 * DAY);
    let day = utc.windows(Period::Daily, last).unwrap();
    assert_eq!(day.current, w(UTC_2027_01_31, UTC_2027_02_01));
    assert_eq!(day.next, w(UTC_2027_02_01, UTC_2027_02_01 + DAY));
    // One millisecond later, everything has moved on.
    let first = UTC_2027_02_01;
    assert_eq!(
        utc.window(Period::Monthly, first).unwrap(),
        w(UTC_2027_02_01, UTC_2027_03_01)
    );
    assert_eq!(
        utc.window(Period::Daily, first).unwrap(),
        w(UTC_2027_02_01, UTC_2027_02_01 + DAY)
    );
    // 2027-01-31 is a Sunday: its week began Monday the 25th, and the
    // next one begins on 1 February.
    let week = utc.windows(Period::Weekly, last).unwrap();
    assert_eq!(week.current, w(UTC_2027_02_01 - 7 * DAY, UTC_2027_02_01));
    assert_eq!(week.next, w(UTC_2027_02_01, UTC_2027_02_01 + 7 * DAY));
    holds(&utc, Period::Monthly, UTC_2027_01_01, UTC_2027_02_01);
}

#[test]
fn months_of_31_and_30_days() {
    let utc = BudgetZone::default();
    holds(&utc, Period::Monthly, UTC_2027_03_01, UTC_2027_04_01);
    assert_eq!(UTC_2027_04_01 - UTC_2027_03_01, 31 * DAY);
    holds(&utc, Period::Monthly, UTC_2027_04_01, UTC_2027_05_01);
    assert_eq!(UTC_2027_05_01 - UTC_2027_04_01, 30 * DAY);
    let march = utc.windows(Period::Monthly, UTC_2027_03_01 + 17).unwrap();
    assert_eq!(march.next, w(UTC_2027_04_01, UTC_2027_05_01));
}

#[test]
fn the_29th_of_february_2028() {
    let paris = paris();
    // Feb 2028 has 29 days (winter time throughout: 29 × 24 h).
    holds(&paris, Period::Monthly, PARIS_2028_02_01, PARIS_2028_03_01);
    assert_eq!(PARIS_2028_03_01 - PARIS_2028_02_01, 29 * DAY);
    // The day itself, and its last millisecond.
    holds(&paris, Period::Daily, PARIS_2028_02_29, PARIS_2028_03_01);
    let last = paris
        .windows(Period::Monthly, PARIS_2028_03_01 - 1)
        .unwrap();
    assert_eq!(last.current, w(PARIS_2028_02_01, PARIS_2028_03_01));
    // March 2028 ends in summer time: 31 days less the hour of 26 March.
    assert_eq!(last.next, w(PARIS_2028_03_01, PARIS_2028_04_01));
    assert_eq!(last.next.len_ms(), 31 * DAY - H);
    // Tuesday the 29th is in the week from Monday the 28th.
    assert_eq!(
        paris.window(Period::Weekly, PARIS_2028_02_29).unwrap(),
        w(PARIS_2028_02_29 - DAY, PARIS_2028_02_29 + 6 * DAY)
    );
}

#[test]
fn paris_springs_forward_on_28_march_2027() {
    let paris = paris();
    // The day of the change lasts 23 hours.
    holds(&paris, Period::Daily, PARIS_2027_03_28, PARIS_2027_03_29);
    assert_eq!(PARIS_2027_03_29 - PARIS_2027_03_28, 23 * H);
    // Noon UTC that day (14:00 summer time) and the day before, whose next
    // window is the short one.
    let noon = 1_806_235_200_000;
    assert_eq!(
        paris.window(Period::Daily, noon).unwrap(),
        w(PARIS_2027_03_28, PARIS_2027_03_29)
    );
    let before = paris.windows(Period::Daily, PARIS_2027_03_27).unwrap();
    assert_eq!(before.current, w(PARIS_2027_03_27, PARIS_2027_03_28));
    assert_eq!(before.current.len_ms(), 24 * H);
    assert_eq!(before.next.len_ms(), 23 * H);
    // The week containing the change: Monday 22nd to Monday 29th, 167 h.
    holds(&paris, Period::Weekly, PARIS_2027_03_22, PARIS_2027_03_29);
    assert_eq!(PARIS_2027_03_29 - PARIS_2027_03_22, 7 * DAY - H);
    let prior = paris.windows(Period::Weekly, PARIS_2027_03_15).unwrap();
    assert_eq!(prior.current, w(PARIS_2027_03_15, PARIS_2027_03_22));
    assert_eq!(prior.next, w(PARIS_2027_03_22, PARIS_2027_03_29));
    let after = paris.windows(Period::Weekly, PARIS_2027_03_29).unwrap();
    assert_eq!(after.current, w(PARIS_2027_03_29, PARIS_2027_04_05));
    assert_eq!(after.current.len_ms(), 7 * DAY);
    // And the month: 31 days less an hour.
    holds(&paris, Period::Monthly, PARIS_2027_03_01, PARIS_2027_04_01);
    assert_eq!(PARIS_2027_04_01 - PARIS_2027_03_01, 31 * DAY - H);
}

#[test]
fn paris_falls_back_on_31_october_2027() {
    let paris = paris();
    // The day of the change lasts 25 hours; 02:30 local happens twice and
    // both are in it.
    holds(&paris, Period::Daily, PARIS_2027_10_31, PARIS_2027_11_01);
    assert_eq!(PARIS_2027_11_01 - PARIS_2027_10_31, 25 * H);
    let first_0230 = PARIS_2027_10_31 + 2 * H + 30 * 60_000; // 00:30 UTC, +02:00
    let second_0230 = first_0230 + H; // 01:30 UTC, +01:00
    for at in [first_0230, second_0230] {
        assert_eq!(
            paris.window(Period::Daily, at).unwrap(),
            w(PARIS_2027_10_31, PARIS_2027_11_01)
        );
    }
    // The week containing it: Monday 25 October to Monday 1 November, 169 h.
    holds(&paris, Period::Weekly, PARIS_2027_10_25, PARIS_2027_11_01);
    assert_eq!(PARIS_2027_11_01 - PARIS_2027_10_25, 7 * DAY + H);
    // The last millisecond of October is the last of that week, that day
    // and that month; November's first window follows in each.
    let last = PARIS_2027_11_01 - 1;
    for period in Period::ALL {
        let ws = paris.windows(period, last).unwrap();
        assert_eq!(ws.current.end_ms, PARIS_2027_11_01, "{period}");
        assert_eq!(ws.next.start_ms, PARIS_2027_11_01, "{period}");
    }
    let november = paris.window(Period::Monthly, PARIS_2027_11_01).unwrap();
    assert_eq!(november.len_ms(), 30 * DAY);
}

#[test]
fn a_day_whose_midnight_does_not_exist_starts_at_its_first_valid_instant() {
    // (zone, the first instant of the day, the next midnight): each of
    // these went from 00:00 straight to 01:00.
    for (zone, start, end) in [
        // 2015-10-18T01:00-02:00.
        ("America/Sao_Paulo", 1_445_137_200_000, 1_445_220_000_000),
        // 2023-03-12T01:00-04:00.
        ("America/Havana", 1_678_597_200_000, 1_678_680_000_000),
        // 2022-09-11T01:00-03:00.
        ("America/Santiago", 1_662_868_800_000, 1_662_951_600_000),
    ] {
        let zone = BudgetZone::new(zone).unwrap();
        holds(&zone, Period::Daily, start, end);
        assert_eq!(end - start, 23 * H, "{}", zone.name());
        // The last millisecond of the day before ends right where it starts.
        let eve = zone.windows(Period::Daily, start - 1).unwrap();
        assert_eq!(eve.current.end_ms, start, "{}", zone.name());
        assert_eq!(eve.next, w(start, end), "{}", zone.name());
    }
}

#[test]
fn unknown_zones_and_instants_out_of_range_are_errors() {
    assert_eq!(
        BudgetZone::new("Europe/Pariss").unwrap_err(),
        UnknownZone("Europe/Pariss".into())
    );
    assert!(BudgetZone::new("").is_err());
    let utc = BudgetZone::default();
    for at in [u64::MAX, i64::MAX as u64, 253_402_300_800_000] {
        assert_eq!(
            utc.windows(Period::Monthly, at).unwrap_err(),
            OutOfRange { at_ms: at }
        );
    }
    // The epoch's day and month start at 0; its week began on Monday
    // 1969-12-29, before the epoch, so it is out of range.
    assert_eq!(utc.window(Period::Daily, 0).unwrap(), w(0, DAY));
    assert_eq!(utc.window(Period::Monthly, 0).unwrap(), w(0, 31 * DAY));
    assert_eq!(
        utc.window(Period::Weekly, 0).unwrap_err(),
        OutOfRange { at_ms: 0 }
    );
    assert_eq!(
        utc.window(Period::Weekly, 4 * DAY).unwrap(),
        w(4 * DAY, 11 * DAY)
    );
}

#[test]
fn names_are_matched_without_case_and_kept_as_the_database_spells_them() {
    for (written, name) in [
        ("europe/paris", "Europe/Paris"),
        ("utc", "UTC"),
        ("Etc/UTC", "Etc/UTC"),
    ] {
        assert_eq!(BudgetZone::new(written).unwrap().name(), name);
    }
    assert_eq!(BudgetZone::new("europe/paris").unwrap(), paris());
}
