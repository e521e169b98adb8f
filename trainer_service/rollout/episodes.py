"""Tool episodes on the trainer side: which episode each prompt asks for, and what TRL gets back.

TRL's ``rollout_func`` receives the prompts only, while an environment needs the sample's dataset columns
(``reset(**row)``): :class:`EpisodePlan` keeps a table from each training/eval prompt to its row's columns,
built from the datasets, and attaches one :class:`~rollout_service.types.EpisodeSpec` per prompt. With
several ``environments`` a row picks one by its ``environment`` column (default: the first).

Back from the rollout service, each completion carries its ``tool_mask``; :func:`episode_fields` returns it
as TRL's ``env_mask`` (TRL 1.16 turns it into ``tool_mask`` and trains on ``completion_mask × tool_mask``,
so tool-result tokens are out of the loss), plus the per-sample ``env_reward`` column that the
:class:`EnvironmentReward` function reads. :func:`tool_metrics` gives TRL's ``tools/call_frequency`` (tool
calls per completion) and ``tools/failure_frequency`` (failed calls per call).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rollout_service.client import EpisodeSpec, FinishReason
from trainer_service.config.run_config import RunConfig
from trainer_service.config.tools import EnvironmentSpec

PROMPT_COLUMNS = ("prompt", "completion", "completion_ids")


def prompt_key(prompt: Any) -> str:
    """A prompt (message list or text) as a lookup key."""
    return json.dumps(prompt, sort_keys=True, default=str)


def jsonable(value: Any) -> Any:
    """Struct-safe column values: numbers, strings, bools, None, lists and dicts of those."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return str(value)


class EpisodePlan:
    """One EpisodeSpec per prompt for the run's ``environments``.

    ``max_turns``: model turns per episode (TRL's ``max_tool_calling_iterations`` + 1 when only that is
    set); ``max_tool_calls``: None = the rollout service's limit; ``target``: the environment service name
    configured on the rollout service ("" = its default); ``skip_reward``: the run does not weigh the
    environment's reward, so the rollout service need not read it; ``end_token_id``: the tokenizer's EOS, the
    one token given to a completion whose episode failed before its first turn (see
    :func:`fill_empty_completions`).
    """

    def __init__(
        self,
        environments: Sequence[EnvironmentSpec],
        rows: Iterable[Mapping[str, Any]],
        *,
        max_turns: int | None = None,
        max_tool_calls: int | None = None,
        target: str = "",
        skip_reward: bool = False,
        end_token_id: int = 0,
    ) -> None:
        if not environments:
            raise ValueError("an episode plan needs at least one environment")
        self.end_token_id = end_token_id
        self._environments = {env.name: env for env in environments}
        self._default = environments[0].name
        self._max_turns = max_turns
        self._max_tool_calls = max_tool_calls
        self._target = target
        self._skip_reward = skip_reward
        self._columns: dict[str, dict[str, Any]] = {}
        for row in rows:
            key = prompt_key(row["prompt"])
            columns = {k: jsonable(v) for k, v in row.items() if k not in PROMPT_COLUMNS}
            self._columns.setdefault(key, columns)

    def spec(self, prompt: Any) -> EpisodeSpec:
        metadata = self._columns.get(prompt_key(prompt), {})
        name = metadata.get("environment") or self._default
        if name not in self._environments:
            raise ValueError(
                f"a row names environment {name!r}, which is not among the run's environments "
                f"{sorted(self._environments)}"
            )
        return EpisodeSpec(
            environment=name,
            params=dict(self._environments[name].params),
            metadata=metadata,
            max_turns=self._max_turns,
            max_tool_calls=self._max_tool_calls,
            target=self._target,
            skip_reward=self._skip_reward,
        )


def episode_fields(completions: Sequence[Any]) -> dict[str, list]:
    """TRL extra keys of episode completions: ``env_mask`` (1 = model token) and ``env_reward`` (None = none).

    A completion whose episode failed (finish ERROR) is kept with its tokens, its reward column None.
    """
    for index, completion in enumerate(completions):
        if len(completion.tool_mask) != len(completion.token_ids):
            raise RuntimeError(
                f"completion {index} has {len(completion.token_ids)} tokens but a tool_mask of "
                f"{len(completion.tool_mask)}; is the rollout service older than the episode contract?"
            )
    return {
        "env_mask": [[int(m) for m in c.tool_mask] for c in completions],
        "env_reward": [None if c.finish_reason == FinishReason.ERROR else c.env_reward for c in completions],
    }


def fill_empty_completions(out: dict[str, list], token_id: int) -> None:
    """Give each completion without tokens (its episode failed before its first turn) one ``token_id``, with
    logprob 0 and env_mask 0: TRL reads every completion's last id, and the token stays out of the loss.

    ``out``: :meth:`ServiceRollout.to_trl`'s dict with ``completion_ids``, ``logprobs`` and ``env_mask``.
    """
    for ids, logprobs, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True):
        if not ids:
            ids.append(token_id)
            logprobs.append(0.0)
            mask.append(0)


def tool_metrics(completions: Sequence[Any]) -> dict[str, float]:
    """TRL's tool metrics over one generation batch, plus the share of episodes that failed."""
    if not completions:
        return {}
    calls = sum(c.tool_call_count for c in completions)
    failures = sum(c.tool_failure_count for c in completions)
    errors = sum(c.finish_reason == FinishReason.ERROR for c in completions)
    return {
        "tools/call_frequency": calls / len(completions),
        "tools/failure_frequency": failures / calls if calls else 0.0,
        "tools/episode_error_frequency": errors / len(completions),
    }


class EnvironmentReward:
    """TRL reward function reading the ``env_reward`` column the rollout returned (None → NaN in TRL)."""

    __name__ = "env_reward"

    def __call__(
        self, prompts=None, completions=(), completion_ids=None, **columns: Any
    ) -> list[float | None]:
        values = columns.get("env_reward")
        if values is None:
            return [None] * len(completions)
        return [None if v is None else float(v) for v in values]


def episode_plan(
    config: RunConfig, *datasets: Iterable[Mapping[str, Any]] | None, end_token_id: int = 0
) -> EpisodePlan | None:
    """The run's plan over its train and eval rows, or None for a single-turn run; ``end_token_id``: the
    tokenizer's EOS."""
    t = config.training
    if not t.tools.episode_environments:
        return None
    rows = [row for dataset in datasets if dataset is not None for row in dataset]
    return EpisodePlan(
        t.tools.episode_environments,
        rows,
        max_turns=t.tools.max_model_turns,
        max_tool_calls=t.tools.max_tool_calls,
        target=config.services.environment_target,
        skip_reward=not uses_env_reward(config),
        end_token_id=end_token_id,
    )


def uses_env_reward(config: RunConfig) -> bool:
    """Whether the environment's reward is a reward term of the run (after reward_fn's terms)."""
    t = config.training
    # Function tools (training.tools.functions, TRL's tools=) have no environment reward, as in TRL.
    return bool(t.tools.episode_environments) and not t.tools.functions and t.rewards.environment_weight > 0
