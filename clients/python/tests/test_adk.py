"""tollgate.adk with google-adk's real InMemoryRunner and a scripted BaseLlm
(no network) against a real ``tollgate serve``.

The sidecar's default plan here is "meter" (tokens refill 1 an hour), so a
balance read through the admin user view is exact in real time.
"""

from __future__ import annotations

import asyncio
import os
import re
from contextlib import aclosing
from typing import Any, AsyncGenerator, Optional

import httpx
import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import errors as genai_errors
from google.genai import types
from pydantic import ConfigDict

import tollgate
from tollgate import AsyncClient, Overloaded, SessionBusy
from tollgate.adk import (
    UNAVAILABLE_TEXT,
    ProviderGate,
    QuotaGatedLlm,
    TollgatePlugin,
    TurnExecutor,
    TurnRefused,
    current_turn,
)

from conftest import ADMIN, Sidecar, free_port, token

FULL = 100_000
HANG = "hang"


def usage(total: int) -> types.GenerateContentResponseUsageMetadata:
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=total - 10, candidates_token_count=10, total_token_count=total
    )


def text(t: str, *, partial: Optional[bool] = None, used: Optional[int] = None) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=t)]),
        partial=partial,
        usage_metadata=usage(used) if used is not None else None,
    )


class ScriptedLlm(BaseLlm):
    """A model that answers from a script: one list per call, of responses,
    exceptions to raise, sleeps (floats, seconds) or HANG (wait forever)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "scripted"
    script: list[list[Any]] = []
    calls: int = 0
    turns_seen: list[Any] = []

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.calls += 1
        self.turns_seen.append(current_turn())
        step = self.script.pop(0)
        for item in step:
            if isinstance(item, BaseException):
                raise item
            if item == HANG:
                await asyncio.Event().wait()
            elif isinstance(item, float):
                await asyncio.sleep(item)
            else:
                yield item


class Counting(AsyncClient):
    """An AsyncClient that records the closes and renewals it sends."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.log: list[tuple[str, Any]] = []

    async def settle(self, reservation_id: str, actual: int, **kw: Any) -> Any:
        self.log.append(("settle", actual))
        return await super().settle(reservation_id, actual, **kw)

    async def refund(self, reservation_id: str, **kw: Any) -> Any:
        self.log.append(("refund", reservation_id))
        return await super().refund(reservation_id, **kw)

    async def renew_run(self, invocation_id: str, **kw: Any) -> Any:
        self.log.append(("renew", invocation_id))
        return await super().renew_run(invocation_id, **kw)

    def count(self, op: str) -> int:
        return sum(1 for (o, _) in self.log if o == op)


def lookup(q: str) -> dict:
    """A tool the scripted model calls."""
    return {"answer": q.upper()}


async def make(
    url: str, script: list[list[Any]], *, user: str = "ann", fail_open: bool = False, llm: Any = None, **kw: Any
):
    model = llm or ScriptedLlm(script=script)
    agent = LlmAgent(name="helper", model=model, instruction="Be brief.", tools=[lookup])
    client = Counting(url, timeout=5)
    plugin = TollgatePlugin(client, fail_open=fail_open, credentials=lambda u: token(u), **kw)
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[plugin]))
    session = await runner.session_service.create_session(app_name="app", user_id=user)
    return runner, session, model, client, plugin


def msg(t: str = "hello") -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=t)])


async def run_all(runner: InMemoryRunner, user: str, sid: str, **kw: Any) -> list[Any]:
    out = []
    async with aclosing(runner.run_async(user_id=user, session_id=sid, new_message=msg(), **kw)) as ev:
        async for e in ev:
            out.append(e)
    return out


def texts(events: list[Any]) -> list[str]:
    return [p.text for e in events if e.content for p in (e.content.parts or []) if p.text]


async def admin_user(sc: Sidecar, user: str) -> dict:
    async with httpx.AsyncClient() as h:
        r = await h.get(f"{sc.url}/admin/users/{user}", headers={"authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        return r.json()


async def test_turn_admitted_settled_once_across_streamed_chunks_and_released(meter_sidecar: Sidecar) -> None:
    script = [[text("Hel", partial=True, used=3), text("lo", partial=True, used=5), text("Hello", used=1234)]]
    runner, s, model, client, plugin = await make(meter_sidecar.url, script)
    events = await run_all(runner, "ann", s.id, run_config=RunConfig(streaming_mode=StreamingMode.SSE))
    assert "Hello" in texts(events)
    assert model.calls == 1
    assert client.log == [("settle", 1234)], "settled exactly once, on the final chunk"
    u = await admin_user(meter_sidecar, "ann")
    assert u["leases"] == [] and u["tokens_available"] == FULL - 1234
    assert plugin.active_turns == 0


async def test_example_1_through_real_turns(sidecar: Sidecar) -> None:
    """SPEC §7 example 1 through google-adk turns on the "support" plan:
    five turns answered, the sixth refused for the turn rate with a plain
    message asking to retry in about 3 s (1 turn per 3 s; up to 1 s of real
    time may pass during the five turns)."""
    script = [[text(f"answer {i}", used=100)] for i in range(5)]
    runner, s, model, client, plugin = await make(sidecar.url, script, user="carl")
    for i in range(5):
        assert texts(await run_all(runner, "carl", s.id)) == [f"answer {i}"]
    (denied,) = texts(await run_all(runner, "carl", s.id))
    assert "turn_rate" in denied and "too many requests" in denied, denied
    assert re.search(r"retry in [23] s", denied), denied
    assert model.calls == 5
    assert (await admin_user(sidecar, "carl"))["leases"] == []


async def test_example_3_through_a_real_turn(sidecar: Sidecar) -> None:
    """SPEC §7 example 3 through a google-adk turn: the token bucket empty,
    the call's 6,000-token estimate needs about 6 s, past the 2 s max wait:
    the model is not called and the turn stops early asking to retry in
    about 4 s; nothing is taken."""
    async with AsyncClient(sidecar.url, token=token("dora"), admin_token=ADMIN) as c:
        await c.admit_run("elsewhere")
        await c.reserve("elsewhere", 60_000)
        runner, s, model, client, plugin = await make(sidecar.url, [[text("never")]], user="dora")
        (stopped,) = texts(await run_all(runner, "dora", s.id))
        assert "stopped early" in stopped and "token_rate" in stopped, stopped
        assert re.search(r"retry in [34] s", stopped), stopped
        assert model.calls == 0
        u = await c.admin_user("dora")
        assert [x.invocation_id for x in u.leases] == ["elsewhere"]
        assert u.tokens_available < 1_000


# A host process running one google-adk turn under the plugin, its model
# hanging: it prints "held" once the model is called, then waits to be
# killed (an agent process that dies mid-run, abandoning its lease).
ABANDONING_HOST = r"""
import asyncio, sys
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.runners import InMemoryRunner
from google.genai import types
from tollgate import AsyncClient
from tollgate.adk import TollgatePlugin

class Hang(BaseLlm):
    model: str = "hang"

    async def generate_content_async(self, llm_request, stream=False):
        print("held", flush=True)
        await asyncio.Event().wait()
        yield

async def main(url, tok):
    agent = LlmAgent(name="helper", model=Hang(), instruction="Be brief.")
    plugin = TollgatePlugin(AsyncClient(url), credentials=lambda u: tok)
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[plugin]))
    s = await runner.session_service.create_session(app_name="app", user_id="eve")
    hi = types.Content(role="user", parts=[types.Part(text="hi")])
    async for _ in runner.run_async(user_id="eve", session_id=s.id, new_message=hi):
        pass

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_example_4_through_real_turns(sidecar: Sidecar) -> None:
    """SPEC §7 example 4 through google-adk turns (plan "four": 2 concurrent
    runs, a 1 s lease TTL, a turn bucket that does not refill during the
    test): two runs active, a third turn is denied for concurrency and
    charges no turn; after one run releases, the next turn is admitted; a
    run abandoned without release (its host process killed) holds its lease
    until the TTL, then a turn is admitted (within 3 s of the kill)."""
    import signal
    import sys

    sse = RunConfig(streaming_mode=StreamingMode.SSE)

    async def hold() -> Any:
        """A run of this process, active (its model streaming, then hanging)."""
        runner, s, _, _, _ = await make(sidecar.url, [[text("working", partial=True), HANG]], user="eve")
        agen = runner.run_async(user_id="eve", session_id=s.id, new_message=msg(), run_config=sse)
        assert texts([await agen.__anext__()]) == ["working"]
        return agen

    async def turn(answer: str) -> tuple[list[str], int]:
        runner, s, model, _, _ = await make(sidecar.url, [[text(answer, used=10)]], user="eve")
        out = texts(await run_all(runner, "eve", s.id))
        return out, model.calls

    a = await hold()
    host = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ABANDONING_HOST, sidecar.url, token("eve"), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert await asyncio.wait_for(host.stdout.readline(), 60) == b"held\n"
        before = await admin_user(sidecar, "eve")
        assert len(before["leases"]) == 2

        # A third turn: denied for concurrency, the model never called,
        # nothing charged to the turn bucket.
        (denied,), calls = await turn("never")
        assert "concurrency" in denied and calls == 0, denied
        after = await admin_user(sidecar, "eve")
        assert after["turns_available"] == before["turns_available"]
        assert len(after["leases"]) == 2

        # One run releases: the next turn is admitted.
        await a.aclose()
        assert await turn("next") == (["next"], 1)

        # Another run active, and the host process killed mid-run: its
        # lease stays until the TTL, so a turn is denied, then admitted.
        b = await hold()
        host.send_signal(signal.SIGKILL)
        await host.wait()
        (denied,), calls = await turn("never")
        assert "concurrency" in denied and calls == 0, denied
        for _ in range(60):
            leases = (await admin_user(sidecar, "eve"))["leases"]
            if len(leases) == 1:
                break
            await asyncio.sleep(0.05)
        assert len(leases) == 1, "the abandoned lease expired by its TTL"
        assert await turn("after expiry") == (["after expiry"], 1)
        await b.aclose()
        assert (await admin_user(sidecar, "eve"))["leases"] == []
    finally:
        if host.returncode is None:
            host.kill()
            await host.wait()


async def test_denied_turn_answers_a_plain_message(meter_sidecar: Sidecar) -> None:
    runner, s, model, client, plugin = await make(meter_sidecar.url, [[text("never")]])
    # The plan's two runs are held elsewhere.
    async with AsyncClient(meter_sidecar.url, token=token("ann")) as other:
        assert isinstance(await other.admit_run("x1"), tollgate.Admitted)
        assert isinstance(await other.admit_run("x2"), tollgate.Admitted)
        events = await run_all(runner, "ann", s.id)
        (only,) = texts(events)
        assert "not started" in only and "concurrency" in only and "retry in 1 s" in only, only
        assert events[-1].author == "model"
        assert model.calls == 0
        u = await admin_user(meter_sidecar, "ann")
        assert sorted(x["invocation_id"] for x in u["leases"]) == ["x1", "x2"]
        assert u["turns_available"] == 98, "a refused turn charges nothing"


async def test_model_error_refunds(meter_sidecar: Sidecar) -> None:
    script = [[text("par", partial=True, used=2), RuntimeError("model down")]]
    runner, s, model, client, plugin = await make(meter_sidecar.url, script)
    with pytest.raises(RuntimeError, match="model down"):
        await run_all(runner, "ann", s.id, run_config=RunConfig(streaming_mode=StreamingMode.SSE))
    assert client.count("refund") == 1 and client.count("settle") == 0
    u = await admin_user(meter_sidecar, "ann")
    assert u["leases"] == [] and u["tokens_available"] == FULL


async def test_stopping_iteration_early_releases_and_refunds_at_once(meter_sidecar: Sidecar) -> None:
    script = [[text("partial", partial=True), HANG]]
    runner, s, model, client, plugin = await make(meter_sidecar.url, script)
    agen = runner.run_async(
        user_id="ann", session_id=s.id, new_message=msg(), run_config=RunConfig(streaming_mode=StreamingMode.SSE)
    )
    first = await agen.__anext__()
    assert texts([first]) == ["partial"]
    held = await admin_user(meter_sidecar, "ann")
    assert len(held["leases"]) == 1 and held["tokens_available"] < FULL
    await agen.aclose()
    # Nothing leaks, immediately (no TTL wait).
    u = await admin_user(meter_sidecar, "ann")
    assert u["leases"] == [] and u["tokens_available"] == FULL
    assert client.count("refund") == 1 and client.count("settle") == 0
    assert plugin.active_turns == 0


async def test_cancelling_the_callers_task_releases_and_refunds(meter_sidecar: Sidecar) -> None:
    """A hard cancel (the task iterating the run is cancelled: google-adk
    2.13 then skips after_run_callback) is cleaned up when that task ends."""
    runner, s, model, client, plugin = await make(meter_sidecar.url, [[HANG]])
    task = asyncio.create_task(run_all(runner, "ann", s.id))
    for _ in range(100):
        await asyncio.sleep(0.02)
        if model.calls == 1:
            break
    assert len((await admin_user(meter_sidecar, "ann"))["leases"]) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(50):
        if plugin.active_turns == 0 and client.count("refund") == 1:
            break
        await asyncio.sleep(0.02)
    u = await admin_user(meter_sidecar, "ann")
    assert u["leases"] == [] and u["tokens_available"] == FULL
    assert client.count("refund") == 1


async def test_a_refused_reservation_stops_the_turn_early(meter_sidecar: Sidecar) -> None:
    """Plan "onecall": one model call per run. The model asks for a tool; the
    second call is refused (max_llm_calls) and the turn ends with a plain
    message."""
    call = types.Part(function_call=types.FunctionCall(name="lookup", args={"q": "x"}))
    script = [[LlmResponse(content=types.Content(role="model", parts=[call]), usage_metadata=usage(100))]]
    runner, s, model, client, plugin = await make(meter_sidecar.url, script, user="onecall")
    events = await run_all(runner, "onecall", s.id)
    assert model.calls == 1
    last = texts(events)[-1]
    assert "stopped early" in last and "max_llm_calls" in last, last
    u = await admin_user(meter_sidecar, "onecall")
    assert u["leases"] == []


async def test_a_run_longer_than_its_lease_keeps_it(tmp_path) -> None:
    """Plan "short": lease_ttl 600 ms. The model takes 1.3 s; the lease is
    renewed every 200 ms, so it is still held at 0.9 s, and released at the
    end."""
    from conftest import start_sidecar

    sc = start_sidecar(tmp_path)
    try:
        runner, s, model, client, plugin = await make(sc.url, [[1.3, text("done", used=10)]], user="shorty")
        task = asyncio.create_task(run_all(runner, "shorty", s.id))
        await asyncio.sleep(0.9)
        mid = await admin_user(sc, "shorty")
        assert len(mid["leases"]) == 1, mid
        await task
        assert client.count("renew") >= 3
        assert (await admin_user(sc, "shorty"))["leases"] == []
    finally:
        sc.stop()


async def test_fail_closed_and_fail_open_when_the_sidecar_is_unreachable() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    runner, s, model, client, plugin = await make(dead, [[text("answered", used=5)]], fail_open=False)
    events = await run_all(runner, "ann", s.id)
    assert texts(events) == [UNAVAILABLE_TEXT] and model.calls == 0
    runner, s, model, client, plugin = await make(dead, [[text("answered", used=5)]], fail_open=True)
    events = await run_all(runner, "ann", s.id)
    assert texts(events) == ["answered"] and model.calls == 1
    assert plugin.active_turns == 0


async def test_turn_executor_cap_session_lease_and_fence(meter_sidecar: Sidecar) -> None:
    script = [[0.5, text("one", used=10)], [text("two", used=10)], [HANG]]
    runner, s, model, client, plugin = await make(meter_sidecar.url, script)
    ex = TurnExecutor(runner, client, max_in_flight=2, session_ttl_ms=3_000, credentials=lambda u: token(u))

    async def turn() -> list[Any]:
        out = []
        async with aclosing(ex.run_async(user_id="ann", session_id=s.id, new_message=msg())) as ev:
            async for e in ev:
                out.append(e)
        return out

    first = asyncio.create_task(turn())
    await asyncio.sleep(0.2)
    # A second turn of the same session: busy, with the remaining TTL.
    with pytest.raises(TurnRefused) as busy:
        await turn()
    assert isinstance(busy.value.refusal, SessionBusy)
    assert 2_000 <= busy.value.retry_after_ms <= 3_000
    assert ex.in_flight == 1
    assert texts(await first) == ["one"]
    assert ex.in_flight == 0
    # The next turn takes the session over: the fence grows.
    assert texts(await turn()) == ["two"]
    assert [t.fence for t in model.turns_seen] == [1, 2]
    assert current_turn() is None
    # The per-process cap: a hanging turn in each of two slots, a third is Overloaded.
    other = await runner.session_service.create_session(app_name="app", user_id="ann")
    model.script.append([HANG])
    hang1 = ex.run_async(user_id="ann", session_id=s.id, new_message=msg())
    hang2 = ex.run_async(user_id="ann", session_id=other.id, new_message=msg())
    t1 = asyncio.create_task(hang1.__anext__())
    t2 = asyncio.create_task(hang2.__anext__())
    await asyncio.sleep(0.3)
    assert ex.in_flight == 2
    with pytest.raises(Overloaded) as over:
        await ex.run_async(user_id="ann", session_id="third", new_message=msg()).__anext__()
    assert over.value.retry_after_ms == 1_000
    # Cancelling the hanging turns releases their session leases.
    t1.cancel()
    t2.cancel()
    await asyncio.gather(t1, t2, return_exceptions=True)
    await hang1.aclose()
    await hang2.aclose()
    assert ex.in_flight == 0
    async with AsyncClient(meter_sidecar.url, token=token("ann")) as c:
        assert isinstance(await c.acquire_session_lease(s.id, "someone", 1_000), tollgate.SessionLease)
        assert isinstance(await c.acquire_session_lease(other.id, "someone", 1_000), tollgate.SessionLease)
    await asyncio.sleep(0.1)
    u = await admin_user(meter_sidecar, "ann")
    assert u["leases"] == [], u


async def test_provider_429_fed_back_pauses_the_pool(meter_sidecar: Sidecar) -> None:
    quota = genai_errors.ClientError(
        429,
        {"error": {"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED"}},
        httpx.Response(429, headers={"retry-after": "5"}),
    )
    inner = ScriptedLlm(script=[[quota], [text("never", used=1)]])
    async with AsyncClient(meter_sidecar.url, token=lambda: token("ann")) as pc:
        gate = ProviderGate(pc, "gemini", "flash", feedback_token=token("svc", scope="tollgate:feedback"))
        llm = QuotaGatedLlm(model="flash", inner=inner, gate=gate)
        runner, s, _, client, plugin = await make(meter_sidecar.url, [], llm=llm)
        with pytest.raises(genai_errors.ClientError):
            await run_all(runner, "ann", s.id)
        async with AsyncClient(meter_sidecar.url, admin_token=ADMIN) as admin:
            view = await admin.admin_provider("gemini", "flash")
        assert view.cooldown_until_ms is not None and view.cooldown_remaining_ms > 0
        # The next call is refused a permit: the model is not called, the
        # reservation is refunded.
        with pytest.raises(TurnRefused) as refused:
            await run_all(runner, "ann", s.id)
        assert isinstance(refused.value.refusal, tollgate.ProviderLimited)
        assert inner.calls == 1
        assert client.count("refund") == 2
        u = await admin_user(meter_sidecar, "ann")
        assert u["leases"] == [] and u["tokens_available"] == FULL


async def fair_turns(sc: Sidecar, **gated: Any) -> None:
    """On "gemini:fair" (6 requests/min, burst 10, tenants a and b weighted
    3:1), users a1 (tenant a) and b1 (tenant b), one model call a turn:
    after a1's call, b1 books four (two within its lead, two from its part
    of the burst); its fifth permit is refused by the fair gate although the
    pool still holds five (b is three permits past its share: 120 s at a
    quarter of the pool), the model is not called and the reservation is
    refunded; a1's next call is granted."""
    inner = ScriptedLlm(script=[[text("ok", used=1)] for _ in range(6)])
    async with AsyncClient(sc.url, token=lambda: token("svc")) as pc:
        gate = ProviderGate(pc, "gemini", "fair")
        llm = QuotaGatedLlm(model="fair", inner=inner, gate=gate, **gated)
        runner, _, _, client, _ = await make(sc.url, [], llm=llm)
        sid = {}
        for u in ("a1", "b1"):
            sid[u] = (await runner.session_service.create_session(app_name="app", user_id=u)).id
        assert texts(await run_all(runner, "a1", sid["a1"])) == ["ok"]
        for _ in range(4):
            assert texts(await run_all(runner, "b1", sid["b1"])) == ["ok"]
        with pytest.raises(TurnRefused) as refused:
            await run_all(runner, "b1", sid["b1"])
        limited = refused.value.refusal
        assert isinstance(limited, tollgate.ProviderLimited), limited
        assert 100_000 < limited.retry_after_ms <= 120_000, limited
        assert inner.calls == 5
        assert client.count("refund") == 1
        assert texts(await run_all(runner, "a1", sid["a1"])) == ["ok"]
        assert inner.calls == 6
        # The admin view: both ahead of their shares, b (past its share)
        # about 120 s, a less; of the six calls granted, two were a's.
        async with AsyncClient(sc.url, admin_token=ADMIN) as admin:
            view = await admin.admin_provider("gemini", "fair")
        rows = {t.name: t for t in view.tenants}
        assert set(rows) == {"a", "b"}, view.tenants
        assert (rows["a"].weight, rows["b"].weight) == (3, 1)
        assert rows["a"].active and rows["b"].active
        assert 100_000 < rows["b"].booked_ahead_ms <= 200_000, rows["b"]
        assert 0 < rows["a"].booked_ahead_ms < rows["b"].booked_ahead_ms, rows["a"]
        assert rows["a"].recent_share == pytest.approx(2 / 6), rows["a"]


async def test_quota_gated_llm_sends_each_callers_tenant(meter_sidecar: Sidecar) -> None:
    """Fair sharing through QuotaGatedLlm with the tenant sent in the body
    (``tenant_of``, for a sidecar that takes it as sent)."""
    await fair_turns(meter_sidecar, tenant_of=lambda user: user[0])


async def test_quota_gated_llm_asks_with_each_callers_token(claim_sidecar: Sidecar) -> None:
    """Fair sharing through QuotaGatedLlm with each caller's own token (the
    sidecar takes the tenant from its verified ``org`` claim); a tenant sent
    that differs from the claim is refused as forbidden."""
    await fair_turns(claim_sidecar, credentials=lambda user: token(user, org=user[0]))
    async with AsyncClient(claim_sidecar.url, token=lambda: token("b1", org="b")) as pc:
        with pytest.raises(tollgate.TollgateError) as e:
            await ProviderGate(pc, "gemini", "fair").permit(1, tenant="a")
        assert e.value.status == 403, e.value


def test_the_readme_quickstart_runs(sidecar: Sidecar) -> None:
    """examples/quickstart.py (the README's client example and its three-line
    plugin registration) against a real sidecar on the "support" plan
    (bursting to 5 turns): the client's turn, then four google-adk turns
    answered and the fifth refused with the plugin's plain message."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
    env = dict(os.environ, TOLLGATE_URL=sidecar.url, TOLLGATE_TOKEN=token("alice"))
    out = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:4] == [
        "admitted inv-1: estimate 6000 tokens, max wait 2000 ms",
        "reserved 6000 tokens as 1.inv-1",
        "settled 812",
        "released inv-1",
    ], out.stdout
    assert lines[4:8] == [f"turn {i}: Here is your answer." for i in range(1, 5)], out.stdout
    assert lines[8].startswith("turn 5: This request was not started: ") and "turn_rate" in lines[8], out.stdout
    assert len(lines) == 9, out.stdout
