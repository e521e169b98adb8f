"""Code reward: the cost of the sandbox against plain ``subprocess`` runs, and a batch of looping programs.

1. **throughput**: ``--samples`` samples × ``--tests`` tests of short programs (each reads a number and
   prints a sum: Python start-up dominates, as for most model-written solutions), scored by the ``code``
   reward (``CodeReward.score``, in this process, no gRPC) with ``concurrency`` = the CPUs here, in modes:

   * ``subprocess`` (the baseline): the same programs and inputs run with plain ``asyncio`` subprocesses of
     the sandbox's interpreter (``python3 -I -S -B -c``), no isolation, at the same concurrency, graded the
     same way;
   * ``sandbox_per_test``: a fresh sandbox per test (``sandbox.batch_wall_s: 0``);
   * ``sandbox_batched``: the default, one sandbox run going through a sample's tests for up to
     ``batch_wall_s``.

   Modes alternate within each of ``--rounds`` rounds (rotating order) after a warm-up; per mode the
   median wall time, runs/s and samples/s, CPU seconds per run (this process and its children), and the
   ratios to ``subprocess`` (``runs_per_s_vs_subprocess``: the fraction of plain throughput kept, and
   ``wall_vs_subprocess``). Every mode must give the same values.
2. **looping batch**: ``--loop-samples`` samples × ``--loop-tests`` tests of ``while True: pass``
   (``wall_timeout_s`` = ``cpu_time_s`` = ``--loop-wall-s``) under each ``on_timeout``: wall time of the
   batch, sandbox runs it started, ``speedup_vs_continue`` against ``continue`` (every test runs, the
   service's default), and the latency of a one-test request sent while the batch runs.

Writes ``--out`` (default ``bench/results/code.json``) whole, with the 1-minute load average at the start
and the end. Quote figures only from a run that started at a load below 1.

Usage: ``python bench/code_bench.py [--samples 32 --tests 16 --rounds 3] [--out bench/results/code.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

from reward_service.core.types import Sample
from reward_service.rewards.code import CodeReward, extract_program, parse_tests, same_output
from reward_service.rewards.params import resolve_params
from reward_service.sandbox.backends import PYTHON_FLAGS
from reward_service.sandbox.runner import SandboxRunner, open_runner
from reward_service.sandbox.settings import SandboxSettings

ROOT = Path(__file__).resolve().parent.parent
SUM_PROGRAM = "n = int(input())\nprint(sum(range(n)))"
LOOP_PROGRAM = "while True:\n    pass"
MODES = ("subprocess", "sandbox_per_test", "sandbox_batched")
ON_TIMEOUT = ("continue", "fail_rest", "zero")


def fenced(program: str) -> str:
    return f"Solution:\n```python\n{program}\n```\n"


def throughput_samples(samples: int, tests: int) -> list[Sample]:
    """Every sample the same short program; inputs differ, and one sample in four prints a wrong sum for
    its last test (so values are not all 1)."""
    out = []
    for i in range(samples):
        cases = [
            {"input": str(100 + i * tests + t), "output": str(sum(range(100 + i * tests + t)))}
            for t in range(tests)
        ]
        if i % 4 == 3:
            cases[-1]["output"] = "-1"
        out.append(Sample(id=f"s{i}", completion=fenced(SUM_PROGRAM), metadata={"tests": cases}))
    return out


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def run_plain(python: str, program: str, stdin: str, wall_s: float) -> tuple[str, bool]:
    """(stdout, ran to exit 0 in time) of one unisolated run."""
    proc = await asyncio.create_subprocess_exec(
        python,
        *PYTHON_FLAGS,
        "-c",
        program,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), wall_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "", False
    return out.decode(errors="replace"), proc.returncode == 0


async def score_plain(samples: list[Sample], python: str, concurrency: int, wall_s: float) -> list[float]:
    """The code reward's value per sample, every test a plain subprocess, ``concurrency`` at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one(program: str, stdin: str, expected: str) -> bool:
        async with slots:
            stdout, ok = await run_plain(python, program, stdin, wall_s)
        return ok and same_output(stdout, expected)

    values = []
    jobs = []
    for sample in samples:
        program = extract_program(sample.completion, False)
        tests = parse_tests(sample.metadata)
        assert program is not None and isinstance(tests, list)
        jobs.append([one(program, stdin, expected) for stdin, expected in tests])
    passed = await asyncio.gather(*(asyncio.gather(*tests) for tests in jobs))
    for results in passed:
        values.append(sum(results) / len(results))
    return values


async def score_mode(
    mode: str, samples: list[Sample], rewards: dict[str, CodeReward], settings: SandboxSettings
) -> list[float]:
    if mode == "subprocess":
        python = settings.resolved_python()
        assert python is not None
        return await score_plain(samples, python, settings.concurrency, settings.wall_timeout_s)
    reward = rewards[mode]
    params = resolve_params(reward.description.params, {}, "params")
    results = await reward.score(samples, params)
    return [r.value for r in results]


async def bench_throughput(args: argparse.Namespace, runner: SandboxRunner) -> dict:
    settings = runner.settings
    rewards = {
        "sandbox_per_test": CodeReward(
            SandboxRunner(settings.model_copy(update={"batch_wall_s": 0}), runner.backend), True, ""
        ),
        "sandbox_batched": CodeReward(SandboxRunner(settings, runner.backend), True, ""),
    }
    samples = throughput_samples(args.samples, args.tests)
    warm = throughput_samples(min(args.samples, 2), min(args.tests, 2))
    for mode in MODES:
        await score_mode(mode, warm, rewards, settings)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    values: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
            cpu_before, start = cpu_s(), time.perf_counter()
            values[mode] = await score_mode(mode, samples, rewards, settings)
            times[mode].append(time.perf_counter() - start)
            cpu[mode].append(cpu_s() - cpu_before)
    runs = args.samples * args.tests
    report: dict = {"runs_per_round": runs, "modes": {}}
    for mode in MODES:
        wall = statistics.median(times[mode])
        report["modes"][mode] = {
            "median_s": wall,
            "times_s": times[mode],
            "runs_per_s": runs / wall,
            "samples_per_s": args.samples / wall,
            "cpu_s_per_run": statistics.median(cpu[mode]) / runs,
        }
    base = report["modes"]["subprocess"]
    for entry in report["modes"].values():
        entry["runs_per_s_vs_subprocess"] = entry["runs_per_s"] / base["runs_per_s"]
        entry["wall_vs_subprocess"] = entry["median_s"] / base["median_s"]
        entry["cpu_per_run_vs_subprocess"] = entry["cpu_s_per_run"] / base["cpu_s_per_run"]
    report["values_agree"] = all(values[m] == values["subprocess"] for m in MODES)
    report["values"] = values["subprocess"]
    return report


class CountingBackend:
    """The runner's backend, counting the sandbox runs it prepares."""

    def __init__(self, backend):
        self._backend = backend
        self.name, self.options, self.reports_tests = backend.name, backend.options, backend.reports_tests
        self.prepared = 0

    def prepare(self, program, batch):
        self.prepared += 1
        return self._backend.prepare(program, batch)


async def bench_loop(args: argparse.Namespace, runner: SandboxRunner) -> dict:
    wall = args.loop_wall_s
    settings = runner.settings.model_copy(update={"wall_timeout_s": wall, "cpu_time_s": max(1, wall)})
    tests = [{"input": "", "output": "1"}] * args.loop_tests
    batch = [
        Sample(id=f"loop{i}", completion=fenced(LOOP_PROGRAM), metadata={"tests": tests})
        for i in range(args.loop_samples)
    ]
    small = [Sample(id="small", completion=fenced("print(1)"), metadata={"expected": "1"})]
    report: dict = {"wall_timeout_s": wall, "modes": {}}
    for mode in ON_TIMEOUT:
        counting = CountingBackend(runner.backend)
        reward = CodeReward(SandboxRunner(settings, counting), True, "")
        params = resolve_params(reward.description.params, {"on_timeout": mode}, "params")
        start = time.perf_counter()
        big = asyncio.ensure_future(reward.score(batch, params))
        await asyncio.sleep(min(0.5, wall / 2))  # the batch holds every slot
        small_start = time.perf_counter()
        (small_result,) = await reward.score(small, params)
        small_s = time.perf_counter() - small_start
        results = await big
        report["modes"][mode] = {
            "batch_s": time.perf_counter() - start,
            "sandbox_runs": counting.prepared - 1,  # the small request's run
            "values": [r.value for r in results],
            "small_request_s": small_s,
            "small_request_value": small_result.value,
        }
    base = report["modes"]["continue"]["batch_s"]
    for entry in report["modes"].values():
        entry["speedup_vs_continue"] = base / entry["batch_s"]
    return report


async def main_async(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    settings = SandboxSettings(concurrency=max(1, len(os.sched_getaffinity(0))))
    runner, status = await open_runner(settings)
    if runner is None:
        raise SystemExit(f"the sandbox cannot run here: {status}")
    throughput = await bench_throughput(args, runner)
    loop = await bench_loop(args, runner)
    return {
        "benchmark": "code reward: sandbox vs plain subprocess runs, and a batch of looping programs",
        "workload": {
            "samples": args.samples,
            "tests_per_sample": args.tests,
            "rounds": args.rounds,
            "program": SUM_PROGRAM,
            "loop_samples": args.loop_samples,
            "loop_tests_per_sample": args.loop_tests,
            "loop_program": LOOP_PROGRAM,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "concurrency": settings.concurrency,
            "python": platform.python_version(),
            "kernel": platform.release(),
            "sandbox": status,
            "batch_wall_s": settings.batch_wall_s,
            "load_average_1m_at_start": load_before,
            "load_average_1m_at_end": os.getloadavg()[0],
        },
        "throughput": throughput,
        "looping_batch": loop,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--tests", type=int, default=16, help="tests per sample")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loop-samples", type=int, default=4)
    parser.add_argument("--loop-tests", type=int, default=40, help="tests per looping sample")
    parser.add_argument("--loop-wall-s", type=float, default=1.0, help="wall and CPU limit of a looping test")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "code.json")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
