"""Reward service benchmarks, side by side in one run against a real ``python -m reward_service``.

1. **accuracy**: 512 samples (64 problems × 8 completions, the GRPO layout: each gold shared by a group)
   scored by one ``Score`` call through gRPC, versus TRL's ``trl.rewards.accuracy_reward`` in this process
   (its main thread, so with its signal timeouts, as in a trainer). Both get a warm-up call first; each side
   is timed ``--rounds`` times and the median is reported; ``speedup = trl_s / grpc_s`` (target ≥ 1.7× on 2
   cores). CPU seconds of both sides are recorded too, and the answers are compared (they must agree).
   Beside it, the same call spread over a ``concurrent.futures.ProcessPoolExecutor`` with as many processes
   as the service has math-verify workers (the same cores), warmed up first: ``speedup_vs_trl_pool =
   trl_pool_s / grpc_s`` is what the service adds over parallelising TRL's function by hand. CPU seconds per
   answer (``service_cpu_s_per_answer``, ``trl_pool_cpu_s_per_answer``) stand beside the wall times: they
   measure the per-answer cost itself, and move less than wall times on a machine shared with other work.
2. **load**: ``--clients`` concurrent clients (64) issue ``--calls`` Score calls in total (10,000;
   ``--quick``: 1,000), each 4 samples × (accuracy, format, tag_count); errors counted; resident memory of
   the service (main process + math-verify workers, psutil) after a warm-up vs at the end: ``rss_growth``
   (target < 10 %).
3. **latency**: single-sample Score, sequential, p50/p99 in ms, for a rule reward (``format``) and for
   ``accuracy`` (one round trip to a math-verify worker process).

The service runs with ``checkers.workers`` = the cores this process may use. Writes ``--out``
(default ``bench/results/reward.json``).

Usage: ``python bench/reward_bench.py [--quick] [--out bench/results/reward.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import grpc
import psutil
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc
from trl.rewards import accuracy_reward

from grpo_runtime.client import create_channel

ROOT = Path(__file__).resolve().parent.parent

# Gold answers in the forms of math datasets, and ways a completion can state (or miss) them.
GOLDS = [
    (r"\frac{1}{3}", [r"\frac{1}{3}", r"\frac{2}{6}", "0.3333333", r"\frac{1}{2}"]),
    ("42", ["42", "42.0", "41", r"\frac{84}{2}"]),
    (r"(1, 2]", [r"(1,2]", r"[1,2]", r"(1, 2]", r"(1,2)"]),
    (r"50\%", [r"50\%", "0.5", r"40\%", "50"]),
    (r"\{1, 2, 3\}", [r"\{3, 2, 1\}", r"\{1, 2\}", r"\{1,2,3\}", r"\{4\}"]),
    (r"x^2 + 2x + 1", [r"(x+1)^2", r"x^2+2x+1", r"(x-1)^2", r"x^2 + 1"]),
    (r"\sqrt{2}", [r"\frac{2}{\sqrt{2}}", "1.41421356", r"\sqrt{3}", r"2^{1/2}"]),
    (r"2\pi", [r"2\pi", "6.283185307", r"\pi", r"\tau"]),
]


def make_batch(n_problems: int, group: int, seed: int = 0) -> list[tuple[str, str]]:
    """(gold, completion) pairs: ``n_problems`` golds × ``group`` completions, in group order.

    Every problem gets its own shifted gold (``<form> + k``), distinct across seeds too, so no cache carries
    over between batches: only the completions of one group share a gold, as in GRPO."""
    rng = random.Random(seed)
    pairs = []
    for p in range(n_problems):
        gold, answers = GOLDS[p % len(GOLDS)]
        offset = p // len(GOLDS) + 1000 * seed
        # Vary the gold's numbers across problems so the cache only helps within a group, as in GRPO.
        gold_text = f"${gold} + {offset}$" if offset else f"${gold}$"
        for _ in range(group):
            answer = rng.choice(answers)
            answer_text = f"{answer} + {offset}" if offset else answer
            filler = " ".join(
                rng.choice(["so", "then", "we", "get", "thus"]) for _ in range(rng.randint(5, 40))
            )
            pairs.append(
                (gold_text, f"Let me think. {filler}. The final answer is $\\boxed{{{answer_text}}}$.")
            )
    return pairs


def trl_accuracy(chunk: tuple[list[str], list[str]]) -> tuple[list[float | None], float]:
    """TRL's ``accuracy_reward`` on (completions, golds) in a pool worker's main thread (its signal timeouts
    work there): (rewards, CPU seconds the worker spent)."""
    completions, golds = chunk
    cpu = time.process_time()
    rewards = accuracy_reward([[{"role": "assistant", "content": c}] for c in completions], golds)
    return rewards, time.process_time() - cpu


def pool_chunks(pairs: list[tuple[str, str]], parts: int) -> list[tuple[list[str], list[str]]]:
    """``pairs`` cut into ``parts`` contiguous chunks of whole groups of 8 (near-equal sizes)."""
    groups = [pairs[i : i + 8] for i in range(0, len(pairs), 8)]
    chunks = []
    for k in range(parts):
        part = [
            pair
            for group in groups[k * len(groups) // parts : (k + 1) * len(groups) // parts]
            for pair in group
        ]
        chunks.append(([c for _, c in part], [g for g, _ in part]))
    return [chunk for chunk in chunks if chunk[0]]


def score_request(pairs: list[tuple[str, str]], rewards: list[str]) -> reward_pb2.ScoreRequest:
    request = reward_pb2.ScoreRequest()
    for i, (gold, completion) in enumerate(pairs):
        sample = request.samples.add(id=str(i), completion=completion, group=f"g{i // 8}")
        sample.metadata.update({"answer": gold})
    for name in rewards:
        request.rewards.add(name=name)
    return request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """``python -m reward_service`` in a subprocess, on a free port."""

    def __init__(self, workers: int):
        self.port = free_port()
        fd, self._config_path = tempfile.mkstemp(suffix=".yaml")
        with os.fdopen(fd, "w") as config:
            config.write(f"server:\n  grace_period_s: 2\ncheckers:\n  workers: {workers}\n")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reward_service",
                "--port",
                str(self.port),
                "--config",
                self._config_path,
                "--log-level",
                "WARNING",
            ],
            env=env,
            cwd=ROOT,
        )
        self.address = f"127.0.0.1:{self.port}"

    def wait_ready(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            grpc.channel_ready_future(channel).result(timeout=180)

    def rss_bytes(self) -> int:
        """Resident memory of the service and its children (the math-verify workers)."""
        root = psutil.Process(self.proc.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])

    def cpu_seconds(self) -> float:
        """user + system CPU time of the service and its children so far."""
        root = psutil.Process(self.proc.pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.unlink(self._config_path)


async def bench_accuracy(service: Service, rounds: int, pool: ProcessPoolExecutor, workers: int) -> dict:
    address = service.address
    # Four chunks per process: a chunk of slow samples does not leave the other processes idle.
    parts = 4 * workers
    async with create_channel(address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        warm = make_batch(8, 2, seed=99)
        await stub.Score(score_request(warm, ["accuracy"]), timeout=300)
        # TRL warm-up (imports, regex compilation)
        accuracy_reward([[{"role": "assistant", "content": c}] for _, c in warm], [g for g, _ in warm])
        list(pool.map(trl_accuracy, pool_chunks(make_batch(4 * parts, 8, seed=98), parts)))
        grpc_times, trl_times, pool_times, grpc_cpu, trl_cpu, pool_cpu = [], [], [], [], [], []
        agree = total = correct = 0
        for r in range(rounds):
            # A fresh batch each round (new golds and completions): no cache helps across rounds.
            pairs = make_batch(64, 8, seed=r + 1)
            request = score_request(pairs, ["accuracy"])
            completions = [[{"role": "assistant", "content": c}] for _, c in pairs]
            golds = [g for g, _ in pairs]
            cpu = service.cpu_seconds()
            start = time.perf_counter()
            reply = await stub.Score(request, timeout=600)
            grpc_times.append(time.perf_counter() - start)
            grpc_cpu.append(service.cpu_seconds() - cpu)
            cpu = time.process_time()
            start = time.perf_counter()
            expected = accuracy_reward(completions, golds)
            trl_times.append(time.perf_counter() - start)
            trl_cpu.append(time.process_time() - cpu)
            start = time.perf_counter()
            parts_done = list(pool.map(trl_accuracy, pool_chunks(pairs, parts)))
            pool_times.append(time.perf_counter() - start)
            pool_cpu.append(sum(cpu_s for _, cpu_s in parts_done))
            pooled = [v for rewards, _ in parts_done for v in rewards]
            if pooled != expected:
                raise AssertionError("TRL's accuracy_reward gave other values in the process pool")
            ours = [s.reward if s.HasField("reward") else None for s in reply.scores]
            agree += sum(a == b for a, b in zip(ours, expected, strict=True))
            total += len(pairs)
            correct += sum(v == 1.0 for v in expected)
    grpc_s, trl_s = statistics.median(grpc_times), statistics.median(trl_times)
    pool_s = statistics.median(pool_times)
    service_cpu, trl_cpu_s = statistics.median(grpc_cpu), statistics.median(trl_cpu)
    pool_cpu_s = statistics.median(pool_cpu)
    answers = len(pairs)
    cores = min(2, len(os.sched_getaffinity(0)))
    return {
        "samples": answers,
        "grpc_s": round(grpc_s, 4),
        "trl_in_process_s": round(trl_s, 4),
        "speedup": round(trl_s / grpc_s, 3),
        "trl_pool_processes": workers,
        "trl_pool_s": round(pool_s, 4),
        "speedup_vs_trl_pool": round(pool_s / grpc_s, 3),
        "rounds": {
            "grpc_s": [round(t, 4) for t in grpc_times],
            "trl_s": [round(t, 4) for t in trl_times],
            "trl_pool_s": [round(t, 4) for t in pool_times],
        },
        # CPU seconds spent on the batch: the service (gRPC process + math-verify workers) vs TRL's process.
        # On a machine shared with other work, wall time depends on the neighbours; CPU time does not, and
        # trl_cpu / (service_cpu / cores) is the speedup the same work gives on `cores` otherwise idle cores.
        "service_cpu_s": round(service_cpu, 3),
        "service_cpu_s_per_answer": round(service_cpu / answers, 6),
        "trl_cpu_s": round(trl_cpu_s, 3),
        "projected_speedup_on_2_idle_cores": round(trl_cpu_s / (service_cpu / cores), 3),
        # The pool spreads the same CPU work over the same cores: on idle cores the ratio of the CPU seconds
        # is the ratio of the wall times.
        "trl_pool_cpu_s": round(pool_cpu_s, 3),
        "trl_pool_cpu_s_per_answer": round(pool_cpu_s / answers, 6),
        "projected_speedup_vs_trl_pool_on_2_idle_cores": round(pool_cpu_s / service_cpu, 3),
        "agreement_with_trl": f"{agree}/{total}",
        "correct_fraction": round(correct / total, 3),
    }


async def bench_load(service: Service, clients: int, calls: int) -> dict:
    pairs = make_batch(64, 4, seed=1)
    requests = [
        score_request(pairs[i : i + 4], ["accuracy", "format", "tag_count"]) for i in range(0, 256, 4)
    ]
    errors: dict[str, int] = {}
    latencies: list[float] = []

    async with create_channel(service.address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def client(index: int, n: int) -> None:
            for k in range(n):
                start = time.perf_counter()
                try:
                    await stub.Score(requests[(index + k) % len(requests)], timeout=120)
                    latencies.append(time.perf_counter() - start)
                except grpc.aio.AioRpcError as exc:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1

        async def wave(total: int) -> float:
            per_client = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
            start = time.perf_counter()
            await asyncio.gather(*(client(i, n) for i, n in enumerate(per_client)))
            return time.perf_counter() - start

        await wave(min(500, calls))  # warm-up: workers, caches, allocator arenas
        rss_before = service.rss_bytes()
        latencies.clear()
        elapsed = await wave(calls)
        rss_after = service.rss_bytes()
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "calls": calls,
        "samples_per_call": 4,
        "rewards": ["accuracy", "format", "tag_count"],
        "errors": sum(errors.values()),
        "errors_by_code": errors,
        "wall_s": round(elapsed, 2),
        "calls_per_s": round(calls / elapsed, 1),
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 2) if ordered else None,
        "p99_ms": round(1000 * ordered[int(len(ordered) * 0.99)], 2) if ordered else None,
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_after_mb": round(rss_after / 2**20, 1),
        "rss_growth": round(rss_after / rss_before - 1, 4),
    }


async def bench_latency(address: str, n: int) -> dict:
    out = {}
    async with create_channel(address) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        for reward in ("format", "accuracy"):
            request = score_request(make_batch(1, 1, seed=2), [reward])
            for _ in range(20):
                await stub.Score(request, timeout=30)
            times = []
            for _ in range(n):
                start = time.perf_counter()
                await stub.Score(request, timeout=30)
                times.append(time.perf_counter() - start)
            times.sort()
            out[reward] = {
                "calls": n,
                "p50_ms": round(1000 * times[n // 2], 3),
                "p99_ms": round(1000 * times[int(n * 0.99)], 3),
            }
    return out


async def run(args: argparse.Namespace) -> dict:
    workers = len(os.sched_getaffinity(0))
    load_avg_start = os.getloadavg()
    # spawn: this process holds gRPC channels, which a forked child must not inherit.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
    service = Service(workers)
    try:
        service.wait_ready()
        accuracy = await bench_accuracy(service, args.rounds, pool, workers)
        pool.shutdown()
        print(f"accuracy: {json.dumps(accuracy)}", flush=True)
        latency = await bench_latency(service.address, args.latency_calls)
        print(f"latency: {json.dumps(latency)}", flush=True)
        load = await bench_load(service, args.clients, args.calls)
        print(f"load: {json.dumps(load)}", flush=True)
    finally:
        pool.shutdown(cancel_futures=True)
        service.stop()
    load_avg_end = os.getloadavg()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # 1-minute load average at the start and the end: other work on the machine skews wall times.
            "load_average_start": round(load_avg_start[0], 2),
            "load_average_end": round(load_avg_end[0], 2),
            "load_averages_1_5_15m": {"start": load_avg_start, "end": load_avg_end},
        },
        "service": {"checker_workers": workers},
        "accuracy_512": accuracy,
        "single_sample_latency": latency,
        "load": load,
        "targets": {
            "accuracy_speedup_min": 1.7,
            "accuracy_speedup_vs_trl_pool_min": 1.5,
            "load_errors": 0,
            "rss_growth_max": 0.10,
        },
        "quick": args.quick,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 load calls instead of 10,000")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--calls", type=int, default=None, help="load calls (default 10,000; --quick 1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of the accuracy comparison")
    parser.add_argument("--latency-calls", type=int, default=500)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reward.json")
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 1000 if args.quick else 10_000
    results = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
