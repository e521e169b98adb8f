"""GRPO with FSDP2 on two CPU processes (torchrun, gloo) against REAL reward and rollout services on loopback.

Each rank holds half of every sharded parameter; a weight push gathers the full tensors on every rank before
rank 0 sends them (trainer_service/rollout/full_weights.py). Checked for a LoRA adapter and a full fine-tune:
the run ends (a hang kills the process group and fails), FSDP really ran (its checkpoint files, not DDP's),
every step trained on the version pushed for it, and what the replica serves at the end is the trainer's
final model: its greedy completions' log-probs equal those of the saved model, recomputed here, and differ
from the base model's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient
from rollout_service.types import WeightFormat
from tests.integration.trainer.fixtures import run_config
from trainer_service.local.launcher import LocalServices, free_port, start_local_services, start_service
from trainer_service.training.callbacks import read_metrics

pytestmark = pytest.mark.slow

# Generous: the run takes well under a minute on an idle machine; this only proves it did not hang.
DID_NOT_HANG_S = 420.0
# Token-id prompts for the replica and the in-process recomputation (no chat template in between).
PROMPTS = [[1, 5, 9, 17, 33], [100, 200, 300], [7, 7, 7, 42]]
FSDP = {"transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}


@pytest.fixture(scope="module")
def reward(tmp_path_factory) -> LocalServices:
    with start_local_services(
        need_reward=True, need_rollout=False, model="", log_dir=tmp_path_factory.mktemp("fsdp-logs")
    ) as local:
        yield local


def torchrun(config: Path, log: Path, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node N -m trainer_service train CONFIG``, output in ``log``; a run still going
    after DID_NOT_HANG_S has its whole process group killed and fails the test with the log's tail."""
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "trainer_service",
        "train",
        str(config),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=DID_NOT_HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            tail = log.read_text()[-3000:]
            pytest.fail(f"the FSDP run hung (killed after {DID_NOT_HANG_S:.0f} s):\n{tail}")
    return subprocess.CompletedProcess(command, returncode)


def token_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(tokens[i] | prompt, tokens[:i]) under ``model`` (untempered: greedy completions)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.mark.parametrize("lora", [{"r": 4, "alpha": 8}, {"r": 0}], ids=["lora", "full"])
def test_fsdp_on_two_cpu_processes_pushes_the_full_weights(tiny_models, reward, train_file, tmp_path, lora):
    rollout = start_service(
        "rollout_service",
        ["--model", str(tiny_models["policy"]), "--engine", "hf"],
        port=free_port(),
        log_dir=tmp_path / "logs",
    )
    try:
        with RolloutClient(rollout.target) as client:
            before = client.status().policy_version
        output = tmp_path / "run"
        config = run_config(
            tiny_models,
            train_file,
            output,
            reward.reward.target,
            rollout.target,
            max_steps=2,
            save_steps=2,
            # Rewards that differ within a group (character lengths), so both steps move the weights.
            rewards={"reward_fn": "cosine"},
            optimizer={"learning_rate": 1e-2},
            model={"lora": lora, "fsdp_config": FSDP},
        )
        path = tmp_path / "fsdp.yaml"
        path.write_text(yaml.safe_dump(config))
        log = tmp_path / "torchrun.log"
        done = torchrun(path, log)
        assert done.returncode == 0, log.read_text()[-3000:]
        with RolloutClient(rollout.target) as client:
            status = client.status()
            served = client.generate(PROMPTS, sampling={"temperature": 0.0, "max_tokens": 12})
    finally:
        rollout.stop()

    # FSDP, not DDP: the checkpoint holds FSDP's model and optimizer files.
    checkpoint = output / "checkpoint-2"
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file()
    assert (checkpoint / "optimizer.bin").is_file() and not (checkpoint / "optimizer.pt").exists()

    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in records)
    # Pushes: train begin + one per optimizer step; step k trained on the version pushed before it.
    assert [int(r["policy_version"]) for r in records] == [before + 1, before + 2]
    assert status.policy_version == before + 3 and status.weights_valid
    assert status.weight_format is (WeightFormat.STATE_DICT if lora["r"] == 0 else WeightFormat.LORA_ADAPTER)

    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).eval()
    if lora["r"] == 0:
        trained = AutoModelForCausalLM.from_pretrained(output).eval()
    else:
        trained = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_models["policy"]), output
        ).eval()
    moved = 0.0
    for prompt, completion in zip(PROMPTS, served, strict=True):
        assert len(completion.token_ids) == 12
        replica = torch.tensor(completion.logprobs)
        # The replica serves exactly the trainer's final weights (shards would not even load) ...
        expected = token_logprobs(trained, prompt, completion.token_ids)
        torch.testing.assert_close(replica, expected, rtol=0, atol=1e-4)
        moved = max(moved, (replica - token_logprobs(base, prompt, completion.token_ids)).abs().max().item())
    # ... and those are not the base weights: training moved the log-probs far beyond the tolerance.
    assert moved > 1e-2
