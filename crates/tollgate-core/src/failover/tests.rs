use super::store::scale_spec;
use super::*;
use crate::BucketSpec;

#[test]
fn shares_scale_rates_and_caps_down_to_one() {
    let spec = BucketSpec::new(600, 60_000, 60).unwrap();
    let half = scale_spec(&spec, 0.5);
    assert_eq!((half.amount(), half.capacity()), (300, 30));
    let tiny = scale_spec(&spec, 0.001);
    assert_eq!((tiny.amount(), tiny.capacity()), (1, 1));
    assert_eq!(scale_spec(&spec, 1.0), spec);
}

#[test]
fn share_is_validated() {
    let clock = crate::FakeClock::new(0);
    let mem = MemoryStore::new(clock.clone());
    for bad in [0.0, -1.0, 1.5, f64::NAN] {
        let policy = FailurePolicy::FailOpen {
            fallback_share: bad,
        };
        assert!(Failover::new(mem.clone(), policy, clock.clone()).is_err());
    }
    assert!(Failover::new(mem, FailurePolicy::FailClosed, clock).is_ok());
}
