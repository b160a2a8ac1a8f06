//! `simulate` end to end: SPEC §7 replayed from the sample trace
//! (examples/traces), shadow mode, malformed input, the chart's structure
//! and a long trace streamed from a generator.

use std::collections::HashMap;
use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};

use tollgate_planner::simulate::{ReplayOptions, Report, SimulateOptions, replay, simulate};
use tollgate_planner::{Limits, PlanError};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/traces")
}

fn spec7_limits() -> Limits {
    Limits::load(&examples().join("spec7.toml")).unwrap()
}

fn spec7(shadow: bool) -> Report {
    let opts = SimulateOptions::new(
        examples().join("spec7.toml"),
        examples().join("spec7.jsonl"),
    )
    .with_shadow(shadow);
    simulate(&opts).unwrap()
}

fn run(limits: &Limits, trace: &str) -> Result<Report, PlanError> {
    replay(
        limits,
        trace.as_bytes(),
        "t.jsonl",
        &ReplayOptions::default(),
    )
}

fn counts(c: &tollgate_planner::simulate::DecisionCounts) -> (u64, u64, u64, u64) {
    (c.allowed, c.waited, c.denied, c.shadow_denied)
}

fn retries(report: &tollgate_planner::simulate::LimitReport) -> (u64, u64, u64) {
    let s = report.retry_after_ms.expect("a retry hint");
    (s.count, s.min, s.max)
}

#[test]
fn spec7_sample_trace_reproduces_the_examples() {
    let r = spec7(false);
    assert_eq!((r.lines, r.events, r.users), (442, 442, 8));
    assert_eq!((r.start_ms, r.end_ms), (Some(0), Some(595_000)));
    assert!(!r.shadow);

    let support = &r.plans["support"];
    assert_eq!(support.users, 7);
    // Turns: example 1 (5 allowed, 5 denied), example 2 (60 allowed),
    // example 3 (1), example 4 (tabs: a, b, d, f allowed, c and e denied;
    // tabs2: 5 allowed after a denial), a session (2 allowed, 1 busy), the
    // one-deadline agent (1).
    assert_eq!(counts(&support.turns), (78, 0, 9, 0));
    // Example 1: turns 6-10 at t = 1,000 ms are denied with retry 2,000.
    assert_eq!(support.limits["turn_rate"].denied, 5);
    assert_eq!(retries(&support.limits["turn_rate"]), (5, 2_000, 2_000));
    // Example 4: a third run is denied for concurrency (retry capped at
    // concurrency_retry_ms), also while an abandoned lease still holds.
    assert_eq!(support.limits["concurrency"].denied, 3);
    assert_eq!(retries(&support.limits["concurrency"]), (3, 1_000, 1_000));
    // A second turn of a running session: busy for the lease's TTL.
    assert_eq!(retries(&support.limits["session"]), (1, 30_000, 30_000));

    // Model calls: 60 steady ones never wait; example 3's refused call
    // (retry 4,000) and its retry granted after 2,000 (the boundary is
    // inclusive); the agent's call refused by the provider (retry 2,100,
    // refunded) and granted after 1,100.
    assert_eq!(counts(&support.model_calls), (61, 2, 2, 0));
    assert_eq!(retries(&support.limits["token_rate"]), (1, 4_000, 4_000));
    assert_eq!(retries(&support.limits["provider_rate"]), (1, 2_100, 2_100));
    let waits = support.wait_ms.unwrap();
    assert_eq!((waits.count, waits.max, waits.p95), (63, 2_000, 0));

    // Example 3 with max wait 6,000 ms: granted with a 6,000 ms wait.
    let patient = &r.plans["support+override"];
    assert_eq!(counts(&patient.model_calls), (1, 1, 0, 0));
    assert_eq!(patient.wait_ms.unwrap().max, 6_000);

    // The provider example: 100 calls at t = 0 on 600/min, capacity 60.
    let p = &r.providers["openai:gpt-4o"];
    // 60 at once, 40 waiting 100·k ms up to 4,000; plus the agent's two.
    assert_eq!(counts(&p.permits), (60, 41, 1, 0));
    assert_eq!(p.wait_ms.unwrap().max, 4_000);
    let mini = &r.providers["openai:gpt-4o-mini"];
    // With max wait 2,000 ms, calls 81-100 are refused.
    assert_eq!(counts(&mini.permits), (60, 20, 20, 0));
    assert_eq!(retries(&mini.limits["provider_rate"]), (20, 100, 100));
    assert_eq!(mini.wait_ms.unwrap().max, 2_000);
    // A 429 with Retry-After: 2 holds the key for 2 s.
    let o3 = &r.providers["openai:o3"];
    assert_eq!(o3.responses["throttled"], 1);
    assert_eq!(o3.cooldowns, 1);
    let w = o3.wait_ms.unwrap();
    assert_eq!((w.count, w.min, w.max), (2, 1_500, 2_000));

    assert_eq!(r.runs.admitted, 79);
    assert_eq!(r.runs.ended, 78);
    assert_eq!(r.runs.abandoned, 1);
    assert_eq!(r.runs.still_running, 0);
    assert_eq!(r.runs.leases_reclaimed, 1);
    assert_eq!(r.runs.leases_lost, 0);
    // The turn_end events of burst's five denied turns.
    assert_eq!(r.skipped.not_running, 5);

    let by_user: HashMap<&str, _> = r.top_users.iter().map(|u| (u.user.as_str(), u)).collect();
    assert_eq!(r.top_users[0].user, "burst");
    assert_eq!(by_user["burst"].turns.denied, 5);
    assert_eq!(counts(&by_user["tabs2"].turns), (5, 0, 1, 0));
    assert_eq!(by_user["tokens"].wait_ms_max, 2_000);
    assert_eq!(by_user["patient"].wait_ms_total, 6_000);
    assert_eq!(by_user["steady"].tokens, 300_000);

    let table = r.to_table();
    for want in [
        "support (7 users)",
        "turn_rate",
        "2,000 ms",
        "provider openai:gpt-4o-mini",
        "users hit hardest",
    ] {
        assert!(table.contains(want), "{want:?} not in\n{table}");
    }
    let json = r.to_json();
    assert_eq!(json["plans"]["support"]["turns"]["denied"], 9);
    assert_eq!(
        json["plans"]["support"]["limits"]["turn_rate"]["retry_after_ms"]["max"],
        2_000
    );
    assert_eq!(
        json["providers"]["openai:gpt-4o-mini"]["permits"]["denied"],
        20
    );
}

#[test]
fn shadow_mode_denies_nothing_and_counts_would_deny() {
    let r = spec7(true);
    assert!(r.shadow);
    for (name, p) in &r.plans {
        assert_eq!(p.turns.denied + p.model_calls.denied, 0, "{name}");
    }
    for (name, p) in &r.providers {
        assert_eq!(p.permits.denied, 0, "{name}");
    }
    let support = &r.plans["support"];
    // Refusals take nothing, so the turn denials are the enforcing ones.
    assert_eq!(counts(&support.turns), (78, 0, 0, 9));
    assert_eq!(support.limits["turn_rate"].shadow_denied, 5);
    assert_eq!(support.limits["concurrency"].shadow_denied, 3);
    assert_eq!(support.limits["session"].shadow_denied, 1);
    assert_eq!(retries(&support.limits["turn_rate"]), (5, 2_000, 2_000));
    // Shadow-admitted calls run and are charged, so a later call of the
    // same user would be refused too.
    assert_eq!(support.limits["token_rate"].shadow_denied, 2);
    assert_eq!(r.providers["openai:gpt-4o-mini"].permits.shadow_denied, 20);
    let table = r.to_table();
    assert!(table.contains("would deny"), "{table}");
    assert!(table.contains("shadow mode (--shadow)"), "{table}");
}

#[test]
fn malformed_lines_name_line_and_field() {
    let limits = spec7_limits();
    let good = r#"{"t_ms": 0, "event": "turn_start", "user": "u1", "invocation": "i1"}"#;
    let cases = [
        (
            r#"{"t_ms": 5, "event": "turn_end", "invocation": "i1"}"#,
            Some("user"),
            r#"t.jsonl: line 3: field "user": missing"#,
        ),
        (
            r#"{"t_ms": 5, "event": "model_call", "user": "u1", "invocation": "i1", "estimate": "big"}"#,
            Some("estimate"),
            r#"t.jsonl: line 3: field "estimate": invalid type: string "big", expected u64"#,
        ),
        (
            r#"{"t_ms": 5, "event": "model_call", "user": "u1", "invocation": "i1", "estimat": 5}"#,
            Some("estimat"),
            "t.jsonl: line 3: field \"estimat\": unknown field",
        ),
        (
            r#"{"t_ms": 5, "event": "turn_start", "user": "u1", "invocation": "i2""#,
            None,
            "t.jsonl: line 3: not valid JSON: EOF while parsing an object",
        ),
        (
            r#"{"t_ms": 5, "event": "model_call", "user": "u1", "invocation": "i1", "actual": 9007199254740993}"#,
            Some("actual"),
            r#"t.jsonl: line 3: field "actual": must be at most"#,
        ),
        (
            &format!(
                r#"{{"t_ms": 5, "event": "turn_start", "user": "{}", "invocation": "i2"}}"#,
                "u".repeat(600)
            ),
            Some("user"),
            r#"t.jsonl: line 3: field "user": must be at most 512 characters"#,
        ),
    ];
    for (line, field, want) in cases {
        // A blank line 2: line numbers count every line of the file.
        let trace = format!("{good}\n\n{line}\n");
        let e = run(&limits, &trace).unwrap_err();
        assert!(e.to_string().starts_with(want), "{e}\nwanted: {want}");
        match &e {
            PlanError::Line {
                line: 3, field: f, ..
            } => assert_eq!(f.as_deref(), field),
            other => panic!("{other:?}"),
        }
        assert_eq!(e.exit_code(), 65);
    }
}

#[test]
fn events_going_back_in_time_are_refused() {
    let trace = r#"{"t_ms": 1000, "event": "turn_start", "user": "u1", "invocation": "i1"}
{"t_ms": 1000, "event": "turn_end", "user": "u1", "invocation": "i1"}
{"t_ms": 999, "event": "turn_start", "user": "u1", "invocation": "i2"}
"#;
    let e = run(&spec7_limits(), trace).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"t.jsonl: line 3: field "t_ms": 999 is earlier than the previous event's 1000: a trace must be sorted by time"#
    );
}

#[test]
fn bad_config_and_missing_files_are_clear_errors() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate-errors");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[plans.p]\nturns = { amount = 0, period_ms = 60000 }\ntokens = { amount = 1, period_ms = 1 }\nconcurrent_runs = 1\n",
    )
    .unwrap();
    let e = simulate(&SimulateOptions::new(&bad, examples().join("spec7.jsonl"))).unwrap_err();
    assert!(
        e.to_string()
            .contains("plans.p.turns.amount: must be at least 1 (got 0)"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 64);
    let e = simulate(&SimulateOptions::new(
        examples().join("spec7.toml"),
        dir.join("missing.jsonl"),
    ))
    .unwrap_err();
    assert!(e.to_string().starts_with("cannot read "), "{e}");
    assert_eq!(e.exit_code(), 66);
}

#[test]
fn users_without_a_plan_and_unknown_providers_are_skipped_and_counted() {
    let limits = Limits::parse(
        r#"
[plans.p]
turns = { amount = 10, period_ms = 60000 }
tokens = { amount = 60000, period_ms = 60000 }
concurrent_runs = 1
[users]
known = "p"
"#,
        "c.toml",
    )
    .unwrap();
    let trace = r#"{"t_ms": 0, "event": "turn_start", "user": "stranger", "invocation": "i1"}
{"t_ms": 0, "event": "model_call", "user": "stranger", "invocation": "i1"}
{"t_ms": 0, "event": "turn_start", "user": "known", "invocation": "i1"}
{"t_ms": 0, "event": "model_call", "user": "known", "invocation": "i1", "provider": "acme", "model": "m"}
{"t_ms": 0, "event": "provider_response", "provider": "acme", "model": "m", "status": 429}
"#;
    let r = run(&limits, trace).unwrap();
    assert_eq!(r.skipped.unknown_user, 1);
    assert_eq!(r.skipped.not_running, 1);
    assert_eq!(r.skipped.unknown_provider, 2);
    assert_eq!(r.users, 1);
    // The call went ahead without a provider permit, charged its default
    // estimate (1,000) and settled it.
    assert_eq!(counts(&r.plans["p"].model_calls), (1, 0, 0, 0));
    assert_eq!(r.plans["p"].tokens, 1_000);
    assert_eq!(r.runs.still_running, 1);
}

/// Parses an SVG and checks what a reader needs: both panels' axes with
/// their descriptions and tick labels, and one line per outcome and per
/// user, each with its legend entry.
#[test]
fn chart_has_axes_and_one_series_per_outcome_and_user() {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spec7.svg");
    let _ = std::fs::remove_file(&out);
    let opts = SimulateOptions::new(
        examples().join("spec7.toml"),
        examples().join("spec7.jsonl"),
    )
    .with_chart(Some(out.clone()));
    let report = simulate(&opts).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some("1200"));

    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect();
    let has = |t: &str| texts.iter().any(|x| x == t);
    for want in [
        "Decisions per second by outcome (1 s bins)",
        "Token bucket level of the users hit hardest (lowest in each bin)",
        "decisions/s",
        "tokens available",
        "allowed",
        "waited",
        "denied",
        "shadow-denied",
        "60,000",
    ] {
        assert!(has(want), "no text {want:?} in {texts:?}");
    }
    assert_eq!(texts.iter().filter(|t| *t == "time (min)").count(), 2);
    // Tick labels: numbers on both axes of both panels.
    let numeric = texts
        .iter()
        .filter(|t| t.replace([',', '.', '-'], "").parse::<u64>().is_ok())
        .count();
    assert!(numeric >= 20, "{numeric} tick labels");

    let polylines: Vec<(String, usize)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .map(|n| {
            (
                n.attribute("stroke").unwrap_or("").to_owned(),
                n.attribute("points")
                    .unwrap_or("")
                    .split_whitespace()
                    .count(),
            )
        })
        .collect();
    // Axes: black two-point lines.
    assert!(
        polylines
            .iter()
            .filter(|(c, n)| c == "#000000" && *n == 2)
            .count()
            >= 4
    );
    // One series per outcome (a point per bin: 595 s at 1 s bins) and a
    // legend sample in the same colour.
    for colour in ["#2CA02C", "#FF7F0E", "#D62728", "#9467BD"] {
        let series: Vec<usize> = polylines
            .iter()
            .filter(|(c, _)| c == colour)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(series.len(), 2, "{colour}: {series:?}");
        assert!(series.contains(&596), "{colour}: {series:?}");
    }
    // One series per user hit hardest (five), labelled with the user.
    let users: Vec<&str> = report
        .top_users
        .iter()
        .take(5)
        .map(|u| u.user.as_str())
        .collect();
    assert_eq!(users.len(), 5);
    for (user, colour) in users
        .iter()
        .zip(["#1F77B4", "#8C564B", "#E377C2", "#7F7F7F", "#17BECF"])
    {
        assert!(has(&format!("{user} (support)")), "no legend for {user}");
        assert!(
            polylines.iter().any(|(c, n)| c == colour && *n == 596),
            "no series for {user}"
        );
    }
}

/// A trace generated on the fly, never held whole: `users` users taking
/// turns of two model calls each, one line at a time.
struct Generated {
    lines: u64,
    next: u64,
    users: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Generated {
    fn new(lines: u64, users: u64) -> Self {
        Self {
            lines,
            next: 0,
            users,
            buf: Vec::new(),
            pos: 0,
        }
    }

    fn refill(&mut self) {
        self.buf.clear();
        self.pos = 0;
        if self.next >= self.lines {
            return;
        }
        let i = self.next;
        self.next += 1;
        // Turn k of user u: start, call, call, end; 4 lines per turn.
        let (turn, step) = (i / 4, i % 4);
        let user = turn % self.users;
        let t = turn * 100;
        let line = match step {
            0 => format!(
                r#"{{"t_ms": {t}, "event": "turn_start", "user": "u{user}", "session": "s{user}", "invocation": "i{turn}"}}"#
            ),
            1 | 2 => format!(
                r#"{{"t_ms": {t}, "event": "model_call", "user": "u{user}", "invocation": "i{turn}", "estimate": 3000, "actual": 2500}}"#
            ),
            _ => format!(
                r#"{{"t_ms": {t}, "event": "turn_end", "user": "u{user}", "invocation": "i{turn}"}}"#
            ),
        };
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
    }
}

impl Read for Generated {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = {
            let avail = self.fill_buf()?;
            let n = avail.len().min(out.len());
            out[..n].copy_from_slice(&avail[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Generated {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos >= self.buf.len() {
            self.refill();
        }
        Ok(&self.buf[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

#[test]
fn a_long_trace_streams_from_a_reader() {
    let r = replay(
        &spec7_limits(),
        Generated::new(40_000, 50),
        "generated",
        &ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(r.events, 40_000);
    assert_eq!(r.users, 50);
    let support = &r.plans["support"];
    // 10,000 turns of 50 users over 1,000 s: 12 turns/min each, under 20.
    assert_eq!(support.turns.total(), 10_000);
    assert_eq!(support.turns.denied, 0);
    assert_eq!(support.model_calls.total(), 20_000);
    assert_eq!(r.runs.ended, 10_000);
}

/// SPEC §5: one deadline. The provider permit is taken after the user's
/// wait, within what is left of the plan's `max_wait_ms`; a refusal refunds
/// the user.
#[test]
fn a_model_call_has_one_deadline_for_user_and_provider_waits() {
    let limits = Limits::parse(
        r#"
default_plan = "p"
[plans.p]
turns = { amount = 10, period_ms = 60000 }
tokens = { amount = 60000, period_ms = 60000 }
max_wait_ms = 2000
concurrent_runs = 1
[providers."acme:m"]
requests = { amount = 30, period_ms = 60000, burst = 1 }
max_wait_ms = 4000
"#,
        "c.toml",
    )
    .unwrap();
    let call = |estimate: u64| {
        format!(
            r#"{{"t_ms": 0, "event": "model_call", "user": "u", "invocation": "i", "estimate": {estimate}, "provider": "acme", "model": "m"}}"#
        )
    };
    let trace = [
        r#"{"t_ms": 0, "event": "turn_start", "user": "u", "invocation": "i"}"#.to_owned(),
        // Empties both the user's tokens and the provider's one request.
        call(60_000),
        // User: 1,000 ms for 1,000 tokens; then the provider (1 per 2 s,
        // half a request back by then) needs 1,000 ms more: exactly the
        // 1,000 ms left. Waited 2,000 ms in all.
        call(1_000),
        // User: 2,000 ms; the provider would need 2,000 ms more, and
        // nothing is left: refused, and the 1,000 tokens are refunded.
        call(1_000),
    ]
    .join("\n");
    let r = run(&limits, &trace).unwrap();
    let p = &r.plans["p"];
    assert_eq!(counts(&p.model_calls), (1, 1, 1, 0));
    assert_eq!(p.wait_ms.unwrap().max, 2_000);
    assert_eq!(p.limits["provider_rate"].denied, 1);
    let acme = &r.providers["acme:m"];
    assert_eq!(counts(&acme.permits), (1, 1, 1, 0));
    assert_eq!(acme.wait_ms.unwrap().max, 1_000);
    // Only the two calls that went ahead are charged.
    assert_eq!(r.top_users[0].tokens, 61_000);
}

/// Spend budgets in a replay: the real limiter charges each
/// model call to the plan's budgets at its model's price, refuses what
/// would go over until the window resets (`budget_daily` in the report),
/// and a turn admission under `deny_turns`; a trace of a budgeted config
/// must be in Unix time.
#[test]
fn budgets_are_replayed_at_the_models_prices_in_calendar_windows() {
    let limits = Limits::parse(
        r#"default_plan = "pro"
currency = "USD"

[prices."openai:gpt-4o"]
input = "2.50"
output = "10.00"

[budgets]
time_zone = "Europe/Paris"

[plans.pro]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 10000000, period_ms = 60000 }
concurrent_runs = 10

[plans.pro.budgets]
daily = { cost = "0.10" }
on_exhausted = "deny_turns"
"#,
        "c.toml",
    )
    .unwrap();
    // 2026-12-02 22:00 UTC = 23:00 in Paris: an hour before the local day
    // ends. Calls of 3,000, 3,000, 3,000 and 1,000 tokens at $10/M
    // (unsplit: the higher price) spend the $0.10 exactly; a fifth of one
    // token is refused.
    let t0: u64 = 1_796_248_800_000;
    let mut trace = format!(
        r#"{{"t_ms": {t0}, "event": "turn_start", "user": "u1", "invocation": "i1"}}
"#
    );
    for (k, estimate) in [3_000, 3_000, 3_000, 1_000, 1].into_iter().enumerate() {
        trace += &format!(
            r#"{{"t_ms": {}, "event": "model_call", "user": "u1", "invocation": "i1", "estimate": {estimate}, "provider": "openai", "model": "gpt-4o"}}
"#,
            t0 + 1_000 * (k as u64 + 1)
        );
    }
    trace += &format!(
        r#"{{"t_ms": {}, "event": "turn_end", "user": "u1", "invocation": "i1"}}
{{"t_ms": {}, "event": "turn_start", "user": "u1", "invocation": "i2"}}
{{"t_ms": {}, "event": "turn_start", "user": "u1", "invocation": "i3"}}
{{"t_ms": {}, "event": "model_call", "user": "u1", "invocation": "i3", "estimate": 3000, "provider": "openai", "model": "gpt-4o"}}
"#,
        t0 + 10_000,
        t0 + 20_000,
        // Local midnight in Paris: a new day, a new budget.
        t0 + 3_600_000,
        t0 + 3_600_001,
    );
    let r = run(&limits, &trace).unwrap();
    let pro = &r.plans["pro"];
    assert_eq!(counts(&pro.model_calls), (5, 0, 1, 0), "{pro:?}");
    // The fifth call and the turn i2 (deny_turns): both refused until
    // local midnight, 3,595,000 and 3,580,000 ms later; i3's call after
    // midnight goes ahead.
    let budget = &pro.limits["budget_daily"];
    assert_eq!(retries(budget), (2, 3_580_000, 3_595_000));
    assert_eq!(counts(&pro.turns), (2, 0, 1, 0));

    // A trace from 0 cannot name calendar windows.
    let e = run(
        &limits,
        r#"{"t_ms": 0, "event": "turn_start", "user": "u1", "invocation": "i1"}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("line 1: field \"t_ms\": 0 is not Unix time"),
        "{e}"
    );
    // A model with no price against the cost budget names its line.
    let unpriced = format!(
        r#"{{"t_ms": {t0}, "event": "turn_start", "user": "u1", "invocation": "i1"}}
{{"t_ms": {t0}, "event": "model_call", "user": "u1", "invocation": "i1", "provider": "openai", "model": "o3"}}
"#
    );
    let e = run(&limits, &unpriced).unwrap_err().to_string();
    assert!(
        e.contains("line 2: field \"model\": openai:o3 has no price"),
        "{e}"
    );
}

/// The noisy-neighbour trace (examples/traces/noisy.jsonl: batch offers
/// 2.5 times the pool, chat twice it, support a fifth) under weighted fair
/// sharing, static shares and no tenants: the figures docs/planning.md's
/// table gives.
#[test]
fn a_noisy_neighbour_under_weights_shares_and_no_tenants() {
    let noisy = |config: &str| {
        let opts = SimulateOptions::new(
            examples().join(format!("noisy-{config}.toml")),
            examples().join("noisy.jsonl"),
        );
        let report = simulate(&opts).unwrap();
        report.providers["llm:shared"].clone()
    };
    let granted =
        |p: &tollgate_planner::simulate::ProviderReport, t: &str| p.tenants[t].allowed_total();
    // Weights 2:1:1: the pool used, chat twice batch, support never
    // refused nor kept waiting.
    let w = noisy("weights");
    assert!(w.utilisation.unwrap() >= 0.98, "{:?}", w.utilisation);
    let ratio = granted(&w, "chat") as f64 / granted(&w, "batch") as f64;
    assert!((ratio - 2.0).abs() <= 0.06, "chat/batch {ratio}");
    assert_eq!(w.tenants["support"].permits.denied, 0);
    assert_eq!(granted(&w, "support"), 120);
    assert!(w.tenants["support"].wait_ms.as_ref().unwrap().p99 <= 200);
    assert!(w.fairness.unwrap() >= 0.99, "{:?}", w.fairness);
    assert_eq!(w.backlogged, 2);
    // Shares 0.5/0.25/0.25: support is served, but what it leaves of its
    // quarter is wasted and the backlogged wait the whole max wait.
    let s = noisy("shares");
    assert!(s.utilisation.unwrap() < 0.95, "{:?}", s.utilisation);
    assert_eq!(s.tenants["support"].permits.denied, 0);
    assert_eq!(s.tenants["chat"].wait_ms.as_ref().unwrap().p50, 4_000);
    // No tenants: the pool is used, support is crowded out.
    let n = noisy("none");
    assert!(n.utilisation.unwrap() >= 0.98, "{:?}", n.utilisation);
    assert!(
        n.tenants["support"].permits.denied > 100,
        "{:?}",
        n.tenants["support"]
    );
    assert_eq!(n.backlogged, 3);
}

/// With tenants, the chart has a third panel: each tenant's permits
/// started per second, one line and legend entry each.
#[test]
fn the_chart_draws_each_tenants_permits() {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("noisy.svg");
    let _ = std::fs::remove_file(&out);
    let opts = SimulateOptions::new(
        examples().join("noisy-weights.toml"),
        examples().join("noisy.jsonl"),
    )
    .with_chart(Some(out.clone()));
    simulate(&opts).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert_eq!(doc.root_element().attribute("height"), Some("1200"));
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect();
    for want in [
        "Provider permits per second by tenant (by start)",
        "permits/s",
        "llm:shared batch",
        "llm:shared chat",
        "llm:shared support",
    ] {
        assert!(
            texts.iter().any(|t| t == want),
            "no text {want:?} in {texts:?}"
        );
    }
    // The tenants' lines: one polyline per tenant beside the outcomes'.
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= 4 + 3, "{lines} polylines");
}
