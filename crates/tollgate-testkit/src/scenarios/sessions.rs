//! Session leases (SPEC §4): fencing, the per-user bound and retention.

use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::store::{AppendOutcome, FenceCheck};
use tollgate_core::{Clock, FakeClock, Limit, Store};

use super::{allowed, limited, limiter_with, support};

/// SPEC §4: fence numbers grow only for a new holder; busy with the remaining
/// TTL; compare-and-act renew/release; appends only at the latest number;
/// records in order; the counter survives record deletion.
pub async fn session_fencing<S: Store + Clone>(store: S, clock: FakeClock) {
    let s = &store;
    let now = clock.now_ms();
    assert_eq!(
        s.fence_check("sess", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 0
        }
    );
    assert!(matches!(
        s.append_fenced("sess", 0, b"x").await.unwrap(),
        AppendOutcome::Stale { latest: 0 }
    ));
    let g = s.session_acquire("sess", "h1", 30_000).await.unwrap();
    assert_eq!(
        g,
        SessionAcquire::Acquired(SessionGrant {
            fence: 1,
            expires_at_ms: now + 30_000
        })
    );
    assert_eq!(
        s.append_fenced("sess", 1, b"a").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
    assert_eq!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Busy {
            retry_after_ms: 30_000
        }
    );
    clock.advance(10_000);
    assert_eq!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Busy {
            retry_after_ms: 20_000
        }
    );
    assert_eq!(s.session_renew("sess", "h2", 30_000).await.unwrap(), None);
    assert!(!s.session_release("sess", "h2").await.unwrap());
    let renewed = s
        .session_renew("sess", "h1", 30_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.fence, 1);
    assert_eq!(renewed.expires_at_ms, clock.now_ms() + 30_000);
    // A refresh by the live holder keeps the number.
    assert!(matches!(
        s.session_acquire("sess", "h1", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    assert_eq!(
        s.append_fenced("sess", 1, b"b").await.unwrap(),
        AppendOutcome::Appended { index: 1 }
    );
    // h1 pauses past its TTL; h2 takes over.
    clock.advance(30_000);
    assert!(matches!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 2, .. })
    ));
    assert_eq!(
        s.append_fenced("sess", 1, b"late").await.unwrap(),
        AppendOutcome::Stale { latest: 2 },
        "a holder whose lease was taken over cannot write"
    );
    assert_eq!(
        s.fence_check("sess", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 2
        }
    );
    assert!(s.fence_check("sess", 2).await.unwrap().current);
    assert_eq!(
        s.append_fenced("sess", 2, b"c").await.unwrap(),
        AppendOutcome::Appended { index: 2 }
    );
    assert_eq!(s.session_renew("sess", "h1", 30_000).await.unwrap(), None);
    assert!(!s.session_release("sess", "h1").await.unwrap());
    let all = s.read_records("sess", 0, 100).await.unwrap();
    assert_eq!(all, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(
        s.read_records("sess", 1, 1).await.unwrap(),
        vec![b"b".to_vec()]
    );
    assert!(s.read_records("sess", 9, 10).await.unwrap().is_empty());
    assert!(s.read_records("other", 0, 10).await.unwrap().is_empty());
    assert!(s.session_release("sess", "h2").await.unwrap());
    // Released: the same holder acquiring again is a new grant.
    assert!(matches!(
        s.session_acquire("sess", "h2", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 3, .. })
    ));
    assert_eq!(s.delete_records("sess").await.unwrap(), 3);
    assert!(s.read_records("sess", 0, 10).await.unwrap().is_empty());
    assert!(s.session_release("sess", "h2").await.unwrap());
    assert!(matches!(
        s.session_acquire("sess", "h3", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 4, .. })
    ));
    assert!(matches!(
        s.append_fenced("sess", 3, b"z").await.unwrap(),
        AppendOutcome::Stale { latest: 4 }
    ));
    assert_eq!(
        s.append_fenced("sess", 4, b"d").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
}

/// SPEC §4 session bound: a user holds at most `max_sessions` session
/// claims; a new session past it is denied ([`Limit::Sessions`]) with the
/// time until the earliest claim ends, while an existing one is extended
/// and other users are unaffected. A claim that may only be extended
/// (renew, release) never creates one. Claims end `lease_ttl + grace +
/// slack` after their last extension.
pub async fn sessions_are_bounded_per_user<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::SessionsHeld;
    use tollgate_core::store::{CLAIM_SLACK_MS, DEFAULT_SESSION_GRACE_MS};
    let mut plan = support();
    plan.max_sessions = Some(3);
    let l = limiter_with(store, &clock, plan);
    let hold = 30_000 + DEFAULT_SESSION_GRACE_MS + CLAIM_SLACK_MS;
    let held = |sessions, claimed| SessionsHeld { sessions, claimed };
    for (i, s) in ["s1", "s2", "s3"].iter().enumerate() {
        let d = l.claim_session("u1", s, 30_000, true).await.unwrap();
        assert_eq!(allowed(&d), held(i as u32 + 1, true), "{s}");
    }
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(limited(&d), (Limit::Sessions, hold), "the 4th session");
    clock.advance(1_000);
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(limited(&d), (Limit::Sessions, hold - 1_000));
    // An existing session is extended, whatever the count.
    let d = l.claim_session("u1", "s1", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
    let d = l.claim_session("u1", "s2", 0, false).await.unwrap();
    assert_eq!(
        allowed(&d),
        held(3, true),
        "a release keeps its claim (never shortened)"
    );
    // Renewing or releasing a session that was never claimed claims nothing.
    let d = l.claim_session("u1", "ghost", 30_000, false).await.unwrap();
    assert_eq!(allowed(&d), held(3, false));
    // Another user has a bound of their own.
    let d = l.claim_session("u2", "s4", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(1, true));
    // s2's and s3's claims end at their hold; s1's, extended, a second later.
    clock.advance(hold - 1_000);
    let d = l.claim_session("u1", "s4", 30_000, true).await.unwrap();
    assert_eq!(
        allowed(&d),
        held(2, true),
        "s2's and s3's places are free again"
    );
    let d = l.claim_session("u1", "s5", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
    let d = l.claim_session("u1", "s6", 30_000, true).await.unwrap();
    assert_eq!(
        limited(&d),
        (Limit::Sessions, 1_000),
        "s1's claim ends first"
    );
    clock.advance(1_000);
    let d = l.claim_session("u1", "s6", 30_000, true).await.unwrap();
    assert_eq!(allowed(&d), held(3, true));
}

/// SPEC §4 retention: a session with no record (a lease and its fence
/// only) is kept until its lease's end (or its last operation) plus the
/// grace, then forgotten (its fence counter starts again at 1); one with a
/// record is kept for the retention, even after its records are deleted.
pub async fn sessions_without_records_are_kept_for_the_grace<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_GRACE_MS as GRACE;
    let s = &store;
    let fence = |n: u64| {
        SessionAcquire::Acquired(SessionGrant {
            fence: n,
            expires_at_ms: clock.now_ms() + 30_000,
        })
    };
    assert_eq!(
        s.session_acquire("bare", "h", 30_000).await.unwrap(),
        fence(1)
    );
    assert_eq!(
        s.session_acquire("kept", "h", 30_000).await.unwrap(),
        fence(1)
    );
    assert_eq!(
        s.append_fenced("kept", 1, b"r").await.unwrap(),
        AppendOutcome::Appended { index: 0 }
    );
    assert_eq!(
        s.session_acquire("freed", "h", 30_000).await.unwrap(),
        fence(1)
    );
    clock.advance(10_000);
    // Released at +10 s: what the acquire kept (the lease's end at +30 s
    // plus the grace) is never cut short.
    assert!(s.session_release("freed", "h").await.unwrap());
    clock.advance(20_000 + GRACE - 1);
    assert_eq!(s.fence_check("bare", 1).await.unwrap().latest, 1);
    assert_eq!(s.fence_check("freed", 1).await.unwrap().latest, 1);
    clock.advance(1);
    assert_eq!(s.fence_check("freed", 1).await.unwrap().latest, 0);
    assert_eq!(
        s.fence_check("bare", 1).await.unwrap(),
        FenceCheck {
            current: false,
            latest: 0
        },
        "forgotten"
    );
    assert_eq!(
        s.session_acquire("bare", "h2", 30_000).await.unwrap(),
        fence(1)
    );
    // The session with a record is kept for the retention.
    assert_eq!(s.fence_check("kept", 1).await.unwrap().latest, 1);
    assert_eq!(s.delete_records("kept").await.unwrap(), 1);
    clock.advance(GRACE + 30_000);
    assert_eq!(
        s.fence_check("kept", 1).await.unwrap().latest,
        1,
        "deleting its records keeps the counter for the retention"
    );
}
