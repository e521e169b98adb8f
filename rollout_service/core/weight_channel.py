"""The replica's weight channel: which data plane it has open, and receiving a manifest's buckets on it.

The transports themselves live in :mod:`rollout_service.weight_plane` (shared memory, a torch.distributed
group); this is the replica's state over them: at most one channel open at a time, opened by
``OpenWeightChannel``, used by ``UpdateWeightsFromChannel``, left by ``CloseWeightChannel`` (or a
broadcast that broke), after which updates arrive on the ``UpdateWeights`` stream again.
"""

from __future__ import annotations

import asyncio

import torch

from grpo_runtime.errors import FailedPrecondition, InvalidArgument
from rollout_service.types import WeightTransport
from rollout_service.weight_plane.distributed import BroadcastGroup, GroupJoiner, GroupSpec
from rollout_service.weight_plane.manifest import ChannelManifest
from rollout_service.weight_plane.shared_memory import SharedMemoryDir


class WeightChannel:
    """The replica's end of the data plane: at most one open channel, shared memory or a group.

    ``shm``: the shared-memory directory the replica was started with (None: none).
    ``device``: where broadcast buffers go for nccl (the engine's device). ``joiner``: joins groups
    within their timeouts (default, one of its own). :meth:`receive` blocks (run it in a worker
    thread); :meth:`join_group` waits on the event loop. One of them at a time (the core holds its
    lock around them).
    """

    def __init__(
        self, shm: SharedMemoryDir | None, device: str = "cpu", joiner: GroupJoiner | None = None
    ) -> None:
        self.shm = shm
        self.device = device
        self.transport = WeightTransport.GRPC_STREAM
        self.joiner = joiner or GroupJoiner()
        self._group: BroadcastGroup | None = None
        # CPU receive buffers, kept from push to push while the group is open: writing into fresh
        # pages costs a page fault per 4 KiB, more than gloo's copy itself. (CUDA buffers are not kept:
        # accelerator memory is the engine's.)
        self._buffers: list[torch.Tensor] = []

    @property
    def supported(self) -> tuple[WeightTransport, ...]:
        kinds = [WeightTransport.GRPC_STREAM]
        if self.shm is not None:
            kinds.append(WeightTransport.SHARED_MEMORY)
        if torch.distributed.is_available():
            kinds.append(WeightTransport.TORCH_DISTRIBUTED)
        return tuple(kinds)

    def check_open(self, transport: WeightTransport, spec: GroupSpec | None) -> None:
        """Refuse an Open this replica cannot serve (cheap; before anything joins)."""
        if transport not in (WeightTransport.SHARED_MEMORY, WeightTransport.TORCH_DISTRIBUTED):
            raise InvalidArgument("must be SHARED_MEMORY or TORCH_DISTRIBUTED", field="transport")
        if transport not in self.supported:
            raise FailedPrecondition(f"this replica has no {transport.name} transport (see GetStatus)")
        if transport == WeightTransport.TORCH_DISTRIBUTED:
            assert spec is not None
            spec.check()
            if spec.rank == 0:
                raise InvalidArgument("rank 0 is the trainer's; a replica is 1..world_size-1", field="rank")

    def open_shared_memory(self) -> None:
        self.close()
        self.transport = WeightTransport.SHARED_MEMORY

    async def join_group(self, spec: GroupSpec) -> None:
        """Leave any open channel and join ``spec``'s group, waiting at most ``spec.timeout_s``
        (:meth:`GroupJoiner.join`)."""
        await asyncio.to_thread(self.close)
        self._group = await self.joiner.join(spec, self.device)
        self.transport = WeightTransport.TORCH_DISTRIBUTED

    def close(self) -> None:
        self._buffers = []
        group, self._group = self._group, None
        if group is not None:
            group.close()
        if self.shm is not None:
            self.shm.release()
        self.transport = WeightTransport.GRPC_STREAM

    def shutdown(self) -> None:
        """Close the channel and remove the token file (the replica stops)."""
        self.close()
        if self.shm is not None:
            self.shm.close()

    def require(self) -> WeightTransport:
        """The open channel's transport; FAILED_PRECONDITION without one."""
        if self.transport == WeightTransport.GRPC_STREAM:
            raise FailedPrecondition("no weight channel is open; call OpenWeightChannel or use UpdateWeights")
        return self.transport

    def receive(self, manifest: ChannelManifest) -> list[torch.Tensor]:
        """The buckets of a checked manifest, as flat uint8 tensors (blocking).

        Shared memory maps the files; a group receives each bucket by broadcast into a fresh buffer.
        A broadcast that fails leaves the group (its stream of buckets is out of step)."""
        if self.transport == WeightTransport.SHARED_MEMORY:
            assert self.shm is not None
            return self.shm.map_buckets(manifest)
        group = self._group
        if group is None:
            raise FailedPrecondition("no weight channel is open; call OpenWeightChannel or use UpdateWeights")
        sizes = list(manifest.bucket_bytes)
        if [len(b) for b in self._buffers] == sizes:
            buckets = self._buffers
        else:
            buckets = [torch.empty(size, dtype=torch.uint8, device=group.device) for size in sizes]
        try:
            group.broadcast(buckets)
        except BaseException:
            self.close()
            raise
        if group.device.type == "cpu":
            self._buffers = buckets
        return buckets
