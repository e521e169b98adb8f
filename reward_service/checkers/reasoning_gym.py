"""reasoning-gym's ``score_answer`` on a sample's entry: the code that runs in a checker worker process
(``score_entry``, a pool job) for the ``reasoning_gym:<task>`` rewards (see
``reward_service.rewards.reasoning_gym``).

The entry is rebuilt from the sample's metadata and checked first: withheld tasks are refused and metadata
numbers that size what a task builds are bounded (``reward_service.checkers.reasoning_gym_tasks``).
``score_answer`` itself is reasoning-gym's code, opaque to any cooperative deadline, which is why it runs
here, under the pool's deadline and memory limit.

reasoning-gym (and ``reasoning_gym_tasks``, which imports it) is imported at the first reasoning-gym job a
process runs, not with this module: every checker worker would otherwise pay about 1.3 s and 200 MiB at
start for tasks few services score. The first job's deadline includes the import; the worker's memory limit
is raised by what it took (``worker.import_outside_memory_limit``).
"""

from __future__ import annotations

import json
import math
from functools import cache
from types import ModuleType
from typing import Any

from reward_service.checkers.worker import import_outside_memory_limit

ENTRY_KEY = "reasoning_gym"
ERROR_CHARS = 200


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
    _tasks().check_entry_metadata(task, raw, where=f"metadata {ENTRY_KEY}")
    return {"question": question, "answer": gold, "metadata": raw}


def _tasks() -> ModuleType:
    """``reasoning_gym_tasks`` (the withheld tasks and bounds), imported at first use."""
    return import_outside_memory_limit("reward_service.checkers.reasoning_gym_tasks")


@cache
def _dataset(task: str) -> Any:
    """The task's dataset with its default config: its ``score_answer`` is what scores."""
    return import_outside_memory_limit("reasoning_gym").create_dataset(task, size=1, seed=0)


def score_entry(
    task: str, answer: str | None, question: str, gold: str | None, raw: Any
) -> tuple[float | None, str]:
    """``(value, error)`` of one sample: its entry rebuilt and checked (:func:`entry_of`), then the task's
    ``score_answer(answer, entry)``. A checker pool job (it runs in a worker process, see the module
    docstring); MemoryError propagates, for the worker to name its limit."""
    reason = _tasks().withheld_reason(task)
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
