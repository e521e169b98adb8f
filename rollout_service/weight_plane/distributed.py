"""Buckets broadcast over a torch.distributed group of its own, outside the default group.

The trainer may itself run in an accelerate / FSDP default process group, and a rollout replica has
none, so neither ``init_process_group`` nor ``new_group`` fits: the group is built directly from a
``TCPStore`` (the trainer, rank 0, hosts it at ``tcp://host:port``) and a ``ProcessGroupGloo`` (CPU
tensors) or ``ProcessGroupNCCL`` (CUDA tensors) on it, the way vLLM's ``StatelessProcessGroup``
and TRL's ``vllm-serve`` weight sync do. Every call of :class:`BroadcastGroup` blocks; callers run them in a
thread. A replica joins through :class:`GroupJoiner`, which waits for a join at most its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from grpo_runtime.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted

BACKENDS = ("gloo", "nccl")
STORE_PREFIX = "grpo-weights"
# The trainer and up to 4095 replicas. torch takes the size as a C int (2**31 and more is a TypeError), and
# gloo's full mesh does work and waits for every rank.
MAX_WORLD_SIZE = 4096
MAX_TIMEOUT_S = 3600.0
# A DNS name has at most 253 characters.
MAX_HOST_CHARS = 253
# Abandoned joins (threads torch still holds past the join's timeout) allowed at once.
MAX_ABANDONED_JOINS = 4

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupSpec:
    """Where the group meets and who is who: rank 0 is the sender."""

    init_method: str
    rank: int
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 60.0

    def address(self) -> tuple[str, int]:
        """(host, port) of ``tcp://host:port``, the host printable ASCII without spaces and the port in
        [1, 65535]; INVALID_ARGUMENT(init_method) otherwise."""
        try:
            parts = urlsplit(self.init_method)
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            raise InvalidArgument(
                f"{self.init_method!r} is not tcp://host:port", field="init_method"
            ) from exc
        if parts.scheme != "tcp" or not host or not port or parts.path not in ("", "/"):
            raise InvalidArgument(f"{self.init_method!r} is not tcp://host:port", field="init_method")
        if len(host) > MAX_HOST_CHARS or not (host.isascii() and host.isprintable()) or " " in host:
            raise InvalidArgument(
                f"host {host!r}: at most {MAX_HOST_CHARS} printable ASCII characters, no spaces",
                field="init_method",
            )
        return host, port

    def check(self) -> None:
        """Refuse an inconsistent spec before anything connects: every number in its range."""
        self.address()
        if not 2 <= self.world_size <= MAX_WORLD_SIZE:
            raise InvalidArgument(
                f"world_size {self.world_size}: the trainer and 1 to {MAX_WORLD_SIZE - 1} replicas "
                f"([2, {MAX_WORLD_SIZE}])",
                field="world_size",
            )
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgument(f"rank {self.rank} is not in [0, {self.world_size})", field="rank")
        if self.backend not in BACKENDS:
            raise InvalidArgument(f"backend {self.backend!r} is none of {list(BACKENDS)}", field="backend")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(
                f"timeout {self.timeout_s} s is not in (0, {MAX_TIMEOUT_S:g}]", field="timeout_seconds"
            )
        if self.backend == "nccl" and not (torch.cuda.is_available() and hasattr(dist, "ProcessGroupNCCL")):
            raise FailedPrecondition("backend nccl needs CUDA and a torch built with NCCL")

    def not_formed(self, reason: str = "") -> DeadlineExceeded:
        """The error of a join that did not end within ``timeout_s``."""
        because = f" ({reason})" if reason else ""
        return DeadlineExceeded(
            f"the weight group at {self.init_method} did not form within {self.timeout_s:g} s{because}",
            field="timeout_seconds",
        )


class BroadcastGroup:
    """A joined group; :meth:`broadcast` sends (rank 0) or receives (others) one flat buffer.

    ``device``: where buffers live (CPU for gloo, the CUDA device for nccl). NCCL wants every rank on a
    GPU of its own: a trainer and a replica sharing one GPU use shared memory instead.
    """

    # None once closed.
    _store: dist.TCPStore | None
    _group: dist.ProcessGroupNCCL | dist.ProcessGroupGloo | None

    def __init__(self, spec: GroupSpec, device: torch.device | str = "cpu") -> None:
        """Join the group: blocks until every rank joined, or torch gave up: DEADLINE_EXCEEDED when that
        was past ``spec.timeout_s`` (nobody hosts the store, a rank never came), FAILED_PRECONDITION before.

        torch does not bound every wait by the timeout: a store address that accepts the connection and
        never answers blocks the store's handshake for good (the caller bounds that wait)."""
        spec.check()
        host, port = spec.address()
        started = time.monotonic()
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        self.spec = spec
        self.device = torch.device(device if spec.backend == "nccl" else "cpu")
        try:
            self._store = dist.TCPStore(
                host, port, spec.world_size, spec.rank == 0, timeout=timeout, wait_for_workers=False
            )
            store = dist.PrefixStore(STORE_PREFIX, self._store)
            if spec.backend == "nccl":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self._group = dist.ProcessGroupNCCL(store, spec.rank, spec.world_size, options)
            else:
                self._group = dist.ProcessGroupGloo(store, spec.rank, spec.world_size, timeout)
        except (RuntimeError, dist.DistError) as exc:
            if time.monotonic() - started >= spec.timeout_s:
                raise spec.not_formed(str(exc)) from exc
            raise FailedPrecondition(
                f"could not join the weight group at {spec.init_method} as rank {spec.rank} of "
                f"{spec.world_size} ({exc})"
            ) from exc

    def broadcast(
        self,
        buffers: Sequence[torch.Tensor],
        fill: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        """Broadcast every buffer from rank 0 (in place on the other ranks), in order. ``fill(i, buffer)``
        (sender) writes buffer i just before its broadcast starts, while the earlier ones are in flight.
        A peer that left or a timeout raises FAILED_PRECONDITION."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            works = []
            for index, buffer in enumerate(buffers):
                if fill is not None:
                    fill(index, buffer)
                # torch's .pyi lacks the backends' broadcast; after close() (None) this fails as before
                works.append(self._group.broadcast([buffer], options))  # type: ignore[union-attr]
            for work in works:
                work.wait()
        except (RuntimeError, dist.DistError) as exc:
            raise FailedPrecondition(f"the weight group broke during a broadcast ({exc})") from exc
        if any(buffer.is_cuda for buffer in buffers):
            torch.cuda.synchronize(buffers[0].device)

    def close(self) -> None:
        """Leave the group (its peers' pending broadcasts fail instead of waiting)."""
        group, self._group = self._group, None
        if group is not None and hasattr(group, "abort"):
            with contextlib.suppress(RuntimeError):
                group.abort()
        self._store = None


@dataclass
class _JoinAttempt:
    """One join on its thread. ``wakeup`` is set on the caller's loop when the join ended; the other
    fields are guarded by the joiner's lock."""

    spec: GroupSpec
    wakeup: asyncio.Future[None]
    group: BroadcastGroup | None = None
    error: BaseException | None = None
    finished: bool = False
    abandoned: bool = False


class GroupJoiner:
    """Joins torch.distributed groups, each on a daemon thread of its own, and waits for each at most
    its ``timeout_s``.

    torch bounds most of a join by that timeout but not all of it: a store address that accepts the
    connection and never answers blocks the store's handshake in a receive without a timeout. Such a
    join is *abandoned*: the caller gets DEADLINE_EXCEEDED at the timeout, and the thread, a daemon that
    holds no lock and does not hold up the process's exit, closes whatever group it still makes and ends
    when the peer closes the connection. At most ``max_abandoned`` abandoned joins may wait at once; past
    them a join is RESOURCE_EXHAUSTED.
    """

    def __init__(self, max_abandoned: int = MAX_ABANDONED_JOINS) -> None:
        self.max_abandoned = max_abandoned
        self._lock = threading.Lock()
        self._abandoned = 0

    @property
    def abandoned(self) -> int:
        """Abandoned joins whose threads still wait."""
        with self._lock:
            return self._abandoned

    async def join(self, spec: GroupSpec, device: str) -> BroadcastGroup:
        """The joined group; DEADLINE_EXCEEDED once ``spec.timeout_s`` passed, FAILED_PRECONDITION when
        torch refused sooner."""
        with self._lock:
            if self._abandoned >= self.max_abandoned:
                raise ResourceExhausted(
                    f"{self._abandoned} abandoned joins still wait inside torch (at most "
                    f"{self.max_abandoned}); each ends when torch gives up or its peer closes the connection"
                )
        loop = asyncio.get_running_loop()
        attempt = _JoinAttempt(spec, loop.create_future())
        thread = threading.Thread(
            target=self._run, args=(attempt, device, loop), name="weight-group-join", daemon=True
        )
        thread.start()
        try:
            await asyncio.wait({attempt.wakeup}, timeout=spec.timeout_s)
        except BaseException:  # the call was cancelled: nobody takes the group
            group, _ = self._settle(attempt)
            if group is not None:
                group.close()
            raise
        group, error = self._settle(attempt)
        if error is not None:
            raise error
        assert group is not None
        return group

    def _settle(self, attempt: _JoinAttempt) -> tuple[BroadcastGroup | None, BaseException | None]:
        """What the join ended with, or, while it still runs, abandon it."""
        with self._lock:
            if attempt.finished:
                return attempt.group, attempt.error
            attempt.abandoned = True
            self._abandoned += 1
        log.warning(
            "abandoned a join of the weight group at %s (timeout %g s) that torch had not ended: it retries "
            "a refused connection past the timeout, and waits for a silent peer's answer for good",
            attempt.spec.init_method,
            attempt.spec.timeout_s,
        )
        return None, attempt.spec.not_formed("torch did not give up in time; the join is abandoned")

    def _run(self, attempt: _JoinAttempt, device: str, loop: asyncio.AbstractEventLoop) -> None:
        """The join itself (on its own thread): hand the outcome over, or close an abandoned join's group."""
        group: BroadcastGroup | None = None
        error: BaseException | None = None
        try:
            group = BroadcastGroup(attempt.spec, device)
        except BaseException as exc:  # handed to the caller, whatever it is
            error = exc
        with self._lock:
            attempt.finished = True
            abandoned = attempt.abandoned
            if abandoned:
                self._abandoned -= 1
            else:
                attempt.group, attempt.error = group, error
        if abandoned:
            if group is not None:
                group.close()
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_wake, attempt.wakeup)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
