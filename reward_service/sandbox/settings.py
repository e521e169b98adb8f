"""Settings of the code sandbox (the ``sandbox:`` block of the reward service config)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

NOBODY_UID = 65534


def _world_executable(path: Path) -> bool:
    """True when an unprivileged user can reach and run ``path`` (every parent dir searchable by others)."""
    try:
        real = path.resolve()
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)
    except OSError:
        return False


def default_python() -> str:
    """An interpreter the sandbox user can run: this one when reachable, else the system python3."""
    candidates = [Path(sys.executable), Path(sys.base_prefix) / "bin" / "python3"]
    candidates += [
        Path(p) for p in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3") if p
    ]
    for candidate in candidates:
        if _world_executable(candidate):
            return str(candidate.resolve())
    return sys.executable


class SandboxSettings(BaseModel):
    """Limits of one program run; times in seconds, sizes in MiB unless named ``_bytes``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Offer the `code` reward at all.")
    allow_weak_isolation: bool = Field(
        False,
        description="Run `code` without namespaces (rlimits, process group and empty env only) when the "
        "kernel refuses unprivileged user namespaces. Off: `code` is refused there.",
    )
    python: str = Field("", description="Interpreter for programs; empty = one the sandbox user can run.")
    unshare_path: str = Field("unshare", description="util-linux unshare binary.")
    setpriv_path: str = Field("setpriv", description="util-linux setpriv binary (drops root to run_as_uid).")
    run_as_uid: int | None = Field(
        None, description="Uid (and gid) of runs; default: 65534 (nobody) when the service runs as root."
    )
    wall_timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one run.")
    cpu_time_s: float = Field(5.0, ge=1, description="RLIMIT_CPU of one run.")
    memory_mb: int = Field(512, ge=64, description="RLIMIT_AS of one run.")
    max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file a run may write.")
    tmp_size_mb: int = Field(64, ge=1, description="Size of the private tmpfs (/tmp and the scratch dir).")
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE of one run.")
    max_processes: int = Field(32, ge=2, description="RLIMIT_NPROC (processes + threads) of one run.")
    max_output_bytes: int = Field(65536, ge=1024, description="stdout/stderr cap; more kills the run.")
    max_program_bytes: int = Field(65536, ge=1024, description="Largest program accepted.")
    concurrency: int = Field(
        default_factory=lambda: max(1, len(os.sched_getaffinity(0))),
        ge=1,
        description="Runs at the same time.",
    )

    def effective_uid(self) -> int | None:
        if self.run_as_uid is not None:
            return self.run_as_uid
        return NOBODY_UID if os.geteuid() == 0 else None

    def resolved_python(self) -> str:
        return self.python or default_python()
