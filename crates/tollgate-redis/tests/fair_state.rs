//! A provider key's fair-sharing state in a real `redis-server`
//! (`take_many.lua`, SPEC §5): the state expires the window and 60 s after
//! its last write, as in memory, and its key's TTL is renewed only when it
//! would end before that;
//! the weights it keeps with its tenants follow a reload; odd tenant names
//! are held under `{others}`.

use std::time::Duration;

use tollgate_core::fair::{FairTake, OTHERS};
use tollgate_core::store::{BucketTake, FairCheck, MultiTake};
use tollgate_core::{BucketSpec, FakeClock, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{shared_url, unique_prefix};

const WINDOW: u64 = 4_000;

struct Key {
    store: RedisStore,
    clock: FakeClock,
    raw: redis::aio::MultiplexedConnection,
    state_key: String,
}

impl Key {
    async fn new() -> Self {
        let prefix = unique_prefix();
        let clock = FakeClock::new(1_000_000);
        let store = RedisStore::connect(
            RedisConfig::standalone(shared_url())
                .with_key_prefix(prefix.clone())
                .with_op_timeout(Duration::from_secs(2)),
        )
        .await
        .expect("connect to the test redis")
        .with_clock_override(clock.clone());
        let raw = redis::Client::open(shared_url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        Self {
            store,
            clock,
            raw,
            state_key: format!("{prefix}:k:{{p:m}}:fair"),
        }
    }

    /// A permit of `tenant` from a pool of 600 requests/min (burst 60).
    async fn permit(&self, tenant: &str, weights: &[(&str, u32)]) -> MultiTake {
        let spec = BucketSpec::new(600, 60_000, 60).expect("spec");
        self.permit_from(spec, tenant, weights).await
    }

    async fn permit_from(
        &self,
        spec: BucketSpec,
        tenant: &str,
        weights: &[(&str, u32)],
    ) -> MultiTake {
        let takes = [BucketTake {
            key: "{p:m}:rpm",
            spec,
            cost: 1,
            max_wait_ms: WINDOW,
        }];
        let fair = FairCheck {
            key: "{p:m}:fair",
            take: FairTake {
                tenant,
                weights,
                amount: spec.amount(),
                period_ms: spec.period_ms(),
                capacity: spec.capacity(),
                window_ms: WINDOW,
            },
        };
        self.store
            .take_many_fair(&takes, None, fair)
            .await
            .expect("take_many_fair")
    }

    async fn pttl(&mut self) -> i64 {
        redis::cmd("PTTL")
            .arg(&self.state_key)
            .query_async(&mut self.raw)
            .await
            .expect("PTTL")
    }

    async fn pexpire(&mut self, ms: u64) {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&self.state_key)
            .arg(ms)
            .query_async(&mut self.raw)
            .await
            .expect("PEXPIRE");
    }

    /// The tenants held, with their weights, from the state string
    /// ('<dddddd' header, then per tenant 'sdddd': name, weight, …).
    async fn held(&mut self) -> Vec<(String, f64)> {
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(&self.state_key)
            .query_async(&mut self.raw)
            .await
            .expect("GET");
        let double = |at: usize| f64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let n = double(16) as usize;
        let mut at = 48;
        let mut out = Vec::new();
        for _ in 0..n {
            let end = at + raw[at..].iter().position(|&b| b == 0).expect("NUL");
            let name = String::from_utf8(raw[at..end].to_vec()).expect("utf-8");
            out.push((name, double(end + 1)));
            at = end + 1 + 32;
        }
        assert_eq!(at, raw.len(), "the whole state read");
        out
    }
}

#[tokio::test]
async fn the_state_key_expiry_is_renewed_only_when_little_is_left() {
    let mut k = Key::new().await;
    assert!(matches!(
        k.permit("a", &[]).await,
        MultiTake::Granted { .. }
    ));
    let full = WINDOW as i64 + 90_000;
    let t = k.pttl().await;
    assert!(t > full - 5_000 && t <= full, "first write: PX {t}");
    // Written again well within its expiry: the TTL is kept as it is (a
    // short one set by hand shows it was not renewed).
    k.pexpire(20_000).await;
    k.clock.advance(10_000);
    assert!(matches!(
        k.permit("a", &[]).await,
        MultiTake::Granted { .. }
    ));
    let t = k.pttl().await;
    assert!(t > 0 && t <= 20_000, "kept: {t}");
    // Once the state's own expiry (its last write + the window + 60 s)
    // would pass the key's (at 1,094,000 ms), the write renews it.
    k.clock.advance(21_000);
    assert!(matches!(
        k.permit("a", &[]).await,
        MultiTake::Granted { .. }
    ));
    let t = k.pttl().await;
    assert!(t > full - 5_000 && t <= full, "renewed: {t}");
}

#[tokio::test]
async fn held_weights_follow_a_reload_and_odd_names_go_to_others() {
    let mut k = Key::new().await;
    let long = "n".repeat(129);
    for tenant in ["a", "b", long.as_str(), "c\u{1}"] {
        k.permit(tenant, &[("a", 3)]).await;
    }
    assert_eq!(
        k.held().await,
        [
            ("a".to_owned(), 3.0),
            ("b".to_owned(), 1.0),
            (OTHERS.to_owned(), 1.0)
        ]
    );
    // A reload: b now weighs 5 and a is no longer configured. The next
    // permit, of any tenant, looks every held weight up anew.
    k.permit("c", &[("b", 5)]).await;
    assert_eq!(
        k.held().await,
        [
            ("a".to_owned(), 1.0),
            ("b".to_owned(), 5.0),
            (OTHERS.to_owned(), 1.0),
            ("c".to_owned(), 1.0)
        ]
    );
}

#[tokio::test]
async fn a_flood_of_tenant_names_is_held_in_64_entries_and_others() {
    let mut k = Key::new().await;
    let names: Vec<String> = (0..70).map(|i| format!("t{i:02}")).collect();
    for name in &names {
        k.permit(name, &[("a", 2)]).await;
    }
    // A configured tenant always gets an entry of its own.
    k.permit("a", &[("a", 2)]).await;
    let held = k.held().await;
    let mut want: Vec<(String, f64)> = names[..64].iter().map(|n| (n.clone(), 1.0)).collect();
    want.push((OTHERS.to_owned(), 1.0));
    want.push(("a".to_owned(), 2.0));
    assert_eq!(held, want);
}

#[tokio::test]
async fn the_state_is_forgotten_the_window_and_a_minute_after_its_last_write() {
    let mut k = Key::new().await;
    // A pool of one request a minute: a's and b's finish tags stay ahead
    // of the clock for minutes, so only the expiry forgets them.
    let slow = BucketSpec::new(1, 60_000, 3).expect("spec");
    for tenant in ["a", "b", "a"] {
        k.permit_from(slow, tenant, &[]).await;
    }
    k.clock.advance(WINDOW + 60_000 - 1);
    k.permit_from(slow, "c", &[]).await;
    let names = |held: Vec<(String, f64)>| held.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(k.held().await), ["a", "b", "c"], "1 ms before");
    k.clock.advance(WINDOW + 60_000);
    k.permit_from(slow, "d", &[]).await;
    assert_eq!(names(k.held().await), ["d"]);
}
