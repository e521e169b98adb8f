"""Domain types of the trainer service: run states, the events a job reports, what a run looks like.

A job emits :class:`JobEvent` objects to a sink (a plain callable). The CLI's sink draws a progress bar; the
service's sink puts them on a multiprocessing queue read by the run manager. Events are plain dataclasses of
built-in types so they pickle across the process boundary.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class RunState(enum.StrEnum):
    """Lifecycle of a run (mirrors ``grpo.trainer.v1.RunState``)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (RunState.COMPLETED, RunState.STOPPED, RunState.FAILED)


@dataclass(frozen=True)
class JobEvent:
    """One report from a job: after a logged step, a checkpoint, a state change or an error.

    ``step`` counts optimizer steps done; ``metrics`` holds the logged values of that step (TRL's names:
    ``reward``, ``loss``, ``kl``, ``rewards/accuracy/mean`` ...) plus ``policy_version``.
    """

    step: int
    total_steps: int
    state: RunState
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""
    time: float = field(default_factory=time.time)


@dataclass
class RunInfo:
    """What GetRun / ListRuns report about a run."""

    run_id: str
    state: RunState
    step: int
    total_steps: int
    output_dir: str
    metrics: dict[str, float]
    message: str
    created_at: float


EventSink = Callable[[JobEvent], None]


def discard(_event: JobEvent) -> None:
    """An event sink that drops everything."""
