use super::*;
use crate::FakeClock;
use crate::bucket::{self, BucketState, Take};
use crate::lease::{Admit, TurnParams};
use crate::store::{BucketRef, LogWrite};

fn params() -> TurnParams {
    TurnParams {
        turns: BucketSpec::new(20, 60_000, 5).unwrap(),
        max_runs: 2,
        lease_ttl_ms: 120_000,
        concurrency_retry_ms: 1_000,
    }
}

fn admit(store: &MemoryStore, user: &str, inv: &str) -> Admit {
    store
        .admit(TurnRequest {
            user,
            invocation_id: inv,
            params: params(),
            budgets: &[],
        })
        .expect("room")
        .admit
}

#[test]
fn idle_users_expire_and_are_swept() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::new(clock.clone());
    for i in 0..5_000 {
        let user = format!("u{i}");
        assert!(matches!(admit(&store, &user, "r"), Admit::Admitted { .. }));
        assert!(store.release_run(&user, "r").into_inner_ready().released());
    }
    assert_eq!(store.stats().users, 5_000);
    // The turn bucket is full again after 3 s, plus the 60 s grace.
    clock.advance(63_000);
    store.purge_expired();
    assert_eq!(store.stats().users, 0);
}

#[test]
fn a_write_sweeps_its_shard_after_a_minute() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::new(clock.clone());
    for i in 0..2_000 {
        let _ = admit(&store, &format!("u{i}"), "r");
    }
    // Leases keep the entries for 120 s.
    clock.advance(119_999);
    store.purge_expired();
    assert_eq!(store.stats().users, 2_000);
    clock.advance(61_000);
    // One write per shard triggers the minute sweep there.
    for i in 0..2_000 {
        let _ = admit(&store, &format!("v{i}"), "r");
    }
    assert_eq!(store.stats().users, 2_000, "old users swept, new kept");
}

#[test]
fn live_entries_survive_a_shrinking_sweep() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::new(clock.clone());
    for i in 0..20_000 {
        let user = format!("idle{i}");
        let _ = admit(&store, &user, "r");
        store.release_run(&user, "r").into_inner_ready();
    }
    clock.advance(30_000);
    let mut p = params();
    p.max_runs = 1;
    for i in 0..64 {
        let req = TurnRequest {
            user: &format!("busy{i}"),
            invocation_id: "r",
            params: p,
            budgets: &[],
        };
        assert!(matches!(
            store.admit(req).expect("room").admit,
            Admit::Admitted { .. }
        ));
    }
    // The idle users expire (3 s + 60 s grace); the sweep shrinks the
    // tables and must keep every busy user findable.
    clock.advance(70_000);
    store.purge_expired();
    assert_eq!(store.stats().users, 64);
    for i in 0..64 {
        let req = TurnRequest {
            user: &format!("busy{i}"),
            invocation_id: "other",
            params: p,
            budgets: &[],
        };
        assert!(
            matches!(store.admit(req).expect("room").admit, Admit::Denied(_)),
            "busy{i} still holds its only slot"
        );
    }
    assert_eq!(store.stats().users, 64);
}

#[test]
fn reads_do_not_create_entries() {
    let clock = FakeClock::new(1_000);
    let store = MemoryStore::new(clock);
    assert!(
        !store
            .release_run("ghost", "r")
            .into_inner_ready()
            .released()
    );
    assert_eq!(store.renew_run("ghost", "r", 10).into_inner_ready(), None);
    let spec = BucketSpec::new(1, 1, 1).unwrap();
    let st = store.user_state("ghost", spec, spec).into_inner_ready();
    assert_eq!(st.tokens_available, 1);
    assert_eq!(store.session_renew("s", "h", 10).into_inner_ready(), None);
    assert_eq!(
        store.stats(),
        MemoryStats {
            users: 0,
            sessions: 0,
            keys: 0
        }
    );
}

#[test]
fn sessions_are_kept_for_their_retention() {
    let clock = FakeClock::new(1_000);
    let store = MemoryStore::with_session_retention(clock.clone(), 10_000);
    let g = store.session_acquire("s", "h", 100).into_inner_ready();
    assert!(matches!(
        g,
        SessionAcquire::Acquired(SessionGrant { fence: 1, .. })
    ));
    // A record: the retention applies (without one, the grace would,
    // here cut to the retention).
    assert!(matches!(
        store.append_fenced("s", 1, b"r").into_inner_ready(),
        AppendOutcome::Appended { index: 0 }
    ));
    // Kept for the retention past the append (11,000), and never less
    // than the lease's end plus the grace the acquire gave it (11,100).
    clock.advance(10_099);
    assert_eq!(store.fence_check("s", 1).into_inner_ready().latest, 1);
    clock.advance(1);
    assert_eq!(store.fence_check("s", 1).into_inner_ready().latest, 0);
    store.purge_expired();
    assert_eq!(store.stats().sessions, 0);
}

fn small(clock: &FakeClock, max_entries: usize) -> MemoryStore {
    MemoryStore::with_config(
        clock.clone(),
        MemoryConfig {
            max_entries,
            ..MemoryConfig::default()
        },
    )
}

fn turn(store: &MemoryStore, user: &str, inv: &str) -> Result<Admit, StoreError> {
    store
        .admit_turn(TurnRequest {
            user,
            invocation_id: inv,
            params: params(),
            budgets: &[],
        })
        .into_result_ready()
        .map(|o| o.admit)
}

#[test]
fn past_max_entries_new_keys_are_refused_and_existing_ones_work() {
    let clock = FakeClock::new(1_000_000);
    let store = small(&clock, 3);
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = refused.clone();
    store.on_full(move |_op| {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    for u in ["a", "b", "c"] {
        assert!(matches!(turn(&store, u, "r1"), Ok(Admit::Admitted { .. })));
    }
    let e = turn(&store, "d", "r1").unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Full);
    assert!(!e.is_transient(), "a full store is not an outage");
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    assert_eq!(store.stats().total(), 3, "the refusal stored nothing");
    // Existing users keep working: a second run, renewals.
    assert!(matches!(
        turn(&store, "a", "r2"),
        Ok(Admit::Admitted { .. })
    ));
    assert!(
        store
            .renew_run("b", "r1", 1_000)
            .into_inner_ready()
            .is_some()
    );
    assert!(
        store
            .renew_run("c", "r1", 120_000)
            .into_inner_ready()
            .is_some()
    );
    // An operation that stores nothing needs no room.
    assert!(!store.release_run("d", "r1").into_inner_ready().released());
    assert_eq!(store.session_renew("s", "h", 10).into_inner_ready(), None);
    // A multi-key take with a new key changes nothing.
    let spec = BucketSpec::new(10, 1_000, 10).unwrap();
    let take = |key| BucketTake {
        key,
        spec,
        cost: 1,
        max_wait_ms: 0,
    };
    let e = store
        .take_many(&[take("k1"), take("k2")], None)
        .into_result_ready()
        .unwrap_err();
    assert!(e.is_full());
    assert_eq!(store.stats().keys, 0);
    // Live leases are never evicted: they expire (120 s) and make room.
    clock.advance(119_999);
    assert!(turn(&store, "d", "r1").is_err(), "all leases still live");
    clock.advance(2_000);
    assert!(matches!(
        turn(&store, "d", "r1"),
        Ok(Admit::Admitted { .. })
    ));
}

#[test]
fn the_bound_counts_every_table_and_sweeps_follow_it() {
    let clock = FakeClock::new(1_000_000);
    let store = small(&clock, 2);
    assert!(matches!(
        store.session_acquire("s1", "h", 1_000).into_result_ready(),
        Ok(SessionAcquire::Acquired(_))
    ));
    let spec = BucketSpec::new(10, 1_000, 10).unwrap();
    let take = TakeRequest {
        bucket: BucketRef::Named("k"),
        spec,
        cost: 1,
    };
    assert!(store.take_one(take).into_result_ready().is_ok());
    assert!(
        store
            .session_acquire("s2", "h", 1_000)
            .into_result_ready()
            .unwrap_err()
            .is_full()
    );
    // The bucket is full again after 100 ms (+ 60 s grace), the session
    // 1 s + 10 min later; at the bound a write sweeps its shard.
    clock.advance(61_000);
    store.purge_expired();
    assert_eq!(store.stats().total(), 1);
    assert!(
        store
            .session_acquire("s2", "h", 1_000)
            .into_result_ready()
            .is_ok()
    );
}

#[test]
fn a_grouped_write_needs_room_for_every_key_it_adds_and_only_those() {
    use crate::store::grouped::grouped_name;
    let clock = FakeClock::new(1_000_000);
    let store = small(&clock, 2);
    let (sess, log, other) = (
        grouped_name("g", "s"),
        grouped_name("g", "log"),
        grouped_name("g", "other"),
    );
    let write = |log, record| LogWrite { log, record };
    // Room for the session and one log: created.
    let create = SessionCreate {
        session: &sess,
        record: b"r0",
        logs: &[write(&log, Some(b"l")), write(&other, None)],
    };
    assert_eq!(
        store.session_create(create).into_inner_ready(),
        SessionCreated::Created { fence: 1 }
    );
    assert_eq!(store.stats().sessions, 2, "a refreshed log is not created");
    // At the bound, an append that only refreshes a missing log works…
    let append = |id, logs| SessionAppend {
        session: &sess,
        fence: 1,
        id: Some(id),
        record: b"e",
        logs,
    };
    let refresh = [write(&other, None)];
    assert_eq!(
        store
            .session_append(append("e1", &refresh))
            .into_inner_ready(),
        SessionAppended::Appended { index: 1 }
    );
    // …one that would add it is refused, and writes nothing at all.
    let add = [write(&log, Some(b"l2")), write(&other, Some(b"o"))];
    let e = store
        .session_append(append("e2", &add))
        .into_result_ready()
        .unwrap_err();
    assert!(e.is_full());
    let read = |name| store.read_records(name, 0, 10).into_inner_ready();
    assert_eq!(read(&sess).len(), 2);
    assert_eq!(read(&log), vec![b"l".to_vec()]);
    // A refused write needs no room: the repeated id is answered.
    assert_eq!(
        store.session_append(append("e1", &add)).into_inner_ready(),
        SessionAppended::Repeated
    );
}

trait ReadyExt: Future + Sized {
    fn into_result_ready(self) -> Self::Output {
        let mut fut = std::pin::pin!(self);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => panic!("MemoryStore futures are ready"),
        }
    }

    fn into_inner_ready(self) -> <Self::Output as Unwrap>::T
    where
        Self::Output: Unwrap,
    {
        let mut fut = std::pin::pin!(self);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out.unwrap_ok(),
            std::task::Poll::Pending => panic!("MemoryStore futures are ready"),
        }
    }
}
impl<F: Future> ReadyExt for F {}

trait Unwrap {
    type T;
    fn unwrap_ok(self) -> Self::T;
}
impl<T> Unwrap for Result<T, StoreError> {
    type T = T;
    fn unwrap_ok(self) -> T {
        self.expect("MemoryStore never fails")
    }
}

/// A bucket whose period does not fit the compact entry (49 days and more)
/// is kept whole, boxed: its takes go on as the bucket rules say, and a
/// key past the inline length is found again.
#[test]
fn a_long_period_bucket_and_a_long_key_keep_their_state() {
    let clock = FakeClock::new(1_000_000);
    let store = MemoryStore::new(clock.clone());
    let period = u64::from(u32::MAX) + 1;
    let spec = BucketSpec::new(3, period, 3).unwrap();
    for key in ["short", "{rls:tollgate:user_id=a-rather-long-value}"] {
        let take = |cost| BucketTake {
            key,
            spec,
            cost,
            max_wait_ms: 0,
        };
        assert_eq!(
            store.take_single(&take(2)).unwrap(),
            MultiTake::Granted { wait_ms: 0 }
        );
        // One token left; two more need a third of the period.
        let refused = store.take_single(&take(2)).unwrap();
        let expected = bucket::take(
            &spec,
            Some(BucketState {
                level: spec.capacity_scaled() - 2 * period as i64,
                ts: 1_000_000,
                period_ms: period,
            }),
            1_000_000,
            2,
            0,
        );
        let Take::Refused { retry_after_ms } = expected.outcome else {
            panic!("the model refuses too: {expected:?}");
        };
        assert_eq!(
            refused,
            MultiTake::Refused {
                index: Some(0),
                retry_after_ms
            },
            "{key}"
        );
        clock.advance(retry_after_ms);
        assert_eq!(
            store.take_single(&take(2)).unwrap(),
            MultiTake::Granted { wait_ms: 0 },
            "{key}"
        );
    }
    assert_eq!(store.stats().keys, 2);
}
