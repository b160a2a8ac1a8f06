//! tollgate's tables in a real PostgreSQL (`TOLLGATE_TEST_PG_URL`, which
//! `./scripts/test` sets to a cluster of its own): versioned migrations
//! under an advisory lock, and the database fence (docs/spec.md §4,
//! *Sessions in PostgreSQL*). Each test works in a database of its own.
#![cfg(feature = "postgres")]

mod scenario;
mod support;
mod takeover;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use adk_core::{Content, ErrorCategory, SessionId, UserId};
use adk_session::{InMemorySessionService, PostgresSessionService, SessionService};
use futures::future::BoxFuture;
use scenario::*;
use serde_json::json;
use support::APP;
use tokio::sync::Semaphore;
use tollgate_adk::postgres::{PgSessionService, PoolBounds};
use tollgate_adk::{FenceError, TurnExecutor, TurnStream, with_fence};
use tollgate_core::{FakeClock, MemoryStore, ReplicaGate, Store};
use tollgate_testkit::T0;
use tollgate_testkit::scenarios::support as support_plan;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};
use tollgate_adk::postgres::{
    DbFence, Fences, MIGRATIONS, MigrateError, SessionRef, Stale, TABLES, migrate, schema_version,
};

/// A fresh, empty database in the test cluster, dropped when the test ends.
struct TestDb {
    name: String,
    pool: PgPool,
}

impl TestDb {
    async fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let url = std::env::var("TOLLGATE_TEST_PG_URL").expect(
            "TOLLGATE_TEST_PG_URL is not set: run ./scripts/test, which starts a PostgreSQL of its own",
        );
        let name = format!(
            "tg_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&db_url(&url, &name))
            .await
            .expect("connect to the test database");
        Self { name, pool }
    }

    /// The URL of this database.
    fn url(&self) -> String {
        db_url(
            &std::env::var("TOLLGATE_TEST_PG_URL").expect("url"),
            &self.name,
        )
    }

    async fn drop_db(self) {
        self.pool.close().await;
        let url = std::env::var("TOLLGATE_TEST_PG_URL").expect("url");
        let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect");
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut admin)
            .await
            .expect("drop database");
    }
}

/// `url` with its database replaced by `name`.
fn db_url(url: &str, name: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("a database in the URL");
    format!("{base}/{name}")
}

async fn tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' ORDER BY table_name",
    )
    .fetch_all(pool)
    .await
    .expect("tables")
}

fn s<'a>(app: &'a str, user: &'a str, session: &'a str) -> SessionRef<'a> {
    SessionRef { app, user, session }
}

#[tokio::test]
async fn migrations_apply_once_and_create_only_tollgates_tables() {
    let db = TestDb::new().await;
    // The ADK's own table, with a row, as adk-session's service keeps it.
    sqlx::raw_sql(
        "CREATE TABLE sessions (app_name TEXT, user_id TEXT, session_id TEXT, state JSONB);
         INSERT INTO sessions VALUES ('support', 'bob', 'chat', '{\"k\": 1}');",
    )
    .execute(&db.pool)
    .await
    .expect("adk table");
    assert_eq!(schema_version(&db.pool).await.expect("version"), 0);

    let applied = migrate(&db.pool).await.expect("migrate");
    let all: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(applied, all);
    assert_eq!(
        schema_version(&db.pool).await.expect("version"),
        all.len() as i64
    );
    assert!(
        migrate(&db.pool).await.expect("again").is_empty(),
        "applied once"
    );

    let mut expected: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    expected.push("sessions".into());
    expected.sort();
    assert_eq!(tables(&db.pool).await, expected);
    let row: (String,) = sqlx::query_as("SELECT state::text FROM sessions")
        .fetch_one(&db.pool)
        .await
        .expect("row");
    assert_eq!(row.0, r#"{"k": 1}"#, "the ADK's data is untouched");
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_migrating_together_do_not_race() {
    let db = TestDb::new().await;
    let url = db_url(
        &std::env::var("TOLLGATE_TEST_PG_URL").expect("url"),
        &db.name,
    );
    // Eight replicas, each with its own pool, start at once.
    let mut replicas = Vec::new();
    for _ in 0..8 {
        let url = url.clone();
        replicas.push(tokio::spawn(async move {
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect(&url)
                .await
                .expect("connect");
            let applied = migrate(&pool).await.expect("migrate");
            pool.close().await;
            applied
        }));
    }
    let mut applied = Vec::new();
    for r in replicas {
        applied.push(r.await.expect("replica"));
    }
    let migrated: Vec<_> = applied.iter().filter(|a| !a.is_empty()).collect();
    assert_eq!(migrated.len(), 1, "one replica migrated: {applied:?}");
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_schema_migrations")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(recorded, MIGRATIONS.len() as i64);
    db.drop_db().await;
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let db = TestDb::new().await;
    migrate(&db.pool).await.expect("migrate");
    sqlx::query("INSERT INTO tollgate_schema_migrations (version, description) VALUES (99, 'from the future')")
        .execute(&db.pool)
        .await
        .expect("insert");
    match migrate(&db.pool).await {
        Err(MigrateError::Newer { found: 99, known }) => {
            assert_eq!(known, MIGRATIONS.len() as i64);
        }
        other => panic!("expected Newer, got {other:?}"),
    }
    db.drop_db().await;
}

#[tokio::test]
async fn fences_grow_per_session_with_a_new_token_each_time() {
    let db = TestDb::new().await;
    migrate(&db.pool).await.expect("migrate");
    let f = Fences::new(db.pool.clone());
    let chat = s("support", "bob", "chat");
    assert_eq!(f.current(chat).await.expect("current"), None);
    let a = f.take(chat).await.expect("take");
    let b = f.take(chat).await.expect("take");
    assert_eq!((a.number, b.number), (1, 2));
    assert_ne!(a.token, b.token);
    assert_eq!(f.current(chat).await.expect("current"), Some(b));
    // Keyed by all three parts: ids that concatenate alike are apart.
    for other in [
        s("support", "bo", "bchat"),
        s("support2", "bob", "chat"),
        s("support", "bob", "chat2"),
    ] {
        assert_eq!(f.take(other).await.expect("take").number, 1, "{other:?}");
    }
    assert_eq!(f.current(chat).await.expect("current"), Some(b));
    db.drop_db().await;
}

/// Checks `fence` in a transaction of its own, writing nothing.
async fn check(pool: &PgPool, s: SessionRef<'_>, fence: DbFence) -> Result<(), Stale> {
    let mut tx = pool.begin().await.expect("begin");
    let r = Fences::check(&mut tx, s, fence).await.expect("check");
    tx.rollback().await.expect("rollback");
    r
}

#[tokio::test]
async fn only_the_current_fence_passes_and_a_reissued_number_is_not_current() {
    let db = TestDb::new().await;
    migrate(&db.pool).await.expect("migrate");
    let f = Fences::new(db.pool.clone());
    let chat = s("support", "bob", "chat");
    let first = f.take(chat).await.expect("take");
    assert_eq!(check(&db.pool, chat, first).await, Ok(()));
    let second = f.take(chat).await.expect("take");
    assert_eq!(
        check(&db.pool, chat, first).await,
        Err(Stale { held: 1, latest: 2 })
    );
    assert_eq!(check(&db.pool, chat, second).await, Ok(()));
    // The right number with another token is not current.
    let forged = DbFence {
        number: 2,
        token: first.token,
    };
    assert_eq!(
        check(&db.pool, chat, forged).await,
        Err(Stale { held: 2, latest: 2 })
    );
    // A session erased and begun again reissues number 1, with a new
    // token: the holder of the old number 1 is still refused.
    sqlx::query("DELETE FROM tollgate_session_fences")
        .execute(&db.pool)
        .await
        .expect("erase");
    assert_eq!(
        check(&db.pool, chat, second).await,
        Err(Stale { held: 2, latest: 0 })
    );
    let again = f.take(chat).await.expect("take");
    assert_eq!(again.number, 1);
    assert_eq!(
        check(&db.pool, chat, first).await,
        Err(Stale { held: 1, latest: 1 })
    );
    db.drop_db().await;
}

/// A take waits for a write transaction that checked the fence: the write
/// lands whole before the take, and a write after the take is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_waits_for_the_write_in_flight_and_refuses_the_next() {
    let db = TestDb::new().await;
    migrate(&db.pool).await.expect("migrate");
    sqlx::raw_sql("CREATE TABLE log (n INT)")
        .execute(&db.pool)
        .await
        .expect("table");
    let f = Fences::new(db.pool.clone());
    let chat = s("support", "bob", "chat");
    let held = f.take(chat).await.expect("take");

    let mut tx = db.pool.begin().await.expect("begin");
    assert_eq!(
        Fences::check(&mut tx, chat, held).await.expect("check"),
        Ok(())
    );
    sqlx::query("INSERT INTO log VALUES (1)")
        .execute(&mut *tx)
        .await
        .expect("write");
    let taker = {
        let f = f.clone();
        tokio::spawn(async move {
            f.take(SessionRef {
                app: "support",
                user: "bob",
                session: "chat",
            })
            .await
        })
    };
    // Poll PostgreSQL (each round is a query, no sleep) until the take is
    // seen waiting for the row lock.
    let mut waited = false;
    for _ in 0..5_000 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO tollgate_session_fences%'",
        )
        .fetch_one(&db.pool)
        .await
        .expect("activity");
        if waiting == 1 {
            waited = true;
            break;
        }
    }
    assert!(waited, "the take waits for the writer's transaction");
    assert!(!taker.is_finished());
    tx.commit().await.expect("commit");
    let next = taker.await.expect("task").expect("take");
    assert_eq!(next.number, held.number + 1);

    // The old holder's next write is refused and writes nothing.
    let mut tx = db.pool.begin().await.expect("begin");
    assert_eq!(
        Fences::check(&mut tx, chat, held).await.expect("check"),
        Err(Stale { held: 1, latest: 2 })
    );
    tx.rollback().await.expect("rollback");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM log")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 1, "the write before the take landed whole");
    db.drop_db().await;
}

/// A migrated session service over `db`, creation times from `clock`.
async fn service(db: &TestDb, clock: &FakeClock) -> PgSessionService {
    let svc = PgSessionService::new(db.pool.clone(), clock.clone());
    svc.migrate().await.expect("migrate");
    svc
}

/// Database fences taken from `svc` for the scenario's turns.
fn db_fences<'a>(
    svc: &'a PgSessionService,
) -> impl Fn(String, String) -> BoxFuture<'a, Option<DbFence>> + Sync + 'a {
    move |user, session| {
        Box::pin(async move {
            Some(
                svc.take_fence(APP, &user, &session)
                    .await
                    .expect("take the database fence"),
            )
        })
    }
}

#[tokio::test]
async fn crud_matches_in_memory_on_postgres() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let svc = service(&db, &clock).await;
    let leases = MemoryStore::new(clock.clone());
    let got = scenario(&svc, &leases, &db_fences(&svc)).await;
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
    let s1 = &got.iter().find(|(l, _)| *l == "get s1").expect("get s1").1;
    assert_eq!(s1["events"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        s1["state"],
        json!({"app:theme": "light", "app:version": 2, "user:lang": "fr", "user:tz": "UTC",
               "topic": "go", "mood": "ok"})
    );
    db.drop_db().await;
}

async fn event_ids(svc: &PgSessionService, user: &str, id: &str) -> Vec<String> {
    svc.get(get(user, id))
        .await
        .expect("get")
        .events()
        .all()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

fn fence_error(e: &adk_core::AdkError) -> FenceError {
    FenceError::find_in(e)
        .unwrap_or_else(|| panic!("not a fence error: {e:?}"))
        .clone()
}

/// Appends carry the turn's database fence: none (or only a lease's) is
/// not held; one a newer turn superseded is stale and writes nothing, in
/// any scope; a repeated event id appends nothing.
#[tokio::test]
async fn appends_are_checked_against_the_database_fence() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let svc = service(&db, &clock).await;
    let leases = MemoryStore::new(clock.clone());
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");

    let e = svc
        .append_event_for_identity(append("u1", "s1", event("e0", "user", "x", 1, &[])))
        .await
        .expect_err("no fence");
    assert!(matches!(fence_error(&e), FenceError::NotHeld { .. }));
    let lease_only = lease(&leases, "u1", "s1", "turn-0").await;
    let e = with_fence(
        lease_only.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e0", "user", "x", 1, &[]))),
    )
    .await
    .expect_err("a lease fence only");
    assert!(matches!(fence_error(&e), FenceError::NotHeld { .. }));
    release(&leases, &lease_only, "turn-0").await;

    // Turn A takes the fence; turn B takes it over.
    let mut a = lease(&leases, "u1", "s1", "turn-a").await;
    a.db = Some(svc.take_fence(APP, "u1", "s1").await.expect("fence"));
    with_fence(
        a.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e1", "user", "a1", 1, &[]))),
    )
    .await
    .expect("A appends");
    let b_fence = svc.take_fence(APP, "u1", "s1").await.expect("fence");
    let e = with_fence(
        a.clone(),
        svc.append_event_for_identity(append(
            "u1",
            "s1",
            event(
                "e2",
                "assistant",
                "a2",
                2,
                &[
                    ("app:k", json!("A")),
                    ("user:k", json!("A")),
                    ("k", json!("A")),
                ],
            ),
        )),
    )
    .await
    .expect_err("stale");
    assert_eq!(
        fence_error(&e),
        FenceError::Stale {
            fence: a.db.expect("db").number as u64,
            latest: b_fence.number as u64
        }
    );
    assert_eq!(e.code, "session.fence_stale");
    let s = svc.get(get("u1", "s1")).await.expect("get");
    assert_eq!(event_ids(&svc, "u1", "s1").await, ["e1"]);
    for k in ["app:k", "user:k", "k"] {
        assert_eq!(
            s.state().get(k),
            None,
            "{k}: nothing of the stale append landed"
        );
    }

    // B's turn appends, and its retry of the same event lands once.
    let mut b = a.clone();
    b.db = Some(b_fence);
    for _ in 0..2 {
        with_fence(
            b.clone(),
            svc.append_event_for_identity(append("u1", "s1", event("e3", "user", "b", 3, &[]))),
        )
        .await
        .expect("B appends");
    }
    assert_eq!(event_ids(&svc, "u1", "s1").await, ["e1", "e3"]);
    // Events without an id are appended every time, each given one.
    for n in [5, 6] {
        with_fence(
            b.clone(),
            svc.append_event_for_identity(append("u1", "s1", event("", "user", "b", n, &[]))),
        )
        .await
        .expect("an event without an id");
    }
    let ids = event_ids(&svc, "u1", "s1").await;
    assert_eq!(ids.len(), 4);
    assert!(
        ids[2..].iter().all(|id| !id.is_empty()) && ids[2] != ids[3],
        "{ids:?}"
    );

    // A session deleted and created again takes a new fence: B's is stale.
    svc.delete(delete("u1", "s1")).await.expect("delete");
    let e = with_fence(
        b.clone(),
        svc.append_event_for_identity(append("u1", "s1", event("e4", "user", "b", 4, &[]))),
    )
    .await
    .expect_err("no session");
    assert_eq!(e.code, "session.not_found");
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create again");
    let e = with_fence(
        b,
        svc.append_event_for_identity(append("u1", "s1", event("e4", "user", "b", 4, &[]))),
    )
    .await
    .expect_err("stale after re-create");
    assert!(matches!(fence_error(&e), FenceError::Stale { .. }));
    assert!(event_ids(&svc, "u1", "s1").await.is_empty());
    db.drop_db().await;
}

/// Reads answer the most recent events first, bounded.
#[tokio::test]
async fn reads_are_bounded_to_the_most_recent_events() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let svc = service(&db, &clock).await.with_max_events(3);
    let leases = MemoryStore::new(clock.clone());
    svc.create(create("u1", "s1", HashMap::new()))
        .await
        .expect("create");
    let mut fence = lease(&leases, "u1", "s1", "turn").await;
    fence.db = Some(svc.take_fence(APP, "u1", "s1").await.expect("fence"));
    for n in 1..=5u64 {
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
    }
    assert_eq!(event_ids(&svc, "u1", "s1").await, ["e3", "e4", "e5"]);
    let last = svc
        .get(adk_session::GetRequest {
            num_recent_events: Some(2),
            ..get("u1", "s1")
        })
        .await
        .expect("get");
    let ids: Vec<String> = last.events().all().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["e4", "e5"]);
    let listed = svc.list(list("u1", None, None)).await.expect("list");
    assert_eq!(listed[0].events().len(), 3);
    db.drop_db().await;
}

/// Sessions adk-session's own PostgreSQL service wrote are read, state and
/// events, and it reads what this service wrote: the tables are shared.
#[tokio::test]
async fn the_adk_postgres_services_data_is_kept_and_shared() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    // Their migration on a connection of its own: it locks and unlocks
    // with two statements on its pool, which may take two connections.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*db.pool.connect_options()).clone())
        .await
        .expect("connect");
    PostgresSessionService::from_pool(own.clone())
        .migrate()
        .await
        .expect("their migration");
    own.close().await;
    let theirs = PostgresSessionService::from_pool(db.pool.clone());
    theirs
        .create(create(
            "u1",
            "old",
            HashMap::from([
                ("topic".to_owned(), json!("rust")),
                ("app:v".to_owned(), json!(1)),
            ]),
        ))
        .await
        .expect("their create");
    theirs
        .append_event_for_identity(append(
            "u1",
            "old",
            event("e1", "user", "hi", 1, &[("mood", json!("ok"))]),
        ))
        .await
        .expect("their append");

    let ours = service(&db, &clock).await;
    let s = ours.get(get("u1", "old")).await.expect("ours reads theirs");
    assert_eq!(s.state().get("topic"), Some(json!("rust")));
    assert_eq!(s.state().get("mood"), Some(json!("ok")));
    assert_eq!(s.state().get("app:v"), Some(json!(1)));
    assert_eq!(event_ids(&ours, "u1", "old").await, ["e1"]);

    ours.create(create(
        "u1",
        "new",
        HashMap::from([("x".to_owned(), json!(2))]),
    ))
    .await
    .expect("our create");
    let leases = MemoryStore::new(clock.clone());
    let mut fence = lease(&leases, "u1", "new", "turn").await;
    fence.db = Some(ours.take_fence(APP, "u1", "new").await.expect("fence"));
    with_fence(
        fence,
        ours.append_event_for_identity(append("u1", "new", event("e2", "user", "yo", 2, &[]))),
    )
    .await
    .expect("our append");
    let s = theirs
        .get(get("u1", "new"))
        .await
        .expect("theirs reads ours");
    assert_eq!(s.state().get("x"), Some(json!(2)));
    let ids: Vec<String> = s.events().all().into_iter().map(|e| e.id).collect();
    assert_eq!(ids, ["e2"]);
    db.drop_db().await;
}

/// A database that cannot be reached is a transient error, never a panic
/// or a silent success.
#[tokio::test]
async fn an_unreachable_database_is_a_transient_error() {
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let svc = PgSessionService::connect(
        &format!("postgres://tollgate@127.0.0.1:{port}/tollgate"),
        PoolBounds {
            acquire_timeout: Duration::from_secs(2),
            ..PoolBounds::default()
        },
        FakeClock::new(T0),
    )
    .expect("a valid URL");
    let Err(e) = svc.create(create("u1", "s1", HashMap::new())).await else {
        panic!("created on an unreachable database");
    };
    assert_eq!(e.code, "session.database_unavailable", "{e:?}");
    assert_eq!(e.category, ErrorCategory::Unavailable);
    let Err(e) = svc.get(get("u1", "s1")).await else {
        panic!("read from an unreachable database");
    };
    assert_eq!(e.code, "session.database_unavailable");
    let e = PgSessionService::connect("mysql://x", PoolBounds::default(), FakeClock::new(T0))
        .expect_err("not a PostgreSQL URL");
    assert_eq!(e.category, ErrorCategory::InvalidInput);
}

const TTL: u64 = 30_000;

/// A real adk runner keeping its sessions in PostgreSQL, its turns run by
/// a `TurnExecutor` that takes each turn's database fence; leases in
/// `leases`.
struct PgTurns<S: Store + Clone> {
    h: support::Harness<S>,
    executor: TurnExecutor<S>,
}

impl<S: Store + Clone> PgTurns<S> {
    async fn new(db: &TestDb, leases: S, clock: FakeClock) -> Self {
        let sessions = Arc::new(service(db, &clock).await);
        let h = support::Harness::assemble(
            leases,
            clock,
            support_plan(),
            support::FakeLlm::replying(),
            Arc::clone(&sessions) as Arc<dyn SessionService>,
            false,
            |m| m,
        );
        let executor = TurnExecutor::new(
            Arc::clone(&h.runner),
            Arc::clone(&h.limiter),
            ReplicaGate::new(4),
        )
        .with_session_ttl_ms(TTL)
        .with_postgres_sessions(sessions);
        Self { h, executor }
    }

    async fn turn(&self, text: &'static str) -> TurnStream<S> {
        self.executor
            .execute(
                UserId::new("u1").expect("user"),
                SessionId::new("s1").expect("session"),
                Content::new("user").with_text(text),
            )
            .await
            .expect("admitted")
    }

    async fn history(&self) -> Vec<adk_session::Event> {
        self.h
            .sessions
            .get(get("u1", "s1"))
            .await
            .expect("session")
            .events()
            .all()
    }
}

/// Sessions in PostgreSQL: turn A holds s1 and is paused past its lease;
/// turn B takes the session (a higher lease fence and a higher database
/// fence) and completes; A's late append is refused by the database
/// (stale), and the history holds A's user message, then B's whole turn.
#[tokio::test]
async fn a_late_append_after_a_takeover_is_refused_by_the_database() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let t = PgTurns::new(&db, MemoryStore::new(clock.clone()), clock).await;
    t.h.session("u1", "s1").await;
    let gate = Arc::new(Semaphore::new(0));
    t.h.model.push(support::gated(&gate));
    let a = t.turn("from A").await;
    let a_invocation = a.invocation_id().expect("id").to_owned();
    let a_db = a.fence().db.expect("A holds a database fence");
    let a = tokio::spawn(support::outcome(a));
    while t.h.model.calls() < 1 {
        tokio::task::yield_now().await;
    }

    t.h.clock.advance(TTL + 1_000);
    let b = t.turn("from B").await;
    let b_db = b.fence().db.expect("B holds a database fence");
    assert_eq!(b_db.number, a_db.number + 1);
    let (b_texts, b_error) = support::outcome(b).await;
    assert!(b_error.is_none(), "{b_error:?}");
    assert!(support::is_reply(&b_texts), "{b_texts:?}");

    gate.add_permits(1);
    let (_, a_error) = a.await.expect("join");
    let a_error = a_error.expect("A's late append is refused");
    assert_eq!(a_error.code, "session.fence_stale");
    assert_eq!(
        FenceError::find_in(&a_error),
        Some(&FenceError::Stale {
            fence: a_db.number as u64,
            latest: b_db.number as u64
        })
    );
    let who: Vec<(bool, String)> = t
        .history()
        .await
        .iter()
        .map(|e| (e.invocation_id == a_invocation, e.author.clone()))
        .collect();
    assert_eq!(
        who,
        vec![
            (true, "user".to_owned()),
            (false, "user".to_owned()),
            (false, "assistant".to_owned()),
        ],
        "A's user message, then B's turn; nothing of A after B"
    );
    assert_eq!(t.executor.gate().in_flight(), 0);
    db.drop_db().await;
}

/// The lease store loses its data between two turns (a fresh memory store
/// stands for Redis restarted empty): the next turn's lease fence starts
/// again at 1, yet its database fence is higher than any before, so its
/// appends land; a holder from before the loss is refused.
#[tokio::test]
async fn a_lease_store_that_lost_its_data_cannot_reissue_a_database_fence() {
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let before = PgTurns::new(&db, MemoryStore::new(clock.clone()), clock.clone()).await;
    before.h.session("u1", "s1").await;
    let first = before.turn("one").await;
    let (first_lease, first_db) = (first.fence().fence, first.fence().db.expect("db"));
    let old_fence = first.fence().clone();
    let (texts, error) = support::outcome(first).await;
    assert!(error.is_none() && support::is_reply(&texts), "{error:?}");

    // The lease store restarts empty; the database keeps everything.
    let after = PgTurns::new(&db, MemoryStore::new(clock.clone()), clock.clone()).await;
    let second = after.turn("two").await;
    assert_eq!(
        second.fence().fence,
        first_lease,
        "the lease fence starts again"
    );
    let second_db = second.fence().db.expect("db");
    assert!(second_db.number > first_db.number);
    let (texts, error) = support::outcome(second).await;
    assert!(error.is_none() && support::is_reply(&texts), "{error:?}");
    assert_eq!(after.history().await.len(), 4, "both turns whole");

    // The holder from before the loss is refused.
    let e = with_fence(
        old_fence,
        after.h.sessions.append_event_for_identity(append(
            "u1",
            "s1",
            event("late", "assistant", "late", 99, &[]),
        )),
    )
    .await
    .expect_err("stale");
    assert_eq!(e.code, "session.fence_stale");
    assert_eq!(after.history().await.len(), 4);
    db.drop_db().await;
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Retention deletes idle sessions (with their events and, once no session
/// is left, their fence rows) in batches, and keeps the others; erasure
/// deletes one user's sessions, state and fences and nothing of another's.
#[tokio::test]
async fn idle_sessions_are_deleted_in_batches_and_a_user_is_erased() {
    const DAY: u64 = 86_400_000;
    let db = TestDb::new().await;
    let clock = FakeClock::new(T0);
    let svc = service(&db, &clock).await;
    let leases = MemoryStore::new(clock.clone());
    // Three old sessions of u1 (one with an event of day 0), then, on day
    // 10, a new one of u1 and one of u2 with user and app state.
    for id in ["old1", "old2", "old3"] {
        svc.create(create("u1", id, HashMap::new()))
            .await
            .expect("create");
        svc.take_fence(APP, "u1", id).await.expect("fence");
    }
    let mut fence = lease(&leases, "u1", "old1", "turn").await;
    fence.db = Some(svc.take_fence(APP, "u1", "old1").await.expect("fence"));
    with_fence(
        fence,
        svc.append_event_for_identity(append("u1", "old1", event("e1", "user", "x", 0, &[]))),
    )
    .await
    .expect("append");
    clock.advance(10 * DAY);
    for (user, id) in [("u1", "new"), ("u2", "other")] {
        svc.create(create(
            user,
            id,
            HashMap::from([
                ("user:lang".to_owned(), json!("en")),
                ("app:theme".to_owned(), json!("dark")),
            ]),
        ))
        .await
        .expect("create");
    }

    // A fence row of a session another service keeps (the Java client's
    // tables), taken now: not idle, so it stays.
    Fences::new(db.pool.clone())
        .take(s(APP, "u9", "java-session"))
        .await
        .expect("fence");
    // The fence rows' times are the database's: they too were taken ten
    // days ago.
    sqlx::query(
        "UPDATE tollgate_session_fences SET updated_at = updated_at - interval '10 days'
         WHERE session_id LIKE 'old%'",
    )
    .execute(&db.pool)
    .await
    .expect("age the fence rows");
    let deleted = svc
        .delete_idle(Duration::from_millis(7 * DAY), 2)
        .await
        .expect("retention");
    assert_eq!(deleted, 3, "three idle sessions, in batches of two");
    let mut left: Vec<String> = svc
        .list(list("u1", None, None))
        .await
        .expect("list")
        .iter()
        .map(|s| s.id().to_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["new"]);
    assert_eq!(
        count(&db.pool, "SELECT count(*) FROM events").await,
        0,
        "events went with them"
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM tollgate_session_fences WHERE session_id LIKE 'old%'"
        )
        .await,
        0,
        "so did their fences"
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM tollgate_session_fences WHERE session_id = 'java-session'"
        )
        .await,
        1,
        "a fence row taken within `idle` stays"
    );
    assert_eq!(
        svc.delete_idle(Duration::from_millis(7 * DAY), 2)
            .await
            .expect("again"),
        0
    );

    assert_eq!(svc.erase_user(APP, "u1").await.expect("erase"), 1);
    assert!(
        svc.list(list("u1", None, None))
            .await
            .expect("list")
            .is_empty()
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM user_states WHERE user_id = 'u1'"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &db.pool,
            "SELECT count(*) FROM tollgate_session_fences WHERE user_id = 'u1'"
        )
        .await,
        0
    );
    let other = svc
        .get(get("u2", "other"))
        .await
        .expect("u2's session stays");
    assert_eq!(other.state().get("user:lang"), Some(json!("en")));
    assert_eq!(
        other.state().get("app:theme"),
        Some(json!("dark")),
        "app state stays"
    );
    db.drop_db().await;
}
