"""Local judges: dynamic batcher with shared prompts vs one request at a time, side by side in one run.

Workload, GRPO-shaped: ``--requests`` concurrent calls of ``ModelRegistry.score("judge:...")``, each with
``--samples`` completions of *one* prompt (a GRPO group), a reference answer in the metadata, the
default pointwise template (``reward_service.judges.template``: instructions, question, reference,
response, question to the judge) through the judge's chat template. Prompts are math word problems of
1-4 sentences, completions 2-8 reasoning steps (the PRM benchmark's generator); token counts recorded.

Every mode runs the same registry, tokenizer and forward code on the same inputs:

* ``one_request_at_a_time`` (the baseline): the requests one after the other, each request's samples
  in one right-padded forward (no batching across requests, no prefix sharing), as TRL scores a
  reward model;
* ``one_sample_at_a_time``: every sample judged alone, one forward each, one after the other, as a
  loop calling a judge per sample does;
* ``batched``: the dynamic batcher as configured by default: the sequences of all concurrent requests,
  each request's shared template head and prompt run once (KV cache), cut into length buckets.

Modes alternate within each round (rotating order), so load drifts hit them alike; the median wall
time of ``--rounds`` rounds is reported after a warm-up, with ``speedup = one_request_at_a_time_s /
batched_s`` (and against ``one_sample_at_a_time``), the process CPU time and the tokens each mode ran.
Values of every mode must match the baseline within 1e-5. The load average is recorded at the start
and the end of the run.
Models: the tiny trained judge (``tests/assets/models/judge``); ``--models large`` adds an untrained
causal LM of the ``policy-large`` shape (hidden 512, 8 layers, ~23M params) with the judge's tokenizer,
built in ``bench/models/`` (gitignored; minutes per round on 2 cores).

Usage: ``python bench/judge_bench.py [--out bench/results/judge.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from prm_bench import token_stats, workload  # run as a script (bench/__main__.py): bench/ is on sys.path
from transformers import Qwen2ForCausalLM

from reward_service.core.types import Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
from tiny_models.judge import judge_tokenizer
from tiny_models.make import make_all, qwen2_config

ROOT = Path(__file__).resolve().parent.parent
REWARD = "judge:bench"
MODES = {
    "one_request_at_a_time": {"dynamic_batching": False, "share_prefixes": False},
    "one_sample_at_a_time": {"dynamic_batching": False, "share_prefixes": False},
    "batched": {"dynamic_batching": True, "share_prefixes": True},
}


def build_large_judge(out: Path) -> Path:
    """A causal LM of the policy-large shape with the judge's tokenizer (seeded, untrained)."""
    if (out / "config.json").exists():
        return out
    tokenizer = judge_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(tokenizer, "large")).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def judge_workload(requests: int, samples: int, sentences: tuple[int, int]) -> list[list[Sample]]:
    """The PRM benchmark's groups with a reference answer for the template's ``{answer}``."""
    return [
        [replace(s, metadata={"answer": str(17 + r)}) for s in batch]
        for r, batch in enumerate(workload(requests, samples, sentence_range=sentences))
    ]


async def _round(
    mode: str, registry: ModelRegistry, batches: list[list[Sample]]
) -> tuple[float, float, list]:
    started, cpu_started = time.perf_counter(), time.process_time()
    if mode == "one_sample_at_a_time":
        results = [[(await registry.score(REWARD, [s], {}))[0] for s in batch] for batch in batches]
    elif mode == "one_request_at_a_time":
        results = [await registry.score(REWARD, batch, {}) for batch in batches]
    else:
        results = await asyncio.gather(*(registry.score(REWARD, b, {}) for b in batches))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert all(r.error == "" for batch in results for r in batch)
    return elapsed, cpu, [[r.value for r in batch] for batch in results]


def _tokens(stats: dict[str, int]) -> int:
    return stats["padded_tokens"] + stats["prefix_tokens"]


def _max_diff(a: list, b: list) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


async def bench_model(label: str, path: Path, threads: int, args: argparse.Namespace) -> dict:
    """Every mode on the same workload, rounds interleaved; per mode medians, tokens and value diffs."""
    torch.set_num_threads(threads)
    batches = judge_workload(args.requests, args.samples, tuple(args.question_sentences))
    registries = {}
    for mode, switches in MODES.items():
        settings = ModelSettings(
            max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms, **switches
        )
        registries[mode] = ModelRegistry(settings)
        await registries[mode].load(ModelSpec(name="bench", path=str(path), kind=ModelKind.JUDGE))
    rounds = args.large_rounds if label == "large" else args.rounds
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    values, tokens, forwards = {}, {}, {}
    try:
        for registry in registries.values():  # warm-up: first-call allocations, one request
            await registry.score(REWARD, batches[0], {})
        before = {mode: registry.batcher_stats("bench") for mode, registry in registries.items()}
        order = list(MODES)
        for index in range(rounds):
            for mode in order[index % len(order) :] + order[: index % len(order)]:
                elapsed, cpu_s, values[mode] = await _round(mode, registries[mode], batches)
                times[mode].append(elapsed)
                cpu[mode].append(cpu_s)
        for mode, registry in registries.items():
            after = registry.batcher_stats("bench")
            tokens[mode] = (_tokens(after) - _tokens(before[mode])) / rounds
            forwards[mode] = (after["forward_calls"] - before[mode]["forward_calls"]) / rounds
    finally:
        for registry in registries.values():
            await registry.close()
    modes = {}
    base = statistics.median(times["one_request_at_a_time"])
    base_cpu = statistics.median(cpu["one_request_at_a_time"])
    per_sample = statistics.median(times["one_sample_at_a_time"])
    for mode in MODES:
        wall, cpu_s = statistics.median(times[mode]), statistics.median(cpu[mode])
        modes[mode] = {
            "median_s": wall,
            "times_s": times[mode],
            "median_cpu_s": cpu_s,
            "forwards_per_round": forwards[mode],
            "tokens_run_per_round": tokens[mode],
            "speedup_vs_one_request_at_a_time": base / wall,
            "speedup_vs_one_sample_at_a_time": per_sample / wall,
            "cpu_time_ratio_vs_one_request_at_a_time": base_cpu / cpu_s,
            "max_abs_value_diff_vs_one_request_at_a_time": _max_diff(
                values[mode], values["one_request_at_a_time"]
            ),
        }
        print(
            f"{label:>6} threads={threads} {mode:>14}: {wall * 1000:8.1f} ms, "
            f"{forwards[mode]:6.1f} forwards, "
            f"{tokens[mode]:7.0f} tokens, speedup {base / wall:.2f}x (CPU {base_cpu / cpu_s:.2f}x), "
            f"max |diff| {modes[mode]['max_abs_value_diff_vs_one_request_at_a_time']:.1e}",
            flush=True,
        )
    worst = max(m["max_abs_value_diff_vs_one_request_at_a_time"] for m in modes.values())
    assert worst <= 1e-5, f"a mode changed the values by {worst}"
    return {
        "model": label,
        "torch_threads": threads,
        "rounds": rounds,
        "load_average_1m_after": os.getloadavg()[0],
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "modes": modes,
        "speedup": modes["batched"]["speedup_vs_one_request_at_a_time"],
        "speedup_vs_one_sample_at_a_time": modes["batched"]["speedup_vs_one_sample_at_a_time"],
        "cpu_time_ratio": modes["batched"]["cpu_time_ratio_vs_one_request_at_a_time"],
        "max_abs_value_diff": worst,
    }


async def main_async(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    paths = {}
    if "tiny" in args.models:
        paths["tiny"] = make_all(ROOT / "tests" / "assets" / "models", ("judge",))["judge"]
    if "large" in args.models:
        paths["large"] = build_large_judge(ROOT / "bench" / "models" / "judge-large")
    results = []
    for label, path in paths.items():
        for threads in args.threads:
            results.append(await bench_model(label, path, threads, args))
    return {
        "benchmark": "judge dynamic batcher with shared prompts vs one request at a time",
        "workload": {
            "concurrent_requests": args.requests,
            "samples_per_request": args.samples,
            "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms,
            "question_sentences": args.question_sentences,
            **token_stats(
                judge_workload(args.requests, args.samples, tuple(args.question_sentences)),
                next(iter(paths.values())),
                ModelKind.JUDGE,
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
        "target_speedup": 2.0,
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--large-rounds", type=int, default=2, help="rounds of the large model")
    parser.add_argument(
        "--question-sentences", type=int, nargs=2, default=[1, 4], help="min and max sentences per prompt"
    )
    parser.add_argument("--max-batch-tokens", type=int, default=ModelSettings().max_batch_tokens)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--models", nargs="+", choices=("tiny", "large"), default=["tiny", "large"])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[torch.get_num_threads()], help="torch threads"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judge.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
