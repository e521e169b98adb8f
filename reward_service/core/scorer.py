"""The Score logic: validates a request, computes every reward, combines them.

``reward = Σ weight·value`` over the components of a sample that have a value; unset (None) when none has —
TRL's None, which its trainer turns into NaN and excludes from the statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from reward_service.core.types import ComponentResult, RewardDescription, RewardRequest, Sample, SampleResult
from reward_service.rewards.base import Reward
from reward_service.rewards.params import resolve_params

# Names of loaded models. A remote judge (``judge:<name>`` of the server's configuration) is a built-in:
# built-in names are looked up first, and the model registry refuses to load over one.
MODEL_PREFIXES = ("prm:", "orm:", "judge:")


class ModelRewards(Protocol):
    """The part of ``reward_service.models.registry.ModelRegistry`` the scorer uses."""

    def describe(self) -> list[RewardDescription]: ...
    def has(self, reward_name: str) -> bool: ...
    def validate_params(self, reward_name: str, params: dict[str, Any]) -> dict[str, Any]: ...
    async def score(
        self, reward_name: str, samples: Sequence[Sample], params: dict[str, Any]
    ) -> list[ComponentResult]: ...


@dataclass(frozen=True)
class ScoreLimits:
    """What one Score request may ask for (the settings of the same names): counts past a limit are
    RESOURCE_EXHAUSTED naming the limit, an over-size field is INVALID_ARGUMENT naming the field."""

    max_samples: int = 4096
    max_rewards: int = 32
    max_completion_chars: int = 1 << 20
    max_completion_ids: int = 1 << 18
    max_prompt_chars: int = 1 << 20
    max_metadata_chars: int = 1 << 20

    def check_completion_ids(self, count: int, where: str) -> None:
        """INVALID_ARGUMENT naming ``<where>.completion_ids`` when ``count`` ids are past the limit (checked
        on the message by the codec, and again on the Sample for in-process callers)."""
        if count > self.max_completion_ids:
            raise InvalidArgument(
                f"{count} token ids, at most max_completion_ids={self.max_completion_ids}",
                field=f"{where}.completion_ids",
            )


def json_chars(value: Any) -> int:
    """Size of a JSON value in characters, roughly as serialised: the length of every string (keys too)
    plus one per other node. Iterative, so any depth is safe."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += 1 + sum(len(k) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 1
            stack.extend(item)
        else:
            total += 1
    return total


class Scorer:
    """Scores requests with the built-ins and the loaded models, at most ``max_concurrent`` at a time."""

    def __init__(
        self,
        builtins: Mapping[str, Reward],
        models: ModelRewards | None,
        *,
        max_concurrent: int,
        limits: ScoreLimits = ScoreLimits(),
    ):
        self._builtins = dict(builtins)
        self._models = models
        self._limits = limits
        self._max_concurrent = max_concurrent
        self._in_flight = 0
        self._released = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def describe(self) -> list[RewardDescription]:
        """Built-ins first, then loaded models."""
        described = [r.description for r in self._builtins.values()]
        return described + (self._models.describe() if self._models else [])

    @contextlib.asynccontextmanager
    async def _slot(self, wait: bool):
        """One unit of the concurrency bound. ``wait=False`` refuses at once when all are taken (instead of
        queueing: an unbounded queue only moves overload into memory and latency); ``wait=True`` is for the
        later requests of a ScoreStream, whose window already bounds what can wait."""
        while self._in_flight >= self._max_concurrent:
            if not wait:
                raise ResourceExhausted(
                    f"{self._in_flight} requests in flight "
                    f"(max_concurrent_requests={self._max_concurrent}); retry later",
                    retry_after_s=0.2,
                )
            self._released.clear()
            await self._released.wait()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._released.set()

    @property
    def limits(self) -> ScoreLimits:
        return self._limits

    def check_counts(self, samples: int, rewards: int) -> None:
        """The checks that need only the request's sample and reward counts: callers run them on the wire
        form (the lengths of its repeated fields) before converting anything."""
        limits = self._limits
        if not samples:
            raise InvalidArgument("at least one sample is required", field="samples")
        if samples > limits.max_samples:
            raise ResourceExhausted(
                f"{samples} samples, at most max_samples={limits.max_samples} per request", field="samples"
            )
        if not rewards:
            raise InvalidArgument("at least one reward is required", field="rewards")
        if rewards > limits.max_rewards:
            raise ResourceExhausted(
                f"{rewards} rewards, at most max_rewards={limits.max_rewards} per request", field="rewards"
            )

    def validate(self, samples: Sequence[Sample], rewards: Sequence[RewardRequest]) -> list[dict[str, Any]]:
        """Checks the request; returns each reward's resolved params. InvalidArgument names the field.
        Linear in the request's size (metadata is walked): :meth:`score` runs it off the event loop."""
        self.check_counts(len(samples), len(rewards))
        for i, sample in enumerate(samples):
            self._check_size(i, sample)
        seen: dict[str, int] = {}
        resolved = []
        for i, spec in enumerate(rewards):
            where = f"rewards[{i}]"
            if spec.name in seen:
                raise InvalidArgument(
                    f"duplicate reward name {spec.name!r} (also rewards[{seen[spec.name]}])",
                    field=f"{where}.name",
                )
            seen[spec.name] = i
            if not math.isfinite(spec.weight):
                raise InvalidArgument(f"must be finite, got {spec.weight}", field=f"{where}.weight")
            resolved.append(self._resolve(where, spec))
        return resolved

    def _check_size(self, index: int, sample: Sample) -> None:
        limits = self._limits
        where = f"samples[{index}]"
        if len(sample.completion) > limits.max_completion_chars:
            raise InvalidArgument(
                f"{len(sample.completion)} characters, at most max_completion_chars="
                f"{limits.max_completion_chars}",
                field=f"{where}.completion",
            )
        limits.check_completion_ids(len(sample.completion_ids), where)
        metadata_chars = json_chars(sample.metadata)
        if metadata_chars > limits.max_metadata_chars:
            raise InvalidArgument(
                f"about {metadata_chars} characters, at most max_metadata_chars={limits.max_metadata_chars}",
                field=f"{where}.metadata",
            )
        prompt_chars = sum(len(m.content) + len(m.role) for m in sample.prompt)
        if prompt_chars > limits.max_prompt_chars:
            raise InvalidArgument(
                f"{prompt_chars} characters in its messages, at most "
                f"max_prompt_chars={limits.max_prompt_chars}",
                field=f"{where}.prompt",
            )

    def _is_model(self, name: str) -> bool:
        return name.startswith(MODEL_PREFIXES) and name not in self._builtins

    def _resolve(self, where: str, spec: RewardRequest) -> dict[str, Any]:
        if self._is_model(spec.name):
            if self._models is None or not self._models.has(spec.name):
                raise InvalidArgument(f"no model is loaded as {spec.name!r}", field=f"{where}.name")
            try:
                return self._models.validate_params(spec.name, dict(spec.params))
            except InvalidArgument as exc:
                raise InvalidArgument(exc.message, field=f"{where}.{exc.field or 'params'}") from exc
        reward = self._builtins.get(spec.name)
        if reward is None:
            known = ", ".join(self._builtins)
            raise InvalidArgument(
                f"unknown reward {spec.name!r} (built-ins: {known}; "
                "models: prm:<name>, orm:<name>, judge:<name>)",
                field=f"{where}.name",
            )
        if not reward.description.available:
            raise FailedPrecondition(
                f"reward {spec.name!r} is unavailable on this server: {reward.description.status}",
                field=f"{where}.name",
            )
        return resolve_params(reward.description.params, spec.params, f"{where}.params")

    async def score(
        self, samples: Sequence[Sample], rewards: Sequence[RewardRequest], *, wait: bool = False
    ) -> list[SampleResult]:
        """One result per sample, components in request order; ResourceExhausted when the bound is reached
        (unless ``wait``)."""
        # Both walk the whole request (up to max_samples x max_rewards): seconds of Python at the limits.
        resolved = await asyncio.to_thread(self.validate, samples, rewards)
        async with self._slot(wait):
            columns = await asyncio.gather(
                *(
                    self._component(spec, samples, params)
                    for spec, params in zip(rewards, resolved, strict=True)
                )
            )
        return await asyncio.to_thread(combine, samples, rewards, columns)

    async def score_stream(
        self, requests: AsyncIterator[tuple[list[Sample], list[RewardRequest]]], window: int
    ) -> AsyncIterator[list[SampleResult]]:
        """Scores a stream: up to ``window`` requests in progress while later ones arrive; in order."""
        pending: asyncio.Queue[asyncio.Task[list[SampleResult]] | None] = asyncio.Queue(maxsize=window)

        async def feed() -> None:
            try:
                first = True
                async for samples, rewards in requests:
                    task = asyncio.ensure_future(self.score(samples, rewards, wait=not first))
                    await pending.put(task)
                    first = False
            finally:
                await pending.put(None)

        feeder = asyncio.ensure_future(feed())
        try:
            while (task := await pending.get()) is not None:
                yield await task
            await feeder  # surfaces an error of the request iterator
        finally:
            feeder.cancel()
            while not pending.empty():
                leftover = pending.get_nowait()
                if leftover is not None:
                    leftover.cancel()

    async def _component(
        self, spec: RewardRequest, samples: Sequence[Sample], params: dict[str, Any]
    ) -> list[ComponentResult]:
        if self._is_model(spec.name):
            assert self._models is not None
            results = await self._models.score(spec.name, samples, params)
        else:
            results = await self._builtins[spec.name].score(samples, params)
        if len(results) != len(samples):
            raise RuntimeError(
                f"reward {spec.name!r} returned {len(results)} results for {len(samples)} samples"
            )
        return results


def combine(
    samples: Sequence[Sample], rewards: Sequence[RewardRequest], columns: Sequence[Sequence[ComponentResult]]
) -> list[SampleResult]:
    """``reward = Σ weight·value`` over components with a value (None when none has one)."""
    out = []
    for i, sample in enumerate(samples):
        components = [(spec.name, column[i]) for spec, column in zip(rewards, columns, strict=True)]
        valued = [
            (spec.weight, c.value)
            for spec, (_, c) in zip(rewards, components, strict=True)
            if c.value is not None
        ]
        total = sum(w * v for w, v in valued) if valued else None
        out.append(SampleResult(id=sample.id, reward=total, components=components))
    return out
