"""The trainer side of the training guards: feed each logged step to :class:`~.guards.Guards` and carry out
its verdict; one JSON line per step in ``guards.jsonl``.

- **Inputs.** TRL's step log (``loss``, ``grad_norm``, ``completions/mean_length``, ``rewards/<term>/mean``,
  ``frac_reward_zero_std``), the step's completion token ids (:class:`CompletionRecorder`, wrapped around
  the ``rollout_func``) and the evaluation of that step, if one ran (:class:`EvaluationCallback`; the
  step-0 evaluation is the eval gate's baseline unless a baseline file gives one).
- **When.** In ``on_log``, which the HF Trainer calls after the optimizer step and weight push and before it
  saves the step's checkpoint, so a rollback can cancel that save; guards need ``logging_steps: 1``.
- **warn**: the line and a run event. **halt**: stop after this step, saving a checkpoint. **rollback**: load
  the newest checkpoint saved at a step where no guard fired (HF Trainer's own resume loaders: model or
  adapter weights, optimizer and scheduler), scale the learning rate by ``lr_factor ** rollbacks`` and β by
  ``beta_factor ** rollbacks``, push the restored weights to the rollout service, and skip this step's
  checkpoint. No good checkpoint yet: halt. The step counter keeps counting (the retried steps are part of
  ``max_steps``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState

from trainer_service.core.types import EventSink, JobEvent, RunState, discard
from trainer_service.rollout.weight_sync import WeightSync
from trainer_service.training.evaluation import EvaluationCallback
from trainer_service.training.guards import Guards, StepVerdict

GUARDS_FILE = "guards.jsonl"


class CompletionRecorder:
    """A ``rollout_func`` that passes through to ``rollout`` and keeps the token ids of the latest batch."""

    def __init__(self, rollout: Any):
        self.rollout = rollout
        self.last_completion_ids: list[list[int]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        result = self.rollout(prompts, trainer)
        self.last_completion_ids = result["completion_ids"]
        return result

    def __getattr__(self, name: str) -> Any:
        # What the trainer asks of the rollout itself (the async rollout's ``direct``, ...).
        return getattr(self.rollout, name)


class GuardCallback(TrainerCallback):
    """Runs the guards on every logged training step (register it after the evaluation callback). Set
    ``trainer`` before training; ``halted`` holds the verdict that stopped the run, if any."""

    def __init__(
        self,
        guards: Guards,
        output_dir: Path,
        sync: WeightSync,
        recorder: CompletionRecorder,
        evaluation: EvaluationCallback | None = None,
        sink: EventSink = discard,
    ):
        self.guards = guards
        self.path = Path(output_dir) / GUARDS_FILE
        self.sync = sync
        self.recorder = recorder
        self.evaluation = evaluation
        self.trainer: Any = None
        self.halted: StepVerdict | None = None
        self._sink = sink
        self._flagged: set[int] = set()  # steps where a guard fired: their checkpoints are not "good"
        self._good_checkpoints: list[Path] = []
        self._base_lrs: list[float] | None = None
        self._base_beta: float | None = None

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if state.is_world_process_zero:
            kept = []
            if self.path.exists():
                kept = [line for line in self.path.read_text().splitlines() if line.strip()]
                kept = [line for line in kept if json.loads(line)["step"] <= state.global_step]
            self.path.write_text("".join(f"{line}\n" for line in kept))
        gate = self.guards.eval_gate
        if gate is not None and self.evaluation is not None and self.evaluation.last is not None:
            gate.check(*self.evaluation.last)  # the step-0 evaluation becomes the baseline

    def on_log(
        self, args, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None, **kw
    ):
        if not logs or "reward" not in logs:
            return control
        step = int(state.global_step)
        last = self.evaluation.last if self.evaluation is not None else None
        evaluation = last[1] if last is not None and last[0] == step else None
        verdict = self.guards.judge(step, logs, self.recorder.last_completion_ids, evaluation)
        restored = None
        if verdict.findings:
            self._flagged.add(step)
        if verdict.action == "rollback":
            restored = self._last_good_checkpoint()
            if restored is None:
                verdict.action = "halt"
            else:
                self.guards.rollbacks += 1
                self._restore(restored)
                control.should_save = False
        if verdict.action == "halt":
            control.should_training_stop = True
            control.should_save = True
            self.halted = verdict
        self._write(state, verdict, restored)
        return control

    def on_save(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step not in self._flagged:
            self._good_checkpoints.append(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def _last_good_checkpoint(self) -> Path | None:
        # save_total_limit may have deleted older ones.
        existing = [path for path in self._good_checkpoints if path.is_dir()]
        return existing[-1] if existing else None

    def _restore(self, checkpoint: Path) -> None:
        """Weights, optimizer and scheduler from ``checkpoint``; lr and β scaled by the rollback count."""
        trainer = self.trainer
        rollback = self.guards.config.rollback
        if self._base_lrs is None:
            self._base_lrs = list(trainer.lr_scheduler.base_lrs)
            self._base_beta = float(trainer.beta)
        trainer._load_from_checkpoint(str(checkpoint))
        trainer._load_optimizer_and_scheduler(str(checkpoint))
        # The scheduler recomputes every group's lr from base_lrs at each step (LambdaLR and its kin); the
        # checkpoint's own lr (base × schedule) is rescaled to the new base now.
        scaled = [lr * rollback.lr_factor**self.guards.rollbacks for lr in self._base_lrs]
        loaded = list(trainer.lr_scheduler.base_lrs)
        for group, old_base, new_base in zip(trainer.optimizer.param_groups, loaded, scaled, strict=True):
            group["lr"] = group["lr"] * new_base / old_base if old_base else new_base
        trainer.lr_scheduler.base_lrs = scaled
        trainer.beta = self._base_beta * rollback.beta_factor**self.guards.rollbacks
        # The rollout service holds the rejected step's weights: give it the restored ones.
        self.sync.after_optimizer_step(trainer)

    def _write(self, state: TrainerState, verdict: StepVerdict, restored: Path | None) -> None:
        if not state.is_world_process_zero:
            return
        record = verdict.record()
        record["rollbacks"] = self.guards.rollbacks
        record["lr"] = float(self.trainer.optimizer.param_groups[0]["lr"])
        record["beta"] = float(self.trainer.beta)
        if restored is not None:
            record["restored"] = restored.name
        with self.path.open("a") as out:
            out.write(json.dumps(record, allow_nan=True) + "\n")
        if verdict.findings:
            names = ", ".join(
                f"{f.guard}:{f.signal}={f.value:.3g} (limit {f.limit:.3g})" for f in verdict.findings
            )
            where = f" from {restored.name}" if restored is not None else ""
            self._sink(
                JobEvent(
                    step=verdict.step,
                    total_steps=state.max_steps,
                    state=RunState.RUNNING,
                    message=f"guard at step {verdict.step}: {names} -> {verdict.action}{where}",
                )
            )
