"""A rich progress bar for the command line: steps done, reward and loss of the last logged step."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from trainer_service.core.types import JobEvent


def _fmt(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


class ProgressSink:
    """An event sink that draws ``step/total [bar] reward loss`` and prints messages above the bar.

    Use as a context manager around the job: ``with ProgressSink() as sink: run_job(config, sink=sink)``.
    """

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward [green]{task.fields[reward]}"),
            TextColumn("loss [cyan]{task.fields[loss]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=None, reward="-", loss="-")

    def __enter__(self) -> ProgressSink:
        self._progress.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._progress.stop()

    def __call__(self, event: JobEvent) -> None:
        total = event.total_steps or None
        fields: dict[str, Any] = {}  # rich task fields, as Progress.update takes them
        if "reward" in event.metrics:
            fields["reward"] = _fmt(event.metrics.get("reward"))
        if "loss" in event.metrics:
            fields["loss"] = _fmt(event.metrics.get("loss"))
        self._progress.update(self._task, completed=event.step, total=total, **fields)
        if event.message:
            self._progress.console.print(f"[dim]{event.message}")
