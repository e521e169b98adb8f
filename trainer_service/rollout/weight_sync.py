"""Keep every rollout replica generating from the trainer's current policy.

:class:`WeightSync` is what the rest of the trainer uses; it composes three parts, each explained in its
module: :mod:`~trainer_service.rollout.policy_versions` (the version the replicas must serve and which
members serve it, shared by every rank), :mod:`~trainer_service.rollout.replica_push` (what is pushed and how,
in the foreground or from a thread) and :mod:`~trainer_service.rollout.engine_sleep` (wake → push → generate
→ sleep).

The rules they keep together:

- Without sleep mode the trainer pushes once at the start of training (initial or resumed weights) and after
  every optimizer step, so ``policy_version = version_at_start + global_step`` and generation for step k+1
  always sees the weights of step k. A single-process run streams the push after an optimizer step from a
  thread: an async run's next prefetch waits for it; a sync run's next Generate goes out at once with that
  version as ``min_policy_version``, so the replicas open its episodes while the weights arrive and
  generate only once they serve them (:meth:`WeightSync.generation` with ``overlap``). The next optimizer
  step and the end of training settle the push.
- Before each generation every member's ``GetStatus`` is read: a member that is new, restarted or lost its
  weights makes the trainer push its current weights to every member under a new version, so the step
  generates only when all of them serve one version. A push that reached no replica is retried there.
- With weight sync off (``training.rollout.weight_sync``) nothing is pushed: every generation expects the
  version the replicas serve as it is then.
- With sleep mode (``training.rollout.vllm_enable_sleep_mode``) nothing is pushed after an optimizer step:
  the weights are pushed after the wake that starts each generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from trainer_service.rollout.engine_sleep import EngineSleep
from trainer_service.rollout.policy_versions import PolicyVersions
from trainer_service.rollout.replica_push import ReplicaPush, log_deferred
from trainer_service.rollout.replicas import ReplicaAddress, RolloutReplicas, RolloutUnavailable
from trainer_service.rollout.weight_transport import WeightTransports


class WeightSync:
    """Pushes policy weights to every rollout replica and knows which version they must be serving.

    ``client``: the :class:`~trainer_service.replicas.RolloutReplicas` of the run (each member's
    :class:`rollout_service.client.RolloutClient`: ``push_weights``, ``status``, ``sleep``,
    ``wake_up``). ``ready`` lists the members serving ``current_version``: generation goes there.
    ``background``: the push after an optimizer step streams in a thread (single-process runs).
    """

    def __init__(
        self,
        client: RolloutReplicas | None,
        *,
        enabled: bool = True,
        sleep_mode: bool = False,
        sleep_level: int = 1,
        background: bool = False,
        transports: WeightTransports | None = None,
    ):
        self.replicas = client
        self.enabled = enabled
        self.sleep_mode = sleep_mode
        self.background = background
        self.versions = PolicyVersions(client)
        self.pusher = ReplicaPush(self.versions, transports or WeightTransports())
        self.engine_sleep = EngineSleep(self.versions, sleep_level)

    # -- the state the trainer reads ------------------------------------------------------------------------
    @property
    def current_version(self) -> int | None:
        """The version of the trainer's weights, which the replicas must serve (None before any)."""
        return self.versions.current_version

    @current_version.setter
    def current_version(self, version: int | None) -> None:
        self.versions.current_version = version

    @property
    def push_pending(self) -> bool:
        """A push started and its version has not reached a replica yet."""
        return self.versions.push_pending

    @push_pending.setter
    def push_pending(self, pending: bool) -> None:
        self.versions.push_pending = pending

    @property
    def ready(self) -> list[ReplicaAddress]:
        """The members serving ``current_version``, in membership order."""
        return self.versions.ready

    @ready.setter
    def ready(self, members: list[ReplicaAddress]) -> None:
        self.versions.ready = members

    @property
    def transports(self) -> WeightTransports:
        return self.pusher.transports

    @property
    def pushes(self) -> int:
        return self.pusher.pushes

    @property
    def last_push_seconds(self) -> float:
        return self.pusher.last_push_seconds

    @property
    def total_push_seconds(self) -> float:
        return self.pusher.total_push_seconds

    @property
    def _transfer(self) -> Future | None:
        """The background push in flight (a test puts one in place)."""
        return self.pusher.transfer

    @_transfer.setter
    def _transfer(self, transfer: Future | None) -> None:
        self.pusher.transfer = transfer

    # -- pushing --------------------------------------------------------------------------------------------
    def payload(self, trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """(state dict to send, adapter config or None); :meth:`ReplicaPush.payload`."""
        return self.pusher.payload(trainer)

    def push(self, trainer: Any) -> int:
        """Send the current weights to every replica with the next version; :meth:`ReplicaPush.push`."""
        return self.pusher.push(trainer)

    def push_in_background(self, trainer: Any) -> None:
        """Stream the current weights under the next version from a thread;
        :meth:`ReplicaPush.push_in_background`."""
        self.pusher.push_in_background(trainer)

    @property
    def transferring(self) -> bool:
        """A background push was started and not settled yet (it may have finished)."""
        return self.pusher.transferring

    def wait_for_transfer(self) -> None:
        """Block until the background push (if any) has ended, without consuming its outcome."""
        self.pusher.wait_for_transfer()

    def settle_transfer(self) -> None:
        """Wait for the background push and report its outcome."""
        self.pusher.settle_transfer()

    def push_metrics(self) -> dict[str, float]:
        """The last push, for the trainer's metrics (:meth:`ReplicaPush.push_metrics`)."""
        return self.pusher.push_metrics()

    def close(self) -> None:
        """Leave the weight group and delete the shared-memory bucket files."""
        self.pusher.close()

    def follow_service_version(self, trainer: Any) -> int:
        """Weight sync off: make the version the replicas serve now the current one and return it
        (collective)."""
        return self.versions.follow_service_version(trainer)

    # -- the training loop's events -------------------------------------------------------------------------
    def on_train_begin(self, trainer: Any) -> None:
        """Push the initial (or resumed) weights; with sync off, adopt whatever version the service has."""
        if not self.enabled:
            self.follow_service_version(trainer)
        elif not self.sleep_mode:
            self._push_or_defer(self.push, trainer)
        trainer.accelerator.wait_for_everyone()

    def after_optimizer_step(self, trainer: Any) -> None:
        """Push the updated weights before the next generation (sleep mode pushes at the next wake
        instead; ``background``: streamed from a thread)."""
        if self.enabled and not self.sleep_mode:
            self._push_or_defer(self.push_in_background if self.background else self.push, trainer)
        trainer.accelerator.wait_for_everyone()

    @staticmethod
    def _push_or_defer(push: Callable[[Any], Any], trainer: Any) -> None:
        try:
            push(trainer)
        except RolloutUnavailable as error:
            log_deferred(error)

    @contextmanager
    def generation(self, trainer: Any, *, overlap: bool = False) -> Iterator[int]:
        """Bracket one generation; yields the version every completion must carry.

        Every replica serves that version when the body runs (``ready`` lists them all); otherwise this
        raises RolloutUnavailable and the caller retries. Sleep mode: the replicas are woken, the weights
        pushed, all ranks generate, then the replicas go back to sleep, before the trainer's forward pass
        (:meth:`EngineSleep.awake`).

        ``overlap`` (a caller whose requests carry the version as ``min_policy_version``): while a background
        push streams, the body runs at once and the push is settled after it; the replicas wait for the
        version themselves (UNAVAILABLE, retried, when it fails or never comes).
        """
        if overlap and self.transferring:  # only pushes after an optimizer step stream (not in sleep mode)
            try:
                yield self._prepared_version()
            finally:
                self.settle_transfer()
            return
        self.settle_transfer()
        if self.sleep_mode:
            with self.engine_sleep.awake(trainer, lambda woken: self._weights_after_wake(trainer, woken)):
                yield self._prepared_version()
            return
        if not self.enabled:
            # Sync off: the replicas keep whatever they serve; expect their version as it is now.
            self.follow_service_version(trainer)
        elif self.push_pending:
            # Never pushed, or a push that reached no replica.
            self.push(trainer)
        else:
            # A replica that joined, restarted (base weights, version 0) or lost its weights: push the
            # current weights again, to every replica, under a new version.
            behind, members = self.versions.on_main(trainer, self.versions.behind)
            if behind:
                self.push(trainer)
            else:
                self.versions.set_ready(trainer, members)
        yield self._prepared_version()

    def _prepared_version(self) -> int:
        """``current_version`` once :meth:`generation` has prepared the replicas: the push or status read
        there set it (or raised)."""
        version = self.current_version
        assert version is not None
        return version

    def _weights_after_wake(self, trainer: Any, woken: list[ReplicaAddress]) -> None:
        """Sleep mode: push to the members just woken (sync on), or learn their version once (sync off)."""
        if self.enabled:
            self.pusher.push(trainer, woken)
        elif self.current_version is None:
            self.follow_service_version(trainer)


class WeightSyncCallback(TrainerCallback, ExportableState):
    """Runs :class:`WeightSync` at train begin and after each optimizer step; records the version in
    checkpoints.

    The version lands in ``trainer_state.json`` (``stateful_callbacks``) of every checkpoint, so a checkpoint
    says which policy version it holds; on resume the weights are pushed again under a fresh version.
    """

    def __init__(self, sync: WeightSync):
        self.sync = sync
        self.trainer: Any = None  # the trainer that registered it, from bind()

    def bind(self, trainer: Any) -> None:
        """Act on ``trainer`` (called once, by the trainer's constructor)."""
        self.trainer = trainer

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.sync.on_train_begin(self.trainer)

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs
    ):
        # A background push streams the model's own tensors: it must end before they change.
        self.sync.settle_transfer()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.sync.after_optimizer_step(self.trainer)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.sync.settle_transfer()

    def state(self) -> dict:
        return {"args": {}, "attributes": {"policy_version": self.sync.current_version}}
