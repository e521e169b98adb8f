"""Entry point of a run's worker process (started with ``spawn`` by :mod:`trainer_service.core.runs`).

The worker parses the config again, runs :func:`trainer_service.training.job.run_job` and reports every event
on a multiprocessing queue. Its last event always has an ended state: COMPLETED, STOPPED, or FAILED with the
error. A crash that kills the process outright (segfault, OOM kill) is noticed by the run manager instead,
which then reports the tail of the worker's log (its stdout and stderr, ``<output>/worker.log``).

The worker never outlives the service that started it: it leads its own process group (the reward and rollout
services it may start for the run are in it), asks the kernel for SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``) and, should that be missed, a watchdog thread polls the parent's pid; either
way the whole group is SIGKILLed. It holds the output directory's lock until its run ends and, on a resume
of a run that already completed, trains nothing (:mod:`trainer_service.core.output_dir`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from grpo_runtime.config import ADMIN_TOKEN_ENV
from trainer_service.config.run_config import parse_config
from trainer_service.core import output_dir as outputs
from trainer_service.core.types import JobEvent, RunState
from trainer_service.training.job import run_job

log = logging.getLogger(__name__)

WORKER_LOG = "worker.log"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.25


def _kill_own_group(*_: Any) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    _kill_own_group()


def _die_with_parent(parent_pid: int) -> None:
    """Kill this worker's process group as soon as ``parent_pid`` (the service) is gone."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, _kill_own_group)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        logging.getLogger(__name__).warning("prctl(PR_SET_PDEATHSIG) failed (errno %d)", ctypes.get_errno())
    if os.getppid() != parent_pid:  # died before the prctl took effect
        _kill_own_group()
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()


def run_worker(
    config_yaml: str, resume: bool, queue: Any, stop_event: Any, log_path: Path, parent_pid: int
) -> None:
    """Train one run; put :class:`JobEvent` objects on ``queue``; ``stop_event`` asks for a stop at a step
    end. The process's stdout and stderr (file descriptors 1 and 2) are appended to ``log_path``; it dies
    with ``parent_pid``.
    """
    _die_with_parent(parent_pid)
    # The service's own admin token is not the run's: a run sends only the token its config names.
    os.environ.pop(ADMIN_TOKEN_ENV, None)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    last = {"step": 0, "total": 0}

    def sink(event: JobEvent) -> None:
        last["step"], last["total"] = event.step, event.total_steps
        queue.put(event)

    lock_fd: int | None = None
    try:
        config = parse_config(config_yaml)
        lock_fd = outputs.hold_lock(config.output_dir)
        final = outputs.completed_resume(config, resume)
        if final is None:
            result = run_job(config, sink=sink, stop_flag=stop_event, resume=resume)
            if result.state is RunState.COMPLETED:
                outputs.record_completion(config.output_dir, result.step, result.total_steps)
            note = "run completed" if result.state is RunState.COMPLETED else "run stopped; checkpoint saved"
            final = JobEvent(
                step=result.step,
                total_steps=result.total_steps,
                state=result.state,
                message=f"{note} (step {result.step}/{result.total_steps}, output {result.output_dir})",
            )
    except BaseException as exc:  # the worker must always report how it ended
        log.exception("run failed")
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        final = JobEvent(step=last["step"], total_steps=last["total"], state=RunState.FAILED, message=detail)
    if lock_fd is not None:
        # Nothing writes the directory any more: a client that sees the final event may resume into it at
        # once, while this process is still exiting.
        os.close(lock_fd)
    queue.put(final)
