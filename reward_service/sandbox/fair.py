"""Round-robin sharing of the sandbox's run slots between requests.

Each request queues its runs in its own lane; a freed slot goes to the next lane in turn (not to the oldest
run overall), so a request with many tests takes one slot per turn and a small request that arrives behind
it waits for at most one run of each other lane, never for the whole big request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Lane:
    """One request's queue of waiting runs."""

    def __init__(self, slots: FairSlots):
        self._slots = slots
        self.waiting: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Holds one run slot for the duration of the block."""
        await self._slots.acquire(self)
        try:
            yield
        finally:
            self._slots.release()


class FairSlots:
    """``size`` slots handed out round-robin between lanes."""

    def __init__(self, size: int):
        self._free = size
        self._ring: deque[Lane] = deque()  # lanes with waiting runs, in turn order

    def lane(self) -> Lane:
        return Lane(self)

    async def acquire(self, lane: Lane) -> None:
        if self._free > 0 and not self._ring:
            self._free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        lane.waiting.append(future)
        if lane not in self._ring:
            self._ring.append(lane)
        self._dispatch()  # lanes whose runs were all cancelled may hold the ring while slots are free
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted just as the waiter was cancelled: hand the slot on
            raise

    def release(self) -> None:
        self._free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free > 0 and self._ring:
            lane = self._ring.popleft()
            while lane.waiting and lane.waiting[0].done():
                lane.waiting.popleft()  # cancelled while waiting
            if not lane.waiting:
                continue
            self._free -= 1
            lane.waiting.popleft().set_result(None)
            if lane.waiting:
                self._ring.append(lane)
