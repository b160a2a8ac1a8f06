//! `FencedSessionService`: the same CRUD scenario observed on adk's
//! `InMemorySessionService` and on the fenced service (memory store, Redis
//! node, Redis cluster) must give the same results; event appends are
//! refused without the session's current fence.

mod scenario;
mod support;

use std::collections::HashMap;
use std::sync::Arc;

use adk_core::{AdkError, ErrorCategory};
use adk_session::{CreateRequest, InMemorySessionService, SessionService};
use chrono::{DateTime, Utc};
use scenario::*;
use serde_json::{Value, json};
use support::APP;
use tollgate_adk::{FenceError, FencedSessionService, session_key, with_fence};
use tollgate_core::{FakeClock, MemoryStore, Store};

use tollgate_testkit::faulty::Faulty;

on_every_store!(
    crud_matches_in_memory,
    append_without_a_fence_is_not_held,
    append_with_another_sessions_fence_is_not_held,
    append_with_a_superseded_fence_is_stale,
    create_refuses_an_existing_or_leased_session,
    get_of_a_missing_session_is_not_found,
    append_after_delete_is_not_found_and_leaves_nothing,
    shared_state_outlives_retention_while_sessions_are_used,
    corrupt_record_is_an_internal_error,
    generated_ids_and_delete_all,
    create_is_all_or_nothing_whichever_call_fails,
    append_is_all_or_nothing_and_its_retry_lands_once,
    a_repeated_event_id_appends_nothing,
    a_stale_turn_cannot_land_app_or_user_deltas,
    nothing_of_a_turn_lands_after_a_takeover_between_its_calls,
);

async fn crud_matches_in_memory<S: Store + Clone>(store: S, clock: FakeClock) {
    let fenced = FencedSessionService::new(store.clone(), clock.clone());
    let got = scenario(&fenced, &store, &no_db).await;
    let reference = scenario(
        &InMemorySessionService::new(),
        &MemoryStore::new(clock.clone()),
        &no_db,
    )
    .await;
    assert_eq!(got.len(), reference.len());
    for ((label, got), (_, want)) in got.iter().zip(&reference) {
        assert_eq!(got, want, "{label}");
    }
    // Spot checks that the scenario says what it should.
    let s1 = &got.iter().find(|(l, _)| *l == "get s1").expect("get s1").1;
    assert_eq!(
        s1["state"],
        json!({"app:theme": "light", "app:version": 2, "user:lang": "fr", "user:tz": "UTC",
               "topic": "go", "mood": "ok"})
    );
    assert_eq!(s1["events"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        s1["events"][1]["actions"]["state_delta"],
        json!({"topic": "go", "app:version": 2, "user:tz": "UTC"}),
        "stored without its temp: key"
    );
    let listed = &got.iter().find(|(l, _)| *l == "list u1").expect("list").1;
    assert_eq!(listed[0]["id"], "s2");
    assert_eq!(listed[1]["id"], "s1");
    let missing = &got
        .iter()
        .find(|(l, _)| *l == "get s1 after delete")
        .expect("get after delete")
        .1;
    assert_eq!(missing["error"]["code"], "session.not_found");
}

fn fence_error(e: &AdkError) -> FenceError {
    FenceError::find_in(e)
        .unwrap_or_else(|| panic!("no FenceError in {e:?}"))
        .clone()
}

async fn events_of<S: Store>(svc: &FencedSessionService<S>, user: &str, id: &str) -> Vec<String> {
    svc.get(get(user, id))
        .await
        .expect("get")
        .events()
        .all()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

async fn append_without_a_fence_is_not_held<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store, clock);
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let e = svc
        .append_event_for_identity(append("u1", "s1", event("e1", "user", "x", 1, &[])))
        .await
        .expect_err("no fence");
    assert_eq!(e.code, "session.fence_not_held");
    assert_eq!(e.category, ErrorCategory::Forbidden);
    assert_eq!(
        fence_error(&e),
        FenceError::NotHeld {
            session: session_key(APP, "u1", "s1")
        }
    );
    let e = svc
        .append_event("s1", event("e2", "user", "x", 2, &[]))
        .await
        .expect_err("no fence");
    assert_eq!(e.code, "session.fence_not_held");
    assert_eq!(
        fence_error(&e),
        FenceError::NotHeld {
            session: "s1".into()
        }
    );
    assert!(events_of(&svc, "u1", "s1").await.is_empty());
}

async fn append_with_another_sessions_fence_is_not_held<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let svc = FencedSessionService::new(store.clone(), clock);
    for (user, id) in [("u1", "s1"), ("u1", "s2"), ("u2", "s1")] {
        svc.create(create(user, id, HashMap::new()))
            .await
            .expect("create");
    }
    let other = lease(&store, "u1", "s2", "turn").await;
    let e = with_fence(
        other.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "x", 1, &[]))),
    )
    .await
    .expect_err("fence of s2");
    assert_eq!(
        fence_error(&e),
        FenceError::NotHeld {
            session: session_key(APP, "u1", "s1")
        }
    );
    let e = with_fence(
        other,
        svc.append_event("s1", event("e2", "user", "x", 2, &[])),
    )
    .await
    .expect_err("fence of s2, by session id");
    assert_eq!(
        fence_error(&e),
        FenceError::NotHeld {
            session: "s1".into()
        }
    );
    // Same session id, another user: not the same session.
    let theirs = lease(&store, "u2", "s1", "turn").await;
    let e = with_fence(
        theirs.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e3", "user", "x", 3, &[]))),
    )
    .await
    .expect_err("fence of u2's s1");
    assert_eq!(e.code, "session.fence_not_held");
    // `append_event` by id goes to the fence's own session: u2's s1.
    with_fence(
        theirs,
        svc.append_event("s1", event("e4", "user", "x", 4, &[])),
    )
    .await
    .expect("u2's s1 under its own fence");
    assert!(events_of(&svc, "u1", "s1").await.is_empty());
    assert_eq!(events_of(&svc, "u2", "s1").await, ["e4"]);
}

async fn append_with_a_superseded_fence_is_stale<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store.clone(), clock.clone());
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let old = lease(&store, "u1", "s1", "turn-a").await;
    with_fence(
        old.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "a", 1, &[]))),
    )
    .await
    .expect("first holder appends");

    // The first holder stalls past its TTL; a second takes the session.
    clock.advance(TURN_TTL_MS + 1);
    let new = lease(&store, "u1", "s1", "turn-b").await;
    assert_eq!(new.fence, old.fence + 1);

    for e in [
        with_fence(
            old.clone(),
            svc.append_event_for_identity(append(
                "u1",
                "s1",
                event("e2", "assistant", "late", 2, &[("app:leak", json!(1))]),
            )),
        )
        .await
        .expect_err("stale"),
        with_fence(
            old.clone(),
            svc.append_event("s1", event("e2", "assistant", "late", 2, &[])),
        )
        .await
        .expect_err("stale, by session id"),
    ] {
        assert_eq!(e.code, "session.fence_stale");
        assert_eq!(
            fence_error(&e),
            FenceError::Stale {
                fence: old.fence,
                latest: new.fence
            }
        );
    }
    assert_eq!(events_of(&svc, "u1", "s1").await, ["e1"]);

    with_fence(
        new,
        svc.append_event_for_identity(append("u1", "s1", event("e3", "user", "b", 3, &[]))),
    )
    .await
    .expect("the new holder appends");
    let session = svc.get(get("u1", "s1")).await.expect("get");
    let ids: Vec<String> = session.events().all().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["e1", "e3"]);
    assert_eq!(
        session.state().get("app:leak"),
        None,
        "a refused event changes no state"
    );
}

async fn create_refuses_an_existing_or_leased_session<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let svc = FencedSessionService::new(store.clone(), clock);
    svc.create(create("u1", "s1", state(&[("k", json!(1))])))
        .await
        .expect("create");
    let e = svc
        .create(create("u1", "s1", state(&[("k", json!(2))])))
        .await
        .err()
        .expect("exists");
    assert_eq!(e.code, "session.already_exists");
    assert!(e.message.contains("s1"), "{}", e.message);
    let s = svc.get(get("u1", "s1")).await.expect("get");
    assert_eq!(s.state().get("k"), Some(json!(1)), "the first one is kept");
    assert_eq!(
        svc.list(list("u1", None, None)).await.expect("list").len(),
        1
    );

    // A session a turn holds cannot be created under it.
    let held = lease(&store, "u1", "s2", "turn").await;
    let e = svc
        .create(create("u1", "s2", HashMap::new()))
        .await
        .err()
        .expect("busy");
    assert_eq!(e.code, "session.busy");
    release(&store, &held, "turn").await;
    svc.create(create("u1", "s2", HashMap::new()))
        .await
        .expect("created once free");
    // The turn's old fence is superseded by the create's lease.
    let e = with_fence(
        held,
        svc.append_event_for_identity(append("u1", "s2", event("e1", "user", "x", 1, &[]))),
    )
    .await
    .expect_err("stale");
    assert_eq!(e.code, "session.fence_stale");
}

async fn get_of_a_missing_session_is_not_found<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store, clock);
    let e = svc.get(get("u1", "nope")).await.err().expect("missing");
    assert_eq!(e.code, "session.not_found");
    assert_eq!(e.category, ErrorCategory::NotFound);
    assert!(e.is_not_found());
    let e = svc
        .get_for_identity(&identity("u1", "nope"))
        .await
        .err()
        .expect("missing");
    assert_eq!(e.code, "session.not_found");
    svc.delete(delete("u1", "nope"))
        .await
        .expect("delete of nothing");
    assert!(
        svc.list(list("u1", None, None))
            .await
            .expect("list")
            .is_empty()
    );
}

async fn append_after_delete_is_not_found_and_leaves_nothing<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let svc = FencedSessionService::new(store.clone(), clock);
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let fence = lease(&store, "u1", "s1", "turn").await;
    with_fence(
        fence.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "x", 1, &[]))),
    )
    .await
    .expect("append");
    svc.delete_for_identity(&identity("u1", "s1"))
        .await
        .expect("delete while the turn runs");
    let e = with_fence(
        fence.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e2", "user", "x", 2, &[]))),
    )
    .await
    .expect_err("deleted");
    assert_eq!(e.code, "session.not_found");
    assert_eq!(
        store
            .read_records(&fence.session_key, 0, 10)
            .await
            .expect("read")
            .len(),
        0,
        "the lone event was removed"
    );
    assert!(svc.get(get("u1", "s1")).await.is_err());
    release(&store, &fence, "turn").await;
    let s = svc
        .create(create("u1", "s1", HashMap::new()))
        .await
        .expect("created again");
    assert!(s.events().is_empty());
    assert_eq!(
        svc.list(list("u1", None, None)).await.expect("list").len(),
        1
    );
}

/// The catalog and the app and user state are written once, then only
/// sessions are used: they must not expire with the 7-day retention.
async fn shared_state_outlives_retention_while_sessions_are_used<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    const DAY: u64 = 24 * 3_600_000;
    let svc = FencedSessionService::new(store.clone(), clock.clone());
    svc.create(create(
        "u1",
        "s1",
        state(&[("app:a", json!(1)), ("user:u", json!(2))]),
    ))
    .await
    .expect("create");
    for n in 1..=3 {
        clock.advance(5 * DAY);
        let fence = lease(&store, "u1", "s1", &format!("turn-{n}")).await;
        with_fence(
            fence.clone(),
            svc.append_event_for_identity(append(
                "u1",
                "s1",
                event(&format!("e{n}"), "user", "x", n, &[]),
            )),
        )
        .await
        .expect("append");
        release(&store, &fence, &format!("turn-{n}")).await;
    }
    clock.advance(5 * DAY);
    let s = svc.get(get("u1", "s1")).await.expect("get after 20 days");
    assert_eq!(s.events().len(), 3);
    assert_eq!(s.state().get("app:a"), Some(json!(1)));
    assert_eq!(s.state().get("user:u"), Some(json!(2)));
    let listed = svc.list(list("u1", None, None)).await.expect("list");
    assert_eq!(listed.len(), 1, "still in the catalog");
}

async fn corrupt_record_is_an_internal_error<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store.clone(), clock);
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let fence = lease(&store, "u1", "s1", "turn").await;
    store
        .append_fenced(&fence.session_key, fence.fence, b"{not json")
        .await
        .expect("append raw");
    let e = svc.get(get("u1", "s1")).await.err().expect("corrupt");
    assert_eq!(e.code, "session.corrupt_record");
    assert_eq!(e.category, ErrorCategory::Internal);
    assert!(e.message.contains(&fence.session_key), "{}", e.message);
    let e = svc
        .list(list("u1", None, None))
        .await
        .err()
        .expect("corrupt");
    assert_eq!(e.code, "session.corrupt_record");
}

async fn generated_ids_and_delete_all<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store, clock.clone());
    let mut ids = Vec::new();
    for _ in 0..3 {
        let s = svc
            .create(CreateRequest {
                session_id: None,
                ..create("u1", "unused", HashMap::new())
            })
            .await
            .expect("create");
        assert!(!s.id().is_empty());
        assert_eq!(s.last_update_time(), clock_time(&clock));
        ids.push(s.id().to_owned());
        clock.advance(1_000);
    }
    svc.create(create("u2", "kept", HashMap::new()))
        .await
        .expect("create");
    let listed: Vec<String> = svc
        .list(list("u1", None, None))
        .await
        .expect("list")
        .iter()
        .map(|s| s.id().to_owned())
        .collect();
    ids.reverse();
    assert_eq!(listed, ids, "newest first");
    svc.delete_all_sessions(APP, "u1")
        .await
        .expect("delete all");
    assert!(
        svc.list(list("u1", None, None))
            .await
            .expect("list")
            .is_empty()
    );
    for id in &ids {
        assert!(svc.get(get("u1", id)).await.is_err());
    }
    assert!(svc.get(get("u2", "kept")).await.is_ok());
}

fn clock_time(clock: &FakeClock) -> DateTime<Utc> {
    use tollgate_core::Clock;
    DateTime::from_timestamp_millis(i64::try_from(clock.now_ms()).expect("ms")).expect("time")
}

/// What a clean reader sees of session `id` of `user` and of the app and
/// user keys `key` a create or append of it sets: (the session exists, it
/// is listed, its events, the app key through `probe` (another user's
/// session), the user key through `own` (a session of the same user)).
async fn observe_all<S: Store + Clone>(
    store: &S,
    clock: &FakeClock,
    user: &str,
    id: &str,
    key: &str,
) -> (bool, bool, usize, bool, bool) {
    let svc = FencedSessionService::new(store.clone(), clock.clone());
    let session = svc.get(get(user, id)).await;
    let listed = svc
        .list(list(user, None, None))
        .await
        .expect("list")
        .iter()
        .any(|s| s.id() == id);
    let app = svc.get(get("probe", "probe")).await.expect("probe");
    let own = svc.get(get(user, "own")).await.expect("own");
    (
        session.is_ok(),
        listed,
        session.map_or(0, |s| s.events().len()),
        app.state().get(&format!("app:{key}")).is_some(),
        own.state().get(&format!("user:{key}")).is_some(),
    )
}

/// A create fails at its k-th store call, for every k (the call never
/// made, or made with its answer lost): afterwards a clean reader sees the
/// session, its catalog entry and its app and user state all, or none.
async fn create_is_all_or_nothing_whichever_call_fails<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let clean = FencedSessionService::new(store.clone(), clock.clone());
    clean
        .create(create("probe", "probe", HashMap::new()))
        .await
        .expect("probe");
    let mut faults = 0;
    for lost_reply in [false, true] {
        for k in 1.. {
            let user = format!("u-{lost_reply}-{k}");
            clean
                .create(create(&user, "own", HashMap::new()))
                .await
                .expect("own");
            let key = format!("k{lost_reply}{k}");
            let (app_key, user_key) = (format!("app:{key}"), format!("user:{key}"));
            let faulty = Faulty::new(store.clone(), k, lost_reply);
            let svc = FencedSessionService::new(faulty.clone(), clock.clone());
            let r = svc
                .create(create(
                    &user,
                    "s1",
                    state(&[
                        (&app_key, json!(1)),
                        (&user_key, json!(1)),
                        ("topic", json!("x")),
                    ]),
                ))
                .await;
            let seen = observe_all(&store, &clock, &user, "s1", &key).await;
            let all = (true, true, 0, true, true);
            let none = (false, false, 0, false, false);
            assert!(
                seen == all || seen == none,
                "k {k}, lost reply {lost_reply}: {seen:?}"
            );
            if r.is_ok() {
                assert_eq!(seen, all, "k {k}");
            }
            if !faulty.fired() {
                assert!(r.is_ok(), "no fault, k {k}: {:?}", r.err());
                break;
            }
            faults += 1;
            assert!(r.is_err(), "k {k}: the fault is reported");
            if lost_reply && seen == all {
                // The store did it; a retry says so.
                let e = clean
                    .create(create(&user, "s1", HashMap::new()))
                    .await
                    .err()
                    .expect("exists");
                assert_eq!(e.code, "session.already_exists");
            }
        }
    }
    assert!(faults >= 2, "each mode failed at least one call");
}

/// An append fails at its k-th store call, for every k: a clean reader sees
/// the event and its session, app and user changes all, or none; retried
/// with the same event, it is there exactly once.
async fn append_is_all_or_nothing_and_its_retry_lands_once<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    let clean = FencedSessionService::new(store.clone(), clock.clone());
    clean
        .create(create("probe", "probe", HashMap::new()))
        .await
        .expect("probe");
    for lost_reply in [false, true] {
        for k in 1.. {
            let user = format!("u-{lost_reply}-{k}");
            for id in ["own", "s1"] {
                clean
                    .create(create(&user, id, HashMap::new()))
                    .await
                    .expect("create");
            }
            let key = format!("k{lost_reply}{k}");
            let (app_key, user_key) = (format!("app:{key}"), format!("user:{key}"));
            let e1 = event(
                "e1",
                "assistant",
                "hi",
                1,
                &[(&app_key, json!(1)), (&user_key, json!(1))],
            );
            let fence = lease(&store, &user, "s1", "turn").await;
            let faulty = Faulty::new(store.clone(), k, lost_reply);
            let svc = FencedSessionService::new(faulty.clone(), clock.clone());
            let r = with_fence(
                fence.clone(),
                svc.append_event_for_identity(append(&user, "s1", e1.clone())),
            )
            .await;
            let seen = observe_all(&store, &clock, &user, "s1", &key).await;
            let all = (true, true, 1, true, true);
            let none = (true, true, 0, false, false);
            assert!(
                seen == all || seen == none,
                "k {k}, lost reply {lost_reply}: {seen:?}"
            );
            // The turn retries the append it could not confirm.
            with_fence(
                fence.clone(),
                clean.append_event_for_identity(append(&user, "s1", e1)),
            )
            .await
            .expect("retry");
            assert_eq!(
                observe_all(&store, &clock, &user, "s1", &key).await,
                all,
                "k {k}: once"
            );
            release(&store, &fence, "turn").await;
            if !faulty.fired() {
                assert!(r.is_ok(), "no fault, k {k}: {:?}", r.err());
                break;
            }
            assert!(r.is_err(), "k {k}: the fault is reported");
        }
    }
}

/// adk event ids are unique: an append of an id the session holds already
/// answers `Ok` and changes nothing (not the events, not any state).
async fn a_repeated_event_id_appends_nothing<S: Store + Clone>(store: S, clock: FakeClock) {
    let svc = FencedSessionService::new(store.clone(), clock);
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let fence = lease(&store, "u1", "s1", "turn").await;
    let delta = |v: i64| {
        [
            ("count", json!(v)),
            ("user:count", json!(v)),
            ("app:count", json!(v)),
        ]
    };
    with_fence(fence.clone(), async {
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "a", 1, &delta(1))))
            .await
            .expect("e1");
        // The same id again, by both methods, with other content.
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "b", 2, &delta(2))))
            .await
            .expect("e1 again is Ok");
        svc.append_event("s1", event("e1", "user", "c", 3, &delta(3)))
            .await
            .expect("e1 again by session id is Ok");
        svc.append_event("s1", event("e2", "user", "d", 4, &[]))
            .await
            .expect("e2");
    })
    .await;
    let s = svc.get(get("u1", "s1")).await.expect("get");
    let texts: Vec<String> = s
        .events()
        .all()
        .iter()
        .map(|e| {
            let content = e.llm_response.content.as_ref().expect("content");
            serde_json::to_value(content).expect("json")["parts"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned()
        })
        .collect();
    assert_eq!(texts, ["a", "d"], "e1 once, as first written");
    for k in ["count", "user:count", "app:count"] {
        assert_eq!(s.state().get(k), Some(json!(1)), "{k}");
    }
    assert_eq!(
        store
            .read_records(&fence.session_key, 0, 100)
            .await
            .expect("read")
            .len(),
        3,
        "record 0, e1, e2"
    );
}

/// Two replicas: a turn on one stalls past its lease, a turn on the other
/// takes the session. From the moment the second holds the lease, nothing
/// of the first lands: not its events, not their app or user deltas.
async fn a_stale_turn_cannot_land_app_or_user_deltas<S: Store + Clone>(store: S, clock: FakeClock) {
    let one = FencedSessionService::new(store.clone(), clock.clone());
    let two = FencedSessionService::new(store.clone(), clock.clone());
    one.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    one.create(create("u2", "other", HashMap::new()))
        .await
        .expect("create");
    let set = |v: &str| {
        vec![
            ("app:owner", json!(v)),
            ("user:owner", json!(v)),
            ("owner", json!(v)),
        ]
    };
    let a = lease(&store, "u1", "s1", "turn-a").await;
    with_fence(
        a.clone(),
        one.append_event_for_identity(append("u1", "s1", event("e1", "user", "x", 1, &set("a")))),
    )
    .await
    .expect("a holds the lease");
    clock.advance(TURN_TTL_MS + 1);
    let b = lease(&store, "u1", "s1", "turn-b").await;
    // b holds the session and has written nothing yet: a's late writes,
    // with new deltas or a repeated id, all fail.
    let mut late = event("e2", "assistant", "late", 2, &set("a-late"));
    late.actions
        .state_delta
        .insert("app:only_a".into(), json!(true));
    for e in [late, event("e1", "user", "x", 1, &set("a-late"))] {
        let err = with_fence(
            a.clone(),
            one.append_event_for_identity(append("u1", "s1", e)),
        )
        .await
        .expect_err("stale");
        assert_eq!(
            fence_error(&err),
            FenceError::Stale {
                fence: a.fence,
                latest: b.fence
            }
        );
    }
    let other = two.get(get("u2", "other")).await.expect("get");
    assert_eq!(other.state().get("app:owner"), Some(json!("a")));
    assert_eq!(other.state().get("app:only_a"), None);
    with_fence(
        b.clone(),
        two.append_event_for_identity(append("u1", "s1", event("e3", "user", "y", 3, &set("b")))),
    )
    .await
    .expect("b appends");
    release(&store, &b, "turn-b").await;
    // Released by b, still not a's: its number stays superseded.
    let err = with_fence(
        a.clone(),
        one.append_event("s1", event("e4", "user", "z", 4, &set("a-later"))),
    )
    .await
    .expect_err("still stale");
    assert_eq!(err.code, "session.fence_stale");
    let s = two.get(get("u1", "s1")).await.expect("get");
    let ids: Vec<String> = s.events().all().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["e1", "e3"]);
    for k in ["app:owner", "user:owner", "owner"] {
        assert_eq!(s.state().get(k), Some(json!("b")), "{k}");
    }
    assert_eq!(s.state().get("app:only_a"), None);
    let other = one.get(get("u2", "other")).await.expect("get");
    assert_eq!(other.state().get("app:owner"), Some(json!("b")));
}

/// A turn whose lease lapsed appends an event with session, app and user
/// deltas while, just before its k-th store call (for every k), another
/// holder takes the session. What a clean reader sees at the takeover is
/// what it sees after the append: nothing of the old turn lands once the
/// new holder has the lease, whether the append was answered `Ok` (it
/// landed whole before) or stale.
async fn nothing_of_a_turn_lands_after_a_takeover_between_its_calls<S: Store + Clone>(
    store: S,
    clock: FakeClock,
) {
    type View = (usize, Option<Value>, Option<Value>, Option<Value>);
    async fn view<S: Store + Clone>(store: &S, clock: &FakeClock, user: &str) -> View {
        let svc = FencedSessionService::new(store.clone(), clock.clone());
        let s = svc.get(get(user, "s1")).await.expect("get");
        let app = svc.get(get("probe", "probe")).await.expect("probe");
        (
            s.events().len(),
            s.state().get("mark"),
            s.state().get("user:mark"),
            app.state().get(&format!("app:{user}")),
        )
    }
    let clean = FencedSessionService::new(store.clone(), clock.clone());
    clean
        .create(create("probe", "probe", HashMap::new()))
        .await
        .expect("probe");
    for k in 1.. {
        let user = format!("u{k}");
        clean
            .create(create(&user, "s1", HashMap::new()))
            .await
            .expect("create");
        let old = lease(&store, &user, "s1", "turn-old").await;
        clock.advance(TURN_TTL_MS + 1);
        let at_takeover = Arc::new(parking_lot::Mutex::new(None::<View>));
        let hook: tollgate_testkit::faulty::Hook = {
            let (store, clock, user, seen) = (
                store.clone(),
                clock.clone(),
                user.clone(),
                Arc::clone(&at_takeover),
            );
            Arc::new(move || {
                let (store, clock, user, seen) = (
                    store.clone(),
                    clock.clone(),
                    user.clone(),
                    Arc::clone(&seen),
                );
                Box::pin(async move {
                    lease(&store, &user, "s1", "turn-new").await;
                    *seen.lock() = Some(view(&store, &clock, &user).await);
                })
            })
        };
        let faulty = Faulty::interleaved(store.clone(), k, hook);
        let svc = FencedSessionService::new(faulty.clone(), clock.clone());
        let app_key = format!("app:{user}");
        let r = with_fence(
            old,
            svc.append_event_for_identity(append(
                &user,
                "s1",
                event(
                    "e1",
                    "assistant",
                    "late",
                    1,
                    &[
                        ("mark", json!(1)),
                        ("user:mark", json!(1)),
                        (&app_key, json!(1)),
                    ],
                ),
            )),
        )
        .await;
        if !faulty.fired() {
            // No takeover during the append: it landed, whole.
            r.expect("append");
            assert_eq!(
                view(&store, &clock, &user).await,
                (1, Some(json!(1)), Some(json!(1)), Some(json!(1)))
            );
            assert!(k > 1, "the append makes at least one store call");
            break;
        }
        let before = at_takeover.lock().clone().expect("the hook ran");
        assert_eq!(
            view(&store, &clock, &user).await,
            before,
            "k {k}: nothing landed after the takeover ({r:?})"
        );
        match r {
            Ok(()) => assert_eq!(before.0, 1, "k {k}: Ok only if it landed before"),
            Err(e) => assert_eq!(e.code, "session.fence_stale", "k {k}"),
        }
    }
}
