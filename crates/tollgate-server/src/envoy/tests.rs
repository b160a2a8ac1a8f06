use std::path::Path;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::google::protobuf::Duration;
use serde::Deserialize;
use tollgate_core::{BucketSpec, Outcome};
use tollgate_testkit::id;

use super::response::duration;
use super::service::Verdict;
use super::*;

fn parse(text: &str) -> RlsConfig {
    #[derive(Deserialize)]
    struct File {
        rls: RlsConfig,
    }
    toml::from_str::<File>(text).expect("valid toml").rls
}

fn rules(text: &str) -> RlsRules {
    validate_rls(&parse(text)).expect("valid rules")
}

fn errors(text: &str) -> Vec<String> {
    validate_rls(&parse(text))
        .expect_err("invalid rules")
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

const EXAMPLE: &str = r#"
    [rls]
    domain = "agents"
    [[rls.descriptors]]
    key = "generic_key"
    value = "search"
    rate = { amount = 100, period_ms = 1000, burst = 200 }
    [[rls.descriptors]]
    key = "user_id"
    limit = "user_turns"
    [[rls.descriptors]]
    key = "user_id"
    with = { generic_key = "chat" }
    rate = { amount = 30, period_ms = 60000, burst = 10 }
    name = "chat per user"
    [[rls.descriptors]]
    key = "generic_key"
    rate = { amount = 5, period_ms = 1000 }
"#;

#[test]
fn defaults() {
    let r = validate_rls(&RlsConfig::default()).unwrap();
    assert_eq!(r, RlsRules::default());
    assert_eq!(r.domain(), "tollgate");
    assert!(r.rate_limit_headers() && !r.shadow() && r.rules().is_empty());
    assert!(r.find(&[("user_id", id("u1"))]).is_none());
}

#[test]
fn whole_descriptors_match_in_order() {
    let r = rules(EXAMPLE);
    let m = r.find(&[("user_id", id("u1"))]).unwrap();
    assert_eq!((m.rule.target(), m.value), (Target::UserTurns, id("u1")));
    assert_eq!(&**m.rule.name(), "user_id");
    assert!(m.bucket_key.is_none());

    // Entries in any order; the `with` value must be exact.
    let m = r
        .find(&[("user_id", id("u1")), ("generic_key", id("chat"))])
        .unwrap();
    assert_eq!(&**m.rule.name(), "chat per user");
    assert_eq!(
        m.bucket_key.as_deref(),
        Some("{rls:agents:generic_key=chat,user_id=u1}")
    );
    assert!(
        r.find(&[("user_id", id("u1")), ("generic_key", id("other"))])
            .is_none()
    );
    // A superset or a subset of a rule's entries is another descriptor.
    assert!(
        r.find(&[
            ("user_id", id("u1")),
            ("generic_key", id("chat")),
            ("x", id("y"))
        ])
        .is_none()
    );
    assert!(r.find(&[]).is_none());
    assert!(
        r.find(&[("user_id", id("u1")), ("user_id", id("u2"))])
            .is_none()
    );

    // Value-specific first, then the rule for every other value.
    let m = r.find(&[("generic_key", id("search"))]).unwrap();
    assert_eq!(&**m.rule.name(), "generic_key=search");
    assert_eq!(
        m.rule.target(),
        Target::Bucket(BucketSpec::new(100, 1_000, 200).unwrap())
    );
    let m = r.find(&[("generic_key", id("x:{y}"))]).unwrap();
    assert_eq!(&**m.rule.name(), "generic_key");
    assert_eq!(
        m.bucket_key.as_deref(),
        Some("{rls:agents:generic_key=x%3A%7By%7D}")
    );
    assert!(r.find(&[("remote_address", id("10.0.0.1"))]).is_none());
}

#[test]
fn escaping_keeps_descriptors_apart() {
    let r = rules(
        r#"
        [rls]
        [[rls.descriptors]]
        key = "a"
        rate = { amount = 1, period_ms = 1000 }
        [[rls.descriptors]]
        key = "a"
        with = { b = "1" }
        rate = { amount = 1, period_ms = 1000 }
    "#,
    );
    let one = r.find(&[("a", id("x,b=1"))]).unwrap().bucket_key.unwrap();
    let two = r
        .find(&[("a", id("x")), ("b", id("1"))])
        .unwrap()
        .bucket_key
        .unwrap();
    assert_ne!(one, two);
    assert_eq!(one, "{rls:tollgate:a=x%2Cb%3D1}");
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let e = errors(
        r#"
        [rls]
        domain = ""
        [[rls.descriptors]]
        key = ""
        limit = "user_turns"
        [[rls.descriptors]]
        key = "a"
        [[rls.descriptors]]
        key = "b"
        limit = "user_turns"
        rate = { amount = 1, period_ms = 1000 }
        [[rls.descriptors]]
        key = "c"
        value = ""
        with = { c = "x" }
        rate = { amount = 0, period_ms = -1, burst = 0 }
        [[rls.descriptors]]
        key = "d"
        rate = { amount = 1, period_ms = 9007199254740993 }
        name = 'say "hi"'
    "#,
    );
    let expected = [
        "rls.domain: must not be empty",
        "rls.descriptors[0].key: must not be empty",
        "rls.descriptors[1]: needs `limit = \"user_turns\"` or `rate = { amount, period_ms, burst }`",
        "rls.descriptors[2]: has both `limit` and `rate`; give one",
        "rls.descriptors[3].value: must not be empty",
        "rls.descriptors[3].with.c: names the rule's own key \"c\"; use `value` to match its value",
        "rls.descriptors[3].rate.amount: must be at least 1 (got 0)",
        "rls.descriptors[3].rate.period_ms: must be at least 1 (got -1)",
        "rls.descriptors[3].rate.burst: capacity must be at least 1 (got 0)",
        "rls.descriptors[4].rate: burst × period_ms (1 × 9007199254740993) and amount × period_ms must not exceed 2^53",
        "rls.descriptors[4].name: must not contain quotes, backslashes or control characters (it is sent in a header)",
    ];
    assert_eq!(e, expected);
}

#[test]
fn a_rule_behind_a_wider_one_is_an_error() {
    let e = errors(
        r#"
        [rls]
        [[rls.descriptors]]
        key = "generic_key"
        rate = { amount = 1, period_ms = 1000 }
        [[rls.descriptors]]
        key = "generic_key"
        value = "search"
        rate = { amount = 9, period_ms = 1000 }
    "#,
    );
    assert_eq!(
        e,
        [
            "rls.descriptors[1]: never matches: rls.descriptors[0] comes first and matches every descriptor this rule does"
        ]
    );
    // The other way round is the intended order; another `with` is
    // another shape.
    rules(
        r#"
        [rls]
        [[rls.descriptors]]
        key = "generic_key"
        value = "search"
        rate = { amount = 9, period_ms = 1000 }
        [[rls.descriptors]]
        key = "generic_key"
        rate = { amount = 1, period_ms = 1000 }
        [[rls.descriptors]]
        key = "generic_key"
        with = { tenant = "acme" }
        rate = { amount = 1, period_ms = 1000 }
    "#,
    );
}

#[test]
fn keys_are_checked_compared_and_never_shown() {
    const KEY: &str = "0123456789abcdef0123456789abcdef";
    let key = RlsKey::new(KEY).unwrap();
    assert!(key.matches(KEY.as_bytes()));
    assert!(!key.matches(b"0123456789abcdef0123456789abcdeF"));
    assert!(!key.matches(&KEY.as_bytes()[1..]));
    assert!(!key.matches(b""));
    assert_eq!(key, RlsKey::new(KEY).unwrap());
    assert_ne!(key, RlsKey::new(&KEY.repeat(2)).unwrap());
    assert_eq!(format!("{key:?}"), "RlsKey([redacted])");
    for bad in [
        &KEY[1..],
        "0123456789abcdef 0123456789abcdef",
        "0123456789abcdef\t0123456789abcdef",
        "é123456789abcdef0123456789abcdef",
    ] {
        assert!(RlsKey::new(bad).is_err(), "{bad:?}");
    }
    assert!(RlsKey::new(&"k".repeat(MAX_KEY_BYTES)).is_ok());
    assert!(RlsKey::new(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());

    let cfg = RlsConfig {
        key: Some(KEY.to_owned()),
        max_in_flight: Some(3),
        ..RlsConfig::default()
    };
    assert!(!format!("{cfg:?}").contains(KEY));
    let server = validate_rls_server(&cfg, Path::new(".")).unwrap();
    assert!(!format!("{server:?}").contains(KEY));
    assert_eq!(server.max_in_flight, 3);
    assert_eq!(
        validate_rls_server(&RlsConfig::default(), Path::new(".")).unwrap(),
        RlsServer::default()
    );
}

#[test]
fn unknown_fields_and_limits_are_rejected() {
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct File {
        rls: RlsConfig,
    }
    for text in [
        "[rls]\ndomian = \"x\"",
        "[rls]\n[[rls.descriptors]]\nkey = \"a\"\nlimit = \"user_tokens\"",
        "[rls]\n[[rls.descriptors]]\nkey = \"a\"\nlimt = \"user_turns\"",
    ] {
        assert!(toml::from_str::<File>(text).is_err(), "{text}");
    }
}

fn spec(amount: u64, period_ms: u64) -> BucketSpec {
    BucketSpec::new(amount, period_ms, amount).unwrap()
}

#[test]
fn rates_map_to_envoy_units() {
    assert_eq!(per_unit(&spec(20, 60_000)), (20, Unit::Minute));
    assert_eq!(per_unit(&spec(5, 1_000)), (5, Unit::Second));
    assert_eq!(per_unit(&spec(1_000, 86_400_000)), (1_000, Unit::Day));
    // Exact in a larger unit.
    assert_eq!(per_unit(&spec(10, 30_000)), (20, Unit::Minute));
    assert_eq!(per_unit(&spec(1, 2_000)), (30, Unit::Minute));
    assert_eq!(per_unit(&spec(5, 100)), (50, Unit::Second));
    assert_eq!(per_unit(&spec(60, 3_600_000)), (60, Unit::Hour));
    // Not exact anywhere: the nearest unit, rounded, at least 1.
    assert_eq!(per_unit(&spec(3, 7)), (429, Unit::Second));
    assert_eq!(per_unit(&spec(1, 7 * 86_400_000)), (1, Unit::Day));
    assert_eq!(per_unit(&spec(7, 7_000_000)), (4, Unit::Hour));
}

#[test]
fn durations_split_ms() {
    assert_eq!(
        duration(2_500),
        Duration {
            seconds: 2,
            nanos: 500_000_000
        }
    );
}

#[test]
fn shadow_outcomes() {
    let mut v = Verdict::unmatched();
    assert_eq!(v.outcome(false), Outcome::Allowed);
    assert_eq!(v.outcome(true), Outcome::Allowed);
    v.over = true;
    assert_eq!(v.outcome(false), Outcome::Denied);
    assert_eq!(v.outcome(true), Outcome::ShadowDenied);
    v.over = false;
    v.plan_shadow = true;
    assert_eq!(v.outcome(false), Outcome::ShadowDenied);
}
