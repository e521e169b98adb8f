"""Three tensors of the three channel dtypes, and manifests of them, for the weight plane's tests."""

from __future__ import annotations

import dataclasses

import torch

from rollout_service.types import WeightFormat
from rollout_service.weight_plane.buckets import plan_buckets
from rollout_service.weight_plane.manifest import ChannelManifest

SHAPES = {"a.weight": (4, 8), "b.weight": (3,), "c.weight": (2, 2)}
TENSORS = {
    "a.weight": torch.arange(32, dtype=torch.float32).reshape(4, 8),
    "b.weight": torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
    "c.weight": torch.full((2, 2), 0.5, dtype=torch.float16),
}


def manifest(**changes) -> ChannelManifest:
    """The manifest of :data:`TENSORS` in one bucket, with ``changes`` to its fields."""
    plan = plan_buckets(TENSORS, bucket_bytes=1 << 20)
    base = ChannelManifest(1, WeightFormat.STATE_DICT, plan.layouts, plan.bucket_bytes)
    return dataclasses.replace(base, **changes)


def with_tensor(index: int, **changes) -> ChannelManifest:
    """:func:`manifest` with ``changes`` to the layout of tensor ``index``."""
    layouts = list(manifest().tensors)
    layouts[index] = dataclasses.replace(layouts[index], **changes)
    return manifest(tensors=tuple(layouts))
