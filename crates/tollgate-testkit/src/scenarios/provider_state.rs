//! The store's provider state (SPEC §5): AIMD, cooldowns and clearing a
//! provider key.

use tollgate_core::aimd::AimdParams;
use tollgate_core::store::{BucketTake, CooldownCheck, MultiTake};
use tollgate_core::{BucketSpec, Clock, FakeClock, Store};

/// AIMD (SPEC §5): a 429 halves the effective rate at most once per
/// decrease interval (a burst of 429s counts once), never below the floor;
/// each quiet increase interval adds 5 %, up to the configured rate; keys
/// are independent.
pub async fn aimd_halves_once_and_recovers<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let p = AimdParams::default();
    let k = "{prov:m}:aimd";
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000, "starts full");
    assert_eq!(s.aimd(k, p, true).await.unwrap(), 500);
    for step in [1_000, 3_999] {
        clock.advance(step);
        assert_eq!(s.aimd(k, p, true).await.unwrap(), 500, "counted once");
    }
    clock.advance(1); // 5,000 ms after the first halving
    assert_eq!(s.aimd(k, p, true).await.unwrap(), 250);
    assert_eq!(s.aimd("{prov:other}:aimd", p, false).await.unwrap(), 1_000);
    clock.advance(9_999);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 250);
    clock.advance(1);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 300, "+5 % per 10 s");
    clock.advance(140_000);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000, "back to full");
    for _ in 0..6 {
        s.aimd(k, p, true).await.unwrap();
        clock.advance(5_000);
    }
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 100, "the floor: 10 %");
    clock.advance(180_000);
    assert_eq!(s.aimd(k, p, false).await.unwrap(), 1_000);
}

/// The longest cooldown the scenarios allow (the config's ceiling: a day).
const MAX: u64 = 86_400_000;

/// A cooldown only grows; permits wait it out (block) or are refused with
/// the cooldown named, taking nothing.
pub async fn cooldown<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let now = clock.now_ms();
    let spec = BucketSpec::new(10, 1_000, 60).unwrap();
    assert_eq!(
        s.extend_cooldown("{p}:cd", 5_000, MAX).await.unwrap(),
        now + 5_000
    );
    assert_eq!(
        s.extend_cooldown("{p}:cd", 1_000, MAX).await.unwrap(),
        now + 5_000,
        "until = max(existing, now + for)"
    );
    let rpm = |max_wait_ms| BucketTake {
        key: "{p}:rpm",
        spec,
        cost: 60,
        max_wait_ms,
    };
    let cd = |max_wait_ms| {
        Some(CooldownCheck {
            key: "{p}:cd",
            max_wait_ms,
            max_ms: MAX,
        })
    };
    assert_eq!(
        s.take_many(&[rpm(0)], cd(2_000)).await.unwrap(),
        MultiTake::Refused {
            index: None,
            retry_after_ms: 3_000
        }
    );
    assert_eq!(
        s.take_many(&[rpm(0)], cd(10_000)).await.unwrap(),
        MultiTake::Granted { wait_ms: 5_000 },
        "the refusal took nothing: the full 60 were still there"
    );
    clock.advance(5_000);
    assert_eq!(
        s.take_many(&[rpm(10_000)], cd(0)).await.unwrap(),
        MultiTake::Granted { wait_ms: 1_000 },
        "cooldown over; 50 refilled of 60"
    );
}

/// Clearing a provider key (SPEC §5, the operator's tool after a bad hint):
/// one step removes its cooldown and puts its AIMD state back at the full
/// rate, answering what was live; its buckets and other keys are left
/// alone. An end of 0 reads a cooldown without changing it.
pub async fn clear_provider<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::store::ProviderCleared;

    let s = &store;
    let p = AimdParams::default();
    let (cd, aimd) = ("{prov:m}:cooldown", "{prov:m}:aimd");
    let now = clock.now_ms();
    assert_eq!(
        s.extend_cooldown(cd, 0, MAX).await.unwrap(),
        0,
        "none: reads 0"
    );
    assert_eq!(
        s.extend_cooldown(cd, 5_000, MAX).await.unwrap(),
        now + 5_000
    );
    assert_eq!(
        s.extend_cooldown(cd, 0, MAX).await.unwrap(),
        now + 5_000,
        "extending by 0 reads the cooldown"
    );
    assert_eq!(s.aimd(aimd, p, true).await.unwrap(), 500);
    // Another provider key, and a bucket of this one.
    let other = "{prov:other}:cooldown";
    s.extend_cooldown(other, 9_000, MAX).await.unwrap();
    let spec = BucketSpec::new(1, 1_000, 10).unwrap();
    let rpm = |cost| BucketTake {
        key: "{prov:m}:rpm",
        spec,
        cost,
        max_wait_ms: 0,
    };
    let cooldown = |max_wait_ms| {
        Some(CooldownCheck {
            key: cd,
            max_wait_ms,
            max_ms: MAX,
        })
    };
    assert_eq!(
        s.take_many(&[rpm(10)], cooldown(5_000)).await.unwrap(),
        MultiTake::Granted { wait_ms: 5_000 }
    );
    clock.advance(1_000);
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: Some(now + 5_000),
            effective_permille: 500
        }
    );
    assert_eq!(s.extend_cooldown(cd, 0, MAX).await.unwrap(), 0, "cleared");
    assert_eq!(s.aimd(aimd, p, false).await.unwrap(), 1_000, "full rate");
    assert_eq!(s.extend_cooldown(other, 0, MAX).await.unwrap(), now + 9_000);
    assert_eq!(
        s.take_many(&[rpm(10)], cooldown(0)).await.unwrap(),
        MultiTake::Refused {
            index: Some(0),
            retry_after_ms: 9_000
        },
        "the bucket is left alone: 1 of 10 refilled"
    );
    assert_eq!(
        s.take_many(&[rpm(1)], cooldown(0)).await.unwrap(),
        MultiTake::Granted { wait_ms: 0 },
        "and no cooldown to wait for"
    );
    // Cleared state is as if never written: the next 429 halves at once.
    assert_eq!(s.aimd(aimd, p, true).await.unwrap(), 500);
    clock.advance(10_000);
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: None,
            effective_permille: 550
        },
        "the rate as it was, recovering; no cooldown"
    );
    assert_eq!(
        s.clear_provider(cd, aimd, p).await.unwrap(),
        ProviderCleared {
            cooldown_until_ms: None,
            effective_permille: 1_000
        },
        "nothing left to clear"
    );
    // A cooldown that has passed is none.
    s.extend_cooldown(cd, 100, MAX).await.unwrap();
    clock.advance(100);
    assert_eq!(
        s.clear_provider(cd, aimd, p)
            .await
            .unwrap()
            .cooldown_until_ms,
        None
    );
}

/// A cooldown's length is the store's business (SPEC §5): it is set as a
/// duration from the store's own now, and an end stored further than the
/// key's ceiling (a ceiling lowered by a reload, or an end written before
/// this rule) counts as ending at the ceiling, for reads and for permits.
pub async fn cooldown_is_a_duration_capped_when_read<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let now = clock.now_ms();
    let cd = "{cap:m}:cd";
    assert_eq!(
        s.extend_cooldown(cd, 60_000, MAX).await.unwrap(),
        now + 60_000
    );
    // Read under a ceiling of 10 s: it ends at the ceiling (and stays so).
    assert_eq!(
        s.extend_cooldown(cd, 0, 10_000).await.unwrap(),
        now + 10_000
    );
    assert_eq!(s.extend_cooldown(cd, 0, MAX).await.unwrap(), now + 10_000);
    // A hint longer than the ceiling is the ceiling.
    assert_eq!(
        s.extend_cooldown(cd, 3_600_000, 20_000).await.unwrap(),
        now + 20_000
    );
    // A permit waits at most the ceiling for a cooldown stored longer.
    assert_eq!(
        s.extend_cooldown(cd, 50_000, MAX).await.unwrap(),
        now + 50_000
    );
    let spec = BucketSpec::new(10, 1_000, 60).unwrap();
    let rpm = BucketTake {
        key: "{cap:m}:rpm",
        spec,
        cost: 1,
        max_wait_ms: 0,
    };
    let check = |max_ms| {
        Some(CooldownCheck {
            key: cd,
            max_wait_ms: 0,
            max_ms,
        })
    };
    assert_eq!(
        s.take_many(&[rpm], check(5_000)).await.unwrap(),
        MultiTake::Refused {
            index: None,
            retry_after_ms: 5_000
        }
    );
    assert_eq!(
        s.take_many(&[rpm], check(MAX)).await.unwrap(),
        MultiTake::Refused {
            index: None,
            retry_after_ms: 50_000
        }
    );
}
