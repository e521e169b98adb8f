"""Which reasoning-gym tasks run here, and within which bounds: one policy for the reward service's
``reasoning_gym:<task>`` rewards and the trainer's ``data.train: reasoning_gym:<task>`` source (which imports
this module), so that a task refused as a reward is not run as training data either.

Withheld tasks (:func:`withheld_reason`): those whose code evaluates text (``eval``, ``exec``, sympy's
parser, pickle, subprocess, ... found in the task's modules and the reasoning-gym modules they import;
reasoning-gym runs them in the calling process, and this project runs bundled or model-written code only in
its sandbox), and ``composite``, whose config names other tasks with configs of their own.

Bounds (:func:`value_bounds`): a task's config fields are numbers that size what its code builds (disks,
pegs, grid sides, word counts); reasoning-gym allocates and loops in proportion to them, in generation and
in ``score_answer`` alike. A field may not exceed, in magnitude, the largest of its default and its
curriculum's levels (the hardest setting the task's authors define). :func:`check_config` applies them to a
task config (the trainer's ``data.reasoning_gym.config``). :func:`check_entry_metadata` applies them, with
METADATA_SLACK, to the top-level numbers of an entry's metadata named like a bounded field or curriculum
attribute (``num_disks``), which a ``Score`` caller writes: an entry's values are drawn from its config's
ranges and derived from them (a year drawn around the configured one), so they may pass the config's bound a
little, never by orders of magnitude. That check stops a caller's ``num_pegs: 1e9`` at once with an error
naming it; the checker pool's deadline and memory limit bound whatever it cannot see.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from types import ModuleType
from typing import Any

from reasoning_gym.coaching.attributes import RangeAttributeDefinition, ScalarAttributeDefinition
from reasoning_gym.factory import CURRICULA, DATASETS

# Tasks that cannot be built with their default config and whose config names other tasks and their configs.
NOT_STANDALONE = frozenset({"composite"})
# What marks scoring code that evaluates text: Python's evaluators and every sympy parser (sympy turns strings
# into expressions with eval).
EVALUATES_TEXT = re.compile(
    r"\beval\(|\bexec\(|\bcompile\(|literal_eval|__import__|import_module|sympy|parse_expr|sympify|"
    r"subprocess|pickle"
)
# A config string is a word or a bundled file's name, never a document; a config list is a handful of
# choices (names, weights, operators).
MAX_CONFIG_STRING_CHARS = 200
MAX_CONFIG_LIST_ITEMS = 100
# Nesting of config lists (weights of ranges are lists of pairs).
MAX_CONFIG_DEPTH = 4
# Fields of every task config that are the dataset's length and seed, not task parameters.
DATASET_FIELDS = frozenset({"size", "seed"})
# How far past its config bound a number in an entry's metadata may be.
METADATA_SLACK = 10


class BoundsError(ValueError):
    """A config or metadata value past its bound; ``field`` is its name."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


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


def withheld_reason(task: str) -> str | None:
    """Why a registered task is not run here (as a reward or as training data), None when it is."""
    if task in NOT_STANDALONE:
        return "its config names other tasks with configs of their own; use one task per source"
    if evaluates_text(task):
        return (
            "its code evaluates text (eval, exec or sympy's parser), and this service runs such code only in "
            "its sandbox"
        )
    return None


def offered_tasks() -> list[str]:
    """Tasks run here, sorted: every registered one that is not withheld."""
    return sorted(t for t in DATASETS if withheld_reason(t) is None)


def _numbers(value: Any) -> Iterator[float]:
    """Every number (bool excluded) in ``value`` and the lists, tuples and pairs inside it."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _numbers(item)


def _largest(value: Any) -> float | None:
    return max((abs(n) for n in _numbers(value)), default=None)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


@cache
def value_bounds(task: str) -> dict[str, float]:
    """Name → the largest magnitude a number under that name may have: each numeric config field, and each
    curriculum attribute, gets the largest of its default and its curriculum's levels."""
    _, config_cls = DATASETS[task]
    bounds: dict[str, float] = {}

    def widen(name: str, value: Any) -> None:
        largest = _largest(value)
        if largest is not None:
            bounds[name] = max(bounds.get(name, 0), largest)

    for field in dataclasses.fields(config_cls):
        if field.name not in DATASET_FIELDS:
            widen(field.name, _default(field))
    if task in CURRICULA:
        for name, attribute in CURRICULA[task]().attributes.items():
            names: tuple[str, ...]
            if isinstance(attribute, RangeAttributeDefinition):
                names = (attribute.lower_field_name, attribute.upper_field_name)
            elif isinstance(attribute, ScalarAttributeDefinition):
                names = (attribute.field_name,)
            else:
                names = ()
            for field_name in (name, *names):
                widen(field_name, attribute.levels)
    return bounds


@cache
def _data_files() -> frozenset[str]:
    """Names of the data files reasoning-gym bundles (what its ``read_data_file`` may open)."""
    return frozenset(
        entry.name for entry in resources.files("reasoning_gym.data").iterdir() if entry.is_file()
    )


def _check_number(task: str, field: str, value: float, where: str, slack: float = 1) -> None:
    bound = value_bounds(task).get(field)
    if bound is None:
        raise BoundsError(field, f"{where} takes no number in task {task!r}")
    if not math.isfinite(value) or abs(value) > bound * slack:
        scale = "" if slack == 1 else f"{slack:g} x "
        raise BoundsError(
            field,
            f"{where} is {value!r}, beyond ±{bound * slack:g} (for task {task!r}: {scale}the largest of its "
            "default and its curriculum's levels)",
        )


def _check_config_value(task: str, field: str, default: Any, value: Any, where: str, depth: int = 0) -> None:
    if depth > MAX_CONFIG_DEPTH:
        raise BoundsError(field, f"{where} nests lists deeper than {MAX_CONFIG_DEPTH}")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        _check_number(task, field, value, where)
    elif isinstance(value, str):
        if len(value) > MAX_CONFIG_STRING_CHARS:
            raise BoundsError(field, f"{where} is longer than {MAX_CONFIG_STRING_CHARS} characters")
        if isinstance(default, str) and default in _data_files() and value not in _data_files():
            raise BoundsError(
                field, f"{where} must name one of reasoning-gym's data files, not {value[:80]!r}"
            )
    elif isinstance(value, (list, tuple)):
        if len(value) > MAX_CONFIG_LIST_ITEMS:
            raise BoundsError(field, f"{where} has {len(value)} items, at most {MAX_CONFIG_LIST_ITEMS}")
        for index, item in enumerate(value):
            _check_config_value(task, field, default, item, f"{where}[{index}]", depth + 1)
    else:
        raise BoundsError(field, f"{where} must be a number, string, boolean or list")


def check_config(task: str, config: Mapping[str, Any], where: str = "config") -> None:
    """Refuses a config of ``task`` (its config dataclass's fields) that names an unknown field or holds a
    value past its bound (see the module docstring); the BoundsError names ``where.<field>``."""
    _, config_cls = DATASETS[task]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    for name, value in config.items():
        if name in DATASET_FIELDS:
            raise BoundsError(name, f"{where}.{name} is set by the data source, not the task config")
        if name not in fields:
            known = ", ".join(sorted(set(fields) - DATASET_FIELDS))
            raise BoundsError(name, f"{where}.{name} is not a field of task {task!r} (fields: {known})")
        _check_config_value(task, name, _default(fields[name]), value, f"{where}.{name}")


def check_entry_metadata(task: str, metadata: Mapping[str, Any], where: str = "metadata") -> None:
    """Refuses entry metadata whose top-level number under a bounded name (a config field or curriculum
    attribute of ``task``, e.g. ``num_disks``) is past METADATA_SLACK times its bound; the BoundsError names
    ``where.<key>``."""
    bounds = value_bounds(task)
    for key, value in metadata.items():
        if key in bounds and not isinstance(value, bool) and isinstance(value, (int, float)):
            _check_number(task, key, value, f"{where}.{key}", slack=METADATA_SLACK)
