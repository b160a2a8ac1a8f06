//! Grouped session writes (SPEC §4): a session's record and the logs of
//! its group written in one step, and the logs' retention.

use tollgate_core::lease::{SessionAcquire, SessionGrant};
use tollgate_core::store::{
    AppendOutcome, LogWrite, SessionAppend, SessionAppended, SessionCreate, SessionCreated,
    SessionDelete,
};
use tollgate_core::{FakeClock, Store};

fn g(rest: &str) -> String {
    tollgate_core::store::grouped::grouped_name("grp", rest)
}

fn write<'a>(log: &'a str, record: Option<&'a [u8]>) -> LogWrite<'a> {
    LogWrite { log, record }
}

async fn records<S: Store>(s: &S, name: &str) -> Vec<Vec<u8>> {
    s.read_records(name, 0, 100).await.unwrap()
}

fn bytes(items: &[&[u8]]) -> Vec<Vec<u8>> {
    items.iter().map(|b| b.to_vec()).collect()
}

/// SPEC §4 grouped create: record 0 and the logs of the session's group in
/// one step, or nothing (busy while a holder holds the lease, exists once
/// it has records); the create issues a fence of its own, so an earlier
/// holder is stale; a log in another group is refused before anything is
/// written.
pub async fn session_create_writes_its_group_in_one_step<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let s = &store;
    let (sess, catalog, app) = (g("s1"), g("catalog"), g("app"));
    // A holder from before the create.
    assert!(matches!(
        s.session_acquire(&sess, "h1", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    assert!(s.session_release(&sess, "h1").await.unwrap());
    let logs = [write(&catalog, Some(b"c1")), write(&app, None)];
    let create = |session, record, logs| SessionCreate {
        session,
        record,
        logs,
    };
    assert_eq!(
        s.session_create(create(&sess, b"r0", &logs)).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0"]));
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    assert!(
        records(s, &app).await.is_empty(),
        "a log only refreshed is not created"
    );
    assert_eq!(
        s.append_fenced(&sess, 1, b"late").await.unwrap(),
        AppendOutcome::Stale { latest: 2 },
        "the create superseded the earlier holder"
    );
    // Exists: nothing written, not even the logs.
    let again = [write(&catalog, Some(b"c2")), write(&app, Some(b"a2"))];
    assert_eq!(
        s.session_create(create(&sess, b"r0'", &again))
            .await
            .unwrap(),
        SessionCreated::Exists
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0"]));
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    assert!(records(s, &app).await.is_empty());
    // Busy while a holder holds the lease: nothing written.
    let held = g("s2");
    assert!(matches!(
        s.session_acquire(&held, "turn", 30_000).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    clock.advance(10_000);
    assert_eq!(
        s.session_create(create(&held, b"r0", &again))
            .await
            .unwrap(),
        SessionCreated::Busy {
            retry_after_ms: 20_000
        }
    );
    assert!(records(s, &held).await.is_empty());
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1"]));
    // Once the lease is free (released or lapsed) the create goes ahead.
    clock.advance(20_000);
    let c2 = [write(&catalog, Some(b"c2"))];
    assert_eq!(
        s.session_create(create(&held, b"h0", &c2)).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    assert_eq!(records(s, &catalog).await, bytes(&[b"c1", b"c2"]));
    // A log of another group (or an ungrouped name) cannot be in the step.
    let lone = g("s3");
    let other = tollgate_core::store::grouped::grouped_name("other", "catalog");
    for bad in [other.as_str(), "catalog", lone.as_str()] {
        let logs = [write(bad, Some(b"x"))];
        let e = s
            .session_create(SessionCreate {
                session: &lone,
                record: b"r0",
                logs: &logs,
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol, "{bad}");
        assert!(records(s, bad).await.is_empty());
    }
    assert!(records(s, &lone).await.is_empty());
    assert_eq!(s.fence_check(&lone, 1).await.unwrap().latest, 0);
    // An ungrouped session is a group of its own: created alone.
    assert_eq!(
        s.session_create(create("plain", b"p0", &[])).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    assert_eq!(records(s, "plain").await, bytes(&[b"p0"]));
}

/// SPEC §4 retention of a log: a log written a record keeps the end its
/// record gave it after the records are deleted (the end never moves back),
/// so a lease taken on it later is kept to that end, past the grace.
pub async fn a_log_keeps_its_end_after_its_records_are_deleted<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_GRACE_MS as GRACE;
    let s = &store;
    let (sess, log) = (g("s1"), g("catalog"));
    let logs = [write(&log, Some(b"c1"))];
    assert_eq!(
        s.session_create(SessionCreate {
            session: &sess,
            record: b"r0",
            logs: &logs,
        })
        .await
        .unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    assert_eq!(s.delete_records(&log).await.unwrap(), 1);
    assert!(matches!(
        s.session_acquire(&log, "h", 1).await.unwrap(),
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    clock.advance(GRACE + 1);
    assert!(
        matches!(
            s.session_acquire(&log, "h", 1).await.unwrap(),
            SessionAcquire::Acquired(SessionGrant { fence: 2, .. })
        ),
        "kept for the retention its record gave it, not forgotten after the grace"
    );
}

/// SPEC §4 grouped append: checked in one step against the fence (stale
/// first), the session's existence, then the event id; a refused or
/// repeated append writes nothing, its logs included; ids are kept with
/// the records.
pub async fn session_append_is_fenced_and_once_per_id<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let s = &store;
    let (sess, user, app) = (g("s"), g("user"), g("app"));
    let append = |fence, id, record, logs| SessionAppend {
        session: &sess,
        fence,
        id,
        record,
        logs,
    };
    let deltas = |u: &'static [u8], a: &'static [u8]| [write(&user, Some(u)), write(&app, Some(a))];
    let fence_of = |a: SessionAcquire| match a {
        SessionAcquire::Acquired(g) => g.fence,
        busy => panic!("busy: {busy:?}"),
    };
    // Not created yet: missing, nothing written.
    let f1 = fence_of(s.session_acquire(&sess, "h1", 30_000).await.unwrap());
    let d1 = deltas(b"u0", b"a0");
    assert_eq!(
        s.session_append(append(f1, Some("e0"), b"e0", &d1))
            .await
            .unwrap(),
        SessionAppended::Missing
    );
    assert!(records(s, &sess).await.is_empty());
    assert!(records(s, &user).await.is_empty());
    assert!(s.session_release(&sess, "h1").await.unwrap());
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 2 }
    );
    let f3 = fence_of(s.session_acquire(&sess, "h2", 30_000).await.unwrap());
    assert_eq!(f3, 3);
    let d2 = deltas(b"u1", b"a1");
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1", &d2))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    // The same id again: nothing written, whatever it carries.
    let d3 = deltas(b"u1'", b"a1'");
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1'", &d3))
            .await
            .unwrap(),
        SessionAppended::Repeated
    );
    assert_eq!(records(s, &sess).await, bytes(&[b"r0", b"e1"]));
    assert_eq!(records(s, &user).await, bytes(&[b"u1"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1"]));
    // Without an id (or with an empty one), every append lands.
    for (id, index) in [(None, 2), (None, 3), (Some(""), 4), (Some(""), 5)] {
        assert_eq!(
            s.session_append(append(f3, id, b"x", &[])).await.unwrap(),
            SessionAppended::Appended { index },
            "{id:?}"
        );
    }
    // h2 stalls past its TTL; h3 takes the session over.
    clock.advance(30_001);
    let f4 = fence_of(s.session_acquire(&sess, "h3", 30_000).await.unwrap());
    assert_eq!(f4, 4);
    let d4 = deltas(b"late", b"late");
    assert_eq!(
        s.session_append(append(f3, Some("e2"), b"late", &d4))
            .await
            .unwrap(),
        SessionAppended::Stale { latest: 4 },
        "the old holder's deltas cannot land after the takeover"
    );
    assert_eq!(
        s.session_append(append(f3, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Stale { latest: 4 },
        "the fence is checked first"
    );
    assert_eq!(records(s, &user).await, bytes(&[b"u1"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1"]));
    let d5 = deltas(b"u2", b"a2");
    assert_eq!(
        s.session_append(append(f4, Some("e2"), b"e2", &d5))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 6 }
    );
    assert_eq!(records(s, &user).await, bytes(&[b"u1", b"u2"]));
    assert_eq!(records(s, &app).await, bytes(&[b"a1", b"a2"]));
    // The ids go with the records.
    assert_eq!(s.delete_records(&sess).await.unwrap(), 7);
    assert_eq!(
        s.session_append(append(f4, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Missing
    );
    assert!(s.session_release(&sess, "h3").await.unwrap());
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 5 }
    );
    let f6 = fence_of(s.session_acquire(&sess, "h4", 30_000).await.unwrap());
    assert_eq!(
        s.session_append(append(f6, Some("e1"), b"e1", &[]))
            .await
            .unwrap(),
        SessionAppended::Appended { index: 1 },
        "a deleted session's ids are forgotten"
    );
    let e = s
        .session_append(append(f6, Some("e9"), b"e9", &[write("elsewhere", None)]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol);
    assert_eq!(records(s, &sess).await, bytes(&[b"r0", b"e1"]));
}

/// SPEC §4 grouped delete: the records, the event ids and the logs in one
/// step; a session without records writes nothing; the fence counter stays.
pub async fn session_delete_writes_its_group_in_one_step<S: Store + Clone>(
    store: S,
    _clock: FakeClock,
) {
    let s = &store;
    let (sess, catalog) = (g("s"), g("catalog"));
    let gone = [write(&catalog, Some(b"deleted"))];
    let delete = SessionDelete {
        session: &sess,
        logs: &gone,
    };
    assert_eq!(s.session_delete(delete).await.unwrap(), 0);
    assert!(records(s, &catalog).await.is_empty(), "nothing to delete");
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[write(&catalog, Some(b"created"))],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    let append = SessionAppend {
        session: &sess,
        fence: 1,
        id: Some("e1"),
        record: b"e1",
        logs: &[],
    };
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    assert_eq!(s.session_delete(delete).await.unwrap(), 2);
    assert!(records(s, &sess).await.is_empty());
    assert_eq!(records(s, &catalog).await, bytes(&[b"created", b"deleted"]));
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Missing
    );
    assert_eq!(s.session_delete(delete).await.unwrap(), 0);
    assert_eq!(records(s, &catalog).await, bytes(&[b"created", b"deleted"]));
    assert_eq!(s.fence_check(&sess, 1).await.unwrap().latest, 1);
    let e = s
        .session_delete(SessionDelete {
            session: &sess,
            logs: &[write("elsewhere", Some(b"x"))],
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), tollgate_core::StoreErrorKind::Protocol);
}

/// SPEC §4 retention of logs: a log is a session like any other, kept for
/// the retention after its last write; a grouped write that only names it
/// (`record: None`) refreshes it.
pub async fn grouped_logs_live_as_long_as_they_are_written<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    use tollgate_core::store::DEFAULT_SESSION_RETENTION_MS as RETENTION;
    let s = &store;
    let (sess, kept, left) = (g("s"), g("kept"), g("left"));
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[write(&kept, Some(b"k")), write(&left, Some(b"l"))],
    };
    assert_eq!(
        s.session_create(create).await.unwrap(),
        SessionCreated::Created { fence: 1 }
    );
    clock.advance(RETENTION - 1_000);
    let append = SessionAppend {
        session: &sess,
        fence: 1,
        id: Some("e1"),
        record: b"e1",
        logs: &[write(&kept, None)],
    };
    assert_eq!(
        s.session_append(append).await.unwrap(),
        SessionAppended::Appended { index: 1 }
    );
    clock.advance(1_000);
    assert!(records(s, &left).await.is_empty(), "past its retention");
    assert_eq!(records(s, &kept).await, bytes(&[b"k"]), "refreshed");
    clock.advance(RETENTION - 1_001);
    assert_eq!(records(s, &kept).await, bytes(&[b"k"]));
    assert_eq!(records(s, &sess).await.len(), 2);
    clock.advance(1);
    assert!(records(s, &kept).await.is_empty());
    assert!(records(s, &sess).await.is_empty());
    // Forgotten with its records: the fence and the ids start again.
    assert_eq!(s.fence_check(&sess, 1).await.unwrap().latest, 0);
}
