"""Async rollout with bounded staleness, and fault tolerance, against REAL services on loopback.

- ``async_rollout: true``: the next step's completions are generated while the trainer steps; every trained
  batch is at most ``max_staleness`` versions behind the trainer's weights (read back from metrics.jsonl);
  ``max_staleness: 0`` drops every prefetch that raced a weight push and regenerates it;
- async rollout with the rollout service killed with SIGKILL mid-run and restarted: the run completes within
  the bound, on weights pushed again to the new process;
- reward service killed with SIGKILL mid-run and restarted on the same port: scoring waits, no step is lost
  and no step's reward is missing (an unscored sample would be NaN in TRL's mean, never a silent 0);
- the trainer CLI process killed with SIGKILL mid-run, then ``train --resume``: it continues from the last
  checkpoint to the same final step.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rollout_service.client import RolloutClient
from tests.integration.trainer.fixtures import CrashAndRestart, run_config
from trainer_service.config.run_config import parse_config
from trainer_service.core.types import RunState
from trainer_service.local.launcher import ServiceProcess, free_port, start_service
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.checkpoints import last_complete_checkpoint
from trainer_service.training.job import run_job

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("max_staleness", [1, 0])
def test_async_rollout_never_trains_beyond_the_staleness_bound(
    tiny_models, services, train_file, tmp_path, max_staleness
):
    steps = 5
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "async",
        services.reward.target,
        services.rollout.target,
        retry_timeout_s=120,
        max_steps=steps,
        rollout={
            "async_rollout": True,
            "max_staleness": max_staleness,
            "partial_rollouts": False,  # the batch-level rule (test_partial_rollouts.py: the per-token one)
        },
    )
    result = run_job(parse_config(config))

    assert result.state is RunState.COMPLETED and result.step == steps
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for record in records:
        staleness = record["trainer_version"] - record["policy_version"]
        assert 0 <= staleness <= max_staleness, record
        assert staleness == record["async/staleness"]
    last = records[-1]
    # Step 1 has nothing prefetched; every later step had a prefetch that was either used or dropped.
    assert last["async/prefetch_hits"] + last["async/prefetch_misses"] == steps
    assert last["async/max_staleness_seen"] <= max_staleness
    if max_staleness == 1:
        # The overlap really happened: later steps trained on batches generated during the previous step.
        assert last["async/prefetch_hits"] >= 1
        assert any(r["async/staleness"] == 1 for r in records)
    else:
        # Every prefetch ran before (or during) the push of the weights it would train against: dropped and
        # regenerated, so each step trained exactly on the trainer's current version.
        assert last["async/stale_dropped"] > 0
        assert all(r["trainer_version"] == r["policy_version"] for r in records)


def test_async_rollout_survives_a_rollout_crash_mid_run(tiny_models, services, train_file, tmp_path):
    """Async: SIGKILL the rollout service after step 2 (its prefetch and the weights streaming in the
    background are cut off) and restart it on the same port 1 s later: the prefetch is a miss, the step waits,
    pushes the weights again and generates; every step stays within the bound and trains on the restarted
    service's weights from then on."""
    port = free_port()
    model_args = ["--model", str(tiny_models["policy"]), "--engine", "hf"]
    logs = tmp_path / "logs"

    def start() -> ServiceProcess:
        return start_service("rollout_service", model_args, port=port, log_dir=logs)

    crash = CrashAndRestart(start(), start, delay_s=1.0)
    steps = 5
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "async-crash",
        services.reward.target,
        crash.service.target,
        retry_timeout_s=120,
        max_steps=steps,
        rollout={"async_rollout": True},
    )
    try:
        result = run_job(parse_config(config), sink=crash)
        crash.check()
        with RolloutClient(crash.service.target) as rollout:
            served = rollout.status().policy_version
    finally:
        crash.restarted.wait(timeout=300)
        crash.service.stop()
    assert result.state is RunState.COMPLETED and result.step == steps
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for record in records:
        assert 0 <= record["trainer_version"] - record["policy_version"] <= 1, record
    # Step 1 and a step after the crash generated synchronously.
    assert records[-1]["async/prefetch_misses"] >= 2
    # The restarted process (version 0 when it came up) serves the trainer's final weights.
    assert served == result.policy_version == records[-1]["trainer_version"] + 1


def test_reward_service_killed_and_restarted_mid_run(tiny_models, services, train_file, tmp_path):
    """SIGKILL the reward service after step 2, restart it on the same port 3 s later: step 3's scoring waits
    (the reward client retries within services.retry_timeout_s), and every step has a finite reward."""
    port = free_port()
    logs = tmp_path / "logs"

    def start() -> ServiceProcess:
        return start_service("reward_service", [], port=port, log_dir=logs)

    # The restart waits long enough that step 3's Score call finds the service down.
    crash = CrashAndRestart(start(), start, delay_s=3.0)
    config = run_config(
        tiny_models,
        train_file,
        tmp_path / "rf",
        crash.service.target,
        services.rollout.target,
        retry_timeout_s=120,
        max_steps=4,
    )
    try:
        result = run_job(parse_config(config), sink=crash)
    finally:
        crash.restarted.wait(timeout=300)
        crash.service.stop()
    crash.check()
    assert result.state is RunState.COMPLETED and result.step == 4
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        # TRL turns a missing reward (None) into NaN: a finite mean means every sample was really scored.
        assert math.isfinite(record["reward"]), record
        assert math.isfinite(record["rewards/accuracy/mean"]), record
        assert math.isfinite(record["rewards/repetition_penalty/mean"]), record


def test_trainer_process_killed_then_resumed_reaches_the_same_final_step(
    tiny_models, services, train_file, tmp_path
):
    """SIGKILL the `trainer_service train` process once checkpoint-2 exists; `train --resume` continues from
    the newest complete checkpoint (metrics of steps after it are rewritten once) and ends at max_steps. The
    next checkpoint is left as a kill mid-save leaves it (a torn trainer_state.json), whether or not the
    kill itself landed there: the resume passes over it and saves that step again."""
    output = tmp_path / "killed"
    config = run_config(
        tiny_models,
        train_file,
        output,
        services.reward.target,
        services.rollout.target,
        retry_timeout_s=120,
        max_steps=6,
        save_steps=2,
    )
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "trainer_service", "train", str(config_path)]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    metrics = output / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and first.poll() is None:
            if (output / "checkpoint-2").is_dir() and metrics.exists() and len(read_metrics(metrics)) >= 3:
                break
            time.sleep(0.05)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
    killed_at = len(read_metrics(metrics))
    assert 3 <= killed_at < 6
    assert not (output / "adapter_model.safetensors").exists()
    complete = last_complete_checkpoint(output)
    assert complete is not None
    cut_short = output / f"checkpoint-{int(complete.name.split('-')[1]) + 2}"
    cut_short.mkdir(exist_ok=True)
    (cut_short / "trainer_state.json").write_text('{"global_step": ')

    second = subprocess.run(
        [*command, "--resume"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert (output / "adapter_model.safetensors").is_file()
    state = json.loads((output / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
