//! The answer Envoy reads: per-descriptor statuses, the overall code and
//! the response headers (`x-ratelimit-*` as Envoy's `DRAFT_VERSION_03`
//! writes them, `retry-after`), with rates as requests per Envoy unit.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;
use tollgate_core::BucketSpec;

use super::rules::RlsRules;
use super::service::Verdict;

pub(super) fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Envoy's units, ms each.
const UNITS: [(u64, Unit); 4] = [
    (1_000, Unit::Second),
    (60_000, Unit::Minute),
    (3_600_000, Unit::Hour),
    (86_400_000, Unit::Day),
];

/// A rate as requests per Envoy unit: the period's own unit when it is
/// one; else the smallest unit the rate fills a whole number of times (10
/// per 30 s is 20 per MINUTE); else the unit nearest the period, the count
/// rounded (at least 1).
pub fn per_unit(spec: &BucketSpec) -> (u32, Unit) {
    let (amount, period) = (u128::from(spec.amount()), u128::from(spec.period_ms()));
    if let Some((_, unit)) = UNITS.iter().find(|(ms, _)| u128::from(*ms) == period)
        && amount <= u128::from(u32::MAX)
    {
        return (amount as u32, *unit);
    }
    for (ms, unit) in UNITS {
        let scaled = amount * u128::from(ms);
        if scaled % period == 0 && scaled / period <= u128::from(u32::MAX) {
            return (clamp_u32((scaled / period) as u64), unit);
        }
    }
    let (ms, unit) = UNITS
        .into_iter()
        .min_by(|(a, _), (b, _)| {
            let da = (*a as f64 / period as f64).ln().abs();
            let db = (*b as f64 / period as f64).ln().abs();
            da.total_cmp(&db)
        })
        .unwrap_or(UNITS[0]);
    let n = (amount * u128::from(ms) + period / 2) / period;
    (clamp_u32(n.max(1).min(u128::from(u32::MAX)) as u64), unit)
}

pub(super) fn rate_limit(spec: &BucketSpec, name: &str) -> RateLimit {
    let (requests_per_unit, unit) = per_unit(spec);
    RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

fn window_secs(unit: i32) -> u64 {
    UNITS
        .iter()
        .find(|(_, u)| *u as i32 == unit)
        .map_or(0, |(ms, _)| ms / 1_000)
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

/// The response for `verdicts`, one status each, under `rules`' shadow
/// and header settings.
pub(super) fn respond(rules: &RlsRules, verdicts: &[Verdict]) -> RateLimitResponse {
    let shadow = rules.shadow();
    let over = !shadow && verdicts.iter().any(|v| v.over);
    let statuses: Vec<DescriptorStatus> = verdicts
        .iter()
        .map(|v| DescriptorStatus {
            code: if v.over && !shadow {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            current_limit: v.limit.clone(),
            limit_remaining: clamp_u32(v.remaining),
            duration_until_reset: v.reset_ms.map(duration),
            quota: None,
        })
        .collect();
    let mut headers = Vec::new();
    if rules.rate_limit_headers() && !shadow {
        headers.extend(rate_limit_headers(verdicts));
    }
    if over
        && let Some(ms) = verdicts
            .iter()
            .filter(|v| v.over)
            .filter_map(|v| v.retry_after_ms)
            .max()
    {
        headers.push(header("retry-after", ms.div_ceil(1_000).max(1).to_string()));
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: headers,
        ..RateLimitResponse::default()
    }
}

/// `x-ratelimit-*` as Envoy's `DRAFT_VERSION_03` writes them: the limit,
/// remaining and reset of the descriptor with the least remaining (the first
/// on ties), and every limit's quota policy (`, 20;w=60;name="user_id"`).
fn rate_limit_headers(verdicts: &[Verdict]) -> Vec<HeaderValue> {
    let limited: Vec<(&Verdict, &RateLimit)> = verdicts
        .iter()
        .filter_map(|v| v.limit.as_ref().map(|l| (v, l)))
        .collect();
    let Some(&(least, least_limit)) = limited.iter().min_by_key(|(v, _)| clamp_u32(v.remaining))
    else {
        return Vec::new();
    };
    let mut limit = least_limit.requests_per_unit.to_string();
    for (_, l) in &limited {
        let w = window_secs(l.unit);
        if w > 0 {
            limit.push_str(&format!(", {};w={w}", l.requests_per_unit));
            if !l.name.is_empty() {
                limit.push_str(&format!(";name=\"{}\"", l.name));
            }
        }
    }
    vec![
        header("x-ratelimit-limit", limit),
        header(
            "x-ratelimit-remaining",
            clamp_u32(least.remaining).to_string(),
        ),
        header(
            "x-ratelimit-reset",
            least.reset_ms.unwrap_or(0).div_ceil(1_000).to_string(),
        ),
    ]
}
