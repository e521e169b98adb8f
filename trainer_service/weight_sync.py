"""Keep the rollout service generating from the trainer's current policy.

Versions: the trainer owns a counter. Each push sends the weights with ``version = last + 1`` (the first push
of a run uses the service's version + 1, because the service only accepts increasing versions), and every
completion of the next generation must carry exactly that version (checked in :mod:`trainer_service.rollout`).
Without sleep mode the trainer pushes once at the start of training (initial or resumed weights) and after
every optimizer step, so ``policy_version = version_at_start + global_step`` and generation for step k+1
always sees the weights of step k.

With ``vllm_sleep_mode`` (trainer and rollout engine share one accelerator) the engine sleeps while the
trainer computes, and around each generation the order is: wake → push → generate → sleep, all before the
optimizer step. Weights are pushed after *every* wake, so the engine never generates from weights that were
restored from disk or host memory after a sleep (TRL #5312's bug: after a sleep/wake cycle colocated vLLM
served the base model).

What is pushed: a PEFT model sends its adapter (``get_peft_model_state_dict`` + ``adapter_config.json``); a
full fine-tune sends the whole state dict. Under DeepSpeed ZeRO-3 or FSDP, gathering the state dict is
collective, so every rank calls :meth:`WeightSync.push`; only the main process talks to the service, and the
new version is broadcast so every rank checks its own completions against it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import torch
from accelerate.utils import broadcast_object_list
from peft import PeftModel, get_peft_model_state_dict
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

log = logging.getLogger(__name__)


# Status codes of a rollout service that is down or restarting (after the channel's own quick retries).
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})


class RolloutUnavailable(RuntimeError):
    """The rollout service could not be reached for a weight operation; retry later."""


class WeightPushError(RuntimeError):
    """The rollout service refused a weight update (bad payload, version, auth, ...)."""


class WeightSync:
    """Pushes policy weights to the rollout service and knows which version it must be serving.

    ``client`` is a :class:`rollout_service.client.RolloutClient` (``push_lora``, ``push_state_dict``,
    ``status``, ``sleep``, ``wake_up``).
    """

    def __init__(self, client: Any, *, enabled: bool = True, sleep_mode: bool = False, sleep_level: int = 1):
        self.client = client
        self.enabled = enabled
        self.sleep_mode = sleep_mode
        self.sleep_level = sleep_level
        # Version the service serves for this run (None until the first push or status read).
        self.current_version: int | None = None
        # True from the start of a push until it succeeded: the service may serve older weights.
        self.push_pending = True
        self.pushes = 0
        self.last_push_seconds = 0.0
        self.total_push_seconds = 0.0

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

    def _service_version(self, trainer: Any) -> int:
        """The service's current version, read by the main process and shared (collective)."""
        version = self._status_version() if self._is_main(trainer) else None
        return int(self._share(trainer, version))

    # -- pushing --------------------------------------------------------------------------------------------
    def payload(self, trainer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """(state dict to send, adapter config or None). Collective under ZeRO-3/FSDP: call on every rank."""
        accelerator = trainer.accelerator
        model = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
        full = accelerator.get_state_dict(model)
        unwrapped = accelerator.unwrap_model(model)
        if isinstance(unwrapped, PeftModel):
            adapter = get_peft_model_state_dict(unwrapped, state_dict=full)
            config = unwrapped.peft_config[unwrapped.active_adapter]
            adapter_config = json.loads(json.dumps(config.to_dict(), default=_json_default))
            return _detached(adapter), adapter_config
        return _detached(full), None

    def push(self, trainer: Any) -> int:
        """Send the current weights with the next version; every rank returns that version.

        A failure on the main process is shared with every rank (no rank is left waiting in a collective):
        a service that is down or restarting raises :class:`RolloutUnavailable` and leaves the push pending,
        so the next generation pushes again; any other error raises :class:`WeightPushError`.
        """
        started = time.perf_counter()
        self.push_pending = True
        state_dict, adapter_config = self.payload(trainer)
        outcome: int | tuple[str, str] | None = None
        if self._is_main(trainer):
            try:
                base = self.current_version if self.current_version is not None else self._status_version()
                version = base + 1
                if adapter_config is not None:
                    self.client.push_lora(state_dict, version=version, adapter_config=adapter_config)
                else:
                    self.client.push_state_dict(state_dict, version=version)
                outcome = version
            except grpc.RpcError as error:
                outcome = (error.code().name, error.details() or "")
        outcome = self._share(trainer, outcome)
        if not isinstance(outcome, int):
            code, details = outcome
            if code in RETRYABLE_CODES:
                raise RolloutUnavailable(f"weight push failed: {code} {details}")
            raise WeightPushError(f"the rollout service refused the weights: {code} {details}")
        self.current_version = outcome
        self.push_pending = False
        self.pushes += 1
        self.last_push_seconds = time.perf_counter() - started
        self.total_push_seconds += self.last_push_seconds
        return outcome

    def _status_version(self) -> int:
        return int(self.client.status().policy_version)

    def on_train_begin(self, trainer: Any) -> None:
        """Push the initial (or resumed) weights; with sync off, adopt whatever version the service has."""
        if not self.enabled:
            self.current_version = self._service_version(trainer)
        elif not self.sleep_mode:
            self._push_or_defer(trainer)
        trainer.accelerator.wait_for_everyone()

    def after_optimizer_step(self, trainer: Any) -> None:
        """Push the updated weights before the next generation (sleep mode pushes at the next wake
        instead)."""
        if self.enabled and not self.sleep_mode:
            self._push_or_defer(trainer)
        trainer.accelerator.wait_for_everyone()

    def _push_or_defer(self, trainer: Any) -> None:
        try:
            self.push(trainer)
        except RolloutUnavailable as error:
            # The next generation waits for the service and pushes these weights (push_pending).
            log.warning("%s; the push is retried before the next generation", error)

    @contextmanager
    def generation(self, trainer: Any) -> Iterator[int]:
        """Bracket one generation; yields the version every completion must carry.

        Sleep mode: the main process wakes the engine, the weights are pushed (after every wake), all ranks
        generate, then the main process puts the engine back to sleep, before the trainer's forward pass.
        """
        if not self.sleep_mode:
            if not self.enabled:
                # Sync off: the service keeps whatever it serves; expect its version as it is now.
                self.current_version = self._service_version(trainer)
            elif self.push_pending or self._service_version(trainer) != self.current_version:
                # Never pushed, a push that failed, or the service restarted (it came back with its base
                # weights and version): push the current weights again.
                self.push(trainer)
            yield self.current_version
            return
        if self._is_main(trainer):
            self.client.wake_up()
        if self.enabled:
            self.push(trainer)
        elif self.current_version is None:
            self.current_version = self._service_version(trainer)
        trainer.accelerator.wait_for_everyone()
        try:
            yield self.current_version
        finally:
            trainer.accelerator.wait_for_everyone()
            if self._is_main(trainer):
                self.client.sleep(self.sleep_level)


def _detached(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies that own their memory (tied weights share storage, which safetensors refuses)."""
    return {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in state_dict.items()}


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

    def __init__(self, sync: WeightSync, trainer_ref: Any = None):
        self.sync = sync
        self.trainer = trainer_ref

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.sync.on_train_begin(self.trainer)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.sync.after_optimizer_step(self.trainer)

    def state(self) -> dict:
        return {"args": {}, "attributes": {"policy_version": self.sync.current_version}}
