"""The requests' results, refusals and faults shared by both clients.

A *result* is what an operation answers when it succeeds; a *refusal* is a
decision the sidecar made against the request (a limit, a busy session, a
stale fence): both are values the caller branches on. A *fault* means no
decision could be made (bad credentials, bad input, the store or the sidecar
unreachable) and is raised as a :class:`TollgateError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

# ---------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class SessionLease:
    """A session lease: its fencing number and expiry.

    Attributes:
        fence: The fencing number; session writes must carry it.
        expires_at_ms: When the lease expires unless renewed, ms since the
            Unix epoch.
    """

    fence: int
    expires_at_ms: int


@dataclass(frozen=True)
class Admitted:
    """A turn admitted (``POST /v1/runs``), with the plan numbers a client needs.

    Attributes:
        lease_expires_at_ms: Run lease expiry, ms since the Unix epoch.
        lease_ttl_ms: The plan's run lease TTL; renew every third of it.
        estimate_tokens: The plan's estimate of a model call's tokens.
        max_wait_ms: The longest wait a token reservation is granted with.
        max_llm_calls: Reservations one run may make.
        session: The session lease, when a session was named.
    """

    lease_expires_at_ms: int
    lease_ttl_ms: int
    estimate_tokens: int
    max_wait_ms: int
    max_llm_calls: int
    session: Optional[SessionLease] = None


@dataclass(frozen=True)
class Released:
    """The answer to a release (run or session lease).

    Attributes:
        released: ``False`` when it held nothing (not an error) or the
            release is pending.
        pending: The sidecar's store was unreachable; the release is
            journalled and applied when it answers again. Treat it as done.
    """

    released: bool
    pending: bool = False

    @property
    def done(self) -> bool:
        """Always ``True``: a pending close is as good as a done one."""
        return True


@dataclass(frozen=True)
class Renewed:
    """A run lease renewed.

    Attributes:
        lease_expires_at_ms: The run lease's new expiry, ms since the epoch.
    """

    lease_expires_at_ms: int


@dataclass(frozen=True)
class Reservation:
    """Tokens reserved for one model call.

    Attributes:
        reservation_id: Settle or refund it with this id.
        wait_ms: How long to wait before the call (0 when ``wait=True``: the
            sidecar already waited).
        request_id: The request id the reservation was made under (a retry
            with it answers the same grant and charges nothing).
    """

    reservation_id: str
    wait_ms: int
    request_id: str


@dataclass(frozen=True)
class Closed:
    """The answer to a settle or refund.

    Attributes:
        balance: The user's token level after it (negative while in debt);
            ``None`` when the close is pending.
        pending: The sidecar's store was unreachable; the close is journalled
            and applied when it answers again. Treat it as done.
    """

    balance: Optional[int]
    pending: bool = False

    @property
    def done(self) -> bool:
        """Always ``True``: a pending close is as good as a done one."""
        return True


@dataclass(frozen=True)
class FenceCurrent:
    """A fence check that passed: the fence is the session's latest."""

    current: bool = True


@dataclass(frozen=True)
class ProviderPermit:
    """A provider permit granted.

    Attributes:
        wait_ms: How long to wait before calling the provider (0 when the
            sidecar already waited).
        effective_permille: The provider key's current AIMD rate, in permille.
    """

    wait_ms: int
    effective_permille: int


@dataclass(frozen=True)
class FeedbackResult:
    """How the sidecar classified and applied a provider's answer.

    Attributes:
        klass: The class (``ok``, ``throttled``, ``exhausted``, ...; the
            wire field ``class``).
        retryable: Whether the provider call may be retried.
        retry_after_ms: The provider's hint as clamped, if any.
        cooldown_until_ms: The cooldown's end after it, if any.
        effective_permille: The rate after it, if it changed.
        reason: Why permits fail fast, for ``exhausted``.
    """

    klass: str
    retryable: bool
    retry_after_ms: Optional[int] = None
    cooldown_until_ms: Optional[int] = None
    effective_permille: Optional[int] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class LeaseView:
    """One run lease in a user's admin view.

    Attributes:
        invocation_id: The run.
        expires_at_ms: When the lease expires, ms since the epoch.
    """

    invocation_id: str
    expires_at_ms: int


@dataclass(frozen=True)
class BudgetView:
    """One spend budget in a user's admin view, in its current window.

    Attributes:
        window: ``daily``, ``weekly`` or ``monthly``.
        unit: ``tokens``, or ``micros`` (micro-units of ``currency``).
        currency: The config's currency, for a ``micros`` budget.
        limit: The plan's limit per window.
        granted: Top-ups for this window (its limit is ``limit + granted``).
        spent: Spent in this window.
        resets_at_ms: When the window ends, ms since the epoch.
    """

    window: str
    unit: str
    currency: Optional[str]
    limit: int
    granted: int
    spent: int
    resets_at_ms: int


@dataclass(frozen=True)
class UserView:
    """A user's state (``GET /admin/users/{user}``).

    Attributes:
        user: The user id.
        plan: The effective plan's name.
        turns_available: Whole turns in the turn bucket.
        tokens_available: Whole tokens in the token bucket (negative in debt).
        tokens_last_minute: The sliding-minute token estimate.
        leases: The live run leases.
        budgets: The plan's spend budgets now (empty: none).
    """

    user: str
    plan: str
    turns_available: int
    tokens_available: int
    tokens_last_minute: int
    leases: tuple[LeaseView, ...]
    budgets: tuple[BudgetView, ...] = ()


@dataclass(frozen=True)
class TopUser:
    """One row of ``GET /admin/top``.

    Attributes:
        user: The user id.
        tokens_last_minute: The sliding-minute token estimate.
    """

    user: str
    tokens_last_minute: int


@dataclass(frozen=True)
class Reloaded:
    """The answer to ``POST /admin/reload``.

    Attributes:
        reloaded: Always ``True`` (a bad config raises InvalidConfig).
        needs_restart: Settings changed that keep their running values until
            a restart.
    """

    reloaded: bool
    needs_restart: tuple[str, ...]


@dataclass(frozen=True)
class ProviderTenant:
    """A tenant of a provider key in its admin view (docs/spec.md §5, *Fair
    sharing*).

    Attributes:
        name: The tenant (``{others}``: unconfigured tenants past the key's
            64; ``{none}``: permits naming none).
        weight: Its configured weight, or ``None``.
        share: Its configured ceiling (a fraction of the pool), or ``None``.
        active: Whether it asked within the key's ``max_wait_ms``.
        booked_ahead_ms: How far ahead of its weighted share it has booked,
            ms at the current sharing (0: not ahead).
        recent_share: A configured tenant's part of the permits granted on
            that replica in the last minute, or ``None``.
    """

    name: str
    weight: Optional[int]
    share: Optional[float]
    active: bool
    booked_ahead_ms: int
    recent_share: Optional[float]


@dataclass(frozen=True)
class ProviderView:
    """A provider key's admin view (``GET /admin/providers``).

    Attributes:
        provider: The provider.
        model: The model.
        cooldown_until_ms: The cooldown's end, or ``None``.
        cooldown_remaining_ms: Ms left of the cooldown.
        effective_permille: The current AIMD rate.
        exhausted: This replica's exhaustion (``until_ms``, ``remaining_ms``,
            ``reason``) or ``None``.
        tenants: Its configured tenants and those its fair sharing holds, by
            name.
    """

    provider: str
    model: str
    cooldown_until_ms: Optional[int]
    cooldown_remaining_ms: int
    effective_permille: int
    exhausted: Optional[Mapping[str, Any]]
    tenants: tuple[ProviderTenant, ...] = ()


@dataclass(frozen=True)
class ProviderCleared:
    """What ``POST /admin/providers/{provider}/{model}/clear`` cleared.

    Attributes:
        provider: The provider.
        model: The model.
        cleared: ``{cooldown_until_ms, effective_permille, exhausted}`` as the
            sidecar answered (``None`` values: nothing of that kind).
    """

    provider: str
    model: str
    cleared: Mapping[str, Any]


# ---------------------------------------------------------------------------
# Refusals


@dataclass(frozen=True)
class Refusal:
    """A decision against the request: a value, never raised.

    Attributes:
        error: The sidecar's ``error`` code.
        message: The sidecar's message.
        retry_after_ms: When a retry may succeed; ``None`` when it cannot.
        limit: The limit that refused, when the sidecar names one.
        status: The HTTP status it came with.
    """

    error: str
    message: str
    retry_after_ms: Optional[int] = None
    limit: Optional[str] = None
    status: int = 429

    @property
    def retryable(self) -> bool:
        """Whether a retry after ``retry_after_ms`` may succeed."""
        return self.retry_after_ms is not None


@dataclass(frozen=True)
class TurnRateLimited(Refusal):
    """The user's turn rate is spent (429 ``turn_rate``)."""


@dataclass(frozen=True)
class ConcurrencyLimited(Refusal):
    """The user runs as many turns as the plan allows (429 ``concurrency``)."""


@dataclass(frozen=True)
class SessionsLimited(Refusal):
    """A new session past the plan's ``max_sessions`` (429 ``sessions``)."""


@dataclass(frozen=True)
class SessionBusy(Refusal):
    """Another holder has the session; ``retry_after_ms`` is its remaining TTL (409)."""


@dataclass(frozen=True)
class TokenRateLimited(Refusal):
    """The call's tokens do not fit within the plan's max wait (429 ``token_rate``)."""


@dataclass(frozen=True)
class BudgetExhausted(Refusal):
    """A spend budget of the user is spent (429 ``budget_exhausted``): ``limit``
    names its window (``budget_daily``, ``budget_weekly``, ``budget_monthly``)
    and ``retry_after_ms`` runs to its end.

    Attributes:
        resets_at_ms: When the window ends, ms since the Unix epoch (the
            sidecar's clock).
    """

    resets_at_ms: Optional[int] = None


@dataclass(frozen=True)
class MaxLlmCalls(Refusal):
    """The run made the plan's ``max_llm_calls`` model calls (429, not retryable)."""


@dataclass(frozen=True)
class ExceedsCapacity(Refusal):
    """The request can never fit the bucket (400 ``exceeds_capacity``; not retryable)."""


@dataclass(frozen=True)
class TooManyWaits(Refusal):
    """Too many ``wait=true`` requests wait at once (429 ``too_many_waits``)."""


@dataclass(frozen=True)
class ProviderLimited(Refusal):
    """The provider key's rate or cooldown refuses the call (``provider_rate`` / ``provider_cooldown``)."""


@dataclass(frozen=True)
class ProviderExhausted(Refusal):
    """The provider's quota is exhausted; permits fail fast for ``retry_after_ms`` (403)."""


@dataclass(frozen=True)
class StaleFence(Refusal):
    """A newer holder took the session (409 ``stale_fence``).

    Attributes:
        latest_fence: The session's latest issued fence.
    """

    latest_fence: int = 0


@dataclass(frozen=True)
class LeaseLost(Refusal):
    """The run lease is gone (expired or released): 404 ``lease_lost``."""


@dataclass(frozen=True)
class NotHolder(Refusal):
    """The session lease is not held by this holder (404 ``not_holder``)."""


@dataclass(frozen=True)
class UnknownReservation(Refusal):
    """No such reservation (404 ``unknown_reservation``)."""


REFUSALS: dict[str, type[Refusal]] = {
    "turn_rate": TurnRateLimited,
    "concurrency": ConcurrencyLimited,
    "sessions": SessionsLimited,
    "session_busy": SessionBusy,
    "token_rate": TokenRateLimited,
    "budget_exhausted": BudgetExhausted,
    "max_llm_calls": MaxLlmCalls,
    "exceeds_capacity": ExceedsCapacity,
    "too_many_waits": TooManyWaits,
    "provider_rate": ProviderLimited,
    "provider_cooldown": ProviderLimited,
    "provider_exhausted": ProviderExhausted,
    "stale_fence": StaleFence,
    "lease_lost": LeaseLost,
    "not_holder": NotHolder,
    "unknown_reservation": UnknownReservation,
}
"""The sidecar's ``error`` codes answered as refusal values, and their types."""


# ---------------------------------------------------------------------------
# Faults


class TollgateError(Exception):
    """No decision could be made: raised, never returned.

    Attributes:
        operation: The client operation, e.g. ``"reserve"``.
        error: The sidecar's ``error`` code (``"unreachable"`` when there was
            no answer).
        status: The HTTP status, or ``None`` without an answer.
        message: The sidecar's message, or the transport's.
        retry_after_ms: A retry hint, when one was given.
        field: The offending field, for ``invalid_request``.
    """

    def __init__(
        self,
        operation: str,
        error: str,
        message: str,
        *,
        status: Optional[int] = None,
        retry_after_ms: Optional[int] = None,
        field: Optional[str] = None,
    ) -> None:
        self.operation = operation
        self.error = error
        self.status = status
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.field = field
        where = f" (field {field})" if field else ""
        super().__init__(f"tollgate {operation}: {error}{where}: {message}")


class Unauthorized(TollgateError):
    """No verified identity, or a user no plan covers (401)."""


class Forbidden(TollgateError):
    """The credential lacks a privilege the operation needs (403 ``forbidden``)."""


class InvalidRequest(TollgateError):
    """Bad input (400 ``invalid_request``, ``field`` names it), or a bad config on reload."""


class NotFound(TollgateError):
    """An unknown route or provider key (404 ``not_found`` / ``unknown_provider``)."""


class RequestTimeout(TollgateError):
    """The body did not arrive in time (408)."""


class StoreUnavailable(TollgateError):
    """The sidecar's store fails (503 ``store_unavailable``) or is full (``store_full``)."""


class Overloaded(TollgateError):
    """Over an in-flight cap (the sidecar's 429 ``overloaded`` after the
    client's retries, or :class:`tollgate.adk.TurnExecutor`'s per-process
    cap): retry after ``retry_after_ms``."""


class ServerError(TollgateError):
    """A 500 or an answer the client does not understand."""


class SidecarUnreachable(TollgateError):
    """No answer: connection refused, reset, or timed out."""


FAULTS: dict[str, type[TollgateError]] = {
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "invalid_request": InvalidRequest,
    "invalid_config": InvalidRequest,
    "not_found": NotFound,
    "unknown_provider": NotFound,
    "request_timeout": RequestTimeout,
    "store_unavailable": StoreUnavailable,
    "store_full": StoreUnavailable,
    "overloaded": Overloaded,
    "internal": ServerError,
}
"""The sidecar's ``error`` codes raised as faults, and their types."""


@dataclass
class RetryPolicy:
    """Retries of 503 and 429 ``overloaded`` answers (and nothing else).

    The delay before retry ``n`` (0-based) is full jitter,
    ``uniform(0, min(max_backoff_ms, base_ms * 2**n))``, raised to the
    server's hint (``retry_after_ms`` or ``Retry-After``) when it gives one;
    a hint above ``max_delay_ms`` is not waited out (the fault is raised).

    Attributes:
        max_retries: Retries after the first attempt (0: none).
        base_ms: The first backoff's ceiling.
        max_backoff_ms: The ceiling of any backoff.
        max_delay_ms: The longest single delay, hint included.
    """

    max_retries: int = 2
    base_ms: int = 100
    max_backoff_ms: int = 2_000
    max_delay_ms: int = 5_000

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.base_ms < 0 or self.max_backoff_ms < 0:
            raise ValueError("retry policy numbers must be non-negative")

