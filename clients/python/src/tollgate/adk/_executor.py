"""``TurnExecutor``: runs google-adk turns under a per-process cap and a
session lease with its fence."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, Optional

from google.adk.events.event import Event
from google.adk.runners import Runner

from .._client import AsyncClient
from ._plugin import Credentials
from .._models import NotHolder, Overloaded, Refusal, SessionLease, TollgateError

if TYPE_CHECKING:
    from .postgres import DbFence, FencedDatabaseSessionService

log = logging.getLogger("tollgate.adk")


class TurnRefused(TollgateError):
    """A turn refused where no value can be returned (an iterator).

    Attributes:
        refusal: The refusal, e.g. :class:`tollgate.SessionBusy` with the
            remaining TTL in ``retry_after_ms``.
    """

    def __init__(self, operation: str, refusal: Refusal) -> None:
        super().__init__(
            operation,
            refusal.error,
            refusal.message,
            status=refusal.status,
            retry_after_ms=refusal.retry_after_ms,
        )
        self.refusal = refusal


@dataclass
class Turn:
    """The session lease a turn runs under.

    Attributes:
        session_id: The session.
        holder: The turn's holder token.
        fence: The fencing number: a write to the session store must carry it
            (:meth:`tollgate.AsyncClient.check_fence` checks it).
        lost: ``True`` once a renewal found the lease gone (a takeover): the
            fence is then stale.
        db: The database fence the turn's appends carry when sessions live
            in PostgreSQL (``TurnExecutor(postgres_sessions=…)``): the one
            :class:`tollgate.adk.postgres.FencedDatabaseSessionService`
            checks. ``fence`` is the lease's, which the sidecar answers for.
    """

    session_id: str
    holder: str
    fence: int
    lost: bool = False
    db: Optional["DbFence"] = None


_CURRENT: contextvars.ContextVar[Optional[Turn]] = contextvars.ContextVar(
    "tollgate_turn", default=None
)


def current_turn() -> Optional[Turn]:
    """The :class:`Turn` of the turn running in this context (set by
    :meth:`TurnExecutor.run_async`, visible to a session service called by
    the runner), or ``None``."""
    return _CURRENT.get()


class TurnExecutor:
    """Runs ``Runner.run_async`` under a per-process in-flight cap and the
    session's lease.

    * At most ``max_in_flight`` turns of this executor run at once; past it,
      :class:`tollgate.Overloaded` (retryable after ``retry_after_ms``). The
      cap is per process: a host with N worker processes admits up to N ×
      ``max_in_flight`` turns.
    * Before the run, the session lease is taken (holder: a fresh token per
      turn, TTL ``session_ttl_ms``); another turn of the session holding it
      raises :class:`TurnRefused` carrying :class:`tollgate.SessionBusy`
      with the remaining TTL. The lease is renewed every third of its TTL
      and released on every exit (end, error, cancellation, or the caller
      closing the iterator early).
    * While the turn runs, :func:`current_turn` gives its fence, for a
      session service that checks it before writing.

    Args:
        runner: The google-adk runner (use :class:`TollgatePlugin` on it to
            admit and meter the turns too).
        client: The sidecar's :class:`tollgate.AsyncClient`.
        max_in_flight: The per-process cap.
        session_ttl_ms: The session lease's TTL (renewed every third).
        overloaded_retry_ms: The hint :class:`tollgate.Overloaded` carries.
        credentials: Given a user id, the token to send for it; ``None``:
            the client's own token provider.
        postgres_sessions: The runner's session service when sessions live
            in PostgreSQL: each turn then takes the session's database fence
            after its lease (``Turn.db``); if the database cannot issue it,
            the turn raises its :class:`SessionDatabaseError
            <tollgate.adk.postgres.SessionDatabaseError>` and the lease is
            released.
    """

    def __init__(
        self,
        runner: Runner,
        client: AsyncClient,
        *,
        max_in_flight: int = 64,
        session_ttl_ms: int = 30_000,
        overloaded_retry_ms: int = 1_000,
        credentials: Optional[Credentials] = None,
        postgres_sessions: Optional["FencedDatabaseSessionService"] = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if session_ttl_ms < 3:
            raise ValueError("session_ttl_ms must be at least 3")
        self.runner = runner
        self.client = client
        self.max_in_flight = max_in_flight
        self.session_ttl_ms = session_ttl_ms
        self.overloaded_retry_ms = overloaded_retry_ms
        self.credentials = credentials
        self.postgres_sessions = postgres_sessions
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Turns of this executor running now."""
        return self._in_flight

    async def _token(self, user_id: str) -> Optional[str]:
        if self.credentials is None:
            return None
        v = self.credentials(user_id)
        if inspect.isawaitable(v):
            v = await v
        return v

    async def run_async(
        self, *, user_id: str, session_id: str, **kwargs: Any
    ) -> AsyncGenerator[Event, None]:
        """Runs one turn: ``runner.run_async(user_id=…, session_id=…,
        **kwargs)`` under the cap and the session lease, yielding its events.

        Raises:
            tollgate.Overloaded: Over the per-process cap (nothing was taken).
            TurnRefused: The session is busy (``refusal.retry_after_ms``: its
                remaining TTL) or the user has too many sessions.
            tollgate.TollgateError: The sidecar failed (session leases fail
                closed).
        """
        if self._in_flight >= self.max_in_flight:
            raise Overloaded(
                "run_turn",
                "overloaded",
                f"{self._in_flight} turns in flight in this process (cap {self.max_in_flight})",
                retry_after_ms=self.overloaded_retry_ms,
            )
        self._in_flight += 1
        try:
            token = await self._token(user_id)
            holder = f"turn-{uuid.uuid4().hex}"
            ttl = self.session_ttl_ms
            lease = await self.client.acquire_session_lease(session_id, holder, ttl, token=token)
            if isinstance(lease, Refusal):
                raise TurnRefused("acquire_session_lease", lease)
            assert isinstance(lease, SessionLease)
            turn = Turn(session_id=session_id, holder=holder, fence=lease.fence)
            renewer = asyncio.create_task(self._renew(turn, token))
            ctx = _CURRENT.set(turn)
            try:
                if self.postgres_sessions is not None:
                    turn.db = await self.postgres_sessions.take_fence(
                        app_name=self.runner.app_name, user_id=user_id, session_id=session_id
                    )
                async with aclosing(
                    self.runner.run_async(user_id=user_id, session_id=session_id, **kwargs)
                ) as events:
                    async for event in events:
                        yield event
            finally:
                renewer.cancel()
                try:
                    _CURRENT.reset(ctx)
                except ValueError:
                    _CURRENT.set(None)
                await asyncio.shield(self._release(turn, token))
        finally:
            self._in_flight -= 1

    async def _renew(self, turn: Turn, token: Optional[str]) -> None:
        period = self.session_ttl_ms / 3000.0
        while True:
            await asyncio.sleep(period)
            try:
                r = await self.client.renew_session_lease(
                    turn.session_id, turn.holder, self.session_ttl_ms, token=token
                )
            except TollgateError as e:
                log.warning("tollgate session renew of %s failed: %s", turn.session_id, e)
                continue
            if isinstance(r, NotHolder):
                turn.lost = True
                log.warning("tollgate session lease of %s lost: its fence is stale", turn.session_id)
                return

    async def _release(self, turn: Turn, token: Optional[str]) -> None:
        try:
            await self.client.release_session_lease(turn.session_id, turn.holder, token=token)
        except TollgateError as e:
            log.warning("tollgate session release of %s failed: %s", turn.session_id, e)
