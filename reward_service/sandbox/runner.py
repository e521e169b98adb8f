"""Runs one untrusted Python program in a throw-away sandbox and reports what it did.

Isolation per run (when the kernel allows unprivileged user namespaces):

* ``unshare --user --map-root-user --net --pid --fork --mount-proc --kill-child``: a fresh user, network
  (only a downed loopback: no network at all), PID (the program cannot see or signal the service) and mount
  namespace;
* when the service runs as root the run starts as an unprivileged uid (``run_as_uid``, default 65534) so root
  inside the namespace is nobody outside it and owns none of the host's files;
* private size-limited tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm``, locked against unmounting, and the
  scratch working dir inside it (see ``launcher.py``);
* rlimits: CPU seconds, address space, file size, open files, processes (``RLIMIT_NPROC`` is counted per user
  namespace, so concurrent runs do not share it), no core files;
* its own session/process group; a wall-clock timeout ``SIGKILL``s the whole group, and since the launcher is
  PID 1 of the namespace, its exit kills every process the program started (daemons included);
* an empty environment (``env={}`` for ``unshare`` and for the program): the service's secrets never reach it;
* stdout and stderr are read up to ``max_output_bytes``; a program that writes more is killed.

Without namespaces (``namespaces=False``, only when the settings accept weaker isolation) the same launcher
runs with rlimits, empty environment, own process group and a scratch dir under the service's temp dir, but
without network, PID or mount isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from reward_service.sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)

LAUNCHER_SOURCE = (Path(__file__).parent / "launcher.py").read_text()
MiB = 1024 * 1024
UNSHARE_FLAGS = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc", "--kill-child")
# How long to wait for the killed process to be reaped before reading its status directly (seconds).
REAP_TIMEOUT_S = 5.0


@dataclass
class RunResult:
    """Outcome of one run. ``failure`` is empty when the program ran to completion with exit code 0."""

    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe_exit(code: int, stderr: str) -> str:
    """A one-line reason for a non-zero exit: the signal, or the last line of the traceback."""
    if code > 128 and code - 128 < 65:
        return f"killed by {_signal_name(code - 128)}"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
    return f"exit code {code}" + (f": {last.strip()[:200]}" if last else "")


class _CappedReader:
    """Reads a stream to EOF keeping at most ``cap`` bytes; ``overflow`` is set once more arrived.

    Past the cap it keeps reading and discards: a reader that stopped would leave the pipe full, its
    transport paused before EOF, and (Python < 3.12) ``Process.wait()`` waiting for that pipe forever."""

    def __init__(self, stream: asyncio.StreamReader, cap: int):
        self._stream = stream
        self._cap = cap
        self.data = bytearray()
        self.overflow = asyncio.Event()

    async def run(self) -> None:
        while chunk := await self._stream.read(65536):
            room = self._cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.overflow.set()


class SandboxRunner:
    """Runs programs with the isolation above; ``namespaces`` says which mode is in force."""

    def __init__(self, settings: SandboxSettings, *, namespaces: bool):
        self.settings = settings
        self.namespaces = namespaces
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._uid = settings.effective_uid()
        self._python = settings.resolved_python()

    def _limits(self) -> dict[str, int]:
        s = self.settings
        return {
            "RLIMIT_CPU": int(s.cpu_time_s),
            "RLIMIT_AS": s.memory_mb * MiB,
            "RLIMIT_FSIZE": s.max_file_mb * MiB,
            "RLIMIT_NOFILE": s.max_open_files,
            "RLIMIT_NPROC": s.max_processes,
            "RLIMIT_CORE": 0,
        }

    def _command(self, program: str, workdir: str) -> list[str]:
        config = {
            "program": program,
            "python": self._python,
            "limits": self._limits(),
            "namespaces": self.namespaces,
            "tmp_size_mb": self.settings.tmp_size_mb,
            "workdir": workdir,
        }
        command = [self._python, "-I", "-S", "-c", LAUNCHER_SOURCE, json.dumps(config)]
        if self.namespaces:
            command = [self.settings.unshare_path, *UNSHARE_FLAGS, "--", *command]
        if self._uid is not None:
            # setpriv, not Popen(user=...): a uid change makes Python fork() instead of vfork(), and fork() of
            # this multi-threaded gRPC process runs gRPC's atfork handlers, which crashed children (SIGSEGV).
            ids = [f"--reuid={self._uid}", f"--regid={self._uid}", "--clear-groups", "--no-new-privs"]
            command = [self.settings.setpriv_path, *ids, "--", *command]
        return command

    async def run(self, program: str, stdin: str = "") -> RunResult:
        """Runs ``program`` with ``stdin``; never raises for anything the program does."""
        if len(program.encode()) > self.settings.max_program_bytes:
            return RunResult(
                "", "", None, 0.0, f"program larger than {self.settings.max_program_bytes} bytes"
            )
        async with self._slots:
            return await self._run(program, stdin)

    async def _run(self, program: str, stdin: str) -> RunResult:
        workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
        try:
            if self._uid is not None:
                os.chown(workdir, self._uid, self._uid)
            start = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *self._command(program, workdir),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                cwd=workdir,
                start_new_session=True,
            )
            return await self._supervise(proc, stdin, start)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _supervise(self, proc: asyncio.subprocess.Process, stdin: str, start: float) -> RunResult:
        s = self.settings
        assert proc.stdin and proc.stdout and proc.stderr
        out = _CappedReader(proc.stdout, s.max_output_bytes)
        err = _CappedReader(proc.stderr, s.max_output_bytes)
        readers = [asyncio.ensure_future(out.run()), asyncio.ensure_future(err.run())]
        feeder = asyncio.ensure_future(self._feed(proc.stdin, stdin))
        waiter = asyncio.ensure_future(proc.wait())
        overflow = [asyncio.ensure_future(out.overflow.wait()), asyncio.ensure_future(err.overflow.wait())]
        failure = ""
        try:
            done, _ = await asyncio.wait(
                [waiter, *overflow], timeout=s.wall_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                failure = f"timed out after {s.wall_timeout_s:g}s"
            elif waiter not in done:
                failure = f"output exceeded {s.max_output_bytes} bytes"
        finally:
            # Whatever happened, nothing the run started may survive it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                code = await asyncio.wait_for(proc.wait(), timeout=REAP_TIMEOUT_S)
            except TimeoutError:
                # Python < 3.12 returns from wait() only once the pipes are closed as well, which a process
                # that escaped the group can delay; the killed process's own status is known by then.
                code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
            for task in overflow:
                task.cancel()
            feeder.cancel()
            # The pipes close once every process holding them is dead; bound the drain anyway.
            await asyncio.wait(readers, timeout=2.0)
            for task in readers:
                task.cancel()
        stdout = out.data.decode(errors="replace")
        stderr = err.data.decode(errors="replace")
        if not failure and code != 0:
            failure = _describe_exit(code, stderr)
        return RunResult(stdout, stderr, code, time.monotonic() - start, failure)

    @staticmethod
    async def _feed(writer: asyncio.StreamWriter, data: str) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            writer.write(data.encode())
            await writer.drain()
            writer.close()


async def probe_namespaces(settings: SandboxSettings) -> tuple[bool, str]:
    """Checks that a namespaced run works here; returns (available, explanation)."""
    if shutil.which(settings.unshare_path) is None:
        return False, f"'{settings.unshare_path}' not found"
    if settings.run_as_uid is not None and os.geteuid() != 0:
        return False, "sandbox.run_as_uid needs the service to run as root"
    if settings.effective_uid() is not None and shutil.which(settings.setpriv_path) is None:
        return False, f"'{settings.setpriv_path}' not found (needed to drop root privileges)"
    runner = SandboxRunner(settings, namespaces=True)
    check = "import os\nprint(os.getpid())\n"
    try:
        result = await runner.run(check)
    except OSError as exc:
        return False, f"cannot start the sandbox: {exc}"
    if result.ok and result.stdout.strip() == "2":
        return True, "namespaces: user, pid, net, mount; private tmpfs; rlimits; empty environment"
    return False, f"namespaced probe failed: {result.failure or result.stdout.strip()} {result.stderr[-300:]}"
