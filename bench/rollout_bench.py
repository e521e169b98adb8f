"""Rollout service benchmark: gRPC overhead, engine throughput, weight push and sleep/wake.

    python bench/rollout_bench.py [--engines hf vllm] [--model tests/assets/models/policy-large]
                                  [--out bench/results/rollout.json] [--only weights]

``--only weights`` measures only the weight paths (LoRA push, full-weight stream, LoadWeights)
and writes them, whole, to their own file (default ``bench/results/rollout_weights.json``): every
results file comes from one run, with the 1-minute load average at its start and end.

Per engine (one service each, started in this process on 127.0.0.1):
- ``grpc_vs_inprocess``: the same Generate (8 prompts × n=8 × 64 tokens, fixed length via
  min_tokens) through gRPC with RolloutClient vs RolloutCore.generate called in-process on the
  server's event loop; median of alternating rounds, wall time and CPU time of the process tree
  (steadier on a shared machine); target ratio ≤ 1.05.
- ``tokens_per_s``: generated tokens / wall time of that Generate.
- ``lora_push_s``: RolloutClient.push_lora of a rank-16 adapter on every linear layer, median.
- ``full_weights``: RolloutClient.push_state_dict of the whole model (fp32, tied lm_head left
  out), median of rounds. ``end_to_end_s``: from the state dict in the caller's memory to the
  new weights serving (encode, SHA-256 on both sides, stream, validate, apply). It splits into
  ``client_prepare_s`` (encoding the safetensors header and hashing the tensors, measured
  alone: the header carries the SHA-256, so it precedes the first chunk), ``apply_s`` (the
  server's "last chunk → serving": checksum compare, parse, validate, apply) and ``stream_s``
  (the rest: the chunks on the wire, copied into the receive buffer and hashed as they come);
  ``transfer_gb_per_s`` = bytes / stream_s. ``cpu_s``: CPU seconds of the process tree per
  push (client and server share this process). ``baseline_generated_stub``: the same push
  built the straightforward way, side by side: ``safetensors.torch.save`` to bytes, hashlib,
  16 MiB ``WeightChunk`` messages through the generated stub (the service side is the same).
  ``server_in_own_process`` (HF): the same push to a service started as its own process, as
  it runs next to a trainer (in this process the client and the server share one GIL).
- ``logprob_error``: max over completions of mean |logprob − log_softmax(logits / T)| from a
  fresh transformers forward pass (fp32), base weights.
- ``load_weights_from_dir``: LoadWeights of the same state dict from a local directory (the
  path for large models on a shared volume).
- ``sleep``: RSS freed by Sleep(level) and the time WakeUp takes, for levels 1 and 2.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import psutil
import torch
from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from peft import LoraConfig, get_peft_model
from safetensors.torch import save as safetensors_save
from transformers import AutoModelForCausalLM

from grpo_runtime.call_errors import UnavailableError
from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer
from rollout_service.client import CHUNK_BYTES, RolloutClient
from rollout_service.server import binding, build_core
from rollout_service.settings import RolloutSettings
from rollout_service.types import GenerateRequest, PromptInput, SamplingSpec
from rollout_service.weight_plane.payload import encode
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


def push_with_generated_stub(stub, state_dict: dict[str, torch.Tensor], version: int) -> None:
    """The straightforward push: one serialized file, one hash, 16 MiB messages (the baseline)."""
    data = safetensors_save({k: v.contiguous() for k, v in state_dict.items()})
    header = {
        "version": version,
        "format": rollout_pb2.WEIGHT_FORMAT_STATE_DICT,
        "total_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    step = 16 * 1024 * 1024
    chunks = (
        rollout_pb2.WeightChunk(data=data[i : i + step], **(header if i == 0 else {}))
        for i in range(0, len(data), step)
    )
    stub.UpdateWeights(chunks, timeout=600)


def push_to_own_process(model: str, state_dict: dict[str, torch.Tensor], rounds: int) -> dict:
    """push_state_dict to an HF rollout service in its own process, as deployed next to a trainer
    (in-process, client and server share one interpreter lock)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "rollout_service", "--port", str(port), "--model", model]
    command += ["--engine", "hf"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    service = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = RolloutClient(f"127.0.0.1:{port}", timeout_s=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                version = client.status().policy_version
                break
            except UnavailableError:  # not listening yet
                if time.monotonic() > deadline or service.poll() is not None:
                    raise
                time.sleep(0.5)
        pushes = []
        for _ in range(rounds):
            version += 1
            start = time.perf_counter()
            applied = client.push_state_dict(state_dict, version=version)
            pushes.append((time.perf_counter() - start, applied.apply_seconds))
        client.close()
    finally:
        service.terminate()
        service.wait(timeout=60)
    nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    total = statistics.median(p[0] for p in pushes)
    return {
        "end_to_end_s": total,
        "end_to_end_gb_per_s": nbytes / total / 1e9,
        "apply_s": statistics.median(p[1] for p in pushes),
        "rounds_end_to_end_s": [p[0] for p in pushes],
    }


def bench_weights(
    client: RolloutClient,
    address: str,
    model: str,
    rounds: int,
    work: Path,
    engine: str,
    out: dict,
) -> tuple[int, dict[str, torch.Tensor]]:
    """LoRA push, full-weight stream and LoadWeights; returns (last version, the state dict)."""
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
    stub = rollout_pb2_grpc.RolloutServiceStub(grpc.insecure_channel(address))
    pushes, prepares, baseline = [], [], []
    for _ in range(rounds):
        version += 1
        wall, cpu = time.perf_counter(), tree_cpu_seconds()
        applied = client.push_state_dict(state_dict, version=version)
        pushes.append((time.perf_counter() - wall, tree_cpu_seconds() - cpu, applied.apply_seconds))
        prepares.append(timed(lambda: encode(state_dict).sha256)[0])
        version += 1
        baseline.append(timed(partial(push_with_generated_stub, stub, state_dict, version)))
    total = statistics.median(p[0] for p in pushes)
    apply = statistics.median(p[2] for p in pushes)
    prepare = statistics.median(prepares)
    stream = total - prepare - apply
    out["full_weights"] = {
        "bytes": nbytes,
        "end_to_end_s": total,
        "end_to_end_gb_per_s": nbytes / total / 1e9,
        "client_prepare_s": prepare,
        "stream_s": stream,
        "transfer_gb_per_s": nbytes / stream / 1e9,
        "apply_s": apply,
        "cpu_s": statistics.median(p[1] for p in pushes),
        "rounds_end_to_end_s": [p[0] for p in pushes],
        "chunk_bytes": CHUNK_BYTES,
        "baseline_generated_stub": {
            "end_to_end_s": statistics.median(b[0] for b in baseline),
            "end_to_end_gb_per_s": nbytes / statistics.median(b[0] for b in baseline) / 1e9,
            "cpu_s": statistics.median(b[1] for b in baseline),
        },
        "speedup_vs_baseline": statistics.median(b[0] for b in baseline) / total,
        "cpu_ratio_vs_baseline": statistics.median(b[1] for b in baseline)
        / statistics.median(p[1] for p in pushes),
        "load_avg_1m": psutil.getloadavg()[0],
        "target_gb_per_s": 1.0,
    }

    if engine == "hf":
        out["full_weights"]["server_in_own_process"] = push_to_own_process(model, state_dict, rounds)

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

    return version, state_dict


def bench_engine(engine: str, model: str, rounds: int, work: Path, only_weights: bool = False) -> dict:
    settings = RolloutSettings(
        model=model, engine=engine, max_model_len=512, weights_root=str(work), vllm={"max_lora_rank": 16}
    )
    return asyncio.run(serve_and_measure(settings, rounds, only_weights))


async def serve_and_measure(settings: RolloutSettings, rounds: int, only_weights: bool) -> dict:
    """The service on this thread's event loop, assembled as ``python -m rollout_service`` assembles it; the
    measurements (blocking clients, as TRL calls them) in a thread of their own."""
    start = time.perf_counter()
    core = await build_core(settings)
    config = ServerConfig(host="127.0.0.1", port=0)
    async with GrpcServer(config, [binding(core)], on_shutdown=core.close) as server:
        out: dict = {"engine": settings.engine, "start_s": time.perf_counter() - start}
        loop = asyncio.get_running_loop()

        def in_process(request: GenerateRequest) -> None:
            asyncio.run_coroutine_threadsafe(core.generate(request), loop).result()

        # Not the loop's default executor: the core runs its engine calls there.
        with ThreadPoolExecutor(1, thread_name_prefix="bench") as measurer:
            run = partial(measure, server.address, in_process, settings, rounds, only_weights, out)
            await loop.run_in_executor(measurer, run)
    return out


def measure(
    address: str,
    in_process: Callable[[GenerateRequest], None],
    settings: RolloutSettings,
    rounds: int,
    only_weights: bool,
    out: dict,
) -> None:
    """Every figure of the service at ``address`` into ``out``; ``in_process(request)`` runs
    RolloutCore.generate on the server's event loop."""
    model, work, engine = settings.model, Path(settings.weights_root), settings.engine
    with RolloutClient(address, timeout_s=600) as client:
        if only_weights:
            bench_weights(client, address, model, rounds, work, engine, out)
            return
        request = GenerateRequest(
            prompts=tuple(PromptInput(id=str(i), text=p) for i, p in enumerate(PROMPTS)),
            n=N,
            sampling=SamplingSpec(**SAMPLING),
        )
        client.generate(PROMPTS, n=N, sampling=SAMPLING)  # warm-up
        grpc_runs, local_runs = [], []
        for _ in range(rounds):
            grpc_runs.append(timed(lambda: client.generate(PROMPTS, n=N, sampling=SAMPLING)))
            local_runs.append(timed(partial(in_process, request)))
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

        version, state_dict = bench_weights(client, address, model, rounds, work, engine, out)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--model", default="tests/assets/models/policy-large")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/rollout[_weights].json")
    parser.add_argument("--only", choices=["weights"], default=None, help="measure only these parts")
    args = parser.parse_args()
    if args.out is None:
        args.out = Path("bench/results/rollout_weights.json" if args.only else "bench/results/rollout.json")
    work = Path("/tmp/rollout-bench")
    work.mkdir(parents=True, exist_ok=True)
    if args.only == "weights":
        weights_only(args, work)
        return
    report = {
        "model": args.model,
        "workload": {"prompts": len(PROMPTS), "n": N, "tokens": TOKENS, "dtype": "float32"},
        "machine": {
            "cpus": psutil.cpu_count(),
            "load_avg_1m_at_start": psutil.getloadavg()[0],
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
    report["machine"]["load_avg_1m_at_end"] = psutil.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


WEIGHT_KEYS = ("lora_push_s", "lora_bytes", "full_weights", "load_weights_from_dir")


def weights_only(args: argparse.Namespace, work: Path) -> None:
    """Measure the weight paths alone and write them as a results file of their own."""
    report = {
        "model": args.model,
        "measured": list(WEIGHT_KEYS),
        "rounds": args.rounds,
        "machine": {"cpus": psutil.cpu_count(), "load_avg_1m_at_start": psutil.getloadavg()[0]},
        "engines": {},
    }
    for engine in args.engines:
        fresh = bench_engine(engine, args.model, args.rounds, work, only_weights=True)
        report["engines"][engine] = {k: fresh[k] for k in WEIGHT_KEYS}
        print(json.dumps(report["engines"][engine], indent=2), flush=True)
    report["machine"]["load_avg_1m_at_end"] = psutil.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
