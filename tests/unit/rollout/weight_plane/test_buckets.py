"""Bucket layout without gRPC: planning and filling buckets, the manifest's checks, views of the tensors."""

from __future__ import annotations

import pytest
import torch

from grpo_runtime.errors import InvalidArgument, ResourceExhausted
from rollout_service.types import WeightFormat
from rollout_service.weight_plane.buckets import TENSOR_ALIGN, fill_bucket, plan_buckets, tensors_in_buckets
from rollout_service.weight_plane.manifest import check_manifest
from tests.support.bucket_layouts import SHAPES, TENSORS, manifest, with_tensor


def test_a_consistent_manifest_passes_and_its_views_hold_the_tensors():
    plan = plan_buckets(TENSORS, bucket_bytes=1 << 20)
    good = manifest()
    check_manifest(good, 1 << 30, SHAPES)
    bucket = torch.zeros(plan.bucket_bytes[0], dtype=torch.uint8)
    fill_bucket(bucket, plan, 0, TENSORS)
    views = tensors_in_buckets(good, [bucket])
    for name, tensor in TENSORS.items():
        assert views[name].dtype == tensor.dtype
        assert torch.equal(views[name], tensor)


def test_plan_packs_in_order_aligned_and_splits_at_the_bucket_size():
    big = {f"t{i}": torch.zeros(1000) for i in range(10)}  # 4000 bytes each
    plan = plan_buckets(big, bucket_bytes=10_000)
    assert [t.bucket for t in plan.layouts] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(t.offset % TENSOR_ALIGN == 0 for t in plan.layouts)
    assert all(size <= 10_000 for size in plan.bucket_bytes)
    huge = plan_buckets({"x": torch.zeros(10), "y": torch.zeros(5000)}, bucket_bytes=1000)
    assert huge.bucket_bytes == (40, 20_000)  # a tensor larger than a bucket gets its own
    with pytest.raises(ValueError, match="int64"):
        plan_buckets({"i": torch.zeros(2, dtype=torch.int64)})


@pytest.mark.parametrize(
    ("bad", "field", "error"),
    [
        (lambda: with_tensor(1, dtype="int8"), "tensors[1].dtype", InvalidArgument),
        (lambda: with_tensor(1, dtype="float64"), "tensors[1].dtype", InvalidArgument),
        (lambda: with_tensor(0, shape=(8, 4)), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, shape=(0, 4)), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, shape=()), "tensors[0].shape", InvalidArgument),
        (lambda: with_tensor(0, nbytes=4), "tensors[0].nbytes", InvalidArgument),
        (lambda: with_tensor(2, offset=1 << 40), "tensors[2].offset", InvalidArgument),
        (
            lambda: with_tensor(2, offset=manifest().tensors[2].offset + 1),
            "tensors[2].offset",
            InvalidArgument,
        ),
        (lambda: with_tensor(1, offset=0), "tensors[1].offset", InvalidArgument),
        (lambda: with_tensor(1, bucket=3), "tensors[1].bucket", InvalidArgument),
        (lambda: with_tensor(1, name="a.weight"), "tensors[1].name", InvalidArgument),
        (lambda: with_tensor(1, name=""), "tensors[1].name", InvalidArgument),
        (lambda: with_tensor(1, name="z.weight"), "tensors[1].name", InvalidArgument),
        (lambda: manifest(tensors=()), "tensors", InvalidArgument),
        (lambda: manifest(bucket_bytes=()), "bucket_bytes", InvalidArgument),
        (lambda: manifest(bucket_bytes=(0,)), "bucket_bytes[0]", InvalidArgument),
        (lambda: manifest(bucket_bytes=(1 << 31,)), "bucket_bytes", ResourceExhausted),
        (lambda: manifest(format=WeightFormat.UNSPECIFIED), "format", InvalidArgument),
    ],
)
def test_an_inconsistent_manifest_is_refused_naming_the_field(bad, field, error):
    with pytest.raises(error) as info:
        check_manifest(bad(), 1 << 30, SHAPES)
    assert info.value.field == field


def test_lora_tensors_are_not_held_to_the_models_shapes_before_the_bytes():
    check_manifest(manifest(format=WeightFormat.LORA_ADAPTER), 1 << 30, {})
