"""A shared-memory directory too small for the weights: the trainer's sender streams them instead.

The replica's ``weight_shm_dir`` is a real 1 MiB tmpfs and the tiny policy's weights are ~2 MiB, so writing
the bucket files fails with ENOSPC (the sender checks the free space before it reserves any). The push must
still commit over the ``UpdateWeights`` stream, leave no bucket file in the directory, and a later push that
fits goes over shared memory again. Mounting needs root (CI runs as root); elsewhere the test is skipped.
"""

from __future__ import annotations

import errno
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollout_service.client import RolloutClient, shares_directory
from rollout_service.settings import RolloutSettings
from rollout_service.types import WeightTransport
from rollout_service.weight_plane.buckets import plan_buckets
from rollout_service.weight_plane.shared_memory import BucketFiles
from tests.integration.rollout.fixtures import rollout_server_thread
from trainer_service.rollout.weight_transport import WeightTransports

TMPFS_BYTES = 1 << 20
BUCKET_BYTES = 256 << 10  # the first buckets fit into the tmpfs, a later one does not


@pytest.fixture(scope="module")
def tiny_tmpfs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0755", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        # Lazily if a mapping is still open (a failing test), so no mount outlives the session.
        if subprocess.run(["umount", str(directory)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], check=True)


@pytest.fixture(scope="module")
def server(tiny_models, tiny_tmpfs):
    settings = RolloutSettings(model=str(tiny_models["policy"]), engine="hf", weight_shm_dir=str(tiny_tmpfs))
    with rollout_server_thread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with RolloutClient(server.address, timeout_s=60) as c:
        c.wait_ready(10)
        yield c


def _buckets(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".bucket")


def _assert_serving(server, weights: dict[str, torch.Tensor]) -> None:
    live = server.core.engine.model.state_dict()
    assert all(torch.equal(live[name], tensor) for name, tensor in weights.items())


def test_weights_larger_than_the_shm_directory_are_streamed(server, client, tiny_models, tiny_tmpfs):
    status = client.status()
    assert WeightTransport.SHARED_MEMORY in status.weight_transports
    assert shares_directory(status.weight_shm_dir, status.weight_shm_token)  # so shared memory is chosen
    base = AutoModelForCausalLM.from_pretrained(tiny_models["policy"]).state_dict()
    base.pop("lm_head.weight")  # tied to the embeddings
    weights = {name: tensor * 1.25 for name, tensor in base.items()}
    plan = plan_buckets(weights, BUCKET_BYTES)
    assert plan.bucket_bytes[0] < TMPFS_BYTES < plan.total_bytes

    sender = WeightTransports("shared_memory", bucket_bytes=BUCKET_BYTES)
    try:
        version = status.policy_version + 1
        (outcome,) = sender.push([(server.address, client)], version, weights, None)
        assert not isinstance(outcome, Exception), outcome
        assert outcome.policy_version == version and outcome.tensors_loaded == len(weights)
        assert sender.last[server.address].transport == WeightTransport.GRPC_STREAM
        assert client.status().policy_version == version
        _assert_serving(server, weights)
        assert _buckets(tiny_tmpfs) == []  # the buckets reserved before ENOSPC are gone too

        # Weights that fit go over shared memory again: the fallback was for that push only.
        layer = "model.layers.0.self_attn."
        small = {name: tensor * 0.5 for name, tensor in weights.items() if name.startswith(layer)}
        (outcome,) = sender.push([(server.address, client)], version + 1, small, None)
        assert not isinstance(outcome, Exception), outcome
        assert sender.last[server.address].transport == WeightTransport.SHARED_MEMORY
        assert outcome.transport == WeightTransport.SHARED_MEMORY
        assert client.status().policy_version == version + 1
        _assert_serving(server, small)
    finally:
        sender.close()
    assert _buckets(tiny_tmpfs) == []


def test_bucket_files_refuse_before_reserving_any_when_the_directory_is_too_small(tiny_tmpfs):
    weights = {f"layer{i}.weight": torch.ones(64, 1024) for i in range(8)}  # 2 MiB in 256 KiB buckets
    plan = plan_buckets(weights, BUCKET_BYTES)
    assert plan.bucket_bytes[0] < TMPFS_BYTES < plan.total_bytes
    files = BucketFiles(tiny_tmpfs)
    try:
        with pytest.raises(OSError) as refused:
            files.write(weights, plan)
        assert refused.value.errno == errno.ENOSPC
        assert _buckets(tiny_tmpfs) == []  # not the buckets that fitted, kept until close()
    finally:
        files.close()
