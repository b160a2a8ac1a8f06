//! The conformance suite (tollgate-testkit) against real Redis: a single
//! node and a 3-master cluster, each store on the fake clock and its own key
//! prefix.

use std::time::Duration;

use tollgate_core::FakeClock;
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{shared_cluster, shared_url, unique_prefix};

async fn connect(config: RedisConfig, clock: FakeClock) -> RedisStore {
    RedisStore::connect(
        config
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("connect to the test redis")
    .with_clock_override(clock)
}

mod standalone {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock| connect(
        RedisConfig::standalone(shared_url()),
        clock
    ));
}

mod cluster {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock| connect(
        RedisConfig::cluster(shared_cluster()),
        clock
    ));
}
