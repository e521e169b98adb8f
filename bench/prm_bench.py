"""PRM scoring: dynamic batcher vs one forward per request, measured side by side in one run.

Workload (issue: "16 concurrent requests of 8 samples"), GRPO-shaped: ``--requests`` concurrent
calls of ``ModelRegistry.score("prm:...")``, each with ``--samples`` completions of *one* prompt
(a GRPO group). Prompts are math word problems of 1-4 sentences (about 90-270 tokens after the
PRM's chat template), completions 2-8 steps (about 50-200 tokens). The token counts are recorded.

Every mode runs the same registry, tokenizer and forward code on the same inputs:

* ``per_request`` (the baseline): no batching across requests and no prefix sharing, so each
  request is one right-padded forward of its own 8 samples, as TRL scores a reward model;
* ``batched``: the dynamic batcher as configured by default: the sequences of all concurrent
  requests, with each request's shared prompt run once (KV cache), cut into length buckets;
* two ablations that split the gain: ``batched_no_prefix`` (buckets across requests, every
  sequence whole) and ``per_request_prefix`` (one request per forward, prompt run once).

Modes alternate within each round (rotating order), so load drifts hit them alike; the median wall
time of ``--rounds`` rounds is reported after a one-request warm-up, with ``speedup = per_request_s /
batched_s``, the process CPU time of each mode, and the tokens each one ran (padded forward tokens
+ shared-prefix tokens). Scores of every mode must match the baseline within 1e-5. The large model
runs ``--large-rounds`` (default 1) interleaved rounds per thread count, to keep the run short.
``batch_scaling`` then times plain forwards of 1, 8 and 32 sequences: on a CPU the time per token
hardly changes with the batch size, which bounds what merging requests alone can gain.
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
from batcher_modes import bench_modes  # run as a script (bench/__main__.py): bench/ is on sys.path
from transformers import Qwen2ForTokenClassification

from reward_service.core.types import Message, Sample
from reward_service.models.engine import Encoded
from reward_service.models.engine_builder import build_engine
from reward_service.models.loading import load_model
from reward_service.models.prefix import share_prefixes
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
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
QUESTION_SENTENCES = [
    "A baker makes {a} loaves every morning and sells {b} of them before noon.",
    "Each box holds {a} apples, and a crate holds {b} boxes.",
    "Natalia sold clips to {a} of her friends in April, and then half as many in May.",
    "A train travels {a} kilometres in the first hour and {b} kilometres in the second.",
    "The school ordered {a} notebooks for each of its {b} classrooms.",
    "Tom saves {a} dollars a week and spends {b} dollars of it on lunch.",
    "A garden has {a} rows of tomato plants with {b} plants in each row.",
]
QUESTIONS = ["How many are left at the end?", "What is the total?", "How much is that altogether?"]


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


def workload(
    requests: int, samples: int, seed: int = 0, sentence_range: tuple[int, int] = (1, 4)
) -> list[list[Sample]]:
    """``requests`` groups of ``samples`` completions of one prompt each (see the module docstring);
    each question has ``sentence_range`` (min, max) sentences before the question itself."""
    rng = random.Random(seed)
    batches = []
    for r in range(requests):
        sentences = [
            rng.choice(QUESTION_SENTENCES).format(a=rng.randint(2, 90), b=rng.randint(2, 90))
            for _ in range(rng.randint(*sentence_range))
        ]
        question = " ".join([*sentences, rng.choice(QUESTIONS)])
        prompt = (Message("system", "Solve the problem."), Message("user", question))
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


MODES = {
    "per_request": {"dynamic_batching": False, "share_prefixes": False},
    "batched": {"dynamic_batching": True, "share_prefixes": True},
    "batched_no_prefix": {"dynamic_batching": True, "share_prefixes": False},
    "per_request_prefix": {"dynamic_batching": False, "share_prefixes": True},
}


async def _score_round(mode: str, registry: ModelRegistry, batches: list[list[Sample]]) -> list:
    """All requests at once, as concurrent GRPO groups arrive (every mode; the batcher settings differ)."""
    return await asyncio.gather(*(registry.score("prm:bench", b, {}) for b in batches))


async def bench_model(label: str, path: Path, threads: int, args: argparse.Namespace) -> dict:
    """Every mode on the same workload, rounds interleaved; per mode medians, tokens and score diffs."""
    return await bench_modes(
        label,
        path,
        ModelKind.PRM,
        threads,
        MODES,
        workload(args.requests, args.samples, sentence_range=tuple(args.question_sentences)),
        args,
        baseline="per_request",
        score_round=_score_round,
        value_of=lambda result: result.step_scores,
        value_name="score",
    )


def batch_scaling(path: Path, threads: int, length: int = 128, sizes: tuple[int, ...] = (1, 8, 32)) -> dict:
    """Wall and CPU time per token of one plain forward of B sequences of ``length`` tokens, per B.

    Flat numbers mean the CPU is compute-bound already at a request's size, so merging requests
    can only win by computing fewer tokens (padding, shared prefixes), not by doing them faster.
    (With several threads on a shared machine, CPU time also counts OpenMP threads spinning.)
    """
    torch.set_num_threads(threads)
    settings = ModelSettings()
    spec = ModelSpec(name="bench", path=str(path), kind=ModelKind.PRM)
    engine = build_engine(load_model(spec, settings), settings)
    rng = random.Random(1)
    wall, cpu = {}, {}
    for size in sizes:
        batch = [Encoded(input_ids=[rng.randrange(10, 500) for _ in range(length)]) for _ in range(size)]
        engine.forward(batch)  # allocations
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.forward(batch)
        wall[str(size)] = 1e6 * (time.perf_counter() - started) / (size * length)
        cpu[str(size)] = 1e6 * (time.process_time() - cpu_started) / (size * length)
    return {
        "threads": threads,
        "sequence_tokens": length,
        "wall_us_per_token_by_batch_size": wall,
        "cpu_us_per_token_by_batch_size": cpu,
    }


def token_stats(batches: list[list[Sample]], path: Path, kind: ModelKind = ModelKind.PRM) -> dict:
    """Sequence and shared-prefix lengths of the workload, in tokens, as the registry encodes them."""
    settings = ModelSettings()
    engine = build_engine(load_model(ModelSpec(name="bench", path=str(path), kind=kind), settings), settings)
    lengths, prefixes = [], []
    for batch in batches:
        grouped = share_prefixes(
            [engine.encode(sample) for sample in batch], settings.min_shared_prefix_tokens
        )
        lengths += [item.num_tokens for item in grouped]
        prefixes.append(grouped[0].prefix_tokens)
    return {
        "sequence_tokens_mean": statistics.mean(lengths),
        "sequence_tokens_min_max": [min(lengths), max(lengths)],
        "shared_prefix_tokens_mean": statistics.mean(prefixes),
        "shared_prefix_tokens_min_max": [min(prefixes), max(prefixes)],
    }


async def main_async(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    paths = {}
    if "tiny" in args.models:
        paths["tiny"] = make_all(ROOT / "tests" / "assets" / "models", ("prm-token",))["prm-token"]
    if "large" in args.models:
        paths["large"] = build_large_prm(ROOT / "bench" / "models" / "prm-token-large")
    results, scaling = [], {}
    for label, path in paths.items():
        for threads in args.large_threads if label == "large" else args.threads:
            results.append(await bench_model(label, path, threads, args))
        most = max(*args.threads, *args.large_threads)
        scaling[label] = [batch_scaling(path, threads) for threads in sorted({1, most})]
        print(f"{label:>6} time per token by batch size: {scaling[label]}", flush=True)
    return {
        "benchmark": "prm dynamic batcher vs one forward per request",
        "workload": {
            "concurrent_requests": args.requests,
            "samples_per_request": args.samples,
            "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms,
            "question_sentences": args.question_sentences,
            **token_stats(
                workload(args.requests, args.samples, sentence_range=tuple(args.question_sentences)),
                next(iter(paths.values())),
            ),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": "cpu",
            "load_average_1m_at_start": load_before,
            "load_average_1m_at_end": os.getloadavg()[0],
        },
        "target_speedup": 3.0,
        "results": results,
        "batch_scaling": scaling,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--question-sentences", type=int, nargs=2, default=[1, 4], help="min and max sentences per prompt"
    )
    parser.add_argument("--large-rounds", type=int, default=1, help="rounds of the large model")
    parser.add_argument("--max-batch-tokens", type=int, default=ModelSettings().max_batch_tokens)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--models", nargs="+", choices=("tiny", "large"), default=["tiny", "large"])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[torch.get_num_threads(), 1], help="torch threads to try"
    )
    parser.add_argument(
        "--large-threads", type=int, nargs="+", default=[torch.get_num_threads(), 1], help="same, large model"
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
