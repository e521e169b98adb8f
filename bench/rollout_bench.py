"""Rollout service benchmark: gRPC overhead, engine throughput, weight push and sleep/wake.

    python bench/rollout_bench.py [--engines hf vllm] [--model tests/assets/models/policy-large]
                                  [--out bench/results/rollout.json]

Per engine (one service each, started in this process on 127.0.0.1):
- ``grpc_vs_inprocess``: the same Generate (8 prompts × n=8 × 64 tokens, fixed length via
  min_tokens) through gRPC with RolloutClient vs RolloutCore.generate called in-process on the
  server's event loop; median of alternating rounds, wall time and CPU time of the process tree
  (steadier on a shared machine); target ratio ≤ 1.05.
- ``tokens_per_s``: generated tokens / wall time of that Generate.
- ``lora_push_s``: RolloutClient.push_lora of a rank-16 adapter on every linear layer, median.
- ``full_weights``: push_state_dict of the whole model; bytes / second end to end (serialize,
  SHA-256 on both sides, stream, validate, apply) and of the transfer alone (minus apply).
- ``logprob_error``: max over completions of mean |logprob − log_softmax(logits / T)| from a
  fresh transformers forward pass (fp32), base weights.
- ``load_weights_from_dir``: LoadWeights of the same state dict from a local directory (the
  path for large models on a shared volume).
- ``sleep``: RSS freed by Sleep(level) and the time WakeUp takes, for levels 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import psutil
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient
from rollout_service.core.settings import RolloutSettings
from rollout_service.core.types import GenerateRequest, PromptInput, SamplingSpec
from rollout_service.server import BackgroundServer
from rollout_service.weights import state_dict_bytes

PROMPTS = [
    "What is 12 + 7?",
    "Compute 3 * 4 - 5.",
    "reverse the word hello:",
    "def solve():",
    "The quick brown fox",
    "First, read the question.",
    '{"name": "Ada",',
    "sort 3 1 2:",
]
N, TOKENS = 8, 64
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SAMPLING = {"temperature": 1.0, "max_tokens": TOKENS, "min_tokens": TOKENS, "seed": 0}


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and its live children (vLLM engine processes)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one call. On a shared machine the
    CPU time is the steadier measure of the work a path costs."""
    wall, cpu = time.perf_counter(), tree_cpu_seconds()
    fn()
    return time.perf_counter() - wall, tree_cpu_seconds() - cpu


def logprob_error(model, results, temperature: float) -> float:
    errors = []
    for r in results:
        ids = torch.tensor([r.prompt_token_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.prompt_token_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[
            :, 0
        ]
        errors.append((expected - torch.tensor(r.logprobs)).abs().mean().item())
    return max(errors)


def bench_engine(engine: str, model: str, rounds: int, work: Path) -> dict:
    settings = RolloutSettings(model=model, engine=engine, max_model_len=512, vllm={"max_lora_rank": 16})
    start = time.perf_counter()
    server = BackgroundServer(settings).start()
    out: dict = {"engine": engine, "start_s": time.perf_counter() - start}
    try:
        client = RolloutClient(server.address, timeout_s=600)
        request = GenerateRequest(
            prompts=tuple(PromptInput(id=str(i), text=p) for i, p in enumerate(PROMPTS)),
            n=N,
            sampling=SamplingSpec(**SAMPLING),
        )
        client.generate(PROMPTS, n=N, sampling=SAMPLING)  # warm-up
        grpc_runs, local_runs = [], []
        for _ in range(rounds):
            grpc_runs.append(timed(lambda: client.generate(PROMPTS, n=N, sampling=SAMPLING)))
            local_runs.append(timed(lambda: server.call(server.core.generate(request))))
        tokens = len(PROMPTS) * N * TOKENS
        g, loc = statistics.median(r[0] for r in grpc_runs), statistics.median(r[0] for r in local_runs)
        g_cpu, loc_cpu = (
            statistics.median(r[1] for r in grpc_runs),
            statistics.median(r[1] for r in local_runs),
        )
        out["grpc_vs_inprocess"] = {
            "grpc_s": g,
            "inprocess_s": loc,
            "ratio": g / loc,
            "grpc_cpu_s": g_cpu,
            "inprocess_cpu_s": loc_cpu,
            "cpu_ratio": g_cpu / loc_cpu,
            "target": 1.05,
        }
        out["tokens_per_s"] = tokens / loc
        out["generated_tokens"] = tokens
        reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        sample = client.generate(PROMPTS, n=2, sampling={"max_tokens": 32, "temperature": 0.8, "seed": 1})
        out["logprob_error"] = logprob_error(reference, sample, 0.8)

        torch.manual_seed(0)
        peft_model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(model),
            LoraConfig(
                r=16,
                lora_alpha=32,
                init_lora_weights=False,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            ),
        )
        adapter_dir = work / f"adapter-{engine}"
        peft_model.save_pretrained(adapter_dir)
        version = client.status().policy_version
        pushes = []
        for _ in range(rounds):
            version += 1
            start = time.perf_counter()
            client.push_lora(adapter_dir, version=version)
            pushes.append(time.perf_counter() - start)
        out["lora_push_s"] = statistics.median(pushes)
        out["lora_bytes"] = (adapter_dir / "adapter_model.safetensors").stat().st_size

        state_dict = AutoModelForCausalLM.from_pretrained(model).state_dict()
        state_dict.pop("lm_head.weight", None)  # tied to the embeddings
        nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        results = []
        for _ in range(rounds):
            version += 1
            start = time.perf_counter()
            applied = client.push_state_dict(state_dict, version=version)
            results.append((time.perf_counter() - start, applied.apply_seconds))
        total, apply = statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)
        out["full_weights"] = {
            "bytes": nbytes,
            "end_to_end_s": total,
            "end_to_end_gb_per_s": nbytes / total / 1e9,
            "apply_s": apply,
            "transfer_gb_per_s": nbytes / max(total - apply, 1e-9) / 1e9,
            "target_gb_per_s": 1.0,
        }

        shared = work / f"state-{engine}"
        shared.mkdir(exist_ok=True)
        (shared / "model.safetensors").write_bytes(state_dict_bytes(state_dict))
        loads = []
        for _ in range(rounds):
            version += 1
            start = time.perf_counter()
            client.load_weights(shared, version=version)
            loads.append(time.perf_counter() - start)
        out["load_weights_from_dir"] = {
            "s": statistics.median(loads),
            "gb_per_s": nbytes / statistics.median(loads) / 1e9,
        }

        out["sleep"] = {}
        for level in (1, 2):
            slept = client.sleep(level)
            start = time.perf_counter()
            client.wake_up(["weights"])
            if level == 2:  # the contract: push weights between waking the weights and the KV cache
                version += 1
                client.push_state_dict(state_dict, version=version)
            client.wake_up(["kv_cache"])
            wake_s = time.perf_counter() - start
            client.generate(PROMPTS[:1], n=1, sampling={"max_tokens": 4})
            out["sleep"][f"level{level}"] = {
                "rss_before_mb": slept.memory_before.rss_bytes / 1e6,
                "rss_after_mb": slept.memory_after.rss_bytes / 1e6,
                "freed_mb": (slept.memory_before.rss_bytes - slept.memory_after.rss_bytes) / 1e6,
                "wake_s": wake_s,
                "wake_includes_full_push": level == 2,
            }
        client.close()
    finally:
        server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--model", default="tests/assets/models/policy-large")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/rollout.json"))
    args = parser.parse_args()
    work = Path("/tmp/rollout-bench")
    work.mkdir(parents=True, exist_ok=True)
    report = {
        "model": args.model,
        "workload": {"prompts": len(PROMPTS), "n": N, "tokens": TOKENS, "dtype": "float32"},
        "machine": {
            "cpus": psutil.cpu_count(),
            "load_avg_1m": psutil.getloadavg()[0],
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "engines": {},
    }
    for engine in args.engines:
        report["engines"][engine] = bench_engine(engine, args.model, args.rounds, work)
        print(json.dumps(report["engines"][engine], indent=2), flush=True)
    engines = report["engines"]
    if "hf" in engines and "vllm" in engines:
        report["vllm_over_hf_tokens_per_s"] = engines["vllm"]["tokens_per_s"] / engines["hf"]["tokens_per_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
