"""Sleep mode: the rollout engines sleep while the trainer computes, and wake only to generate.

With ``training.rollout.vllm_enable_sleep_mode`` (trainer and rollout engine share one accelerator), around
each generation the order is: wake → push → generate → sleep, all before the optimizer step. Weights are
pushed after *every* wake, so the engine never generates from weights that were restored from disk or host
memory after a sleep (TRL #5312's bug: after a sleep/wake cycle colocated vLLM served the base model).

``training.rollout.sleep_level`` is the level the replicas sleep at (the rollout service's ``Sleep``):
level 1 offloads the weights to host memory and frees the caches; level 2 discards the weights too, and a
replica refuses to generate until new weights arrive, which the push after the wake brings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trainer_service.rollout.policy_versions import PolicyVersions
from trainer_service.rollout.replicas import ReplicaAddress


class EngineSleep:
    """Wakes every member of ``versions``' replica set for one generation and puts it back to sleep at
    ``level``. Collective: every rank enters :meth:`awake`; the main process makes the calls."""

    def __init__(self, versions: PolicyVersions, level: int = 1) -> None:
        self.versions = versions
        self.level = level

    @contextmanager
    def awake(self, trainer: Any, after_wake: Callable[[list[ReplicaAddress]], None]) -> Iterator[None]:
        """Wake every member, run ``after_wake(woken members)`` (the push) and wait for every rank; the body
        generates; then every rank waits again and the members go back to sleep.

        A failure to wake, or of ``after_wake``, raises before the body and leaves the members awake (the
        next generation wakes them again, a no-op for those awake)."""
        members = self.versions.on_main(trainer, self._wake_all)
        after_wake(members)
        trainer.accelerator.wait_for_everyone()
        try:
            yield
        finally:
            trainer.accelerator.wait_for_everyone()
            self.versions.on_main(trainer, lambda: self._sleep_all(members))

    def _wake_all(self) -> list[ReplicaAddress]:
        versions = self.versions
        members = versions.members()
        versions.require(members, versions.each(members, lambda client: client.wake_up()), "WakeUp")
        return members

    def _sleep_all(self, members: list[ReplicaAddress]) -> None:
        versions = self.versions
        outcomes = versions.each(members, lambda client: client.sleep(self.level))
        versions.require(members, outcomes, "Sleep")
