//! Spend budgets in the server's config: `currency`,
//! `[prices]`, `[budgets]`, `[plans.<name>.budgets]` and
//! `[overrides.<user>.budgets]` parse and validate with field paths. No
//! Redis needed.

use std::path::Path;

use tollgate_core::budget::BudgetAmount;
use tollgate_server::config::{Config, ConfigError};

const BASE: &str = r#"listen = "127.0.0.1:0"
default_plan = "pro"
currency = "USD"

[identity]
mode = "dev"

[budgets]
time_zone = "Europe/Paris"

[prices."openai:gpt-4o"]
input = "2.50"
output = "10.00"
cached_input = "1.25"

[plans.pro]
turns = { amount = 20, period_ms = 60000, burst = 5 }
tokens = { amount = 60000, period_ms = 60000 }
concurrent_runs = 2
"#;

const BUDGET: &str = r#"
[plans.pro.budgets]
daily = { tokens = 2000000 }
monthly = { cost = "50.00" }
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "t.toml", Path::new("."))
}

/// Each error as `path: reason`.
fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

fn has(errors: &[String], want: &str) {
    assert!(
        errors.iter().any(|e| e.starts_with(want)),
        "{want}\nnot in {errors:#?}"
    );
}

#[test]
fn currency_prices_and_time_zone_alone_are_accepted_as_plan_data() {
    let cfg = parse(BASE).expect("valid");
    assert_eq!(cfg.plans.currency(), Some("USD"));
    assert_eq!(cfg.plans.budget_zone().name(), "Europe/Paris");
    let p = cfg.plans.prices().get("openai", "gpt-4o").unwrap();
    assert_eq!(
        (p.input, p.output, p.cached_input),
        (2_500_000, 10_000_000, 1_250_000)
    );
    assert!(cfg.plans.resolve("anyone").unwrap().budgets.is_none());
    // Without [budgets], windows are in UTC.
    let utc = parse(&BASE.replace("[budgets]\ntime_zone = \"Europe/Paris\"\n", "")).unwrap();
    assert_eq!(utc.plans.budget_zone().name(), "UTC");
}

#[test]
fn a_valid_budget_is_accepted_and_an_override_replaces_a_window() {
    let text = format!(
        "{BASE}{BUDGET}\n[users]\nbob = \"pro\"\n\n[overrides.bob.budgets]\nmonthly = {{ cost = \"80\" }}\n"
    );
    let cfg = parse(&text).expect("valid");
    let b = cfg
        .plans
        .resolve("anyone")
        .unwrap()
        .budgets
        .clone()
        .unwrap();
    assert_eq!(b.daily, Some(BudgetAmount::Tokens(2_000_000)));
    assert_eq!(b.monthly, Some(BudgetAmount::Cost(50_000_000)));
    let bob = cfg.plans.resolve("bob").unwrap().budgets.clone().unwrap();
    assert_eq!(
        bob.daily, b.daily,
        "a window the override does not set stays the plan's"
    );
    assert_eq!(bob.monthly, Some(BudgetAmount::Cost(80_000_000)));
}

#[test]
fn budget_problems_are_reported_with_their_paths() {
    let text = format!(
        "{}{}",
        BASE.replace("currency = \"USD\"", "currency = \"usd\"")
            .replace(
                "time_zone = \"Europe/Paris\"",
                "time_zone = \"Europe/Pariss\""
            )
            .replace("input = \"2.50\"", "input = \"-2.50\"")
            .replace("output = \"10.00\"", "output = \"10.0000001\""),
        BUDGET
            .replace("{ tokens = 2000000 }", "{ tokens = 0 }")
            .replace("\"50.00\"", "\"5e1\"")
    );
    let errs = errors(&text);
    for want in [
        "currency: must be an ISO 4217 code of three capital letters such as \"USD\" (got \"usd\")",
        "budgets.time_zone: unknown time zone \"Europe/Pariss\": an IANA name such as \"Europe/Paris\" or \"UTC\"",
        "prices.\"openai:gpt-4o\".input: must not be negative (got \"-2.50\")",
        "prices.\"openai:gpt-4o\".output: at most 6 decimal places, the micro-unit (got \"10.0000001\")",
        "plans.pro.budgets.daily.tokens: must be at least 1 (got 0)",
        "plans.pro.budgets.monthly.cost: must be a decimal string such as \"50.00\" or \"0.15\" (got \"5e1\")",
    ] {
        has(&errs, want);
    }
    // Both amounts, or neither; zero; no currency; nothing to price with.
    let both = format!(
        "{BASE}{}",
        BUDGET.replace("{ tokens = 2000000 }", "{ tokens = 5, cost = \"1\" }")
    );
    has(
        &errors(&both),
        "plans.pro.budgets.daily: must be exactly one of { tokens = N } or { cost = \"50.00\" }",
    );
    let zero = format!("{BASE}{}", BUDGET.replace("\"50.00\"", "\"0.000000\""));
    has(
        &errors(&zero),
        "plans.pro.budgets.monthly.cost: must be more than 0 (got \"0.000000\")",
    );
    let no_currency = format!("{}{BUDGET}", BASE.replace("currency = \"USD\"\n", ""));
    let errs = errors(&no_currency);
    has(
        &errs,
        "plans.pro.budgets.monthly.cost: a cost budget needs the top-level `currency`",
    );
    has(&errs, "currency: must be set when [prices] is");
    let unpriced = format!(
        "{}{BUDGET}",
        BASE.split("[prices.").next().unwrap().to_owned()
            + "[plans.pro]\nturns = { amount = 20, period_ms = 60000, burst = 5 }\n\
               tokens = { amount = 60000, period_ms = 60000 }\nconcurrent_runs = 2\n"
    );
    has(
        &errors(&unpriced),
        "plans.pro.budgets: a cost budget needs [prices] or a default_price",
    );
    let empty = format!("{BASE}\n[plans.pro.budgets]\non_exhausted = \"deny_turns\"\n");
    has(
        &errors(&empty),
        "plans.pro.budgets: sets no daily, weekly or monthly budget",
    );
    let bad_key = BASE.replace("[prices.\"openai:gpt-4o\"]", "[prices.gpt-4o]");
    has(
        &errors(&bad_key),
        "prices.gpt-4o: the key must be \"provider:model\"",
    );
}

#[test]
fn wrong_shapes_are_named_by_their_toml_path() {
    for (from, to, path, says) in [
        (
            "monthly = { cost = \"50.00\" }",
            "monthly = { cost = 50.0 }",
            "plans.pro.budgets.monthly.cost",
            "invalid type",
        ),
        (
            "monthly = { cost = \"50.00\" }",
            "yearly = { cost = \"50.00\" }",
            "plans.pro.budgets.yearly",
            "unknown field `yearly`",
        ),
        (
            "monthly = { cost = \"50.00\" }",
            "monthly = { cost = \"50.00\" }\non_exhausted = \"deny_all\"",
            "plans.pro.budgets.on_exhausted",
            "unknown variant `deny_all`, expected `deny_model_calls` or `deny_turns`",
        ),
        (
            "monthly = { cost = \"50.00\" }",
            "monthly = { cost = \"50.00\" }\non_outage = \"maybe\"",
            "plans.pro.budgets.on_outage",
            "unknown variant `maybe`, expected `fail_closed` or `fallback`",
        ),
        (
            "monthly = { cost = \"50.00\" }",
            "monthly = { cost = \"50.00\", currency = \"EUR\" }",
            "plans.pro.budgets.monthly.currency",
            "unknown field `currency`",
        ),
        (
            "time_zone = \"Europe/Paris\"",
            "timezone = \"Europe/Paris\"",
            "budgets.timezone",
            "unknown field `timezone`",
        ),
        (
            "cached_input = \"1.25\"",
            "cached = \"1.25\"",
            "prices.\"openai:gpt-4o\".cached",
            "unknown field `cached`",
        ),
        (
            "input = \"2.50\"",
            "input = 2.5",
            "prices.\"openai:gpt-4o\".input",
            "invalid type",
        ),
    ] {
        let text = format!("{BASE}{BUDGET}").replace(from, to);
        let e = parse(&text).unwrap_err();
        assert_eq!(e.errors.len(), 1, "{e}");
        assert_eq!(e.errors[0].path, path, "{e}");
        assert!(e.errors[0].reason.contains(says), "{says} not in {e}");
    }
}

/// The full example of docs/config.md's budget section is valid.
#[test]
fn the_docs_budget_example_is_valid() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md"))
            .unwrap();
    let start = doc
        .find("```toml\n# Spend budgets: the config of SPEC §7's example 5.")
        .expect("the example in docs/config.md")
        + "```toml\n".len();
    let text = &doc[start..start + doc[start..].find("```").unwrap()];
    let cfg = parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.plans.resolve("bob").unwrap().budgets.is_some());
}

#[test]
fn alert_thresholds_are_validated_with_their_path() {
    let with = |a: &str| {
        BASE.replace(
            "time_zone = \"Europe/Paris\"",
            &format!("time_zone = \"Europe/Paris\"\nalert_percent = {a}"),
        )
    };
    assert_eq!(
        parse(&with("[50, 90, 100]")).unwrap().plans.budget_alerts(),
        [50, 90, 100]
    );
    assert_eq!(
        parse(&with("[]")).unwrap().plans.budget_alerts(),
        [] as [u8; 0]
    );
    assert_eq!(
        parse(BASE).unwrap().plans.budget_alerts(),
        [80, 100],
        "the default"
    );
    for (a, says) in [
        (
            "[100, 80]",
            "budgets.alert_percent: must be ascending without repeats (got [100, 80])",
        ),
        (
            "[0, 50]",
            "budgets.alert_percent: each must be 1 to 100 (got 0)",
        ),
        (
            "[50, 101]",
            "budgets.alert_percent: each must be 1 to 100 (got 101)",
        ),
        (
            "[1, 2, 3, 4, 5, 6, 7, 8, 9]",
            "budgets.alert_percent: at most 8 thresholds (got 9)",
        ),
    ] {
        has(&errors(&with(a)), says);
    }
    has(&errors(&with("[300]")), "budgets.alert_percent");
}
