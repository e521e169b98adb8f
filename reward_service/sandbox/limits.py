"""Resource limits of one run, and which mechanism bounds a run as a whole on this machine.

Without a delegated cgroup v2 subtree the whole-run bound is rlimit arithmetic: ``RLIMIT_NPROC`` caps the
run's tasks (processes and threads, counted in the run's own user namespace, so concurrent runs do not share
the count) and ``RLIMIT_AS`` caps each process, so a run holds at most
``RLIMIT_AS × RLIMIT_NPROC = memory_mb`` of address space (threads share their process's), plus its tmpfs.
The rlimits are set inside the sandbox, after its user namespace exists: set outside, the parent namespace's
count of the shared host uid would make concurrent runs share one process budget. ``RLIMIT_MSGQUEUE`` 0
refuses POSIX message queues: they would outlive a test in its sandbox's IPC namespace, where the launcher
cannot list them (``launcher.py`` checks System V IPC, files and keyrings instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from reward_service.sandbox.settings import SandboxSettings

MiB = 1024 * 1024
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class RunLimits:
    """Per-process rlimits of a run (seconds, bytes, counts)."""

    cpu_s: int
    address_space_bytes: int
    file_bytes: int
    open_files: int
    processes: int

    @classmethod
    def from_settings(cls, settings: SandboxSettings, cpu_s: float) -> RunLimits:
        return cls(
            cpu_s=max(1, math.ceil(cpu_s)),
            address_space_bytes=settings.process_memory_bytes(),
            file_bytes=settings.max_file_mb * MiB,
            open_files=settings.max_open_files,
            processes=settings.max_processes,
        )

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """RLIMIT name → (soft, hard). CPU: SIGXCPU at the soft limit (the failure names it), SIGKILL a
        second later for a program that handles SIGXCPU."""
        return {"RLIMIT_CPU": (self.cpu_s, self.cpu_s + 1)} | self.fixed_rlimits()

    def fixed_rlimits(self) -> dict[str, tuple[int, int]]:
        """Every rlimit but RLIMIT_CPU (the same for every test of a sandbox run)."""
        fixed = {
            "RLIMIT_AS": self.address_space_bytes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_CORE": 0,
            "RLIMIT_MSGQUEUE": 0,
        }
        return {k: (v, v) for k, v in fixed.items()}


def cgroup_v2_status() -> str:
    """Why runs are bounded by rlimits rather than a cgroup (the log line and ListRewards status say it)."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return "no cgroup v2 here"
    return "cgroup v2 present, not used (needs a delegated subtree)"


def describe(settings: SandboxSettings) -> str:
    """One line: what bounds a run as a whole."""
    per_process = settings.process_memory_bytes() // MiB
    return (
        f"per-run limits by rlimits ({cgroup_v2_status()}): RLIMIT_AS {per_process} MiB x RLIMIT_NPROC "
        f"{settings.max_processes} = {settings.memory_mb} MiB + {settings.tmp_size_mb} MiB tmpfs, "
        f"RLIMIT_CPU {settings.cpu_time_s:g} s per process, wall {settings.wall_timeout_s:g} s"
    )
