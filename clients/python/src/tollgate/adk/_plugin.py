"""``TollgatePlugin``: a google-adk plugin that admits turns and meters tokens."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Union

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

from .._client import AsyncClient
from .._models import (
    Admitted,
    ConcurrencyLimited,
    LeaseLost,
    MaxLlmCalls,
    Refusal,
    Reservation,
    SessionBusy,
    SessionsLimited,
    TokenRateLimited,
    TollgateError,
    TurnRateLimited,
)

log = logging.getLogger("tollgate.adk")

Credentials = Callable[[str], Union[Optional[str], Awaitable[Optional[str]]]]
"""Given the run's user id, the bearer token to send for it (or ``None`` to
use the client's own token provider)."""

_CALLER: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("tollgate_caller", default=None)


def current_user() -> Optional[str]:
    """The user id of the run whose model call is being made in this
    context: set by :class:`TollgatePlugin` just before each model call
    (google-adk then calls the model in the same context), so a model
    wrapper such as :class:`tollgate.adk.QuotaGatedLlm` can tell whose call
    it is. ``None`` outside a call or without the plugin."""
    return _CALLER.get()


async def token_for(credentials: Optional[Credentials], user_id: str) -> Optional[str]:
    """The token ``credentials`` gives for ``user_id`` (awaited if it is a
    coroutine); ``None`` without credentials."""
    if credentials is None:
        return None
    v = credentials(user_id)
    if inspect.isawaitable(v):
        v = await v
    return v


def _seconds(ms: Optional[int]) -> str:
    if ms is None:
        return "later"
    return f"in {max(1, math.ceil(ms / 1000))} s"


def denial_text(refusal: Refusal) -> str:
    """The plain message a refused turn answers with: which limit, and when
    to retry."""
    what = {
        TurnRateLimited: "you have sent too many requests recently",
        ConcurrencyLimited: "too many of your requests are already running",
        SessionsLimited: "you have too many open conversations",
        SessionBusy: "this conversation is already busy with another request",
    }.get(type(refusal), f"a usage limit was reached ({refusal.error})")
    return f"This request was not started: {what} (limit: {refusal.limit or refusal.error}). Please retry {_seconds(refusal.retry_after_ms)}."


def stopped_text(refusal: Refusal) -> str:
    """The plain message a turn stopped before a model call answers with."""
    if isinstance(refusal, MaxLlmCalls):
        what = "this request reached its limit of model calls"
        when = "Please start a new request."
    elif isinstance(refusal, TokenRateLimited):
        what = "your token budget is spent for now"
        when = f"Please retry {_seconds(refusal.retry_after_ms)}."
    else:
        what = f"a usage limit was reached ({refusal.error})"
        when = (
            f"Please retry {_seconds(refusal.retry_after_ms)}."
            if refusal.retry_after_ms is not None
            else "It cannot be retried as it is."
        )
    return f"The work stopped early: {what} (limit: {refusal.limit or refusal.error}). {when}"


UNAVAILABLE_TEXT = (
    "This request was not started: the usage-limit service is unavailable. Please retry shortly."
)
"""The message a fail-closed plugin answers with when the sidecar fails."""


def _content(text: str) -> types.Content:
    return types.Content(role="model", parts=[types.Part(text=text)])


def request_tokens(llm_request: LlmRequest, chars_per_token: float = 4.0) -> int:
    """A rough size of a model request in tokens: its text (contents and
    system instruction) over ``chars_per_token``, plus the requested
    ``max_output_tokens`` when set."""
    chars = 0
    for c in llm_request.contents or []:
        for p in c.parts or []:
            if p.text:
                chars += len(p.text)
            if p.function_call is not None:
                chars += len(str(p.function_call.args or "")) + len(p.function_call.name or "")
            if p.function_response is not None:
                chars += len(str(p.function_response.response or ""))
    cfg = llm_request.config
    if cfg is not None and cfg.system_instruction is not None:
        chars += len(str(cfg.system_instruction))
    out = 0
    if cfg is not None and cfg.max_output_tokens:
        out = int(cfg.max_output_tokens)
    return int(chars / chars_per_token) + out


class Estimator:
    """What a model call reserves: the larger of the request's size
    (:func:`request_tokens`) and a moving average of the agent's past calls,
    seeded by the plan's ``estimate_tokens``.

    Args:
        alpha: Weight of the newest call in the exponential moving average.
        chars_per_token: Characters per token for the size estimate.
    """

    def __init__(self, alpha: float = 0.3, chars_per_token: float = 4.0) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self.chars_per_token = chars_per_token
        self._avg: dict[str, float] = {}

    def estimate(self, agent: str, llm_request: LlmRequest, seed: int) -> int:
        """The tokens to reserve for ``agent``'s call ``llm_request``."""
        avg = self._avg.get(agent, float(seed))
        return max(1, request_tokens(llm_request, self.chars_per_token), math.ceil(avg))

    def observe(self, agent: str, actual: int, seed: int) -> None:
        """Feeds a call's actual tokens into ``agent``'s average."""
        avg = self._avg.get(agent, float(seed))
        self._avg[agent] = (1 - self.alpha) * avg + self.alpha * actual


@dataclass
class _Open:
    reservation_id: str
    estimate: int
    agent: str
    answered: bool = False


@dataclass
class _Turn:
    invocation_id: str
    # The credential is asked for on every request (a long run outlives a
    # short-lived token).
    user_id: str
    admitted: Optional[Admitted]
    # key (agent, branch) -> reservations of calls not settled yet, oldest first
    open: dict[tuple[str, str], list[_Open]] = field(default_factory=dict)
    renewer: Optional[asyncio.Task[None]] = None
    owner: Optional[asyncio.Task[Any]] = None
    owner_cb: Optional[Callable[[asyncio.Task[Any]], None]] = None
    finished: bool = False


def _usage_tokens(resp: LlmResponse) -> Optional[int]:
    u = resp.usage_metadata
    if u is None:
        return None
    if u.total_token_count is not None:
        return int(u.total_token_count)
    parts = [u.prompt_token_count, u.candidates_token_count, u.thoughts_token_count]
    if all(p is None for p in parts):
        return None
    return sum(int(p or 0) for p in parts)


class TollgatePlugin(BasePlugin):
    """Admits each google-adk run and meters its model calls through a
    tollgate sidecar::

        client = tollgate.AsyncClient("http://127.0.0.1:8787", token=my_token)
        runner = InMemoryRunner(agent, plugins=[TollgatePlugin(client)])

    * ``before_run_callback`` admits the turn (keyed by the invocation id); a
      refusal ends the run with a model message naming the limit and when to
      retry.
    * ``before_model_callback`` reserves the call's estimate (:class:`Estimator`),
      waiting within the plan's ``max_wait_ms``; a refusal stops the turn
      with a message saying the work stopped early.
    * ``after_model_callback`` settles the call once, on its final
      (non-partial) response carrying ``usage_metadata``;
      ``on_model_error_callback`` refunds it.
    * The run lease is renewed every ``lease_ttl_ms / 3`` while the run lasts.
    * ``after_run_callback`` / ``on_run_error_callback`` release the run
      (a denied turn's release is a harmless no-op), refund what was
      reserved for calls that never answered (a call cut off when the caller
      stopped iterating: google-adk 2.13 then cancels the run and calls
      ``after_run_callback``) and settle calls answered without usage at
      their estimate. A run cancelled some other way (no ``after_run``) is
      cleaned up when the task that started it ends.

    Args:
        client: The sidecar's :class:`tollgate.AsyncClient`.
        fail_open: When the sidecar cannot be reached or fails: ``True`` lets
            the turn (or call) run unmetered, ``False`` (the default) stops
            it with a plain message. Either way it is logged.
        credentials: Given a run's user id, the token to send for it;
            ``None``: the client's own token provider.
        estimator: Estimates a call's tokens; default :class:`Estimator`.
        renew: Renew run leases while runs last (default ``True``).
        name: The plugin's name in google-adk.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        fail_open: bool = False,
        credentials: Optional[Credentials] = None,
        estimator: Optional[Estimator] = None,
        renew: bool = True,
        name: str = "tollgate",
    ) -> None:
        super().__init__(name=name)
        self.client = client
        self.fail_open = fail_open
        self.credentials = credentials
        self.estimator = estimator or Estimator()
        self.renew = renew
        self._turns: dict[str, _Turn] = {}
        self._cleanups: set[asyncio.Task[None]] = set()

    # -- helpers -----------------------------------------------------------

    async def _token(self, user_id: str) -> Optional[str]:
        return await token_for(self.credentials, user_id)

    def _fault(self, op: str, inv: str, e: TollgateError) -> None:
        policy = "fail open: running unmetered" if self.fail_open else "fail closed: stopping"
        log.warning("tollgate %s failed for invocation %s (%s); %s", op, inv, e, policy)

    @property
    def active_turns(self) -> int:
        """Turns admitted (or let through) and not finished yet."""
        return len(self._turns)

    # -- the run ---------------------------------------------------------------

    async def before_run_callback(
        self, *, invocation_context: InvocationContext
    ) -> Optional[types.Content]:
        """Admits the turn; a refusal (or a fault, failing closed) ends the
        run with a plain model message."""
        inv = invocation_context.invocation_id
        token = await self._token(invocation_context.user_id)
        try:
            answer = await self.client.admit_run(inv, token=token)
        except TollgateError as e:
            self._fault("admit_run", inv, e)
            if self.fail_open:
                self._turns[inv] = _Turn(inv, invocation_context.user_id, admitted=None)
                return None
            return _content(UNAVAILABLE_TEXT)
        if isinstance(answer, Refusal):
            log.info("tollgate refused invocation %s: %s", inv, answer.error)
            return _content(denial_text(answer))
        turn = _Turn(inv, invocation_context.user_id, admitted=answer)
        self._turns[inv] = turn
        if self.renew:
            turn.renewer = asyncio.create_task(self._renew(turn), name=f"tollgate-renew-{inv}")
        owner = asyncio.current_task()
        if owner is not None:
            turn.owner = owner
            turn.owner_cb = self._owner_done(inv)
            owner.add_done_callback(turn.owner_cb)
        return None

    def _owner_done(self, inv: str) -> Callable[[asyncio.Task[Any]], None]:
        def done(_: asyncio.Task[Any]) -> None:
            turn = self._turns.get(inv)
            if turn is None or turn.finished:
                return
            try:
                t = asyncio.get_running_loop().create_task(self._finish(inv))
                log.info("tollgate: the task that ran invocation %s ended without after_run; releasing", inv)
            except RuntimeError:
                return
            self._cleanups.add(t)
            t.add_done_callback(self._cleanups.discard)

        return done

    async def _renew(self, turn: _Turn) -> None:
        assert turn.admitted is not None
        period = max(turn.admitted.lease_ttl_ms / 3000.0, 0.001)
        while True:
            await asyncio.sleep(period)
            try:
                r = await self.client.renew_run(turn.invocation_id, token=await self._token(turn.user_id))
            except TollgateError as e:
                log.warning("tollgate renew of %s failed: %s", turn.invocation_id, e)
                continue
            if isinstance(r, LeaseLost):
                log.warning("tollgate lease of %s lost: %s", turn.invocation_id, r.message)
                return

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        """Releases the run and closes what it left open (also when the
        caller stopped iterating early)."""
        await self._finish(invocation_context.invocation_id)

    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        """Releases the run and closes what it left open after a failure."""
        await self._finish(invocation_context.invocation_id)

    async def _finish(self, inv: str) -> None:
        turn = self._turns.pop(inv, None)
        if turn is None or turn.finished:
            # A denied turn holds nothing; a second finish does nothing.
            return
        turn.finished = True
        if turn.renewer is not None:
            turn.renewer.cancel()
        if turn.owner is not None and turn.owner_cb is not None:
            turn.owner.remove_done_callback(turn.owner_cb)
        if turn.admitted is None:
            return
        # Shielded: the cleanup must finish even if the task running it is
        # being cancelled.
        await asyncio.shield(self._close_turn(turn))

    async def _close_turn(self, turn: _Turn) -> None:
        for calls in turn.open.values():
            for c in calls:
                try:
                    if c.answered:
                        # Answered without usage: its estimate stands.
                        await self.client.settle(c.reservation_id, c.estimate, token=await self._token(turn.user_id))
                    else:
                        await self.client.refund(c.reservation_id, token=await self._token(turn.user_id))
                except TollgateError as e:
                    log.warning("tollgate close of %s failed: %s", c.reservation_id, e)
        turn.open.clear()
        try:
            await self.client.release_run(turn.invocation_id, token=await self._token(turn.user_id))
        except TollgateError as e:
            log.warning("tollgate release of %s failed: %s", turn.invocation_id, e)

    async def close(self) -> None:
        """Finishes every turn still open (the runner is closing)."""
        for inv in list(self._turns):
            await self._finish(inv)

    # -- model calls ---------------------------------------------------------

    @staticmethod
    def _key(ctx: CallbackContext) -> tuple[str, str]:
        # Parallel agents' calls run on their own branches of one invocation.
        branch = getattr(ctx, "branch", None) or ""
        return (ctx.agent_name, branch)

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> Optional[LlmResponse]:
        """Reserves the call's estimate; a refusal stops the turn with a
        plain message."""
        turn = self._turns.get(callback_context.invocation_id)
        _CALLER.set(callback_context.user_id)
        if turn is None or turn.admitted is None:
            return None
        plan = turn.admitted
        agent = callback_context.agent_name
        estimate = self.estimator.estimate(agent, llm_request, plan.estimate_tokens)
        try:
            r = await self.client.reserve(
                turn.invocation_id,
                estimate,
                wait=plan.max_wait_ms > 0,
                max_wait_ms=plan.max_wait_ms,
                token=await self._token(turn.user_id),
            )
        except TollgateError as e:
            self._fault("reserve", turn.invocation_id, e)
            if self.fail_open:
                return None
            return LlmResponse(content=_content(UNAVAILABLE_TEXT), turn_complete=True)
        if isinstance(r, Refusal):
            log.info("tollgate stopped invocation %s before a model call: %s", turn.invocation_id, r.error)
            return LlmResponse(content=_content(stopped_text(r)), turn_complete=True)
        assert isinstance(r, Reservation)
        if r.wait_ms > 0:
            await asyncio.sleep(r.wait_ms / 1000.0)
        turn.open.setdefault(self._key(callback_context), []).append(
            _Open(r.reservation_id, estimate, agent)
        )
        return None

    def _oldest_unanswered(self, turn: _Turn, key: tuple[str, str]) -> Optional[_Open]:
        for c in turn.open.get(key, []):
            if not c.answered:
                return c
        return None

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> Optional[LlmResponse]:
        """Settles the call once, on its final response with usage."""
        if llm_response.partial:
            return None
        turn = self._turns.get(callback_context.invocation_id)
        if turn is None:
            return None
        key = self._key(callback_context)
        c = self._oldest_unanswered(turn, key)
        if c is None:
            return None
        used = _usage_tokens(llm_response)
        if used is None:
            # Final but without usage: closed at its estimate when the run ends.
            c.answered = True
            return None
        turn.open[key].remove(c)
        plan = turn.admitted
        if plan is not None:
            self.estimator.observe(c.agent, used, plan.estimate_tokens)
        try:
            await self.client.settle(c.reservation_id, used, token=await self._token(turn.user_id))
        except TollgateError as e:
            log.warning("tollgate settle of %s failed: %s", c.reservation_id, e)
        return None

    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> Optional[LlmResponse]:
        """Refunds the failed call's reservation; the error propagates."""
        turn = self._turns.get(callback_context.invocation_id)
        if turn is None:
            return None
        key = self._key(callback_context)
        c = self._oldest_unanswered(turn, key)
        if c is None:
            return None
        turn.open[key].remove(c)
        try:
            await self.client.refund(c.reservation_id, token=await self._token(turn.user_id))
        except TollgateError as e:
            log.warning("tollgate refund of %s failed: %s", c.reservation_id, e)
        return None
