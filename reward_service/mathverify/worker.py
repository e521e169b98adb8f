"""Code that runs inside a checker worker process (its main thread, so SIGALRM timeouts work).

Two kinds of job run here, both of which can take unbounded CPU on hostile input and are therefore run
where a hard deadline can kill them: math-verify answers (SymPy) and JSON-schema validation against a
sample's own schema (its ``pattern``s are user-supplied regular expressions; Python's ``re`` can backtrack
for hours and never releases the GIL).

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
import logging
import os
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from reward_service.mathverify.options import TRL, MathVerifyOptions
from reward_service.rewards import json_schema

MATH = "math"
JSON_SCHEMA = "json_schema"


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


def _run(job: tuple[Any, ...], parse_timeout: int, verify_timeout: int) -> tuple[float | None, str]:
    """One job: ``(MATH, gold, completion, options)`` or ``(JSON_SCHEMA, schema, completion, partial)``."""
    if job[0] == MATH:
        _, gold, completion, options = job
        return check_answer(gold, completion, parse_timeout, verify_timeout, options)
    _, schema, completion, partial = job
    result = json_schema.check_completion(schema, completion, partial)
    return result.value, result.error


def serve(conn: Any, parse_timeout: int, verify_timeout: int, niceness: int = 0) -> None:
    """Worker loop: receives a job tuple (see ``_run``), answers ``(value, error)``; ``None`` stops it.

    ``niceness`` lowers the worker's CPU priority, so that on a saturated machine the service's event loop
    (health, admission, other callers) is scheduled before a worker grinding on a hostile sample.
    """
    if niceness:
        os.nice(niceness)
    # The first parse/verify pays for lazy imports and grammar set-up (about a second); pay it before
    # "ready", not inside some sample's deadline.
    check_answer("1", r"\boxed{1}", parse_timeout, verify_timeout)
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        try:
            result = _run(job, parse_timeout, verify_timeout)
        except RecursionError:
            result = (None, "input nested too deeply to check")
        except Exception as exc:
            result = (None, f"verification failed: {type(exc).__name__}: {str(exc)[:200]}")
        try:
            conn.send(result)
        except OSError:  # the pool closed or replaced this worker while it computed: nobody to answer
            return
