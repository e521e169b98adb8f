"""`training.loss.importance_sampling: auto` against REAL reward and rollout (HF engine, fp32, CPU) services,
and the CPU thread split of async runs.

Sync mode with a push every step is exactly on-policy: the first batch is corrected and measured (ratio 1
within 1e-3), the next ones skip the extra forward. Async mode always corrects (batches from older weights).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_runtime.client import ChannelConfig
from tests.integration.trainer.fixtures import run_config
from trainer_service.config.run_config import parse_config
from trainer_service.local.launcher import free_port, start_local_services
from trainer_service.training.builders import Device
from trainer_service.training.callbacks import read_metrics
from trainer_service.training.importance_sampling import EXACT_RATIO_TOLERANCE
from trainer_service.training.job import importance_sampling_plan, rollout_engine, run_job

pytestmark = pytest.mark.slow


def test_auto_plan_asks_the_rollout_service_for_its_engine(tiny_models, services, train_file, tmp_path):
    channel = ChannelConfig(target=services.rollout.target)
    assert rollout_engine(channel) == "hf"
    sync = parse_config(
        run_config(tiny_models, train_file, tmp_path, services.reward.target, services.rollout.target)
    )
    assert importance_sampling_plan(sync, Device.named("cpu"), channel).mode == "verify"
    asynchronous = parse_config(
        run_config(
            tiny_models,
            train_file,
            tmp_path,
            services.reward.target,
            services.rollout.target,
            rollout={"async_rollout": True},
        )
    )
    assert importance_sampling_plan(asynchronous, Device.named("cpu"), channel).mode == "on"
    # A service that does not answer: the engine is unknown, so the correction stays on.
    nobody = ChannelConfig(target=f"127.0.0.1:{free_port()}", retry_max_attempts=1)
    assert rollout_engine(nobody) is None
    assert importance_sampling_plan(sync, Device.named("cpu"), nobody).mode == "on"


def test_sync_auto_verifies_the_first_batch_then_skips_the_correction(
    tiny_models, services, train_file, tmp_path
):
    config = parse_config(
        run_config(
            tiny_models,
            train_file,
            tmp_path / "sync",
            services.reward.target,
            services.rollout.target,
            max_steps=3,
        )
    )
    records = read_metrics(run_job(config).metrics_path)
    assert [r["sampling/importance_sampling_applied"] for r in records] == [1.0, 0.0, 0.0]
    first = records[0]
    assert first["sampling/importance_sampling_ratio/min"] >= 1 - EXACT_RATIO_TOLERANCE
    assert first["sampling/importance_sampling_ratio/max"] <= 1 + EXACT_RATIO_TOLERANCE
    assert first["sampling/sampling_logp_difference/max"] < 1e-4
    assert all("sampling/importance_sampling_ratio/mean" not in r for r in records[1:])


def test_async_auto_corrects_every_batch(tiny_models, services, train_file, tmp_path):
    config = parse_config(
        run_config(
            tiny_models,
            train_file,
            tmp_path / "async",
            services.reward.target,
            services.rollout.target,
            max_steps=3,
            rollout={"async_rollout": True},
        )
    )
    threads = torch.get_num_threads()
    records = read_metrics(run_job(config).metrics_path)
    assert [r["sampling/importance_sampling_applied"] for r in records] == [1.0, 1.0, 1.0]
    assert all("sampling/importance_sampling_ratio/mean" in r for r in records)
    # The async job split the cores with the loopback rollout service, then gave the caller its threads back.
    assert torch.get_num_threads() == threads


def test_local_rollout_service_starts_with_the_requested_threads(tiny_models, tmp_path):
    with start_local_services(
        need_reward=False, need_rollout=True, model=tiny_models["policy"], log_dir=tmp_path, rollout_threads=1
    ) as local:
        environ = Path(f"/proc/{local.rollout.process.pid}/environ").read_bytes().split(b"\0")
    assert b"OMP_NUM_THREADS=1" in environ and b"MKL_NUM_THREADS=1" in environ
