"""A torch.distributed group of its own for broadcasting weight buckets, outside the default group.

The trainer may itself run in an accelerate / FSDP default process group, and a rollout replica has
none, so neither ``init_process_group`` nor ``new_group`` fits: the group is built directly from a
``TCPStore`` (the trainer, rank 0, hosts it at ``tcp://host:port``) and a ``ProcessGroupGloo`` (CPU
tensors) or ``ProcessGroupNCCL`` (CUDA tensors) on it, the way vLLM's ``StatelessProcessGroup``
and TRL's ``vllm-serve`` weight sync do. Every call here blocks; callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from grpo_runtime.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument

BACKENDS = ("gloo", "nccl")
STORE_PREFIX = "grpo-weights"
# The trainer and up to 4095 replicas. torch takes the size as a C int (2**31 and more is a TypeError), and
# gloo's full mesh does work and waits for every rank.
MAX_WORLD_SIZE = 4096
MAX_TIMEOUT_S = 3600.0
# A DNS name has at most 253 characters.
MAX_HOST_CHARS = 253


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
                works.append(self._group.broadcast([buffer], options))
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
