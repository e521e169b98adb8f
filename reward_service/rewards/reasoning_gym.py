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

Threat model: answers are model text and metadata is the caller's. Tasks whose scoring code evaluates text
(``eval``, ``exec``, sympy's parser, ...) would run it in this process, so they are not offered as rewards
(:func:`evaluates_text`); they still serve as training data. ``score_answer`` is reasoning-gym's code, opaque
to a cooperative deadline, so each sample runs in a worker thread under ``asyncio.wait_for`` with the text
rewards' ``text_deadline_s`` (the request as a whole ``text_budget_s``): past it the sample is an error and
the thread is left to finish on its own.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import math
import re
import threading
import time
from collections.abc import Sequence
from functools import cache
from types import ModuleType
from typing import Any

import reasoning_gym
from reasoning_gym.factory import DATASETS

from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import ThreadRunner, gold_answer

PREFIX = "reasoning_gym:"
ENTRY_KEY = "reasoning_gym"
ANSWER_KEY = "answer"
# Tasks that cannot be built with their default config (a composite needs its member tasks listed).
NOT_STANDALONE = frozenset({"composite"})
# What marks scoring code that evaluates text: Python's evaluators and every sympy parser (sympy turns strings
# into expressions with eval).
EVALUATES_TEXT = re.compile(
    r"\beval\(|\bexec\(|\bcompile\(|literal_eval|__import__|import_module|sympy|parse_expr|sympify|"
    r"subprocess|pickle"
)
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


def _sources(module: ModuleType) -> set[str]:
    """The source files of ``module`` and of the reasoning_gym modules, classes and functions it imports."""
    files = set()
    for value in [module, *vars(module).values()]:
        owner = value if isinstance(value, ModuleType) else inspect.getmodule(value)
        if owner is None or not owner.__name__.startswith("reasoning_gym"):
            continue
        path = getattr(owner, "__file__", None)
        if path and path.endswith(".py"):
            files.add(path)
    return files


@cache
def evaluates_text(task: str) -> bool:
    """Whether the task's dataset code (its classes' modules and the reasoning_gym code they import) contains
    any of EVALUATES_TEXT. Conservative: a module that evaluates only while generating counts too."""
    dataset_cls, _ = DATASETS[task]
    files: set[str] = set()
    for klass in dataset_cls.__mro__:
        module = inspect.getmodule(klass)
        if module is not None and module.__name__.startswith("reasoning_gym"):
            files |= _sources(module)
    for path in files:
        with open(path, encoding="utf-8") as source:
            if EVALUATES_TEXT.search(source.read()):
                return True
    return False


def offered_tasks() -> list[str]:
    """Tasks offered as rewards, sorted: all registered ones but NOT_STANDALONE and those evaluating text."""
    return sorted(t for t in DATASETS if t not in NOT_STANDALONE and not evaluates_text(t))


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


def entry_of(sample: Sample, task: str) -> dict[str, Any]:
    """The reasoning-gym entry of ``sample`` (a fresh copy, score_answer may change it); ValueError says what
    is missing or wrong."""
    raw = sample.metadata.get(ENTRY_KEY)
    if raw is None:
        raise ValueError(f"metadata '{ENTRY_KEY}' is required (the entry's metadata, from the data source)")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"metadata '{ENTRY_KEY}' is not JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"metadata '{ENTRY_KEY}' must be an object or its JSON text")
    source = raw.get("source_dataset")
    if source is not None and source != task:
        raise ValueError(f"metadata '{ENTRY_KEY}' is an entry of task {str(source)[:80]!r}, not {task!r}")
    return {
        "question": sample.prompt[-1].content if sample.prompt else "",
        "answer": gold_answer(sample, ANSWER_KEY),
        "metadata": copy.deepcopy(raw),
    }


class ReasoningGymReward:
    """``reasoning_gym:<task>``: ``score_answer(extract(completion), entry)`` in [0, 1]."""

    def __init__(self, task: str, runner: ThreadRunner):
        self.task = task
        self._runner = runner
        self._dataset: Any = None
        self._lock = threading.Lock()
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

    def _scorer(self) -> Any:
        # Built on first use, in a worker thread: some tasks load word lists or boards when constructed.
        with self._lock:
            if self._dataset is None:
                self._dataset = reasoning_gym.create_dataset(self.task, size=1, seed=0)
            return self._dataset

    def _score_one(self, sample: Sample, params: dict[str, Any]) -> ComponentResult:
        try:
            entry = entry_of(sample, self.task)
        except ValueError as exc:
            return ComponentResult(error=str(exc))
        answer = extract_answer(sample.completion, params["answer_format"])
        if answer is not None and len(answer) > params["max_answer_chars"]:
            return ComponentResult(value=0.0)
        try:
            value = float(self._scorer().score_answer(answer, entry))
        except Exception as exc:  # the task's code on caller metadata: any failure is this sample's error
            reason = f"{type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"
            return ComponentResult(error=f"score_answer failed: {reason}")
        if not math.isfinite(value):
            return ComponentResult(error=f"score_answer returned {value}")
        return ComponentResult(value=value)

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        """One sample at a time in the runner's executor, each within ``deadline_s``, all in ``budget_s``."""
        loop = asyncio.get_running_loop()
        runner = self._runner
        budget_end = time.monotonic() + runner.budget_s
        results = []
        for sample in samples:
            left = budget_end - time.monotonic()
            by_budget = left < runner.deadline_s  # the request's budget ends before this sample's deadline
            try:
                if left <= 0:
                    raise TimeoutError
                call = loop.run_in_executor(runner.executor, self._score_one, sample, params)
                results.append(await asyncio.wait_for(call, min(runner.deadline_s, left)))
            except TimeoutError:
                results.append(ComponentResult(error=self._timeout_error(by_budget)))
        return results

    def _timeout_error(self, by_budget: bool) -> str:
        if by_budget:
            return f"exceeded the request's time budget of {self._runner.budget_s:g}s (text_budget_s)"
        return f"exceeded the per-sample deadline of {self._runner.deadline_s:g}s (text_deadline_s)"


def reasoning_gym_rewards(runner: ThreadRunner) -> list[ReasoningGymReward]:
    """One reward per offered task, in name order."""
    return [ReasoningGymReward(task, runner) for task in offered_tasks()]
