"""Entry point of a run's worker process (started with ``spawn`` by :mod:`trainer_service.core.runs`).

The worker parses the config again, runs :func:`trainer_service.training.job.run_job` and reports every event
on a multiprocessing queue. Its last event always has an ended state: COMPLETED, STOPPED, or FAILED with the
error. A crash that kills the process outright (segfault, OOM kill) is noticed by the run manager instead,
which then reports the tail of the worker's log (its stdout and stderr, ``<output>/worker.log``).
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any

from trainer_service.config.run_config import parse_config
from trainer_service.core.types import JobEvent, RunState
from trainer_service.training.job import run_job

log = logging.getLogger(__name__)

WORKER_LOG = "worker.log"


def run_worker(config_yaml: str, resume: bool, queue: Any, stop_event: Any, log_path: Path) -> None:
    """Train one run; put :class:`JobEvent` objects on ``queue``; ``stop_event`` asks for a stop at a step
    end. The process's stdout and stderr (file descriptors 1 and 2) are appended to ``log_path``.
    """
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    last = {"step": 0, "total": 0}

    def sink(event: JobEvent) -> None:
        last["step"], last["total"] = event.step, event.total_steps
        queue.put(event)

    try:
        config = parse_config(config_yaml)
        result = run_job(config, sink=sink, stop_flag=stop_event, resume=resume)
    except BaseException as exc:  # the worker must always report how it ended
        log.exception("run failed")
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        queue.put(
            JobEvent(step=last["step"], total_steps=last["total"], state=RunState.FAILED, message=detail)
        )
        return
    note = "run completed" if result.state is RunState.COMPLETED else "run stopped; checkpoint saved"
    queue.put(
        JobEvent(
            step=result.step,
            total_steps=result.total_steps,
            state=result.state,
            message=f"{note} (step {result.step}/{result.total_steps}, output {result.output_dir})",
        )
    )
