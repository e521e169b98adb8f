"""Weight push benchmark: full-weight and LoRA pushes over each transport of the weight data plane.

    python bench/weight_push_bench.py [--transport grpc shared_memory distributed] [--backend gloo|nccl]
                                      [--device cpu|cuda] [--rounds 3] [--out bench/results/weight_push.json]

A rollout service (HF engine) runs as its own process on 127.0.0.1, as it runs beside a trainer,
serving a Qwen2 model built here from a config (random weights, no download; ~0.8 GB of float32 by
default). This process is the trainer: it pushes a full state dict of new weights through
:class:`trainer_service.rollout.weight_transport.WeightTransports`, the code a training run uses,
with the transport forced, and times each push from the call to its return (the replica answers
once the new weights serve; a 1-token Generate after each push checks that they do). Per transport:
median seconds, GB/s, the replica's transfer / apply split, the ratio to the gRPC stream of the same
run, a projected 7B bf16 push (14 GB at the measured rate), and the push of a rank-16 LoRA adapter on
every attention projection. Shared memory needs the replica started with ``--weight-shm-dir`` (done
here, in /dev/shm); the distributed transport runs against a replica without one (else the sender
prefers shared memory). The results file is written whole, with the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_runtime.call_errors import UnavailableError
from rollout_service.client import RolloutClient
from tiny_models.tokenizer import build_tokenizer
from trainer_service.rollout.weight_transport import WeightTransports

TRANSPORTS = ("grpc", "shared_memory", "distributed")
PROJECTED_BYTES = 14e9  # a 7B model in bfloat16
LORA_RANK = 16
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def build_model(directory: Path, hidden: int, layers: int) -> Path:
    """A Qwen2 model of random weights saved in ``directory`` (tied embeddings, float32)."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def new_weights(directory: Path, device: str) -> dict[str, torch.Tensor]:
    """Every parameter of the model, changed (the tied lm_head is the embedding: left out)."""
    model = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    out = {}
    for name, tensor in model.state_dict().items():
        if name != "lm_head.weight":
            out[name] = (tensor + 0.01 * torch.randn(tensor.shape, generator=generator)).to(device)
    return out


def lora_adapter(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """A rank-16 PEFT adapter on every attention projection (small random A and B)."""
    generator = torch.Generator().manual_seed(2)
    tensors: dict[str, torch.Tensor] = {}
    modules = sorted(
        name.removesuffix(".weight")
        for name in weights
        if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS
    )
    for module in modules:
        out_features, in_features = weights[f"{module}.weight"].shape
        device = weights[f"{module}.weight"].device
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = (
            0.01 * torch.randn(LORA_RANK, in_features, generator=generator)
        ).to(device)
        tensors[f"{prefix}.lora_B.weight"] = (
            0.01 * torch.randn(out_features, LORA_RANK, generator=generator)
        ).to(device)
    config = {
        "peft_type": "LORA",
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "target_modules": list(PROJECTIONS),
    }
    return tensors, config


@contextmanager
def rollout_service(model: Path, device: str, shm_dir: Path | None):
    """``python -m rollout_service`` on a free loopback port; yields its address once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "rollout_service", "--port", str(port), "--model", str(model)]
    command += ["--engine", "hf", "--device", device]
    if shm_dir is not None:
        command += ["--weight-shm-dir", str(shm_dir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    service = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        with RolloutClient(address, timeout_s=600) as client:
            deadline = time.monotonic() + 600
            while True:
                try:
                    client.status()
                    break
                except UnavailableError:
                    if time.monotonic() > deadline or service.poll() is not None:
                        raise
                    time.sleep(0.5)
        yield address
    finally:
        service.terminate()
        service.wait(timeout=120)


def measure(
    address: str, mode: str, weights: dict, lora: tuple[dict, dict], rounds: int, backend: str, device: str
) -> dict:
    """``rounds`` full-weight pushes and ``rounds`` LoRA pushes to one replica through ``mode``."""
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    sender = WeightTransports(mode, backend=backend, device=device)
    full, lora_s, split = [], [], []
    try:
        with RolloutClient(address, timeout_s=600) as client:
            version = client.status().policy_version
            # Round 0 warms up (opens the channel or group, maps the files, faults the buffers in).
            for round_index in range(rounds + 1):
                version += 1
                start = time.perf_counter()
                (outcome,) = sender.push([(address, client)], version, weights, None)
                elapsed = time.perf_counter() - start
                if isinstance(outcome, Exception):
                    raise outcome
                client.generate([[5, 6, 7]], n=1, sampling={"max_tokens": 1})
                record = sender.last[address]
                if record.transport.name.lower() != _transport_name(mode):
                    raise RuntimeError(f"{mode} push went over {record.transport.name}")
                if round_index:
                    full.append(elapsed)
                    split.append((getattr(outcome, "transfer_seconds", None), outcome.apply_seconds))
            for round_index in range(rounds + 1):
                version += 1
                start = time.perf_counter()
                (outcome,) = sender.push([(address, client)], version, lora[0], lora[1])
                elapsed = time.perf_counter() - start
                if isinstance(outcome, Exception):
                    raise outcome
                if round_index:
                    lora_s.append(elapsed)
    finally:
        sender.close()
    median = statistics.median(full)
    transfers = [t for t, _ in split if t is not None]
    return {
        "bytes": nbytes,
        "end_to_end_s": median,
        "end_to_end_gb_per_s": nbytes / median / 1e9,
        "rounds_end_to_end_s": full,
        "replica_transfer_s": statistics.median(transfers) if transfers else None,
        "replica_apply_s": statistics.median(a for _, a in split),
        "projected_7b_bf16_s": PROJECTED_BYTES / (nbytes / median),
        "lora_push_s": statistics.median(lora_s),
        "lora_bytes": sum(t.numel() * t.element_size() for t in lora[0].values()),
    }


def _transport_name(mode: str) -> str:
    return {"grpc": "grpc_stream", "shared_memory": "shared_memory", "distributed": "torch_distributed"}[mode]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/weight_push.json"))
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    transports = ["grpc"] + [t for t in args.transport if t != "grpc"]  # the stream is the baseline
    work = Path(tempfile.mkdtemp(prefix="weight-push-bench-"))
    shm_dir = Path(tempfile.mkdtemp(prefix="weight-push-bench-", dir="/dev/shm"))
    results: dict[str, dict] = {}
    try:
        model = build_model(work / "model", args.hidden, args.layers)
        weights = new_weights(model, args.device)
        lora = lora_adapter(weights)
        skipped = {}
        if "distributed" in transports and args.backend == "nccl" and torch.cuda.device_count() < 2:
            # NCCL refuses two ranks on one GPU ("duplicate GPU"): such a host uses shared memory instead.
            skipped["distributed"] = "nccl needs two GPUs; measured shared memory, the one-GPU path, instead"
            transports = [t for t in transports if t != "distributed"] + ["shared_memory"]
        with_shm = list(dict.fromkeys(t for t in transports if t != "distributed"))
        if with_shm:
            with rollout_service(model, args.device, shm_dir) as address:
                for mode in with_shm:
                    results[mode] = measure(
                        address, mode, weights, lora, args.rounds, args.backend, args.device
                    )
        if "distributed" in transports:
            replica_device = "cuda:1" if args.backend == "nccl" else args.device
            with rollout_service(model, replica_device, None) as address:
                results["distributed"] = measure(
                    address, "distributed", weights, lora, args.rounds, args.backend, args.device
                )
        leftovers = sorted(p.name for p in shm_dir.iterdir() if not p.name.startswith("."))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
    baseline = results["grpc"]["end_to_end_s"]
    for entry in results.values():
        entry["speedup_vs_grpc"] = baseline / entry["end_to_end_s"]
    report = {
        "what": "full-weight push, trainer call -> new weights serving; HF rollout service, own process",
        "model": {
            "hidden_size": args.hidden,
            "layers": args.layers,
            "parameters": sum(t.numel() for t in weights.values()),
            "dtype": "float32",
        },
        "device": args.device,
        "backend": args.backend,
        "rounds": args.rounds,
        "target_gb_per_s": 1.5,
        "transports": results,
        "skipped": skipped,
        "shm_files_left_behind": leftovers,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        },
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, entry in results.items():
        print(
            f"{name:14s} {entry['end_to_end_s']:.3f} s  {entry['end_to_end_gb_per_s']:.2f} GB/s  "
            f"x{entry['speedup_vs_grpc']:.2f} vs grpc  7B bf16 ~{entry['projected_7b_bf16_s']:.1f} s  "
            f"LoRA {entry['lora_push_s'] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
