//! A provider's cooldown is timed by the store's clock, not the replica's
//! (SPEC §5): a governor whose clock is minutes off Redis's `TIME` still
//! sets a 30 s hint as 30 s. (Before, the replica sent `its now + hint` as
//! the end: 5 minutes ahead made it 330 s; 5 minutes behind, none.)

use std::time::Duration;

use tollgate_core::{Clock, Decision, FakeClock, RateConfig, SystemClock};
use tollgate_provider::{
    PermitRequest, Policy, ProviderConfig, ProviderGovernor, ProvidersConfig, validate_providers,
};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{shared_url, unique_prefix};

fn book() -> tollgate_provider::ProviderBook {
    let mut cfg = ProvidersConfig::new();
    cfg.insert(
        "p:m".into(),
        ProviderConfig {
            kind: Some("openai".into()),
            requests: Some(RateConfig {
                amount: 600,
                period_ms: 60_000,
                burst: Some(10),
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
    validate_providers(&cfg).expect("valid")
}

#[tokio::test]
async fn a_replica_clock_minutes_off_moves_no_cooldown() {
    for skew_ms in [-300_000i64, 300_000] {
        // Redis's own clock (no override), a replica's minutes off it.
        let store = RedisStore::connect(
            RedisConfig::standalone(shared_url())
                .with_key_prefix(unique_prefix())
                .with_op_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("connect to the test redis");
        let replica = FakeClock::new(SystemClock.now_ms().saturating_add_signed(skew_ms));
        let g = ProviderGovernor::new(store, replica, book());
        let out = g
            .feedback("p", "m", 429, &[("retry-after", "30")], None)
            .await
            .expect("feedback");
        let until = out.cooldown_until_ms.expect("a cooldown");
        let redis_now = SystemClock.now_ms();
        assert!(
            until > redis_now + 25_000 && until <= redis_now + 30_000,
            "skew {skew_ms}: ends {} ms from Redis's now",
            until as i64 - redis_now as i64
        );
        match g
            .permit(PermitRequest::new("p", "m", 0))
            .await
            .expect("permit")
        {
            Decision::Denied(d) => {
                let hint = d.retry_after_ms().expect("a hint");
                assert!(
                    (25_000..=30_000).contains(&hint),
                    "skew {skew_ms}: hint {hint}"
                );
            }
            other => panic!("skew {skew_ms}: not refused: {other:?}"),
        }
    }
}
