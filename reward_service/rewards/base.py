"""What every built-in reward looks like to the scorer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reward_service.types import ComponentResult, RewardDescription, Sample


class Reward(Protocol):
    """A reward: ``description`` for ListRewards, ``score`` for one request.

    ``score`` gets every sample of the request (group-aware rewards need the others) and the params already
    checked and completed with defaults (see ``params.resolve_params``); it returns one result per sample and
    reports per-sample problems in ``ComponentResult.error`` rather than raising.
    """

    description: RewardDescription

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]: ...


class Deadline:
    """The time one sample may still take in a worker thread: its own ``sample_s`` bounded by the end of
    the request's ``budget_end`` (``time.monotonic``) and a stop flag set when the caller went away.

    ``remaining()`` is what a regular expression gets as its ``timeout``; it raises DeadlineExceeded once
    nothing is left, so work between regexes stops there too.
    """

    def __init__(self, sample_s: float, budget_end: float, stop: threading.Event):
        self.sample_s = sample_s
        self._end = min(time.monotonic() + sample_s, budget_end)
        self._stop = stop

    def remaining(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0 or self._stop.is_set():
            raise DeadlineExceeded
        return left


class DeadlineExceeded(Exception):
    """A sample ran past its Deadline."""


TextFn = Callable[[str, dict[str, Any], Deadline | None], float]


class TextReward:
    """A reward computed from each completion's text alone (regexes, counting), off the event loop.

    All samples of one request run in one worker thread, one after the other; each gets ``deadline_s``
    (its regexes run with that timeout on the ``regex`` engine, which releases the GIL while it matches,
    so the event loop keeps answering), and the request as a whole gets ``budget_s``. A sample past either
    gets an error naming the limit instead of a value; a cancelled request stops before its next sample.
    """

    def __init__(self, description: RewardDescription, fn: TextFn, *, deadline_s: float, budget_s: float):
        self.description = description
        self._fn = fn
        self._deadline_s = deadline_s
        self._budget_s = budget_s

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return await score_in_thread(
            samples,
            lambda s, deadline: ComponentResult(value=float(self._fn(s.completion, params, deadline))),
            self._deadline_s,
            self._budget_s,
        )


async def score_in_thread(
    samples: Sequence[Sample],
    one: Callable[[Sample, Deadline], ComponentResult],
    deadline_s: float,
    budget_s: float,
) -> list[ComponentResult]:
    """``one(sample, deadline)`` for each sample in a worker thread, within the deadlines (see TextReward)."""
    stop = threading.Event()

    def run() -> list[ComponentResult]:
        budget_end = time.monotonic() + budget_s
        results = []
        for sample in samples:
            deadline = Deadline(deadline_s, budget_end, stop)
            try:
                deadline.remaining()
                results.append(one(sample, deadline))
            except (DeadlineExceeded, TimeoutError):  # TimeoutError: a regex's timeout
                if stop.is_set():
                    break
                results.append(ComponentResult(error=deadline_error(deadline_s, budget_s, budget_end)))
        return results

    try:
        return await asyncio.to_thread(run)
    finally:
        stop.set()  # a cancelled caller: the thread stops at its next deadline check


def deadline_error(deadline_s: float, budget_s: float, budget_end: float) -> str:
    if time.monotonic() >= budget_end:
        return f"exceeded the request's time budget of {budget_s:g}s (text_budget_s)"
    return f"exceeded the per-sample deadline of {deadline_s:g}s (text_deadline_s)"


def missing_metadata(key: str) -> ComponentResult:
    return ComponentResult(error=f"metadata '{key}' is required")


def gold_answer(sample: Sample, key: str) -> str | None:
    """The gold answer as text (numbers are accepted and formatted), or None when absent."""
    value = sample.metadata.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else str(value)
