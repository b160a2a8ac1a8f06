"""One description of every operation, shared by the sync and async clients.

Each operation is a :class:`Call`: how to send it (method, path, body, query,
whether a retry is safe, extra time it may legitimately take) and how to read
the answer (``parse`` for a 200; refusals and faults by the ``error`` code).
The clients only move bytes and sleep.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union
from urllib.parse import quote

from ._models import (
    FAULTS,
    REFUSALS,
    Admitted,
    BudgetExhausted,
    Closed,
    FeedbackResult,
    FenceCurrent,
    BudgetView,
    LeaseView,
    ProviderCleared,
    ProviderPermit,
    ProviderTenant,
    ProviderView,
    Refusal,
    Released,
    Reloaded,
    Renewed,
    Reservation,
    RetryPolicy,
    ServerError,
    SessionLease,
    StaleFence,
    TollgateError,
    TopUser,
    UserView,
)


def _seg(v: str) -> str:
    """A path segment, percent-encoded (a ``/`` in a model is ``%2F``)."""
    return quote(v, safe="")


@dataclass
class Call:
    """One request to the sidecar and how to read its answer.

    Attributes:
        operation: The operation's name, carried by faults.
        method: The HTTP method.
        path: The path, ids already encoded.
        parse: Turns a 200 body into the result.
        body: The JSON body, if any.
        params: The query, if any.
        retry_safe: Retried after a 503: a retry cannot take or grant
            twice (reserves and top-ups carry request ids).
        admin: Sent with the admin token to the admin URL.
        extra_timeout_s: Time the sidecar may hold the request on purpose
            (a ``wait=true`` reservation or permit), added to the timeout.
    """

    operation: str
    method: str
    path: str
    parse: Callable[[Any], Any]
    body: Optional[dict[str, Any]] = None
    params: Optional[dict[str, str]] = None
    retry_safe: bool = True
    admin: bool = False
    extra_timeout_s: float = 0.0


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _session(b: Any) -> Optional[SessionLease]:
    if b is None:
        return None
    return SessionLease(fence=int(b["fence"]), expires_at_ms=int(b["expires_at_ms"]))


# ---------------------------------------------------------------------------
# The operations (docs/spec.md §8)


def admit_run(
    invocation_id: str,
    session_id: Optional[str] = None,
    session_ttl_ms: Optional[int] = None,
) -> Call:
    """``POST /v1/runs``."""

    def parse(b: Any) -> Admitted:
        return Admitted(
            lease_expires_at_ms=int(b["lease_expires_at_ms"]),
            lease_ttl_ms=int(b["lease_ttl_ms"]),
            estimate_tokens=int(b["estimate_tokens"]),
            max_wait_ms=int(b["max_wait_ms"]),
            max_llm_calls=int(b["max_llm_calls"]),
            session=_session(b.get("session")),
        )

    body = _drop_none(
        {
            "invocation_id": invocation_id,
            "session_id": session_id,
            "session_ttl_ms": session_ttl_ms,
        }
    )
    return Call("admit_run", "POST", "/v1/runs", parse, body=body)


def release_run(invocation_id: str, session_id: Optional[str] = None) -> Call:
    """``DELETE /v1/runs/{invocation_id}[?session_id=…]``."""
    params = {"session_id": session_id} if session_id is not None else None
    return Call(
        "release_run",
        "DELETE",
        f"/v1/runs/{_seg(invocation_id)}",
        _released,
        params=params,
    )


def _released(b: Any) -> Released:
    return Released(released=bool(b["released"]), pending=bool(b.get("pending", False)))


def renew_run(invocation_id: str) -> Call:
    """``POST /v1/runs/{invocation_id}/renew``."""
    return Call(
        "renew_run",
        "POST",
        f"/v1/runs/{_seg(invocation_id)}/renew",
        lambda b: Renewed(lease_expires_at_ms=int(b["lease_expires_at_ms"])),
        body={},
    )


def reserve(
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
) -> Call:
    """``POST /v1/tokens/reserve``, always under a request id (generated
    when not given) so a retry answers the first grant and never charges
    twice. ``model`` (``"provider:model"``) and the token split price the
    call for the plan's cost budgets."""
    rid = request_id or uuid.uuid4().hex

    def parse(b: Any) -> Reservation:
        return Reservation(
            reservation_id=str(b["reservation_id"]),
            wait_ms=int(b["wait_ms"]),
            request_id=rid,
        )

    body: dict[str, Any] = {
        "invocation_id": invocation_id,
        "estimate": estimate,
        "wait": wait,
        "request_id": rid,
    }
    if model is not None:
        body["model"] = model
    body.update(_split(input_tokens, output_tokens, cached_input_tokens))
    return Call(
        "reserve",
        "POST",
        "/v1/tokens/reserve",
        parse,
        body=body,
        retry_safe=True,
        extra_timeout_s=(max_wait_ms / 1000.0) if wait else 0.0,
    )


def _closed(b: Any) -> Closed:
    if b.get("pending"):
        return Closed(balance=None, pending=True)
    return Closed(balance=int(b["balance"]), pending=False)


def _split(
    input_tokens: Optional[int], output_tokens: Optional[int], cached_input_tokens: Optional[int]
) -> dict[str, int]:
    parts = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_input_tokens": cached_input_tokens,
    }
    return {k: v for k, v in parts.items() if v is not None}


def settle(
    reservation_id: str,
    actual: int,
    *,
    input_tokens: Optional[int] = None,
    output_tokens: Optional[int] = None,
    cached_input_tokens: Optional[int] = None,
) -> Call:
    """``POST /v1/tokens/settle``; the usage's split prices the call at the
    reservation's price for cost budgets."""
    body: dict[str, Any] = {"reservation_id": reservation_id, "actual": actual}
    body.update(_split(input_tokens, output_tokens, cached_input_tokens))
    return Call("settle", "POST", "/v1/tokens/settle", _closed, body=body)


def refund(reservation_id: str) -> Call:
    """``POST /v1/tokens/refund``."""
    return Call(
        "refund", "POST", "/v1/tokens/refund", _closed, body={"reservation_id": reservation_id}
    )


def _lease(b: Any) -> SessionLease:
    return SessionLease(fence=int(b["fence"]), expires_at_ms=int(b["expires_at_ms"]))


def acquire_session_lease(session_id: str, holder: str, ttl_ms: int) -> Call:
    """``POST /v1/sessions/{session_id}/lease``."""
    return Call(
        "acquire_session_lease",
        "POST",
        f"/v1/sessions/{_seg(session_id)}/lease",
        _lease,
        body={"holder": holder, "ttl_ms": ttl_ms},
    )


def renew_session_lease(session_id: str, holder: str, ttl_ms: int) -> Call:
    """``POST /v1/sessions/{session_id}/lease/renew``."""
    return Call(
        "renew_session_lease",
        "POST",
        f"/v1/sessions/{_seg(session_id)}/lease/renew",
        _lease,
        body={"holder": holder, "ttl_ms": ttl_ms},
    )


def release_session_lease(session_id: str, holder: str) -> Call:
    """``DELETE /v1/sessions/{session_id}/lease?holder=…``."""
    return Call(
        "release_session_lease",
        "DELETE",
        f"/v1/sessions/{_seg(session_id)}/lease",
        _released,
        params={"holder": holder},
    )


def check_fence(session_id: str, fence: int) -> Call:
    """``POST /v1/sessions/{session_id}/fence``."""
    return Call(
        "check_fence",
        "POST",
        f"/v1/sessions/{_seg(session_id)}/fence",
        lambda b: FenceCurrent(current=bool(b["current"])),
        body={"fence": fence},
    )


def provider_permit(
    provider: str,
    model: str,
    tokens: int,
    *,
    tenant: Optional[str] = None,
    input_tokens: Optional[int] = None,
    output_tokens: Optional[int] = None,
    max_wait_ms: Optional[int] = None,
    wait: bool = False,
) -> Call:
    """``POST /v1/providers/{provider}/permits``. Never retried: a permit
    is a take with no request id, so a retry could take twice."""
    body = _drop_none(
        {
            "model": model,
            "tenant": tenant,
            "tokens": tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "max_wait_ms": max_wait_ms,
            "wait": wait,
        }
    )
    return Call(
        "provider_permit",
        "POST",
        f"/v1/providers/{_seg(provider)}/permits",
        lambda b: ProviderPermit(
            wait_ms=int(b["wait_ms"]), effective_permille=int(b["effective_permille"])
        ),
        body=body,
        retry_safe=False,
        extra_timeout_s=((max_wait_ms or 60_000) / 1000.0) if wait else 0.0,
    )


def provider_feedback(
    provider: str,
    model: str,
    status: int,
    headers: Optional[Mapping[str, str]] = None,
    body: Optional[str] = None,
) -> Call:
    """``POST /v1/providers/{provider}/feedback``."""

    def parse(b: Any) -> FeedbackResult:
        return FeedbackResult(
            klass=str(b["class"]),
            retryable=bool(b["retryable"]),
            retry_after_ms=b.get("retry_after_ms"),
            cooldown_until_ms=b.get("cooldown_until_ms"),
            effective_permille=b.get("effective_permille"),
            reason=b.get("reason"),
        )

    payload = _drop_none(
        {"model": model, "status": status, "headers": dict(headers or {}), "body": body}
    )
    return Call(
        "provider_feedback",
        "POST",
        f"/v1/providers/{_seg(provider)}/feedback",
        parse,
        body=payload,
        # Feedback is not idempotent (a second 429 may halve the rate again).
        retry_safe=False,
    )


def healthz() -> Call:
    """``GET /healthz``."""
    return Call("healthz", "GET", "/healthz", lambda b: b.get("status") == "ok")


def readyz() -> Call:
    """``GET /readyz``."""
    return Call("readyz", "GET", "/readyz", lambda b: b.get("status") == "ok", retry_safe=False)


# Admin routes


def admin_user(user: str) -> Call:
    """``GET /admin/users/{user}``."""

    def parse(b: Any) -> UserView:
        return UserView(
            user=str(b["user"]),
            plan=str(b["plan"]),
            turns_available=int(b["turns_available"]),
            tokens_available=int(b["tokens_available"]),
            tokens_last_minute=int(b["tokens_last_minute"]),
            leases=tuple(
                LeaseView(invocation_id=str(x["invocation_id"]), expires_at_ms=int(x["expires_at_ms"]))
                for x in b.get("leases", [])
            ),
            budgets=_budgets(b),
        )

    return Call("admin_user", "GET", f"/admin/users/{_seg(user)}", parse, admin=True)


def _budgets(b: Any) -> tuple[BudgetView, ...]:
    return tuple(
        BudgetView(
            window=str(x["window"]),
            unit=str(x["unit"]),
            currency=x.get("currency"),
            limit=int(x["limit"]),
            granted=int(x.get("granted", 0)),
            spent=int(x["spent"]),
            resets_at_ms=int(x["resets_at_ms"]),
        )
        for x in b.get("budgets", [])
    )


def admin_budget_reset(user: str, window: str) -> Call:
    """``POST /admin/users/{user}/budgets/{window}/reset``."""
    return Call(
        "admin_budget_reset",
        "POST",
        f"/admin/users/{_seg(user)}/budgets/{_seg(window)}/reset",
        _budgets,
        admin=True,
    )


def admin_budget_top_up(
    user: str,
    window: str,
    *,
    tokens: Optional[int] = None,
    cost: Optional[str] = None,
    request_id: Optional[str] = None,
) -> Call:
    """``POST /admin/users/{user}/budgets/{window}/top_up``, with a request
    id (a new UUID unless given) so its retries grant once."""
    body: dict[str, Any] = {
        "request_id": request_id if request_id is not None else str(uuid.uuid4())
    }
    if tokens is not None:
        body["tokens"] = tokens
    if cost is not None:
        body["cost"] = cost
    return Call(
        "admin_budget_top_up",
        "POST",
        f"/admin/users/{_seg(user)}/budgets/{_seg(window)}/top_up",
        _budgets,
        body=body,
        # The sidecar applies one request id once (within a day).
        admin=True,
    )


def admin_top(n: Optional[int] = None) -> Call:
    """``GET /admin/top?n=``."""
    return Call(
        "admin_top",
        "GET",
        "/admin/top",
        lambda b: tuple(
            TopUser(user=str(x["user"]), tokens_last_minute=int(x["tokens_last_minute"]))
            for x in b["users"]
        ),
        params={"n": str(n)} if n is not None else None,
        admin=True,
    )


def admin_reset(user: str) -> Call:
    """``POST /admin/users/{user}/reset``."""
    return Call(
        "admin_reset",
        "POST",
        f"/admin/users/{_seg(user)}/reset",
        lambda b: bool(b["reset"]),
        admin=True,
    )


def admin_release_lease(user: str, invocation_id: str) -> Call:
    """``DELETE /admin/users/{user}/leases/{invocation_id}``."""
    return Call(
        "admin_release_lease",
        "DELETE",
        f"/admin/users/{_seg(user)}/leases/{_seg(invocation_id)}",
        _released,
        admin=True,
    )


def admin_reload() -> Call:
    """``POST /admin/reload``."""
    return Call(
        "admin_reload",
        "POST",
        "/admin/reload",
        lambda b: Reloaded(
            reloaded=bool(b["reloaded"]), needs_restart=tuple(b.get("needs_restart", []))
        ),
        admin=True,
        retry_safe=False,
    )


def _provider_view(b: Any) -> ProviderView:
    return ProviderView(
        provider=str(b["provider"]),
        model=str(b["model"]),
        cooldown_until_ms=b.get("cooldown_until_ms"),
        cooldown_remaining_ms=int(b.get("cooldown_remaining_ms", 0)),
        effective_permille=int(b["effective_permille"]),
        exhausted=b.get("exhausted"),
        tenants=tuple(
            ProviderTenant(
                name=str(x["name"]),
                weight=x.get("weight"),
                share=x.get("share"),
                active=bool(x.get("active", False)),
                booked_ahead_ms=int(x.get("booked_ahead_ms", 0)),
                recent_share=x.get("recent_share"),
            )
            for x in b.get("tenants", ())
        ),
    )


def admin_providers() -> Call:
    """``GET /admin/providers``."""
    return Call(
        "admin_providers",
        "GET",
        "/admin/providers",
        lambda b: tuple(_provider_view(x) for x in b["providers"]),
        admin=True,
    )


def admin_provider(provider: str, model: str) -> Call:
    """``GET /admin/providers/{provider}/{model}``."""
    return Call(
        "admin_provider",
        "GET",
        f"/admin/providers/{_seg(provider)}/{_seg(model)}",
        _provider_view,
        admin=True,
    )


def admin_clear_provider(provider: str, model: str) -> Call:
    """``POST /admin/providers/{provider}/{model}/clear``."""
    return Call(
        "admin_clear_provider",
        "POST",
        f"/admin/providers/{_seg(provider)}/{_seg(model)}/clear",
        lambda b: ProviderCleared(provider=str(b["provider"]), model=str(b["model"]), cleared=b["cleared"]),
        admin=True,
    )


# ---------------------------------------------------------------------------
# Reading answers


Outcome = Union[Any, Refusal]
"""What a call answers: its result, or a :class:`Refusal`."""


def _retry_after_ms(body: Mapping[str, Any], headers: Mapping[str, str]) -> Optional[int]:
    v = body.get("retry_after_ms")
    if isinstance(v, (int, float)) and v >= 0:
        return int(v)
    h = headers.get("retry-after")
    if h is not None:
        try:
            return max(0, int(float(h) * 1000))
        except ValueError:
            return None
    return None


def _body(content: bytes) -> dict[str, Any]:
    try:
        b = json.loads(content) if content else {}
    except ValueError:
        return {}
    return b if isinstance(b, dict) else {}


def decode(call: Call, status: int, headers: Mapping[str, str], content: bytes) -> Outcome:
    """Reads an answer: the result for a 200, a :class:`Refusal` for a
    decision, or raises the :class:`TollgateError` for a fault."""
    body = _body(content)
    if status == 200:
        try:
            return call.parse(body)
        except (KeyError, TypeError, ValueError) as e:
            raise ServerError(
                call.operation, "bad_answer", f"unexpected answer {body!r}: {e}", status=status
            ) from e
    error = str(body.get("error") or f"http_{status}")
    message = str(body.get("message") or error)
    retry = _retry_after_ms(body, headers)
    kind = REFUSALS.get(error)
    if kind is not None:
        limit = body.get("limit")
        if kind is BudgetExhausted:
            resets = body.get("resets_at_ms")
            return BudgetExhausted(
                error=error,
                message=message,
                retry_after_ms=retry,
                limit=limit,
                status=status,
                resets_at_ms=int(resets) if isinstance(resets, (int, float)) else None,
            )
        if kind is StaleFence:
            return StaleFence(
                error=error,
                message=message,
                retry_after_ms=None,
                limit=limit,
                status=status,
                latest_fence=int(body.get("latest_fence") or 0),
            )
        # Only a hint the sidecar gave makes a refusal retryable (max_llm_calls
        # and exceeds_capacity carry none).
        return kind(error=error, message=message, retry_after_ms=retry, limit=limit, status=status)
    fault = FAULTS.get(error)
    if fault is None:
        fault = ServerError
    raise fault(
        call.operation,
        error,
        message,
        status=status,
        retry_after_ms=retry,
        field=body.get("field"),
    )


def retry_delay_s(
    policy: RetryPolicy,
    attempt: int,
    call: Call,
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    rng: random.Random,
) -> Optional[float]:
    """The delay before retrying ``call`` after its answer, or ``None`` when
    it is not retried: only 503s and 429 ``overloaded`` are, only when the
    call is retry-safe, at most ``policy.max_retries`` times, and never when
    the server's hint is longer than ``policy.max_delay_ms``."""
    if not call.retry_safe or attempt >= policy.max_retries:
        return None
    body = _body(content)
    if status == 503:
        pass
    elif status == 429 and body.get("error") == "overloaded":
        pass
    else:
        return None
    hint = _retry_after_ms(body, headers) or 0
    if hint > policy.max_delay_ms:
        return None
    ceiling = min(policy.max_backoff_ms, policy.base_ms * (2**attempt))
    jitter = rng.uniform(0, ceiling)
    return min(max(float(hint), jitter), float(policy.max_delay_ms)) / 1000.0


@dataclass
class Settings:
    """What both clients are configured with (see :class:`tollgate.Client`)."""

    base_url: str
    admin_url: str
    timeout_s: float
    retry: RetryPolicy
    admin_token: Optional[str]
    headers: dict[str, str] = field(default_factory=dict)


def request_headers(
    settings: Settings, call: Call, token: Optional[str]
) -> dict[str, str]:
    """The headers of one request: the static ones, then the credential."""
    h = dict(settings.headers)
    if call.admin:
        if settings.admin_token:
            h["authorization"] = f"Bearer {settings.admin_token}"
    elif token:
        h["authorization"] = f"Bearer {token}"
    return h


def unreachable(call: Call, e: Exception) -> TollgateError:
    """The fault for a request that got no answer."""
    from ._models import SidecarUnreachable

    return SidecarUnreachable(call.operation, "unreachable", f"{type(e).__name__}: {e}")
