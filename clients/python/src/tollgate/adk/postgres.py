"""google-adk sessions in PostgreSQL whose writes the database fences
(docs/spec.md §4, *Sessions in PostgreSQL*).

:class:`FencedDatabaseSessionService` is google-adk's
``DatabaseSessionService`` (``postgresql+asyncpg``; its tables and data as
google-adk keeps them) whose ``append_event`` writes only in a transaction
that first reads the session's row of ``tollgate_session_fences`` ``FOR
SHARE`` and finds the running turn's :class:`DbFence` there: else nothing is
written and it raises :class:`StaleFenceError`. The :class:`TurnExecutor
<tollgate.adk.TurnExecutor>` given the service (``postgres_sessions=``)
takes the fence at the start of each turn, after the session lease; the
service reads it from :func:`tollgate.adk.current_turn`.

Needs ``sqlalchemy[asyncio]`` and ``asyncpg`` (this module is not imported
by ``tollgate.adk``)."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from google.adk.events.event import Event
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.adk.sessions.session import Session
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession

from ._executor import current_turn

__all__ = [
    "LOCK_KEY",
    "MIGRATIONS",
    "TABLES",
    "DbFence",
    "FenceError",
    "StaleFenceError",
    "FenceNotHeldError",
    "SessionDatabaseError",
    "SchemaTooNewError",
    "FencedDatabaseSessionService",
]

#: The advisory lock tollgate's migrations are applied under: the bytes of
#: "tollgate" (every tollgate client, Rust, Java and Python, uses it).
LOCK_KEY = int.from_bytes(b"tollgate", "big")

#: tollgate's migrations, in order: (version, description); the files
#: ``NNNN_words.sql`` of ``crates/tollgate-adk/migrations``, copied into
#: this package (a test checks they are the same).
MIGRATIONS: tuple[tuple[int, str], ...] = ((1, "session fences"), (2, "java sessions"))

#: The tables tollgate owns in a session database (google-adk's own are
#: ``sessions``, ``events``, ``app_states``, ``user_states`` and
#: ``adk_internal_metadata``).
TABLES = (
    "tollgate_schema_migrations",
    "tollgate_session_fences",
    "tollgate_java_sessions",
    "tollgate_java_events",
    "tollgate_java_app_states",
    "tollgate_java_user_states",
)

_REGISTRY = """CREATE TABLE IF NOT EXISTS tollgate_schema_migrations (
    version BIGINT PRIMARY KEY, description TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""

_TAKE = text(
    "INSERT INTO tollgate_session_fences AS f (app_name, user_id, session_id, fence, token)"
    " VALUES (:app, :user, :session, 1, gen_random_uuid())"
    " ON CONFLICT (app_name, user_id, session_id) DO UPDATE"
    " SET fence = f.fence + 1, token = gen_random_uuid(), updated_at = now()"
    " RETURNING fence, token"
)

_CHECK = text(
    "SELECT fence, token FROM tollgate_session_fences"
    " WHERE app_name = :app AND user_id = :user AND session_id = :session FOR SHARE"
)


def migration_sql(version: int, description: str) -> str:
    """The statements of one migration, from this package."""
    name = f"{version:04d}_{description.replace(' ', '_')}.sql"
    return resources.files(__package__).joinpath("migrations", name).read_text("utf-8")


@dataclass(frozen=True)
class DbFence:
    """A session's database fence: the number PostgreSQL issued with the
    take that made it current, and the random token drawn with it.

    Attributes:
        number: From 1, growing with each take.
        token: Equal numbers from two histories of the row never carry
            equal tokens.
    """

    number: int
    token: uuid.UUID


class FenceError(Exception):
    """A write refused because it did not carry the session's current
    database fence; nothing of it was written.

    Attributes:
        code: ``session.fence_stale`` or ``session.fence_not_held``.
    """

    code = "session.fence"


class StaleFenceError(FenceError):
    """The write's fence is no longer the session's: another turn took the
    session since. The turn holding it must stop.

    Attributes:
        fence: The number the write carried.
        latest: The session's current number (0 when its row is gone).
    """

    code = "session.fence_stale"

    def __init__(self, session: str, fence: int, latest: int) -> None:
        super().__init__(
            f"fence {fence} of session {session} is stale: the session was taken again "
            f"(latest fence {latest})"
        )
        self.fence = fence
        self.latest = latest


class FenceNotHeldError(FenceError):
    """The write was made outside a turn holding the session's database
    fence (no :class:`TurnExecutor <tollgate.adk.TurnExecutor>` given this
    service, or a turn of another session)."""

    code = "session.fence_not_held"

    def __init__(self, session: str) -> None:
        super().__init__(f"no database fence is held on session {session}: appends are made by a fenced turn")


class SessionDatabaseError(Exception):
    """The session database failed; a failed write wrote nothing.

    Attributes:
        code: ``session.database_unavailable`` (the database unreachable, the
            pool out of connections for its timeout) or
            ``session.database_error``.
        transient: Whether retrying later can help.
    """

    def __init__(self, what: str, cause: BaseException, *, transient: bool) -> None:
        super().__init__(f"session database: {what}: {cause}")
        self.transient = transient
        self.code = "session.database_unavailable" if transient else "session.database_error"


class SchemaTooNewError(Exception):
    """The database was migrated by a newer tollgate, whose schema this one
    does not know and will not write to.

    Attributes:
        found: The database's version.
        known: The newest this tollgate knows.
    """

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the session database's schema is at version {found}, newer than this tollgate "
            f"knows ({known}): upgrade tollgate"
        )
        self.found = found
        self.known = known


_TRANSIENT = (OSError, asyncio.TimeoutError, PoolTimeout, OperationalError, InterfaceError)


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, _TRANSIENT):
        return True
    if isinstance(e, DBAPIError):
        if e.connection_invalidated:
            return True
        code = getattr(e.orig, "sqlstate", None) or getattr(getattr(e.orig, "__cause__", None), "sqlstate", None)
        return isinstance(code, str) and (code[:2] in ("08", "53", "57") or code in ("40001", "40P01"))
    return False


@asynccontextmanager
async def _database(what: str) -> AsyncIterator[None]:
    try:
        yield
    except (FenceError, SchemaTooNewError):
        raise
    except (DBAPIError, *_TRANSIENT) as e:
        raise SessionDatabaseError(what, e, transient=_is_transient(e)) from e


class _First:
    """A statement to run first in the next write transaction google-adk's
    service opens in this context (so it commits or rolls back with it)."""

    def __init__(self, run: Callable[[AsyncSession], Awaitable[None]]) -> None:
        self.run = run
        self.done = False


_FIRST: ContextVar[Optional[_First]] = ContextVar("tollgate_pg_first", default=None)


class FencedDatabaseSessionService(DatabaseSessionService):
    """google-adk's ``DatabaseSessionService`` on PostgreSQL with the
    database fence (module docs). Behaviour is google-adk's, plus:

    * ``append_event`` (a non-partial event) raises
      :class:`FenceNotHeldError` outside a fenced turn of the session and
      :class:`StaleFenceError` when the turn's fence is no longer current,
      checked first in the append's own transaction;
    * ``create_session`` takes a new fence held by no one in the create's
      transaction (a holder from before a delete cannot write into a
      session created again under its name);
    * tollgate's tables are created with google-adk's
      (:meth:`migrate`, also run by ``prepare_tables``);
    * an unreachable database is :class:`SessionDatabaseError` (transient).

    Args:
        db_url: A ``postgresql+asyncpg://`` URL (or ``db_engine=``).
        db_engine: An ``AsyncEngine`` of the caller's.
        **kwargs: Passed to ``create_async_engine`` (bound the pool:
            ``pool_size``, ``max_overflow``, ``pool_timeout``).
    """

    def __init__(self, db_url: Optional[str] = None, *, db_engine: Any = None, **kwargs: Any) -> None:
        super().__init__(db_url=db_url, db_engine=db_engine, **kwargs)
        if self.db_engine.dialect.name != "postgresql":
            raise ValueError(
                f"FencedDatabaseSessionService needs PostgreSQL, not {self.db_engine.dialect.name}"
            )
        self._tollgate_ready = False
        self._tollgate_lock = asyncio.Lock()

    async def migrate(self) -> list[int]:
        """Brings tollgate's tables to this version's schema: each migration
        not yet recorded applied and recorded in one transaction, under the
        session-level advisory lock :data:`LOCK_KEY`. Returns the versions
        applied now.

        Raises:
            SchemaTooNewError: A newer tollgate migrated the database.
            SessionDatabaseError: The database failed.
        """
        async with _database("migrate"), self.db_engine.connect() as conn:
            raw = await conn.get_raw_connection()
            pg = raw.driver_connection
            await pg.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
            try:
                await pg.execute(_REGISTRY)
                applied = {r[0] for r in await pg.fetch("SELECT version FROM tollgate_schema_migrations")}
                known = MIGRATIONS[-1][0]
                found = max(applied, default=0)
                if found > known:
                    raise SchemaTooNewError(found, known)
                done = []
                for version, description in MIGRATIONS:
                    if version in applied:
                        continue
                    async with pg.transaction():
                        await pg.execute(migration_sql(version, description))
                        await pg.execute(
                            "INSERT INTO tollgate_schema_migrations (version, description) VALUES ($1, $2)",
                            version,
                            description,
                        )
                    done.append(version)
                return done
            finally:
                try:
                    await pg.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
                except Exception:
                    # It may still hold the lock: never give it back to the pool.
                    await conn.invalidate()

    async def prepare_tables(self) -> None:
        """google-adk's tables, then tollgate's (once per service)."""
        await super().prepare_tables()
        if self._tollgate_ready:
            return
        async with self._tollgate_lock:
            if not self._tollgate_ready:
                await self.migrate()
                self._tollgate_ready = True

    async def take_fence(self, *, app_name: str, user_id: str, session_id: str) -> DbFence:
        """Takes the session's next database fence, making it current: every
        write carrying an earlier one is refused from now on.

        Raises:
            SessionDatabaseError: The database failed.
        """
        async with _database("take a fence"):
            await self.prepare_tables()
            async with self.db_engine.begin() as conn:
                row = (
                    await conn.execute(_TAKE, {"app": app_name, "user": user_id, "session": session_id})
                ).one()
        return DbFence(int(row[0]), uuid.UUID(str(row[1])))

    @asynccontextmanager
    async def _rollback_on_exception_session(self, *, read_only: bool = False) -> AsyncIterator[Any]:
        # google-adk's one way into a transaction: a pending first statement
        # (the fence's check or take) runs first in the next write one.
        async with super()._rollback_on_exception_session(read_only=read_only) as sql_session:
            first = _FIRST.get()
            if first is not None and not first.done and not read_only:
                first.done = True
                await first.run(sql_session)
            yield sql_session

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: Optional[dict[str, Any]] = None,
        session_id: Optional[str] = None,
    ) -> Session:
        async with _database("create"):
            await self.prepare_tables()
            sid = session_id if session_id is not None else str(uuid.uuid4())

            async def take(s: AsyncSession) -> None:
                await s.execute(_TAKE, {"app": app_name, "user": user_id, "session": sid})

            token = _FIRST.set(_First(take))
            try:
                return await super().create_session(
                    app_name=app_name, user_id=user_id, state=state, session_id=sid
                )
            finally:
                _FIRST.reset(token)

    async def get_session(self, **kwargs: Any) -> Optional[Session]:
        async with _database("get"):
            return await super().get_session(**kwargs)

    async def list_sessions(self, **kwargs: Any) -> Any:
        async with _database("list"):
            return await super().list_sessions(**kwargs)

    async def delete_session(self, **kwargs: Any) -> None:
        """Deletes the session and its events; its fence row stays (numbers
        never go back)."""
        async with _database("delete"):
            await super().delete_session(**kwargs)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return await super().append_event(session, event)
        key = f"{session.app_name}/{session.user_id}/{session.id}"
        turn = current_turn()
        fence = turn.db if turn is not None and turn.session_id == session.id else None
        if fence is None:
            raise FenceNotHeldError(key)

        async def check(s: AsyncSession) -> None:
            row = (
                await s.execute(
                    _CHECK, {"app": session.app_name, "user": session.user_id, "session": session.id}
                )
            ).one_or_none()
            if row is None:
                raise StaleFenceError(key, fence.number, 0)
            if int(row[0]) != fence.number or uuid.UUID(str(row[1])) != fence.token:
                raise StaleFenceError(key, fence.number, int(row[0]))

        async with _database("append"):
            await self.prepare_tables()
            token = _FIRST.set(_First(check))
            try:
                return await super().append_event(session, event)
            finally:
                _FIRST.reset(token)
