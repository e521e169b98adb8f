"""Runs an untrusted Python program in throw-away sandboxes (see ``backends``), once per test, and reports
what it did.

Around the backend's isolation the runner adds:

* when the service runs as root, the sandbox starts as an unprivileged host uid (``run_as_uid``, default
  65534): the kernel does not apply ``RLIMIT_NPROC`` to uid 0, and root inside the sandbox must own nothing
  outside it;
* the limits of ``limits.RunLimits`` and a wall-clock timeout per test (bwrap: enforced by the sandbox's
  PID 1, ``launcher.py``, which kills everything of a test before the next; the runner kills the sandbox
  past ``batch_wall_s + wall_timeout_s`` + a margin); at a timeout, an output overflow or a cancelled
  request the sandbox's PID 1 is ``SIGKILL``ed, the kernel kills everything left in its PID namespace
  (daemons included), then the sandbox's process group;
* stdin from an in-memory file, stdout and stderr read up to ``max_output_bytes`` (more kills the run); of
  stderr only a sanitized excerpt of ``error_excerpt_bytes`` ever leaves the runner (``RunResult.failure``);
* fair sharing: run slots are handed out round-robin between sessions (one per Score request), and each
  session has a CPU-seconds budget (``max_cpu_s_per_request``) that its runs' measured CPU time draws from.
  A sandbox run holds one slot; with bwrap it goes on to the same program's next tests for up to
  ``batch_wall_s`` (not its start-up cost again for each), then the session takes its turn again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import signal
import subprocess
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_service.sandbox.backends import (
    KernelOptions,
    RunBatch,
    SandboxBackend,
    SandboxUnavailable,
    make_backend,
    memfd_with,
)
from reward_service.sandbox.fair import FairSlots, Lane
from reward_service.sandbox.limits import RunLimits, describe
from reward_service.sandbox.reports import HEADER_BYTES, TestReport, read_reports
from reward_service.sandbox.settings import SandboxSettings

if TYPE_CHECKING:
    import resource

log = logging.getLogger(__name__)

# How long to wait for the killed sandbox to be reaped and its pipes to close (seconds).
REAP_TIMEOUT_S = 5.0
# Margin of a sandbox run over the limits of its tests (start-up, kills, reaping), before the runner kills it.
BACKSTOP_S = 5.0


@dataclass
class RunResult:
    """Outcome of one run of a program (one test). ``failure`` is empty when the program ran to completion
    with exit code 0; it holds at most a bounded, sanitized excerpt of what the program printed. ``stdout``
    is for comparison only. ``limit``: the limit that ended it, "wall", "cpu" (RLIMIT_CPU), "output" or "".
    Seconds."""

    stdout: str
    exit_code: int | None
    duration_s: float
    cpu_s: float = 0.0
    failure: str = ""
    limit: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure

    @property
    def timed_out(self) -> bool:
        """Ended by the wall-clock or the CPU-time limit."""
        return self.limit in ("wall", "cpu")


def excerpt(data: bytes, limit: int) -> str:
    """The last non-blank line of ``data`` as valid, printable UTF-8 of at most ``limit`` bytes."""
    text = data.decode("utf-8", errors="replace")
    line = next((x for x in reversed(text.splitlines()) if x.strip()), "")
    clean = "".join(c if unicodedata.category(c)[0] != "C" else "?" for c in line.strip())
    encoded = clean.encode()
    if len(encoded) <= limit:
        return clean
    return encoded[: limit - 3].decode("utf-8", errors="ignore") + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe_exit(status: int, stderr_tail: bytes, limit: int) -> str:
    """A one-line reason for a non-zero exit: the signal, or the last line of what the program printed."""
    if os.WIFSIGNALED(status):
        return f"killed by {_signal_name(os.WTERMSIG(status))}"
    code = os.WEXITSTATUS(status)
    if code > 128 and code - 128 < 65:  # bwrap reports a program killed by a signal as 128 + signal
        return f"killed by {_signal_name(code - 128)}"
    last = excerpt(stderr_tail, limit)
    return f"exit code {code}" + (f": {last}" if last else "")


class _CappedReader:
    """Reads a stream to EOF keeping the first ``cap`` bytes (``head``) and the last ``tail_cap`` bytes
    (``tail``); ``overflow`` is set once more than ``cap`` arrived.

    Past the cap it keeps reading and discards: a reader that stopped would leave the pipe full and the
    writer blocked instead of killed."""

    def __init__(self, stream: asyncio.StreamReader, cap: int, tail_cap: int):
        self._stream = stream
        self._cap = cap
        self._tail_cap = tail_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.overflow = asyncio.Event()

    async def run(self) -> None:
        total = 0
        while chunk := await self._stream.read(65536):
            total += len(chunk)
            room = self._cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
            self.tail = (self.tail + chunk)[-self._tail_cap :]
            if total > self._cap:
                self.overflow.set()


class RunSession:
    """The runs of one request: their turn in the shared slots and their CPU-seconds budget."""

    def __init__(self, lane: Lane, cpu_budget_s: float):
        self.lane = lane
        self.cpu_left_s = cpu_budget_s


class _Started:
    """A started sandbox: its stdout and stderr as streams, its exit awaited through a pidfd (so that wait4
    gives the run's CPU time: the sandbox's init reaps every process of the run, so its children's times
    add up to the sandbox's)."""

    def __init__(self, proc: subprocess.Popen, stdout_limit: int):
        self.proc = proc
        self._loop = asyncio.get_running_loop()
        self.stdout = asyncio.StreamReader(limit=stdout_limit)
        self.stderr = asyncio.StreamReader()
        self._transports: list[asyncio.BaseTransport] = []
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except OSError:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        self.exited: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(self._pidfd, self._mark_exited)

    def _mark_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    async def connect(self) -> None:
        """Feeds the streams from the pipes (await it inside the ``try`` whose ``finally`` calls ``end``)."""
        assert self.proc.stdout and self.proc.stderr
        for pipe, stream in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            transport, _ = await self._loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, stream), pipe
            )
            self._transports.append(transport)

    async def end(self, reading: Sequence[asyncio.Future[Any]]) -> tuple[int, float | None]:
        """Kills whatever is left, reaps the sandbox, lets ``reading`` finish; (wait status, CPU seconds of
        the run, None when lost with a kill)."""
        pid = self.proc.pid
        try:
            await _kill(pid, self.exited)
        finally:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            done, status, rusage = os.wait4(pid, 0 if self.exited.done() else os.WNOHANG)
            usage: resource.struct_rusage | None = rusage
            if done == 0:  # not reaped in time (it cannot run on: it is SIGKILLed); Popen reaps it later
                status, usage = signal.SIGKILL, None
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            pipes = ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
            for pipe, stream in pipes[len(self._transports) :]:  # never connected (cancelled before)
                stream.feed_eof()
                if pipe is not None:
                    pipe.close()
            if reading:
                await asyncio.wait(reading, timeout=REAP_TIMEOUT_S)
            for task in reading:
                task.cancel()
            for transport in self._transports:
                transport.close()
        return status, usage.ru_utime + usage.ru_stime if usage else None


async def _kill(pid: int, exited: asyncio.Future[None]) -> None:
    """Kills a run from the inside out: the sandbox's PID 1 first (its namespace dies with it and bwrap
    reaps it), so that it is not orphaned to a host init that may never reap it; then the group."""
    if not exited.done():
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                os.kill(int(child), signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), 1.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(exited), REAP_TIMEOUT_S)


class SandboxRunner:
    """Runs programs with ``backend`` (by default the configured one, assuming the kernel allows everything;
    ``open_runner`` probes what it does allow)."""

    def __init__(self, settings: SandboxSettings, backend: SandboxBackend | None = None):
        self.settings = settings
        options = KernelOptions(mount_proc=settings.mount_proc != "false")
        self.backend = backend or make_backend(settings, options)
        self._slots = FairSlots(settings.concurrency)

    @property
    def mount_proc(self) -> bool:
        return self.backend.options.mount_proc

    def session(self) -> RunSession:
        return RunSession(self._slots.lane(), self.settings.max_cpu_s_per_request)

    async def run(self, program: str, stdin: str = "", session: RunSession | None = None) -> RunResult:
        """Runs ``program`` with ``stdin`` in ``session`` (a fresh one when None); never raises for anything
        the program does."""
        (result,) = await self.run_tests(program, [stdin], session)
        return result

    async def run_tests(
        self,
        program: str,
        stdins: Sequence[str],
        session: RunSession | None = None,
        stop_at_timeout: bool = False,
    ) -> list[RunResult]:
        """Runs ``program`` once per stdin, in order, in ``session`` (a fresh one when None): one result
        per stdin, or (``stop_at_timeout``) fewer, up to the first that hit the wall or CPU limit.

        Each run of a sandbox holds one slot and may go through several tests (``RunBatch``); between
        runs the session takes its turn again. Never raises for anything the program does."""
        s = self.settings
        if len(program.encode()) > s.max_program_bytes:
            too_big = RunResult("", None, 0.0, failure=f"program larger than {s.max_program_bytes} bytes")
            return [too_big] * len(stdins)
        session = session or self.session()
        encoded = [stdin.encode() for stdin in stdins]
        offsets = itertools.accumulate((len(x) for x in encoded), initial=0)
        spans = tuple(zip(offsets, (len(x) for x in encoded), strict=False))
        inputs_fd = memfd_with("sandbox-stdin", b"".join(encoded)) if self.backend.reports_tests else -1
        results: list[RunResult] = []
        try:
            while len(results) < len(stdins) and not (stop_at_timeout and results and results[-1].timed_out):
                first = len(results)
                stdin = inputs_fd if inputs_fd >= 0 else encoded[first]
                results += await self._run_batch(program, stdin, spans[first:], session, stop_at_timeout)
        finally:
            if inputs_fd >= 0:
                os.close(inputs_fd)
        return results

    async def _run_batch(
        self,
        program: str,
        stdin: int | bytes,
        spans: tuple[tuple[int, int], ...],
        session: RunSession,
        stop_at_timeout: bool,
    ) -> list[RunResult]:
        """One sandbox run, in one slot of ``session``'s turn: results of its first test and any it went on
        to (``stdin``: the inputs file of all tests, or the first test's input for a backend that runs one
        test). Its CPU grant is reserved from the session's budget while it runs."""
        s = self.settings
        async with session.lane.slot():
            batch_s = s.batch_wall_s if self.backend.reports_tests else 0.0
            grant_s = min(s.cpu_time_s + batch_s, session.cpu_left_s)
            if min(s.cpu_time_s, grant_s) < 1:
                return [
                    RunResult(
                        "",
                        None,
                        0.0,
                        failure=f"request CPU budget spent (sandbox.max_cpu_s_per_request="
                        f"{s.max_cpu_s_per_request:g})",
                    )
                ]
            session.cpu_left_s -= grant_s  # reserved now, so concurrent runs of the session cannot overdraw
            batch = RunBatch(
                limits=RunLimits.from_settings(s, min(s.cpu_time_s, grant_s)),
                inputs=spans,
                cpu_time_s=s.cpu_time_s,
                cpu_grant_s=grant_s,
                wall_timeout_s=s.wall_timeout_s,
                batch_wall_s=batch_s,
                stop_at_timeout=stop_at_timeout,
                max_output_bytes=s.max_output_bytes,
                tail_bytes=s.error_excerpt_bytes * 4,
            )
            try:
                results, charged_s = await self._start(program, stdin, batch)
            except OSError as exc:  # the host could not start a sandbox now (processes, memory, files)
                log.warning("code sandbox: cannot start a run: %s", exc)
                failure = f"sandbox could not start: {exc.strerror or exc}"
                results, charged_s = [RunResult("", None, 0.0, failure=failure)], 0.0
            session.cpu_left_s += grant_s - charged_s
            return results

    async def _start(
        self, program: str, stdin: int | bytes, batch: RunBatch
    ) -> tuple[list[RunResult], float]:
        """Starts the sandbox and supervises it; (results, CPU seconds to charge)."""
        launch = self.backend.prepare(program.encode(), batch)
        try:
            stdin_fd = stdin if isinstance(stdin, int) else memfd_with("sandbox-stdin", stdin)
            try:
                start = time.monotonic()
                proc = subprocess.Popen(
                    launch.argv,
                    stdin=stdin_fd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={},
                    cwd="/",
                    start_new_session=True,
                    pass_fds=launch.pass_fds,
                )
            finally:
                if not isinstance(stdin, int):
                    os.close(stdin_fd)
            if self.backend.reports_tests:
                return await self._supervise_tests(proc, batch)
            result = await self._supervise_program(proc, start, batch.limits)
            return [result], result.cpu_s
        finally:
            await asyncio.to_thread(launch.cleanup)

    async def _supervise_tests(
        self, proc: subprocess.Popen, batch: RunBatch
    ) -> tuple[list[RunResult], float]:
        """Reads the launcher's reports until it exits; kills the sandbox past its bound (every test's wall
        limit is the launcher's to enforce, this is the backstop) or on a malformed report."""
        s = self.settings
        started = _Started(proc, HEADER_BYTES)
        results: list[RunResult] = []
        extra_s = 0.0  # CPU allowance charged beyond the measured time, for tests the launcher killed

        def on_report(report: TestReport) -> None:
            nonlocal extra_s
            results.append(self._test_result(report))
            extra_s += max(0.0, report.cpu_limit_s - report.cpu_s) if report.killed else 0.0

        launcher_err = _CappedReader(started.stderr, s.error_excerpt_bytes * 4, s.error_excerpt_bytes * 4)
        reading = asyncio.ensure_future(read_reports(started.stdout, batch, on_report))
        tasks = [reading, asyncio.ensure_future(launcher_err.run())]
        problem = ""
        try:
            await started.connect()
            bound_s = batch.batch_wall_s + batch.wall_timeout_s + BACKSTOP_S
            done, _ = await asyncio.wait(
                [started.exited, reading], timeout=bound_s, return_when=asyncio.FIRST_EXCEPTION
            )
            if reading in done and reading.exception() is not None:
                problem = f"bad report: {reading.exception()}"
            elif not started.exited.done():
                problem = "timeout"
        finally:
            status, cpu_s = await started.end(tasks)
        if not problem and status != 0:  # bwrap's or the launcher's own message (the program has its pipes)
            problem = _describe_exit(status, bytes(launcher_err.tail), s.error_excerpt_bytes)
        if not problem and not results:
            problem = "no report"
        if problem and len(results) < len(batch.inputs):
            results.append(self._lost_test(problem))
        measured_s = cpu_s if cpu_s is not None else batch.cpu_grant_s
        charged_s = max(measured_s, batch.cpu_grant_s) if problem else measured_s + extra_s
        return results, charged_s

    def _test_result(self, report: TestReport) -> RunResult:
        s = self.settings
        status = report.status
        exit_code = None
        if status is not None:
            exit_code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        failure = ""
        if report.limit == "wall":
            failure = f"timed out after {s.wall_timeout_s:g}s"
        elif report.limit == "output":
            failure = f"output exceeded {s.max_output_bytes} bytes"
        elif status is None:
            failure = "sandbox run failed: the program was not reaped"
        elif status != 0:
            failure = _describe_exit(status, report.stderr_tail, s.error_excerpt_bytes)
        stdout = report.stdout.decode(errors="replace")
        return RunResult(stdout, exit_code, report.wall_s, report.cpu_s, failure, report.limit)

    def _lost_test(self, problem: str) -> RunResult:
        """The test a sandbox run was on when it ended without reporting it."""
        if problem == "timeout":
            wall_s = self.settings.wall_timeout_s
            return RunResult("", None, 0.0, failure=f"timed out after {wall_s:g}s", limit="wall")
        log.warning("code sandbox: a run ended early: %s", problem)
        return RunResult("", None, 0.0, failure=f"sandbox run failed: {problem}")

    async def _supervise_program(self, proc: subprocess.Popen, start: float, limits: RunLimits) -> RunResult:
        """A backend whose stdout and stderr are the program's: one test, timed and capped here."""
        s = self.settings
        started = _Started(proc, 2**16)
        out, err = (
            _CappedReader(stream, s.max_output_bytes, s.error_excerpt_bytes * 4)
            for stream in (started.stdout, started.stderr)
        )
        reading = [asyncio.ensure_future(r.run()) for r in (out, err)]
        overflow = [asyncio.ensure_future(r.overflow.wait()) for r in (out, err)]
        failure, limit = "", ""
        try:
            await started.connect()
            watched: list[asyncio.Future[Any]] = [started.exited, *overflow]
            done, _ = await asyncio.wait(
                watched, timeout=s.wall_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                failure, limit = f"timed out after {s.wall_timeout_s:g}s", "wall"
            elif started.exited not in done:
                failure, limit = f"output exceeded {s.max_output_bytes} bytes", "output"
        finally:
            # Whatever happened (the request may be cancelled too), nothing the run started may survive it.
            for task in overflow:
                task.cancel()
            status, cpu_s = await started.end(reading)
        if failure:  # killed: the CPU time of its processes is lost with them; charge the whole allowance
            cpu_s = max(cpu_s or 0.0, limits.cpu_s)
        if not failure and proc.returncode != 0:
            failure = _describe_exit(status, bytes(err.tail), s.error_excerpt_bytes)
            limit = "cpu" if failure == f"killed by {signal.SIGXCPU.name}" else ""
        stdout = out.head.decode(errors="replace")
        return RunResult(stdout, proc.returncode, time.monotonic() - start, cpu_s or 0.0, failure, limit)


PROBE_PROGRAM = "import os\nprint(os.getpid())\n"


async def _probe(settings: SandboxSettings, options: KernelOptions) -> tuple[SandboxRunner | None, str]:
    """A runner when a trivial program runs as PID 1 or 2 of its sandbox; else None and why not."""
    try:
        runner = SandboxRunner(settings, make_backend(settings, options))
        result = await runner.run(PROBE_PROGRAM)
    except (SandboxUnavailable, OSError) as exc:
        return None, str(exc)
    if result.ok and result.stdout.strip() in ("1", "2"):
        return runner, ""
    return None, f"probe run failed: {result.failure or result.stdout.strip()[:200]}"


async def open_runner(settings: SandboxSettings) -> tuple[SandboxRunner | None, str]:
    """Probes the configured backend once at start-up, strongest isolation first: with a fresh /proc
    (``mount_proc: auto`` falls back to none) and refusing nested user namespaces (dropped where the kernel
    refuses bwrap that). Returns (runner, status) — runner None and the reasons when nothing runs here."""
    procs = {"auto": (True, False), "true": (True,), "false": (False,)}[settings.mount_proc]
    candidates = [KernelOptions(p, u) for p in procs for u in (True, False)]
    if settings.backend == "runsc":
        candidates = [KernelOptions()]
    reasons = []
    for options in candidates:
        runner, reason = await _probe(settings, options)
        if runner is None:
            reasons.append(reason)
            continue
        if reasons:
            log.warning("code sandbox: weaker than configured here: %s", "; ".join(dict.fromkeys(reasons)))
        if settings.backend == "runsc":
            isolation = "runsc (gVisor user-space kernel): no network, minimal read-only root, its own /proc"
        else:
            proc = "a /proc of its own" if options.mount_proc else "no /proc (a fresh one was refused here)"
            userns = (
                "nested user namespaces refused"
                if options.disable_userns
                else "nested user namespaces NOT refused (bwrap --disable-userns was refused here)"
            )
            isolation = (
                f"bwrap (host kernel): namespaces, no network, minimal read-only root, {proc}, {userns}"
            )
        return runner, f"{isolation}; {describe(settings)}"
    return None, "; ".join(dict.fromkeys(reasons))
