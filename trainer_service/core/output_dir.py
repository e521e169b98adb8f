"""What the service keeps in a run's output directory besides the training outputs.

- ``.run.lock``: locked (``lockf``) by the worker that writes the directory until its run ends, its pid
  inside. The kernel drops the lock when that process dies however it dies, so a lock that cannot be taken
  means a live writer — possibly one left by an earlier service process — and a second run or a resume is
  refused.
- ``run_completed.json``: written when a run completes (``{"step": N, "total_steps": N}``), removed when a
  fresh (non-resumed) run starts in the directory. A resume of a completed run reads it and trains nothing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from grpo_runtime.errors import FailedPrecondition
from trainer_service.config.run_config import RunConfig
from trainer_service.core.types import JobEvent, RunState

LOCK_FILE = ".run.lock"
COMPLETED_FILE = "run_completed.json"


def _open_lock(output_dir: Path) -> int:
    # O_NOFOLLOW: a symlink planted as the lock file must not make us create or truncate a file elsewhere.
    return os.open(output_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _try_lock(fd: int) -> bool:
    """Take the lock without waiting; False when another live process holds it.

    A POSIX record lock (``lockf``), not ``flock``: it belongs to the process that took it, so the worker's
    forked children (killed with it, but a few milliseconds later) never hold it, and it is gone the moment
    the worker is.
    """
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _locked_error(output_dir: Path, fd: int) -> FailedPrecondition:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return FailedPrecondition(
        f"output: {output_dir} is being written by a live run worker (pid {holder}); stop that run or choose "
        "another output or experiment_name",
        field="config_yaml",
    )


def hold_lock(output_dir: Path) -> int:
    """Take the directory's lock for this process (returns the fd to keep open); FailedPrecondition naming
    ``output`` when another live process holds it."""
    fd = _open_lock(output_dir)
    if not _try_lock(fd):
        error = _locked_error(output_dir, fd)
        os.close(fd)
        raise error
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def check_unlocked(output_dir: Path) -> None:
    """FailedPrecondition naming ``output`` when a live process holds the directory's lock (taken and released
    at once: the worker takes it for good when it starts)."""
    if not (output_dir / LOCK_FILE).exists():
        return
    fd = _open_lock(output_dir)
    try:
        if not _try_lock(fd):
            raise _locked_error(output_dir, fd)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def record_completion(output_dir: Path, step: int, total_steps: int) -> None:
    (output_dir / COMPLETED_FILE).write_text(json.dumps({"step": step, "total_steps": total_steps}) + "\n")


def clear_completion(output_dir: Path) -> None:
    (output_dir / COMPLETED_FILE).unlink(missing_ok=True)


def completed_step(output_dir: Path) -> int | None:
    """The final step of the run that completed in ``output_dir``; None if none did (or the record is bad)."""
    try:
        record = json.loads((output_dir / COMPLETED_FILE).read_text())
        return int(record["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def completed_resume(config: RunConfig, resume: bool) -> JobEvent | None:
    """The final event of a resume with nothing left to train (the caller then trains nothing), else None.

    A resume (``resume`` or ``training.resume_from_checkpoint`` set) has nothing to train when the directory
    records a completion at step N and ``training.max_steps`` is -1 or at most N. A fresh run removes the
    record, since it may stop before it completes.
    """
    output_dir = config.output_dir
    if not (resume or config.training.resume_from_checkpoint):
        clear_completion(output_dir)
        return None
    done = completed_step(output_dir)
    max_steps = config.training.max_steps
    if done is None or (max_steps != -1 and max_steps > done):
        return None
    return JobEvent(
        step=done,
        total_steps=done,
        state=RunState.COMPLETED,
        message=f"run already completed at step {done}; nothing to resume ({output_dir} left unchanged)",
    )
