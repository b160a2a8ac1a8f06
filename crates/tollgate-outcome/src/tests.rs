//! A row per denial and error: status, code, body and headers.

use http::StatusCode as H;
use serde_json::{Value, json};
use tollgate_core::{Denial, Limit, LimiterError, StoreError, StoreErrorKind};

use crate::{ApiError, Retry, TooManyWaits};

/// Status, headers (name → value, content type left out) and JSON body.
fn answer(e: &ApiError) -> (H, Vec<(String, String)>, Value) {
    let res = e.http_response();
    assert_eq!(res.headers()["content-type"], "application/json");
    let mut headers: Vec<_> = res
        .headers()
        .iter()
        .filter(|(k, _)| *k != "content-type")
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    headers.sort();
    let body = serde_json::from_slice(res.body()).expect("a JSON body");
    (res.status(), headers, body)
}

fn limited(limit: Limit, retry_after_ms: u64) -> Denial {
    Denial::Limited {
        limit,
        retry_after_ms,
    }
}

fn hdrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

fn limit_headers(secs: &str) -> Vec<(String, String)> {
    hdrs(&[
        ("retry-after", secs),
        ("ratelimit-remaining", "0"),
        ("ratelimit-reset", secs),
    ])
}

#[test]
fn user_limits_are_retryable_429s_with_ratelimit_headers() {
    for (limit, message) in [
        (Limit::TurnRate, "too many turns: retry in 3 s"),
        (
            Limit::Concurrency,
            "too many runs at once: finish one or retry in 3 s",
        ),
        (Limit::TokenRate, "token rate exceeded: retry in 3 s"),
        (
            Limit::Sessions,
            "too many live sessions: reuse one, or retry a new one in 3 s",
        ),
    ] {
        let (status, headers, body) = answer(&ApiError::Denied(limited(limit, 2_001)));
        assert_eq!(status, H::TOO_MANY_REQUESTS, "{limit}");
        assert_eq!(headers, limit_headers("3"), "{limit}");
        assert_eq!(
            body,
            json!({"error": limit.as_str(), "limit": limit.as_str(),
                   "retry_after_ms": 2_001, "message": message})
        );
    }
}

#[test]
fn a_sub_second_hint_is_retry_after_one() {
    let (_, headers, body) = answer(&ApiError::Denied(limited(Limit::TurnRate, 1)));
    assert_eq!(headers, limit_headers("1"));
    assert_eq!(body["retry_after_ms"], 1);
}

#[test]
fn never_fitting_and_capped_requests_are_not_retryable() {
    let (status, headers, body) = answer(&ApiError::Denied(Denial::ExceedsCapacity {
        limit: Limit::TokenRate,
        cost: 900,
        max_cost: 500,
    }));
    assert_eq!(status, H::BAD_REQUEST);
    assert!(headers.is_empty());
    assert_eq!(
        body,
        json!({"error": "exceeds_capacity", "limit": "token_rate",
               "message": "an estimate of 900 tokens can never be granted: at most 500"})
    );

    let (status, headers, body) = answer(&ApiError::Denied(Denial::CapReached {
        limit: Limit::MaxLlmCalls,
        cap: 500,
    }));
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert!(headers.is_empty(), "the run must stop: no Retry-After");
    assert_eq!(
        body,
        json!({"error": "max_llm_calls", "limit": "max_llm_calls",
               "message": "this run reached its cap of 500 model calls; it must stop"})
    );
}

#[test]
fn provider_refusals() {
    let (status, headers, body) = answer(&ApiError::ProviderDenied(limited(Limit::Bucket, 1_500)));
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert_eq!(headers, limit_headers("2"));
    assert_eq!(
        body,
        json!({"error": "provider_rate", "limit": "provider_rate", "retry_after_ms": 1_500,
               "message": "provider rate exceeded: retry in 2 s"})
    );

    let (status, headers, body) =
        answer(&ApiError::ProviderDenied(limited(Limit::Cooldown, 4_000)));
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert_eq!(headers, limit_headers("4"));
    assert_eq!(body["error"], "provider_cooldown");
    assert_eq!(body["limit"], "provider_cooldown");

    let (status, headers, body) = answer(&ApiError::ProviderDenied(Denial::ExceedsCapacity {
        limit: Limit::Bucket,
        cost: 10,
        max_cost: 5,
    }));
    assert_eq!(status, H::BAD_REQUEST);
    assert!(headers.is_empty());
    assert_eq!(body["error"], "exceeds_capacity");
    assert_eq!(body["limit"], "provider_rate");

    let (status, headers, body) = answer(&ApiError::ProviderExhausted {
        reason: "daily quota".into(),
        retry_after_ms: 60_000,
    });
    assert_eq!(status, H::FORBIDDEN);
    assert!(headers.is_empty(), "not retryable: no Retry-After");
    assert_eq!(
        body,
        json!({"error": "provider_exhausted", "retry_after_ms": 60_000,
               "message": "provider quota exhausted (daily quota); do not retry"})
    );

    let (status, _, body) = answer(&ApiError::UnknownProvider {
        provider: "p".into(),
        model: "m".into(),
    });
    assert_eq!(status, H::NOT_FOUND);
    assert_eq!(body["error"], "unknown_provider");
}

#[test]
fn session_and_lease_rows() {
    let (status, headers, body) = answer(&ApiError::SessionBusy {
        retry_after_ms: 2_500,
    });
    assert_eq!(status, H::CONFLICT);
    assert_eq!(headers, limit_headers("3"));
    assert_eq!(
        body,
        json!({"error": "session_busy", "retry_after_ms": 2_500,
               "message": "a turn is already running in this session"})
    );

    let (status, headers, body) = answer(&ApiError::StaleFence { latest: 7 });
    assert_eq!(status, H::CONFLICT);
    assert!(headers.is_empty());
    assert_eq!(
        body,
        json!({"error": "stale_fence", "latest_fence": 7,
               "message": "another turn has taken this session over; stop writing"})
    );

    for (e, code) in [
        (ApiError::LeaseLost, "lease_lost"),
        (ApiError::NotHolder, "not_holder"),
        (ApiError::UnknownReservation, "unknown_reservation"),
        (ApiError::NotFound("no such route".into()), "not_found"),
    ] {
        let (status, headers, body) = answer(&e);
        assert_eq!(status, H::NOT_FOUND, "{code}");
        assert!(headers.is_empty(), "{code}");
        assert_eq!(body["error"], code);
        assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{code}: {body}");
    }
}

#[test]
fn caller_errors() {
    let (status, headers, body) = answer(&ApiError::invalid("tokens", "must be at most 2^53"));
    assert_eq!(status, H::BAD_REQUEST);
    assert!(headers.is_empty());
    assert_eq!(
        body,
        json!({"error": "invalid_request", "field": "tokens", "message": "must be at most 2^53"})
    );

    let (status, _, body) = answer(&ApiError::Unauthorized("no token".into()));
    assert_eq!(status, H::UNAUTHORIZED);
    assert_eq!(
        body,
        json!({"error": "unauthorized", "message": "no token"})
    );

    let (status, _, body) = answer(&ApiError::Forbidden("not yours".into()));
    assert_eq!(status, H::FORBIDDEN);
    assert_eq!(body, json!({"error": "forbidden", "message": "not yours"}));

    let (status, headers, body) = answer(&ApiError::RequestTimeout { timeout_ms: 5_000 });
    assert_eq!(status, H::REQUEST_TIMEOUT);
    assert!(headers.is_empty());
    assert_eq!(
        body["message"],
        "the request body did not arrive within 5000 ms"
    );
}

#[test]
fn replica_bounds_are_backoffs_without_ratelimit_headers() {
    let retry_after = hdrs(&[("retry-after", "1")]);
    let (status, headers, body) = answer(&ApiError::Overloaded);
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert_eq!(headers, retry_after);
    assert_eq!(
        body,
        json!({"error": "overloaded", "retry_after_ms": 1_000,
               "message": "this replica is at its in-flight cap; retry in 1 s"})
    );

    let (status, headers, body) = answer(&ApiError::TooManyWaits(TooManyWaits::User(2)));
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert_eq!(headers, retry_after);
    assert_eq!(
        body["message"],
        "this user already has 2 wait=true requests waiting: retry in 1 s, or send wait=false and wait out wait_ms yourself"
    );
    let (_, _, body) = answer(&ApiError::TooManyWaits(TooManyWaits::Replica(64)));
    assert_eq!(body["error"], "too_many_waits");
    assert!(
        body["message"].as_str().is_some_and(
            |m| m.starts_with("this replica already holds 64 waiting requests (all users)")
        ),
        "{body}"
    );
}

#[test]
fn store_faults_map_to_their_rows_without_details() {
    let cases = [
        (
            StoreErrorKind::Timeout,
            H::SERVICE_UNAVAILABLE,
            "store_unavailable",
        ),
        (
            StoreErrorKind::Unavailable,
            H::SERVICE_UNAVAILABLE,
            "store_unavailable",
        ),
        (StoreErrorKind::Full, H::SERVICE_UNAVAILABLE, "store_full"),
        (
            StoreErrorKind::Protocol,
            H::INTERNAL_SERVER_ERROR,
            "internal",
        ),
    ];
    for (kind, want, code) in cases {
        let e = ApiError::from(LimiterError::Store(StoreError::new(kind, "secret detail")));
        assert!(e.is_fault(), "{code}");
        let (status, headers, body) = answer(&e);
        assert_eq!(status, want, "{code}");
        assert_eq!(body["error"], code);
        assert!(!body.to_string().contains("secret"), "no detail leaks");
        if code == "store_full" {
            assert_eq!(headers, hdrs(&[("retry-after", "1")]));
            assert_eq!(body["retry_after_ms"], 1_000);
        } else {
            assert!(headers.is_empty(), "{code}");
        }
    }
    assert!(!ApiError::Overloaded.is_fault());
}

#[test]
fn limiter_errors_map_to_their_rows() {
    let e = ApiError::from(LimiterError::UnknownUser { user: "u".into() });
    assert_eq!(e.row().status, H::UNAUTHORIZED);
    assert_eq!(e.row().body.message, "this user has no plan");

    let e = ApiError::from(LimiterError::InvalidRequest {
        field: "user",
        message: "must not be empty".into(),
    });
    let row = e.row();
    assert_eq!(row.status, H::BAD_REQUEST);
    assert_eq!(row.body.field.as_deref(), Some("user"));

    let e = ApiError::from(LimiterError::UnknownReservation("r1".into()));
    assert_eq!(e.row().body.error, "unknown_reservation");
    assert_eq!(e.row().retry, Retry::No);
}

/// A spent budget: 429 `budget_exhausted`, the limit naming its window,
/// the hint to the window's end and the instant it resets (when decided at
/// a known time), a sentence saying which budget and when.
#[test]
fn a_spent_budget_is_a_retryable_429_naming_its_window_and_reset() {
    // 3 March 2027 09:00 UTC, the day ending in 15 h.
    let now = 1_804_064_400_000;
    let e = ApiError::denied_at(limited(Limit::BudgetDaily, 54_000_000), now);
    let (status, headers, body) = answer(&e);
    assert_eq!(status, H::TOO_MANY_REQUESTS);
    assert_eq!(headers, limit_headers("54000"));
    assert_eq!(
        body,
        json!({"error": "budget_exhausted", "limit": "budget_daily",
               "retry_after_ms": 54_000_000_u64, "resets_at_ms": 1_804_118_400_000_u64,
               "message": "your daily budget is spent: model calls are refused until it \
                           resets in 15 h"})
    );
    // Monthly, 27 days 15 h to 1 April; weekly, 90 s (rounded up to minutes
    // past one).
    for (limit, ms, words) in [
        (
            Limit::BudgetMonthly,
            2_386_800_000,
            "monthly budget is spent: model calls are refused until it resets in 27 days 15 h",
        ),
        (
            Limit::BudgetWeekly,
            90_000,
            "weekly budget is spent: model calls are refused until it resets in 2 min",
        ),
        (
            Limit::BudgetWeekly,
            45_000,
            "weekly budget is spent: model calls are refused until it resets in 45 s",
        ),
    ] {
        let (_, _, body) = answer(&ApiError::denied_at(limited(limit, ms), now));
        assert_eq!(body["message"], format!("your {words}"));
        assert_eq!(body["resets_at_ms"], now + ms);
    }
    // Any other denial is unchanged.
    assert!(matches!(
        ApiError::denied_at(limited(Limit::TokenRate, 5), now),
        ApiError::Denied(_)
    ));
    // A charge past a whole budget: 400 exceeds_capacity, not retryable.
    let e = ApiError::Denied(Denial::ExceedsCapacity {
        limit: Limit::BudgetMonthly,
        cost: 60_000_000,
        max_cost: 50_000_000,
    });
    let (status, headers, body) = answer(&e);
    assert_eq!(status, H::BAD_REQUEST);
    assert!(headers.is_empty());
    assert_eq!(body["error"], "exceeds_capacity");
    assert_eq!(body["limit"], "budget_monthly");
}
