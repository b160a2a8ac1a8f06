use super::*;

pub(crate) fn support() -> PlanConfig {
    PlanConfig {
        turns: RateConfig {
            amount: 20,
            period_ms: 60_000,
            burst: Some(5),
        },
        tokens: RateConfig {
            amount: 60_000,
            period_ms: 60_000,
            burst: Some(60_000),
        },
        max_wait_ms: 2_000,
        concurrent_runs: 2,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: None,
        estimate_tokens: Some(6_000),
        max_sessions: None,
        shadow: false,
        budgets: None,
    }
}

#[test]
fn resolves_assignment_override_and_default() {
    let mut cfg = PlansConfig {
        default_plan: Some("support".into()),
        ..Default::default()
    };
    cfg.plans.insert("support".into(), support());
    let mut big = support();
    big.concurrent_runs = 10;
    cfg.plans.insert("big".into(), big);
    cfg.users.insert("u1".into(), "big".into());
    cfg.overrides.insert(
        "u2".into(),
        PlanOverride {
            max_wait_ms: Some(6_000),
            ..Default::default()
        },
    );
    let book = cfg.validate().unwrap();
    assert_eq!(book.resolve("u1").unwrap().concurrent_runs, 10);
    let u2 = book.resolve("u2").unwrap();
    assert_eq!(u2.max_wait_ms, 6_000);
    assert_eq!(&*u2.name, "support+override");
    let anyone = book.resolve("zz").unwrap();
    assert_eq!(anyone.lease_ttl_ms, 120_000);
    assert_eq!(anyone.max_llm_calls, 500);
    assert_eq!(anyone.concurrency_retry_ms, 1_000);
    assert_eq!(anyone.estimate_tokens, 6_000);
}

#[test]
fn estimate_defaults_within_the_burst_and_may_not_exceed_it() {
    let mut small = support();
    small.estimate_tokens = None;
    small.tokens.burst = Some(500);
    let mut plain = support();
    plain.estimate_tokens = None;
    let mut cfg = PlansConfig::default();
    cfg.plans.insert("small".into(), small.clone());
    cfg.plans.insert("plain".into(), plain);
    let book = cfg.validate().unwrap();
    assert_eq!(book.plan("small").unwrap().estimate_tokens, 500);
    assert_eq!(book.plan("plain").unwrap().estimate_tokens, 1_000);

    small.estimate_tokens = Some(501);
    let mut cfg = PlansConfig::default();
    cfg.plans.insert("small".into(), small);
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.errors[0].path, "plans.small.estimate_tokens");
    assert!(
        err.to_string()
            .contains("must not exceed tokens.burst (500")
    );
}

#[test]
fn every_error_is_reported_with_its_path() {
    let mut bad = support();
    bad.turns.amount = 0;
    bad.tokens.burst = Some(0);
    bad.max_wait_ms = -1;
    bad.concurrent_runs = -3;
    bad.max_sessions = Some(100_001);
    let mut huge = support();
    huge.tokens = RateConfig {
        amount: 1,
        period_ms: 1 << 30,
        burst: Some(1 << 30),
    };
    let mut cfg = PlansConfig {
        default_plan: Some("nope".into()),
        ..Default::default()
    };
    cfg.plans.insert("bad".into(), bad);
    cfg.plans.insert("huge".into(), huge);
    cfg.users.insert("u1".into(), "missing".into());
    let err = cfg.validate().unwrap_err();
    let paths: Vec<&str> = err.errors.iter().map(|e| e.path.as_str()).collect();
    for p in [
        "plans.bad.turns.amount",
        "plans.bad.tokens.burst",
        "plans.bad.max_wait_ms",
        "plans.bad.concurrent_runs",
        "plans.bad.max_sessions",
        "plans.huge.tokens",
        "default_plan",
        "users.u1",
    ] {
        assert!(paths.contains(&p), "missing {p} in {paths:?}");
    }
    assert!(err.to_string().contains("must be at least 1 (got 0)"));
    assert!(
        err.to_string()
            .contains("must be at most 100000 (got 100001)")
    );
}

#[test]
fn deserializes_from_json_and_rejects_unknown_fields() {
    let json = r#"{"default_plan":"p","plans":{"p":{
        "turns":{"amount":20,"period_ms":60000,"burst":5},
        "tokens":{"amount":60000,"period_ms":60000},
        "concurrent_runs":2,"max_wait_ms":2000}}}"#;
    let cfg: PlansConfig = serde_json::from_str(json).unwrap();
    let book = cfg.validate().unwrap();
    assert_eq!(book.resolve("x").unwrap().tokens.capacity(), 60_000);
    let bad = json.replace("\"burst\":5", "\"brust\":5");
    assert!(serde_json::from_str::<PlansConfig>(&bad).is_err());
}
