"""Keep every rollout replica generating from the trainer's current policy.

Versions: the trainer owns a counter. Each push sends the weights with ``version = last + 1`` to every replica
(the first push of a run, and a push to a replica whose version is unknown, uses the highest version the
replicas report + 1, because a replica only accepts increasing versions), and every completion of the next
generation must carry exactly that version (checked in :mod:`~trainer_service.rollout.service_rollout`).
Without sleep mode the trainer pushes once at the start of training (initial or resumed weights) and after
every optimizer step, so ``policy_version = version_at_start + global_step`` and generation for step k+1
always sees the weights of step k. Async rollout streams the push after an optimizer step from a thread
(:meth:`WeightSync.push_in_background`): the version is given at once, and whatever needs the replicas to
serve it, or the tensors to stay unchanged, waits for the stream first.

Replicas (:mod:`~trainer_service.rollout.replicas`): the membership is resolved again before every push and
every generation (``dns:///`` targets follow the pods a headless Service lists). A push goes to every member
at once, one thread per replica, and returns when all have answered. Before each generation every member's
``GetStatus`` is read: a member that is new, restarted (behind the trainer's version) or lost its weights
(``weights_valid`` false) makes the trainer push its current weights to every member under a new version, so
all replicas always serve the same version, and the step generates only when all of them have it. A listed
member that does not answer makes the step wait with backoff (:class:`RolloutUnavailable`); one that DNS no
longer lists is simply not a member any more.

With ``vllm_sleep_mode`` (trainer and rollout engine share one accelerator) the engine sleeps while the
trainer computes, and around each generation the order is: wake → push → generate → sleep, all before the
optimizer step. Weights are pushed after *every* wake, so the engine never generates from weights that were
restored from disk or host memory after a sleep (TRL #5312's bug: after a sleep/wake cycle colocated vLLM
served the base model).

What is pushed: a PEFT model sends its adapter (``get_peft_model_state_dict`` + ``adapter_config.json``); a
full fine-tune sends the whole state dict. Under DeepSpeed ZeRO-3 or FSDP, gathering the state dict is
collective, so every rank calls :meth:`WeightSync.push`; only the main process talks to the replicas' weight
RPCs, and the new version and the members serving it are broadcast, so every rank generates on those members
and checks its own completions against that version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import broadcast_object_list
from peft import PeftModel, get_peft_model_state_dict
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from grpo_runtime.call_errors import ServiceCallError
from trainer_service.rollout.full_weights import full_state_dict
from trainer_service.rollout.replicas import (
    ReplicaAddress,
    RolloutReplicas,
    RolloutUnavailable,
    may_recover,
    settle,
)
from trainer_service.rollout.weight_transport import WeightTransports

log = logging.getLogger(__name__)


class RolloutReplicaError(RuntimeError):
    """A rollout replica answered with an error that waiting will not fix, or the replicas disagree."""


class WeightPushError(RolloutReplicaError):
    """A rollout replica refused a weight update (bad payload, version, auth, ...)."""


def _describe(address: str, operation: str, error: Exception) -> str:
    if isinstance(error, ServiceCallError):
        return f"{operation} on {address} failed: {error.code.name} {error.details}".rstrip()
    return f"{operation} on {address} failed: {type(error).__name__}: {error}"


class WeightSync:
    """Pushes policy weights to every rollout replica and knows which version they must be serving.

    ``client``: the :class:`~trainer_service.replicas.RolloutReplicas` of the run (each member's
    :class:`rollout_service.client.RolloutClient`: ``push_weights``, ``status``, ``sleep``,
    ``wake_up``). ``ready`` lists the members serving ``current_version``: generation goes there.
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
        self.sleep_level = sleep_level
        # Async rollout: the push after an optimizer step streams in a thread (see push_in_background).
        self.background = background
        self._transfer: Future | None = None
        # Version the replicas serve for this run (None until the first push or status read).
        self.current_version: int | None = None
        # True from the start of a push until a version was given to the weights and reached a replica.
        self.push_pending = True
        # Members serving current_version (every rank), in membership order. Replaced, never mutated: the
        # async prefetch thread reads it.
        self.ready: list[ReplicaAddress] = []
        # Main process: addresses known to serve current_version (no GetStatus needed before a push).
        self._synced: set[str] = set()
        # Sleep mode, main process: the members woken for this generation (pushed to, then put to sleep).
        self._awake: list[ReplicaAddress] | None = None
        self.pushes = 0
        self.last_push_seconds = 0.0
        self.total_push_seconds = 0.0
        self.transports = transports or WeightTransports()

    # -- collective helpers -------------------------------------------------------------------------------
    @staticmethod
    def _is_main(trainer: Any) -> bool:
        return bool(trainer.accelerator.is_main_process)

    @staticmethod
    def _share(trainer: Any, value: Any) -> Any:
        """The main process's ``value`` on every rank (a no-op on one process)."""
        if trainer.accelerator.num_processes == 1:
            return value
        return broadcast_object_list([value], from_process=0)[0]

    def _on_main(self, trainer: Any, work: Callable[[], Any]) -> Any:
        """``work()`` on the main process, its result on every rank; its RolloutUnavailable or
        RolloutReplicaError (WeightPushError) is raised on every rank, so no rank waits in a collective alone.
        """
        outcome: tuple[str, Any] | None = None
        if self._is_main(trainer):
            try:
                outcome = ("ok", work())
            except RolloutUnavailable as error:
                outcome = ("unavailable", str(error))
            except WeightPushError as error:
                outcome = ("refused", str(error))
            except RolloutReplicaError as error:
                outcome = ("failed", str(error))
        kind, value = self._share(trainer, outcome)
        if kind == "unavailable":
            raise RolloutUnavailable(value)
        if kind == "refused":
            raise WeightPushError(value)
        if kind == "failed":
            raise RolloutReplicaError(value)
        return value

    def _set_ready(self, trainer: Any, members: list[ReplicaAddress]) -> None:
        """Every rank generates on ``members``; other ranks open clients for them."""
        if not self._is_main(trainer) and self.replicas is not None:
            self.replicas.adopt(members)
        self.ready = list(members)

    # -- main-process work on the replicas ------------------------------------------------------------------
    def _members(self) -> list[ReplicaAddress]:
        """Resolve the targets again; no member at all is a replica set that is down."""
        assert self.replicas is not None
        members = self.replicas.refresh()
        if not members:
            raise RolloutUnavailable(f"no rollout replica behind {', '.join(self.replicas.targets)}")
        self._synced &= {m.address for m in members}
        return members

    def _each(self, members: list[ReplicaAddress], call: Callable[[Any], Any]) -> list[Any]:
        """``call(client)`` on every member concurrently; results or exceptions, in member order."""
        assert self.replicas is not None
        replicas = self.replicas

        def on(address: str) -> Callable[[], Any]:
            return lambda: call(replicas.client(address))

        return settle([on(m.address) for m in members])

    def _require(self, members: list[ReplicaAddress], outcomes: list[Any], operation: str) -> None:
        """Raise when any member failed: RolloutUnavailable (wait and retry) or RolloutReplicaError."""
        failed = [(m.address, o) for m, o in zip(members, outcomes, strict=True) if isinstance(o, Exception)]
        if not failed:
            return
        message = "; ".join(_describe(address, operation, error) for address, error in failed)
        if all(may_recover(error) for _, error in failed):
            raise RolloutUnavailable(message)
        raise RolloutReplicaError(message)

    def _statuses(self, members: list[ReplicaAddress]) -> list[Any]:
        """Every member's GetStatus; any member that does not answer raises."""
        outcomes = self._each(members, lambda client: client.status())
        self._require(members, outcomes, "GetStatus")
        return outcomes

    def _push_everywhere(
        self, state_dict: dict[str, torch.Tensor], adapter_config: dict[str, Any] | None
    ) -> tuple[int, list[ReplicaAddress], str]:
        """Push the weights to every member under the next version.

        Returns (version, members that applied it, what failed or ""). The version exceeds the trainer's
        last one and the version of every member not known to serve it (new, restarted or failed before),
        so no member refuses it as old. Raises RolloutUnavailable when no member took it (nothing changed),
        WeightPushError when a member refused it.
        """
        return self._send(*self._plan_push(), state_dict, adapter_config)

    def _plan_push(self) -> tuple[int, list[ReplicaAddress], list[str]]:
        """(next version, members to send it to, members that did not answer GetStatus, described).

        Only members not known to serve the current version are asked (none in the usual step)."""
        members = self._awake if self._awake is not None else self._members()
        unknown = [m for m in members if m.address not in self._synced]
        statuses = self._each(unknown, lambda client: client.status())
        seen = [int(s.policy_version) for s in statuses if not isinstance(s, Exception)]
        if self.current_version is not None:
            seen.append(self.current_version)
        if not seen:
            self._require(unknown, statuses, "GetStatus")
        version = max(seen) + 1
        unreachable = {m.address for m, s in zip(unknown, statuses, strict=True) if isinstance(s, Exception)}
        targets = [m for m in members if m.address not in unreachable]
        problems = [
            _describe(m.address, "GetStatus", s)
            for m, s in zip(unknown, statuses, strict=True)
            if m.address in unreachable
        ]
        return version, targets, problems

    def _send(
        self,
        version: int,
        targets: list[ReplicaAddress],
        problems: list[str],
        state_dict: dict[str, torch.Tensor],
        adapter_config: dict[str, Any] | None,
    ) -> tuple[int, list[ReplicaAddress], str]:
        """Send the weights to ``targets`` under ``version``, each over its transport
        (:class:`~trainer_service.rollout.weight_transport.WeightTransports`); see :meth:`_push_everywhere`.
        """
        assert self.replicas is not None
        replicas = self.replicas
        outcomes = self.transports.push(
            [(m.address, replicas.client(m.address)) for m in targets], version, state_dict, adapter_config
        )
        self._log_transports(version, targets)
        problems = list(problems)
        applied: list[ReplicaAddress] = []
        refused: list[str] = []
        for member, outcome in zip(targets, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                applied.append(member)
            elif may_recover(outcome):
                problems.append(_describe(member.address, f"weight push of version {version}", outcome))
            else:
                refused.append(_describe(member.address, f"weight push of version {version}", outcome))
        self._synced = {m.address for m in applied}
        if refused:
            raise WeightPushError("the rollout replica refused the weights: " + "; ".join(refused))
        if not applied:
            raise RolloutUnavailable("weight push failed: " + "; ".join(problems))
        return version, applied, "; ".join(problems)

    def _log_transports(self, version: int, targets: list[ReplicaAddress]) -> None:
        """One log line per push: each replica's transport, seconds and GB/s."""
        records = [(m.address, self.transports.last.get(m.address)) for m in targets]
        parts = [
            f"{address} {r.transport.name} {r.seconds:.3f} s {r.gb_per_s:.2f} GB/s"
            for address, r in records
            if r is not None
        ]
        if parts:
            log.info("weight push of version %s: %s", version, "; ".join(parts))

    def push_metrics(self) -> dict[str, float]:
        """The last push, for the trainer's metrics: seconds from the call to the weights serving and GB/s of
        the slowest replica (``weight_sync/transfer_*``), and how many replicas each transport served."""
        records = list(self.transports.last.values())
        if not records:
            return {}
        slowest = max(records, key=lambda r: r.seconds)
        metrics = {
            "weight_sync/transfer_seconds": slowest.seconds,
            "weight_sync/transfer_gb_per_s": slowest.gb_per_s,
        }
        for transport in sorted({r.transport for r in records}):
            metrics[f"weight_sync/replicas_{transport.name.lower()}"] = float(
                sum(r.transport == transport for r in records)
            )
        return metrics

    def close(self) -> None:
        """Leave the weight group and delete the shared-memory bucket files."""
        self.transports.close()

    def _behind(self) -> tuple[bool, list[ReplicaAddress]]:
        """(whether any member lacks ``current_version``, the members), from every member's GetStatus."""
        members = self._members()
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
        members = self._members()
        statuses = self._statuses(members)
        versions = {m.address: int(s.policy_version) for m, s in zip(members, statuses, strict=True)}
        if len(set(versions.values())) > 1:
            raise RolloutReplicaError(
                f"training.weight_sync is off and the rollout replicas serve different versions {versions}; "
                "every completion must come from one version"
            )
        return next(iter(versions.values())), members

    def follow_service_version(self, trainer: Any) -> int:
        """Weight sync off: make the version the replicas serve now the current one and return it (read by the
        main process and shared; collective)."""
        version, members = self._on_main(trainer, self._common_version)
        self._set_ready(trainer, members)
        self.current_version = int(version)
        return self.current_version

    # -- pushing --------------------------------------------------------------------------------------------
    def payload(self, trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """(state dict to send, adapter config or None). Collective under ZeRO-3/FSDP: call on every rank.

        Every tensor is gathered (:mod:`~trainer_service.rollout.full_weights`) before anything is sent. On
        one process the tensors are the model's own (sent from their memory, moved to CPU only where they are
        elsewhere), which is safe because a push finishes before the next optimizer step changes them."""
        accelerator = trainer.accelerator
        model = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
        unwrapped = accelerator.unwrap_model(model)
        if isinstance(unwrapped, PeftModel):
            adapter = full_state_dict(
                accelerator, model, lambda tensors: get_peft_model_state_dict(unwrapped, state_dict=tensors)
            )
            config = unwrapped.peft_config[unwrapped.active_adapter]
            adapter_config = json.loads(json.dumps(config.to_dict(), default=_json_default))
            return adapter, adapter_config
        return full_state_dict(accelerator, model), None

    def push(self, trainer: Any) -> int:
        """Send the current weights to every replica with the next version; every rank returns that version.

        A failure on the main process is shared with every rank (no rank is left waiting in a collective).
        When no replica could be reached, :class:`RolloutUnavailable` is raised and the push stays pending,
        so the next generation pushes again. When some replicas took the version and others could not be
        reached, the version is the trainer's (``ready`` = those that took it) and RolloutUnavailable is
        raised after recording it; the next generation finds the others behind and pushes again. A refusal
        raises :class:`WeightPushError`.
        """
        self.settle_transfer()
        started = time.perf_counter()
        self.push_pending = True
        state_dict, adapter_config = self.payload(trainer)
        version, applied, problems = self._on_main(
            trainer, lambda: self._push_everywhere(state_dict, adapter_config)
        )
        self.current_version = int(version)
        self._pushed(trainer, version, applied, problems, started)
        return int(version)

    def _pushed(
        self, trainer: Any, version: int, applied: list[ReplicaAddress], problems: str, started: float
    ) -> None:
        """Record a push that reached ``applied``; raise RolloutUnavailable when others missed it."""
        self.push_pending = False
        self._set_ready(trainer, applied)
        self.pushes += 1
        self.last_push_seconds = time.perf_counter() - started
        self.total_push_seconds += self.last_push_seconds
        if problems:
            raise RolloutUnavailable(f"version {version} reached {len(applied)} replica(s) only: {problems}")

    # -- pushing in the background (async rollout) ----------------------------------------------------------
    def push_in_background(self, trainer: Any) -> None:
        """Give the current weights the next version now and stream them to the replicas in a thread.

        Single process only (async rollout is). From this call on ``current_version`` is the version of the
        trainer's weights, which the staleness bound is judged against, even while they are in flight;
        ``ready`` and ``push_pending`` change when the transfer has reached the replicas. The next
        prefetch waits for it (:meth:`wait_for_transfer`), and every other replica operation, the next
        optimizer step (the transfer streams the model's own tensors) and the end of training settle it
        first (:meth:`settle_transfer`), which reports a failure as a synchronous push would: the replicas
        unreachable → a warning and a push before the next generation; a refusal → WeightPushError.
        """
        if trainer.accelerator.num_processes != 1:
            raise RuntimeError("weights are pushed in the background by single-process runs only")
        self.settle_transfer()
        started = time.perf_counter()
        self.push_pending = True
        state_dict, adapter_config = self.payload(trainer)
        version, targets, problems = self._plan_push()
        self.current_version = version
        transfer: Future = Future()

        def stream() -> None:
            try:
                _, applied, missed = self._send(version, targets, problems, state_dict, adapter_config)
                self._pushed(trainer, version, applied, missed, started)
                transfer.set_result(version)
            except BaseException as error:  # reported by settle_transfer on the trainer's thread
                transfer.set_exception(error)

        self._transfer = transfer
        threading.Thread(target=stream, name=f"weight-push-{version}", daemon=True).start()

    @property
    def transferring(self) -> bool:
        """A background push was started and not settled yet (it may have finished)."""
        return self._transfer is not None

    def wait_for_transfer(self) -> None:
        """Block until the background push (if any) has ended, without consuming its outcome."""
        transfer = self._transfer
        if transfer is not None:
            wait([transfer])

    def settle_transfer(self) -> None:
        """Wait for the background push and report its outcome (see :meth:`push_in_background`)."""
        transfer, self._transfer = self._transfer, None
        if transfer is None:
            return
        try:
            transfer.result()
        except RolloutUnavailable as error:
            _log_deferred(error)

    def on_train_begin(self, trainer: Any) -> None:
        """Push the initial (or resumed) weights; with sync off, adopt whatever version the service has."""
        if not self.enabled:
            self.follow_service_version(trainer)
        elif not self.sleep_mode:
            self._push_or_defer(self.push, trainer)
        trainer.accelerator.wait_for_everyone()

    def after_optimizer_step(self, trainer: Any) -> None:
        """Push the updated weights before the next generation (sleep mode pushes at the next wake
        instead; async rollout streams them in the background)."""
        if self.enabled and not self.sleep_mode:
            self._push_or_defer(self.push_in_background if self.background else self.push, trainer)
        trainer.accelerator.wait_for_everyone()

    @staticmethod
    def _push_or_defer(push: Callable[[Any], Any], trainer: Any) -> None:
        try:
            push(trainer)
        except RolloutUnavailable as error:
            _log_deferred(error)

    def _wake_all(self) -> list[ReplicaAddress]:
        members = self._members()
        self._require(members, self._each(members, lambda client: client.wake_up()), "WakeUp")
        return members

    def _sleep_all(self) -> None:
        members, self._awake = self._awake or [], None
        self._require(members, self._each(members, lambda client: client.sleep(self.sleep_level)), "Sleep")

    @contextmanager
    def generation(self, trainer: Any) -> Iterator[int]:
        """Bracket one generation; yields the version every completion must carry.

        Every replica serves that version when the body runs (``ready`` lists them all); otherwise this
        raises RolloutUnavailable and the caller retries. Sleep mode: the main process wakes every replica,
        the weights are pushed (after every wake), all ranks generate, then the main process puts the
        replicas back to sleep, before the trainer's forward pass.
        """
        self.settle_transfer()
        if not self.sleep_mode:
            if not self.enabled:
                # Sync off: the replicas keep whatever they serve; expect their version as it is now.
                self.follow_service_version(trainer)
            elif self.push_pending:
                # Never pushed, or a push that reached no replica.
                self.push(trainer)
            else:
                # A replica that joined, restarted (base weights, version 0) or lost its weights: push the
                # current weights again, to every replica, under a new version.
                behind, members = self._on_main(trainer, self._behind)
                if behind:
                    self.push(trainer)
                else:
                    self._set_ready(trainer, members)
            yield self.current_version
            return
        self._awake = self._on_main(trainer, self._wake_all)
        if self.enabled:
            self.push(trainer)
        elif self.current_version is None:
            self.follow_service_version(trainer)
        trainer.accelerator.wait_for_everyone()
        try:
            yield self.current_version
        finally:
            trainer.accelerator.wait_for_everyone()
            try:
                self._on_main(trainer, self._sleep_all)
            finally:
                self._awake = None


def _log_deferred(error: RolloutUnavailable) -> None:
    # The next generation waits for the replicas and pushes to those that lack these weights.
    log.warning("%s; the push is retried before the next generation", error)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):  # enums such as TaskType
        return value.value
    return str(value)


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
