"""google-adk integration (``pip install tollgate-client[adk]``).

* :class:`TollgatePlugin`: admits each run, reserves and settles each model
  call, renews the run lease, and releases on every exit path (including the
  caller stopping iteration early).
* :class:`TurnExecutor`: a per-process in-flight cap and the session lease
  with its fence around ``Runner.run_async``; :func:`current_turn` exposes
  the fence to a session service.
* :class:`ProviderGate` and :class:`QuotaGatedLlm`: provider permits before
  model calls and the provider's answers fed back.
"""

from ._executor import Turn, TurnExecutor, TurnRefused, current_turn
from ._plugin import (
    UNAVAILABLE_TEXT,
    Credentials,
    Estimator,
    TollgatePlugin,
    current_user,
    denial_text,
    request_tokens,
    stopped_text,
)
from ._provider import ProviderAnswer, ProviderGate, QuotaGatedLlm, provider_answer

__all__ = [
    "Credentials",
    "Estimator",
    "ProviderAnswer",
    "ProviderGate",
    "QuotaGatedLlm",
    "TollgatePlugin",
    "Turn",
    "TurnExecutor",
    "TurnRefused",
    "UNAVAILABLE_TEXT",
    "current_turn",
    "current_user",
    "denial_text",
    "provider_answer",
    "request_tokens",
    "stopped_text",
]
