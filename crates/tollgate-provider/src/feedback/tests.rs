//! Classification of provider answers: kinds, classes, the status rules and
//! each provider's rules.

use super::gemini::parse_proto_duration_ms;
use super::*;

// 2024-05-01T12:00:00Z
const NOW: u64 = 1_714_564_800_000;

#[test]
fn provider_kind_names_round_trip() {
    for kind in ProviderKind::ALL {
        assert_eq!(kind.as_str().parse::<ProviderKind>(), Ok(kind));
        assert_eq!(kind.to_string(), kind.as_str());
    }
    assert_eq!(" OpenAI ".parse::<ProviderKind>(), Ok(ProviderKind::OpenAi));
    let err = "azure".parse::<ProviderKind>().unwrap_err();
    assert_eq!(err.name(), "azure");
    assert!(err.to_string().contains("azure"), "{err}");
    let json = serde_json::to_string(&ProviderKind::OpenAi).unwrap();
    assert_eq!(json, r#""openai""#);
    assert_eq!(
        serde_json::from_str::<ProviderKind>(r#""gemini""#).unwrap(),
        ProviderKind::Gemini
    );
}

#[test]
fn class_names_are_stable() {
    let all = [
        (
            Feedback::Success {
                limits: RateLimitHeaders::default(),
            },
            "success",
        ),
        (
            Feedback::Throttled {
                retry_after_ms: Some(5),
                scope: ThrottleScope::Tokens,
            },
            "throttled",
        ),
        (
            Feedback::Exhausted {
                reason: "x".into(),
                retry_after_ms: None,
            },
            "exhausted",
        ),
        (
            Feedback::ServerError {
                retry_after_ms: Some(7),
            },
            "server_error",
        ),
        (Feedback::ClientError, "client_error"),
    ];
    for (fb, class) in &all {
        assert_eq!(fb.class(), *class);
    }
    assert_eq!(all[1].0.retry_after_ms(), Some(5));
    assert_eq!(all[3].0.retry_after_ms(), Some(7));
    assert_eq!(all[0].0.retry_after_ms(), None);
    assert!(all[1].0.is_retryable() && all[3].0.is_retryable());
    assert!(!all[2].0.is_retryable() && !all[4].0.is_retryable());
    assert!(all[0].0.limits().is_some() && all[1].0.limits().is_none());
    assert_eq!(ThrottleScope::InputTokens.to_string(), "input_tokens");
    assert!(ThrottleScope::OutputTokens.is_tokens() && !ThrottleScope::Requests.is_tokens());
}

#[test]
fn header_names_are_case_insensitive() {
    let headers = [
        ("RETRY-AFTER", " 7 "),
        ("X-RateLimit-Remaining-Requests", "0"),
        ("x-ratelimit-reset-REQUESTS", "1s"),
    ];
    let fb = classify(ProviderKind::OpenAi, 429, &headers, None, NOW);
    assert_eq!(
        fb,
        Feedback::Throttled {
            retry_after_ms: Some(7_000),
            scope: ThrottleScope::Requests
        }
    );
    let limits = parse_rate_limit_headers(ProviderKind::OpenAi, &headers, NOW);
    assert_eq!(limits.requests.remaining, Some(0));
    assert_eq!(limits.requests.reset_after_ms, Some(1_000));
    assert!(limits.tokens.is_empty());
    // retry-after-ms wins over retry-after.
    let headers = [("Retry-After-Ms", "1234.5"), ("Retry-After", "9")];
    assert_eq!(
        classify(ProviderKind::Generic, 429, &headers, None, NOW).retry_after_ms(),
        Some(1_235)
    );
}

#[test]
fn status_rules_for_every_kind() {
    for kind in ProviderKind::ALL {
        let c = |status: u16| classify(kind, status, &[], None, NOW);
        assert_eq!(c(200).class(), "success", "{kind}");
        assert_eq!(c(204).class(), "success", "{kind}");
        assert_eq!(
            c(429),
            Feedback::Throttled {
                retry_after_ms: None,
                scope: ThrottleScope::Unknown
            },
            "{kind}"
        );
        for s in [408, 500, 502, 503, 504, 529, 599] {
            assert_eq!(
                c(s),
                Feedback::ServerError {
                    retry_after_ms: None
                },
                "{kind} {s}"
            );
        }
        for s in [
            0,
            100,
            301,
            400,
            401,
            403,
            404,
            409,
            413,
            422,
            600,
            u16::MAX,
        ] {
            assert_eq!(c(s), Feedback::ClientError, "{kind} {s}");
        }
        assert_eq!(c(402).class(), "exhausted", "{kind}");
    }
}

#[test]
fn unknown_or_hostile_bodies_fall_back_to_status() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let huge = format!(
        r#"{{"error":{{"type":"insufficient_quota","message":"{}"}}}}"#,
        "x".repeat(MAX_BODY_BYTES)
    );
    let bodies = [
        "",
        "not json",
        "<html>429 Too Many Requests</html>",
        "{",
        r#"{"error": "rate limited"}"#,
        r#"{"error": {"type": 42}}"#,
        r#"{"error": {"type": "insufficient_quota"} trailing"#,
        r#"["#,
        r#"[]"#,
        r#""\ud800""#,
        "\u{0}\u{ffff}",
        &deep,
        &huge,
    ];
    for kind in ProviderKind::ALL {
        for body in bodies {
            assert_eq!(
                classify(kind, 429, &[("retry-after", "3")], Some(body), NOW),
                Feedback::Throttled {
                    retry_after_ms: Some(3_000),
                    scope: ThrottleScope::Unknown
                },
                "{kind} {:?}",
                body.get(..40)
            );
            assert_eq!(
                classify(kind, 400, &[], Some(body), NOW),
                Feedback::ClientError
            );
        }
    }
}

#[test]
fn proto_durations() {
    let d = |s: &str| parse_proto_duration_ms(&serde_json::from_str(s).unwrap());
    assert_eq!(d(r#""37s""#), Some(37_000));
    assert_eq!(d(r#""1.5s""#), Some(1_500));
    assert_eq!(d(r#""0.250s""#), Some(250));
    assert_eq!(d(r#""0.000000001s""#), Some(1));
    assert_eq!(d(r#"{"seconds": 2, "nanos": 500000000}"#), Some(2_500));
    assert_eq!(d(r#"{"seconds": "3"}"#), Some(3_000));
    for bad in [
        r#""37""#,
        r#""-1s""#,
        r#""s""#,
        r#""1m""#,
        "37",
        "{}",
        r#"{"seconds": -1}"#,
        "null",
    ] {
        assert_eq!(d(bad), None, "{bad}");
    }
}

#[test]
fn reasons_are_cut_on_char_boundaries() {
    assert_eq!(reason("x", "  "), "x");
    assert_eq!(reason("x", "hello"), "x: hello");
    let long = "é".repeat(300);
    let r = reason("cause", &long);
    assert_eq!(r.chars().count(), "cause: ".len() + MAX_REASON_CHARS + 1);
    assert!(r.ends_with('…'));
}

#[test]
fn openai_scope_from_remaining_headers_and_message_hint() {
    // No body: the exhausted window names the scope, its reset is the hint.
    let headers = [
        ("x-ratelimit-remaining-requests", "12"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-requests", "120ms"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ];
    assert_eq!(
        classify(ProviderKind::OpenAi, 429, &headers, None, NOW),
        Feedback::Throttled {
            retry_after_ms: Some(360_000),
            scope: ThrottleScope::Tokens
        }
    );
    // Nothing but the message's "try again in".
    let body = r#"{"error":{"message":"Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000, Used 29000, Requested 1500. Please try again in 2.004s. Visit https://platform.openai.com/account/rate-limits.","type":"","code":"rate_limit_exceeded"}}"#;
    assert_eq!(
        classify(ProviderKind::OpenAi, 429, &[], Some(body), NOW),
        Feedback::Throttled {
            retry_after_ms: Some(2_004),
            scope: ThrottleScope::Tokens
        }
    );
    // Unknown scope: the larger reset.
    let headers = [
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-tokens", "250ms"),
    ];
    assert_eq!(
        classify(ProviderKind::OpenAi, 429, &headers, None, NOW).retry_after_ms(),
        Some(1_000)
    );
}

#[test]
fn anthropic_ties_and_fallbacks() {
    // Two exhausted windows: the one that resets last.
    let headers = [
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2024-05-01T12:00:05Z"),
        ("anthropic-ratelimit-output-tokens-remaining", "0"),
        (
            "anthropic-ratelimit-output-tokens-reset",
            "2024-05-01T12:00:20Z",
        ),
    ];
    assert_eq!(
        classify(ProviderKind::Anthropic, 429, &headers, None, NOW),
        Feedback::Throttled {
            retry_after_ms: Some(20_000),
            scope: ThrottleScope::OutputTokens
        }
    );
    // A reset in the past is no wait.
    let headers = [
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2024-05-01T11:59:00Z"),
    ];
    assert_eq!(
        classify(ProviderKind::Anthropic, 429, &headers, None, NOW).retry_after_ms(),
        Some(0)
    );
    // No headers: the message names the scope.
    let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 8,000 output tokens per minute."}}"#;
    assert_eq!(
        classify(ProviderKind::Anthropic, 429, &[], Some(body), NOW),
        Feedback::Throttled {
            retry_after_ms: None,
            scope: ThrottleScope::OutputTokens
        }
    );
    // A 500 api_error with a hint.
    let body = r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
    assert_eq!(
        classify(
            ProviderKind::Anthropic,
            500,
            &[("retry-after", "4")],
            Some(body),
            NOW
        ),
        Feedback::ServerError {
            retry_after_ms: Some(4_000)
        }
    );
}

#[test]
fn exhausted_hints_come_from_the_retry_headers_only() {
    // OpenAI's per-day limit says "try again in 8.64s": when one more
    // request would fit the day, not when the quota is back. Not read.
    let rpd = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini on requests per day (RPD): Limit 10000, Used 10000, Requested 1. Please try again in 8.64s.","type":"requests","code":"rate_limit_exceeded"}}"#;
    let fb = classify(ProviderKind::OpenAi, 429, &[], Some(rpd), NOW);
    assert_eq!((fb.class(), fb.retry_after_ms()), ("exhausted", None));
    // A Retry-After header is.
    let headers = [("retry-after", "3600")];
    let fb = classify(ProviderKind::OpenAi, 429, &headers, Some(rpd), NOW);
    assert_eq!(fb.retry_after_ms(), Some(3_600_000));
    assert!(!fb.is_retryable(), "an exhaustion is never retried");
    // Gemini's RetryInfo beside a per-day violation is not read either.
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}]}}"#;
    let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
    assert_eq!((fb.class(), fb.retry_after_ms()), ("exhausted", None));
    let fb = classify(
        ProviderKind::Gemini,
        429,
        &[("retry-after-ms", "1500")],
        Some(body),
        NOW,
    );
    assert_eq!(fb.retry_after_ms(), Some(1_500));
    // Every kind: a 402 with a hint.
    let fb = classify(
        ProviderKind::Generic,
        402,
        &[("Retry-After", "999999999")],
        None,
        NOW,
    );
    assert_eq!(
        fb,
        Feedback::Exhausted {
            reason: "payment_required".into(),
            retry_after_ms: Some(999_999_999_000)
        }
    );
}

#[test]
fn hints_are_cut_to_a_maximum() {
    let throttled = |h| Feedback::Throttled {
        retry_after_ms: h,
        scope: ThrottleScope::Requests,
    };
    assert_eq!(
        throttled(Some(999_999_999_000)).with_hint_at_most(300_000),
        throttled(Some(300_000))
    );
    assert_eq!(
        throttled(Some(2_000)).with_hint_at_most(300_000),
        throttled(Some(2_000))
    );
    assert_eq!(throttled(None).with_hint_at_most(1), throttled(None));
    let exhausted = Feedback::Exhausted {
        reason: "r".into(),
        retry_after_ms: Some(86_400_000),
    };
    assert_eq!(
        exhausted.with_hint_at_most(60_000).retry_after_ms(),
        Some(60_000)
    );
    let server = Feedback::ServerError {
        retry_after_ms: Some(10),
    };
    assert_eq!(
        server.clone().with_hint_at_most(5),
        Feedback::ServerError {
            retry_after_ms: Some(5)
        }
    );
    assert_eq!(
        Feedback::ClientError.with_hint_at_most(0),
        Feedback::ClientError
    );
}

#[test]
fn gemini_variants() {
    // Token and request violations together: tokens.
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"},
          {"quotaMetric":"generativelanguage.googleapis.com/generate_content_paid_tier_output_token_count","quotaId":"GenerateContentOutputTokensPerModelPerMinute"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":"12","nanos":1}}]}}"#;
    assert_eq!(
        classify(ProviderKind::Gemini, 429, &[], Some(body), NOW),
        Feedback::Throttled {
            retry_after_ms: Some(12_001),
            scope: ThrottleScope::OutputTokens
        }
    );
    // A zero quota can never pass.
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[
          {"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_input_token_count","quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier","quotaValue":"0"}]}]}}"#;
    let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
    assert_eq!(fb.class(), "exhausted");
    assert!(
        matches!(&fb, Feedback::Exhausted { reason, .. } if reason.starts_with("zero_quota: GenerateContentInputTokens")),
        "{fb:?}"
    );
    // No details, but the message names a per-day quota (Vertex AI).
    let body = r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model with base model: gemini-pro."}}]"#;
    let fb = classify(ProviderKind::Gemini, 429, &[], Some(body), NOW);
    assert!(
        matches!(&fb, Feedback::Exhausted { reason, .. } if reason.starts_with("per_day_quota: Quota exceeded")),
        "{fb:?}"
    );
    // The same per minute is a throttle.
    let body = body.replace("per_day", "per_minute");
    assert_eq!(
        classify(ProviderKind::Gemini, 429, &[], Some(&body), NOW),
        Feedback::Throttled {
            retry_after_ms: None,
            scope: ThrottleScope::Unknown
        }
    );
    // RetryInfo on a 503.
    let body = r#"{"error":{"code":503,"status":"UNAVAILABLE","message":"The model is overloaded.","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"5s"}]}}"#;
    assert_eq!(
        classify(ProviderKind::Gemini, 503, &[], Some(body), NOW),
        Feedback::ServerError {
            retry_after_ms: Some(5_000)
        }
    );
    // A malformed retryDelay is no hint.
    let body = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"}]}}"#;
    assert_eq!(
        classify(ProviderKind::Gemini, 429, &[], Some(body), NOW),
        Feedback::Throttled {
            retry_after_ms: None,
            scope: ThrottleScope::Unknown
        }
    );
}
