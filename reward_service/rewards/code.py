"""``code``: runs the completion's Python program in the sandbox against the sample's tests."""

from __future__ import annotations

import asyncio
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


class CodeReward:
    """value = fraction of tests passed (stripped stdout equal to the expected output), each test one sandbox
    run (open-r1 ``code_reward`` semantics, local sandbox instead of E2B). A program that fails gets value 0
    for that test and the first failure's reason in ``error`` (at most a bounded excerpt of its stderr).
    A sample with more than ``max_tests_per_sample`` tests gets an error and no value; the runs of one
    request share its CPU budget (``max_cpu_s_per_request``) and take turns with other requests' runs."""

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
        jobs = []  # (sample index, program, stdin)
        for k, p in enumerate(prepared):
            if isinstance(p, tuple):
                program, tests = p
                jobs += [(k, program, stdin) for stdin, _ in tests]
        runs = await self._run_all([(program, stdin) for _, program, stdin in jobs])
        by_sample: dict[int, list[RunResult]] = {}
        for (k, _, _), run in zip(jobs, runs, strict=True):
            by_sample.setdefault(k, []).append(run)
        return [
            p if isinstance(p, ComponentResult) else _grade(by_sample[k], p[1])
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

    async def _run_all(self, jobs: list[tuple[str, str]]) -> list[RunResult]:
        """Runs (program, stdin) jobs in one session (one per request: its runs take turns with other
        requests' and share its CPU budget), at most ``concurrency`` at a time: no task per pending test."""
        assert self._runner is not None
        session = self._runner.session()
        results: list[RunResult | None] = [None] * len(jobs)
        pending = iter(enumerate(jobs))

        async def worker() -> None:
            for k, (program, stdin) in pending:
                results[k] = await self._runner.run(program, stdin, session)

        workers = min(self._runner.settings.concurrency, len(jobs))
        await asyncio.gather(*(worker() for _ in range(workers)))
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]


def _grade(runs: list[RunResult], tests: list[tuple[str, str]]) -> ComponentResult:
    """value = passed / len(tests); error = the first failing test's reason."""
    passed, reasons = 0, []
    for i, (run, (_, expected)) in enumerate(zip(runs, tests, strict=True)):
        if run.failure:
            reasons.append(f"test {i}: {run.failure}")
        elif same_output(run.stdout, expected):
            passed += 1
        else:
            reasons.append(f"test {i}: wrong output")
    return ComponentResult(value=passed / len(tests), error=reasons[0] if reasons else "")
