"""Python client of the reward service, and the TRL reward function built on it.

    client = RewardClient("127.0.0.1:50051")
    trainer = GRPOTrainer(..., reward_funcs=[client.as_reward_func("accuracy"),
                                             client.as_reward_func(("format", 0.5, {"style": "think"}))])

``as_reward_func`` returns a sync callable with TRL's reward-function contract
``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``: one Score call per trainer
step for the whole batch; ``None`` where the service gave no value (TRL turns it into NaN). It never returns
made-up zeros: when the service stays unreachable it raises.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_sync_channel
from grpo_runtime.errors import retry_delay_s
from grpo_runtime.prompt_groups import prompt_runs
from reward_service.api import convert
from reward_service.core.types import Message, RewardRequest, Sample, SampleResult

log = logging.getLogger(__name__)

# Keyword arguments TRL passes to reward functions that are not dataset columns.
TRL_NON_COLUMNS = frozenset(
    {"trainer_state", "log_extra", "log_metric", "environments", "prompts", "completions"}
)

RewardSpecLike = str | RewardRequest | tuple[str, float] | tuple[str, float, Mapping[str, Any]]


class RewardServiceError(RuntimeError):
    """A Score call failed; ``code`` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"reward service: {code.name}: {details}")
        self.code = code
        self.details = details


def to_reward_request(spec: RewardSpecLike) -> RewardRequest:
    """A reward name, ``(name, weight)``, ``(name, weight, params)`` or a RewardRequest."""
    if isinstance(spec, RewardRequest):
        return spec
    if isinstance(spec, str):
        return RewardRequest(name=spec)
    name, weight, *rest = spec
    return RewardRequest(name=name, weight=float(weight), params=dict(rest[0]) if rest else {})


def json_safe(value: Any) -> Any:
    """A JSON-compatible copy of a dataset value: numpy/torch scalars and arrays become numbers and lists,
    non-finite floats None, anything else unknown its ``str``."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return json_safe(value.tolist())
    if hasattr(value, "item"):
        return json_safe(value.item())
    return str(value)


def _text(completion: Any) -> str:
    """A completion as text: a plain string, or the content of the last message of a conversational one."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        return str(last.get("content") or "") if isinstance(last, Mapping) else str(last)
    return ""


def _prompt(prompt: Any) -> tuple[Message, ...]:
    if prompt is None:
        return ()
    if isinstance(prompt, str):
        return (Message(role="user", content=prompt),)
    return tuple(
        Message(role=str(m.get("role") or "user"), content=str(m.get("content") or "")) for m in prompt
    )


def trl_samples(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None,
    columns: Mapping[str, Any],
) -> list[Sample]:
    """TRL's batch as samples. TRL repeats each prompt ``num_generations`` times consecutively, so a run of
    equal consecutive prompts is one group (``Sample.group``)."""
    n = len(completions)
    usable = {
        k: v
        for k, v in columns.items()
        if k not in TRL_NON_COLUMNS
        and isinstance(v, Sequence | list)
        and not isinstance(v, str)
        and len(v) == n
    }
    row_prompts = list(prompts) if prompts is not None else [None] * n
    group_of = [0] * n
    for group, (start, count) in enumerate(prompt_runs(row_prompts)):
        group_of[start : start + count] = [group] * count
    return [
        Sample(
            id=str(i),
            completion=_text(completions[i]),
            prompt=_prompt(row_prompts[i]),
            completion_ids=tuple(int(t) for t in completion_ids[i]) if completion_ids is not None else (),
            metadata={k: json_safe(v[i]) for k, v in usable.items()},
            group=f"g{group_of[i]}",
        )
        for i in range(n)
    ]


class RewardClient:
    """Blocking client of RewardService (TRL calls reward functions synchronously).

    ``timeout_s`` is the deadline of one Score call. UNAVAILABLE is retried by the channel's retry policy and,
    beyond it, here until ``retry_budget_s`` has passed (a restarting service); RESOURCE_EXHAUSTED is retried
    within the same budget only when the server marked it transient (its concurrency bound, with a pushback
    trailer): a request over a size limit fails at once. Then the call raises RewardServiceError.
    """

    def __init__(
        self, target: str | ChannelConfig, *, timeout_s: float = 300.0, retry_budget_s: float = 60.0
    ):
        self._config = ChannelConfig(target=target) if isinstance(target, str) else target
        self.timeout_s = timeout_s
        self.retry_budget_s = retry_budget_s
        self._channel: grpc.Channel | None = None
        self._stub: reward_pb2_grpc.RewardServiceStub | None = None

    def _service(self) -> reward_pb2_grpc.RewardServiceStub:
        if self._stub is None:
            self._channel = create_sync_channel(self._config)
            self._stub = reward_pb2_grpc.RewardServiceStub(self._channel)
        return self._stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # A reward function may be pickled into a spawned process (TRL's async rollout worker): ship the config.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_channel": None, "_stub": None}

    def _call(self, method: str, request: Any) -> Any:
        deadline = time.monotonic() + self.retry_budget_s
        delay = 0.2
        while True:
            try:
                return getattr(self._service(), method)(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                pushback = retry_delay_s(exc)
                wait = max(delay, pushback or 0.0)
                if pushback is None or time.monotonic() + wait > deadline:
                    raise RewardServiceError(code, details) from exc
                log.warning("reward service %s (%s); retrying in %.1fs", code.name, details, wait)
                time.sleep(wait)
                delay = min(delay * 2, 5.0)

    def score(self, samples: Sequence[Sample], rewards: Sequence[RewardSpecLike]) -> list[SampleResult]:
        """Scores ``samples`` with ``rewards``; one result per sample, in order."""
        request = convert.score_request_message(samples, [to_reward_request(r) for r in rewards])
        return convert.sample_results(self._call("Score", request))

    def list_rewards(self) -> reward_pb2.ListRewardsResponse:
        return self._call("ListRewards", reward_pb2.ListRewardsRequest())

    def as_reward_func(self, spec: RewardSpecLike) -> TrlRewardFunction:
        """A TRL reward function computing ``spec``; its ``__name__`` is the reward name, so TRL logs
        ``rewards/<name>/mean``."""
        return TrlRewardFunction(self, to_reward_request(spec))


class TrlRewardFunction:
    """``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``; see module doc."""

    def __init__(self, client: RewardClient, reward: RewardRequest):
        self.client = client
        self.reward = reward
        self.__name__ = reward.name

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        if not completions:
            return []
        samples = trl_samples(prompts, completions, completion_ids, columns)
        results = self.client.score(samples, [self.reward])
        log_extra = columns.get("log_extra")
        errors = [result.components[0][1].error for result in results]
        if callable(log_extra) and any(errors):
            log_extra(f"{self.__name__}_error", errors)
        return [result.reward for result in results]
