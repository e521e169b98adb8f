"""Pushing the trainer's weights to every rollout replica: what is pushed, in the foreground or from a
thread, and what each push cost.

What is pushed: a PEFT model sends its adapter (``get_peft_model_state_dict`` + ``adapter_config.json``); a
full fine-tune sends the whole state dict. Under DeepSpeed ZeRO-3 or FSDP, gathering the state dict is
collective (:mod:`~trainer_service.rollout.full_weights`), so every rank calls :meth:`ReplicaPush.push`; only
the main process sends, to every member at once over each one's transport
(:class:`~trainer_service.rollout.weight_transport.WeightTransports`), and returns when all have answered.

A push that reached no replica leaves the push pending (:class:`RolloutUnavailable`), so the next generation
pushes again; one that reached some replicas gives the trainer's weights the new version (``ready`` = those
that took it) and then raises RolloutUnavailable, and the next generation finds the others behind. A refusal
raises :class:`~trainer_service.rollout.policy_versions.WeightPushError`.

Async rollout streams the push after an optimizer step from a thread (:meth:`ReplicaPush.push_in_background`):
the version is given at once, and whatever needs the replicas to serve it, or the tensors to stay unchanged,
waits for the stream first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, wait
from typing import Any

import torch
from peft import PeftModel, get_peft_model_state_dict

from trainer_service.rollout.full_weights import full_state_dict
from trainer_service.rollout.policy_versions import PolicyVersions, WeightPushError, describe
from trainer_service.rollout.replicas import ReplicaAddress, RolloutUnavailable, may_recover
from trainer_service.rollout.weight_transport import WeightTransports

log = logging.getLogger(__name__)


class ReplicaPush:
    """Sends the policy's weights to the replicas under the next version of ``versions``, over
    ``transports``; counts the pushes and their seconds."""

    def __init__(self, versions: PolicyVersions, transports: WeightTransports) -> None:
        self.versions = versions
        self.transports = transports
        # The background push in flight, if any (see push_in_background).
        self.transfer: Future | None = None
        self.pushes = 0
        self.last_push_seconds = 0.0
        self.total_push_seconds = 0.0
        # Whether a LoRA payload carries the embedding layers; settled by the first push (see _adapter).
        self._embedding_layers: bool | None = None

    def payload(self, trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """(state dict to send, adapter config or None). Collective under ZeRO-3/FSDP: call on every rank.

        Every tensor is gathered (:mod:`~trainer_service.rollout.full_weights`) before anything is sent. On
        one process the tensors are the model's own (sent from their memory, moved to CPU only where they are
        elsewhere), which is safe because a push finishes before the next optimizer step changes them."""
        accelerator = trainer.accelerator
        model = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
        unwrapped = accelerator.unwrap_model(model)
        if isinstance(unwrapped, PeftModel):
            adapter = full_state_dict(accelerator, model, lambda tensors: self._adapter(unwrapped, tensors))
            config = unwrapped.peft_config[unwrapped.active_adapter]
            adapter_config = json.loads(json.dumps(config.to_dict(), default=_json_default))
            return adapter, adapter_config
        return full_state_dict(accelerator, model), None

    def _adapter(self, model: PeftModel, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """PEFT's adapter state dict of ``tensors``. PEFT's default ``save_embedding_layers="auto"`` reads the
        base model's config.json from disk on every call (has the vocabulary been resized?), a fifth of a
        small adapter's push; the answer cannot change during a run, so the first push settles it."""
        if self._embedding_layers is None:
            auto = get_peft_model_state_dict(model, state_dict=tensors)
            without = get_peft_model_state_dict(model, state_dict=tensors, save_embedding_layers=False)
            self._embedding_layers = auto.keys() != without.keys()
            return auto
        embedding_layers = self._embedding_layers
        return get_peft_model_state_dict(model, state_dict=tensors, save_embedding_layers=embedding_layers)

    def push(self, trainer: Any, members: list[ReplicaAddress] | None = None) -> int:
        """Send the current weights to every replica with the next version; every rank returns that version.

        ``members``: where to send (the members just woken in sleep mode); None resolves them again. A failure
        on the main process is shared with every rank (see the module docstring for what each one leaves).
        """
        self.settle_transfer()
        started = time.perf_counter()
        versions = self.versions
        versions.push_pending = True
        state_dict, adapter_config = self.payload(trainer)

        def push_everywhere() -> tuple[int, list[ReplicaAddress], str]:
            plan = versions.next_version(members if members is not None else versions.members())
            return self._send(*plan, state_dict, adapter_config)

        version, applied, problems = versions.on_main(trainer, push_everywhere)
        versions.current_version = int(version)
        self._pushed(trainer, version, applied, problems, started)
        return int(version)

    def _send(
        self,
        version: int,
        targets: list[ReplicaAddress],
        problems: list[str],
        state_dict: dict[str, torch.Tensor],
        adapter_config: dict[str, Any] | None,
    ) -> tuple[int, list[ReplicaAddress], str]:
        """Send the weights to ``targets`` under ``version``, each over its transport.

        Returns (version, members that applied it, what failed or ""). Raises RolloutUnavailable when no
        member took it (nothing changed), WeightPushError when a member refused it.
        """
        replicas = self.versions.replicas
        assert replicas is not None
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
                problems.append(describe(member.address, f"weight push of version {version}", outcome))
            else:
                refused.append(describe(member.address, f"weight push of version {version}", outcome))
        self.versions.applied(applied)
        if refused:
            raise WeightPushError("the rollout replica refused the weights: " + "; ".join(refused))
        if not applied:
            raise RolloutUnavailable("weight push failed: " + "; ".join(problems))
        return version, applied, "; ".join(problems)

    def _pushed(
        self, trainer: Any, version: int, applied: list[ReplicaAddress], problems: str, started: float
    ) -> None:
        """Record a push that reached ``applied``; raise RolloutUnavailable when others missed it."""
        self.versions.served(trainer, applied)
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
        versions = self.versions
        versions.push_pending = True
        state_dict, adapter_config = self.payload(trainer)
        version, targets, problems = versions.next_version(versions.members())
        versions.current_version = version
        transfer: Future = Future()

        def stream() -> None:
            try:
                _, applied, missed = self._send(version, targets, problems, state_dict, adapter_config)
                self._pushed(trainer, version, applied, missed, started)
                transfer.set_result(version)
            except BaseException as error:  # reported by settle_transfer on the trainer's thread
                transfer.set_exception(error)

        self.transfer = transfer
        threading.Thread(target=stream, name=f"weight-push-{version}", daemon=True).start()

    @property
    def transferring(self) -> bool:
        """A background push was started and not settled yet (it may have finished)."""
        return self.transfer is not None

    def wait_for_transfer(self) -> None:
        """Block until the background push (if any) has ended, without consuming its outcome."""
        transfer = self.transfer
        if transfer is not None:
            wait([transfer])

    def settle_transfer(self) -> None:
        """Wait for the background push and report its outcome (see :meth:`push_in_background`)."""
        transfer, self.transfer = self.transfer, None
        if transfer is None:
            return
        try:
            transfer.result()
        except RolloutUnavailable as error:
            log_deferred(error)

    # -- what the pushes cost --------------------------------------------------------------------------------
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


def log_deferred(error: RolloutUnavailable) -> None:
    """A push that did not reach every replica: the next generation waits for the replicas and pushes to
    those that lack these weights."""
    log.warning("%s; the push is retried before the next generation", error)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "value"):  # enums such as TaskType
        return value.value
    return str(value)
