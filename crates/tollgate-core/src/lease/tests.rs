use super::*;

fn params() -> TurnParams {
    TurnParams {
        turns: BucketSpec::new(20, 60_000, 5).unwrap(),
        max_runs: 2,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    }
}

#[test]
fn lease_acquire_refresh_full_and_release_by_id() {
    let mut s = LeaseSet::default();
    assert_eq!(
        s.acquire(0, "a", 100, 2, 1_000),
        Acquire::Acquired {
            expires_at: 100,
            refreshed: false
        }
    );
    assert_eq!(
        s.acquire(10, "a", 100, 2, 1_000),
        Acquire::Acquired {
            expires_at: 110,
            refreshed: true
        }
    );
    let _ = s.acquire(20, "b", 100, 2, 1_000);
    // Full: earliest expiry 110 - 30 = 80 < 1,000.
    assert_eq!(
        s.acquire(30, "c", 100, 2, 1_000),
        Acquire::Full { retry_after_ms: 80 }
    );
    // Hint capped at concurrency_retry_ms.
    assert_eq!(
        s.acquire(30, "c", 100, 2, 50),
        Acquire::Full { retry_after_ms: 50 }
    );
    assert!(!s.release(30, "c"));
    assert!(s.release(30, "a"));
    assert!(!s.release(30, "a"));
    assert_eq!(s.len(), 1);
}

#[test]
fn renew_only_live_members_and_expiry_reclaims() {
    let mut s = LeaseSet::default();
    let _ = s.acquire(0, "a", 100, 1, 1_000);
    assert_eq!(s.renew(50, "a", 100), Some(150));
    assert_eq!(s.renew(50, "zz", 100), None);
    assert_eq!(s.renew(150, "a", 100), None, "expired at 150: lost");
    assert_eq!(s.len(), 0, "never re-added");
    let _ = s.acquire(200, "b", 100, 1, 1_000);
    assert_eq!(s.purge(300), 1);
    assert_eq!(s.expires_at(), None);
}

#[test]
fn admission_example_4_concurrency_charges_nothing() {
    let p = params();
    let mut leases = LeaseSet::default();
    let mut bucket = None;
    for id in ["r1", "r2"] {
        let t = admit_turn(&p, bucket, &mut leases, 0, id);
        assert!(matches!(t.outcome, Admit::Admitted { .. }));
        bucket = t.bucket.map(|b| b.0).or(bucket);
    }
    let level = bucket.unwrap().level;
    let t = admit_turn(&p, bucket, &mut leases, 0, "r3");
    assert_eq!(
        t.outcome,
        Admit::Denied(Denial::Limited {
            limit: Limit::Concurrency,
            retry_after_ms: 1_000
        })
    );
    assert_eq!(t.bucket.unwrap().0.level, level, "turn bucket not charged");
    assert!(leases.release(0, "r1"));
    let t = admit_turn(&p, bucket, &mut leases, 0, "r3");
    assert!(matches!(t.outcome, Admit::Admitted { .. }));
    // r2 abandoned: after its TTL a new turn gets in and it is reclaimed.
    let b = t.bucket.map(|b| b.0);
    let t = admit_turn(&p, b, &mut leases, 119_999, "r4");
    assert!(matches!(t.outcome, Admit::Denied(_)));
    leases.release(0, "r3");
    let t = admit_turn(&p, b, &mut leases, 120_000, "r4");
    assert!(matches!(t.outcome, Admit::Admitted { .. }));
    assert_eq!(t.reclaimed, 1);
}

#[test]
fn admission_refresh_is_not_charged() {
    let p = params();
    let mut leases = LeaseSet::default();
    let t = admit_turn(&p, None, &mut leases, 0, "r1");
    let b = t.bucket.unwrap().0;
    let t2 = admit_turn(&p, Some(b), &mut leases, 5, "r1");
    assert_eq!(
        t2.outcome,
        Admit::Admitted {
            lease_expires_at: 120_005,
            refreshed: true
        }
    );
    assert_eq!(t2.bucket, None);
}

#[test]
fn both_fail_reports_larger_hint_ties_concurrency() {
    let mut p = params();
    p.max_runs = 1;
    let mut leases = LeaseSet::default();
    let empty = Some(BucketState {
        level: 0,
        ts: 0,
        period_ms: 60_000,
    });
    let _ = leases.acquire(0, "x", 120_000, 1, 1_000);
    // Turn hint 3,000 > concurrency hint 1,000.
    let t = admit_turn(&p, empty, &mut leases, 0, "y");
    assert_eq!(t.outcome.denial_limit(), Some(Limit::TurnRate));
    // Tie: turn hint 1,000 (2/3 token refilled) vs concurrency 1,000.
    let t = admit_turn(&p, empty, &mut leases, 2_000, "y");
    assert_eq!(t.outcome.denial_limit(), Some(Limit::Concurrency));
    assert_eq!(t.bucket.unwrap().0.level, 40_000, "nothing taken");
}

impl Admit {
    fn denial_limit(&self) -> Option<Limit> {
        match self {
            Admit::Denied(d) => Some(d.limit()),
            _ => None,
        }
    }
}

#[test]
fn session_fencing() {
    let mut s = SessionLease::default();
    assert!(!s.fence_is_current(0));
    let g = s.acquire(0, "h1", 100);
    assert_eq!(
        g,
        SessionAcquire::Acquired(SessionGrant {
            fence: 1,
            expires_at_ms: 100
        })
    );
    // Refresh by the live holder keeps the number.
    assert!(matches!(s.acquire(10, "h1", 100), SessionAcquire::Acquired(g) if g.fence == 1));
    assert_eq!(
        s.acquire(20, "h2", 100),
        SessionAcquire::Busy { retry_after_ms: 90 }
    );
    assert_eq!(s.renew(20, "h2", 100), None);
    assert!(!s.release(20, "h2"));
    // h1's lease lapses; h2 takes over with a new number.
    assert!(matches!(s.acquire(110, "h2", 100), SessionAcquire::Acquired(g) if g.fence == 2));
    assert!(!s.fence_is_current(1));
    assert!(s.fence_is_current(2));
    assert_eq!(s.renew(120, "h1", 100), None);
    assert!(s.release(120, "h2"));
    // The same holder acquiring again after release is a new grant.
    assert!(matches!(s.acquire(130, "h2", 100), SessionAcquire::Acquired(g) if g.fence == 3));
}
