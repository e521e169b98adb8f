"""The KV caches the HF engine keeps between a session's calls, within a byte budget.

An episode's next turn, or a gateway session's next call, extends its last one, so its prefill can start
from the KV cache kept after that call (:class:`~rollout_service.engines.hf.HFEngine`). What is kept is
bounded in bytes: keeping a cache past ``max_bytes`` first drops the least recently used sessions' caches,
and a cache larger than ``max_bytes`` alone is not kept. A session whose cache was dropped has its next call
prefilled whole: slower, with the same tokens. Without the bound, the caches of every open session (up to
``gateway.max_sessions``, each up to a context) would grow until the device ran out of memory.

The engine's thread keeps and reads caches while the event loop's thread releases those of sessions that
closed, so one lock guards the store.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch


@dataclass
class SessionCache:
    """A session's KV cache after its last call: per layer (kv_heads, len(tokens), head_dim) tensors."""

    tokens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class SessionCaches:
    """Session key → :class:`SessionCache`, least recently used first, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._caches: OrderedDict[str, SessionCache] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0  # caches dropped to make room or too large to keep, since start

    def get(self, session: str) -> SessionCache | None:
        """The session's cache, now the most recently used; None when none is kept."""
        with self._lock:
            cache = self._caches.get(session)
            if cache is not None:
                self._caches.move_to_end(session)
            return cache

    def fits(self, nbytes: int) -> bool:
        """Whether a cache of ``nbytes`` may be kept at all (checked before it is copied out of a batch)."""
        return nbytes <= self.max_bytes

    def refuse(self, session: str) -> None:
        """The session's latest cache does not fit (:meth:`fits`): it is not kept, nor is its older one."""
        with self._lock:
            self._drop(session)
            self.evicted += 1

    def put(self, session: str, cache: SessionCache) -> None:
        """Keep ``cache`` as the session's (its older one goes), then drop the least recently used others
        while the total exceeds ``max_bytes``."""
        if not self.fits(cache.nbytes):
            self.refuse(session)
            return
        with self._lock:
            self._drop(session)
            self._caches[session] = cache
            self._bytes += cache.nbytes
            while self._bytes > self.max_bytes:
                _, oldest = self._caches.popitem(last=False)
                self._bytes -= oldest.nbytes
                self.evicted += 1

    def release(self, session: str) -> None:
        with self._lock:
            self._drop(session)

    def clear(self) -> None:
        with self._lock:
            self._caches.clear()
            self._bytes = 0

    @property
    def sessions(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._caches)

    @property
    def nbytes(self) -> int:
        """Bytes of the caches kept now."""
        return self._bytes

    def _drop(self, session: str) -> None:
        cache = self._caches.pop(session, None)
        if cache is not None:
            self._bytes -= cache.nbytes
