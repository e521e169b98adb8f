"""The weight data plane: tensor bytes outside gRPC, laid out in buckets a manifest describes.

gRPC stays the control plane (``UpdateWeightsFromChannel`` carries the version, the format and
the manifest); the bytes arrive in *buckets*, flat byte buffers of a few hundred MB holding many
tensors each, over one of two transports:

- **shared memory**: the trainer writes each bucket into a file of a memory-backed directory both
  processes see (``/dev/shm``, a Kubernetes ``emptyDir`` with ``medium: Memory``), and the
  replica maps it. A random token file, written by the replica at start, lets a trainer tell that
  it really sees the same directory.
- **torch.distributed**: each bucket is broadcast from the trainer (rank 0) into a buffer the
  replica preallocates (:mod:`rollout_service.engines.torch_group`). Joining the group takes at
  most its timeout (:class:`GroupJoiner`).

The manifest (:class:`ChannelManifest`) is hostile input: every byte range must lie inside its
bucket, aligned for its dtype, without overlap, and match the tensor's shape; each violation is
INVALID_ARGUMENT naming the field (``tensors[3].offset``). The tensors are then views into the
buckets and go through the same validation as a streamed update
(:func:`rollout_service.weights.validate_tensors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import math
import mmap
import os
import re
import secrets
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from grpo_runtime.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from rollout_service.confined_files import open_confined
from rollout_service.engines.torch_group import BroadcastGroup, GroupSpec
from rollout_service.types import WeightFormat, WeightTransport

# Manifest dtype names (TensorLayout.dtype) ↔ torch dtypes: the dtypes models are served in.
CHANNEL_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
CHANNEL_DTYPE_NAMES = {dtype: name for name, dtype in CHANNEL_DTYPES.items()}
DEFAULT_BUCKET_BYTES = 256 << 20
# Byte offsets of tensors in a bucket are multiples of this (every accepted dtype's size divides it).
TENSOR_ALIGN = 64
MAX_BUCKETS = 4096
MAX_CHANNEL_TENSORS = 1 << 17
MAX_DIMS = 8
TOKEN_PREFIX = ".grpo-weight-shm-"
# Bucket file names: a plain name, no path separator, no leading dot (the token file's).
_BUCKET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
# Abandoned joins (threads torch still holds past the join's timeout) allowed at once.
MAX_ABANDONED_JOINS = 4

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorLayout:
    """One tensor of a channel payload: ``nbytes`` row-major bytes at ``offset`` in ``bucket``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ChannelManifest:
    """What ``UpdateWeightsFromChannel`` says about the bytes on the channel.

    ``bucket_bytes``: the size of every bucket, in sending order. ``bucket_files``: shared memory
    only, the file of each bucket inside the replica's shared-memory directory.
    """

    version: int
    format: WeightFormat
    tensors: tuple[TensorLayout, ...]
    bucket_bytes: tuple[int, ...]
    adapter_config_json: str = ""
    bucket_files: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)


@dataclass(frozen=True)
class ChannelApplied:
    """Result of ``UpdateWeightsFromChannel``: seconds from the request to the bytes having arrived
    (``transfer_seconds``) and from there to the new weights serving (``apply_seconds``)."""

    policy_version: int
    tensors_loaded: int
    bytes_received: int
    transfer_seconds: float
    apply_seconds: float
    transport: WeightTransport


def check_manifest(manifest: ChannelManifest, max_bytes: int, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a manifest whose layout is inconsistent, before any byte is received.

    ``max_bytes``: the server's cap on a payload (RESOURCE_EXHAUSTED past it). ``shapes``: the
    model's parameter shapes; a STATE_DICT tensor must name one and have its shape (LoRA tensors
    are checked against the model after the bytes arrived, with their values).
    """
    if manifest.format not in (WeightFormat.LORA_ADAPTER, WeightFormat.STATE_DICT):
        raise InvalidArgument("must be LORA_ADAPTER or STATE_DICT", field="format")
    buckets = manifest.bucket_bytes
    if not buckets:
        raise InvalidArgument("at least one bucket is required", field="bucket_bytes")
    if len(buckets) > MAX_BUCKETS:
        raise InvalidArgument(f"{len(buckets)} buckets, more than {MAX_BUCKETS}", field="bucket_bytes")
    for i, size in enumerate(buckets):
        if size <= 0:
            raise InvalidArgument("a bucket holds at least one byte", field=f"bucket_bytes[{i}]")
    if manifest.total_bytes > max_bytes:
        raise ResourceExhausted(
            f"the buckets hold {manifest.total_bytes} bytes, more than the server's limit "
            f"max_weight_bytes = {max_bytes}",
            field="bucket_bytes",
        )
    if not manifest.tensors:
        raise InvalidArgument("at least one tensor is required", field="tensors")
    if len(manifest.tensors) > MAX_CHANNEL_TENSORS:
        raise InvalidArgument(
            f"{len(manifest.tensors)} tensors, more than {MAX_CHANNEL_TENSORS}", field="tensors"
        )
    seen: set[str] = set()
    for i, layout in enumerate(manifest.tensors):
        _check_layout(i, layout, buckets)
        if layout.name in seen:
            raise InvalidArgument(f"tensor {layout.name!r} appears twice", field=f"tensors[{i}].name")
        seen.add(layout.name)
        if manifest.format == WeightFormat.STATE_DICT:
            expected = shapes.get(layout.name)
            if expected is None:
                raise InvalidArgument(f"unknown parameter name {layout.name!r}", field=f"tensors[{i}].name")
            if layout.shape != expected:
                raise InvalidArgument(
                    f"parameter {layout.name!r} has shape {list(layout.shape)}, the model has "
                    f"{list(expected)}",
                    field=f"tensors[{i}].shape",
                )
    _check_no_overlap(manifest.tensors)


def _check_layout(i: int, layout: TensorLayout, buckets: Sequence[int]) -> None:
    where = f"tensors[{i}]"
    if not layout.name:
        raise InvalidArgument("a tensor needs a name", field=f"{where}.name")
    dtype = CHANNEL_DTYPES.get(layout.dtype)
    if dtype is None:
        raise InvalidArgument(
            f"dtype {layout.dtype!r} is none of {sorted(CHANNEL_DTYPES)}", field=f"{where}.dtype"
        )
    if not 1 <= len(layout.shape) <= MAX_DIMS or any(size < 1 for size in layout.shape):
        raise InvalidArgument(
            f"shape {list(layout.shape)}: weights have 1 to {MAX_DIMS} dimensions, each >= 1",
            field=f"{where}.shape",
        )
    expected = math.prod(layout.shape) * dtype.itemsize
    if layout.nbytes != expected:
        raise InvalidArgument(
            f"{layout.nbytes} bytes, but shape {list(layout.shape)} of {layout.dtype} holds {expected}",
            field=f"{where}.nbytes",
        )
    if layout.bucket >= len(buckets):
        raise InvalidArgument(
            f"bucket {layout.bucket} does not exist ({len(buckets)} buckets)", field=f"{where}.bucket"
        )
    if layout.offset % dtype.itemsize:
        raise InvalidArgument(
            f"offset {layout.offset} is not a multiple of {layout.dtype}'s {dtype.itemsize} bytes",
            field=f"{where}.offset",
        )
    if layout.offset + layout.nbytes > buckets[layout.bucket]:
        raise InvalidArgument(
            f"bytes [{layout.offset}, {layout.offset + layout.nbytes}) run past bucket {layout.bucket}'s "
            f"{buckets[layout.bucket]} bytes",
            field=f"{where}.offset",
        )


def _check_no_overlap(tensors: Sequence[TensorLayout]) -> None:
    order = sorted(range(len(tensors)), key=lambda i: (tensors[i].bucket, tensors[i].offset))
    for before, after in itertools.pairwise(order):
        a, b = tensors[before], tensors[after]
        if a.bucket == b.bucket and b.offset < a.offset + a.nbytes:
            raise InvalidArgument(
                f"bytes of {b.name!r} overlap those of tensors[{before}] {a.name!r}",
                field=f"tensors[{after}].offset",
            )


def tensors_in_buckets(manifest: ChannelManifest, buckets: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The manifest's tensors as views into ``buckets`` (flat uint8 tensors, one per bucket, of the
    sizes :func:`check_manifest` accepted)."""
    out: dict[str, torch.Tensor] = {}
    for layout in manifest.tensors:
        raw = buckets[layout.bucket][layout.offset : layout.offset + layout.nbytes]
        out[layout.name] = raw.view(CHANNEL_DTYPES[layout.dtype]).view(layout.shape)
    return out


# ---------------------------------------------------------------------------------- joining a group
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


# ---------------------------------------------------------------------------------- the channel
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


# ---------------------------------------------------------------------------------- bucket layout
@dataclass(frozen=True)
class BucketPlan:
    """Where each tensor goes: ``layouts`` in the order given, ``bucket_bytes`` per bucket."""

    layouts: tuple[TensorLayout, ...]
    bucket_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)


def plan_buckets(tensors: Mapping[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> BucketPlan:
    """Pack tensors in order into buckets of at most ``bucket_bytes`` (a larger tensor gets a
    bucket of its own), each at an offset aligned to :data:`TENSOR_ALIGN`."""
    layouts: list[TensorLayout] = []
    sizes: list[int] = []
    used = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in CHANNEL_DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} is none of {sorted(CHANNEL_DTYPES)}")
        nbytes = tensor.numel() * tensor.element_size()
        offset = -(-used // TENSOR_ALIGN) * TENSOR_ALIGN
        if not sizes or (offset + nbytes > bucket_bytes and used > 0):
            sizes.append(0)
            offset = 0
        layouts.append(
            TensorLayout(
                name, CHANNEL_DTYPE_NAMES[tensor.dtype], tuple(tensor.shape), len(sizes) - 1, offset, nbytes
            )
        )
        used = offset + nbytes
        sizes[-1] = used
    return BucketPlan(tuple(layouts), tuple(sizes))


def fill_bucket(
    bucket: torch.Tensor, plan: BucketPlan, index: int, tensors: Mapping[str, torch.Tensor]
) -> None:
    """Copy the tensors of bucket ``index`` into ``bucket`` (flat uint8, on any device).

    CPU to CPU goes through numpy: one memcpy per tensor, single-threaded with the GIL released
    (torch's ``copy_`` splits it over OpenMP threads, which spin on a busy machine)."""
    for layout in plan.layouts:
        if layout.bucket != index:
            continue
        target = bucket[layout.offset : layout.offset + layout.nbytes]
        source = tensors[layout.name].detach()
        if (
            target.device.type == "cpu"
            and source.device.type == "cpu"
            and source.dtype == CHANNEL_DTYPES[layout.dtype]
        ):
            np.copyto(target.numpy(), source.contiguous().reshape(-1).view(torch.uint8).numpy())
        else:
            target.view(CHANNEL_DTYPES[layout.dtype]).view(layout.shape).copy_(source)


# ---------------------------------------------------------------------------------- shared memory
@dataclass
class SharedMemoryDir:
    """The replica's shared-memory directory and the token file that identifies it.

    ``open`` writes ``<dir>/.grpo-weight-shm-<token>`` holding the token; a trainer that finds
    that file with that content sees the same memory (:func:`shares_directory`).
    """

    directory: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    # Bucket file name → ((device, inode, size), its mapping): the trainer overwrites the same files from push
    # to push, and mapping 1 GB again costs ~0.3 s of page-table work on a busy machine. Only the last push's
    # files stay mapped, and none once the channel closes (a mapping pins a deleted file's memory).
    _mapped: dict[str, tuple[tuple[int, int, int], torch.Tensor]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, directory: str | Path) -> SharedMemoryDir:
        path = Path(directory).resolve()
        path.mkdir(parents=True, exist_ok=True)
        shm = cls(path)
        shm.token_file.write_text(shm.token)
        return shm

    @property
    def token_file(self) -> Path:
        return self.directory / f"{TOKEN_PREFIX}{self.token}"

    def close(self) -> None:
        self.release()
        self.token_file.unlink(missing_ok=True)

    def map_buckets(self, manifest: ChannelManifest) -> list[torch.Tensor]:
        """Map every bucket file read-only (blocking: run in a thread); views as flat uint8 tensors.

        Each name must be a plain file name (no ``/``, ``..``, leading dot) of a regular file, not a
        symlink, directly in the directory, with no other hard link, of exactly the declared size."""
        files = manifest.bucket_files
        if len(files) != len(manifest.bucket_bytes):
            raise InvalidArgument(
                f"{len(files)} bucket files for {len(manifest.bucket_bytes)} buckets", field="bucket_files"
            )
        for i, name in enumerate(files):
            if not _BUCKET_NAME.fullmatch(name):
                raise InvalidArgument(
                    f"{name!r} is not a plain file name in the shared-memory directory",
                    field=f"bucket_files[{i}]",
                )
        buckets = [self._map(i, name, manifest.bucket_bytes[i]) for i, name in enumerate(files)]
        self._mapped = {name: self._mapped[name] for name in files}
        return buckets

    def release(self) -> None:
        """Forget every mapping (they go once no tensor views them)."""
        self._mapped = {}

    def _map(self, i: int, name: str, size: int) -> torch.Tensor:
        where = f"bucket_files[{i}]"
        path = self.directory / name
        if path.is_symlink():  # the sender writes regular files; a link is someone else's doing
            raise InvalidArgument(f"{name!r} is a symbolic link", field=where)
        fd, info = open_confined(self.directory, path, where)
        try:
            # A second name may be one in another directory of the same file system (another process's
            # /dev/shm segment): the directory's confinement would not hold for the file's contents.
            if info.st_nlink != 1:
                raise InvalidArgument(
                    f"{name!r} has {info.st_nlink} hard links; a bucket file has exactly one", field=where
                )
            if info.st_size != size:
                raise InvalidArgument(f"{name!r} has {info.st_size} bytes, the bucket {size}", field=where)
            identity = (info.st_dev, info.st_ino, size)
            cached = self._mapped.get(name)
            if cached is not None and cached[0] == identity:
                return cached[1]
            # MAP_POPULATE maps every page now, in this thread, instead of faulting them one by one.
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
        except OSError as exc:
            raise InvalidArgument(f"cannot map {name!r} ({exc.strerror})", field=where) from exc
        finally:
            os.close(fd)
        # Read-only memory viewed as a tensor: nothing here writes to it (torch warns that it could).
        bucket = _readonly_tensor(mapped)
        self._mapped[name] = (identity, bucket)
        return bucket


def _readonly_tensor(mapped: mmap.mmap) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mapped, dtype=torch.uint8)


def shares_directory(directory: str | Path, token: str) -> bool:
    """Whether ``directory`` as this process sees it holds the replica's token file with ``token``."""
    if not token or not re.fullmatch(r"[0-9a-f]{1,64}", token):
        return False
    try:
        return (Path(directory) / f"{TOKEN_PREFIX}{token}").read_text() == token
    except OSError:
        return False


class BucketFiles:
    """The sending side of shared memory: bucket files in ``directory``, kept and overwritten from
    push to push (writing into fresh tmpfs pages costs a page fault each, ~1 GB/s here; into
    pages already there it is a plain copy, ~10 GB/s) and deleted by :meth:`close`.

    ``prefix`` tells this sender's files from others' in a shared directory.
    """

    def __init__(self, directory: str | Path, prefix: str | None = None) -> None:
        self.directory = Path(directory)
        self.prefix = prefix or f"weights-{os.getpid()}-{secrets.token_hex(4)}"
        self._maps: list[tuple[Path, mmap.mmap]] = []

    def write(self, tensors: Mapping[str, torch.Tensor], plan: BucketPlan) -> tuple[str, ...]:
        """Write every bucket of ``plan``; returns the file names, in bucket order."""
        self._resize(plan.bucket_bytes)
        for index, (_, mapped) in enumerate(self._maps):
            fill_bucket(torch.frombuffer(mapped, dtype=torch.uint8), plan, index, tensors)
        return tuple(path.name for path, _ in self._maps)

    def _resize(self, sizes: Sequence[int]) -> None:
        if [len(m) for _, m in self._maps] == list(sizes):
            return
        self.close()
        # Refuse at once when the directory cannot hold them: reserving pages until ENOSPC costs about a
        # second per GB before the stream push even starts. fallocate below stays the guarantee.
        stats = os.statvfs(self.directory)
        free = stats.f_bavail * stats.f_frsize
        if free < sum(sizes):
            raise OSError(errno.ENOSPC, f"{sum(sizes)} bytes of buckets, {free} free", str(self.directory))
        for index, size in enumerate(sizes):
            path = self.directory / f"{self.prefix}-{index}.bucket"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                # Reserve the memory now: a write into a mapping the tmpfs has no room for is SIGBUS,
                # while fallocate fails with ENOSPC (an OSError the sender turns into a stream push).
                os.posix_fallocate(fd, 0, size)
                self._maps.append((path, mmap.mmap(fd, size)))
            except OSError:
                path.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)

    def close(self) -> None:
        """Delete the files (their memory is freed once the replicas unmapped them too)."""
        maps, self._maps = self._maps, []
        for path, mapped in maps:
            path.unlink(missing_ok=True)
            # A tensor still viewing the mapping keeps it until that tensor goes.
            with contextlib.suppress(BufferError):
                mapped.close()
