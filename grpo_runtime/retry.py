"""One way to call again after a transient failure: exponential backoff within a time budget.

Two layers retry, each for what it can see:

- the channel (:mod:`grpo_runtime.client`): gRPC's own retry policy repeats a call refused with UNAVAILABLE
  before any response started, a few times within about a second (a connection being re-established);
- :func:`call_with_retry`, for what outlasts that: a service restarting for minutes, a deadline missed, or a
  RESOURCE_EXHAUSTED with the server's pushback. The clients wrap their calls in it (``retry_budget_s``), and
  the trainer wraps a whole generation step in it (a step is redone after its weights are pushed again).

Which errors are retried is decided once, by :attr:`ServiceCallError.retryable`
(:data:`~grpo_runtime.call_errors.RETRYABLE_CODES`, or a pushback); a caller may add its own transient errors
with ``retryable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from grpo_runtime.call_errors import ServiceCallError

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff of :func:`call_with_retry`.

    The n-th wait (n = 0, 1, ...) is ``min(initial_backoff_s * multiplier**n, max_backoff_s)`` seconds, or the
    server's pushback when that is longer; no attempt starts whose wait would end past ``budget_s`` seconds
    after the first attempt began (``budget_s=0``: one attempt).
    """

    budget_s: float = 0.0
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    multiplier: float = 2.0


def is_retryable(error: BaseException) -> bool:
    """A failed call that may succeed when made again (see :attr:`ServiceCallError.retryable`)."""
    return isinstance(error, ServiceCallError) and error.retryable


def call_with_retry(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool] = is_retryable,
    what: str = "call",
    logger: logging.Logger = log,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, made again after each retryable failure until it succeeds or ``policy.budget_s`` is spent;
    then the last error propagates. Each retry is logged as a warning naming ``what`` and the error."""
    deadline = clock() + policy.budget_s
    delay = policy.initial_backoff_s
    while True:
        try:
            return call()
        except Exception as error:
            if not retryable(error):
                raise
            wait = max(delay, getattr(error, "retry_after_s", None) or 0.0)
            if clock() + wait > deadline:
                raise
            logger.warning("%s failed (%s); retrying in %.1f s", what, error, wait)
            sleep(wait)
            delay = min(delay * policy.multiplier, policy.max_backoff_s)
