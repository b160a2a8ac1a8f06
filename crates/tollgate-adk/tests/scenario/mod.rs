//! The CRUD scenario every adk session service is held to: observed on
//! adk's `InMemorySessionService` and on a fenced service, step by step,
//! it must give the same results. Shared by `sessions.rs` (the tollgate
//! store) and `postgres.rs` (PostgreSQL).
#![allow(dead_code)] // each test binary uses its own part

use std::collections::BTreeMap;
use std::collections::HashMap;

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{AdkError, Content};
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, GetRequest, ListRequest, Session,
    SessionService,
};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tollgate_adk::{DbFence, TurnFence, session_key, with_fence};
use tollgate_core::Store;
use tollgate_core::lease::SessionAcquire;
use tollgate_testkit::T0;

use crate::support::APP;

/// The lease TTL of the scenario's turns.
pub(crate) const TURN_TTL_MS: u64 = 60_000;

/// Takes a session's database fence for a turn of (user, session): `None`
/// where sessions do not live in PostgreSQL.
pub(crate) type DbFences<'a> = dyn Fn(String, String) -> BoxFuture<'a, Option<DbFence>> + Sync + 'a;

/// No database fences: sessions in the tollgate store.
pub(crate) fn no_db(_: String, _: String) -> BoxFuture<'static, Option<DbFence>> {
    Box::pin(async { None })
}

/// A turn's fence: the session's lease in `leases` and, from `db`, its
/// database fence.
pub(crate) async fn turn<L: Store>(
    leases: &L,
    db: &DbFences<'_>,
    user: &str,
    session: &str,
    holder: &str,
) -> TurnFence {
    let mut fence = lease(leases, user, session, holder).await;
    fence.db = db(user.to_owned(), session.to_owned()).await;
    fence
}

/// The timestamp `n` seconds after `T0`.
pub(crate) fn ts(n: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(i64::try_from(T0 + n * 1_000).expect("ms")).expect("time")
}

pub(crate) fn event(id: &str, author: &str, text: &str, at: u64, delta: &[(&str, Value)]) -> Event {
    let mut e = Event::with_id(id, format!("inv-{id}"));
    e.author = author.into();
    e.timestamp = ts(at);
    let role = if author == "user" { "user" } else { "model" };
    e.llm_response.content = Some(Content::new(role).with_text(text));
    e.actions.state_delta = delta
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    e
}

pub(crate) fn state(entries: &[(&str, Value)]) -> HashMap<String, Value> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

pub(crate) fn identity(user: &str, session: &str) -> AdkIdentity {
    AdkIdentity::new(
        AppName::try_from(APP).expect("app"),
        UserId::try_from(user).expect("user"),
        SessionId::try_from(session).expect("session"),
    )
}

pub(crate) fn create(user: &str, session: &str, state: HashMap<String, Value>) -> CreateRequest {
    CreateRequest {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: Some(session.into()),
        state,
    }
}

pub(crate) fn get(user: &str, session: &str) -> GetRequest {
    GetRequest {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: session.into(),
        num_recent_events: None,
        after: None,
    }
}

pub(crate) fn list(user: &str, offset: Option<usize>, limit: Option<usize>) -> ListRequest {
    ListRequest {
        app_name: APP.into(),
        user_id: user.into(),
        limit,
        offset,
    }
}

pub(crate) fn delete(user: &str, session: &str) -> DeleteRequest {
    DeleteRequest {
        app_name: APP.into(),
        user_id: user.into(),
        session_id: session.into(),
    }
}

pub(crate) fn append(user: &str, session: &str, event: Event) -> AppendEventRequest {
    AppendEventRequest {
        identity: identity(user, session),
        event,
    }
}

/// A session, normalized: ids, state (sorted), whole events as JSON.
pub(crate) fn view(s: &dyn Session) -> Value {
    let state: BTreeMap<String, Value> = s.state().all().into_iter().collect();
    let events: Vec<Value> = s
        .events()
        .all()
        .iter()
        .map(|e| serde_json::to_value(e).expect("event json"))
        .collect();
    json!({"id": s.id(), "app": s.app_name(), "user": s.user_id(), "state": state, "events": events})
}

/// Listed sessions, normalized: ids and their event ids, in order.
pub(crate) fn list_view(sessions: &[Box<dyn Session>]) -> Value {
    sessions
        .iter()
        .map(|s| {
            let events: Vec<String> = s.events().all().into_iter().map(|e| e.id).collect();
            json!({"id": s.id(), "events": events})
        })
        .collect()
}

pub(crate) fn error_view(e: &AdkError) -> Value {
    json!({"code": e.code, "category": e.category.to_string()})
}

pub(crate) fn observe<T>(r: adk_core::Result<T>, f: impl FnOnce(T) -> Value) -> Value {
    match r {
        Ok(v) => f(v),
        Err(e) => json!({"error": error_view(&e)}),
    }
}

/// Leases a session in `store` for `holder`, as a turn would.
pub(crate) async fn lease<L: Store>(
    store: &L,
    user: &str,
    session: &str,
    holder: &str,
) -> TurnFence {
    let key = session_key(APP, user, session);
    match store
        .session_acquire(&key, holder, TURN_TTL_MS)
        .await
        .expect("acquire")
    {
        SessionAcquire::Acquired(grant) => TurnFence {
            session_key: key,
            fence: grant.fence,
            db: None,
        },
        busy => panic!("{key} busy: {busy:?}"),
    }
}

pub(crate) async fn release<L: Store>(store: &L, fence: &TurnFence, holder: &str) {
    assert!(
        store
            .session_release(&fence.session_key, holder)
            .await
            .expect("release")
    );
}

/// The CRUD scenario, leasing sessions in `leases` for its fenced appends
/// (harmless for a service that ignores fences). Answers what it observed,
/// step by step.
pub(crate) async fn scenario<L: Store>(
    svc: &dyn SessionService,
    leases: &L,
    db: &DbFences<'_>,
) -> Vec<(&'static str, Value)> {
    let mut seen: Vec<(&'static str, Value)> = Vec::new();

    let r = svc
        .create(create(
            "u1",
            "s1",
            state(&[
                ("app:theme", json!("dark")),
                ("user:lang", json!("en")),
                ("temp:scratch", json!(1)),
                ("topic", json!("rust")),
            ]),
        ))
        .await;
    seen.push(("create s1", observe(r, |s| view(s.as_ref()))));
    let r = svc
        .create(create(
            "u1",
            "s2",
            state(&[("count", json!(0)), ("user:lang", json!("fr"))]),
        ))
        .await;
    seen.push(("create s2", observe(r, |s| view(s.as_ref()))));
    let r = svc
        .create(create("u2", "s3", state(&[("app:theme", json!("light"))])))
        .await;
    seen.push(("create s3 (u2)", observe(r, |s| view(s.as_ref()))));
    let r = svc.get(get("u1", "s1")).await;
    seen.push(("get s1 before events", observe(r, |s| view(s.as_ref()))));

    // A turn of s1: events with deltas of every scope, through both append
    // methods, under the turn's fence.
    let fence = turn(leases, db, "u1", "s1", "turn-1").await;
    let appended = with_fence(fence.clone(), async {
        let mut results = Vec::new();
        results.push(
            svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "hello", 1, &[])))
                .await,
        );
        results.push(
            svc.append_event_for_identity(append(
                "u1",
                "s1",
                event(
                    "e2",
                    "assistant",
                    "hi",
                    2,
                    &[
                        ("topic", json!("go")),
                        ("temp:x", json!(true)),
                        ("app:version", json!(2)),
                        ("user:tz", json!("UTC")),
                    ],
                ),
            ))
            .await,
        );
        results.push(
            svc.append_event(
                "s1",
                event("e3", "assistant", "bye", 3, &[("mood", json!("ok"))]),
            )
            .await,
        );
        results
    })
    .await;
    release(leases, &fence, "turn-1").await;
    for (n, r) in appended.into_iter().enumerate() {
        assert!(r.is_ok(), "append {n} to s1: {r:?}");
    }

    let fence = turn(leases, db, "u1", "s2", "turn-2").await;
    let r = with_fence(
        fence.clone(),
        svc.append_event_for_identity(append(
            "u1",
            "s2",
            event("e4", "user", "again", 4, &[("count", json!(1))]),
        )),
    )
    .await;
    release(leases, &fence, "turn-2").await;
    r.expect("append to s2");

    let fence = turn(leases, db, "u2", "s3", "turn-3").await;
    let r = with_fence(
        fence.clone(),
        svc.append_event_for_identity(append(
            "u2",
            "s3",
            event("e5", "user", "other", 5, &[("user:lang", json!("de"))]),
        )),
    )
    .await;
    release(leases, &fence, "turn-3").await;
    r.expect("append to s3");

    let r = svc.get(get("u1", "s1")).await;
    seen.push(("get s1", observe(r, |s| view(s.as_ref()))));
    let r = svc
        .get(GetRequest {
            num_recent_events: Some(1),
            ..get("u1", "s1")
        })
        .await;
    seen.push(("get s1, last 1", observe(r, |s| view(s.as_ref()))));
    let r = svc
        .get(GetRequest {
            num_recent_events: Some(10),
            ..get("u1", "s1")
        })
        .await;
    seen.push(("get s1, last 10", observe(r, |s| view(s.as_ref()))));
    let r = svc
        .get(GetRequest {
            after: Some(ts(2)),
            ..get("u1", "s1")
        })
        .await;
    seen.push(("get s1, after e2", observe(r, |s| view(s.as_ref()))));
    let r = svc.get(get("u1", "s2")).await;
    seen.push(("get s2", observe(r, |s| view(s.as_ref()))));
    let r = svc.get(get("u2", "s3")).await;
    seen.push(("get s3", observe(r, |s| view(s.as_ref()))));
    let r = svc.get(get("u2", "s1")).await;
    seen.push(("get s1 as u2", observe(r, |s| view(s.as_ref()))));

    for (label, offset, limit) in [
        ("list u1", None, None),
        ("list u1, offset 1", Some(1), None),
        ("list u1, limit 1", None, Some(1)),
        ("list u1, offset 1 limit 1", Some(1), Some(1)),
        ("list u1, offset 5", Some(5), None),
    ] {
        let r = svc.list(list("u1", offset, limit)).await;
        seen.push((label, observe(r, |l| list_view(&l))));
    }
    let r = svc.list(list("u2", None, None)).await;
    seen.push(("list u2", observe(r, |l| list_view(&l))));
    let r = svc.list(list("nobody", None, None)).await;
    seen.push(("list nobody", observe(r, |l| list_view(&l))));

    let r = svc.delete(delete("u1", "s1")).await;
    seen.push(("delete s1", observe(r, |()| json!("ok"))));
    let r = svc.get(get("u1", "s1")).await;
    seen.push(("get s1 after delete", observe(r, |s| view(s.as_ref()))));
    let r = svc.list(list("u1", None, None)).await;
    seen.push(("list u1 after delete", observe(r, |l| list_view(&l))));
    let r = svc.delete(delete("u1", "s1")).await;
    seen.push(("delete s1 again", observe(r, |()| json!("ok"))));
    let r = svc.get(get("u2", "s3")).await;
    seen.push(("get s3 after delete", observe(r, |s| view(s.as_ref()))));
    seen
}
