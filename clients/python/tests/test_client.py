"""tollgate.Client and tollgate.AsyncClient against a real ``tollgate serve``:
every operation of docs/spec.md §8, refusals as values, faults raised,
retries of 503s, SPEC §7 examples 1, 3 and 4 in real time."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import tollgate
from tollgate import (
    Admitted,
    AsyncClient,
    Client,
    Closed,
    ConcurrencyLimited,
    ExceedsCapacity,
    FenceCurrent,
    Forbidden,
    InvalidRequest,
    LeaseLost,
    MaxLlmCalls,
    NotHolder,
    ProviderLimited,
    ProviderPermit,
    Released,
    RetryPolicy,
    SessionBusy,
    SessionLease,
    SidecarUnreachable,
    StaleFence,
    StoreUnavailable,
    TokenRateLimited,
    TurnRateLimited,
    Unauthorized,
    UnknownReservation,
)

from conftest import ADMIN, Sidecar, free_port, token


def near(v: int, expected: int, slack: int = 3_000) -> bool:
    """``v`` is ``expected`` plus at most ``slack`` of real-time refill (the
    support plan refills 1 token per ms; the sidecar has no fake clock)."""
    return expected <= v <= min(60_000, expected + slack)


def client(sc: Sidecar, user: str = "alice", **kw) -> Client:
    return Client(sc.url, token=lambda: token(user), admin_token=ADMIN, **kw)


def test_every_operation_sync(sidecar: Sidecar) -> None:
    with client(sidecar) as c:
        assert c.healthz() is True
        assert c.readyz() is True
        # Admit with a session: the plan's numbers come with it.
        a = c.admit_run("run-1", session_id="conv", session_ttl_ms=10_000)
        assert isinstance(a, Admitted), a
        assert (a.lease_ttl_ms, a.estimate_tokens, a.max_wait_ms, a.max_llm_calls) == (
            120_000,
            6_000,
            2_000,
            500,
        )
        assert isinstance(a.session, SessionLease) and a.session.fence == 1
        now_ms = int(time.time() * 1000)
        assert abs(a.lease_expires_at_ms - (now_ms + 120_000)) < 5_000
        r = c.renew_run("run-1")
        assert isinstance(r, tollgate.Renewed) and r.lease_expires_at_ms >= a.lease_expires_at_ms
        # Tokens.
        res = c.reserve("run-1", 6_000)
        assert isinstance(res, tollgate.Reservation) and res.wait_ms == 0
        s = c.settle(res.reservation_id, 4_000)
        assert isinstance(s, Closed) and near(s.balance, 56_000) and s.done
        # A repeat changes nothing.
        assert near(c.settle(res.reservation_id, 9_000).balance, 56_000)
        res2 = c.reserve("run-1", 1_000)
        assert near(c.refund(res2.reservation_id).balance, 56_000)
        assert isinstance(c.refund("1.nope"), UnknownReservation)
        # Release the run with its session.
        rel = c.release_run("run-1", session_id="conv")
        assert rel == Released(released=True, pending=False)
        assert c.release_run("run-1") == Released(released=False)
        assert isinstance(c.renew_run("run-1"), LeaseLost)
        # Session leases and fences.
        l1 = c.acquire_session_lease("s", "h1", 5_000)
        assert isinstance(l1, SessionLease) and l1.fence == 1
        busy = c.acquire_session_lease("s", "h2", 5_000)
        assert isinstance(busy, SessionBusy) and 0 < busy.retry_after_ms <= 5_000
        assert isinstance(c.renew_session_lease("s", "h1", 5_000), SessionLease)
        assert isinstance(c.renew_session_lease("s", "h2", 5_000), NotHolder)
        assert c.check_fence("s", 1) == FenceCurrent(True)
        assert c.release_session_lease("s", "h1") == Released(released=True)
        assert isinstance(c.release_session_lease("s", "h1"), NotHolder)
        # A takeover bumps the fence; the old one is stale.
        l2 = c.acquire_session_lease("s", "h2", 5_000)
        assert l2.fence == 2
        stale = c.check_fence("s", 1)
        assert isinstance(stale, StaleFence) and stale.latest_fence == 2
        # Providers: a permit, and feedback with the privileged credential.
        p = c.provider_permit("gemini", "flash", 100)
        assert isinstance(p, ProviderPermit) and p.effective_permille == 1000
        with pytest.raises(Forbidden) as e:
            c.provider_feedback("gemini", "flash", 429, {"retry-after": "2"})
        assert e.value.operation == "provider_feedback" and e.value.error == "forbidden"
        fb = c.provider_feedback(
            "gemini", "flash", 429, {"retry-after": "2"}, token=token("svc", scope="tollgate:feedback")
        )
        assert fb.klass == "throttled" and fb.cooldown_until_ms is not None
        # A 429 fed back pauses the pool.
        paused = c.provider_permit("gemini", "flash", 100)
        assert isinstance(paused, ProviderLimited) and paused.error == "provider_cooldown"
        assert paused.retry_after_ms and paused.retry_after_ms > 0
        # Admin routes.
        view = c.admin_provider("gemini", "flash")
        assert view.cooldown_until_ms is not None
        assert [(v.provider, v.model) for v in c.admin_providers()] == [("gemini", "fair"), ("gemini", "flash")]
        cleared = c.admin_clear_provider("gemini", "flash")
        assert cleared.cleared["cooldown_until_ms"] is not None
        assert isinstance(c.provider_permit("gemini", "flash", 100), ProviderPermit)
        u = c.admin_user("alice")
        assert u.plan == "support" and u.leases == () and near(u.tokens_available, 56_000)
        assert u.tokens_last_minute == 4_000
        assert [t.user for t in c.admin_top(5)] == ["alice"]
        assert c.admin_release_lease("alice", "nothing") == Released(released=False)
        assert c.admin_reset("alice") is True
        assert c.admin_user("alice").tokens_available == 60_000
        rl = c.admin_reload()
        assert rl.reloaded is True and rl.needs_restart == ()


def test_refusals_are_values_and_faults_raise(sidecar: Sidecar) -> None:
    with client(sidecar) as c:
        # max_llm_calls: not retryable.
        one = Client(sidecar.url, token=token("onecall"))
        assert isinstance(one.admit_run("r"), Admitted)
        assert isinstance(one.reserve("r", 10), tollgate.Reservation)
        m = one.reserve("r", 10)
        assert isinstance(m, MaxLlmCalls) and m.retry_after_ms is None and not m.retryable
        one.close()
        # Exceeds capacity: the bucket can never hold it.
        e = c.reserve("r", 10_000_000)
        assert isinstance(e, ExceedsCapacity) and e.limit == "token_rate"
        # Faults: bad input names the field; no identity is 401.
        with pytest.raises(InvalidRequest) as bad:
            c.reserve("r", 0)
        assert bad.value.field == "estimate" and bad.value.operation == "reserve"
        assert bad.value.status == 400
        with pytest.raises(Unauthorized) as unauth:
            Client(sidecar.url, token="not-a-jwt").admit_run("x")
        assert unauth.value.error == "unauthorized" and unauth.value.operation == "admit_run"
        with pytest.raises(InvalidRequest):
            c.admit_run("bad\u0001id")


def test_example_1_turn_burst_then_denied(sidecar: Sidecar) -> None:
    """SPEC §7 example 1 in real time: 5 turns allowed, the 6th denied for
    the turn rate with a hint of about 3 s (1 turn per 3 s; tolerance 1 s
    for the time the test itself takes: the sidecar has no fake clock)."""
    with client(sidecar) as c:
        for i in range(5):
            assert isinstance(c.admit_run(f"t{i}"), Admitted)
            c.release_run(f"t{i}")
        d = c.admit_run("t6")
        assert isinstance(d, TurnRateLimited), d
        assert d.limit == "turn_rate" and 2_000 <= d.retry_after_ms <= 3_000, d
        assert "turn" in d.message


def test_example_3_token_wait_bound(sidecar: Sidecar) -> None:
    """SPEC §7 example 3: the bucket emptied, a 6,000-token call needs about
    6 s, past the 2 s max wait: refused with a hint of about 4 s, taking
    nothing; with a 6 s max wait it is granted with about a 6 s wait
    (decide-only, so the test does not sleep it). Tolerances: up to 1 s of
    real-time refill between the requests on a loaded machine."""
    with client(sidecar) as c:
        c.admit_run("r")
        empty = c.reserve("r", 60_000)
        assert isinstance(empty, tollgate.Reservation) and empty.wait_ms == 0
        d = c.reserve("r", 6_000)
        assert isinstance(d, TokenRateLimited), d
        assert 3_000 <= d.retry_after_ms <= 4_000, d
        assert c.admin_user("alice").tokens_available <= 100
    with Client(sidecar.url, token=token("patient"), admin_token=ADMIN) as p:
        p.admit_run("r")
        p.reserve("r", 60_000)
        g = p.reserve("r", 6_000)
        assert isinstance(g, tollgate.Reservation) and 5_000 <= g.wait_ms <= 6_000, g


def test_example_4_concurrency(sidecar: Sidecar) -> None:
    """SPEC §7 example 4: two runs held, a third denied for concurrency with
    nothing charged to the turn bucket; after a release the next is admitted;
    an abandoned run's slot returns when its lease expires (plan "short",
    lease_ttl 600 ms: the test waits 700 ms)."""
    with client(sidecar, user="shorty") as c:
        assert isinstance(c.admit_run("a"), Admitted)
        assert isinstance(c.admit_run("b"), Admitted)
        turns_before = c.admin_user("shorty").turns_available
        d = c.admit_run("c")
        assert isinstance(d, ConcurrencyLimited) and d.retry_after_ms > 0
        assert c.admin_user("shorty").turns_available == turns_before
        c.release_run("a")
        assert isinstance(c.admit_run("c"), Admitted)
        # b and c held; abandon both (no release): admitted once they expire.
        assert isinstance(c.admit_run("d"), ConcurrencyLimited)
        time.sleep(0.7)
        assert isinstance(c.admit_run("d"), Admitted)


async def test_every_operation_async(sidecar: Sidecar) -> None:
    async def tok() -> str:
        await asyncio.sleep(0)
        return token("bob")

    async with AsyncClient(sidecar.url, token=tok, admin_token=ADMIN) as c:
        assert await c.healthz() is True
        a = await c.admit_run("run-1", session_id="conv")
        assert isinstance(a, Admitted) and a.session is not None
        assert isinstance(await c.renew_run("run-1"), tollgate.Renewed)
        res = await c.reserve("run-1", 1_000, wait=True, max_wait_ms=a.max_wait_ms)
        assert res.wait_ms == 0
        assert near((await c.settle(res.reservation_id, 500)).balance, 59_500)
        res2 = await c.reserve("run-1", 10)
        assert near((await c.refund(res2.reservation_id)).balance, 59_500)
        assert isinstance(await c.acquire_session_lease("conv", "other", 1_000), SessionBusy)
        assert (await c.release_run("run-1", session_id="conv")).released
        lease = await c.acquire_session_lease("conv", "other", 1_000)
        assert lease.fence == 2
        assert isinstance(await c.check_fence("conv", 1), StaleFence)
        assert await c.check_fence("conv", 2) == FenceCurrent()
        assert isinstance(await c.renew_session_lease("conv", "other", 1_000), SessionLease)
        assert (await c.release_session_lease("conv", "other")).released
        assert isinstance(await c.provider_permit("gemini", "flash", 10), ProviderPermit)
        fb = await c.provider_feedback(
            "gemini", "flash", 500, {}, token=token("svc", scope="tollgate:feedback")
        )
        assert isinstance(fb, tollgate.FeedbackResult)
        assert near((await c.admin_user("bob")).tokens_available, 59_500)
        assert await c.readyz() is True


def test_reserve_retry_never_charges_twice(sidecar: Sidecar) -> None:
    """A reserve repeated with its request id answers the first grant."""
    with client(sidecar) as c:
        c.admit_run("r")
        first = c.reserve("r", 5_000, request_id="req-1")
        again = c.reserve("r", 5_000, request_id="req-1")
        assert again.reservation_id == first.reservation_id
        assert near(c.admin_user("alice").tokens_available, 55_000)


# ---------------------------------------------------------------------------
# Fault injection: a tiny HTTP server that answers 503 (only for this).


class _Flaky(http.server.BaseHTTPRequestHandler):
    script: list[tuple[int, dict, dict]] = []
    seen: list[tuple[str, str, bytes]] = []

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        type(self).seen.append((self.command, self.path, body))
        status, headers, payload = type(self).script.pop(0) if type(self).script else (200, {}, {})
        data = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = do_GET = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[tuple[str, type[_Flaky]]]:
    class H(_Flaky):
        script = []
        seen = []

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", H
    finally:
        srv.shutdown()
        srv.server_close()


UNAVAILABLE = (503, {"retry-after": "1"}, {"error": "store_unavailable", "message": "down", "retry_after_ms": 50})
OVERLOADED = (429, {"retry-after": "1"}, {"error": "overloaded", "message": "busy", "retry_after_ms": 30})
GRANT = (200, {}, {"reservation_id": "1.r", "wait_ms": 0})


def test_retries_503_and_overloaded_with_one_request_id(flaky) -> None:
    url, H = flaky
    H.script = [UNAVAILABLE, OVERLOADED, GRANT]
    with Client(url, token="t", retry=RetryPolicy(max_retries=2, base_ms=10)) as c:
        t0 = time.monotonic()
        r = c.reserve("r", 10)
        took = time.monotonic() - t0
    assert isinstance(r, tollgate.Reservation) and r.reservation_id == "1.r"
    assert len(H.seen) == 3
    ids = {json.loads(b)["request_id"] for (_, _, b) in H.seen}
    assert ids == {r.request_id}, "every retry carries the first request id"
    # The hints (50 ms, 30 ms) were honoured.
    assert took >= 0.08


def test_retries_are_bounded_and_only_for_503(flaky) -> None:
    url, H = flaky
    H.script = [UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, GRANT]
    with Client(url, token="t", retry=RetryPolicy(max_retries=2, base_ms=1)) as c:
        with pytest.raises(StoreUnavailable) as e:
            c.admit_run("r")
    assert e.value.operation == "admit_run" and e.value.error == "store_unavailable"
    assert len(H.seen) == 3
    # A 429 refusal is not retried; it is a value.
    H.seen.clear()
    H.script = [(429, {"retry-after": "2"}, {"error": "turn_rate", "limit": "turn_rate", "retry_after_ms": 2000, "message": "m"})]
    with Client(url, token="t") as c:
        assert isinstance(c.admit_run("r"), TurnRateLimited)
    assert len(H.seen) == 1
    # A hint beyond the bound is not waited out.
    H.seen.clear()
    H.script = [(503, {}, {"error": "store_full", "message": "full", "retry_after_ms": 60_000})]
    with Client(url, token="t") as c:
        with pytest.raises(StoreUnavailable):
            c.settle("1.r", 5)
    assert len(H.seen) == 1
    # A top-up is retried with its request id, which the sidecar grants once.
    H.seen.clear()
    H.script = [UNAVAILABLE, (200, {}, {"budgets": []})]
    with Client(url, token="t", admin_token="a", retry=RetryPolicy(base_ms=1)) as c:
        assert c.admin_budget_top_up("u", "daily", tokens=5) == ()
    assert len(H.seen) == 2
    ids = {json.loads(b)["request_id"] for (_, _, b) in H.seen}
    assert len(ids) == 1 and ids != {None}, ids
    # A permit is never retried (it is a take without a request id).
    H.seen.clear()
    H.script = [UNAVAILABLE, GRANT]
    with Client(url, token="t") as c:
        with pytest.raises(StoreUnavailable):
            c.provider_permit("p", "m", 1)
    assert len(H.seen) == 1


async def test_async_retry_and_pending_close(flaky) -> None:
    url, H = flaky
    H.script = [UNAVAILABLE, (200, {}, {"pending": True}), (200, {}, {"released": False, "pending": True})]
    async with AsyncClient(url, token="t", retry=RetryPolicy(base_ms=1)) as c:
        s = await c.settle("1.r", 10)
        assert s == Closed(balance=None, pending=True) and s.done
        rel = await c.release_run("r")
        assert rel.pending and rel.done


def test_unreachable_sidecar_raises() -> None:
    port = free_port()
    with Client(f"http://127.0.0.1:{port}", token="t", timeout=1) as c:
        with pytest.raises(SidecarUnreachable) as e:
            c.admit_run("r")
    assert e.value.operation == "admit_run" and e.value.error == "unreachable"


def test_model_and_token_split_pass_through(sidecar: Sidecar) -> None:
    """A reserve names its model and splits its estimate, a settle its
    usage; the sidecar's token rate counts the estimate and the actual (the
    bucket refills 1 token per ms meanwhile: the sidecar has no fake clock)."""
    with client(sidecar, user="splitter") as c:
        r = c.reserve(
            "split-run", 6_000, model="openai:gpt-4o", input_tokens=5_000, output_tokens=500
        )
        assert isinstance(r, tollgate.Reservation), r
        s = c.settle(
            r.reservation_id,
            7_000,
            input_tokens=4_000,
            output_tokens=2_000,
            cached_input_tokens=1_000,
        )
        assert isinstance(s, tollgate.Closed), s
        assert s.balance is not None and 53_000 <= s.balance < 54_000, s


def test_a_spent_budget_is_a_refusal_value() -> None:
    """The sidecar's 429 budget_exhausted (docs/spec.md §8, the body of
    crates/tollgate-outcome's row test) reads as tollgate.BudgetExhausted."""
    from tollgate import _ops

    body = (
        b'{"error":"budget_exhausted","limit":"budget_daily","retry_after_ms":54000000,'
        b'"resets_at_ms":1804118400000,"message":"your daily budget is spent: model calls '
        b'are refused until it resets in 15 h"}'
    )
    out = _ops.decode(_ops.reserve("r", 1), 429, {"retry-after": "54000"}, body)
    assert isinstance(out, tollgate.BudgetExhausted), out
    assert out.limit == "budget_daily" and out.retry_after_ms == 54_000_000
    assert out.resets_at_ms == 1_804_118_400_000 and out.retryable
    assert "daily budget" in out.message


BUDGETED = """
currency = "USD"

[prices."openai:gpt-4o"]
input = "2.50"
output = "10.00"

[plans.spender]
turns = { amount = 600, period_ms = 60000, burst = 100 }
tokens = { amount = 600000, period_ms = 60000, burst = 600000 }
concurrent_runs = 2
estimate_tokens = 500

[plans.spender.budgets]
daily = { tokens = 1000 }
monthly = { cost = "50.00" }
"""


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_budgets_refuse_and_the_admin_tops_up_and_resets(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A configured budget through a real sidecar: the day's 1,000 tokens
    spent, the next reserve is a BudgetExhausted value; the admin view shows
    the spend; a top-up lets 500 more through; a reset starts the day
    afresh."""
    from conftest import start_sidecar, store_config

    sc = start_sidecar(tmp_path, extra=BUDGETED, store=store_config(store, request), default_plan="spender")
    try:
        with tollgate.Client(sc.url, token=token("bud"), admin_token=ADMIN) as c:
            assert isinstance(c.admit_run("r"), tollgate.Admitted)
            assert isinstance(c.reserve("r", 600, model="openai:gpt-4o"), tollgate.Reservation)
            out = c.reserve("r", 600, model="openai:gpt-4o")
            assert isinstance(out, tollgate.BudgetExhausted), out
            assert out.limit == "budget_daily" and out.resets_at_ms > 0
            daily, monthly = c.admin_user("bud").budgets
            assert (daily.window, daily.unit, daily.limit, daily.spent, daily.granted) == (
                "daily", "tokens", 1000, 600, 0)
            # 600 tokens at the higher price, $10 per million: 6,000 µ.
            assert (monthly.unit, monthly.currency, monthly.limit, monthly.spent) == (
                "micros", "USD", 50_000_000, 6_000)
            # Repeated with its request id (a lost answer): granted once.
            for _ in range(2):
                after = c.admin_budget_top_up("bud", "daily", tokens=500, request_id="grant-1")
                assert after[0].granted == 500 and after[0].spent == 600
            assert isinstance(c.reserve("r", 600, model="openai:gpt-4o"), tollgate.Reservation)
            with pytest.raises(tollgate.InvalidRequest) as e:
                c.admin_budget_top_up("bud", "daily", cost="1.00")
            assert e.value.field == "tokens"
            with pytest.raises(tollgate.InvalidRequest) as e:
                c.admin_budget_reset("bud", "weekly")
            assert e.value.field == "window"
            after = c.admin_budget_reset("bud", "daily")
            assert (after[0].spent, after[0].granted) == (0, 0)
            assert after[1].spent == 12_000, "the month is untouched"
            assert isinstance(c.reserve("r", 1000, model="openai:gpt-4o"), tollgate.Reservation)
    finally:
        sc.stop()
