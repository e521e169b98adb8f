"""The local launcher gives the rollout service a shared-memory directory, so a trainer on this host pushes
weights through it instead of the gRPC stream, and removes the directory when the services stop."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient, shares_directory
from rollout_service.types import WeightTransport
from trainer_service.local.launcher import (
    SHARED_MEMORY_PREFIX,
    SHARED_MEMORY_ROOT,
    shared_memory_dir,
    start_local_services,
)
from trainer_service.rollout.weight_transport import WeightTransports


def test_shared_memory_dir_is_private_and_under_the_root(tmp_path):
    made = shared_memory_dir(tmp_path)
    assert made is not None and made.parent == tmp_path and made.is_dir()
    assert made.name.startswith(f"{SHARED_MEMORY_PREFIX}{os.getpid()}-")
    assert made.stat().st_mode & 0o077 == 0  # mkdtemp: only this user reads the buckets
    assert shared_memory_dir(tmp_path / "missing") is None


def test_directories_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"{SHARED_MEMORY_PREFIX}{gone.pid}-abc"
    orphan.mkdir()
    (orphan / "weights-1-0").write_bytes(b"\0" * 1024)  # a bucket file its trainer never deleted
    live = tmp_path / f"{SHARED_MEMORY_PREFIX}{os.getppid()}-def"
    live.mkdir()
    other = tmp_path / "unrelated-1-x"
    other.mkdir()
    made = shared_memory_dir(tmp_path)
    assert not orphan.exists()
    assert live.is_dir() and other.is_dir() and made is not None and made.is_dir()


@pytest.mark.skipif(
    not (SHARED_MEMORY_ROOT.is_dir() and os.access(SHARED_MEMORY_ROOT, os.W_OK)),
    reason="no writable /dev/shm",
)
def test_local_rollout_service_takes_weights_through_shared_memory(tiny_models, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    state = {name: tensor + 0.01 for name, tensor in model.state_dict().items()}
    before = set(SHARED_MEMORY_ROOT.iterdir())
    with start_local_services(
        need_reward=False, need_rollout=True, model=tiny_models["policy"], log_dir=tmp_path
    ) as services:
        directory = services.weight_shm_dir
        assert directory is not None and directory.parent == SHARED_MEMORY_ROOT
        with RolloutClient(services.rollout.target, timeout_s=60) as client:
            status = client.status()
            assert status.weight_shm_dir == str(directory.resolve())
            assert shares_directory(status.weight_shm_dir, status.weight_shm_token)
            sender = WeightTransports("auto")
            try:
                version = status.policy_version + 1
                outcome = sender.push([(services.rollout.target, client)], version, state, None)
                assert not isinstance(outcome[0], Exception), outcome
                assert sender.last[services.rollout.target].transport == WeightTransport.SHARED_MEMORY
                assert client.status().policy_version == version
            finally:
                sender.close()
            assert not [p for p in directory.iterdir() if not p.name.startswith(".")]  # buckets deleted
    assert not directory.exists()
    assert set(SHARED_MEMORY_ROOT.iterdir()) <= before  # nothing of this run is left in /dev/shm
