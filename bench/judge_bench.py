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
from dataclasses import replace
from pathlib import Path

import torch
from batcher_modes import bench_modes  # run as a script (bench/__main__.py): bench/ is on sys.path
from prm_bench import token_stats, workload
from transformers import Qwen2ForCausalLM

from reward_service.core.types import Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind
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


async def _score_round(mode: str, registry: ModelRegistry, batches: list[list[Sample]]) -> list:
    if mode == "one_sample_at_a_time":
        return [[(await registry.score(REWARD, [s], {}))[0] for s in batch] for batch in batches]
    if mode == "one_request_at_a_time":
        return [await registry.score(REWARD, batch, {}) for batch in batches]
    return await asyncio.gather(*(registry.score(REWARD, b, {}) for b in batches))


async def bench_model(label: str, path: Path, threads: int, args: argparse.Namespace) -> dict:
    """Every mode on the same workload, rounds interleaved; per mode medians, tokens and value diffs."""
    result = await bench_modes(
        label,
        path,
        ModelKind.JUDGE,
        threads,
        MODES,
        judge_workload(args.requests, args.samples, tuple(args.question_sentences)),
        args,
        baseline="one_request_at_a_time",
        score_round=_score_round,
        value_of=lambda score: score.value,
        value_name="value",
    )
    modes = result["modes"]
    per_sample = modes["one_sample_at_a_time"]["median_s"]
    for mode in modes.values():
        mode["speedup_vs_one_sample_at_a_time"] = per_sample / mode["median_s"]
    result["speedup_vs_one_sample_at_a_time"] = modes["batched"]["speedup_vs_one_sample_at_a_time"]
    return result


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
