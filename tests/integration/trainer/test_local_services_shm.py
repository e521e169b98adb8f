"""The local launcher gives the rollout service a shared-memory directory, so a trainer on this host pushes
weights through it instead of the gRPC stream, and removes the directory when the services stop."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient, shares_directory
from rollout_service.core.types import WeightTransport
from trainer_service.local.launcher import SHARED_MEMORY_ROOT, shared_memory_dir, start_local_services
from trainer_service.rollout.weight_transport import WeightTransports


def test_shared_memory_dir_is_private_and_under_the_root(tmp_path):
    made = shared_memory_dir(tmp_path)
    assert made is not None and made.parent == tmp_path and made.is_dir()
    assert made.stat().st_mode & 0o077 == 0  # mkdtemp: only this user reads the buckets
    assert shared_memory_dir(tmp_path / "missing") is None


@pytest.mark.skipif(shared_memory_dir(SHARED_MEMORY_ROOT) is None, reason="no writable /dev/shm")
def test_local_rollout_service_takes_weights_through_shared_memory(tiny_models, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["policy"])
    state = {name: tensor + 0.01 for name, tensor in model.state_dict().items()}
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
