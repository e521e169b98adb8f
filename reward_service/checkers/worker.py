"""Code that runs inside a checker worker process (its main thread, so SIGALRM timeouts work).

A job is a module-level function and the arguments of each of its items, ``(function, [args, ...])``,
pickled by the pool (functions pickle by name: the worker imports the function's module); the function
returns ``(value, error)``, which the worker sends back item by item. Every item may take unbounded CPU or
memory on hostile input and therefore runs where a hard deadline can kill it and an address-space limit
stops it (see ``serve``): math-verify answers (``check_answer``, SymPy), JSON-schema validation against a
sample's own schema (``json_schema.check_json_schema``: its ``pattern``s are user-supplied regular
expressions; Python's ``re`` can backtrack for hours and never releases the GIL) and reasoning-gym's
``score_answer`` on caller metadata (``reasoning_gym.score_entry``).

``check_answer`` checks one sample with the extraction and comparison of a ``MathVerifyOptions`` (see
``options``); with ``options.TRL`` it reproduces TRL's ``trl.rewards.accuracy_reward``:

* gold: ``parse(gold)`` with math-verify's default extraction (LaTeX + plain expressions); ``[]`` → no value;
* answer: ``parse(completion, [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
  boxed_match_priority=0, try_extract_without_anchor=False)], extraction_mode="first_match")``;
* value = ``float(verify(gold, answer))`` — gold first, ``verify`` is not symmetric.

Where TRL turns math-verify's own timeouts into a silent ``[]``/``False``, the worker notices the timeout
warning math-verify logs and reports an error instead of a 0.

Caches, per worker: the parsed gold (the same gold is checked against the G completions of a group), and the
verdict per (gold, extracted answer) — completions of a group often reach the same answer in different words,
and ``verify`` (SymPy simplification) is the expensive half. The key is the options, the gold text and the
``str`` of each parsed answer element (SymPy expression and the extracted LaTeX string), so equal keys mean
equal inputs.
"""

from __future__ import annotations

import collections
import functools
import importlib
import logging
import os
import resource
from collections.abc import Callable
from types import ModuleType
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# The JSON-schema job's module is imported here, before the worker says "ready", so that no sample's deadline
# pays for importing it and the memory limit is measured with it loaded. reasoning-gym is not: see
# ``import_outside_memory_limit``.
from reward_service.checkers import json_schema, number_literals  # noqa: F401
from reward_service.checkers.options import TRL, MathVerifyOptions

Result = tuple[float | None, str]

# Bytes in a MiB (the memory limit's unit).
MIB = 1024 * 1024


@functools.lru_cache(maxsize=64)
def extraction_config(options: MathVerifyOptions) -> tuple[LatexExtractionConfig | ExprExtractionConfig, ...]:
    """The ``parse(extraction_config=...)`` of ``options.targets``, in their order."""
    configs: list[LatexExtractionConfig | ExprExtractionConfig] = []
    for target in options.targets:
        if target == "latex":
            normalization = NormalizationConfig(
                basic_latex=options.basic_latex,
                units=options.units,
                malformed_operators=options.malformed_operators,
                nits=options.nits,
                boxed=options.boxed,  # type: ignore[arg-type]
                equations=options.equations,
            )
            configs.append(
                LatexExtractionConfig(
                    try_extract_without_anchor=options.try_extract_without_anchor,
                    boxed_match_priority=options.boxed_match_priority,
                    normalization_config=normalization,
                )
            )
        else:
            configs.append(
                ExprExtractionConfig(try_extract_without_anchor=options.try_extract_without_anchor)
            )
    return tuple(configs)


def _parse_answer(text: str, options: MathVerifyOptions, parse_timeout: int) -> list[Any]:
    return parse(
        text,
        extraction_config=extraction_config(options),
        fallback_mode=options.fallback_mode,  # type: ignore[arg-type]
        extraction_mode=options.extraction_mode,  # type: ignore[arg-type]
        parsing_timeout=parse_timeout,
    )


class _TimeoutWatch(logging.Handler):
    """Catches math-verify's 'Timeout during parsing/comparison' warnings for the sample in progress."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "Timeout" in text and not self.message:
            self.message = text.split(":")[0]


_watch = _TimeoutWatch()
for _name in ("math_verify.parser", "math_verify.grader"):
    _logger = logging.getLogger(_name)
    _logger.addHandler(_watch)
    _logger.propagate = False


VERDICT_CACHE_SIZE = 16384
_verdicts: collections.OrderedDict[tuple[Any, ...], float] = collections.OrderedDict()


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, parse_timeout: int, options: MathVerifyOptions | None) -> list[Any]:
    """``options`` None: parse()'s defaults (TRL); else the answer's extraction."""
    if options is None:
        return parse(gold, parsing_timeout=parse_timeout)
    return _parse_answer(gold, options, parse_timeout)


def check_answer(
    gold: str,
    completion: str,
    parse_timeout: int,
    verify_timeout: int,
    options: MathVerifyOptions = TRL,
) -> tuple[float | None, str]:
    """Returns (value, error): (1.0|0.0, "") when checked, (None, why) otherwise."""
    _watch.message = ""
    gold_parsed = _parse_gold(gold, parse_timeout, options if options.gold == "answer" else None)
    if _watch.message:
        _parse_gold.cache_clear()
        return None, f"gold answer: {_watch.message.lower()} after {parse_timeout}s"
    if not gold_parsed:
        return None, f"gold answer {gold[:80]!r} could not be parsed"
    answer = _parse_answer(completion, options, parse_timeout)
    key = (options, gold, tuple(str(a) for a in answer))
    if key in _verdicts:
        _verdicts.move_to_end(key)
        return _verdicts[key], ""
    value = float(
        verify(
            gold_parsed,
            answer,
            float_rounding=options.float_rounding,
            numeric_precision=options.numeric_precision,
            strict=options.strict,
            allow_set_relation_comp=options.allow_set_relation_comp,
            timeout_seconds=verify_timeout,
        )
    )
    if _watch.message:
        return None, f"verification timed out ({_watch.message.lower()})"
    _verdicts[key] = value
    if len(_verdicts) > VERDICT_CACHE_SIZE:
        _verdicts.popitem(last=False)
    return value, ""


def address_space_bytes() -> int:
    """This process's current address space (``VmSize``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def limit_memory(memory_mb: int | None) -> None:
    """Caps the address space (``RLIMIT_AS``) at what the worker holds now, its imports and warm-up done,
    plus ``memory_mb`` MiB: a job that allocates past it gets MemoryError, and the worker stays usable.
    An address-space bound over-counts (reserved but untouched pages count), so it is exact as an upper
    bound on the memory a job can make the worker take. None: no limit."""
    if memory_mb is None:
        return
    wanted = address_space_bytes() + memory_mb * MIB
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))


# What a worker tells the pool around an import at first use (``import_outside_memory_limit``): the pool
# gives the import STARTUP_TIMEOUT_S instead of the item's deadline and restarts the item's clock after it.
IMPORTING = "importing"
IMPORTED = "imported"
_pool_conn: Any = None  # this worker's pipe to the pool, set by ``serve``


@functools.cache
def import_outside_memory_limit(name: str) -> ModuleType:
    """Imports module ``name`` in this process at its first use, outside the item's deadline (see
    IMPORTING) and outside its memory budget. For job modules too heavy to import in every worker at start:
    reasoning-gym takes about 1.3 s and 200 MiB of address space, paid by every worker of every reward
    service (and every test that starts one) although few of them ever score a reasoning-gym task.

    The import runs without the address-space limit (it is this project's code and its dependencies, not a
    sample's input; some of it, thread pools among it, hangs rather than fails under the limit), which is
    then set back, raised by the address space the import took, so a job's ``memory_mb`` stays its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if _pool_conn is not None:
        _pool_conn.send(IMPORTING)
    before = address_space_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        return importlib.import_module(name)
    finally:
        if soft != resource.RLIM_INFINITY:
            raised = soft + max(0, address_space_bytes() - before)
            if hard != resource.RLIM_INFINITY:
                raised = min(raised, hard)
            resource.setrlimit(resource.RLIMIT_AS, (raised, hard))
        if _pool_conn is not None:
            _pool_conn.send(IMPORTED)


def _run(function: Callable[..., Result], args: tuple[Any, ...], memory_mb: int | None) -> Result:
    """One item of a job, every failure of it an error result (the worker goes on to the next item)."""
    try:
        return function(*args)
    except MemoryError:
        return None, f"exceeded the checker worker's memory limit of {memory_mb} MiB (checkers.memory_mb)"
    except RecursionError:
        return None, "input nested too deeply to check"
    except Exception as exc:
        return None, f"verification failed: {type(exc).__name__}: {str(exc)[:200]}"


def serve(conn: Any, niceness: int = 0, memory_mb: int | None = None) -> None:
    """Worker loop: receives a pickled ``(function, [args, ...])`` job, answers ``(value, error)`` for each
    item as soon as it is computed (so the pool can hold each item to its own deadline); ``None`` stops it.

    ``niceness`` lowers the worker's CPU priority, so that on a saturated machine the service's event loop
    (health, admission, other callers) is scheduled before a worker grinding on a hostile sample. Its CPU is
    bounded by the pool's deadline (the pool kills a worker that overruns), its memory by ``memory_mb``
    (see ``limit_memory``).
    """
    global _pool_conn
    if niceness:
        os.nice(niceness)
    number_literals.install()
    # The first parse/verify pays for lazy imports and grammar set-up (about a second); pay it before
    # "ready", not inside some sample's deadline. (Each job brings its own timeouts; these are TRL's.)
    check_answer("1", r"\boxed{1}", parse_timeout=10, verify_timeout=5)
    limit_memory(memory_mb)
    _pool_conn = conn
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        function, items = job
        for args in items:
            result = _run(function, args, memory_mb)
            try:
                conn.send(result)
            except OSError:  # the pool closed or replaced this worker while it computed: nobody to answer
                return
