"""One replica of the cross-process takeover test (test_postgres.py): one
real google-adk turn through a TurnExecutor whose session lease comes from
the sidecar and whose sessions live in PostgreSQL.

    python pg_replica.py <sidecar url> <db url> <user> <session> <ttl ms> held|free <text>

Reports on stdout in lines ``REPORT <json>``: ``in_model`` (a held replica,
once its model was called; its model answers after a line on stdin) and
``done`` (its fences, attempts, answer or error). A free replica retries
while the session is busy, by the refusal's hint, for at most 30 s."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, AsyncGenerator, Optional

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

from tollgate import AsyncClient, SessionBusy
from tollgate.adk import TollgatePlugin, Turn, TurnExecutor, TurnRefused, current_turn
from tollgate.adk.postgres import FencedDatabaseSessionService, FenceError, StaleFenceError

from conftest import token


def report(event: str, turn: Optional[Turn], attempts: int, answer: Optional[str] = None,
           error: Optional[BaseException] = None) -> None:
    r: dict[str, Any] = {"event": event, "attempts": attempts, "answer": answer}
    if turn is not None:
        r["lease_fence"] = turn.fence
        r["db_fence"] = turn.db.number if turn.db else None
    if error is not None:
        r["error"] = error.code if isinstance(error, FenceError) else repr(error)
        if isinstance(error, StaleFenceError):
            r["fence"], r["latest"] = error.fence, error.latest
    print("REPORT " + json.dumps(r), flush=True)


async def main() -> None:
    url, db, user, session, ttl, role, said = sys.argv[1:8]
    held = role == "held"
    sessions = FencedDatabaseSessionService(db)
    await sessions.prepare_tables()
    reached = asyncio.Event()
    answer = asyncio.Event()
    running: list[Turn] = []

    class Model(BaseLlm):
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            turn = current_turn()
            assert turn is not None
            running.append(turn)
            reached.set()
            if held:
                await answer.wait()
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=f"answer to {said}")]))

    client = AsyncClient(url, timeout=5)
    agent = LlmAgent(name="helper", model=Model(), instruction="Be brief.")
    runner = Runner(
        app_name="app",
        agent=agent,
        session_service=sessions,
        plugins=[TollgatePlugin(client, credentials=lambda u: token(u))],
    )
    ex = TurnExecutor(
        runner, client, session_ttl_ms=int(ttl), credentials=lambda u: token(u), postgres_sessions=sessions
    )
    if held:
        async def release() -> None:
            await asyncio.to_thread(sys.stdin.readline)
            answer.set()

        asyncio.get_running_loop().create_task(release())

    async def turn() -> str:
        out = []
        async for e in ex.run_async(
            user_id=user, session_id=session,
            new_message=types.Content(role="user", parts=[types.Part(text=said)]),
        ):
            if e.content and e.content.parts:
                out.extend(p.text for p in e.content.parts if p.text)
        return "".join(out)

    attempts = 0
    while True:
        attempts += 1
        task = asyncio.get_running_loop().create_task(turn())
        if held:
            waiting = asyncio.get_running_loop().create_task(reached.wait())
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if reached.is_set():
                report("in_model", running[-1], attempts)
        try:
            said_back = await task
        except TurnRefused as e:
            if isinstance(e.refusal, SessionBusy) and attempts < 300:
                await asyncio.sleep(min(0.2, max(0.01, (e.retry_after_ms or 100) / 1000)))
                continue
            report("done", None, attempts, error=e)
            break
        except Exception as e:  # the late append's refusal, reported to the parent
            report("done", running[-1] if running else None, attempts, error=e)
            break
        report("done", running[-1], attempts, answer=said_back)
        break
    await client.aclose()
    await sessions.close()


if __name__ == "__main__":
    asyncio.run(main())
