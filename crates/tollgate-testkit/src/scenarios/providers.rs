//! Provider quota shaping through the governor (SPEC §5, §7): shared
//! cooldowns, clamped hints, AIMD under a burst of 429s, tenant shares.

use tollgate_core::{Clock, Decision, Denial, FakeClock, Limit, RateConfig, Store};
use tollgate_provider::{
    PermitRequest, Policy, ProviderConfig, ProviderError, ProviderGovernor, ProviderPermit,
    ProvidersConfig, TenantConfig, validate_providers,
};

/// A provider governor over `store` for one provider key `p:m` with
/// `requests` per minute (burst `burst`), `policy` and `max_wait_ms`, and
/// tenant shares.
fn governor<S: Store + Clone>(
    store: S,
    clock: &FakeClock,
    requests: i64,
    burst: i64,
    policy: Policy,
    max_wait_ms: i64,
    tenants: &[(&str, f64)],
) -> ProviderGovernor<S> {
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("openai".into()),
            requests: Some(RateConfig {
                amount: requests,
                period_ms: 60_000,
                burst: Some(burst),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy,
            max_wait_ms: Some(max_wait_ms),
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: tenants
                .iter()
                .map(|(t, share)| {
                    (
                        (*t).to_owned(),
                        TenantConfig {
                            share: Some(*share),
                            weight: None,
                        },
                    )
                })
                .collect(),
        },
    );
    ProviderGovernor::new(
        store,
        clock.clone(),
        validate_providers(&cfg).expect("valid providers"),
    )
}

fn permit_wait(d: &Decision<ProviderPermit>) -> Option<u64> {
    d.grant().map(|p| p.wait_ms)
}

/// SPEC §7's provider example through the governor: 600 requests/min =
/// 10/s, burst 60, block. 100 calls at t = 0: 1–60 wait 0, call 60+k waits
/// 100·k ms, the last 4,000 ms; with max wait 2,000 ms calls 81–100 are
/// refused (provider rate, retry in 100 ms), taking nothing.
pub async fn provider_governor_example<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(store.clone(), &clock, 600, 60, Policy::Block, 4_000, &[]);
    for call in 1..=100u64 {
        let d = g.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
        assert_eq!(
            permit_wait(&d),
            Some(call.saturating_sub(60) * 100),
            "call {call}"
        );
    }
    let g = governor(store, &clock, 600, 60, Policy::Block, 4_000, &[]);
    // Same bucket, now drained by 100 calls: a deadline of 2,000 ms.
    let short = |n| PermitRequest {
        max_wait_ms: Some(n),
        ..PermitRequest::new("p", "m", 0)
    };
    clock.advance(4_000); // the 100 granted calls' debt is paid: level 0
    for call in 61..=100u64 {
        let d = g.permit(short(2_000)).await.unwrap();
        if call <= 80 {
            assert_eq!(permit_wait(&d), Some((call - 60) * 100), "call {call}");
        } else {
            assert_eq!(
                d.denial(),
                Some(&Denial::Limited {
                    limit: Limit::Bucket,
                    retry_after_ms: 100
                }),
                "call {call}"
            );
        }
    }
    // Reject policy: nothing waits.
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "q:m".into(),
        ProviderConfig {
            kind: None,
            requests: Some(RateConfig {
                amount: 600,
                period_ms: 60_000,
                burst: Some(60),
            }),
            tokens: None,
            input_tokens: None,
            output_tokens: None,
            policy: Policy::Reject,
            max_wait_ms: None,
            aimd: None,
            max_cooldown_ms: None,
            max_exhausted_ms: None,
            tenants: Default::default(),
        },
    );
    let r = ProviderGovernor::new(
        g.store().clone(),
        clock.clone(),
        validate_providers(&cfg).unwrap(),
    );
    for call in 1..=61u64 {
        let d = r.permit(PermitRequest::new("q", "m", 0)).await.unwrap();
        assert_eq!(d.is_allowed(), call <= 60, "call {call}");
    }
    assert!(matches!(
        r.permit(PermitRequest::new("q", "other", 0)).await,
        Err(ProviderError::Unknown { .. })
    ));
}

/// A 429 with `Retry-After: 3` seen by one replica sets the shared
/// cooldown: every replica's permits wait it out (block) or are refused
/// naming the cooldown when it does not fit their deadline.
pub async fn provider_cooldown_is_shared<S: Store + Clone>(store: S, clock: FakeClock) {
    let a = governor(store.clone(), &clock, 600, 60, Policy::Block, 4_000, &[]);
    let b = governor(store, &clock, 600, 60, Policy::Block, 4_000, &[]);
    let out = a
        .feedback("p", "m", 429, &[("retry-after", "3")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.class(), "throttled");
    assert_eq!(out.cooldown_until_ms, Some(clock.now_ms() + 3_000));
    assert_eq!(out.effective_permille, Some(500));
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(permit_wait(&d), Some(3_000), "the other replica waits");
    let short = PermitRequest {
        max_wait_ms: Some(1_000),
        ..PermitRequest::new("p", "m", 0)
    };
    assert_eq!(
        b.permit(short).await.unwrap().denial(),
        Some(&Denial::Limited {
            limit: Limit::Cooldown,
            retry_after_ms: 2_000
        })
    );
    clock.advance(3_000);
    let d = b.permit(short).await.unwrap();
    assert_eq!(permit_wait(&d), Some(0), "the cooldown is over");
    // Exhaustion fails fast on the replica that saw it.
    let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let out = a.feedback("p", "m", 429, &[], Some(body)).await.unwrap();
    assert_eq!(out.feedback.class(), "exhausted");
    assert!(matches!(
        a.permit(PermitRequest::new("p", "m", 0)).await,
        Err(ProviderError::Exhausted { .. })
    ));
}

/// A provider answer's hint is data to clamp (SPEC §5): a 429 with
/// `Retry-After: 999999999` seen by one replica cools the key down for the
/// whole fleet for at most `max_cooldown_ms` (300 s by default), not 31
/// years; an operator's clear on one replica ends the cooldown and the
/// AIMD cut for every replica at once.
pub async fn provider_bad_hint_is_clamped_and_cleared<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let a = governor(store.clone(), &clock, 600, 60, Policy::Reject, 0, &[]);
    let b = governor(store, &clock, 600, 60, Policy::Reject, 0, &[]);
    let t0 = clock.now_ms();
    let out = a
        .feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    assert_eq!(out.feedback.retry_after_ms(), Some(300_000));
    assert_eq!(out.cooldown_until_ms, Some(t0 + 300_000));
    assert_eq!(out.effective_permille, Some(500));
    let refused = |retry_after_ms| {
        Some(Denial::Limited {
            limit: Limit::Cooldown,
            retry_after_ms,
        })
    };
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(
        d.denial().cloned(),
        refused(300_000),
        "the other replica too"
    );
    let st = b.status("p", "m").await.unwrap();
    assert_eq!(
        (
            st.cooldown_until_ms,
            st.cooldown_remaining_ms,
            st.effective_permille
        ),
        (Some(t0 + 300_000), 300_000, 500)
    );
    clock.advance(299_999);
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(d.denial().cloned(), refused(1));
    clock.advance(1);
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(permit_wait(&d), Some(0), "over after 300 s");

    // Another bad hint, then the operator clears it on replica a: replica
    // b's next permit is granted at once, at the full rate.
    clock.advance(5_000);
    a.feedback("p", "m", 429, &[("retry-after", "999999999")], None)
        .await
        .unwrap();
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    let out = a.clear("p", "m").await.unwrap();
    assert_eq!(out.cooldown_until_ms, Some(clock.now_ms() + 300_000));
    assert_eq!(
        out.effective_permille, 500,
        "recovered in the 300 s, halved again"
    );
    let d = b.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
    assert_eq!(
        d.grant().map(|p| (p.wait_ms, p.effective_permille)),
        Some((0, 1_000))
    );
    let st = b.status("p", "m").await.unwrap();
    assert_eq!(
        (
            st.cooldown_until_ms,
            st.cooldown_remaining_ms,
            st.effective_permille
        ),
        (None, 0, 1_000)
    );
}

/// A burst of 429s seen by five replicas at once halves the shared rate
/// once; the next halving needs another decrease interval (5 s); the
/// permits follow the lowered rate (capacity scales too) and it recovers
/// 5 % per quiet 10 s.
pub async fn provider_aimd_under_a_burst_of_429s<S: Store + Clone>(store: S, clock: FakeClock) {
    let replicas: Vec<_> = (0..5)
        .map(|_| governor(store.clone(), &clock, 600, 60, Policy::Block, 60_000, &[]))
        .collect();
    for r in &replicas {
        let out = r.feedback("p", "m", 429, &[], None).await.unwrap();
        assert_eq!(out.effective_permille, Some(500));
    }
    let g = &replicas[0];
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 500);
    // Half the rate: capacity 30, refill 5/s: call 31 waits 200 ms.
    for call in 1..=31u64 {
        let d = g.permit(PermitRequest::new("p", "m", 0)).await.unwrap();
        let expect = if call <= 30 { 0 } else { 200 };
        assert_eq!(permit_wait(&d), Some(expect), "call {call}");
    }
    clock.advance(5_000);
    for r in &replicas {
        assert_eq!(
            r.feedback("p", "m", 429, &[], None)
                .await
                .unwrap()
                .effective_permille,
            Some(250)
        );
    }
    clock.advance(10_000);
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 300);
    clock.advance(150_000);
    assert_eq!(g.effective_permille("p", "m").await.unwrap(), 1_000);
}

/// Tenant shares: a noisy tenant (share 0.25 of 600/min, burst 15) is held
/// to its share while a quiet tenant (share 0.5) still gets permits at
/// once: the pool (burst 60) is not drained by the noisy one.
pub async fn provider_tenant_shares_isolate<S: Store + Clone>(store: S, clock: FakeClock) {
    let g = governor(
        store,
        &clock,
        600,
        60,
        Policy::Reject,
        0,
        &[("noisy", 0.25), ("quiet", 0.5)],
    );
    let call = |tenant| PermitRequest {
        tenant: Some(tenant),
        ..PermitRequest::new("p", "m", 0)
    };
    let mut granted = 0;
    for _ in 0..100 {
        if g.permit(call("noisy")).await.unwrap().is_allowed() {
            granted += 1;
        }
    }
    assert_eq!(granted, 15, "the noisy tenant gets its share's burst");
    for n in 1..=30 {
        let d = g.permit(call("quiet")).await.unwrap();
        assert_eq!(permit_wait(&d), Some(0), "quiet call {n} runs at once");
    }
    // The pool held 60: 15 + 30 taken, 15 left for calls without a tenant.
    for n in 1..=15 {
        assert!(
            g.permit(PermitRequest::new("p", "m", 0))
                .await
                .unwrap()
                .is_allowed(),
            "pool call {n}"
        );
    }
    assert!(
        !g.permit(PermitRequest::new("p", "m", 0))
            .await
            .unwrap()
            .is_allowed()
    );
}
