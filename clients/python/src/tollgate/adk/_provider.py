"""Provider quota helpers: a permit before a model call, the provider's
answer reported back."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncGenerator, Callable, Mapping, Optional

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from pydantic import ConfigDict

from .._client import AsyncClient
from .._models import FeedbackResult, ProviderPermit, Refusal, TollgateError
from ._executor import TurnRefused
from ._plugin import Credentials, current_user, request_tokens, token_for

log = logging.getLogger("tollgate.adk")

ProviderAnswer = tuple[int, Mapping[str, str], Optional[str]]
"""A provider's failed answer: HTTP status, headers, body."""


def provider_answer(error: BaseException) -> Optional[ProviderAnswer]:
    """The provider's answer inside a model error, when there is one: a
    ``google.genai.errors.APIError`` (the Gemini client's) or any exception
    with an integer ``code`` or ``status_code`` and optionally a
    ``response`` with ``headers``. ``None`` for anything else."""
    code = getattr(error, "code", None)
    if not isinstance(code, int):
        code = getattr(error, "status_code", None)
    if not isinstance(code, int) or not 100 <= code <= 599:
        return None
    resp = getattr(error, "response", None)
    headers: dict[str, str] = {}
    raw = getattr(resp, "headers", None)
    if raw is not None:
        try:
            headers = {str(k).lower(): str(v) for k, v in dict(raw).items()}
        except (TypeError, ValueError):
            headers = {}
    details = getattr(error, "details", None)
    if details is None:
        body = None
    elif isinstance(details, str):
        body = details
    else:
        try:
            body = json.dumps(details)
        except (TypeError, ValueError):
            body = str(details)
    return code, headers, body


class ProviderGate:
    """A provider key's permits and feedback (docs/spec.md §5).

    Args:
        client: The sidecar's :class:`tollgate.AsyncClient`.
        provider: The provider, e.g. ``"gemini"``.
        model: The model, as the sidecar's config names the key.
        tenant: The tenant to charge, when the sidecar does not take it from
            the credential (a sidecar with ``tenant_claim`` takes it from the
            verified token, and refuses another); :meth:`permit` may name
            one per call instead.
        max_wait_ms: The longest the caller will wait for a permit.
        feedback_token: The privileged credential (with the feedback scope)
            used to report answers; ``None``: the client's own.
    """

    def __init__(
        self,
        client: AsyncClient,
        provider: str,
        model: str,
        *,
        tenant: Optional[str] = None,
        max_wait_ms: Optional[int] = None,
        feedback_token: Optional[str] = None,
    ) -> None:
        self.client = client
        self.provider = provider
        self.model = model
        self.tenant = tenant
        self.max_wait_ms = max_wait_ms
        self.feedback_token = feedback_token

    async def permit(
        self, tokens: int, *, token: Optional[str] = None, tenant: Optional[str] = None
    ) -> Any:
        """Takes a permit for a call of ``tokens``, the sidecar waiting out
        any wait, as ``tenant`` (default the gate's) with ``token`` (default
        the client's own). Returns :class:`tollgate.ProviderPermit` or a
        refusal (:class:`tollgate.ProviderLimited`,
        :class:`tollgate.ProviderExhausted`, :class:`tollgate.ExceedsCapacity`)."""
        r = await self.client.provider_permit(
            self.provider,
            self.model,
            max(1, tokens),
            tenant=tenant if tenant is not None else self.tenant,
            max_wait_ms=self.max_wait_ms,
            wait=True,
            token=token,
        )
        if isinstance(r, ProviderPermit) and r.wait_ms > 0:
            await asyncio.sleep(r.wait_ms / 1000.0)
        return r

    async def report(
        self, status: int, headers: Optional[Mapping[str, str]] = None, body: Optional[str] = None
    ) -> FeedbackResult:
        """Reports the provider's answer (a 429 pauses the pool, an
        exhausted quota makes permits fail fast)."""
        r = await self.client.provider_feedback(
            self.provider, self.model, status, headers or {}, body, token=self.feedback_token
        )
        assert isinstance(r, FeedbackResult)
        return r

    async def report_error(self, error: BaseException) -> Optional[FeedbackResult]:
        """Reports the provider answer inside ``error`` (see
        :func:`provider_answer`); ``None`` when it holds none or the report
        failed (logged)."""
        answer = provider_answer(error)
        if answer is None:
            return None
        status, headers, body = answer
        try:
            return await self.report(status, headers, body)
        except TollgateError as e:
            log.warning("tollgate provider feedback failed: %s", e)
            return None


class QuotaGatedLlm(BaseLlm):
    """Wraps any google-adk model (``Gemini`` included, without patching
    ADK): a provider permit before each call, and a failed call's provider
    answer reported as feedback before the error propagates.

    ``QuotaGatedLlm(model=inner.model, inner=inner, gate=ProviderGate(...))``
    is used as the agent's ``model``. A refused permit raises
    :class:`TurnRefused` (so :class:`TollgatePlugin` refunds the call's
    reservation).

    With fair sharing of the key among tenants (docs/spec.md §5), each
    call is the caller's: :class:`TollgatePlugin` on the runner names the
    run's user (:func:`tollgate.adk.current_user`), ``tenant_of`` maps it to
    the tenant sent with the permit (for a sidecar without ``tenant_claim``,
    which takes the tenant as sent), and ``credentials`` to the token the
    permit is asked with (for a sidecar with ``tenant_claim``, which takes
    the tenant from that verified token).

    Attributes:
        inner: The wrapped model.
        gate: The provider key's :class:`ProviderGate`.
        tokens: Tokens a call is asked a permit for; default the request's
            size (:func:`tollgate.adk.request_tokens`).
        tenant_of: Given the run's user id, its tenant (``None``: the gate's
            own ``tenant``).
        credentials: Given the run's user id, the token to ask the permit
            with (``None``: the gate's client's own).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseLlm
    gate: Any
    tokens: Optional[Callable[[LlmRequest], int]] = None
    tenant_of: Optional[Callable[[str], Optional[str]]] = None
    credentials: Optional[Credentials] = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        """Takes a permit, then delegates to the wrapped model."""
        gate: ProviderGate = self.gate
        n = self.tokens(llm_request) if self.tokens else request_tokens(llm_request)
        user = current_user()
        tenant = self.tenant_of(user) if self.tenant_of is not None and user is not None else None
        tok = await token_for(self.credentials, user) if user is not None else None
        permit = await gate.permit(n, token=tok, tenant=tenant)
        if isinstance(permit, Refusal):
            raise TurnRefused("provider_permit", permit)
        try:
            async for r in self.inner.generate_content_async(llm_request, stream=stream):
                yield r
        except Exception as e:
            await gate.report_error(e)
            raise
