use super::*;
use crate::{ProviderConfig, ProvidersConfig, validate_providers};
use tollgate_core::{FakeClock, MemoryStore, RateConfig};

const T0: u64 = 1_700_000_000_000;

/// `p:m`: 600 requests/min, burst 60, block with a 4 s wait, and the
/// given caps (`None`: the defaults).
fn governor(
    max_cooldown_ms: Option<i64>,
    max_exhausted_ms: Option<i64>,
) -> (ProviderGovernor<MemoryStore>, FakeClock) {
    let clock = FakeClock::new(T0);
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("generic".into()),
            requests: Some(RateConfig {
                amount: 600,
                period_ms: 60_000,
                burst: Some(60),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy: Policy::Block,
            max_wait_ms: None,
            aimd: None,
            max_cooldown_ms,
            max_exhausted_ms,
            tenants: Default::default(),
        },
    );
    let book = validate_providers(&cfg).expect("valid");
    let store = MemoryStore::new(clock.clone());
    (ProviderGovernor::new(store, clock.clone(), book), clock)
}

/// A permit that may not wait: granted now, or refused.
async fn now_or_never(
    g: &ProviderGovernor<MemoryStore>,
) -> Result<Decision<ProviderPermit>, ProviderError> {
    g.permit(PermitRequest {
        max_wait_ms: Some(0),
        ..PermitRequest::new("p", "m", 0)
    })
    .await
}

/// How long this replica fails fast now (`None`: it does not).
async fn exhausted_for(g: &ProviderGovernor<MemoryStore>, now: u64) -> Option<u64> {
    match now_or_never(g).await {
        Err(ProviderError::Exhausted { until_ms, .. }) => Some(until_ms - now),
        Ok(d) => {
            assert!(d.is_allowed(), "{d:?}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_31_year_retry_after_sets_a_cooldown_of_at_most_five_minutes() {
    let (g, clock) = governor(None, None);
    let out = g
        .feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(300_000));
    assert_eq!(out.cooldown_until_ms, Some(T0 + 300_000));
    clock.advance(299_999);
    assert_eq!(
        now_or_never(&g).await.unwrap().denial(),
        Some(&Denial::Limited {
            limit: Limit::Cooldown,
            retry_after_ms: 1
        })
    );
    clock.advance(1);
    assert!(now_or_never(&g).await.unwrap().is_allowed());
}

#[tokio::test]
async fn max_cooldown_ms_cuts_every_retry_hint() {
    let (g, _clock) = governor(Some(10_000), None);
    let out = g
        .feedback("p", "m", 429, &[("retry-after", "60")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(10_000));
    assert_eq!(out.cooldown_until_ms, Some(T0 + 10_000));
    // A shorter hint is taken as it is (the cooldown only grows).
    let out = g
        .feedback("p", "m", 429, &[("retry-after-ms", "3000")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(3_000));
    assert_eq!(out.cooldown_until_ms, Some(T0 + 10_000));
    // A server error's hint (the retry layer's wait) is cut too.
    let out = g
        .feedback("p", "m", 503, &[("retry-after", "3600")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(10_000));
    assert_eq!(out.cooldown_until_ms, None);
    // An answer read elsewhere (the embedded model wrapper) likewise.
    let out = g
        .observe(
            "p",
            "m",
            Feedback::Throttled {
                retry_after_ms: Some(u64::MAX),
                scope: crate::ThrottleScope::Unknown,
            },
        )
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(10_000));
    assert_eq!(out.cooldown_until_ms, Some(T0 + 10_000));
}

#[tokio::test]
async fn the_exhaustion_hold_is_cut_to_max_exhausted_ms() {
    let huge = [("retry-after", "999999999")];
    // Default: at most 60 s, whatever the hint.
    let (g, clock) = governor(None, None);
    let out = g.feedback("p", "m", 402, &huge, None).await.unwrap();
    assert_eq!(out.feedback.class(), "exhausted");
    assert_eq!(out.feedback.retry_after_ms(), Some(60_000));
    assert_eq!(exhausted_for(&g, T0).await, Some(60_000));
    clock.advance(60_000);
    assert_eq!(exhausted_for(&g, T0 + 60_000).await, None);

    // Raised to 2 minutes: a long hint holds 2 minutes; no hint still
    // holds EXHAUSTED_HOLD_MS; a short hint holds as long as it says.
    let (g, clock) = governor(None, Some(120_000));
    g.feedback("p", "m", 402, &huge, None).await.unwrap();
    assert_eq!(exhausted_for(&g, T0).await, Some(120_000));
    clock.advance(120_000);
    let now = T0 + 120_000;
    assert_eq!(exhausted_for(&g, now).await, None);
    g.feedback("p", "m", 402, &[], None).await.unwrap();
    assert_eq!(exhausted_for(&g, now).await, Some(EXHAUSTED_HOLD_MS));
    clock.advance(EXHAUSTED_HOLD_MS);
    let now = now + EXHAUSTED_HOLD_MS;
    g.feedback("p", "m", 402, &[("retry-after", "5")], None)
        .await
        .unwrap();
    assert_eq!(exhausted_for(&g, now).await, Some(5_000));

    // Lowered to 20 s: even the hold without a hint is cut.
    let (g, _clock) = governor(None, Some(20_000));
    let out = g.feedback("p", "m", 402, &[], None).await.unwrap();
    assert_eq!(out.feedback.retry_after_ms(), None);
    assert_eq!(exhausted_for(&g, T0).await, Some(20_000));
}

#[tokio::test]
async fn status_shows_and_clear_removes_what_the_answers_set() {
    let (g, clock) = governor(None, None);
    let clean = ProviderStatus {
        provider: "p".into(),
        model: "m".into(),
        cooldown_until_ms: None,
        cooldown_remaining_ms: 0,
        effective_permille: FULL,
        exhausted: None,
        tenants: Vec::new(),
    };
    assert_eq!(g.status("p", "m").await.unwrap(), clean);
    g.feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    g.feedback("p", "m", 402, &[], None).await.unwrap();
    clock.advance(1_000);
    let hold = ExhaustionHold {
        until_ms: T0 + 60_000,
        reason: "payment_required".into(),
    };
    let held = ProviderStatus {
        cooldown_until_ms: Some(T0 + 300_000),
        cooldown_remaining_ms: 299_000,
        effective_permille: 500,
        exhausted: Some(hold.clone()),
        ..clean.clone()
    };
    assert_eq!(g.status("p", "m").await.unwrap(), held);
    assert_eq!(g.statuses().await.unwrap(), vec![held.clone()]);
    assert_eq!(
        g.status("p", "m").await.unwrap(),
        held,
        "a status reads only"
    );
    assert_eq!(
        g.clear("p", "m").await.unwrap(),
        ClearOutcome {
            cooldown_until_ms: Some(T0 + 300_000),
            effective_permille: 500,
            exhausted: Some(hold),
        }
    );
    let d = now_or_never(&g).await.unwrap();
    assert_eq!(d.grant().map(|p| p.effective_permille), Some(FULL));
    assert_eq!(g.status("p", "m").await.unwrap(), clean);
    assert_eq!(
        g.clear("p", "m").await.unwrap(),
        ClearOutcome {
            cooldown_until_ms: None,
            effective_permille: FULL,
            exhausted: None,
        },
        "nothing left to clear"
    );
    assert!(matches!(
        g.clear("p", "other").await,
        Err(ProviderError::Unknown { .. })
    ));
    assert!(matches!(
        g.status("q", "m").await,
        Err(ProviderError::Unknown { .. })
    ));
}
