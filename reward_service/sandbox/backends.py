"""Sandbox backends: how a program is started in isolation. Each builds a command line; the runner
starts it, feeds stdin, reads the output and kills and reaps it.

``bwrap`` (bubblewrap): fresh user, PID, network, IPC, UTS and cgroup namespaces; a root holding only the
interpreter's install tree (read-only), a size-limited private ``/tmp``, a read-only ``/dev`` with the basic
devices, and (``KernelOptions``) a ``/proc`` of the program's own PID namespace and no nested user
namespaces; no capabilities, an empty environment, its own session; ``launcher.py`` as PID 1 runs the
program once per test of a ``RunBatch`` (stdin: the tests' inputs), sets the rlimits, reaps and reports
each test on stdout (``reports_tests``). The program shares the host kernel.

``runsc`` (gVisor): the same minimal root as an OCI bundle, run by gVisor's user-space kernel (the program's
system calls never reach the host kernel directly), without network; one test per run, the program's own
stdin and output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from reward_service.sandbox.limits import RunLimits
from reward_service.sandbox.settings import SandboxSettings

# Uid/gid of the program inside its user namespace (mapped to the host uid the sandbox runs as).
INNER_UID = 65534
WORKDIR = "/tmp"
PROGRAM = "main.py"
# The interpreter runs isolated (-I: no user site, no PYTHON* variables, no cwd on sys.path), without
# site-packages (-S) and writes no bytecode (-B).
PYTHON_FLAGS = ("-I", "-S", "-B")
LAUNCHER_SOURCE = (Path(__file__).parent / "launcher.py").read_text()
LAUNCHER_KEYS = (
    "cpu_time_s",
    "cpu_grant_s",
    "wall_timeout_s",
    "batch_wall_s",
    "stop_at_timeout",
    "max_output_bytes",
    "tail_bytes",
)


@dataclass(frozen=True)
class KernelOptions:
    """What the kernel (or container) here lets bwrap do; probed once at start-up.

    ``mount_proc``: a fresh /proc of the run's PID namespace (refused in a Docker container without
    systempaths=unconfined). ``disable_userns``: ``--disable-userns``, which refuses the program nested user
    namespaces (needs a writable /proc/sys, which Docker mounts read-only)."""

    mount_proc: bool = True
    disable_userns: bool = True


class SandboxUnavailable(Exception):
    """The backend cannot run here (missing binary, interpreter not reachable); the message says why."""


@dataclass
class Launch:
    """A prepared run: the command, file descriptors it inherits, and what to undo after it."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def cleanup(self) -> None:
        for undo in reversed(self.cleanups):
            undo()


@dataclass(frozen=True)
class RunBatch:
    """Tests one sandbox run may go through, in order (see ``launcher.py``; times in seconds).

    ``inputs``: [offset, length] of each test's stdin in the run's stdin file. ``limits``: of the first
    test (``limits.cpu_s`` its RLIMIT_CPU); a later one gets ``cpu_time_s`` and runs only while the run's
    ``cpu_grant_s`` still covers it, the run has lasted less than ``batch_wall_s`` and (``stop_at_timeout``)
    no test has hit the wall or CPU limit. A backend that does not report tests runs the first only."""

    limits: RunLimits
    inputs: tuple[tuple[int, int], ...]
    cpu_time_s: float
    cpu_grant_s: float
    wall_timeout_s: float
    batch_wall_s: float
    stop_at_timeout: bool
    max_output_bytes: int
    tail_bytes: int


class SandboxBackend(Protocol):
    name: str
    options: KernelOptions
    reports_tests: bool  # True: stdout carries the launcher's reports of a RunBatch, not the program's

    def prepare(self, program: bytes, batch: RunBatch) -> Launch: ...


def _interpreter_roots(python: str) -> list[str]:
    """Host dirs to bind read-only for ``python``: /usr for a system interpreter, else its install prefix
    (``<prefix>/bin/python3`` → ``<prefix>``)."""
    if python.startswith("/usr/"):
        return ["/usr"]
    return ["/usr", str(Path(python).parent.parent)]


def _privilege_drop(settings: SandboxSettings) -> list[str]:
    """setpriv prefix that starts the sandbox as ``run_as_uid`` (none when the uid stays the service's).

    setpriv, not Popen(user=...): a uid change makes Python fork() instead of vfork(), and fork() of this
    multi-threaded gRPC process runs gRPC's atfork handlers, which crashed children."""
    uid = settings.effective_uid()
    if uid is None:
        return []
    if os.geteuid() != 0:
        raise SandboxUnavailable("sandbox.run_as_uid needs the service to run as root")
    setpriv = shutil.which(settings.setpriv_path)
    if setpriv is None:
        raise SandboxUnavailable(f"'{settings.setpriv_path}' not found (needed to drop root privileges)")
    ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    return [setpriv, *ids, "--"]


def _resolve_python(settings: SandboxSettings) -> str:
    python = settings.resolved_python()
    if python is None:
        raise SandboxUnavailable(f"sandbox.python {settings.python!r} not found")
    return python


def memfd_with(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start; the caller closes it."""
    fd = os.memfd_create(name, 0)
    with os.fdopen(fd, "wb", closefd=False) as f:
        f.write(data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class BwrapBackend:
    name = "bwrap"
    reports_tests = True

    def __init__(self, settings: SandboxSettings, options: KernelOptions):
        bwrap = shutil.which(settings.bwrap_path)
        if bwrap is None:
            raise SandboxUnavailable(f"'{settings.bwrap_path}' (bubblewrap) not found")
        self.options = options
        self._python = _resolve_python(settings)
        self._settings = settings
        self._prefix = [*_privilege_drop(settings), bwrap]

    def _root(self) -> list[str]:
        args = []
        for root in _interpreter_roots(self._python):
            args += ["--ro-bind", root, root]
        for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin")):
            args += ["--symlink", target, link]
        args += ["--dev", "/dev"]
        if self.options.mount_proc:
            args += ["--proc", "/proc"]
        tmp_bytes = self._settings.tmp_size_mb * 1024 * 1024
        args += ["--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", WORKDIR]
        return args

    def prepare(self, program: bytes, batch: RunBatch) -> Launch:
        fd = memfd_with("sandbox-program", program)
        config = {
            "argv": [self._python, *PYTHON_FLAGS, PROGRAM],
            "limits": batch.limits.fixed_rlimits(),
            "first_cpu_limit_s": batch.limits.cpu_s,
            "inputs": batch.inputs,
            **{k: getattr(batch, k) for k in LAUNCHER_KEYS},
        }
        argv = [
            *self._prefix,
            "--unshare-all",
            "--unshare-user",
            *(["--disable-userns"] if self.options.disable_userns else []),
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--uid",
            str(INNER_UID),
            "--gid",
            str(INNER_UID),
            "--hostname",
            "sandbox",
            *self._root(),
            "--ro-bind-data",
            str(fd),
            f"{WORKDIR}/{PROGRAM}",
            # Writable only: /tmp. bwrap's own root and /dev are tmpfs without a size limit otherwise.
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            WORKDIR,
            "--",
            self._python,
            *PYTHON_FLAGS,
            "-c",
            LAUNCHER_SOURCE,
            json.dumps(config),
        ]
        return Launch(argv, pass_fds=(fd,), cleanups=[lambda: os.close(fd)])


class RunscBackend:
    """gVisor with an OCI bundle per run: an empty read-only root plus read-only binds of the interpreter's
    tree, a tmpfs ``/tmp``, gVisor's own ``/proc`` and ``/dev``, and no network."""

    name = "runsc"
    reports_tests = False

    def __init__(self, settings: SandboxSettings):
        runsc = shutil.which(settings.runsc_path)
        if runsc is None:
            raise SandboxUnavailable(f"'{settings.runsc_path}' (gVisor) not found")
        # gVisor's own /proc shows only the sandbox; user namespaces inside are gVisor's, not the host's.
        self.options = KernelOptions()
        self._runsc = runsc
        self._python = _resolve_python(settings)
        self._settings = settings
        self._prefix = _privilege_drop(settings)
        self._uid = settings.effective_uid()

    def _spec(self, limits: RunLimits) -> dict:
        mounts = [
            {"destination": root, "type": "bind", "source": root, "options": ["rbind", "ro"]}
            for root in _interpreter_roots(self._python)
        ]
        mounts += [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "size=64k"]},
            {
                "destination": WORKDIR,
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", f"size={self._settings.tmp_size_mb}m", "mode=1777"],
            },
            {"destination": "/prog", "type": "bind", "source": "prog", "options": ["rbind", "ro"]},
        ]
        rlimits = [{"type": k, "soft": soft, "hard": hard} for k, (soft, hard) in limits.rlimits().items()]
        return {
            "ociVersion": "1.0.0",
            "process": {
                "terminal": False,
                "user": {"uid": 0, "gid": 0},
                "args": [self._python, *PYTHON_FLAGS, f"/prog/{PROGRAM}"],
                "env": [],
                "cwd": WORKDIR,
                "capabilities": {},
                "rlimits": rlimits,
                "noNewPrivileges": True,
            },
            "root": {"path": "rootfs", "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            },
        }

    def prepare(self, program: bytes, batch: RunBatch) -> Launch:
        limits = batch.limits
        bundle = Path(tempfile.mkdtemp(prefix="grpo-runsc-"))
        state = bundle / "state"
        container = f"grpo-{uuid.uuid4().hex[:12]}"
        try:
            (bundle / "rootfs").mkdir()
            for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin")):
                (bundle / "rootfs" / link).symlink_to(target)
            (bundle / "prog").mkdir()
            (bundle / "prog" / PROGRAM).write_bytes(program)
            (bundle / "config.json").write_text(json.dumps(self._spec(limits)))
            state.mkdir()
            if self._uid is not None:
                for path in (bundle, state, bundle / "rootfs", bundle / "prog", bundle / "prog" / PROGRAM):
                    os.chown(path, self._uid, self._uid)
        except BaseException:
            shutil.rmtree(bundle, ignore_errors=True)
            raise
        runsc = [*self._prefix, self._runsc, "--rootless", "--network=none", f"--root={state}"]
        argv = [*runsc, "run", f"--bundle={bundle}", container]

        def delete() -> None:
            # The sandbox and gofer processes may outlive a killed `runsc run`; `delete --force` ends them.
            subprocess.run([*runsc, "delete", "--force", container], capture_output=True, timeout=10)

        return Launch(argv, cleanups=[lambda: shutil.rmtree(bundle, ignore_errors=True), delete])


def make_backend(settings: SandboxSettings, options: KernelOptions) -> SandboxBackend:
    """The backend named by ``settings.backend``; SandboxUnavailable says why it cannot run here."""
    if settings.backend == "runsc":
        return RunscBackend(settings)
    return BwrapBackend(settings, options)
