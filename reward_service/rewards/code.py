"""``code``: runs the completion's Python program in the sandbox against the sample's tests."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from typing import Any

from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.rewards.base import missing_metadata
from reward_service.sandbox.runner import RunResult, SandboxRunner

# open-r1 `extract_code` takes the last ```python block; ```py is accepted too.
_PYTHON_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


def extract_program(completion: str, whole_text_fallback: bool) -> str | None:
    """The last fenced python block; the whole completion when there is none and the fallback is on."""
    blocks = _PYTHON_BLOCK.findall(completion)
    if blocks:
        return blocks[-1]
    return completion if whole_text_fallback and completion.strip() else None


def same_output(stdout: str, expected: str) -> bool:
    """open-r1's comparison, without its zip truncation: stripped output, line by line, each line stripped."""
    got = [line.strip() for line in stdout.strip().splitlines()]
    want = [line.strip() for line in str(expected).strip().splitlines()]
    return got == want


def parse_tests(metadata: dict[str, Any]) -> list[tuple[str, str]] | str:
    """(stdin, expected stdout) pairs from ``tests`` or ``expected``; an error message when malformed."""
    if "tests" in metadata:
        tests = metadata["tests"]
        if not isinstance(tests, list) or not tests:
            return "metadata 'tests' must be a non-empty list of {input, output}"
        pairs = []
        for i, case in enumerate(tests):
            if not isinstance(case, dict) or "output" not in case:
                return f"metadata 'tests[{i}]' must be an object with 'input' and 'output'"
            pairs.append((str(case.get("input") or ""), str(case["output"])))
        return pairs
    return [("", str(metadata["expected"]))]


# What a test that hits the wall or CPU limit does to its sample (param ``on_timeout``).
CONTINUE, FAIL_REST, ZERO = "continue", "fail_rest", "zero"


class CodeReward:
    """value = fraction of tests passed (stripped stdout equal to the expected output), each test one run of
    the program (open-r1 ``code_reward`` semantics, local sandbox instead of E2B). A program that fails gets
    value 0 for that test and the first failure's reason in ``error`` (at most a bounded excerpt of its
    stderr). A sample with more than ``max_tests_per_sample`` tests gets an error and no value; the runs of
    one request share its CPU budget (``max_cpu_s_per_request``) and take turns with other requests' runs.

    ``on_timeout`` (param): ``continue`` runs every test; ``fail_rest`` and ``zero`` run a sample's tests in
    order and stop at the first that hits the wall or CPU limit, so a program that hangs costs one time
    limit instead of one per test: ``fail_rest`` counts the tests not run as failed, ``zero`` scores the
    sample 0 (open-r1's E2B script, whose uncaught ``TimeoutExpired`` ends it with no score)."""

    def __init__(self, runner: SandboxRunner | None, available: bool, status: str):
        self._runner = runner
        self.description = RewardDescription(
            name="code",
            description="Fraction of metadata 'tests' ({input, output}) whose stripped stdout matches, "
            "or 1/0 against metadata 'expected'; program = last ```python block (open-r1 code_reward).",
            params=(
                ParamInfo(
                    "whole_text_fallback",
                    "boolean",
                    False,
                    "Run the whole completion when it has no ```python block.",
                ),
                ParamInfo(
                    "on_timeout",
                    "string",
                    CONTINUE,
                    "A test that hits the wall or CPU limit: continue (every test runs; that one fails), "
                    "fail_rest (the sample's later tests are not run and count as failed) or zero (value "
                    "0, later tests not run: open-r1's E2B script). With fail_rest and zero a sample's "
                    "tests run in order and a program that hangs costs one time limit, not one per test.",
                    choices=(CONTINUE, FAIL_REST, ZERO),
                ),
            ),
            required_metadata=("tests|expected",),
            min_value=0.0,
            max_value=1.0,
            available=available,
            status=status,
        )

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        assert self._runner is not None  # the scorer refuses `code` when the sandbox is unavailable
        prepared = [self._prepare(sample, params) for sample in samples]
        stop = params["on_timeout"] != CONTINUE
        groups = _test_groups(
            {k: p for k, p in enumerate(prepared) if isinstance(p, tuple)},
            None if stop else self._runner.settings.concurrency,
        )
        runs = await self._run_groups(groups, stop)
        by_sample: dict[int, list[RunResult]] = {}
        for (k, _, _), group_runs in zip(groups, runs, strict=True):
            by_sample.setdefault(k, []).extend(group_runs)
        return [
            p if isinstance(p, ComponentResult) else _grade(by_sample[k], p[1], params["on_timeout"])
            for k, p in enumerate(prepared)
        ]

    def _prepare(
        self, sample: Sample, params: dict[str, Any]
    ) -> ComponentResult | tuple[str, list[tuple[str, str]]]:
        """(program, tests) to run, or the sample's result when there is nothing to run."""
        assert self._runner is not None
        if "tests" not in sample.metadata and "expected" not in sample.metadata:
            return missing_metadata("tests' or 'expected")
        cap = self._runner.settings.max_tests_per_sample
        count = len(sample.metadata["tests"]) if isinstance(sample.metadata.get("tests"), list) else 1
        if count > cap:
            return ComponentResult(
                error=f"metadata 'tests' has {count} tests, at most {cap} (sandbox.max_tests_per_sample)"
            )
        tests = parse_tests(sample.metadata)
        if isinstance(tests, str):
            return ComponentResult(error=tests)
        program = extract_program(sample.completion, params["whole_text_fallback"])
        if program is None:
            return ComponentResult(value=0.0, error="no ```python code block in the completion")
        return program, tests

    async def _run_groups(
        self, groups: list[tuple[int, str, list[str]]], stop: bool
    ) -> list[list[RunResult]]:
        """Runs each group's tests in order (``stop``: up to the first timeout) in one session (one per
        request: its runs take turns with other requests' and share its CPU budget), at most
        ``concurrency`` groups at a time: no task per pending test."""
        runner = self._runner
        assert runner is not None
        session = runner.session()
        results: list[list[RunResult] | None] = [None] * len(groups)
        pending = iter(enumerate(groups))

        async def worker() -> None:
            for g, (_, program, stdins) in pending:
                results[g] = await runner.run_tests(program, stdins, session, stop_at_timeout=stop)

        workers = min(runner.settings.concurrency, len(groups))
        await asyncio.gather(*(worker() for _ in range(workers)))
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]


def _test_groups(
    prepared: dict[int, tuple[str, list[tuple[str, str]]]], workers: int | None
) -> list[tuple[int, str, list[str]]]:
    """(sample index, program, stdins) to run in order, each sample's tests in consecutive groups: one group
    per sample when ``workers`` is None (tests in order), else groups small enough that ``workers`` groups
    run at once even when there are fewer samples than workers."""
    total = sum(len(tests) for _, tests in prepared.values())
    size = max(1, math.ceil(total / workers)) if workers else max(1, total)
    return [
        (k, program, [stdin for stdin, _ in tests[i : i + size]])
        for k, (program, tests) in prepared.items()
        for i in range(0, len(tests), size)
    ]


def _grade(runs: list[RunResult], tests: list[tuple[str, str]], on_timeout: str) -> ComponentResult:
    """value = passed / len(tests); error = the first failing test's reason. ``runs`` stops short of
    ``tests`` only after a timeout (``on_timeout`` fail_rest or zero): the tests not run count as failed,
    and with zero the value is 0."""
    passed, reasons = 0, []
    for i, (run, (_, expected)) in enumerate(zip(runs, tests, strict=False)):
        if run.failure:
            reasons.append(f"test {i}: {run.failure}")
        elif same_output(run.stdout, expected):
            passed += 1
        else:
            reasons.append(f"test {i}: wrong output")
    error = reasons[0] if reasons else ""
    stopped = on_timeout != CONTINUE and any(run.timed_out for run in runs)
    if not stopped:
        return ComponentResult(value=passed / len(tests), error=error)
    not_run = len(tests) - len(runs)
    skipped = f", {not_run} later tests not run" if not_run else ""
    if on_timeout == ZERO:
        return ComponentResult(value=0.0, error=f"{error}; value 0{skipped} (on_timeout=zero)")
    counted = f"{skipped} and counted as failed" if not_run else ""
    return ComponentResult(value=passed / len(tests), error=f"{error}{counted} (on_timeout=fail_rest)")
