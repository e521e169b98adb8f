"""reasoning-gym's procedural tasks as rewards: ``reasoning_gym:<task>`` scores a completion with the task's
own ``score_answer(answer, entry)`` (a value in [0, 1]).

The entry is rebuilt from the sample's metadata, as the trainer's ``reasoning_gym:<task>`` data source
writes it (``trainer_service.training.data``): ``answer`` is the generator's gold answer (null for tasks
verified from the metadata alone) and ``reasoning_gym`` its ``entry["metadata"]``, a JSON object or that
object's JSON text (a text column keeps every task's differently shaped metadata intact in a ``Dataset``).

The answer is taken from the completion by ``answer_format``: ``answer_tag`` (reasoning-gym's own prompt
convention) is the text between the last ``<answer>`` and the ``</answer>`` after it, stripped, and no tag
scores as ``score_answer(None, entry)``; ``last_line`` is the last non-blank line; ``full`` the whole
completion, stripped.

Threat model: answers are model text and metadata is the caller's. Tasks whose code evaluates text are
withheld (``reasoning_gym_tasks.withheld_reason``), and metadata numbers that size what a task builds are
bounded (``reasoning_gym_tasks.check_entry_metadata``: a sample past a bound is an error naming the field).
``score_answer`` itself is reasoning-gym's code, opaque to any cooperative deadline (an answer can make some
tasks loop for hours), so each sample runs in the checker pool's worker processes (``checkers.pool``,
``checkers.reasoning_gym.score_entry``): past the pool's per-sample deadline the worker is killed and
replaced and the sample is an error, and past its memory limit the sample is an error; the service's threads
never run it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from reasoning_gym.factory import DATASETS

from reward_service.checkers.pool import CheckerPool
from reward_service.checkers.reasoning_gym import ENTRY_KEY, score_entry
from reward_service.checkers.reasoning_gym_tasks import offered_tasks
from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import gold_answer

PREFIX = "reasoning_gym:"
ANSWER_KEY = "answer"

PARAMS = (
    ParamInfo(
        "answer_format",
        "string",
        "answer_tag",
        "How the answer is taken from the completion: 'answer_tag' (last <answer>...</answer>), "
        "'last_line' or 'full'.",
        choices=("answer_tag", "last_line", "full"),
    ),
    ParamInfo(
        "max_answer_chars",
        "integer",
        10_000,
        "Longest answer passed to score_answer; a longer one scores 0.",
        minimum=1,
    ),
)


def extract_answer(completion: str, answer_format: str) -> str | None:
    """The answer in ``completion`` (see the module docstring); linear time whatever the text."""
    if answer_format == "full":
        return completion.strip()
    if answer_format == "last_line":
        lines = [line for line in completion.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""
    end = completion.rfind("</answer>")
    if end < 0:
        return None
    start = completion.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return completion[start + len("<answer>") : end].strip()


class ReasoningGymReward:
    """``reasoning_gym:<task>``: ``score_answer(extract(completion), entry)`` in [0, 1], each sample a job of
    the checker pool (``checkers.reasoning_gym.score_entry``)."""

    def __init__(self, task: str, pool: CheckerPool):
        self.task = task
        self._pool = pool
        category = DATASETS[task][0].__module__.split(".")[1]
        self.description = RewardDescription(
            name=PREFIX + task,
            description=f"reasoning-gym task {task} ({category}): its score_answer(answer, entry) in [0, 1]; "
            f"entry from metadata '{ANSWER_KEY}' (gold) and '{ENTRY_KEY}' (the entry's metadata).",
            params=PARAMS,
            required_metadata=(ENTRY_KEY,),
            min_value=0.0,
            max_value=1.0,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        """Every sample at once over the pool's workers, each within the pool's deadline and memory limit."""
        return list(await asyncio.gather(*(self._one(s, params) for s in samples)))

    async def _one(self, sample: Sample, params: dict[str, Any]) -> ComponentResult:
        raw = sample.metadata.get(ENTRY_KEY)
        if raw is None:
            return ComponentResult(
                error=f"metadata '{ENTRY_KEY}' is required (the entry's metadata, from the data source)"
            )
        answer = extract_answer(sample.completion, params["answer_format"])
        if answer is not None and len(answer) > params["max_answer_chars"]:
            return ComponentResult(value=0.0)
        question = sample.prompt[-1].content if sample.prompt else ""
        gold = gold_answer(sample, ANSWER_KEY)
        value, error = await self._pool.run(
            score_entry, self.task, answer, question, gold, raw, key=self.task
        )
        return ComponentResult(value=value, error=error)


def reasoning_gym_rewards(pool: CheckerPool) -> list[ReasoningGymReward]:
    """One reward per offered task, in name order."""
    return [ReasoningGymReward(task, pool) for task in offered_tasks()]
