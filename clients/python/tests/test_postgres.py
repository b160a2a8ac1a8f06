"""tollgate.adk.postgres in a real PostgreSQL (``TOLLGATE_TEST_PG_URL``,
which ``./scripts/test`` sets to a cluster of its own; a database per
test): tollgate's migrations, the database fence on google-adk's
``DatabaseSessionService``, turns through the TurnExecutor and a takeover
across processes (docs/spec.md §4, *Sessions in PostgreSQL*)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Optional
from urllib.parse import urlsplit

import asyncpg
import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.runners import Runner
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.genai import types

from tollgate.adk import Turn, TurnExecutor, current_turn
from tollgate.adk import _executor
from tollgate.adk.postgres import (
    MIGRATIONS,
    TABLES,
    DbFence,
    FencedDatabaseSessionService,
    FenceNotHeldError,
    SchemaTooNewError,
    SessionDatabaseError,
    StaleFenceError,
    migration_sql,
)

from conftest import ROOT, free_port, start_sidecar, store_config, token
from test_adk import ScriptedLlm, text

HERE = Path(__file__).resolve().parent


@pytest.fixture
async def pg_db() -> AsyncIterator[str]:
    """A fresh database in the suite's PostgreSQL, as a ``postgresql+asyncpg``
    URL; dropped after the test."""
    url = os.environ.get("TOLLGATE_TEST_PG_URL")
    if not url:
        if os.environ.get("TOLLGATE_TEST_REQUIRE_PG"):
            pytest.fail("TOLLGATE_TEST_PG_URL is not set (TOLLGATE_TEST_REQUIRE_PG is set)")
        pytest.skip("TOLLGATE_TEST_PG_URL is not set: run ./scripts/test")
    u = urlsplit(url)
    name = f"tg_py_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(url)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    try:
        yield f"postgresql+asyncpg://{u.username}@{u.hostname}:{u.port}/{name}"
    finally:
        admin = await asyncpg.connect(url)
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


def plain(db: str) -> str:
    return db.replace("postgresql+asyncpg://", "postgresql://")


async def scalar(db: str, sql: str) -> Any:
    c = await asyncpg.connect(plain(db))
    try:
        return await c.fetchval(sql)
    finally:
        await c.close()


def event(eid: str, said: str, delta: Optional[dict[str, Any]] = None, *, at: float = 1.0) -> Event:
    return Event(
        id=eid,
        invocation_id="inv-1",
        author="helper",
        content=types.Content(role="model", parts=[types.Part(text=said)]),
        actions=EventActions(state_delta=delta or {}),
        timestamp=at,
    )


def in_turn(session_id: str, db: Optional[DbFence]) -> Any:
    """Makes this context a turn of ``session_id`` holding ``db``, as the
    TurnExecutor does."""
    return _executor._CURRENT.set(Turn(session_id=session_id, holder="h", fence=1, db=db))


def test_the_migrations_are_the_repositorys_files() -> None:
    d = ROOT / "crates" / "tollgate-adk" / "migrations"
    assert sorted(p.name for p in d.iterdir()) == [
        f"{v:04d}_{desc.replace(' ', '_')}.sql" for v, desc in MIGRATIONS
    ]
    for v, desc in MIGRATIONS:
        assert migration_sql(v, desc) == (d / f"{v:04d}_{desc.replace(' ', '_')}.sql").read_text()


async def test_migrations_apply_once_beside_google_adks_tables(pg_db: str) -> None:
    s = FencedDatabaseSessionService(pg_db)
    assert await s.migrate() == [1, 2]
    assert await s.migrate() == []
    await s.prepare_tables()
    c = await asyncpg.connect(plain(pg_db))
    tables = {r[0] for r in await c.fetch(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")}
    await c.close()
    assert set(TABLES) <= tables
    assert {"sessions", "events", "app_states", "user_states"} <= tables, "google-adk's own"
    # Replicas starting together: one migrates, the others find it done.
    others = [FencedDatabaseSessionService(pg_db) for _ in range(5)]
    assert await asyncio.gather(*(o.migrate() for o in others)) == [[]] * 5
    await asyncio.gather(*(o.close() for o in others))
    await s.close()


async def test_replicas_migrating_together_do_not_race(pg_db: str) -> None:
    services = [FencedDatabaseSessionService(pg_db) for _ in range(6)]
    done = await asyncio.gather(*(s.migrate() for s in services))
    assert sorted(v for d in done for v in d) == [1, 2], done
    assert await scalar(pg_db, "SELECT count(*) FROM tollgate_schema_migrations") == 2
    await asyncio.gather(*(s.close() for s in services))


async def test_a_newer_schema_is_refused(pg_db: str) -> None:
    s = FencedDatabaseSessionService(pg_db)
    await s.migrate()
    c = await asyncpg.connect(plain(pg_db))
    await c.execute("INSERT INTO tollgate_schema_migrations (version, description) VALUES (99, 'later')")
    await c.close()
    with pytest.raises(SchemaTooNewError) as e:
        await s.migrate()
    assert (e.value.found, e.value.known) == (99, 2)
    await s.close()


async def test_appends_are_checked_against_the_database_fence(pg_db: str) -> None:
    s = FencedDatabaseSessionService(pg_db)
    session = await s.create_session(app_name="app", user_id="u1", session_id="s1")

    # Outside a fenced turn: refused, nothing written.
    with pytest.raises(FenceNotHeldError) as none:
        await s.append_event(session, event("e0", "x"))
    assert none.value.code == "session.fence_not_held"

    a = await s.take_fence(app_name="app", user_id="u1", session_id="s1")
    assert a.number == 2, "the create took 1"
    ctx = in_turn("s1", a)
    try:
        session = await s.get_session(app_name="app", user_id="u1", session_id="s1")
        await s.append_event(session, event("e1", "one", {"k": "v1"}))
        # Another take: a's fence is stale, its write refused whole (before
        # google-adk's own staleness check, which would not see it).
        b = await s.take_fence(app_name="app", user_id="u1", session_id="s1")
        with pytest.raises(StaleFenceError) as stale:
            await s.append_event(session, event("e2", "late", {"k": "v2", "app:x": 1, "user:y": 2}))
        assert (stale.value.code, stale.value.fence, stale.value.latest) == ("session.fence_stale", 2, 3)
    finally:
        _executor._CURRENT.reset(ctx)
    stored = await s.get_session(app_name="app", user_id="u1", session_id="s1")
    assert [e.id for e in stored.events] == ["e1"]
    assert stored.state == {"k": "v1"}, "nothing of the refused write"

    # The holder of b writes; the same number with another token does not.
    ctx = in_turn("s1", b)
    try:
        await s.append_event(stored, event("e3", "two", at=2.0))
    finally:
        _executor._CURRENT.reset(ctx)
    forged = DbFence(b.number, uuid.uuid4())
    ctx = in_turn("s1", forged)
    try:
        latest = await s.get_session(app_name="app", user_id="u1", session_id="s1")
        with pytest.raises(StaleFenceError):
            await s.append_event(latest, event("e4", "forged", at=3.0))
    finally:
        _executor._CURRENT.reset(ctx)

    # Deleted and created again: a new fence held by no one; b is stale.
    await s.delete_session(app_name="app", user_id="u1", session_id="s1")
    again = await s.create_session(app_name="app", user_id="u1", session_id="s1")
    ctx = in_turn("s1", b)
    try:
        with pytest.raises(StaleFenceError):
            await s.append_event(again, event("e5", "old holder", at=4.0))
    finally:
        _executor._CURRENT.reset(ctx)
    assert (await s.get_session(app_name="app", user_id="u1", session_id="s1")).events == []
    # A turn of another session holds no fence here.
    ctx = in_turn("other", b)
    try:
        with pytest.raises(FenceNotHeldError):
            await s.append_event(again, event("e6", "x", at=5.0))
    finally:
        _executor._CURRENT.reset(ctx)
    await s.close()


async def test_an_unreachable_database_is_a_transient_error() -> None:
    s = FencedDatabaseSessionService(
        f"postgresql+asyncpg://x@127.0.0.1:{free_port()}/none", pool_timeout=1
    )
    with pytest.raises(SessionDatabaseError) as e:
        await s.take_fence(app_name="app", user_id="u1", session_id="s1")
    assert e.value.transient and e.value.code == "session.database_unavailable"
    with pytest.raises(SessionDatabaseError) as e:
        await s.get_session(app_name="app", user_id="u1", session_id="s1")
    assert e.value.transient
    await s.close()
    with pytest.raises(ValueError):
        FencedDatabaseSessionService("sqlite+aiosqlite:///:memory:")


async def test_turns_through_the_executor_each_under_a_fence_of_its_own(pg_db: str, tmp_path: Path) -> None:
    sc = start_sidecar(tmp_path)
    try:
        from tollgate import AsyncClient

        sessions = FencedDatabaseSessionService(pg_db)
        model = ScriptedLlm(script=[[text("one", used=10)], [text("two", used=10)]])
        agent = LlmAgent(name="helper", model=model, instruction="Be brief.")
        runner = Runner(app_name="app", agent=agent, session_service=sessions)
        client = AsyncClient(sc.url, timeout=5)
        ex = TurnExecutor(runner, client, credentials=lambda u: token(u), postgres_sessions=sessions)
        await sessions.create_session(app_name="app", user_id="pia", session_id="s-pia")
        for said in ("hello", "again"):
            async for _ in ex.run_async(
                user_id="pia", session_id="s-pia",
                new_message=types.Content(role="user", parts=[types.Part(text=said)]),
            ):
                pass
        assert [t.db.number for t in model.turns_seen] == [2, 3]
        stored = await sessions.get_session(app_name="app", user_id="pia", session_id="s-pia")
        assert [(e.author, e.content.parts[0].text) for e in stored.events] == [
            ("user", "hello"), ("helper", "one"), ("user", "again"), ("helper", "two")]
        assert current_turn() is None and ex.in_flight == 0
        await client.aclose()
        await sessions.close()
    finally:
        sc.stop()


async def test_a_database_that_cannot_issue_the_fence_fails_the_turn_and_frees_the_lease(tmp_path: Path) -> None:
    sc = start_sidecar(tmp_path)
    try:
        from tollgate import AsyncClient, SessionLease

        down = FencedDatabaseSessionService(f"postgresql+asyncpg://x@127.0.0.1:{free_port()}/none")
        runner = Runner(app_name="app", agent=LlmAgent(name="helper", model=ScriptedLlm(script=[])),
                        session_service=down)
        client = AsyncClient(sc.url, timeout=5)
        ex = TurnExecutor(runner, client, credentials=lambda u: token(u), postgres_sessions=down)
        with pytest.raises(SessionDatabaseError) as e:
            async for _ in ex.run_async(user_id="ola", session_id="s-ola",
                                        new_message=types.Content(role="user", parts=[types.Part(text="hi")])):
                pass
        assert e.value.transient and ex.in_flight == 0
        async with AsyncClient(sc.url, token=token("ola")) as c:
            assert isinstance(await c.acquire_session_lease("s-ola", "next", 1_000), SessionLease)
        await client.aclose()
        await down.close()
    finally:
        sc.stop()


class Replica:
    """A pg_replica.py process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.output: list[str] = []

    @classmethod
    async def start(cls, sidecar: str, db: str, role: str, said: str, ttl_ms: int) -> "Replica":
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "pg_replica.py"), sidecar, db, "tara", "s-tara", str(ttl_ms), role, said,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=str(HERE),
        )
        return cls(proc)

    async def next(self, event: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
            except asyncio.TimeoutError:
                raise AssertionError(f"no {event} report in 60 s:\n" + "".join(self.output)) from None
            if not line:
                raise AssertionError(f"the replica ended before {event}:\n" + "".join(self.output))
            self.output.append(line.decode())
            if line.startswith(b"REPORT "):
                r = json.loads(line[len(b"REPORT "):])
                assert r["event"] == event, r
                return r

    async def finish(self) -> None:
        assert await asyncio.wait_for(self.proc.wait(), 30) == 0, "".join(self.output)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def test_a_paused_replica_process_is_refused_after_another_takes_over(
    pg_db: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two replica processes share a sidecar on Redis and PostgreSQL: A is
    SIGSTOPped in its model call past its lease; B takes the session once
    the lease ran out and completes a real google-adk turn; A, resumed, has
    its late append refused by the database. The history: A's message, then
    B's whole turn."""
    sc = start_sidecar(tmp_path, store=store_config("redis", request))
    sessions = FencedDatabaseSessionService(pg_db)
    await sessions.create_session(app_name="app", user_id="tara", session_id="s-tara")
    a = await Replica.start(sc.url, pg_db, "held", "from A", 2_000)
    b: Optional[Replica] = None
    try:
        a_in = await a.next("in_model")
        os.kill(a.proc.pid, signal.SIGSTOP)
        b = await Replica.start(sc.url, pg_db, "free", "from B", 2_000)
        b_done = await b.next("done")
        await b.finish()
        assert b_done["answer"] == "answer to from B", b_done
        assert b_done["lease_fence"] > a_in["lease_fence"]
        assert b_done["db_fence"] == a_in["db_fence"] + 1
        assert a.proc.stdin is not None
        a.proc.stdin.write(b"answer\n")
        await a.proc.stdin.drain()
        os.kill(a.proc.pid, signal.SIGCONT)
        a_done = await a.next("done")
        await a.finish()
        assert a_done["error"] == "session.fence_stale", a_done
        assert (a_done["fence"], a_done["latest"]) == (a_in["db_fence"], b_done["db_fence"])
    finally:
        a.kill()
        if b is not None:
            b.kill()
        sc.stop()
    stored = await sessions.get_session(app_name="app", user_id="tara", session_id="s-tara")
    assert [(e.author, e.content.parts[0].text) for e in stored.events] == [
        ("user", "from A"), ("user", "from B"), ("helper", "answer to from B")]
    await sessions.close()
