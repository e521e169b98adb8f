"""Tensors packed into buckets, flat byte buffers of a few hundred MB, and read back from them.

The sender plans where each tensor goes (:func:`plan_buckets`) and copies the tensors of one bucket
into its buffer (:func:`fill_bucket`), whatever carries that buffer (a shared-memory file, a
broadcast); the receiver views the tensors of a checked manifest in the buckets it got
(:func:`tensors_in_buckets`) without a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rollout_service.weight_plane.manifest import (
    CHANNEL_DTYPE_NAMES,
    CHANNEL_DTYPES,
    ChannelManifest,
    TensorLayout,
)

DEFAULT_BUCKET_BYTES = 256 << 20
# Byte offsets of tensors in a bucket are multiples of this (every accepted dtype's size divides it).
TENSOR_ALIGN = 64


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


def tensors_in_buckets(manifest: ChannelManifest, buckets: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The manifest's tensors as views into ``buckets`` (flat uint8 tensors, one per bucket, of the
    sizes :func:`~rollout_service.weight_plane.manifest.check_manifest` accepted)."""
    out: dict[str, torch.Tensor] = {}
    for layout in manifest.tensors:
        raw = buckets[layout.bucket][layout.offset : layout.offset + layout.nbytes]
        out[layout.name] = raw.view(CHANNEL_DTYPES[layout.dtype]).view(layout.shape)
    return out
