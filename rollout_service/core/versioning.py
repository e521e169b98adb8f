"""Versioned weights: the policy version state machine, the weights lock, the requests waiting for a version.

Generation batches hold the lock shared (readers); a weight update, a load and a sleep hold it
exclusively (writer) and wait for the batches in flight, so every completion is produced by one
set of weights and carries that version. Writers are preferred: once an update waits, no new
batch starts until it is applied.

Partial rollouts: a batch of ``continue_across_updates`` jobs does not make an update wait for its
end. Its engine polls :class:`UpdatePause` at segment boundaries; when an update waits, the batch
hands its read side over (:meth:`ReadWriteLock.yield_to_updates`), the update applies, and the batch
takes the lock back before any later writer and continues with the new weights. A sleep never
preempts a batch (the engine could not continue without weights): it waits for the batch's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from grpo_runtime.compute_thread import ComputeThread
from grpo_runtime.errors import InvalidArgument, Unavailable
from rollout_service.types import WeightFormat

# Versions are uint64 on the wire but int64 inside engines (vLLM keys LoRA adapters by an int64 id).
MAX_POLICY_VERSION = 2**63 - 1


class ReadWriteLock:
    """Asyncio readers-writer lock, writer-preferring."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._updates_waiting = 0  # waiting writers a partial-rollout batch yields to
        self._paused_readers = 0  # readers inside yield_to_updates: only updates may pass them

    @property
    def readers(self) -> int:
        """Batches holding the read side now (paused ones excluded)."""
        return self._readers

    @property
    def updates_waiting(self) -> bool:
        """Whether a writer that preempts partial rollouts waits (a plain read, safe from any thread)."""
        return self._updates_waiting > 0

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

    async def yield_to_updates(self) -> None:
        """Inside ``read()``: give the read side up while the waiting updates apply, then take it back.

        The reader returns once no update holds the lock or waits for it, ahead of any other writer (a
        sleep waiting since before still waits for the batch's end).
        """
        async with self._cond:
            self._readers -= 1
            self._paused_readers += 1
            self._cond.notify_all()
            try:
                await self._cond.wait_for(lambda: not self._writer and self._updates_waiting == 0)
            finally:
                self._paused_readers -= 1
                self._readers += 1

    @asynccontextmanager
    async def write(self, *, preempts_partial: bool = False) -> AsyncIterator[None]:
        """``preempts_partial``: a weight update, which batches of partial rollouts pause for."""
        async with self._cond:
            self._writers_waiting += 1
            self._updates_waiting += preempts_partial
            try:
                await self._cond.wait_for(
                    lambda: (
                        not self._writer
                        and self._readers == 0
                        and (preempts_partial or self._paused_readers == 0)
                    )
                )
            finally:
                self._writers_waiting -= 1
                self._updates_waiting -= preempts_partial
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
        """A new version must be strictly greater than the one serving, and at most
        :data:`MAX_POLICY_VERSION`."""
        if not self.policy_version < version <= MAX_POLICY_VERSION:
            raise InvalidArgument(
                f"must be greater than the current policy version {self.policy_version} and below 2**63, "
                f"got {version}",
                field="version",
            )

    def advance(self, version: int, fmt: WeightFormat) -> None:
        self.check_next(version)
        self.policy_version = version
        self.weight_format = fmt


def check_min_version(version: int | None) -> None:
    """A ``min_policy_version`` a push could ever reach (at most :data:`MAX_POLICY_VERSION`); else
    InvalidArgument naming it, before anything waits for it."""
    if version is not None and version > MAX_POLICY_VERSION:
        raise InvalidArgument(
            f"must be below 2**63 (no policy version is larger), got {version}", field="min_policy_version"
        )


class VersionWaits:
    """Requests that wait until a policy version serves (``GenerateRequest.min_policy_version``): a trainer
    sends the next step's request while it streams that step's weights.

    Every update attempt wakes them when it ends (:meth:`update_to`). One that applied may be the version
    they wait for; one that failed fails those waiting for its version or an earlier one (UNAVAILABLE: the
    trainer pushes again and retries). ``wait_s`` bounds each wait (the push may never come).
    """

    def __init__(self, state: VersionState, wait_s: float) -> None:
        self._state = state
        self.wait_s = wait_s
        self._changed = asyncio.Event()
        self._failed_version = 0
        self._failure = ""

    async def reach(self, version: int | None) -> None:
        """Return once ``version`` or a later one serves (None: at once); raises Unavailable, or
        InvalidArgument for a version no push can reach."""
        check_min_version(version)
        if version is None or self._state.policy_version >= version:
            return
        try:
            async with asyncio.timeout(self.wait_s):
                while self._state.policy_version < version:
                    if self._failed_version >= version:
                        raise Unavailable(
                            f"waits for policy version {version}, but the update to version "
                            f"{self._failed_version} failed here: {self._failure}",
                            field="min_policy_version",
                        )
                    await self._changed.wait()
        except TimeoutError:
            raise Unavailable(
                f"policy version {version} has not arrived within version_wait_s={self.wait_s:g}; this "
                f"replica serves version {self._state.policy_version}",
                field="min_policy_version",
            ) from None

    @contextmanager
    def update_to(self, version: int) -> Iterator[None]:
        """Around an update to ``version``: wakes the waiting requests when it ends, either way."""
        try:
            yield
        except Exception as exc:
            if version > self._failed_version:
                self._failed_version, self._failure = version, str(exc)[:300]
            raise
        finally:
            self._changed.set()
            self._changed = asyncio.Event()


class UpdatePause:
    """What an engine running a partial-rollout batch (on the core's compute thread) polls at segment
    boundaries.

    ``version``: the policy version sampling now. ``segment_tokens``: pause only after multiples of this
    many generated tokens. When ``requested`` (an update waits for the lock, or work such as its validation
    waits for the compute thread), the engine calls :meth:`pause`: the waiting work runs on its thread, the
    waiting updates apply, and generation continues with the weights serving afterwards.
    """

    def __init__(
        self,
        lock: ReadWriteLock,
        loop: asyncio.AbstractEventLoop,
        compute: ComputeThread,
        served_version: Callable[[], int],
        segment_tokens: int,
    ) -> None:
        self._lock = lock
        self._loop = loop
        self._compute = compute
        self._served_version = served_version
        self.segment_tokens = segment_tokens
        self.version = served_version()
        self.pauses = 0

    @property
    def requested(self) -> bool:
        return self._lock.updates_waiting or self._compute.queued

    def pause(self) -> int:
        """Let the waiting work and updates run; returns the version serving afterwards (``self.version``).

        Called on the compute thread, which the update's apply also needs: it serves that queue meanwhile."""
        self._compute.run_queued()
        done = asyncio.run_coroutine_threadsafe(self._lock.yield_to_updates(), self._loop)
        try:
            # A loop that stopped meanwhile (shutdown) never resumes us.
            self._compute.serve_until(done, 1.0, keep_waiting=self._loop_running)
        except RuntimeError:
            done.cancel()
            raise RuntimeError("the service shut down while generation was paused") from None
        done.result()
        self.pauses += 1
        self.version = self._served_version()
        return self.version

    def _loop_running(self) -> bool:
        return not self._loop.is_closed() and self._loop.is_running()
