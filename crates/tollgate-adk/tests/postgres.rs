//! tollgate's tables in a real PostgreSQL (`TOLLGATE_TEST_PG_URL`, which
//! `./scripts/test` sets to a cluster of its own): versioned migrations
//! under an advisory lock, and the database fence (docs/spec.md §4,
//! *Sessions in PostgreSQL*). Each test works in a database of its own.
#![cfg(feature = "postgres")]

use std::sync::atomic::{AtomicUsize, Ordering};

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
    // Poll (no fixed sleep) until the take is seen waiting for the row lock.
    let mut waited = false;
    for _ in 0..500 {
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
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
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
