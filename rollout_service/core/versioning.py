"""Versioned weights: the policy version state machine and the batch-granularity lock.

Generation batches hold the lock shared (readers); a weight update, a load and a sleep hold it
exclusively (writer) and wait for the batches in flight, so every completion is produced by one
set of weights and carries that version. Writers are preferred: once an update waits, no new
batch starts until it is applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from grpo_runtime.errors import InvalidArgument
from rollout_service.core.types import WeightFormat


class ReadWriteLock:
    """Asyncio readers-writer lock, writer-preferring."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and self._writers_waiting == 0)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and self._readers == 0)
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class VersionState:
    """The version and format of the weights serving now (0 / UNSPECIFIED = base checkpoint)."""

    policy_version: int = 0
    weight_format: WeightFormat = WeightFormat.UNSPECIFIED

    def check_next(self, version: int) -> None:
        """A new version must be strictly greater than the one serving."""
        if version <= self.policy_version:
            raise InvalidArgument(
                f"must be greater than the current policy version {self.policy_version}, got {version}",
                field="version",
            )

    def advance(self, version: int, fmt: WeightFormat) -> None:
        self.check_next(version)
        self.policy_version = version
        self.weight_format = fmt
