"""Trainer callbacks of a run: metrics.jsonl + events, and stopping at a step boundary.

The weight push lives in :mod:`trainer_service.rollout.weight_sync`; these callbacks only observe and steer.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import matplotlib
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainer_service.core.types import EventSink, JobEvent, RunState

# Draw without a display (servers, CI); must be set before pyplot is imported.
matplotlib.use("Agg")
import matplotlib.pyplot as plt

METRICS_FILE = "metrics.jsonl"
EVAL_METRICS_FILE = "eval_metrics.jsonl"


class StopFlag(Protocol):
    """Anything with ``is_set()``: ``threading.Event`` or ``multiprocessing.Event``."""

    def is_set(self) -> bool: ...


def _numeric(logs: dict[str, Any]) -> dict[str, float]:
    """Keep the finite-or-NaN numbers of a log record (TRL also logs strings and lists sometimes)."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, (bool, int, float)):
            out[key] = float(value)
    return out


class MetricsCallback(TrainerCallback):
    """Append one JSON object per logged training step to ``metrics.jsonl`` and emit a :class:`JobEvent`.

    A line is ``{"step": global_step, "reward": ..., "loss": ..., <TRL metrics>, **extra()}``; the job's
    extras are ``policy_version`` (the version of the weights that generated the step's completions) and
    ``weight_sync/push_seconds`` (the last weight push, gather + serialize + stream + apply, in seconds).
    Only records that carry ``reward`` are training-step records (the end-of-training summary is not).
    On resume, lines of steps beyond the checkpoint's step are dropped first, here and in
    ``eval_metrics.jsonl`` (written by :mod:`~trainer_service.training.evaluation`), so each file has each
    step once.
    Written on the main process only.
    """

    def __init__(
        self, output_dir: Path, sink: EventSink, extra: Callable[[], dict[str, float | None]] | None = None
    ):
        self.path = Path(output_dir) / METRICS_FILE
        self.eval_path = Path(output_dir) / EVAL_METRICS_FILE
        self._sink = sink
        # Values the trainer adds to each record (policy version, weight-push time); None values are left out.
        self._extra = extra

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for path in (self.path, self.eval_path):
            keep_records_through(path, state.global_step)
        self._sink(JobEvent(step=state.global_step, total_steps=state.max_steps, state=RunState.RUNNING))

    def on_log(self, args, state: TrainerState, control, logs: dict[str, Any] | None = None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "reward" not in logs:
            return
        record = {"step": state.global_step, **_numeric(logs)}
        if self._extra is not None:
            record.update({key: float(value) for key, value in self._extra().items() if value is not None})
        with self.path.open("a") as out:
            out.write(json.dumps(record, allow_nan=True) + "\n")
        metrics = {key: value for key, value in record.items() if key != "step"}
        self._sink(
            JobEvent(
                step=state.global_step, total_steps=state.max_steps, state=RunState.RUNNING, metrics=metrics
            )
        )

    def on_save(self, args, state: TrainerState, control, **kwargs):
        if state.is_world_process_zero:
            self._sink(
                JobEvent(
                    step=state.global_step,
                    total_steps=state.max_steps,
                    state=RunState.RUNNING,
                    message=f"checkpoint saved: checkpoint-{state.global_step}",
                )
            )


class StopCallback(TrainerCallback):
    """Stop at the next optimizer-step boundary and save a checkpoint when the stop flag is set.

    Sets ``control.should_training_stop`` and ``control.should_save`` in ``on_step_end``, so the HF Trainer
    writes a full checkpoint (adapter, optimizer, scheduler, RNG, data position) before leaving the loop.
    """

    def __init__(self, flag: StopFlag | None = None):
        self.flag = flag if flag is not None else threading.Event()
        self.stopped_early = False

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        if self.flag.is_set() and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_early = True
        return control


def complete_lines(text: str) -> list[str]:
    """The non-blank lines of a JSON-lines file that end with a newline. Each record is written with its
    newline, so a last line without one is a record still being written (a reader of a live run's file) or
    one cut short by a kill: not a record yet."""
    lines = text.split("\n")[:-1]  # what follows the last newline is incomplete (or empty)
    return [line for line in lines if line.strip()]


def keep_records_through(path: Path, step: int) -> None:
    """Rewrite a JSON-lines file of per-step records (created empty when missing) keeping the records of
    steps up to ``step``: a resumed run writes the later ones again. A last line cut short goes too
    (:func:`complete_lines`)."""
    lines = complete_lines(path.read_text()) if path.exists() else []
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    path.write_text("".join(f"{line}\n" for line in kept))


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Read a ``metrics.jsonl`` file into a list of records (:func:`complete_lines`)."""
    return [json.loads(line) for line in complete_lines(Path(path).read_text())]


def plot_reward_curve(metrics_path: Path, out_path: Path, eval_path: Path | None = None) -> Path | None:
    """Draw mean reward per logged step (and its moving average) to a PNG; None when nothing was logged.

    With evaluation rows in ``eval_path`` (``eval_metrics.jsonl``), a second panel beside it plots the
    held-out greedy accuracy and pass@1 per evaluated step."""
    records = [r for r in read_metrics(metrics_path) if "reward" in r and math.isfinite(r["reward"])]
    if not records:
        return None
    steps = [r["step"] for r in records]
    rewards = [r["reward"] for r in records]
    window = max(1, len(rewards) // 10)
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    evaluations = read_metrics(eval_path) if eval_path is not None and Path(eval_path).exists() else []
    evaluations = [r for r in evaluations if "accuracy_greedy" in r]
    if evaluations:
        fig, (ax, eval_ax) = plt.subplots(1, 2, figsize=(12, 4))
        eval_steps = [r["step"] for r in evaluations]
        eval_ax.plot(
            eval_steps, [r["accuracy_greedy"] for r in evaluations], marker="o", label="greedy accuracy"
        )
        if all("pass@1" in r for r in evaluations):
            eval_ax.plot(eval_steps, [r["pass@1"] for r in evaluations], marker="s", label="pass@1 (sampled)")
        eval_ax.set_xlabel("optimizer step")
        eval_ax.set_ylabel("held-out")
        eval_ax.grid(alpha=0.3)
        eval_ax.legend()
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.4, label="reward")
    ax.plot(steps, smooth, label=f"moving mean ({window})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return Path(out_path)
