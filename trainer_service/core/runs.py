"""The trainer service's core: runs, each in its own worker process, and their event histories.

A run is started in a ``spawn``-ed process (gRPC is not fork-safe, and a crash, OOM kill or CUDA error in
one run must never take the service down). The worker puts :class:`JobEvent` objects on a multiprocessing
queue; one reader thread per run moves them into the run's history on the service's event loop, where
:meth:`RunManager.watch` streams them: first the history, then live events, ending when the run ends. A worker
that dies without reporting an end is marked FAILED with its exit code.

StartRun's caller may be hostile: its YAML is parsed off the event loop within size, depth and alias limits,
every path in it is confined to the service's roots and every importable name (function tools, reporting
integrations) to its allow-lists (:mod:`trainer_service.core.confinement`), at most
``max_concurrent_runs`` runs live at once, and an output directory a live worker holds (its lock, see
:mod:`trainer_service.core.output_dir`) is refused.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue as queue_module
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_runtime.config import ConfigError, YamlLimits, safe_load_yaml_async
from grpo_runtime.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from trainer_service.config.run_config import parse_config
from trainer_service.core.confinement import RunAllowList, RunRoots, confine
from trainer_service.core.output_dir import check_unlocked
from trainer_service.core.types import JobEvent, RunInfo, RunState
from trainer_service.core.worker import WORKER_LOG, run_worker
from trainer_service.settings import TrainerServiceSettings

_SPAWN = multiprocessing.get_context("spawn")
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A run config is a few KiB; these bound what one StartRun costs to parse (PyYAML: ~1 s per 100 KiB here).
CONFIG_YAML_LIMITS = YamlLimits(max_bytes=256 * 1024, max_depth=32, max_aliases=100, max_nodes=100_000)
# Config errors one INVALID_ARGUMENT message lists; the rest are counted ("and N more").
MAX_REPORTED_CONFIG_ERRORS = 20


@dataclass
class _Run:
    run_id: str
    output_dir: Path
    created_at: float
    process: Any
    queue: Any
    stop_event: Any
    state: RunState = RunState.PENDING
    step: int = 0
    total_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""
    events: list[JobEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def info(self) -> RunInfo:
        return RunInfo(
            run_id=self.run_id,
            state=self.state,
            step=self.step,
            total_steps=self.total_steps,
            output_dir=str(self.output_dir),
            metrics=dict(self.metrics),
            message=self.message,
            created_at=self.created_at,
        )


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


class RunManager:
    """Starts, watches and stops runs. Create it inside the running event loop (the servicer's)."""

    def __init__(self, settings: TrainerServiceSettings | None = None, *, poll_s: float = 0.5):
        self._loop = asyncio.get_running_loop()
        self._runs: dict[str, _Run] = {}
        self._poll_s = poll_s
        self._settings = settings or TrainerServiceSettings()
        self._roots = RunRoots.of(self._settings)
        self._allowed = RunAllowList.of(self._settings)

    # -- starting -----------------------------------------------------------------------------------------
    async def start(self, config_yaml: str, run_id: str = "", resume: bool = False) -> str:
        """Validate the config and start its worker; returns the run id."""
        try:
            raw = await safe_load_yaml_async(config_yaml, what="config_yaml", limits=CONFIG_YAML_LIMITS)
            # Validating up to CONFIG_YAML_LIMITS.max_nodes values takes a while too: off the loop as well.
            config = await asyncio.to_thread(parse_config, raw)
        except ConfigError as exc:  # YAML errors start with "config_yaml: ", run-config ones with the key
            message = "; ".join(exc.lines(limit=MAX_REPORTED_CONFIG_ERRORS)).removeprefix("config_yaml: ")
            raise InvalidArgument(message, field="config_yaml") from exc
        self._check_run_id(run_id)
        # Path resolution, mkdir and the lock probe touch the file system: off the loop. The capacity is
        # checked after the paths so that a bad path is reported as such whatever the load.
        output_dir = await asyncio.to_thread(confine, config, self._roots, self._allowed)
        self._check_capacity()
        await asyncio.to_thread(self._prepare_output, output_dir)
        # Checked again: other StartRuns may have registered while this one waited.
        self._check_run_id(run_id)
        self._check_capacity()
        run_id = run_id or uuid.uuid4().hex[:12]
        for other in self._runs.values():
            if not other.state.ended and other.output_dir == output_dir:
                raise FailedPrecondition(
                    f"output: run {other.run_id!r} is still writing to {output_dir}; choose another "
                    "output or experiment_name",
                    field="config_yaml",
                )
        events = _SPAWN.Queue()
        stop_event = _SPAWN.Event()
        # Started from the loop's thread, which lives as long as the service: the worker's parent-death
        # signal fires when the thread that forked it ends.
        process = _SPAWN.Process(
            target=run_worker,
            args=(config_yaml, resume, events, stop_event, output_dir / WORKER_LOG, os.getpid()),
            name=f"grpo-run-{run_id}",
            daemon=False,
        )
        run = _Run(
            run_id=run_id,
            output_dir=output_dir,
            created_at=time.time(),
            process=process,
            queue=events,
            stop_event=stop_event,
        )
        self._runs[run_id] = run
        process.start()
        self._append(run, JobEvent(step=0, total_steps=0, state=RunState.PENDING, message="worker started"))
        threading.Thread(
            target=self._read_events, args=(run,), name=f"grpo-run-{run_id}-events", daemon=True
        ).start()
        return run_id

    def _check_run_id(self, run_id: str) -> None:
        if run_id and not _RUN_ID.fullmatch(run_id):
            raise InvalidArgument(
                "must be 1 to 64 letters, digits, '.', '_' or '-' (or empty for a generated id)",
                field="run_id",
            )
        if run_id and run_id in self._runs:
            raise AlreadyExists(f"run {run_id!r} already exists", field="run_id")

    def _check_capacity(self) -> None:
        live = sum(not run.state.ended for run in self._runs.values())
        if live >= self._settings.max_concurrent_runs:
            raise ResourceExhausted(
                f"{live} runs are live, at most {self._settings.max_concurrent_runs}; wait for one to end or "
                "stop one",
                field="max_concurrent_runs",
            )

    @staticmethod
    def _prepare_output(output_dir: Path) -> None:
        """Create the (confined) output directory; FailedPrecondition when a live worker holds it."""
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
            check_unlocked(output_dir)
        except OSError as exc:
            raise InvalidArgument(
                f"output: cannot use {output_dir}: {exc.strerror or exc}", field="config_yaml"
            ) from exc

    # -- event plumbing -----------------------------------------------------------------------------------
    def _read_events(self, run: _Run) -> None:
        """Reader thread: queue → loop. Marks the run FAILED if its process dies without a final event."""
        while True:
            try:
                event = run.queue.get(timeout=self._poll_s)
            except queue_module.Empty:
                if run.process.is_alive():
                    continue
                # The process is gone; drain what it managed to send before deciding.
                try:
                    event = run.queue.get(timeout=self._poll_s)
                except queue_module.Empty:
                    code = run.process.exitcode
                    worker_log = run.output_dir / WORKER_LOG
                    event = JobEvent(
                        step=run.step,
                        total_steps=run.total_steps,
                        state=RunState.FAILED,
                        message=f"worker process exited with code {code} before reporting an end; "
                        f"last lines of {worker_log}:\n{_log_tail(worker_log)}",
                    )
            try:
                self._loop.call_soon_threadsafe(self._append, run, event)
            except RuntimeError:  # the service's loop has closed (shutdown): nobody is left to tell
                return
            if event.state.ended:
                run.process.join(timeout=30)
                return

    def _append(self, run: _Run, event: JobEvent) -> None:
        if run.state.ended:
            return
        # While a stop is pending, progress events keep the STOPPING state.
        state = event.state
        if run.state is RunState.STOPPING and not state.ended:
            state = RunState.STOPPING
            event = JobEvent(event.step, event.total_steps, state, event.metrics, event.message, event.time)
        run.state = state
        run.step = max(run.step, event.step) if not state.ended else event.step or run.step
        run.total_steps = event.total_steps or run.total_steps
        if event.metrics:
            run.metrics = dict(event.metrics)
        if event.message:
            run.message = event.message
        run.events.append(event)
        run.changed.set()
        run.changed = asyncio.Event()

    # -- queries --------------------------------------------------------------------------------------------
    def _get(self, run_id: str) -> _Run:
        if not run_id:
            raise InvalidArgument("is required", field="run_id")
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFound(f"no run {run_id!r}", field="run_id") from None

    def get(self, run_id: str) -> RunInfo:
        return self._get(run_id).info()

    def list(self) -> list[RunInfo]:
        return [run.info() for run in sorted(self._runs.values(), key=lambda r: r.created_at)]

    async def watch(self, run_id: str) -> AsyncIterator[JobEvent]:
        """The run's events so far, then new ones as they arrive; ends after the run's final event."""
        run = self._get(run_id)
        sent = 0
        while True:
            changed = run.changed
            while sent < len(run.events):
                yield run.events[sent]
                sent += 1
            if run.state.ended:
                return
            await changed.wait()

    # -- stopping --------------------------------------------------------------------------------------------
    def stop(self, run_id: str) -> RunInfo:
        """Ask the run to stop at its next step boundary (it saves a checkpoint); returns its info."""
        run = self._get(run_id)
        if run.state.ended:
            raise FailedPrecondition(f"run {run_id!r} has already ended ({run.state.value})", field="run_id")
        run.stop_event.set()
        self._append(
            run,
            JobEvent(
                step=run.step,
                total_steps=run.total_steps,
                state=RunState.STOPPING,
                message="stop requested; stopping at the next step boundary",
            ),
        )
        return run.info()

    async def wait(self, run_id: str, timeout_s: float | None = None) -> RunInfo:
        """Wait until the run ends (for tests and shutdown)."""

        async def _until_end() -> None:
            async for _ in self.watch(run_id):
                pass

        await asyncio.wait_for(_until_end(), timeout_s)
        return self.get(run_id)

    async def close(self, grace_s: float = 30.0) -> None:
        """Stop every live run (checkpointing at the next step), then terminate what is still running."""
        live = [run for run in self._runs.values() if not run.state.ended]
        for run in live:
            run.stop_event.set()
        deadline = time.monotonic() + grace_s
        for run in live:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(run.process.join, remaining)
            if run.process.is_alive():
                run.process.terminate()
                await asyncio.to_thread(run.process.join, 10)
            if run.process.is_alive():
                run.process.kill()
