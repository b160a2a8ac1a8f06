//! The database fence of a session (docs/spec.md §4): a row of
//! `tollgate_session_fences` per (app, user, session) with a number that
//! only grows and a token PostgreSQL draws with each number.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

pub use crate::fence::DbFence;

/// One session, keyed as the ADK's tables key it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef<'a> {
    /// The app.
    pub app: &'a str,
    /// The user.
    pub user: &'a str,
    /// The session id.
    pub session: &'a str,
}

/// A write refused: the fence it carried is not the session's current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("database fence {held} is stale (latest {latest})")]
pub struct Stale {
    /// The number the writer held.
    pub held: i64,
    /// The session's current number (0: the session has no fence).
    pub latest: i64,
}

/// Takes and checks database fences in one session database.
#[derive(Debug, Clone)]
pub struct Fences {
    pool: PgPool,
}

impl Fences {
    /// Fences in the database of `pool` (migrated: [`migrate`](super::migrate)).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Makes the session's next fence current and answers it, in one
    /// statement: 1 for a session without one, else the number after the
    /// current one, with a new token. Waits for every write transaction
    /// that holds the session's row ([`check`](Self::check)) to end, so
    /// none of them lands after it.
    ///
    /// # Errors
    ///
    /// The database failed (no fence was taken, or none is known to be).
    pub async fn take(&self, s: SessionRef<'_>) -> Result<DbFence, sqlx::Error> {
        take(&self.pool, s).await
    }

    /// The session's current fence, if it has one.
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn current(&self, s: SessionRef<'_>) -> Result<Option<DbFence>, sqlx::Error> {
        let row: Option<(i64, Uuid)> = sqlx::query_as(
            "SELECT fence, token FROM tollgate_session_fences
             WHERE app_name = $1 AND user_id = $2 AND session_id = $3",
        )
        .bind(s.app)
        .bind(s.user)
        .bind(s.session)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(number, token)| DbFence { number, token }))
    }

    /// Checks, inside the write transaction `tx`, that `fence` is the
    /// session's current one, and holds the session's row `FOR SHARE`
    /// until `tx` ends, so no fence is taken meanwhile: what `tx` writes
    /// after an `Ok(Ok(()))` lands before the next take or not at all.
    /// `Ok(Err(Stale))`: not current; the caller writes nothing and rolls
    /// back.
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn check(
        tx: &mut PgConnection,
        s: SessionRef<'_>,
        fence: DbFence,
    ) -> Result<Result<(), Stale>, sqlx::Error> {
        let row: Option<(i64, Uuid)> = sqlx::query_as(
            "SELECT fence, token FROM tollgate_session_fences
             WHERE app_name = $1 AND user_id = $2 AND session_id = $3
             FOR SHARE",
        )
        .bind(s.app)
        .bind(s.user)
        .bind(s.session)
        .fetch_optional(&mut *tx)
        .await?;
        Ok(match row {
            Some((number, token)) if number == fence.number && token == fence.token => Ok(()),
            Some((latest, _)) => Err(Stale {
                held: fence.number,
                latest,
            }),
            None => Err(Stale {
                held: fence.number,
                latest: 0,
            }),
        })
    }
}

/// [`Fences::take`] on any executor (a pool, or a transaction that also
/// creates the session).
pub(crate) async fn take<'e, E>(executor: E, s: SessionRef<'_>) -> Result<DbFence, sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    let (number, token): (i64, Uuid) = sqlx::query_as(
        "INSERT INTO tollgate_session_fences AS f (app_name, user_id, session_id, fence, token)
         VALUES ($1, $2, $3, 1, gen_random_uuid())
         ON CONFLICT (app_name, user_id, session_id) DO UPDATE
           SET fence = f.fence + 1, token = gen_random_uuid(), updated_at = now()
         RETURNING fence, token",
    )
    .bind(s.app)
    .bind(s.user)
    .bind(s.session)
    .fetch_one(executor)
    .await?;
    Ok(DbFence { number, token })
}
