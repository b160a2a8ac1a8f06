use crate::calendar::Period;
use crate::plan::tests::support;
use crate::plan::{PlanOverride, PlansConfig};

use super::*;

fn tokens(n: i64) -> Option<BudgetAmountConfig> {
    Some(BudgetAmountConfig {
        tokens: Some(n),
        cost: None,
    })
}

fn cost(text: &str) -> Option<BudgetAmountConfig> {
    Some(BudgetAmountConfig {
        tokens: None,
        cost: Some(text.into()),
    })
}

fn price(input: &str, output: &str) -> PriceConfig {
    PriceConfig {
        input: input.into(),
        output: output.into(),
        cached_input: None,
    }
}

/// The issue's example: $50 a month and 2,000,000 tokens a day, in Paris,
/// with one priced model; bob's override raises the month to $80.
fn example() -> PlansConfig {
    let mut pro = support();
    pro.budgets = Some(BudgetsConfig {
        daily: tokens(2_000_000),
        monthly: cost("50.00"),
        ..Default::default()
    });
    let mut cfg = PlansConfig {
        default_plan: Some("pro".into()),
        currency: Some("USD".into()),
        budgets: BudgetSettingsConfig {
            time_zone: Some("Europe/Paris".into()),
            alert_percent: None,
        },
        ..Default::default()
    };
    cfg.plans.insert("pro".into(), pro);
    cfg.plans.insert("free".into(), support());
    cfg.prices
        .insert("openai:gpt-4o".into(), price("2.50", "10.00"));
    cfg.overrides.insert(
        "bob".into(),
        PlanOverride {
            budgets: Some(BudgetsConfig {
                monthly: cost("80"),
                on_exhausted: Some(OnExhausted::DenyTurns),
                default_price: Some(price("3", "15")),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    cfg.users.insert("carol".into(), "free".into());
    cfg
}

#[test]
fn budgets_validate_into_the_plan_and_overrides_merge_per_field() {
    let book = example().validate().unwrap();
    assert_eq!(book.currency(), Some("USD"));
    assert_eq!(book.budget_zone().name(), "Europe/Paris");
    let pro = book.resolve("anyone").unwrap().budgets.clone().unwrap();
    assert_eq!(pro.daily, Some(BudgetAmount::Tokens(2_000_000)));
    assert_eq!(pro.weekly, None);
    assert_eq!(pro.monthly, Some(BudgetAmount::Cost(50_000_000)));
    assert_eq!(pro.on_exhausted, OnExhausted::DenyModelCalls);
    assert!(pro.has_cost());
    assert_eq!(
        pro.iter().collect::<Vec<_>>(),
        [
            (Period::Daily, BudgetAmount::Tokens(2_000_000)),
            (Period::Monthly, BudgetAmount::Cost(50_000_000)),
        ]
    );
    // bob keeps the plan's daily tokens and gets his own month, policy and
    // default price.
    let bob = book.resolve("bob").unwrap();
    assert_eq!(&*bob.name, "pro+override");
    let b = bob.budgets.clone().unwrap();
    assert_eq!(b.daily, Some(BudgetAmount::Tokens(2_000_000)));
    assert_eq!(b.monthly, Some(BudgetAmount::Cost(80_000_000)));
    assert_eq!(b.on_exhausted, OnExhausted::DenyTurns);
    // Prices: the model's own, else the plan's default, else none.
    let prices = book.prices();
    assert_eq!(
        b.price(prices, "openai", "gpt-4o").unwrap().output,
        10_000_000
    );
    assert_eq!(b.price(prices, "openai", "o3").unwrap().output, 15_000_000);
    assert!(pro.price(prices, "openai", "o3").is_none());
    // A plan without budgets has none.
    assert!(book.resolve("carol").unwrap().budgets.is_none());
}

#[test]
fn without_a_zone_windows_are_in_utc() {
    let mut cfg = example();
    cfg.budgets.time_zone = None;
    let book = cfg.validate().unwrap();
    assert_eq!(book.budget_zone().name(), "UTC");
    assert_eq!(
        PlansConfig::default()
            .validate()
            .unwrap()
            .budget_zone()
            .name(),
        "UTC"
    );
}

#[test]
fn every_budget_problem_is_reported_with_its_path() {
    let mut cfg = example();
    cfg.currency = Some("usd".into());
    cfg.budgets.time_zone = Some("Mars/Olympus_Mons".into());
    cfg.prices.insert("openai".into(), price("1", "1"));
    let pro = cfg.plans.get_mut("pro").unwrap();
    pro.budgets = Some(BudgetsConfig {
        daily: Some(BudgetAmountConfig {
            tokens: Some(5),
            cost: Some("1".into()),
        }),
        weekly: Some(BudgetAmountConfig {
            tokens: None,
            cost: None,
        }),
        monthly: tokens(0),
        on_exhausted: None,
        on_outage: None,
        default_price: Some(price("-3", "1.0000001")),
    });
    let free = cfg.plans.get_mut("free").unwrap();
    free.budgets = Some(BudgetsConfig {
        daily: cost("0"),
        weekly: cost("-5"),
        monthly: cost("12.3456789"),
        ..Default::default()
    });
    cfg.overrides.get_mut("bob").unwrap().budgets = Some(BudgetsConfig {
        weekly: tokens(-1),
        ..Default::default()
    });
    cfg.overrides.insert(
        "dave".into(),
        PlanOverride {
            budgets: Some(BudgetsConfig::default()),
            ..Default::default()
        },
    );
    cfg.users.insert("dave".into(), "free".into());
    let err = cfg.validate().unwrap_err();
    let text: Vec<String> = err.errors.iter().map(ToString::to_string).collect();
    for want in [
        "currency: must be an ISO 4217 code of three capital letters such as \"USD\" (got \"usd\")",
        "budgets.time_zone: unknown time zone \"Mars/Olympus_Mons\"",
        "prices.openai: the key must be \"provider:model\"",
        "plans.pro.budgets.daily: must be exactly one of { tokens = N } or { cost = \"50.00\" }",
        "plans.pro.budgets.weekly: must be exactly one of",
        "plans.pro.budgets.monthly.tokens: must be at least 1 (got 0)",
        "plans.pro.budgets.default_price.input: must not be negative (got \"-3\")",
        "plans.pro.budgets.default_price.output: at most 6 decimal places",
        "plans.free.budgets.daily.cost: must be more than 0 (got \"0\")",
        "plans.free.budgets.weekly.cost: must not be negative (got \"-5\")",
        "plans.free.budgets.monthly.cost: at most 6 decimal places",
        "overrides.bob.budgets.weekly.tokens: must be at least 1 (got -1)",
        // dave's empty override inherits nothing: free has no valid window
        // either way, but his own table is named.
        "overrides.dave.budgets.daily.cost: must be more than 0",
    ] {
        assert!(
            text.iter().any(|t| t.starts_with(want)),
            "{want}\nnot in {text:#?}"
        );
    }
}

#[test]
fn cost_budgets_need_a_currency_and_a_way_to_price_calls() {
    // No currency: the cost budget and the prices both say so.
    let mut cfg = example();
    cfg.currency = None;
    let text = cfg.validate().unwrap_err().to_string();
    assert!(
        text.contains(
            "plans.pro.budgets.monthly.cost: a cost budget needs the top-level `currency`"
        ),
        "{text}"
    );
    assert!(
        text.contains("currency: must be set when [prices] is"),
        "{text}"
    );
    // No prices and no default price: nothing could ever be charged.
    let mut cfg = example();
    cfg.prices.clear();
    cfg.overrides.clear();
    let text = cfg.validate().unwrap_err().to_string();
    assert!(
        text.contains("plans.pro.budgets: a cost budget needs [prices] or a default_price"),
        "{text}"
    );
    // A default price is enough; a token-only budget needs neither.
    let mut with_default = cfg.clone();
    with_default
        .plans
        .get_mut("pro")
        .unwrap()
        .budgets
        .as_mut()
        .unwrap()
        .default_price = Some(price("1", "2"));
    assert!(with_default.validate().is_ok());
    let mut tokens_only = cfg;
    tokens_only.currency = None;
    tokens_only
        .plans
        .get_mut("pro")
        .unwrap()
        .budgets
        .as_mut()
        .unwrap()
        .monthly = tokens(9);
    assert!(tokens_only.validate().is_ok());
}

#[test]
fn a_budgets_table_must_set_a_window() {
    let mut cfg = example();
    cfg.plans.get_mut("free").unwrap().budgets = Some(BudgetsConfig {
        on_exhausted: Some(OnExhausted::DenyTurns),
        ..Default::default()
    });
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.errors.len(), 1, "{err}");
    assert_eq!(err.errors[0].path, "plans.free.budgets");
    assert_eq!(
        err.errors[0].reason,
        "sets no daily, weekly or monthly budget"
    );
    // An override of a budgeted plan may set only the policy.
    let mut cfg = example();
    cfg.overrides.get_mut("bob").unwrap().budgets = Some(BudgetsConfig {
        on_exhausted: Some(OnExhausted::DenyTurns),
        ..Default::default()
    });
    let book = cfg.validate().unwrap();
    let bob = book.resolve("bob").unwrap().budgets.clone().unwrap();
    assert_eq!(bob.on_exhausted, OnExhausted::DenyTurns);
    assert_eq!(bob.monthly, Some(BudgetAmount::Cost(50_000_000)));
}

#[test]
fn budgets_deserialize_and_refuse_unknown_fields() {
    let json = r#"{"currency":"EUR","budgets":{"time_zone":"Europe/Paris"},
        "prices":{"mistral:large":{"input":"2","output":"6","cached_input":"0.2"}},
        "plans":{"p":{
        "turns":{"amount":20,"period_ms":60000},
        "tokens":{"amount":60000,"period_ms":60000},
        "concurrent_runs":2,
        "budgets":{"weekly":{"cost":"10.5"},"on_exhausted":"deny_turns"}}}}"#;
    let cfg: PlansConfig = serde_json::from_str(json).unwrap();
    let book = cfg.validate().unwrap();
    let b = book.plan("p").unwrap().budgets.clone().unwrap();
    assert_eq!(b.weekly, Some(BudgetAmount::Cost(10_500_000)));
    assert_eq!(b.on_exhausted, OnExhausted::DenyTurns);
    assert_eq!(
        book.prices().get("mistral", "large").unwrap().cached_input,
        200_000
    );
    for bad in [
        json.replace("deny_turns", "deny_everything"),
        json.replace("\"weekly\"", "\"yearly\""),
        json.replace("\"cost\":\"10.5\"", "\"cost\":10.5"),
        json.replace("\"time_zone\"", "\"timezone\""),
        json.replace("\"cached_input\"", "\"cached\""),
    ] {
        assert!(serde_json::from_str::<PlansConfig>(&bad).is_err(), "{bad}");
    }
}
