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
tasks loop for hours), so each sample runs in the checker pool's worker processes (``mathverify.pool``,
:func:`score_entry`): past the pool's per-sample deadline the worker is killed and replaced and the sample
is an error, and past its memory limit the sample is an error; the service's threads never run it.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import reasoning_gym
from reasoning_gym.factory import DATASETS

from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import gold_answer
from reward_service.rewards.reasoning_gym_tasks import check_entry_metadata, offered_tasks, withheld_reason

if TYPE_CHECKING:  # the pool's worker imports this module: a runtime import would be circular
    from reward_service.mathverify.pool import MathVerifyPool

PREFIX = "reasoning_gym:"
ENTRY_KEY = "reasoning_gym"
ANSWER_KEY = "answer"
ERROR_CHARS = 200

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


def entry_of(task: str, question: str, gold: str | None, raw: Any) -> dict[str, Any]:
    """The reasoning-gym entry of a sample: its last prompt message, its gold answer and ``raw``, its metadata
    ``reasoning_gym`` (an object or its JSON text); ValueError says what is missing or wrong."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:  # also a number of more digits than int() converts
            raise ValueError(f"metadata '{ENTRY_KEY}' is not JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"metadata '{ENTRY_KEY}' must be an object or its JSON text")
    source = raw.get("source_dataset")
    if source is not None and source != task:
        raise ValueError(f"metadata '{ENTRY_KEY}' is an entry of task {str(source)[:80]!r}, not {task!r}")
    check_entry_metadata(task, raw, where=f"metadata {ENTRY_KEY}")
    return {"question": question, "answer": gold, "metadata": raw}


@cache
def _dataset(task: str) -> Any:
    """The task's dataset with its default config: its ``score_answer`` is what scores."""
    return reasoning_gym.create_dataset(task, size=1, seed=0)


def score_entry(
    task: str, answer: str | None, question: str, gold: str | None, raw: Any
) -> tuple[float | None, str]:
    """``(value, error)`` of one sample: its entry rebuilt and checked (:func:`entry_of`), then the task's
    ``score_answer(answer, entry)``. A checker pool job (it runs in a worker process, see the module
    docstring); MemoryError propagates, for the worker to name its limit."""
    reason = withheld_reason(task)
    if reason is not None:
        return None, f"reasoning-gym task {task!r} is withheld: {reason}"
    try:
        entry = entry_of(task, question, gold, raw)
    except ValueError as exc:
        return None, str(exc)
    try:
        value = float(_dataset(task).score_answer(answer, entry))
    except MemoryError:
        raise
    except Exception as exc:  # the task's code on caller metadata: any failure is this sample's error
        return None, f"score_answer failed: {type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"
    if not math.isfinite(value):
        return None, f"score_answer returned {value}"
    return value, ""


class ReasoningGymReward:
    """``reasoning_gym:<task>``: ``score_answer(extract(completion), entry)`` in [0, 1], each sample a job of
    the checker pool (:func:`score_entry`)."""

    def __init__(self, task: str, pool: MathVerifyPool):
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


def reasoning_gym_rewards(pool: MathVerifyPool) -> list[ReasoningGymReward]:
    """One reward per offered task, in name order."""
    return [ReasoningGymReward(task, pool) for task in offered_tasks()]
