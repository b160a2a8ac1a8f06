"""The README's examples, runnable against a real sidecar.

    cargo run -p tollgate-server -- serve        # the embedded default
    export TOLLGATE_TOKEN=$(cargo run -q -p tollgate-server -- token --user alice)
    python clients/python/examples/quickstart.py

``TOLLGATE_URL`` names another sidecar (default http://127.0.0.1:8787).
The model is a stand-in that answers offline with a fixed usage, so the
example needs no model credentials; the limits are the sidecar's.

It first runs the client example (admit, reserve the plan's estimate,
settle, release: one turn), then registers ``TollgatePlugin`` in three
lines and runs google-adk turns until the plan's turn burst is spent: on
the default plan (bursting to 5 turns) four turns are answered and the
fifth is refused with the plugin's plain message.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import aclosing
from typing import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

import tollgate
from tollgate import AsyncClient
from tollgate.adk import TollgatePlugin

URL = os.environ.get("TOLLGATE_URL", "http://127.0.0.1:8787")
TOKEN = os.environ["TOLLGATE_TOKEN"]


def my_token() -> str:
    return TOKEN


def token_for_user(user_id: str) -> str:
    # The host's verified credential for `user_id`; here the one token.
    return TOKEN


class OfflineLlm(BaseLlm):
    """Answers every call with one line and 812 tokens of usage."""

    model: str = "offline"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text="Here is your answer.")]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=800, candidates_token_count=12, total_token_count=812
            ),
        )


def client_example() -> None:
    with tollgate.Client(URL, token=lambda: my_token()) as c:
        turn = c.admit_run("inv-1")
        if isinstance(turn, tollgate.Refusal):  # TurnRateLimited, ConcurrencyLimited, ...
            print("refused:", turn.error, turn.retry_after_ms, turn.message)
            return
        print(f"admitted inv-1: estimate {turn.estimate_tokens} tokens, max wait {turn.max_wait_ms} ms")
        r = c.reserve("inv-1", turn.estimate_tokens, wait=True, max_wait_ms=turn.max_wait_ms)
        if isinstance(r, tollgate.Refusal):
            print("reserve refused:", r.error, r.message)
        else:
            print(f"reserved {turn.estimate_tokens} tokens as {r.reservation_id}")
            c.settle(r.reservation_id, actual=812)
            print("settled 812")
        c.release_run("inv-1")
        print("released inv-1")


async def adk_example() -> None:
    agent = LlmAgent(name="support_agent", model=OfflineLlm(), instruction="Be brief.")
    app = App(name="support", root_agent=agent,
              plugins=[TollgatePlugin(AsyncClient(URL), credentials=token_for_user)])
    runner = InMemoryRunner(app=app)
    session = await runner.session_service.create_session(app_name="support", user_id="alice")
    for i in range(1, 6):
        message = types.Content(role="user", parts=[types.Part(text=f"question {i}")])
        async with aclosing(runner.run_async(user_id="alice", session_id=session.id, new_message=message)) as events:
            async for event in events:
                for part in (event.content.parts if event.content else None) or []:
                    if part.text:
                        print(f"turn {i}: {part.text}")


if __name__ == "__main__":
    client_example()
    asyncio.run(adk_example())
