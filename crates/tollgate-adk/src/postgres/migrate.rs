//! tollgate's versioned schema in PostgreSQL: migrations embedded in the
//! crate, each applied once, in order, in its own transaction, under an
//! advisory lock.

use sqlx::{Connection, PgConnection, PgPool};

/// One schema change: its version (from 1, consecutive), what it does, and
/// its SQL (one or more statements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The version it brings the schema to.
    pub version: i64,
    /// What it does, recorded with it.
    pub description: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// The tables tollgate owns in a session database, the migrations'
/// registry first. Nothing else in the database is tollgate's. The
/// `tollgate_java_*` tables are those of the Java client's session service
/// (`clients/java`): one schema, one sequence of versions for every
/// language's client, so none refuses a database another migrated.
pub const TABLES: &[&str] = &[
    "tollgate_schema_migrations",
    "tollgate_session_fences",
    "tollgate_java_sessions",
    "tollgate_java_events",
    "tollgate_java_app_states",
    "tollgate_java_user_states",
];

/// This version's migrations, in order: the files of this crate's
/// `migrations/` directory (`NNNN_words.sql`), which the Java and Python
/// clients apply too.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "session fences",
        sql: include_str!("../../migrations/0001_session_fences.sql"),
    },
    Migration {
        version: 2,
        description: "java sessions",
        sql: include_str!("../../migrations/0002_java_sessions.sql"),
    },
];

/// The advisory lock key the migrations are applied under: the first 8
/// bytes of "tollgate" as a big-endian integer (a constant every version
/// of every client uses, Rust, Java and Python alike).
pub const LOCK_KEY: i64 = i64::from_be_bytes(*b"tollgate");

const REGISTRY: &str = "CREATE TABLE IF NOT EXISTS tollgate_schema_migrations (
    version     BIGINT      PRIMARY KEY,
    description TEXT        NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// Why the schema could not be brought to this version.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database could not be reached or a statement failed.
    #[error("session database: {0}")]
    Database(#[from] sqlx::Error),
    /// The database was migrated by a newer tollgate: this one does not
    /// know its schema and will not write to it.
    #[error(
        "the session database's schema is at version {found}, newer than this tollgate knows ({known}): upgrade tollgate"
    )]
    Newer {
        /// The database's version.
        found: i64,
        /// The newest this tollgate knows.
        known: i64,
    },
}

/// The newest version applied to the database (0: none, or no registry).
///
/// # Errors
///
/// The database failed.
pub async fn schema_version(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('tollgate_schema_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await?;
    if !exists {
        return Ok(0);
    }
    sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM tollgate_schema_migrations")
        .fetch_one(pool)
        .await
}

/// Brings tollgate's tables to this version's schema ([`MIGRATIONS`]):
/// under the session-level advisory lock [`LOCK_KEY`] (so of replicas
/// starting together one migrates and the others then find it done), each
/// migration not yet recorded is applied and recorded in one transaction.
/// Answers the versions it applied (none when the schema was current).
///
/// # Errors
///
/// The database failed (nothing of a failed migration is applied), or it
/// was migrated by a newer tollgate ([`MigrateError::Newer`]).
pub async fn migrate(pool: &PgPool) -> Result<Vec<i64>, MigrateError> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    let result = apply(&mut conn).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK_KEY)
        .execute(&mut *conn)
        .await;
    if unlocked.is_err() {
        // A connection whose unlock failed may still hold the lock: close
        // it rather than give it back to the pool.
        conn.detach();
    }
    result
}

async fn apply(conn: &mut PgConnection) -> Result<Vec<i64>, MigrateError> {
    sqlx::query(REGISTRY).execute(&mut *conn).await?;
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM tollgate_schema_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if let Some(&found) = applied.last()
        && found > known
    {
        return Err(MigrateError::Newer { found, known });
    }
    let mut done = Vec::new();
    for m in MIGRATIONS {
        if applied.contains(&m.version) {
            continue;
        }
        let mut tx = conn.begin().await?;
        // Several statements: the simple query protocol.
        sqlx::Executor::execute(&mut *tx, m.sql).await?;
        sqlx::query(
            "INSERT INTO tollgate_schema_migrations (version, description) VALUES ($1, $2)",
        )
        .bind(m.version)
        .bind(m.description)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        done.push(m.version);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_run_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "{}", m.description);
        }
        assert_eq!(LOCK_KEY, 0x746f_6c6c_6761_7465);
    }

    /// Every file of `migrations/` is a migration, named by its version
    /// and description, and nothing else is: the Java and Python clients
    /// read the same directory.
    #[test]
    fn the_migrations_are_the_files_of_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations/")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        files.sort();
        let named: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.description.replace(' ', "_")))
            .collect();
        assert_eq!(files, named);
        for m in MIGRATIONS {
            let file = dir.join(format!(
                "{:04}_{}.sql",
                m.version,
                m.description.replace(' ', "_")
            ));
            assert_eq!(std::fs::read_to_string(file).expect("read"), m.sql);
        }
    }
}
