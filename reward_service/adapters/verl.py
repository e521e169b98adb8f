"""verl's custom reward function backed by the reward service.

In a verl config::

    custom_reward_function:
      path: <site-packages>/reward_service/adapters/verl.py   # or a file that imports compute_score
      name: compute_score                                     # compute_score_batch with reward_manager: batch
      reward_kwargs: {rewards: ["accuracy", ["format", 0.5]], target: "reward:50051"}

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)`` once
per response (``NaiveRewardManager``) and reads a float, or a dict whose ``"score"`` is the reward and whose
other keys it logs (``reward_extra_info``); ``BatchRewardManager`` calls a function with the plural names on a
whole batch. Here a sample is ``solution_str`` as completion, ``ground_truth`` as metadata ``answer`` (an
object ground truth as the metadata itself) plus ``extra_info``'s keys as further metadata; the answer is
``{"score": Σ weight·value, "<reward>": value, ...}`` with ``missing_score`` for a missing value (verl needs a
number for every response; a per-sample error is logged).

Which service and rewards, first found wins: the keyword arguments ``target`` / ``rewards`` (verl's
``reward_kwargs``), ``extra_info["reward_service"]`` / ``extra_info["rewards"]``, the environment variables
``GRPO_REWARD_TARGET`` (host:port) / ``GRPO_REWARD_REWARDS`` (comma list of names), then ``127.0.0.1:50051``
and ``["accuracy"]``. A reward is a name, ``[name, weight]`` or ``[name, weight, params]``. Imports no torch.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from reward_service.client import RewardClient, RewardSpecLike, json_safe, to_reward_request
from reward_service.core.types import RewardRequest, Sample, SampleResult

log = logging.getLogger(__name__)

TARGET_ENV = "GRPO_REWARD_TARGET"
REWARDS_ENV = "GRPO_REWARD_REWARDS"
DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_REWARDS = ("accuracy",)
# extra_info keys that choose the service and rewards; they are not sample metadata.
_CONTROL_KEYS = frozenset({"reward_service", "rewards"})

_clients: dict[str, RewardClient] = {}
_clients_lock = threading.Lock()


def client_for(target: str) -> RewardClient:
    """One client (one channel) per target for the whole process: verl calls once per response."""
    with _clients_lock:
        client = _clients.get(target)
        if client is None:
            client = _clients[target] = RewardClient(target)
        return client


def _target(target: str | None, extra_info: Mapping[str, Any] | None) -> str:
    if target:
        return target
    if extra_info and isinstance(extra_info.get("reward_service"), str):
        return extra_info["reward_service"]
    return os.environ.get(TARGET_ENV) or DEFAULT_TARGET


def _rewards(rewards: Sequence[Any] | None, extra_info: Mapping[str, Any] | None) -> list[RewardRequest]:
    chosen: Sequence[Any] | None = rewards
    if chosen is None and extra_info and isinstance(extra_info.get("rewards"), list):
        chosen = extra_info["rewards"]
    if chosen is None and os.environ.get(REWARDS_ENV):
        chosen = [name.strip() for name in os.environ[REWARDS_ENV].split(",") if name.strip()]
    specs: list[RewardSpecLike] = [
        spec if isinstance(spec, str) else tuple(spec) for spec in (chosen or DEFAULT_REWARDS)
    ]
    return [to_reward_request(spec) for spec in specs]


def sample_of(
    index: int, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None
) -> Sample:
    """One verl response as a Sample (module docstring)."""
    metadata = {k: json_safe(v) for k, v in (extra_info or {}).items() if k not in _CONTROL_KEYS}
    if isinstance(ground_truth, Mapping):
        metadata.update({str(k): json_safe(v) for k, v in ground_truth.items()})
    elif ground_truth is not None:
        metadata["answer"] = json_safe(ground_truth)
    return Sample(id=str(index), completion=solution_str, metadata=metadata)


def _as_dict(result: SampleResult, missing_score: float) -> dict[str, float]:
    for name, component in result.components:
        if component.error:
            log.warning("reward %s of sample %s: %s", name, result.id, component.error)
    scores = {"score": result.reward if result.reward is not None else missing_score}
    for name, component in result.components:
        scores[name] = component.value if component.value is not None else missing_score
    return scores


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    rewards: Sequence[Any] | None = None,
    target: str | None = None,
    missing_score: float = 0.0,
    **_: Any,
) -> dict[str, float]:
    """verl's per-response reward function: ``{"score": reward, "<reward>": value, ...}``."""
    sample = sample_of(0, solution_str, ground_truth, extra_info)
    [result] = client_for(_target(target, extra_info)).score([sample], _rewards(rewards, extra_info))
    return _as_dict(result, missing_score)


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    rewards: Sequence[Any] | None = None,
    target: str | None = None,
    missing_score: float = 0.0,
    **_: Any,
) -> list[dict[str, float]]:
    """verl's batch reward function (``reward_manager: batch``): the whole batch in one Score call; the first
    response's ``extra_info`` chooses the service and rewards when the keywords do not."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    if not (len(data_sources) == len(solution_strs) == len(ground_truths) == len(infos)):
        raise ValueError("data_sources, solution_strs, ground_truths and extra_infos differ in length")
    if not solution_strs:
        return []
    samples = [
        sample_of(i, text, truth, info)
        for i, (text, truth, info) in enumerate(zip(solution_strs, ground_truths, infos, strict=True))
    ]
    first = infos[0]
    results = client_for(_target(target, first)).score(samples, _rewards(rewards, first))
    return [_as_dict(result, missing_score) for result in results]
