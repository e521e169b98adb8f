"""Python client of the reward service, and the TRL reward function built on it.

    client = RewardClient("127.0.0.1:50051")
    trainer = GRPOTrainer(..., reward_funcs=[client.as_reward_func("accuracy"),
                                             client.as_reward_func(("format", 0.5, {"style": "think"}))])

``as_reward_func`` returns a sync callable with TRL's reward-function contract
``f(prompts, completions, completion_ids=None, **columns) -> list[float | None]``: one Score call per trainer
step for the whole batch; ``None`` where the service gave no value (TRL turns it into NaN). It never returns
made-up zeros: when the service stays unreachable it raises.

A failed call raises the :class:`~grpo_runtime.call_errors.ServiceCallError` of its status
(InvalidArgumentError naming the field, ResourceExhaustedError, UnavailableError, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import ChannelConfig, ServiceClient
from grpo_runtime.prompt_groups import prompt_runs
from reward_service import codec
from reward_service.core.types import (
    ComponentResult,
    Message,
    ParamInfo,
    RewardDescription,
    RewardRequest,
    Sample,
    SampleResult,
)

__all__ = [
    "ComponentResult",
    "Message",
    "ParamInfo",
    "RewardClient",
    "RewardDescription",
    "RewardRequest",
    "Sample",
    "SampleResult",
    "TrlRewardFunction",
    "json_safe",
    "to_reward_request",
    "trl_samples",
]

# Keyword arguments TRL passes to reward functions that are not dataset columns.
TRL_NON_COLUMNS = frozenset(
    {"trainer_state", "log_extra", "log_metric", "environments", "prompts", "completions"}
)
# TRL's image columns of vision rows: the pictures went to the policy; a reward's metadata is JSON.
TRL_IMAGE_COLUMNS = frozenset({"image", "images"})

RewardSpecLike = str | RewardRequest | tuple[str, float] | tuple[str, float, Mapping[str, Any]]


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
        Message(role=str(m.get("role") or "user"), content=_message_text(m.get("content"))) for m in prompt
    )


def _message_text(content: Any) -> str:
    """A message's text: its text parts joined by newlines for a vision row's list of parts (the images
    left out: rewards score text), else its content as text."""
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content or "")


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
        if k not in TRL_NON_COLUMNS | TRL_IMAGE_COLUMNS
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


class RewardClient(ServiceClient):
    """Blocking client of RewardService (TRL calls reward functions synchronously; :class:`ServiceClient`).

    ``timeout_s`` is the deadline of one call. UNAVAILABLE and DEADLINE_EXCEEDED are retried by the channel's
    retry policy and, beyond it, here until ``retry_budget_s`` has passed (a restarting service);
    RESOURCE_EXHAUSTED is retried within the same budget only when the server marked it transient (its
    concurrency bound, with a pushback trailer): a request over a size limit fails at once. Then the call
    raises its ServiceCallError.
    """

    service_name = "reward service"
    stub_class = reward_pb2_grpc.RewardServiceStub

    def __init__(
        self,
        target: str | ChannelConfig,
        *,
        admin_token: str | None = None,
        timeout_s: float = 300.0,
        retry_budget_s: float = 60.0,
    ):
        super().__init__(target, admin_token=admin_token, timeout_s=timeout_s, retry_budget_s=retry_budget_s)

    def score(self, samples: Sequence[Sample], rewards: Sequence[RewardSpecLike]) -> list[SampleResult]:
        """Scores ``samples`` with ``rewards``; one result per sample, in order."""
        request = codec.encode_score_request(samples, [to_reward_request(r) for r in rewards])
        return codec.decode_score_response(self._call("Score", request))

    def list_rewards(self) -> list[RewardDescription]:
        """Every reward the service offers (rule rewards, loaded models), in the service's order."""
        response = self._call("ListRewards", reward_pb2.ListRewardsRequest())
        return codec.decode_list_rewards_response(response)

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
