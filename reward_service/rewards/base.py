"""What every built-in reward looks like to the scorer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from reward_service.core.types import ComponentResult, RewardDescription, Sample


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
        sample_end = time.monotonic() + sample_s
        self.bounded_by_budget = budget_end < sample_end  # the request's budget ends first
        self._end = min(sample_end, budget_end)
        self._stop = stop

    def remaining(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0 or self._stop.is_set():
            raise DeadlineExceeded
        return left


class DeadlineExceeded(Exception):
    """A sample ran past its Deadline."""


TextFn = Callable[[str, dict[str, Any], Deadline | None], float]


@dataclass(frozen=True)
class ThreadRunner:
    """Runs per-sample work off the event loop: all samples of one request in one worker thread of
    ``executor`` (None: asyncio's default), one after the other. Each sample gets ``deadline_s`` seconds
    (its regexes run with that timeout on the ``regex`` engine, which releases the GIL while it matches, so
    the event loop keeps answering) and the request as a whole ``budget_s``. A sample past either gets an
    error naming the limit instead of a value; a cancelled request stops before its next sample."""

    deadline_s: float = 2.0
    budget_s: float = 60.0
    executor: Executor | None = None

    async def map(
        self, samples: Sequence[Sample], one: Callable[[Sample, Deadline], ComponentResult]
    ) -> list[ComponentResult]:
        """``one(sample, deadline)`` for each sample, within the limits; one result per sample."""
        stop = threading.Event()

        def run() -> list[ComponentResult]:
            budget_end = time.monotonic() + self.budget_s
            results = []
            for sample in samples:
                deadline = Deadline(self.deadline_s, budget_end, stop)
                try:
                    deadline.remaining()
                    results.append(one(sample, deadline))
                except (DeadlineExceeded, TimeoutError):  # TimeoutError: a regex's timeout
                    if stop.is_set():
                        break
                    results.append(ComponentResult(error=self._error(deadline)))
            return results

        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, run)
        finally:
            stop.set()  # a cancelled caller: the thread stops at its next deadline check

    def _error(self, deadline: Deadline) -> str:
        if deadline.bounded_by_budget:
            return f"exceeded the request's time budget of {self.budget_s:g}s (text_budget_s)"
        return f"exceeded the per-sample deadline of {self.deadline_s:g}s (text_deadline_s)"


class TextReward:
    """A reward computed from each completion's text alone (regexes, counting), run by a ThreadRunner."""

    def __init__(self, description: RewardDescription, fn: TextFn, runner: ThreadRunner):
        self.description = description
        self._fn = fn
        self._runner = runner

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        return await self._runner.map(
            samples,
            lambda s, deadline: ComponentResult(value=float(self._fn(s.completion, params, deadline))),
        )


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
