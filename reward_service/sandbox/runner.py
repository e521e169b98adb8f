"""Runs one untrusted Python program in a throw-away sandbox (see ``backends``) and reports what it did.

Around the backend's isolation the runner adds:

* when the service runs as root, the sandbox starts as an unprivileged host uid (``run_as_uid``, default
  65534): the kernel does not apply ``RLIMIT_NPROC`` to uid 0, and root inside the sandbox must own nothing
  outside it;
* the limits of ``limits.RunLimits`` and a wall-clock timeout; at the timeout, an output overflow or a
  cancelled request the sandbox's PID 1 is ``SIGKILL``ed, the kernel kills everything left in its PID
  namespace (daemons included), then the sandbox's process group;
* stdin from an in-memory file, stdout and stderr read up to ``max_output_bytes`` (more kills the run); of
  stderr only a sanitized excerpt of ``error_excerpt_bytes`` ever leaves the runner (``RunResult.failure``);
* fair sharing: run slots are handed out round-robin between sessions (one per Score request), and each
  session has a CPU-seconds budget (``max_cpu_s_per_request``) that its runs' measured CPU time draws from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from reward_service.sandbox.backends import (
    KernelOptions,
    SandboxBackend,
    SandboxUnavailable,
    make_backend,
    memfd_with,
)
from reward_service.sandbox.fair import FairSlots, Lane
from reward_service.sandbox.limits import RunLimits, describe
from reward_service.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

# How long to wait for the killed sandbox to be reaped and its pipes to close (seconds).
REAP_TIMEOUT_S = 5.0


@dataclass
class RunResult:
    """Outcome of one run. ``failure`` is empty when the program ran to completion with exit code 0; it holds
    at most a bounded, sanitized excerpt of what the program printed. ``stdout`` is for comparison only."""

    stdout: str
    exit_code: int | None
    duration_s: float
    cpu_s: float = 0.0
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


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
        s = self.settings
        if len(program.encode()) > s.max_program_bytes:
            return RunResult("", None, 0.0, failure=f"program larger than {s.max_program_bytes} bytes")
        session = session or self.session()
        async with session.lane.slot():
            cpu_s = min(s.cpu_time_s, session.cpu_left_s)
            if cpu_s < 1:
                return RunResult(
                    "",
                    None,
                    0.0,
                    failure=f"request CPU budget spent (sandbox.max_cpu_s_per_request="
                    f"{s.max_cpu_s_per_request:g})",
                )
            session.cpu_left_s -= cpu_s  # reserved now, so concurrent runs of the session cannot overdraw
            try:
                result = await self._run(program, stdin, RunLimits.from_settings(s, cpu_s))
            except OSError as exc:  # the host could not start a sandbox now (processes, memory, files)
                log.warning("code sandbox: cannot start a run: %s", exc)
                result = RunResult("", None, 0.0, failure=f"sandbox could not start: {exc.strerror or exc}")
            session.cpu_left_s += cpu_s - result.cpu_s
            return result

    async def _run(self, program: str, stdin: str, limits: RunLimits) -> RunResult:
        launch = self.backend.prepare(program.encode(), limits)
        try:
            stdin_fd = memfd_with("sandbox-stdin", stdin.encode())
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
                os.close(stdin_fd)
            return await self._supervise(proc, start, limits)
        finally:
            await asyncio.to_thread(launch.cleanup)

    @staticmethod
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

    async def _supervise(self, proc: subprocess.Popen, start: float, limits: RunLimits) -> RunResult:
        s = self.settings
        loop = asyncio.get_running_loop()
        assert proc.stdout and proc.stderr
        readers, transports = [], []
        for pipe in (proc.stdout, proc.stderr):
            stream = asyncio.StreamReader()
            transport, _ = await loop.connect_read_pipe(
                lambda stream=stream: asyncio.StreamReaderProtocol(stream), pipe
            )
            transports.append(transport)
            readers.append(_CappedReader(stream, s.max_output_bytes, s.error_excerpt_bytes * 4))
        out, err = readers
        reading = [asyncio.ensure_future(r.run()) for r in readers]
        # The exit is awaited through a pidfd so that wait4 gives the run's CPU time (the sandbox's init
        # reaps every process of the run, so its children's times add up to the sandbox's).
        pidfd = os.pidfd_open(proc.pid)
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        overflow = [asyncio.ensure_future(r.overflow.wait()) for r in readers]
        failure = ""
        try:
            done, _ = await asyncio.wait(
                [exited, *overflow], timeout=s.wall_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                failure = f"timed out after {s.wall_timeout_s:g}s"
            elif exited not in done:
                failure = f"output exceeded {s.max_output_bytes} bytes"
        finally:
            # Whatever happened (the request may be cancelled too), nothing the run started may survive it.
            await self._kill(proc.pid, exited)
            for task in overflow:
                task.cancel()
            loop.remove_reader(pidfd)
            os.close(pidfd)
            pid, status, usage = os.wait4(proc.pid, 0 if exited.done() else os.WNOHANG)
            if pid == 0:  # not reaped in time (it cannot run on: it is SIGKILLed); Popen reaps it later
                status, usage = signal.SIGKILL, None
            proc.returncode = os.waitstatus_to_exitcode(status)
            await asyncio.wait(reading, timeout=REAP_TIMEOUT_S)
            for task in reading:
                task.cancel()
            for transport in transports:
                transport.close()
        cpu_s = usage.ru_utime + usage.ru_stime if usage else 0.0
        if failure:  # killed: the CPU time of its processes is lost with them; charge the whole allowance
            cpu_s = max(cpu_s, limits.cpu_s)
        if not failure and proc.returncode != 0:
            failure = _describe_exit(status, bytes(err.tail), s.error_excerpt_bytes)
        stdout = out.head.decode(errors="replace")
        return RunResult(stdout, proc.returncode, time.monotonic() - start, cpu_s, failure)


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
