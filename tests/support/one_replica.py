"""What :class:`~trainer_service.rollout.weight_sync.WeightSync` talks to, in memory: a replica set with one
member and a single-process trainer. Each test brings the replica it needs (one whose push blocks, one that
records wake and sleep calls) as a subclass of :class:`ServingReplica`.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from trainer_service.rollout.replicas import ReplicaAddress

ADDRESS = "127.0.0.1:50052"


class ServingReplica:
    """A replica's status as WeightSync reads it: it serves ``version`` and its weights are valid."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    def status(self) -> SimpleNamespace:
        return SimpleNamespace(policy_version=self.version, weights_valid=True)


class OneReplica:
    """The replica set of :class:`~trainer_service.rollout.replicas.RolloutReplicas` with one member, at
    :data:`ADDRESS`, whose client is ``replica``."""

    def __init__(self, replica: ServingReplica):
        self.replica = replica
        self.targets = [ADDRESS]

    def refresh(self) -> list[ReplicaAddress]:
        return [ReplicaAddress(ADDRESS)]

    def client(self, address: str) -> ServingReplica:
        return self.replica


def trainer_with(model: torch.nn.Module) -> SimpleNamespace:
    """The parts of a single-process trainer (its accelerator and model) WeightSync reads the weights from."""
    accelerator = SimpleNamespace(
        num_processes=1,
        is_main_process=True,
        is_fsdp2=False,
        get_state_dict=lambda m: m.state_dict(),
        unwrap_model=lambda m: m,
        wait_for_everyone=lambda: None,
    )
    return SimpleNamespace(accelerator=accelerator, model=model, model_wrapped=None)
