"""Sleep mode around a generation: wake → push → generate → sleep, with an in-memory replica set that records
the calls in order (the real services run the same path in the sleep-mode training runs)."""

from __future__ import annotations

import grpc
import pytest
import torch

from grpo_runtime.call_errors import InvalidArgumentError
from tests.support.one_replica import ADDRESS, OneReplica, ServingReplica, trainer_with
from trainer_service.rollout.policy_versions import WeightPushError
from trainer_service.rollout.replicas import ReplicaAddress
from trainer_service.rollout.weight_sync import WeightSync


class SleepyReplica(ServingReplica):
    """One replica that records wake, push and sleep calls; it serves ``version``."""

    def __init__(self, version: int = 0) -> None:
        super().__init__(version)
        self.calls: list[str] = []
        self.refuse = False

    def wake_up(self) -> None:
        self.calls.append("wake")

    def push_weights(self, payload, version, fmt, adapter_config) -> None:
        if self.refuse:
            raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "test")
        self.calls.append(f"push {version}")
        self.version = version

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep {level}")


def test_each_generation_wakes_pushes_generates_and_sleeps_at_the_level():
    replica = SleepyReplica()
    sync = WeightSync(OneReplica(replica), sleep_mode=True, sleep_level=2)
    trainer = trainer_with(torch.nn.Linear(2, 2))
    sync.on_train_begin(trainer)
    sync.after_optimizer_step(trainer)
    assert replica.calls == []  # nothing is pushed to a sleeping engine
    for expected in (1, 2):
        with sync.generation(trainer) as version:
            assert version == expected and sync.ready == [ReplicaAddress(ADDRESS)]
            assert replica.calls[-2:] == ["wake", f"push {expected}"]
        assert replica.calls[-1] == "sleep 2"
    assert replica.calls == ["wake", "push 1", "sleep 2", "wake", "push 2", "sleep 2"]


def test_a_generation_that_fails_still_puts_the_replicas_to_sleep():
    replica = SleepyReplica()
    sync = WeightSync(OneReplica(replica), sleep_mode=True)
    trainer = trainer_with(torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="generation failed"), sync.generation(trainer):
        raise RuntimeError("generation failed")
    assert replica.calls == ["wake", "push 1", "sleep 1"]


def test_a_refused_push_after_the_wake_fails_before_generating():
    replica = SleepyReplica()
    replica.refuse = True
    sync = WeightSync(OneReplica(replica), sleep_mode=True)
    trainer = trainer_with(torch.nn.Linear(2, 2))
    generated = False
    with pytest.raises(WeightPushError, match="refused"), sync.generation(trainer):
        generated = True
    assert not generated and replica.calls == ["wake"]


def test_sync_off_learns_the_served_version_once_and_pushes_nothing():
    replica = SleepyReplica(version=7)
    sync = WeightSync(OneReplica(replica), enabled=False, sleep_mode=True)
    trainer = trainer_with(torch.nn.Linear(2, 2))
    sync.on_train_begin(trainer)
    for _ in range(2):
        with sync.generation(trainer) as version:
            assert version == 7
    assert replica.calls == ["wake", "sleep 1", "wake", "sleep 1"]
