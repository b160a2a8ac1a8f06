//! Provider answers, written after the providers' public documentation
//! (tests/fixtures/providers/README.md), classified into quota feedback.

use tollgate_provider::{
    Feedback, ProviderKind, RateLimitWindow, ThrottleScope, classify, parse_rate_limit_headers,
};

/// 2024-05-01T12:00:00Z, the clock the Anthropic and Generic fixtures were
/// written against.
const NOW: u64 = 1_714_564_800_000;

macro_rules! fixtures {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("fixtures/providers/", $path)))),*]
    };
}

/// Every fixture file, by path under tests/fixtures/providers.
const FIXTURES: &[(&str, &str)] = fixtures![
    "openai/200_success.http",
    "openai/400_context_length.http",
    "openai/429_insufficient_quota.http",
    "openai/429_rpd.http",
    "openai/429_rpm.http",
    "openai/429_tpm.http",
    "openai/429_tpm_retry_after.http",
    "openai/500_server_error.http",
    "openai/503_overloaded.http",
    "anthropic/200_success.http",
    "anthropic/400_credit_balance.http",
    "anthropic/401_authentication.http",
    "anthropic/402_billing_error.http",
    "anthropic/413_request_too_large.http",
    "anthropic/429_input_tokens.http",
    "anthropic/429_requests_no_retry_after.http",
    "anthropic/429_spend_limit.http",
    "anthropic/500_api_error.http",
    "anthropic/529_overloaded.http",
    "gemini/200_success.http",
    "gemini/400_invalid_argument.http",
    "gemini/429_input_tokens.http",
    "gemini/429_rpd_free_tier.http",
    "gemini/429_rpm_free_tier.http",
    "gemini/429_vertex_no_details.http",
    "gemini/500_internal.http",
    "gemini/503_unavailable.http",
    "generic/200_success.http",
    "generic/404_not_found.http",
    "generic/408_timeout.http",
    "generic/429_bad_retry_after.http",
    "generic/429_retry_after_date.http",
    "generic/429_retry_after_seconds.http",
    "generic/503_retry_after.http",
];

/// A raw HTTP answer: status line, `name: value` headers, blank line, body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Option<String>,
}

impl Answer {
    fn parse(text: &str) -> Answer {
        let text = text.replace("\r\n", "\n");
        let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status_line = lines.next().expect("a status line");
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let headers = lines
            .map(|line| {
                let (name, value) = line
                    .split_once(':')
                    .unwrap_or_else(|| panic!("bad header line {line:?}"));
                (name.to_owned(), value.trim().to_owned())
            })
            .collect();
        let body = (!body.trim().is_empty()).then(|| body.to_owned());
        Answer {
            status,
            headers,
            body,
        }
    }

    fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    fn classify(&self, kind: ProviderKind, now_ms: u64) -> Feedback {
        classify(
            kind,
            self.status,
            &self.header_pairs(),
            self.body.as_deref(),
            now_ms,
        )
    }
}

fn fixture(path: &str) -> Answer {
    let (_, text) = FIXTURES
        .iter()
        .find(|(p, _)| *p == path)
        .unwrap_or_else(|| panic!("no fixture {path}"));
    Answer::parse(text)
}

/// The fixture's provider, from its directory.
fn kind_of(path: &str) -> ProviderKind {
    path.split('/').next().unwrap().parse().unwrap()
}

fn check(path: &str) -> Feedback {
    fixture(path).classify(kind_of(path), NOW)
}

fn throttled(retry_after_ms: Option<u64>, scope: ThrottleScope) -> Feedback {
    Feedback::Throttled {
        retry_after_ms,
        scope,
    }
}

#[track_caller]
fn assert_exhausted(fb: &Feedback, cause: &str) {
    match fb {
        Feedback::Exhausted { reason, .. } => assert!(
            reason.starts_with(cause),
            "reason {reason:?} should start with {cause:?}"
        ),
        other => panic!("expected exhausted ({cause}), got {other:?}"),
    }
}

#[track_caller]
fn window(w: &RateLimitWindow, limit: u64, remaining: u64, reset_after_ms: u64) {
    assert_eq!(
        (w.limit, w.remaining, w.reset_after_ms),
        (Some(limit), Some(remaining), Some(reset_after_ms))
    );
}

#[test]
fn every_fixture_file_is_listed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers");
    let mut on_disk = Vec::new();
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&dir).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "http") {
                let rel = file.strip_prefix(&root).unwrap();
                on_disk.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = FIXTURES.iter().map(|(p, _)| (*p).to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

// --- OpenAI ------------------------------------------------------------------

#[test]
fn openai_success_reads_the_rate_limit_headers() {
    let fb = check("openai/200_success.http");
    let limits = fb.limits().expect("success");
    window(&limits.requests, 10_000, 9_999, 6);
    window(&limits.tokens, 2_000_000, 1_999_487, 15);
    assert!(limits.input_tokens.is_empty() && limits.output_tokens.is_empty());
}

#[test]
fn openai_rpm_throttle_uses_the_requests_reset() {
    // No retry-after: the reset of the scope that ran out (120ms).
    assert_eq!(
        check("openai/429_rpm.http"),
        throttled(Some(120), ThrottleScope::Requests)
    );
}

#[test]
fn openai_tpm_throttle_uses_the_tokens_reset() {
    // x-ratelimit-reset-tokens: 1m30.5s, not the requests reset nor the
    // message's "try again in 2s".
    assert_eq!(
        check("openai/429_tpm.http"),
        throttled(Some(90_500), ThrottleScope::Tokens)
    );
}

#[test]
fn openai_retry_after_wins_over_reset_headers() {
    assert_eq!(
        check("openai/429_tpm_retry_after.http"),
        throttled(Some(20_000), ThrottleScope::Tokens)
    );
}

#[test]
fn openai_insufficient_quota_is_exhausted() {
    let fb = check("openai/429_insufficient_quota.http");
    assert_exhausted(&fb, "insufficient_quota: You exceeded your current quota");
    assert_eq!(fb.class(), "exhausted");
    assert_eq!(fb.retry_after_ms(), None);
}

#[test]
fn openai_per_day_limit_is_exhausted() {
    let fb = check("openai/429_rpd.http");
    assert_exhausted(&fb, "per_day_limit: Rate limit");
    // "Please try again in 8.64s" is when one more request fits the day's
    // window, not when the quota is back: no hint.
    assert_eq!(fb.retry_after_ms(), None);
}

#[test]
fn openai_server_errors() {
    assert_eq!(
        check("openai/500_server_error.http"),
        Feedback::ServerError {
            retry_after_ms: None
        }
    );
    assert_eq!(
        check("openai/503_overloaded.http"),
        Feedback::ServerError {
            retry_after_ms: Some(5_000)
        }
    );
}

#[test]
fn openai_bad_request_is_a_client_error() {
    assert_eq!(
        check("openai/400_context_length.http"),
        Feedback::ClientError
    );
}

// --- Anthropic ---------------------------------------------------------------

#[test]
fn anthropic_success_reads_all_four_windows() {
    let fb = check("anthropic/200_success.http");
    let limits = fb.limits().expect("success");
    window(&limits.requests, 4_000, 3_999, 15);
    window(&limits.tokens, 480_000, 479_000, 1_000);
    window(&limits.input_tokens, 400_000, 399_000, 1_000);
    window(&limits.output_tokens, 80_000, 80_000, 0);
}

#[test]
fn anthropic_input_token_throttle_with_retry_after() {
    // Both the combined and the input-token windows are at 0 and reset
    // together: the more specific scope; the hint is retry-after.
    assert_eq!(
        check("anthropic/429_input_tokens.http"),
        throttled(Some(30_000), ThrottleScope::InputTokens)
    );
}

#[test]
fn anthropic_request_throttle_without_retry_after_uses_the_reset() {
    // anthropic-ratelimit-requests-reset: 2024-05-01T12:00:07.5Z, now 12:00:00.
    assert_eq!(
        check("anthropic/429_requests_no_retry_after.http"),
        throttled(Some(7_500), ThrottleScope::Requests)
    );
    // Later than the reset: retry now.
    assert_eq!(
        fixture("anthropic/429_requests_no_retry_after.http")
            .classify(ProviderKind::Anthropic, NOW + 60_000),
        throttled(Some(0), ThrottleScope::Requests)
    );
}

#[test]
fn anthropic_spend_cap_and_billing_are_exhausted() {
    assert_exhausted(
        &check("anthropic/429_spend_limit.http"),
        "enforced_spend_limit_reached: Your organization",
    );
    assert_exhausted(
        &check("anthropic/400_credit_balance.http"),
        "credit_balance: Your credit balance is too low",
    );
    assert_exhausted(&check("anthropic/402_billing_error.http"), "billing_error");
}

#[test]
fn anthropic_overloaded_and_api_errors_are_server_errors() {
    for path in [
        "anthropic/529_overloaded.http",
        "anthropic/500_api_error.http",
    ] {
        assert_eq!(
            check(path),
            Feedback::ServerError {
                retry_after_ms: None
            },
            "{path}"
        );
    }
}

#[test]
fn anthropic_other_client_errors() {
    for path in [
        "anthropic/401_authentication.http",
        "anthropic/413_request_too_large.http",
    ] {
        assert_eq!(check(path), Feedback::ClientError, "{path}");
    }
}

// --- Gemini ------------------------------------------------------------------

#[test]
fn gemini_success_has_no_rate_limit_headers() {
    let fb = check("gemini/200_success.http");
    assert!(fb.limits().expect("success").is_empty());
}

#[test]
fn gemini_rpm_throttle_uses_retry_info() {
    assert_eq!(
        check("gemini/429_rpm_free_tier.http"),
        throttled(Some(37_000), ThrottleScope::Requests)
    );
}

#[test]
fn gemini_input_token_throttle_uses_retry_info() {
    assert_eq!(
        check("gemini/429_input_tokens.http"),
        throttled(Some(1_500), ThrottleScope::InputTokens)
    );
}

#[test]
fn gemini_per_day_quota_is_exhausted() {
    assert_exhausted(
        &check("gemini/429_rpd_free_tier.http"),
        "per_day_quota: GenerateRequestsPerDayPerProjectPerModel-FreeTier",
    );
}

#[test]
fn gemini_resource_exhausted_without_details_is_throttled_without_hint() {
    assert_eq!(
        check("gemini/429_vertex_no_details.http"),
        throttled(None, ThrottleScope::Unknown)
    );
}

#[test]
fn gemini_server_and_client_errors() {
    for path in ["gemini/503_unavailable.http", "gemini/500_internal.http"] {
        assert_eq!(
            check(path),
            Feedback::ServerError {
                retry_after_ms: None
            },
            "{path}"
        );
    }
    assert_eq!(
        check("gemini/400_invalid_argument.http"),
        Feedback::ClientError
    );
}

// --- Generic -----------------------------------------------------------------

#[test]
fn generic_success_reads_openai_style_headers() {
    let fb = check("generic/200_success.http");
    let limits = fb.limits().expect("success");
    window(&limits.requests, 30, 29, 2_000);
    window(&limits.tokens, 6_000, 5_990, 100);
}

#[test]
fn generic_throttles_read_retry_after_only() {
    // An HTTP-date 45 s after the clock.
    assert_eq!(
        check("generic/429_retry_after_date.http"),
        throttled(Some(45_000), ThrottleScope::Unknown)
    );
    // Decimal seconds; the body (an OpenAI-looking insufficient_quota) is
    // not read for the generic kind.
    assert_eq!(
        check("generic/429_retry_after_seconds.http"),
        throttled(Some(1_500), ThrottleScope::Unknown)
    );
    // A malformed Retry-After is no hint.
    assert_eq!(
        check("generic/429_bad_retry_after.http"),
        throttled(None, ThrottleScope::Unknown)
    );
}

#[test]
fn generic_server_and_client_errors() {
    assert_eq!(
        check("generic/503_retry_after.http"),
        Feedback::ServerError {
            retry_after_ms: Some(120_000)
        }
    );
    assert_eq!(
        check("generic/408_timeout.http"),
        Feedback::ServerError {
            retry_after_ms: None
        }
    );
    assert_eq!(check("generic/404_not_found.http"), Feedback::ClientError);
}

// --- Across fixtures ---------------------------------------------------------

#[test]
fn header_name_case_does_not_matter() {
    for (path, text) in FIXTURES {
        let answer = Answer::parse(text);
        let kind = kind_of(path);
        let expected = answer.classify(kind, NOW);
        for change in [str::to_ascii_uppercase, str::to_ascii_lowercase] {
            let changed = Answer {
                status: answer.status,
                headers: answer
                    .headers
                    .iter()
                    .map(|(k, v)| (change(k), v.clone()))
                    .collect(),
                body: answer.body.clone(),
            };
            assert_eq!(changed.classify(kind, NOW), expected, "{path}");
        }
    }
}

#[test]
fn any_fixture_under_any_kind_classifies_without_panicking() {
    for (path, text) in FIXTURES {
        let answer = Answer::parse(text);
        for kind in ProviderKind::ALL {
            for now in [0, NOW, u64::MAX] {
                let fb = answer.classify(kind, now);
                // Status classes hold whatever the kind.
                match answer.status {
                    200..=299 => assert_eq!(fb.class(), "success", "{path} as {kind}"),
                    408 | 500..=599 => {
                        assert_eq!(fb.class(), "server_error", "{path} as {kind}")
                    }
                    _ => {}
                }
                let _ = parse_rate_limit_headers(kind, &answer.header_pairs(), now);
            }
        }
    }
}

#[test]
fn truncated_bodies_fall_back_to_the_status() {
    for (path, text) in FIXTURES {
        let answer = Answer::parse(text);
        let Some(body) = &answer.body else { continue };
        let kind = kind_of(path);
        let headers = answer.header_pairs();
        for cut in (0..body.len()).step_by(7) {
            let Some(part) = body.get(..cut) else {
                continue;
            };
            if part.trim_end() == body.trim_end() {
                continue; // only trailing whitespace was cut
            }
            let fb = classify(kind, answer.status, &headers, Some(part), NOW);
            // A truncated body is not JSON: never more than the status says.
            if answer.status == 429 {
                assert_eq!(fb.class(), "throttled", "{path} cut at {cut}");
            }
        }
    }
}
