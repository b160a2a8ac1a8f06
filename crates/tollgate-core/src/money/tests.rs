use super::*;

fn price(input: &str, output: &str, cached: Option<&str>) -> Price {
    let mut errors = Vec::new();
    let p = PriceConfig {
        input: input.into(),
        output: output.into(),
        cached_input: cached.map(Into::into),
    }
    .validate("p", &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    p.unwrap()
}

#[test]
fn decimal_strings_parse_to_exact_micro_units() {
    for (text, micros) in [
        ("0", 0),
        ("0.15", 150_000),
        ("50", 50_000_000),
        ("50.00", 50_000_000),
        ("0.000001", 1),
        ("2.5", 2_500_000),
        ("007.10", 7_100_000),
        ("18446744073709.551615", u64::MAX),
    ] {
        assert_eq!(parse_micros(text), Ok(micros), "{text}");
    }
    for (text, want) in [
        ("-1", MoneyError::Negative("-1".into())),
        ("-0.15", MoneyError::Negative("-0.15".into())),
        ("0.1234567", MoneyError::TooManyDecimals("0.1234567".into())),
        (
            "18446744073709.551616",
            MoneyError::TooLarge("18446744073709.551616".into()),
        ),
        (
            "99999999999999999999",
            MoneyError::TooLarge("99999999999999999999".into()),
        ),
    ] {
        assert_eq!(parse_micros(text), Err(want), "{text}");
    }
    for text in [
        "", ".", "1.", ".5", "+1", "1e3", "1,5", " 1", "1_000", "0x10", "1.2.3", "NaN", "١",
    ] {
        assert_eq!(
            parse_micros(text),
            Err(MoneyError::Malformed(text.into())),
            "{text:?}"
        );
    }
}

#[test]
fn micro_units_format_back_to_decimals() {
    for (micros, text) in [
        (0, "0.00"),
        (1, "0.000001"),
        (150_000, "0.15"),
        (50_000_000, "50.00"),
        (2_500_000, "2.50"),
        (1_234_567, "1.234567"),
        (u64::MAX, "18446744073709.551615"),
    ] {
        assert_eq!(format_micros(micros), text);
        assert_eq!(parse_micros(text), Ok(micros));
    }
}

#[test]
fn a_cost_is_rounded_up_to_the_micro_unit_once() {
    // gpt-4o-mini-like: 0.15 in, 0.60 out, 0.075 cached per million.
    let p = price("0.15", "0.60", Some("0.075"));
    assert_eq!(p.cost(TokenSplit::default()), Ok(0));
    assert_eq!(p.cost(TokenSplit::new(1_000_000, 0, 0)), Ok(150_000));
    assert_eq!(p.cost(TokenSplit::new(0, 1_000_000, 0)), Ok(600_000));
    assert_eq!(p.cost(TokenSplit::new(0, 0, 1_000_000)), Ok(75_000));
    // 1 token in: 0.15 micro-units → 1.
    assert_eq!(p.cost(TokenSplit::new(1, 0, 0)), Ok(1));
    // 7 in + 3 out + 5 cached: (7 × 150,000 + 3 × 600,000 + 5 × 75,000) /
    // 1,000,000 = 3.225 → 4 (rounded once over the call, not 2 + 2 + 1).
    assert_eq!(p.cost(TokenSplit::new(7, 3, 5)), Ok(4));
    // Exact multiples are not rounded: 20 in at 0.15 is 3 micro-units.
    assert_eq!(p.cost(TokenSplit::new(20, 0, 0)), Ok(3));
    assert_eq!(p.cost(TokenSplit::new(21, 0, 0)), Ok(4));
    // A realistic call: 12,345 in, 678 out, 4,096 cached =
    // 1,851,750,000 + 406,800,000 + 307,200,000 = 2,565,750,000 / 1e6
    // = 2,565.75 → 2,566 micro-units (0.002566 USD).
    assert_eq!(p.cost(TokenSplit::new(12_345, 678, 4_096)), Ok(2_566));
    // A free model costs nothing.
    let free = price("0", "0", None);
    assert_eq!(
        free.cost(TokenSplit::new(u64::MAX, u64::MAX, u64::MAX)),
        Ok(0)
    );
}

#[test]
fn unsplit_amounts_are_priced_at_the_higher_price() {
    let p = price("3.00", "15.00", None);
    assert_eq!(p.cached_input, 3_000_000, "cached defaults to input");
    assert_eq!(p.cost_unsplit(1_000), Ok(15_000));
    assert_eq!(p.cost_unsplit(1), Ok(15));
    assert_eq!(p.cost_unsplit(0), Ok(0));
    // Input dearer than output (it happens): input wins.
    let q = price("2.00", "0.50", None);
    assert_eq!(q.cost_unsplit(3), Ok(6));
    // 0.000001 per million: 1 token costs 10^-12, rounded up to 1.
    let tiny = price("0.000001", "0.000001", None);
    assert_eq!(tiny.cost_unsplit(1), Ok(1));
    assert_eq!(tiny.cost_unsplit(1_000_000), Ok(1));
    assert_eq!(tiny.cost_unsplit(1_000_001), Ok(2));
}

#[test]
fn costs_past_64_bits_are_errors_not_wraps() {
    let p = price("1000000", "1000000", None);
    // u64::MAX tokens at 10^12 micro-units per million = 1.8 × 10^25.
    assert_eq!(p.cost_unsplit(u64::MAX), Err(CostOverflow));
    assert_eq!(
        p.cost(TokenSplit::new(u64::MAX, u64::MAX, u64::MAX)),
        Err(CostOverflow)
    );
    // The largest that fits: u64::MAX micro-units exactly.
    let one = price("1", "1", None);
    assert_eq!(one.cost_unsplit(u64::MAX), Ok(u64::MAX));
    // Three u64::MAX × u64::MAX products overflow u128: still an error.
    let max = Price {
        input: u64::MAX,
        output: u64::MAX,
        cached_input: u64::MAX,
    };
    assert_eq!(
        max.cost(TokenSplit::new(u64::MAX, u64::MAX, u64::MAX)),
        Err(CostOverflow)
    );
}

#[test]
fn prices_are_validated_with_field_paths() {
    let mut cfg = PricesConfig::new();
    let ok = PriceConfig {
        input: "2.50".into(),
        output: "10.00".into(),
        cached_input: Some("1.25".into()),
    };
    cfg.insert("openai:gpt-4o".into(), ok.clone());
    cfg.insert(
        "openai:bad".into(),
        PriceConfig {
            input: "-1".into(),
            output: "0.1234567".into(),
            cached_input: Some("one".into()),
        },
    );
    cfg.insert("gpt-4o".into(), ok.clone());
    cfg.insert(":gpt-4o".into(), ok.clone());
    cfg.insert("a:b:c".into(), ok);
    let mut errors = Vec::new();
    let book = validate_prices(&cfg, &mut errors);
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    for want in [
        r#"prices."openai:bad".input: must not be negative (got "-1")"#,
        r#"prices."openai:bad".output: at most 6 decimal places, the micro-unit (got "0.1234567")"#,
        r#"prices."openai:bad".cached_input: must be a decimal string such as "50.00" or "0.15" (got "one")"#,
        r#"prices.gpt-4o: the key must be "provider:model""#,
        r#"prices.":gpt-4o": provider and model must be non-empty"#,
        r#"prices."a:b:c": provider and model must be non-empty"#,
    ] {
        assert!(
            text.iter().any(|t| t.starts_with(want)),
            "{want}\nnot in {text:#?}"
        );
    }
    assert_eq!(errors.len(), 6, "{text:#?}");
    let p = book.get("openai", "gpt-4o").unwrap();
    assert_eq!(
        *p,
        Price {
            input: 2_500_000,
            output: 10_000_000,
            cached_input: 1_250_000
        }
    );
    assert!(book.get("openai", "bad").is_none());
    assert!(book.get("openai", "gpt-4o-mini").is_none());
}

#[test]
fn currencies_are_iso_4217_codes() {
    assert!(validate_currency("USD").is_ok());
    assert!(validate_currency("EUR").is_ok());
    for bad in ["usd", "US", "USDT", "$", "", "U5D"] {
        assert!(validate_currency(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_docs_worked_costs_hold() {
    // docs/config.md: gpt-4o at 2.50 / 10.00, 1,234 in and 567 out.
    let p = price("2.50", "10.00", Some("1.25"));
    assert_eq!(p.cost(TokenSplit::new(1_234, 567, 0)), Ok(8_755));
    assert_eq!(format_micros(8_755), "0.008755");
    assert_eq!(p.cost_unsplit(1_234 + 567), Ok(18_010));
}
