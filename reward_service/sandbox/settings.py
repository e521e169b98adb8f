"""Settings of the code sandbox (the ``sandbox:`` block of the reward service config)."""

from __future__ import annotations

import os
import shutil
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NOBODY_UID = 65534
# Where the sandbox interpreter is looked up: the system's directories, never the service's PATH (which in
# the images starts with the service's virtualenv).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxSettings(BaseModel):
    """Limits of one program run; times in seconds, sizes in MiB unless named ``_bytes``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Offer the `code` reward at all.")
    backend: Literal["bwrap", "runsc"] = Field(
        "bwrap", description="bwrap (bubblewrap namespaces) or runsc (gVisor: its own kernel, stronger)."
    )
    bwrap_path: str = Field("bwrap", description="bubblewrap binary.")
    runsc_path: str = Field("runsc", description="gVisor binary (backend: runsc).")
    setpriv_path: str = Field("setpriv", description="util-linux setpriv binary (drops root to run_as_uid).")
    python: str = Field(
        "python3",
        description="Interpreter of programs: a path, or a name looked up in /usr/local/bin:/usr/bin:/bin. "
        "Its install dir is bound read-only (all of /usr when it lives there).",
    )
    mount_proc: Literal["auto", "true", "false"] = Field(
        "auto",
        description="A fresh /proc of the program's PID namespace. auto: when the kernel allows it (a Docker "
        "container without systempaths=unconfined refuses it; then programs run without /proc).",
    )
    run_as_uid: int | None = Field(
        None,
        ge=1,
        description="Host uid (and gid) of runs; default: 65534 (nobody) when the service runs as root "
        "(root is exempt from the process limit), else the service's own.",
    )
    wall_timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one test's program.")
    batch_wall_s: float = Field(
        1.0,
        ge=0,
        description="bwrap: a sandbox run goes on to the sample's next test while it has lasted less than "
        "this and the earlier tests left nothing the next could see (files, IPC objects, keys); else the "
        "next test gets a fresh sandbox. 0: a fresh sandbox per test. A run holds its slot at most "
        "batch_wall_s + wall_timeout_s.",
    )
    cpu_time_s: float = Field(5.0, ge=1, description="RLIMIT_CPU of each process of a run.")
    memory_mb: int = Field(
        2048,
        ge=64,
        description="Memory of one run, all its processes together: RLIMIT_AS of each process is "
        "memory_mb / max_processes (no cgroup v2 here; see docs/security.md).",
    )
    max_processes: int = Field(
        8, ge=2, description="Processes + threads of one run (RLIMIT_NPROC), the sandbox's init included."
    )
    max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE: largest file a run may write.")
    tmp_size_mb: int = Field(64, ge=1, description="Size of the private tmpfs (/tmp, /dev/shm, cwd).")
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE of each process.")
    max_output_bytes: int = Field(65536, ge=1024, description="stdout/stderr kept; more kills the run.")
    error_excerpt_bytes: int = Field(
        240, ge=16, le=4096, description="Most of a program's stderr that reaches the caller (in `error`)."
    )
    max_program_bytes: int = Field(65536, ge=1024, description="Largest program accepted.")
    max_tests_per_sample: int = Field(64, ge=1, description="Tests of one sample run; more: sample error.")
    max_cpu_s_per_request: float = Field(
        300.0,
        ge=1,
        description="CPU seconds the runs of one Score request may use together; later runs get an error.",
    )
    concurrency: int = Field(
        default_factory=lambda: max(1, len(os.sched_getaffinity(0))),
        ge=1,
        description="Runs at the same time (shared round-robin between requests).",
    )

    def effective_uid(self) -> int | None:
        """The uid to switch to before starting the sandbox, None to keep the service's."""
        if self.run_as_uid is not None:
            return self.run_as_uid
        return NOBODY_UID if os.geteuid() == 0 else None

    def resolved_python(self) -> str | None:
        """Absolute path of the interpreter (symlinks resolved), None when not found."""
        found = shutil.which(self.python, path=SYSTEM_PATH) if "/" not in self.python else self.python
        return os.path.realpath(found) if found and os.path.isfile(found) else None

    def process_memory_bytes(self) -> int:
        """RLIMIT_AS of each process: the run's memory split over its processes, so their sum is bounded."""
        return self.memory_mb * 1024 * 1024 // self.max_processes
