"""Memory measurement and release for GetStatus and Sleep."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import glob
import os

import psutil
import torch

from rollout_service.types import MemoryUsage


def process_tree_rss() -> int:
    """RSS in bytes of this process plus all its descendants (vLLM engine and worker processes)."""
    total = 0
    for process in process_tree(os.getpid()):
        try:
            total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def process_tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants.

    Linux lists each thread's children in ``/proc/PID/task/TID/children``: reading those costs a file per
    thread of the tree, where ``psutil.Process.children`` reads ``/proc/*/stat`` of every process on the host
    (about 1 ms at 70 processes, on each GetStatus). Without those files, psutil's way.
    """
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        try:
            tree.append(psutil.Process(current))
        except psutil.NoSuchProcess:
            continue
        pending.extend(_child_pids(current))
    return tree


def _child_pids(pid: int) -> list[int]:
    children: list[int] = []
    for listing in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(listing) as file:
                children.extend(int(child) for child in file.read().split())
        except OSError:  # the thread (or the process) ended meanwhile
            continue
    return children


def measure() -> MemoryUsage:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return MemoryUsage(process_tree_rss(), torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    return MemoryUsage(process_tree_rss())


def release_freed_memory() -> None:
    """Collect garbage, empty the CUDA cache and hand freed heap pages back to the OS.

    glibc keeps freed arenas mapped; ``malloc_trim(0)`` returns them so RSS actually drops.
    """
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
