"""``tollgate.Client`` (sync) and ``tollgate.AsyncClient`` over one model.

Both take the same settings and expose the same operations with the same
signatures (the async ones are awaited); the operations are described once in
:mod:`tollgate._ops`.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

import httpx

from . import _ops
from ._models import RetryPolicy

TokenProvider = Union[str, Callable[[], Union[str, None, Awaitable[Optional[str]]]], None]
"""A credential: a fixed bearer token, or a callable asked before every
request (the async client also awaits what it returns)."""


class _Operations:
    """The operations of docs/spec.md §8, shared by both clients.

    Every method builds one :class:`tollgate._ops.Call` and hands it to
    ``_run``; on :class:`AsyncClient` the result must be awaited. Every
    operation takes ``token=``, a bearer token for that request only
    (overriding the client's token provider).
    """

    def _run(self, call: _ops.Call, token: Optional[str]) -> Any:  # pragma: no cover
        raise NotImplementedError

    # Runs -----------------------------------------------------------------

    def admit_run(
        self,
        invocation_id: str,
        *,
        session_id: Optional[str] = None,
        session_ttl_ms: Optional[int] = None,
        token: Optional[str] = None,
    ) -> Any:
        """Admits a turn of run ``invocation_id`` (``POST /v1/runs``).

        Returns :class:`tollgate.Admitted` (with the plan's numbers), or a
        refusal: :class:`tollgate.TurnRateLimited`,
        :class:`tollgate.ConcurrencyLimited`, :class:`tollgate.SessionsLimited`,
        :class:`tollgate.SessionBusy`. A retry with the same id charges nothing.
        """
        return self._run(_ops.admit_run(invocation_id, session_id, session_ttl_ms), token)

    def release_run(
        self, invocation_id: str, *, session_id: Optional[str] = None, token: Optional[str] = None
    ) -> Any:
        """Releases run ``invocation_id`` (and the session lease it holds when
        ``session_id`` is given). Returns :class:`tollgate.Released`;
        ``released=False`` (it held nothing) is not an error, and ``pending``
        is done."""
        return self._run(_ops.release_run(invocation_id, session_id), token)

    def renew_run(self, invocation_id: str, *, token: Optional[str] = None) -> Any:
        """Renews the run lease. Returns :class:`tollgate.Renewed` or
        :class:`tollgate.LeaseLost`."""
        return self._run(_ops.renew_run(invocation_id), token)

    # Tokens ---------------------------------------------------------------

    def reserve(
        self,
        invocation_id: str,
        estimate: int,
        *,
        wait: bool = False,
        request_id: Optional[str] = None,
        max_wait_ms: int = 0,
        model: Optional[str] = None,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        cached_input_tokens: Optional[int] = None,
        token: Optional[str] = None,
    ) -> Any:
        """Reserves ``estimate`` tokens for a model call of the run.

        Always sent under a request id (``request_id``, or a fresh one), so a
        retry after a 503 answers the first grant and never charges twice.
        With ``wait=True`` the sidecar waits out the grant's wait before
        answering; pass the plan's ``max_wait_ms`` so the request's timeout
        covers it. ``model`` (``"provider:model"``) and the estimate's split
        into ``input_tokens``, ``output_tokens`` and ``cached_input_tokens``
        price the call for the plan's cost budgets. Returns
        :class:`tollgate.Reservation`, or :class:`tollgate.TokenRateLimited`,
        :class:`tollgate.BudgetExhausted`, :class:`tollgate.MaxLlmCalls`,
        :class:`tollgate.ExceedsCapacity`, :class:`tollgate.TooManyWaits`.
        """
        call = _ops.reserve(
            invocation_id,
            estimate,
            wait=wait,
            request_id=request_id,
            max_wait_ms=max_wait_ms,
            model=model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
        )
        return self._run(call, token)

    def settle(
        self,
        reservation_id: str,
        actual: int,
        *,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        cached_input_tokens: Optional[int] = None,
        token: Optional[str] = None,
    ) -> Any:
        """Settles a reservation at the ``actual`` tokens used (their split,
        if given, prices the call for cost budgets). Returns
        :class:`tollgate.Closed` (a repeat changes nothing; ``pending`` is
        done) or :class:`tollgate.UnknownReservation`."""
        call = _ops.settle(
            reservation_id,
            actual,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
        )
        return self._run(call, token)

    def refund(self, reservation_id: str, *, token: Optional[str] = None) -> Any:
        """Refunds a reservation. Returns :class:`tollgate.Closed` or
        :class:`tollgate.UnknownReservation`."""
        return self._run(_ops.refund(reservation_id), token)

    # Sessions -------------------------------------------------------------

    def acquire_session_lease(
        self, session_id: str, holder: str, ttl_ms: int, *, token: Optional[str] = None
    ) -> Any:
        """Acquires (or refreshes, for the same holder) a session lease.
        Returns :class:`tollgate.SessionLease`, :class:`tollgate.SessionBusy`
        (``retry_after_ms`` the remaining TTL) or
        :class:`tollgate.SessionsLimited`."""
        return self._run(_ops.acquire_session_lease(session_id, holder, ttl_ms), token)

    def renew_session_lease(
        self, session_id: str, holder: str, ttl_ms: int, *, token: Optional[str] = None
    ) -> Any:
        """Renews a session lease. Returns :class:`tollgate.SessionLease` or
        :class:`tollgate.NotHolder`."""
        return self._run(_ops.renew_session_lease(session_id, holder, ttl_ms), token)

    def release_session_lease(
        self, session_id: str, holder: str, *, token: Optional[str] = None
    ) -> Any:
        """Releases a session lease. Returns :class:`tollgate.Released` or
        :class:`tollgate.NotHolder`."""
        return self._run(_ops.release_session_lease(session_id, holder), token)

    def check_fence(self, session_id: str, fence: int, *, token: Optional[str] = None) -> Any:
        """Checks that ``fence`` is the session's latest. Returns
        :class:`tollgate.FenceCurrent` or :class:`tollgate.StaleFence`."""
        return self._run(_ops.check_fence(session_id, fence), token)

    # Providers ------------------------------------------------------------

    def provider_permit(
        self,
        provider: str,
        model: str,
        tokens: int,
        *,
        tenant: Optional[str] = None,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        max_wait_ms: Optional[int] = None,
        wait: bool = False,
        token: Optional[str] = None,
    ) -> Any:
        """Asks for a permit to call ``provider``'s ``model``. Returns
        :class:`tollgate.ProviderPermit`, or :class:`tollgate.ProviderLimited`,
        :class:`tollgate.ProviderExhausted`, :class:`tollgate.ExceedsCapacity`.
        Never retried (a permit is a take)."""
        call = _ops.provider_permit(
            provider,
            model,
            tokens,
            tenant=tenant,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            max_wait_ms=max_wait_ms,
            wait=wait,
        )
        return self._run(call, token)

    def provider_feedback(
        self,
        provider: str,
        model: str,
        status: int,
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[str] = None,
        *,
        token: Optional[str] = None,
    ) -> Any:
        """Reports the provider's answer (needs the feedback scope). Returns
        :class:`tollgate.FeedbackResult`; raises
        :class:`tollgate.Forbidden` without the scope."""
        return self._run(_ops.provider_feedback(provider, model, status, headers, body), token)

    # Beside the API -------------------------------------------------------

    def healthz(self) -> Any:
        """``True`` while the sidecar serves (``GET /healthz``)."""
        return self._run(_ops.healthz(), None)

    def readyz(self) -> Any:
        """``True`` when ready; raises :class:`tollgate.StoreUnavailable`
        when the store is down under fail_closed."""
        return self._run(_ops.readyz(), None)

    # Admin (needs admin_token) ---------------------------------------------

    def admin_user(self, user: str) -> Any:
        """A user's state: :class:`tollgate.UserView`."""
        return self._run(_ops.admin_user(user), None)

    def admin_top(self, n: Optional[int] = None) -> Any:
        """The top users by tokens per minute: a tuple of :class:`tollgate.TopUser`."""
        return self._run(_ops.admin_top(n), None)

    def admin_reset(self, user: str) -> Any:
        """Fills a user's buckets again; ``True`` when reset."""
        return self._run(_ops.admin_reset(user), None)

    def admin_budget_reset(self, user: str, window: str) -> Any:
        """Starts a user's current ``window`` (``daily``, ``weekly``,
        ``monthly``) of that budget afresh: the user's budgets after it, a
        tuple of :class:`tollgate.BudgetView`."""
        return self._run(_ops.admin_budget_reset(user, window), None)

    def admin_budget_top_up(
        self,
        user: str,
        window: str,
        *,
        tokens: Optional[int] = None,
        cost: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> Any:
        """Grants a user's current ``window`` of that budget ``tokens`` (a
        token budget) or ``cost`` (a decimal string, a cost budget) more:
        the user's budgets after it, a tuple of :class:`tollgate.BudgetView`.

        The top-up carries ``request_id`` (a new UUID unless given): the
        sidecar grants one id once within a day, so the client retries a
        503 with it. To repeat a top-up whose answer was lost (a timeout,
        a dropped connection), pass your own ``request_id`` and repeat the
        call with it."""
        return self._run(
            _ops.admin_budget_top_up(user, window, tokens=tokens, cost=cost, request_id=request_id),
            None,
        )

    def admin_release_lease(self, user: str, invocation_id: str) -> Any:
        """Releases a user's run lease: :class:`tollgate.Released`."""
        return self._run(_ops.admin_release_lease(user, invocation_id), None)

    def admin_reload(self) -> Any:
        """Reloads the config: :class:`tollgate.Reloaded`; a bad config raises
        :class:`tollgate.InvalidRequest` (``error`` ``invalid_config``)."""
        return self._run(_ops.admin_reload(), None)

    def admin_providers(self) -> Any:
        """Every provider key's view: a tuple of :class:`tollgate.ProviderView`."""
        return self._run(_ops.admin_providers(), None)

    def admin_provider(self, provider: str, model: str) -> Any:
        """One provider key's view: :class:`tollgate.ProviderView`."""
        return self._run(_ops.admin_provider(provider, model), None)

    def admin_clear_provider(self, provider: str, model: str) -> Any:
        """Clears a provider key's cooldown, rate and exhaustion:
        :class:`tollgate.ProviderCleared`."""
        return self._run(_ops.admin_clear_provider(provider, model), None)


def _settings(
    base_url: str,
    admin_url: Optional[str],
    timeout: float,
    retry: Optional[RetryPolicy],
    admin_token: Optional[str],
    headers: Optional[Mapping[str, str]],
) -> _ops.Settings:
    base = base_url.rstrip("/")
    return _ops.Settings(
        base_url=base,
        admin_url=(admin_url or base).rstrip("/"),
        timeout_s=timeout,
        retry=retry or RetryPolicy(),
        admin_token=admin_token,
        headers={k.lower(): v for k, v in (headers or {}).items()},
    )


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        # Below the sidecar's 10 s header timeout, so the client never sends
        # on a connection the server is about to close.
        keepalive_expiry=5.0,
    )


class Client(_Operations):
    """A blocking client of ``tollgate serve``'s HTTP API.

    Args:
        base_url: The sidecar, e.g. ``http://127.0.0.1:8787``.
        token: The credential: a bearer token, or a callable returning one
            asked before every request (the host's verified credentials).
        admin_token: The sidecar's ``admin_token``, for the ``admin_*`` calls.
        admin_url: Where the admin routes are (``admin_listen``); default
            ``base_url``.
        timeout: Seconds per request (connect, read, write), to which a
            ``wait=true`` request adds the wait it asked for.
        retry: Retries of 503s and 429 ``overloaded`` (:class:`RetryPolicy`).
        headers: Extra headers on every request (e.g. ``x-tollgate-user``
            behind a trusted proxy).
        max_connections: Size of the connection pool.
        transport: An httpx transport, for tests.

    Refusals are returned, faults raised (:class:`tollgate.TollgateError`).
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: TokenProvider = None,
        admin_token: Optional[str] = None,
        admin_url: Optional[str] = None,
        timeout: float = 10.0,
        retry: Optional[RetryPolicy] = None,
        headers: Optional[Mapping[str, str]] = None,
        max_connections: int = 100,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._settings = _settings(base_url, admin_url, timeout, retry, admin_token, headers)
        self._token = token
        self._rng = random.Random()
        self._http = httpx.Client(
            timeout=timeout, limits=_limits(max_connections), transport=transport
        )

    def _credential(self, override: Optional[str]) -> Optional[str]:
        if override is not None:
            return override
        t = self._token
        if t is None or isinstance(t, str):
            return t
        v = t()
        if inspect.isawaitable(v):
            raise TypeError("Client's token provider must not be async; use AsyncClient")
        return v  # type: ignore[return-value]

    def _run(self, call: _ops.Call, token: Optional[str]) -> Any:
        s = self._settings
        url = (s.admin_url if call.admin else s.base_url) + call.path
        timeout = s.timeout_s + call.extra_timeout_s
        attempt = 0
        while True:
            headers = _ops.request_headers(s, call, self._credential(token) if not call.admin else None)
            try:
                r = self._http.request(
                    call.method, url, json=call.body, params=call.params, headers=headers, timeout=timeout
                )
            except httpx.HTTPError as e:
                raise _ops.unreachable(call, e) from e
            delay = _ops.retry_delay_s(
                s.retry, attempt, call, r.status_code, r.headers, r.content, self._rng
            )
            if delay is None:
                return _ops.decode(call, r.status_code, r.headers, r.content)
            attempt += 1
            time.sleep(delay)

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Operations):
    """The asyncio client; the same arguments and operations as
    :class:`Client`, each awaited. The token provider may be async.

    Args:
        base_url: The sidecar, e.g. ``http://127.0.0.1:8787``.
        token: A bearer token, or a (sync or async) callable returning one,
            asked before every request.
        admin_token: The sidecar's ``admin_token``, for the ``admin_*`` calls.
        admin_url: Where the admin routes are; default ``base_url``.
        timeout: Seconds per request, plus the wait of a ``wait=true`` one.
        retry: Retries of 503s and 429 ``overloaded`` (:class:`RetryPolicy`).
        headers: Extra headers on every request.
        max_connections: Size of the connection pool.
        transport: An httpx async transport, for tests.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: TokenProvider = None,
        admin_token: Optional[str] = None,
        admin_url: Optional[str] = None,
        timeout: float = 10.0,
        retry: Optional[RetryPolicy] = None,
        headers: Optional[Mapping[str, str]] = None,
        max_connections: int = 100,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._settings = _settings(base_url, admin_url, timeout, retry, admin_token, headers)
        self._token = token
        self._rng = random.Random()
        self._http = httpx.AsyncClient(
            timeout=timeout, limits=_limits(max_connections), transport=transport
        )

    async def _credential(self, override: Optional[str]) -> Optional[str]:
        if override is not None:
            return override
        t = self._token
        if t is None or isinstance(t, str):
            return t
        v = t()
        if inspect.isawaitable(v):
            v = await v
        return v  # type: ignore[return-value]

    async def _run(self, call: _ops.Call, token: Optional[str]) -> Any:
        s = self._settings
        url = (s.admin_url if call.admin else s.base_url) + call.path
        timeout = s.timeout_s + call.extra_timeout_s
        attempt = 0
        while True:
            cred = None if call.admin else await self._credential(token)
            headers = _ops.request_headers(s, call, cred)
            try:
                r = await self._http.request(
                    call.method, url, json=call.body, params=call.params, headers=headers, timeout=timeout
                )
            except httpx.HTTPError as e:
                raise _ops.unreachable(call, e) from e
            delay = _ops.retry_delay_s(
                s.retry, attempt, call, r.status_code, r.headers, r.content, self._rng
            )
            if delay is None:
                return _ops.decode(call, r.status_code, r.headers, r.content)
            attempt += 1
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
