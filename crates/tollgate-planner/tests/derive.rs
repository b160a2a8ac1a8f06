//! `derive`: per-user rates, nearest-rank p95 per plan, suggestions at
//! 2.5×, and a plan section that parses back through the config loader.

use std::fmt::Write as _;
use std::path::PathBuf;

use tollgate_planner::derive::{DEFAULT_MULTIPLE, derive, derive_file};
use tollgate_planner::{Limits, Rational};

/// Plan "support": user `u01`…`u20`, user i makes i turns in the first
/// minute, one a second from t = 0, each 1,000 tokens in 2 model calls
/// (one turn of u20 makes 10) and 1,500 ms long. Plan "pro": one user, no
/// durations.
fn usage() -> String {
    let mut records = Vec::new();
    for i in 1..=20u64 {
        for j in 0..i {
            let calls = if i == 20 && j == 0 { 10 } else { 2 };
            records.push((
                j * 1_000,
                format!(
                    r#"{{"t_ms": {}, "user": "u{i:02}", "plan": "support", "tokens": 1000, "model_calls": {calls}, "duration_ms": 1500}}"#,
                    j * 1_000
                ),
            ));
        }
    }
    for j in 0..3u64 {
        let t = 30_000 + j * 20_000;
        records.push((
            t,
            format!(
                r#"{{"t_ms": {t}, "user": "big", "plan": "pro", "tokens": 40000, "model_calls": 4}}"#
            ),
        ));
    }
    records.sort_by_key(|(t, _)| *t);
    let mut out = String::new();
    for (_, r) in records {
        let _ = writeln!(out, "{r}");
    }
    out
}

#[test]
fn per_user_rates_and_nearest_rank_p95_per_plan() {
    let r = derive(usage().as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
    assert_eq!(r.records, 213);
    let s = &r.plans["support"];
    assert_eq!(
        (s.users, s.turns, s.tokens, s.model_calls),
        (20, 210, 210_000, 428)
    );
    // Busiest minute: user i makes i turns. Nearest rank of 20 users:
    // rank ⌈0.95 × 20⌉ = 19 → 19; the median is rank 10.
    assert_eq!(
        (
            s.turns_per_min.p50,
            s.turns_per_min.p95,
            s.turns_per_min.max
        ),
        (10, 19, 20)
    );
    assert_eq!(s.tokens_per_min.p95, 19_000);
    // Busiest 10 s: min(i, 10).
    assert_eq!((s.turns_per_10s.p95, s.turns_per_10s.max), (10, 10));
    // 1,500 ms turns a second apart: two at once (one for u01).
    let c = s.concurrent_turns.unwrap();
    assert_eq!((c.p50, c.p95, c.max), (2, 2, 2));
    assert_eq!(s.max_calls_per_turn, 10);
    assert_eq!(s.tokens_per_call, Some(491)); // 210,000 / 428, rounded up

    // Suggestions at 2.5×, rounded up (two significant digits from 100).
    let p = &s.suggested;
    assert_eq!(p.turns.amount, 48); // 47.5
    assert_eq!(p.turns.burst, Some(25));
    assert_eq!(p.tokens.amount, 48_000); // 47,500
    assert_eq!(p.tokens.burst, None);
    assert_eq!(p.concurrent_runs, 5);
    assert_eq!(p.max_llm_calls, Some(25));
    assert_eq!(p.estimate_tokens, Some(500));
    assert_eq!(p.max_wait_ms, 2_000);

    let pro = &r.plans["pro"];
    assert_eq!(pro.users, 1);
    assert_eq!(pro.turns_per_min.p95, 2); // t = 30 s and 50 s share minute 0
    assert_eq!(pro.tokens_per_min.p95, 80_000);
    assert_eq!(pro.concurrent_turns, None);
    assert_eq!(pro.suggested.turns.amount, 5);
    assert_eq!(pro.suggested.tokens.amount, 200_000);
    assert_eq!(pro.suggested.concurrent_runs, 2);
}

#[test]
fn the_plan_section_parses_back_through_the_config_loader() {
    let r = derive(usage().as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
    let text = r.to_toml();
    assert!(text.contains("[plans.support]"), "{text}");
    assert!(
        text.contains("turns = { amount = 48, period_ms = 60000, burst = 25 }"),
        "{text}"
    );
    assert!(text.contains("# no duration_ms in the usage"), "{text}");
    let config = format!("default_plan = \"support\"\n{text}");
    let limits = Limits::parse(&config, "derived.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(limits.plans.plans["support"], r.plans["support"].suggested);
    assert_eq!(limits.plans.plans["pro"], r.plans["pro"].suggested);
}

#[test]
fn the_multiple_is_configurable_and_names_with_spaces_are_quoted() {
    let usage = r#"{"t_ms": 0, "user": "a", "plan": "team plan", "tokens": 999, "model_calls": 1}
{"t_ms": 1, "user": "a", "plan": "team plan", "tokens": 1, "model_calls": 0}
"#;
    let r = derive(usage.as_bytes(), "u", "4".parse::<Rational>().unwrap()).unwrap();
    let p = &r.plans["team plan"].suggested;
    assert_eq!((p.turns.amount, p.tokens.amount), (8, 4_000));
    let text = r.to_toml();
    assert!(text.contains("[plans.\"team plan\"]"), "{text}");
    assert!(text.contains("at 4× the 95th"), "{text}");
    Limits::parse(&text, "derived.toml").unwrap();
    let table = r.to_table();
    assert!(table.contains("turns.amount = 8"), "{table}");
    assert!(table.contains("placeholder"), "{table}");
    assert_eq!(
        r.to_json()["plans"]["team plan"]["suggested"]["tokens"]["amount"],
        4_000
    );
    assert_eq!(r.to_json()["multiple"], 4.0);
}

#[test]
fn files_are_read_and_a_missing_one_is_a_clear_error() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("derive");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("usage.jsonl");
    std::fs::write(&path, usage()).unwrap();
    let r = derive_file(&path, DEFAULT_MULTIPLE).unwrap();
    assert_eq!(r.records, 213);
    assert_eq!(r.source, path.display().to_string());
    let e = derive_file(&dir.join("nope.jsonl"), DEFAULT_MULTIPLE).unwrap_err();
    assert!(e.to_string().starts_with("cannot read "), "{e}");
    assert_eq!(e.exit_code(), 66);
}

#[test]
fn the_sample_usage_file_derives_a_valid_config() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/traces/usage.jsonl");
    let r = derive_file(&path, DEFAULT_MULTIPLE).unwrap();
    assert_eq!(r.records, 896);
    assert_eq!(r.plans.len(), 2);
    let limits = Limits::parse(&r.to_toml(), "derived.toml").unwrap();
    assert_eq!(limits.plans.plans.len(), 2);
    assert_eq!(r.plans["support"].suggested.tokens.amount, 87_000);
}

/// A monthly token budget from each user's busiest calendar month (UTC):
/// user i spends i × 100,000 tokens on 10 January and half that on 10
/// February. The records start on 10 January, so January is covered 22 of
/// its 31 days and scaled by 31/22: user 19's 1,900,000 become 2,677,273,
/// and 2.5× suggests 6,693,182 → 6,700,000. A month covered whole is not
/// scaled.
#[test]
fn a_monthly_budget_from_the_busiest_calendar_month() {
    const DAY: u64 = 86_400_000;
    // 2027-01-10 and 2027-02-10, 00:00 UTC.
    let (jan, feb) = (1_799_539_200_000_u64, 1_799_539_200_000_u64 + 31 * DAY);
    let mut out = String::new();
    for (t, div) in [(jan, 1), (feb, 2)] {
        for i in 1..=20u64 {
            let _ = writeln!(
                out,
                r#"{{"t_ms": {}, "user": "u{i:02}", "plan": "p", "tokens": {}, "model_calls": 1}}"#,
                t + i,
                i * 100_000 / div
            );
        }
    }
    let r = derive(out.as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
    let p = &r.plans["p"];
    assert_eq!(
        (
            p.tokens_per_month.p50,
            p.tokens_per_month.p95,
            p.tokens_per_month.max
        ),
        (1_409_091, 2_677_273, 2_818_182)
    );
    let text = r.to_toml();
    assert!(
        text.contains("[plans.p.budgets]\n# tokens in the busiest calendar month (UTC), a month the records cover in\n# part scaled to the whole: p95 2,677,273 (max 2,818,182)\nmonthly = { tokens = 6700000 }"),
        "{text}"
    );
    let limits = Limits::parse(&format!("default_plan = \"p\"\n{text}"), "d.toml").unwrap();
    assert_eq!(limits.plans.plans["p"], p.suggested);

    // January alone, over 5 days: scaled ×31/5. 190,000 × 6.2 × 2.5 =
    // 2,945,000 → 3,000,000.
    let mut out = String::new();
    for i in 1..=20u64 {
        let _ = writeln!(
            out,
            r#"{{"t_ms": {}, "user": "u{i:02}", "plan": "p", "tokens": {}, "model_calls": 1}}"#,
            jan + (i - 1) * 5 * DAY / 19,
            i * 10_000
        );
    }
    let r = derive(out.as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
    assert_eq!(r.plans["p"].tokens_per_month.p95, 1_178_000);
    assert!(r.to_toml().contains("monthly = { tokens = 3000000 }"));

    // A whole month of records: not scaled.
    let mut out = String::new();
    let jan1 = jan - 9 * DAY;
    for (t, tokens) in [(jan1, 1_000), (jan1 + 31 * DAY - 1, 2_000)] {
        let _ = writeln!(
            out,
            r#"{{"t_ms": {t}, "user": "u", "plan": "p", "tokens": {tokens}, "model_calls": 1}}"#
        );
    }
    let r = derive(out.as_bytes(), "usage.jsonl", DEFAULT_MULTIPLE).unwrap();
    assert_eq!(r.plans["p"].tokens_per_month.p95, 3_000);
}
