"""Which cores a trainer on CPU uses while a rollout service on the same machine generates.

torch's OpenMP pool has one thread per core in every process, and a parallel region waits for all of its
threads. In async rollout the trainer and the rollout service compute at the same time, so on one CPU machine
2 × cores threads share the cores and every region stalls on whichever thread is descheduled (measured on 2
cores under load: the trainer's forward went from 1.5 s with one thread per process to 6.5 s with two).
:func:`overlap_threads` splits the cores between the two instead (the trainer takes the rollout's share back
while no generation runs, :mod:`trainer_service.rollout.core_borrowing`); synchronous runs compute one
process at a time and keep torch's default.
"""

from __future__ import annotations

import os

from trainer_service.config.run_config import RunConfig


def is_loopback(target: str) -> bool:
    """Whether a ``HOST:PORT`` target is on this machine (127.0.0.0/8, ::1 or localhost)."""
    host = target.removeprefix("ipv4:").removeprefix("ipv6:").rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def cpu_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0))


def overlap_threads(cores: int | None = None) -> tuple[int, int]:
    """(trainer, rollout service) torch threads for a trainer and rollout service that compute at the same
    time on one CPU machine: the cores split in two, at least one each (2 cores → (1, 1); 16 → (8, 8))."""
    cores = cpu_cores() if cores is None else cores
    trainer = max(1, cores // 2)
    return trainer, max(1, cores - trainer)


def overlapping_on_cpu(config: RunConfig, device_type: str) -> bool:
    """Async rollout with the trainer on CPU (``device_type``): trainer and rollout service compute at the
    same time."""
    return config.training.rollout.async_rollout and device_type == "cpu"


def local_rollout_threads(config: RunConfig, device_type: str) -> int | None:
    """torch threads of a rollout service started on this machine for the run: its share of the cores when
    it generates while the trainer computes, else None (torch's default)."""
    return overlap_threads()[1] if overlapping_on_cpu(config, device_type) else None


def shares_cores_with_rollout(config: RunConfig, device_type: str, rollout_target: str) -> bool:
    """Whether the trainer splits this machine's cores with the rollout service (async on CPU, a loopback
    rollout, ``training.model.cpu_threads`` unset): its share while a prefetch generates, every core once
    that is done (:mod:`trainer_service.rollout.core_borrowing`)."""
    return (
        config.training.model.cpu_threads is None
        and overlapping_on_cpu(config, device_type)
        and is_loopback(rollout_target)
    )


def trainer_cpu_threads(config: RunConfig, device_type: str, rollout_target: str) -> int | None:
    """torch threads for this trainer process: ``training.model.cpu_threads``, else half the cores when it
    shares them with a rollout service on this machine (:func:`overlap_threads`), else None (default)."""
    if config.training.model.cpu_threads is not None:
        return config.training.model.cpu_threads
    if shares_cores_with_rollout(config, device_type, rollout_target):
        return overlap_threads()[0]
    return None
