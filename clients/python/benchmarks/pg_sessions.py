"""The fence's cost on google-adk's sessions in PostgreSQL: append and
whole-session read latency of ``FencedDatabaseSessionService`` beside
google-adk's unfenced ``DatabaseSessionService`` on the same database,
alternated (A B, then B A, per round); 1 KiB events; appends to a session
that holds about 10 or 1,000 events (each sample one append), reads of
10 or 1,000 events (the most recent). Run by hand, never by the suite:

    .venv/bin/python benchmarks/pg_sessions.py postgresql+asyncpg://user@host:port/db 400 100 2

(in a venv with ``pip install -e 'clients/python[postgres]'``; the
database is used for google-adk's and tollgate's tables; sessions of the
app ``bench`` are created and deleted).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.genai import types

from tollgate.adk import Turn
from tollgate.adk import _executor
from tollgate.adk.postgres import FencedDatabaseSessionService

KIB = "x" * 1024


def event(eid: str) -> Event:
    return Event(
        id=eid,
        invocation_id="inv",
        author="helper",
        content=types.Content(role="model", parts=[types.Part(text=KIB)]),
    )


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[max(0, min(len(s) - 1, int(-(-p * len(s) // 1)) - 1))]


async def measure(name: str, svc: DatabaseSessionService, fenced: bool, size: int, appends: int, reads: int) -> None:
    sid = f"s-{size}-{uuid.uuid4().hex[:8]}"
    session = await svc.create_session(app_name="bench", user_id="u", session_id=sid)
    ctx = None
    if isinstance(svc, FencedDatabaseSessionService):
        fence = await svc.take_fence(app_name="bench", user_id="u", session_id=sid)
        # As the TurnExecutor does for a turn.
        ctx = _executor._CURRENT.set(Turn(session_id=sid, holder="bench", fence=1, db=fence))
    try:
        for i in range(size):
            await svc.append_event(session, event(f"fill-{i}"))
        a = []
        for i in range(appends):
            e = event(f"a-{i}")
            t0 = time.perf_counter()
            await svc.append_event(session, e)
            a.append((time.perf_counter() - t0) * 1000)
        r = []
        for _ in range(reads):
            t0 = time.perf_counter()
            got = await svc.get_session(
                app_name="bench", user_id="u", session_id=sid, config=GetSessionConfig(num_recent_events=size)
            )
            r.append((time.perf_counter() - t0) * 1000)
            assert got is not None and len(got.events) == size
    finally:
        if ctx is not None:
            _executor._CURRENT.reset(ctx)
    await svc.delete_session(app_name="bench", user_id="u", session_id=sid)
    print(f"{name:8} {size:5}-event session: append n={len(a)} p50={statistics.median(a):.2f} ms "
          f"p99={pct(a, 0.99):.2f} ms | read n={len(r)} p50={statistics.median(r):.2f} ms p99={pct(r, 0.99):.2f} ms",
          flush=True)


async def main() -> None:
    url, appends, reads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    fenced = FencedDatabaseSessionService(url)
    plain = DatabaseSessionService(url)
    await fenced.prepare_tables()
    await plain.prepare_tables()
    services = [("fenced", fenced, True), ("google", plain, False)]
    for rnd in range(rounds):
        order = services if rnd % 2 == 0 else list(reversed(services))
        for size in (10, 1_000):
            for name, svc, is_fenced in order:
                await measure(f"{name}", svc, is_fenced, size, appends, reads)
    await fenced.close()
    await plain.close()


if __name__ == "__main__":
    asyncio.run(main())
