"""The policy version the rollout replicas must serve, and which members serve it.

Versions: the trainer owns a counter. Each push gives the weights ``version = last + 1`` (the first push of a
run, and a push to a replica whose version is unknown, uses the highest version the replicas report + 1,
because a replica only accepts increasing versions: :meth:`PolicyVersions.next_version`), and every
completion of the next generation must carry exactly that version (checked in
:mod:`~trainer_service.rollout.service_rollout`). With weight sync off the trainer pushes nothing and
follows whatever version every replica serves (:meth:`PolicyVersions.follow_service_version`); replicas
that disagree have no one version, which is an error.

Replicas (:mod:`~trainer_service.rollout.replicas`): the membership is resolved again before every push and
every generation (``dns:///`` targets follow the pods a headless Service lists). ``ready`` lists the members
serving the current version, in membership order: generation goes there. Before a generation every member's
``GetStatus`` is read (:meth:`PolicyVersions.behind`): a member that is new, restarted (behind the trainer's
version) or lost its weights (``weights_valid`` false) calls for a push of the current weights to every
member under a new version, so all replicas always serve the same version. A listed member that does not
answer makes the step wait with backoff (:class:`RolloutUnavailable`); one that DNS no longer lists is
simply not a member any more.

Under DeepSpeed ZeRO-3 or FSDP every rank runs the trainer's code, but only the main process talks to the
replicas: :meth:`PolicyVersions.on_main` runs such work there and broadcasts its result (a version, the
members serving it) or its failure to every rank, so every rank generates on those members, checks its own
completions against that version, and no rank is left waiting in a collective alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from accelerate.utils import broadcast_object_list

from grpo_runtime.call_errors import ServiceCallError
from trainer_service.rollout.replicas import (
    ReplicaAddress,
    RolloutReplicas,
    RolloutUnavailable,
    may_recover,
    settle,
)

log = logging.getLogger(__name__)


class RolloutReplicaError(RuntimeError):
    """A rollout replica answered with an error that waiting will not fix, or the replicas disagree."""


class WeightPushError(RolloutReplicaError):
    """A rollout replica refused a weight update (bad payload, version, auth, ...)."""


def describe(address: str, operation: str, error: Exception) -> str:
    """One line saying which call on which replica failed, and how."""
    if isinstance(error, ServiceCallError):
        return f"{operation} on {address} failed: {error.code.name} {error.details}".rstrip()
    return f"{operation} on {address} failed: {type(error).__name__}: {error}"


class PolicyVersions:
    """The version the replicas serve for this run and the members serving it, on every rank.

    ``replicas``: the run's :class:`~trainer_service.rollout.replicas.RolloutReplicas` (None: no service,
    nothing is ever asked).
    """

    def __init__(self, replicas: RolloutReplicas | None) -> None:
        self.replicas = replicas
        # Version the replicas serve for this run (None until the first push or status read).
        self.current_version: int | None = None
        # True from the start of a push until a version was given to the weights and reached a replica.
        self.push_pending = True
        # Members serving current_version (every rank), in membership order. Replaced, never mutated: the
        # async prefetch thread reads it.
        self.ready: list[ReplicaAddress] = []
        # Main process: addresses known to serve current_version (no GetStatus needed before a push).
        self._synced: set[str] = set()

    # -- collective ---------------------------------------------------------------------------------------
    @staticmethod
    def is_main(trainer: Any) -> bool:
        return bool(trainer.accelerator.is_main_process)

    @staticmethod
    def share(trainer: Any, value: Any) -> Any:
        """The main process's ``value`` on every rank (a no-op on one process)."""
        if trainer.accelerator.num_processes == 1:
            return value
        return broadcast_object_list([value], from_process=0)[0]

    def on_main(self, trainer: Any, work: Callable[[], Any]) -> Any:
        """``work()`` on the main process, its result on every rank; its RolloutUnavailable or
        RolloutReplicaError (WeightPushError) is raised on every rank, so no rank waits in a collective alone.
        """
        outcome: tuple[str, Any] | None = None
        if self.is_main(trainer):
            try:
                outcome = ("ok", work())
            except RolloutUnavailable as error:
                outcome = ("unavailable", str(error))
            except WeightPushError as error:
                outcome = ("refused", str(error))
            except RolloutReplicaError as error:
                outcome = ("failed", str(error))
        kind, value = self.share(trainer, outcome)
        if kind == "unavailable":
            raise RolloutUnavailable(value)
        if kind == "refused":
            raise WeightPushError(value)
        if kind == "failed":
            raise RolloutReplicaError(value)
        return value

    def set_ready(self, trainer: Any, members: list[ReplicaAddress]) -> None:
        """Every rank generates on ``members``; other ranks open clients for them."""
        if not self.is_main(trainer) and self.replicas is not None:
            self.replicas.adopt(members)
        self.ready = list(members)

    def served(self, trainer: Any, members: list[ReplicaAddress]) -> None:
        """The weights of ``current_version`` reached ``members``: no push is pending; generation goes
        there."""
        self.push_pending = False
        self.set_ready(trainer, members)

    # -- main-process work on the replicas ------------------------------------------------------------------
    def members(self) -> list[ReplicaAddress]:
        """Resolve the targets again; no member at all is a replica set that is down."""
        assert self.replicas is not None
        members = self.replicas.refresh()
        if not members:
            raise RolloutUnavailable(f"no rollout replica behind {', '.join(self.replicas.targets)}")
        self._synced &= {m.address for m in members}
        return members

    def each(self, members: list[ReplicaAddress], call: Callable[[Any], Any]) -> list[Any]:
        """``call(client)`` on every member concurrently; results or exceptions, in member order."""
        assert self.replicas is not None
        replicas = self.replicas

        def on(address: str) -> Callable[[], Any]:
            return lambda: call(replicas.client(address))

        return settle([on(m.address) for m in members])

    @staticmethod
    def require(members: list[ReplicaAddress], outcomes: list[Any], operation: str) -> None:
        """Raise when any member failed: RolloutUnavailable (wait and retry) or RolloutReplicaError."""
        failed = [(m.address, o) for m, o in zip(members, outcomes, strict=True) if isinstance(o, Exception)]
        if not failed:
            return
        message = "; ".join(describe(address, operation, error) for address, error in failed)
        if all(may_recover(error) for _, error in failed):
            raise RolloutUnavailable(message)
        raise RolloutReplicaError(message)

    def _statuses(self, members: list[ReplicaAddress]) -> list[Any]:
        """Every member's GetStatus; any member that does not answer raises."""
        outcomes = self.each(members, lambda client: client.status())
        self.require(members, outcomes, "GetStatus")
        return outcomes

    def next_version(self, members: list[ReplicaAddress]) -> tuple[int, list[ReplicaAddress], list[str]]:
        """(next version, members to send it to, members that did not answer GetStatus, described).

        The version exceeds the trainer's last one and the version of every member not known to serve it
        (new, restarted or failed before), so no member refuses it as old. Only those members are asked
        (none in the usual step); when none of them answers and the trainer has no version yet, this raises.
        """
        unknown = [m for m in members if m.address not in self._synced]
        statuses = self.each(unknown, lambda client: client.status())
        seen = [int(s.policy_version) for s in statuses if not isinstance(s, Exception)]
        if self.current_version is not None:
            seen.append(self.current_version)
        if not seen:
            self.require(unknown, statuses, "GetStatus")
        version = max(seen) + 1
        unreachable = {m.address for m, s in zip(unknown, statuses, strict=True) if isinstance(s, Exception)}
        targets = [m for m in members if m.address not in unreachable]
        problems = [
            describe(m.address, "GetStatus", s)
            for m, s in zip(unknown, statuses, strict=True)
            if m.address in unreachable
        ]
        return version, targets, problems

    def applied(self, members: list[ReplicaAddress]) -> None:
        """``members`` took the last push: the only ones known to serve its version."""
        self._synced = {m.address for m in members}

    def behind(self) -> tuple[bool, list[ReplicaAddress]]:
        """(whether any member lacks ``current_version``, the members), from every member's GetStatus."""
        members = self.members()
        statuses = self._statuses(members)
        behind = [
            m.address
            for m, s in zip(members, statuses, strict=True)
            if int(s.policy_version) != self.current_version or not s.weights_valid
        ]
        if behind:
            log.info("rollout replicas %s do not serve version %s", ", ".join(behind), self.current_version)
        else:
            self._synced = {m.address for m in members}
        return bool(behind), members

    def _common_version(self) -> tuple[int, list[ReplicaAddress]]:
        """The version every member serves (sync off); replicas that disagree have no one version."""
        members = self.members()
        statuses = self._statuses(members)
        versions = {m.address: int(s.policy_version) for m, s in zip(members, statuses, strict=True)}
        if len(set(versions.values())) > 1:
            raise RolloutReplicaError(
                f"training.rollout.weight_sync is off and the rollout replicas serve different versions "
                f"{versions}; every completion must come from one version"
            )
        return next(iter(versions.values())), members

    def follow_service_version(self, trainer: Any) -> int:
        """Weight sync off: make the version the replicas serve now the current one and return it (read by the
        main process and shared; collective)."""
        version, members = self.on_main(trainer, self._common_version)
        self.set_ready(trainer, members)
        self.current_version = int(version)
        return self.current_version
