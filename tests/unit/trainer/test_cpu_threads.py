"""CPU thread split between trainer and rollout service: only async runs on CPU with a local rollout split
(and borrow the rollout's share while it idles)."""

from __future__ import annotations

import os

import pytest

from tests.support.run_configs import merged
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.local.launcher import thread_env
from trainer_service.rollout.cpu_placement import (
    cpu_cores,
    is_loopback,
    overlap_threads,
    shares_cores_with_rollout,
    trainer_cpu_threads,
)

MINIMAL = {
    "base": "models/policy",
    "data": {"train": "train.jsonl"},
    "training": {"model": {"device": "cpu"}},
}


def config(**training):
    return parse_config({**MINIMAL, "training": merged(MINIMAL["training"], training)})


@pytest.mark.parametrize(
    ("target", "local"),
    [
        ("127.0.0.1:50051", True),
        ("127.0.1.1:1", True),
        ("localhost:50052", True),
        ("[::1]:50052", True),
        ("ipv4:127.0.0.1:9", True),
        ("10.0.0.3:50052", False),
        ("rollout.default.svc:50052", False),
        ("dns:///rollout:50052", False),
    ],
)
def test_loopback_targets_are_this_machine(target, local):
    assert is_loopback(target) is local


@pytest.mark.parametrize(("cores", "split"), [(1, (1, 1)), (2, (1, 1)), (3, (1, 2)), (16, (8, 8))])
def test_overlap_threads_split_the_cores(cores, split):
    assert overlap_threads(cores) == split


def test_cpu_cores_is_the_affinity_mask():
    assert cpu_cores() == len(os.sched_getaffinity(0)) >= 1


def test_thread_env_sizes_openmp_and_mkl():
    assert thread_env(None) == {}
    assert thread_env(3) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}


def test_trainer_threads_split_only_in_async_with_a_local_rollout():
    local, remote = "127.0.0.1:50052", "10.1.2.3:50052"
    assert trainer_cpu_threads(config(), "cpu", local) is None
    assert trainer_cpu_threads(config(rollout={"async_rollout": True}), "cpu", local) == overlap_threads()[0]
    assert trainer_cpu_threads(config(rollout={"async_rollout": True}), "cpu", remote) is None
    assert trainer_cpu_threads(config(model={"cpu_threads": 3}), "cpu", remote) == 3
    assert (
        trainer_cpu_threads(config(rollout={"async_rollout": True}, model={"cpu_threads": 2}), "cpu", local)
        == 2
    )


def test_only_the_automatic_split_borrows_the_rollout_cores():
    local, remote = "127.0.0.1:50052", "10.1.2.3:50052"
    assert shares_cores_with_rollout(config(rollout={"async_rollout": True}), "cpu", local)
    assert not shares_cores_with_rollout(config(rollout={"async_rollout": True}), "cpu", remote)
    assert not shares_cores_with_rollout(config(), "cpu", local)
    # An explicit thread count is kept as given for the whole run.
    assert not shares_cores_with_rollout(
        config(rollout={"async_rollout": True}, model={"cpu_threads": 1}), "cpu", local
    )


def test_cpu_threads_must_be_positive():
    with pytest.raises(ConfigError) as caught:
        config(model={"cpu_threads": 0})
    assert caught.value.key == "training.model.cpu_threads"
