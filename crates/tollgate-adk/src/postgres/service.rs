//! [`PgSessionService`]: adk sessions in PostgreSQL, in the ADK's own
//! tables, every write of a turn checked against the turn's database fence
//! in the transaction that makes it (docs/spec.md §4, *Sessions in
//! PostgreSQL*).

use std::sync::Arc;
use std::time::Duration;

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{AdkError, ErrorComponent, Result, async_trait};
use adk_session::{
    AppendEventRequest, CreateRequest, DeleteRequest, Event, GetRequest, KEY_PREFIX_TEMP,
    ListRequest, PostgresSessionService, Session, SessionService, extract_state_deltas,
};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Row};
use tollgate_core::Clock;

use super::fences::{self, Fences, SessionRef};
use crate::fence::{DbFence, TurnFence, current_fence, session_key};
use crate::sessions::{
    FenceError, FencedSession, Loaded, StateMap, identity, legacy_target, not_found, parts,
};

/// Most events a read answers by default: the most recent ones
/// ([`PgSessionService::with_max_events`]).
pub const DEFAULT_MAX_EVENTS: usize = 10_000;

/// Most sessions a `list` without a limit answers (the most recently
/// updated).
pub const MAX_LIST: usize = 1_000;

/// The bounds of the pool [`PgSessionService::connect`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBounds {
    /// Most connections open at once (default 16).
    pub max_connections: u32,
    /// Longest wait for a connection before an operation fails as
    /// unavailable (default 5 s).
    pub acquire_timeout: Duration,
    /// Longest a statement may run before PostgreSQL cancels it (default
    /// 10 s): a write then fails whole.
    pub statement_timeout: Duration,
}

impl Default for PoolBounds {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
        }
    }
}

/// An adk [`SessionService`] over PostgreSQL, in the tables adk-session's
/// `PostgresSessionService` keeps (`sessions`, `events`, `app_states`,
/// `user_states`: a user of that service keeps its data), whose event
/// appends must carry the current turn's database fence
/// ([`TurnFence::db`], taken by [`take_fence`](Self::take_fence); the
/// [`TurnExecutor`](crate::TurnExecutor) takes it at the start of each
/// turn when given this service).
///
/// Written beside adk-session's service rather than around it: its append
/// opens its own transaction, so a fence checked around it would be
/// checked in another step, and a turn taken over between the two would
/// still land its write. Here each write is one transaction that first
/// reads the session's fence row `FOR SHARE`.
///
/// # What holds
///
/// - `create` inserts the session and its app and user state and takes a
///   new database fence held by no one, in one transaction; an existing
///   session is `session.already_exists`.
/// - An event append (either method) is one transaction: refused with
///   [`FenceError::NotHeld`] without a current fence for this session,
///   [`FenceError::Stale`] if the fence is no longer the session's (nothing
///   written), `session.not_found` if the session does not exist; an event
///   whose id the session holds already appends nothing and answers `Ok`
///   (a retry of an append whose answer was lost); an event without an id
///   is given a new one, so it is appended every time. Else the event, the
///   session's state and the app and user deltas (merged in SQL, so
///   concurrent appends of several sessions never lose one another's
///   changes). `temp:` keys are dropped first.
/// - `get` reads in one repeatable-read transaction (the session, its app
///   and user state, its events): the most recent events first, at most
///   `num_recent_events` and at most [`with_max_events`](Self::with_max_events)
///   (default [`DEFAULT_MAX_EVENTS`]), those at or after `after`, answered
///   in order. Events with equal timestamps are ordered by id.
/// - `list` answers the most recently updated sessions first (ties by id),
///   each with its current state and its most recent events; without a
///   limit, at most [`MAX_LIST`].
/// - `delete` removes the session and its events; its fence row is kept
///   (numbers never go back), so a turn that held it can never write again.
/// - A database outage is a transient `session.database_unavailable`
///   error (category unavailable); nothing of a failed write is applied.
pub struct PgSessionService {
    pool: PgPool,
    clock: Arc<dyn Clock>,
    max_events: usize,
}

impl std::fmt::Debug for PgSessionService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSessionService")
            .field("max_events", &self.max_events)
            .finish_non_exhaustive()
    }
}

impl PgSessionService {
    /// Sessions in the database of `pool`, creation times from `clock`.
    /// Call [`migrate`](Self::migrate) once before use.
    pub fn new(pool: PgPool, clock: impl Clock) -> Self {
        Self {
            pool,
            clock: Arc::new(clock),
            max_events: DEFAULT_MAX_EVENTS,
        }
    }

    /// Connects to `url` with a pool bounded by `bounds` (connections,
    /// acquire timeout, statement timeout). Connections are opened as
    /// needed, so a database down at start is not an error here.
    ///
    /// # Errors
    ///
    /// `url` is not a PostgreSQL URL.
    pub fn connect(url: &str, bounds: PoolBounds, clock: impl Clock) -> Result<Self> {
        let invalid = |why: String| {
            AdkError::new(
                ErrorComponent::Session,
                adk_core::ErrorCategory::InvalidInput,
                "session.database_url",
                format!("not a PostgreSQL URL (postgres://…): {why}"),
            )
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(invalid("another scheme".into()));
        }
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e: sqlx::Error| invalid(e.to_string()))?;
        let timeout = format!("{}ms", bounds.statement_timeout.as_millis());
        let options = options.options([("statement_timeout", timeout.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(bounds.max_connections)
            .acquire_timeout(bounds.acquire_timeout)
            .connect_lazy_with(options);
        Ok(Self::new(pool, clock))
    }

    /// The same answering at most `n` events per read (at least 1).
    pub fn with_max_events(mut self, n: usize) -> Self {
        self.max_events = n.max(1);
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates or upgrades the tables: the ADK's (adk-session's
    /// `PostgresSessionService::migrate`, under its own advisory lock and
    /// registry) and tollgate's ([`migrate`](super::migrate)).
    ///
    /// # Errors
    ///
    /// The database failed, or was migrated by a newer tollgate.
    pub async fn migrate(&self) -> Result<()> {
        // adk-session takes its advisory lock and gives it back with two
        // statements on its pool, which may run on two connections: the
        // lock would stay held by a pooled connection and the next
        // migration wait for it forever. One connection of its own, closed
        // after (which frees any lock it holds), keeps them together.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .connect_with((*self.pool.connect_options()).clone())
            .await
            .map_err(|e| database_error("migrate", e))?;
        let adk = PostgresSessionService::from_pool(own.clone())
            .migrate()
            .await;
        own.close().await;
        adk?;
        super::migrate(&self.pool).await.map_err(|e| match e {
            super::MigrateError::Database(e) => database_error("migrate", e),
            newer => AdkError::internal(
                ErrorComponent::Session,
                "session.schema_newer",
                newer.to_string(),
            ),
        })?;
        Ok(())
    }

    /// Takes the session's next database fence (the turn's step 2 in
    /// docs/spec.md §4): the number a turn's writes then carry.
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn take_fence(&self, app: &str, user: &str, session: &str) -> Result<DbFence> {
        Fences::new(self.pool.clone())
            .take(SessionRef { app, user, session })
            .await
            .map_err(|e| database_error("take the fence of", e))
    }

    async fn begin(&self, op: &str) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.pool.begin().await.map_err(|e| database_error(op, e))
    }

    /// A read-only transaction that sees one snapshot, begun in one
    /// statement.
    async fn begin_read(&self, op: &str) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await
            .map_err(|e| database_error(op, e))
    }

    /// Reads one session in one repeatable-read transaction.
    async fn get_session(
        &self,
        identity: AdkIdentity,
        num_recent_events: Option<usize>,
        after: Option<DateTime<Utc>>,
    ) -> Result<Box<dyn Session>> {
        let (app, user, id) = parts(&identity);
        let mut tx = self.begin_read("read").await?;
        let row: Option<(Value, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
            "SELECT state, created_at, updated_at FROM sessions
             WHERE app_name = $1 AND user_id = $2 AND session_id = $3",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| database_error("read", e))?;
        let Some((stored, created_at, updated_at)) = row else {
            return Err(not_found(app, user, id));
        };
        let limit = num_recent_events.map_or(self.max_events, |n| n.min(self.max_events));
        let events = read_events(&mut tx, (app, user, id), after, limit).await?;
        let (app_state, user_state) = read_scopes(&mut tx, app, user).await?;
        tx.commit().await.map_err(|e| database_error("read", e))?;
        let loaded = Loaded {
            created_at,
            state: session_part(&stored),
            events,
        };
        Ok(Box::new(
            FencedSession::new(identity, &app_state, &user_state, loaded).updated(updated_at),
        ))
    }

    async fn append_fenced_event(
        &self,
        identity: (&str, &str, &str),
        fence: Option<Arc<TurnFence>>,
        mut event: Event,
    ) -> Result<()> {
        let (app, user, id) = identity;
        let key = session_key(app, user, id);
        let held = match fence.as_deref() {
            Some(TurnFence {
                session_key,
                db: Some(db),
                ..
            }) if *session_key == key => *db,
            _ => return Err(FenceError::NotHeld { session: key }.into()),
        };
        event
            .actions
            .state_delta
            .retain(|k, _| !k.starts_with(KEY_PREFIX_TEMP));
        // The events table keys events by id: an event without one is
        // given one, so it is appended every time (never taken for a
        // repeat of another).
        if event.id.is_empty() {
            event.id = uuid::Uuid::new_v4().to_string();
        }
        let s = SessionRef {
            app,
            user,
            session: id,
        };
        let mut tx = self.begin("append to").await?;
        let checked = Fences::check(&mut tx, s, held)
            .await
            .map_err(|e| database_error("append to", e))?;
        if let Err(stale) = checked {
            // Nothing written: the transaction rolls back when dropped.
            return Err(FenceError::Stale {
                fence: u64::try_from(stale.held).unwrap_or(0),
                latest: u64::try_from(stale.latest).unwrap_or(0),
            }
            .into());
        }
        let stored: Option<Value> = sqlx::query_scalar(
            "SELECT state FROM sessions
             WHERE app_name = $1 AND user_id = $2 AND session_id = $3 FOR UPDATE",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| database_error("append to", e))?;
        let Some(stored) = stored else {
            return Err(not_found(app, user, id));
        };
        let repeated: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM events
             WHERE id = $1 AND app_name = $2 AND user_id = $3 AND session_id = $4)",
        )
        .bind(&event.id)
        .bind(app)
        .bind(user)
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| database_error("append to", e))?;
        if repeated {
            tracing::debug!(key, event = event.id, "event appended already; not again");
            return Ok(());
        }
        let (app_delta, user_delta, session_delta) =
            extract_state_deltas(&event.actions.state_delta);
        let (app_state, user_state) =
            write_scopes(&mut tx, app, user, &app_delta, &user_delta, event.timestamp).await?;
        let mut session_state = session_part(&stored);
        session_state.extend(session_delta);
        let merged = adk_session::merge_states(&app_state, &user_state, &session_state);
        sqlx::query(
            "UPDATE sessions SET state = $1, updated_at = $2
             WHERE app_name = $3 AND user_id = $4 AND session_id = $5",
        )
        .bind(json(&merged)?)
        .bind(event.timestamp)
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(|e| database_error("append to", e))?;
        sqlx::query(
            "INSERT INTO events (id, app_name, user_id, session_id, invocation_id, branch,
               author, timestamp, llm_response, actions, long_running_tool_ids)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&event.id)
        .bind(app)
        .bind(user)
        .bind(id)
        .bind(&event.invocation_id)
        .bind(&event.branch)
        .bind(&event.author)
        .bind(event.timestamp)
        .bind(json(&event.llm_response)?)
        .bind(json(&event.actions)?)
        .bind(json(&event.long_running_tool_ids)?)
        .execute(&mut *tx)
        .await
        .map_err(|e| database_error("append to", e))?;
        tx.commit()
            .await
            .map_err(|e| database_error("append to", e))
    }

    /// Retention: deletes every session not updated for `idle` (by the
    /// service's clock; a session's last update is its last event, else its
    /// creation), with its events, at most `batch` sessions per
    /// transaction (so no statement holds many rows locked), until none is
    /// left; then, in batches too, the fence rows not taken for `idle`
    /// either (by the database's clock, which sets their time) of sessions that no longer exist here (deleted now or
    /// before; a fence row of another service's table, such as the Java
    /// client's, idle as long, may go too: its next take starts the row
    /// again with a new token, which no holder can match). Answers how many
    /// sessions it deleted. The
    /// host schedules it (docs/operations.md gives the same in SQL). A
    /// holder of a deleted session's fence can never write: the session
    /// is gone, and a new one of that name gets a new token.
    ///
    /// # Errors
    ///
    /// The database failed; what earlier batches deleted stays deleted.
    pub async fn delete_idle(&self, idle: Duration, batch: usize) -> Result<u64> {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let cutoff = from_ms(self.clock.now_ms().saturating_sub(idle_ms));
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut deleted = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM sessions WHERE (app_name, user_id, session_id) IN (
                   SELECT app_name, user_id, session_id FROM sessions
                   WHERE updated_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(cutoff)
            .bind(batch)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("delete idle sessions:", e))?
            .rows_affected();
            deleted += n;
            if n < batch as u64 {
                break;
            }
        }
        loop {
            let n = sqlx::query(
                "DELETE FROM tollgate_session_fences WHERE (app_name, user_id, session_id) IN (
                   SELECT app_name, user_id, session_id FROM tollgate_session_fences f
                   WHERE f.updated_at < now() - $1 * interval '1 millisecond'
                     AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.app_name = f.app_name
                       AND s.user_id = f.user_id AND s.session_id = f.session_id)
                   LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(i64::try_from(idle_ms).unwrap_or(i64::MAX))
            .bind(batch)
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("delete idle sessions:", e))?
            .rows_affected();
            if n < batch as u64 {
                return Ok(deleted);
            }
        }
    }

    /// Erasure: deletes every session of (`app`, `user`) with its events,
    /// the user's state and the sessions' fence rows, in one transaction.
    /// The app's state (shared by all its users) is kept. Answers how many
    /// sessions it deleted.
    ///
    /// # Errors
    ///
    /// The database failed (nothing is deleted).
    pub async fn erase_user(&self, app: &str, user: &str) -> Result<u64> {
        let mut tx = self.begin("erase").await?;
        let sessions = sqlx::query("DELETE FROM sessions WHERE app_name = $1 AND user_id = $2")
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(|e| database_error("erase", e))?
            .rows_affected();
        for table in ["user_states", "tollgate_session_fences"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE app_name = $1 AND user_id = $2"
            ))
            .bind(app)
            .bind(user)
            .execute(&mut *tx)
            .await
            .map_err(|e| database_error("erase", e))?;
        }
        tx.commit().await.map_err(|e| database_error("erase", e))?;
        Ok(sessions)
    }

    async fn delete_session(&self, app: &str, user: &str, id: &str) -> Result<()> {
        // Events go with the session (ON DELETE CASCADE); the fence row
        // stays.
        sqlx::query(
            "DELETE FROM sessions WHERE app_name = $1 AND user_id = $2 AND session_id = $3",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(|e| database_error("delete", e))?;
        Ok(())
    }
}

#[async_trait]
impl SessionService for PgSessionService {
    /// Creates the session with a new database fence held by no one; fails
    /// with `session.already_exists` if it exists.
    async fn create(&self, req: CreateRequest) -> Result<Box<dyn Session>> {
        let id = req
            .session_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let identity = identity(&req.app_name, &req.user_id, &id)?;
        let (app, user, id) = parts(&identity);
        let (app_delta, user_delta, session_state) = extract_state_deltas(&req.state);
        let at = from_ms(self.clock.now_ms());
        let mut tx = self.begin("create").await?;
        let (app_state, user_state) =
            write_scopes(&mut tx, app, user, &app_delta, &user_delta, at).await?;
        let merged = adk_session::merge_states(&app_state, &user_state, &session_state);
        let created = sqlx::query(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT DO NOTHING",
        )
        .bind(app)
        .bind(user)
        .bind(id)
        .bind(json(&merged)?)
        .bind(at)
        .execute(&mut *tx)
        .await
        .map_err(|e| database_error("create", e))?;
        if created.rows_affected() == 0 {
            return Err(AdkError::new(
                ErrorComponent::Session,
                adk_core::ErrorCategory::InvalidInput,
                "session.already_exists",
                format!("session '{id}' already exists for app '{app}' and user '{user}'"),
            ));
        }
        fences::take(
            &mut *tx,
            SessionRef {
                app,
                user,
                session: id,
            },
        )
        .await
        .map_err(|e| database_error("create", e))?;
        tx.commit().await.map_err(|e| database_error("create", e))?;
        let loaded = Loaded {
            created_at: at,
            state: session_state,
            events: Vec::new(),
        };
        Ok(Box::new(FencedSession::new(
            identity,
            &app_state,
            &user_state,
            loaded,
        )))
    }

    async fn get(&self, req: GetRequest) -> Result<Box<dyn Session>> {
        let identity = identity(&req.app_name, &req.user_id, &req.session_id)?;
        self.get_session(identity, req.num_recent_events, req.after)
            .await
    }

    /// The sessions of the app and user, most recently updated first (ties
    /// by id), each with its current state and most recent events.
    async fn list(&self, req: ListRequest) -> Result<Vec<Box<dyn Session>>> {
        let app = AppName::try_from(req.app_name.as_str())?;
        let user = UserId::try_from(req.user_id.as_str())?;
        let limit = i64::try_from(req.limit.unwrap_or(MAX_LIST)).unwrap_or(i64::MAX);
        let offset = i64::try_from(req.offset.unwrap_or(0)).unwrap_or(i64::MAX);
        let mut tx = self.begin_read("list").await?;
        let rows = sqlx::query(
            "SELECT session_id, state, created_at, updated_at FROM sessions
             WHERE app_name = $1 AND user_id = $2
             ORDER BY updated_at DESC, session_id ASC LIMIT $3 OFFSET $4",
        )
        .bind(app.as_ref())
        .bind(user.as_ref())
        .bind(limit)
        .bind(offset)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| database_error("list", e))?;
        let (app_state, user_state) = read_scopes(&mut tx, app.as_ref(), user.as_ref()).await?;
        let mut sessions: Vec<Box<dyn Session>> = Vec::with_capacity(rows.len());
        for row in rows {
            let id: String = row.get("session_id");
            let events = read_events(
                &mut tx,
                (app.as_ref(), user.as_ref(), &id),
                None,
                self.max_events,
            )
            .await?;
            let loaded = Loaded {
                created_at: row.get("created_at"),
                state: session_part(&row.get::<Value, _>("state")),
                events,
            };
            let identity = AdkIdentity::new(app.clone(), user.clone(), SessionId::try_from(id)?);
            sessions.push(Box::new(
                FencedSession::new(identity, &app_state, &user_state, loaded)
                    .updated(row.get("updated_at")),
            ));
        }
        tx.commit().await.map_err(|e| database_error("list", e))?;
        Ok(sessions)
    }

    /// Deletes the session and its events (a missing session is not an
    /// error). Not fenced; a turn that held it can no longer write (its
    /// session is gone, and a re-created one has a new fence).
    async fn delete(&self, req: DeleteRequest) -> Result<()> {
        let identity = identity(&req.app_name, &req.user_id, &req.session_id)?;
        let (app, user, id) = parts(&identity);
        self.delete_session(app, user, id).await
    }

    /// Appends with the current turn's database fence, taking the app and
    /// user from the fence's session key: refused
    /// ([`FenceError::NotHeld`]) if no fence is current or its session id
    /// is not `session_id`.
    async fn append_event(&self, session_id: &str, event: Event) -> Result<()> {
        let (fence, [app, user, id]) = legacy_target(session_id)?;
        self.append_fenced_event((&app, &user, &id), Some(fence), event)
            .await
    }

    async fn get_for_identity(&self, identity: &AdkIdentity) -> Result<Box<dyn Session>> {
        self.get_session(identity.clone(), None, None).await
    }

    async fn delete_for_identity(&self, identity: &AdkIdentity) -> Result<()> {
        let (app, user, id) = parts(identity);
        self.delete_session(app, user, id).await
    }

    /// Appends with the current turn's database fence, which must be for
    /// this identity's session.
    async fn append_event_for_identity(&self, req: AppendEventRequest) -> Result<()> {
        self.append_fenced_event(parts(&req.identity), current_fence(), req.event)
            .await
    }

    async fn delete_all_sessions(&self, app_name: &str, user_id: &str) -> Result<()> {
        let app = AppName::try_from(app_name)?;
        let user = UserId::try_from(user_id)?;
        sqlx::query("DELETE FROM sessions WHERE app_name = $1 AND user_id = $2")
            .bind(app.as_ref())
            .bind(user.as_ref())
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("delete the sessions of", e))?;
        Ok(())
    }

    async fn health_check(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(|e| database_error("reach", e))?;
        Ok(())
    }
}

/// The session-scoped part of a stored state (the ADK's tables keep a
/// session's state merged with the app and user state of its last write).
fn session_part(stored: &Value) -> StateMap {
    let map: StateMap = stored
        .as_object()
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    extract_state_deltas(&map).2
}

fn state_map(value: Option<Value>) -> StateMap {
    value
        .and_then(|v| match v {
            Value::Object(o) => Some(o.into_iter().collect()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The app and user state of (`app`, `user`), in one query.
async fn read_scopes(
    conn: &mut PgConnection,
    app: &str,
    user: &str,
) -> Result<(StateMap, StateMap)> {
    let (app_state, user_state): (Option<Value>, Option<Value>) = sqlx::query_as(
        "SELECT (SELECT state FROM app_states WHERE app_name = $1),
                (SELECT state FROM user_states WHERE app_name = $1 AND user_id = $2)",
    )
    .bind(app)
    .bind(user)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| database_error("read", e))?;
    Ok((state_map(app_state), state_map(user_state)))
}

/// Merges the deltas into the app and user state (in SQL: `||`, so
/// concurrent writers never lose each other's keys) and answers both as
/// they are after. A scope without changes is only read: its row is not
/// locked, so appends of one app's sessions that change no app state never
/// wait for one another.
async fn write_scopes(
    conn: &mut PgConnection,
    app: &str,
    user: &str,
    app_delta: &StateMap,
    user_delta: &StateMap,
    at: DateTime<Utc>,
) -> Result<(StateMap, StateMap)> {
    let (mut app_state, mut user_state) = if app_delta.is_empty() || user_delta.is_empty() {
        read_scopes(&mut *conn, app, user).await?
    } else {
        Default::default()
    };
    if !app_delta.is_empty() {
        let merged: Value = sqlx::query_scalar(
            "INSERT INTO app_states AS s (app_name, state, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (app_name) DO UPDATE SET state = s.state || $2, updated_at = $3
             RETURNING state",
        )
        .bind(app)
        .bind(json(app_delta)?)
        .bind(at)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| database_error("write the state of", e))?;
        app_state = state_map(Some(merged));
    }
    if !user_delta.is_empty() {
        let merged: Value = sqlx::query_scalar(
            "INSERT INTO user_states AS s (app_name, user_id, state, updated_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (app_name, user_id) DO UPDATE SET state = s.state || $3, updated_at = $4
             RETURNING state",
        )
        .bind(app)
        .bind(user)
        .bind(json(user_delta)?)
        .bind(at)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| database_error("write the state of", e))?;
        user_state = state_map(Some(merged));
    }
    Ok((app_state, user_state))
}

/// The most recent `limit` events of a session at or after `after`, in
/// order (by timestamp, ties by id).
async fn read_events(
    conn: &mut PgConnection,
    (app, user, id): (&str, &str, &str),
    after: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<Vec<Event>> {
    let rows = sqlx::query(
        "SELECT id, invocation_id, branch, author, timestamp, llm_response, actions,
                long_running_tool_ids
         FROM events
         WHERE app_name = $1 AND user_id = $2 AND session_id = $3
           AND ($4::timestamptz IS NULL OR timestamp >= $4)
         ORDER BY timestamp DESC, id DESC LIMIT $5",
    )
    .bind(app)
    .bind(user)
    .bind(id)
    .bind(after)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| database_error("read", e))?;
    let mut events = Vec::with_capacity(rows.len());
    for row in rows.into_iter().rev() {
        let event_id: String = row.get("id");
        let field = |name: &str| -> Result<Value> {
            row.try_get::<Value, _>(name)
                .map_err(|e| corrupt(&event_id, name, e))
        };
        events.push(Event {
            timestamp: row.get("timestamp"),
            invocation_id: row.get("invocation_id"),
            branch: row.get("branch"),
            author: row.get("author"),
            llm_request: None,
            llm_response: serde_json::from_value(field("llm_response")?)
                .map_err(|e| corrupt(&event_id, "llm_response", e))?,
            actions: serde_json::from_value(field("actions")?)
                .map_err(|e| corrupt(&event_id, "actions", e))?,
            long_running_tool_ids: serde_json::from_value(field("long_running_tool_ids")?)
                .map_err(|e| corrupt(&event_id, "long_running_tool_ids", e))?,
            provider_metadata: Default::default(),
            id: event_id,
        });
    }
    Ok(events)
}

fn json(value: &impl serde::Serialize) -> Result<Value> {
    serde_json::to_value(value).map_err(|e| {
        AdkError::internal(
            ErrorComponent::Session,
            "session.encode_failed",
            format!("could not encode a session value: {e}"),
        )
    })
}

fn corrupt(event: &str, column: &str, why: impl std::fmt::Display) -> AdkError {
    AdkError::internal(
        ErrorComponent::Session,
        "session.corrupt_record",
        format!("event {event}: column {column} is not valid: {why}"),
    )
}

fn from_ms(ms: u64) -> DateTime<Utc> {
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

/// A database failure as an adk error: transient (`unavailable`, code
/// `session.database_unavailable`) when the database could not be reached
/// or answered in time, or a write lost a conflict it may win when retried;
/// else internal (`session.database_error`).
fn database_error(op: &str, e: sqlx::Error) -> AdkError {
    let transient = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            // 08: connection exception; 40001/40P01: serialization
            // failure, deadlock; 57P01-03: the server shutting down or
            // starting; 57014: statement timeout (query canceled).
            c.starts_with("08")
                || matches!(
                    &*c,
                    "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "57014"
                )
        }),
        _ => false,
    };
    if transient {
        AdkError::unavailable(
            ErrorComponent::Session,
            "session.database_unavailable",
            format!("the session database failed to {op} a session: {e}"),
        )
    } else {
        AdkError::internal(
            ErrorComponent::Session,
            "session.database_error",
            format!("the session database failed to {op} a session: {e}"),
        )
    }
}
