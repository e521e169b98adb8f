"""PRM scoring: dynamic batcher vs one forward per request, measured side by side in one run.

Workload (issue: "16 concurrent requests of 8 samples"): ``--requests`` concurrent calls of
``ModelRegistry.score("prm:...")``, each with ``--samples`` multi-step math completions of varied
length. Two registries score the same workload with the same model:

* ``batched``: the dynamic batcher merges the sequences of all concurrent requests into padded
  forwards of up to ``max_batch_tokens`` (flush after ``max_wait_ms``);
* ``per_request``: batching across requests disabled, so each request is one forward of its own
  samples (the way a reward function called per request would run).

Both run through the same registry, tokenizer and forward code, so the difference is the batching.
Each mode runs ``--rounds`` times (``--large-rounds`` for the large model) after a one-request
warm-up; the median wall time is reported, with ``speedup = per_request_s / batched_s``, for each
torch thread count in ``--threads``. The process CPU time of each mode is recorded too
(``cpu_time_ratio``): on a shared, oversubscribed machine it tracks the work done better than wall
time does.
Models: the tiny ``prm-token`` test model and a larger token-classification PRM built here
(``policy-large`` shape: hidden 512, 8 layers, ~23M params) in ``bench/models/`` (gitignored).

Usage: ``python bench/prm_bench.py [--out bench/results/prm.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen2ForTokenClassification

from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
from reward_service.types import Message, Sample
from tiny_models.make import make_all, qwen2_config
from tiny_models.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
STEP_TEMPLATES = [
    "Step {k}: {a} * {b} = {p}.",
    "Next, {p} - {b} = {d}, so we keep {d}.",
    "Check it: {a} + {b} = {s}, and {s} - {a} = {b}.",
    "First, read the question. Second, solve it: {a} * {b} = {p}.",
    "The quick brown fox jumps over the lazy dog, then {a} + {b} = {s}.",
]


def build_large_prm(out: Path) -> Path:
    """A token-classification PRM of the policy-large shape with the shared tokenizer (seeded)."""
    if (out / "config.json").exists():
        return out
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(qwen2_config(tokenizer, "large", num_labels=2)).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def workload(requests: int, samples: int, seed: int = 0) -> list[list[Sample]]:
    """``requests`` lists of ``samples`` completions with 2-8 steps each (about 40-200 tokens)."""
    rng = random.Random(seed)
    batches = []
    for r in range(requests):
        prompt = (Message("user", f"Compute {r + 3} * 4 - 5 and check the result."),)
        batch = []
        for s in range(samples):
            steps = []
            for k in range(rng.randint(2, 8)):
                a, b = rng.randint(2, 20), rng.randint(2, 20)
                steps.append(
                    rng.choice(STEP_TEMPLATES).format(k=k + 1, a=a, b=b, p=a * b, d=a * b - b, s=a + b)
                )
            steps.append(f"The answer is \\boxed{{{rng.randint(0, 99)}}}.")
            batch.append(Sample(id=f"{r}-{s}", prompt=prompt, completion="\n\n".join(steps)))
        batches.append(batch)
    return batches


async def measure(path: Path, settings: ModelSettings, batches: list[list[Sample]], rounds: int) -> dict:
    registry = ModelRegistry(settings)
    await registry.load(ModelSpec(name="bench", path=str(path), kind=ModelKind.PRM))
    try:
        await registry.score("prm:bench", batches[0], {})  # warm-up: first-call allocations
        before = registry.batcher_stats("bench")
        times, cpu_times = [], []
        for _ in range(rounds):
            started, cpu_started = time.perf_counter(), time.process_time()
            results = await asyncio.gather(*(registry.score("prm:bench", b, {}) for b in batches))
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
            assert all(r.error == "" for batch in results for r in batch)
        after = registry.batcher_stats("bench")
    finally:
        await registry.close()
    forwards = after["forward_calls"] - before["forward_calls"]
    return {
        "median_s": statistics.median(times),
        "times_s": times,
        "median_cpu_s": statistics.median(cpu_times),
        "forwards_per_round": forwards / rounds,
        "largest_batch": after["largest_batch"],
        "scores": [[r.step_scores for r in batch] for batch in results],
    }


async def bench_model(label: str, path: Path, threads: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(threads)
    batches = workload(args.requests, args.samples)
    common = {"max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms}
    rounds = args.large_rounds if label == "large" else args.rounds
    batched = await measure(path, ModelSettings(**common, dynamic_batching=True), batches, rounds)
    per_request = await measure(path, ModelSettings(**common, dynamic_batching=False), batches, rounds)
    # Same numbers either way: batching must not change a score.
    worst = max(
        abs(x - y)
        for a, b in zip(batched.pop("scores"), per_request.pop("scores"), strict=True)
        for sa, sb in zip(a, b, strict=True)
        for x, y in zip(sa, sb, strict=True)
    )
    speedup = per_request["median_s"] / batched["median_s"]
    cpu_ratio = per_request["median_cpu_s"] / batched["median_cpu_s"]
    batched_ms, per_request_ms = batched["median_s"] * 1000, per_request["median_s"] * 1000
    print(
        f"{label:>6} threads={threads}: batched {batched_ms:8.1f} ms "
        f"({batched['forwards_per_round']:.1f} forwards), per-request {per_request_ms:8.1f} ms "
        f"({per_request['forwards_per_round']:.0f} forwards), speedup {speedup:.2f}x "
        f"(CPU time ratio {cpu_ratio:.2f}x), max |diff| {worst:.1e}",
        flush=True,
    )
    return {
        "model": label,
        "torch_threads": threads,
        "rounds": rounds,
        "load_average_1m_after": os.getloadavg()[0],
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "batched": batched,
        "per_request": per_request,
        "speedup": speedup,
        "cpu_time_ratio": cpu_ratio,
        "max_abs_score_diff": worst,
    }


async def main_async(args: argparse.Namespace) -> dict:
    paths = {}
    if "tiny" in args.models:
        paths["tiny"] = make_all(ROOT / "tests" / "assets" / "models", ("prm-token",))["prm-token"]
    if "large" in args.models:
        paths["large"] = build_large_prm(ROOT / "bench" / "models" / "prm-token-large")
    results = []
    for label, path in paths.items():
        for threads in args.threads:
            results.append(await bench_model(label, path, threads, args))
    return {
        "benchmark": "prm dynamic batcher vs one forward per request",
        "workload": {
            "concurrent_requests": args.requests,
            "samples_per_request": args.samples,
            "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": "cpu",
        },
        "target_speedup": 3.0,
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--large-rounds", type=int, default=2, help="rounds of the large model")
    parser.add_argument("--max-batch-tokens", type=int, default=ModelSettings().max_batch_tokens)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--models", nargs="+", choices=("tiny", "large"), default=["tiny", "large"])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[torch.get_num_threads(), 1], help="torch threads to try"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prm.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
