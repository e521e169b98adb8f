"""The weight push of single-process runs, streamed in a thread: when the version is given, when the
replicas count as serving it, who waits for it (an async prefetch, a generation without overlap, the next
optimizer step), who does not (a sync run's generation whose requests carry the version), and how its
failures reach the trainer.

The replica set is an in-memory stand-in whose push blocks until the test lets it through, so every ordering
is checked deterministically; the real services run the same path in the async integration tests.
"""

from __future__ import annotations

import logging
import threading

import grpc
import pytest
import torch

from grpo_runtime.call_errors import InvalidArgumentError, UnavailableError
from tests.support.one_replica import ADDRESS, OneReplica, ServingReplica, trainer_with
from trainer_service.rollout.policy_versions import WeightPushError
from trainer_service.rollout.replicas import ReplicaAddress, RolloutUnavailable
from trainer_service.rollout.weight_sync import WeightSync, WeightSyncCallback


class GatedReplica(ServingReplica):
    """One replica whose PushWeights waits for ``gate`` and then applies the version or raises ``error``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.error: Exception | None = None
        self.pushed: list[tuple[int, bytes]] = []

    def push_weights(self, payload, version, fmt, adapter_config) -> None:
        self.entered.set()
        assert self.gate.wait(timeout=10)
        if self.error is not None:
            raise self.error
        self.pushed.append((version, payload.to_bytes()))
        self.version = version


@pytest.fixture
def setup():
    replica = GatedReplica()
    sync = WeightSync(OneReplica(replica), background=True)
    trainer = trainer_with(torch.nn.Linear(4, 4))
    replica.gate.set()
    sync.push(trainer)  # train begin: synchronous, version 1
    replica.gate.clear()
    return sync, replica, trainer


def test_the_version_is_given_at_once_and_the_replicas_serve_it_after_the_transfer(setup):
    sync, replica, trainer = setup
    assert sync.current_version == 1 and not sync.push_pending

    sync.after_optimizer_step(trainer)
    assert replica.entered.wait(timeout=10)
    # The trainer's weights are version 2 from now on (the staleness bound is judged against it) ...
    assert sync.current_version == 2 and sync.transferring and sync.push_pending
    # ... but no replica serves it yet.
    assert replica.version == 1

    waiter = threading.Thread(target=sync.wait_for_transfer)
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive()  # a prefetch waits for the weights before generating
    replica.gate.set()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert replica.version == 2 and not sync.push_pending and sync.ready == [ReplicaAddress(ADDRESS)]
    sync.settle_transfer()
    assert not sync.transferring and sync.pushes == 2


def test_the_optimizer_step_waits_for_the_tensors_being_streamed(setup):
    sync, replica, trainer = setup
    callback = WeightSyncCallback(sync)
    callback.bind(trainer)
    sync.after_optimizer_step(trainer)
    assert replica.entered.wait(timeout=10)
    settled = threading.Event()

    def optimizer_step() -> None:
        callback.on_pre_optimizer_step(None, None, None)
        settled.set()

    thread = threading.Thread(target=optimizer_step)
    thread.start()
    assert not settled.wait(timeout=0.2)
    with torch.no_grad():
        sent = trainer.model.weight.clone()
    replica.gate.set()
    assert settled.wait(timeout=10)
    thread.join()
    # What reached the replica is the weights as they were when the step ended.
    version, data = replica.pushed[-1]
    assert version == 2 and sent.numpy().tobytes() in data


def test_an_unreachable_replica_is_retried_before_the_next_generation(setup, caplog):
    sync, replica, trainer = setup
    replica.error = UnavailableError(grpc.StatusCode.UNAVAILABLE, "test")
    sync.after_optimizer_step(trainer)
    replica.gate.set()
    sync.wait_for_transfer()
    assert sync.push_pending and sync.current_version == 2
    with caplog.at_level(logging.WARNING, logger="trainer_service.rollout.weight_sync"):
        sync.settle_transfer()
    assert "retried before the next generation" in caplog.text
    # The next generation pushes again, under a version above the one given to the lost transfer.
    replica.error = None
    with sync.generation(trainer) as version:
        assert version == 3 and replica.version == 3 and not sync.push_pending


def test_a_refusal_fails_the_run_where_the_trainer_waits(setup):
    sync, replica, trainer = setup
    replica.error = InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "test")
    sync.after_optimizer_step(trainer)
    replica.gate.set()
    with pytest.raises(WeightPushError, match="refused"):
        sync.settle_transfer()


def test_background_pushes_are_single_process_only(setup):
    sync, _, trainer = setup
    trainer.accelerator.num_processes = 2
    with pytest.raises(RuntimeError, match="single-process"):
        sync.push_in_background(trainer)


def test_no_replica_at_all_defers_the_push(setup, caplog):
    sync, _, trainer = setup
    sync.replicas.refresh = lambda: []
    with caplog.at_level(logging.WARNING, logger="trainer_service.rollout.weight_sync"):
        sync.after_optimizer_step(trainer)
    assert "no rollout replica" in caplog.text
    assert sync.push_pending and not sync.transferring and sync.current_version == 1
    with pytest.raises(RolloutUnavailable), sync.generation(trainer):
        pass


def test_an_overlapping_generation_runs_while_the_push_streams_and_settles_it_after(setup):
    """A sync run's Generate carries the version as min_policy_version: it goes out before the weights have
    reached the replica (which waits for them itself), and the push is settled when the generation ends."""
    sync, replica, trainer = setup
    sync.after_optimizer_step(trainer)
    assert replica.entered.wait(timeout=10)
    with sync.generation(trainer, overlap=True) as version:
        assert version == 2 and replica.version == 1 and sync.transferring
        replica.gate.set()
    assert not sync.transferring and replica.version == 2 and sync.ready == [ReplicaAddress(ADDRESS)]


def test_a_push_refused_during_an_overlapping_generation_fails_it(setup):
    sync, replica, trainer = setup
    replica.error = InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, "test")
    sync.after_optimizer_step(trainer)
    with pytest.raises(WeightPushError, match="refused"), sync.generation(trainer, overlap=True):
        replica.gate.set()
    assert not sync.transferring


def test_a_generation_without_overlap_waits_for_the_push(setup):
    sync, replica, trainer = setup
    sync.after_optimizer_step(trainer)
    assert replica.entered.wait(timeout=10)
    threading.Timer(0.2, replica.gate.set).start()
    with sync.generation(trainer) as version:
        assert version == 2 and replica.version == 2 and not sync.transferring
