"""What ``UpdateWeightsFromChannel`` says about bytes sent outside gRPC, and the replica's checks on it.

A manifest lists every tensor as a byte range in a *bucket* (a flat byte buffer holding many tensors,
:mod:`rollout_service.weight_plane.buckets`). It is hostile input: every byte range must lie inside its
bucket, aligned for its dtype, without overlap, and match the tensor's shape; each violation is
INVALID_ARGUMENT naming the field (``tensors[3].offset``). The tensors read from the buckets then go
through the same validation as a streamed update (:func:`rollout_service.weights.validate_tensors`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from rollout_service.types import WeightFormat, WeightTransport

# Manifest dtype names (TensorLayout.dtype) ↔ torch dtypes: the dtypes models are served in.
CHANNEL_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
CHANNEL_DTYPE_NAMES = {dtype: name for name, dtype in CHANNEL_DTYPES.items()}
MAX_BUCKETS = 4096
MAX_CHANNEL_TENSORS = 1 << 17
MAX_DIMS = 8


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
