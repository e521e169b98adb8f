"""Memory measurement and release for GetStatus and Sleep."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import psutil
import torch

from rollout_service.types import MemoryUsage


def process_tree_rss() -> int:
    """RSS in bytes of this process plus all its descendants (vLLM engine and worker processes)."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


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
