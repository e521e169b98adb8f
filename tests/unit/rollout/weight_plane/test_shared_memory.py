"""Shared-memory bucket files: written by the sender, mapped by the replica only inside its directory."""

from __future__ import annotations

import os

import pytest
import torch

from grpo_runtime.errors import InvalidArgument, PermissionDenied
from rollout_service.weight_plane.buckets import plan_buckets, tensors_in_buckets
from rollout_service.weight_plane.shared_memory import BucketFiles, SharedMemoryDir, shares_directory
from tests.support.bucket_layouts import TENSORS, manifest


def test_shared_memory_files_are_mapped_only_inside_the_directory(tmp_path):
    shm = SharedMemoryDir.open(tmp_path / "shm")
    assert shares_directory(shm.directory, shm.token)
    assert not shares_directory(shm.directory, "0" * 32)
    assert not shares_directory(shm.directory, "../x")
    files = BucketFiles(shm.directory)
    plan = plan_buckets(TENSORS)
    names = files.write(TENSORS, plan)
    good = manifest(bucket_files=names)
    (bucket,) = shm.map_buckets(good)
    assert torch.equal(tensors_in_buckets(good, [bucket])["a.weight"], TENSORS["a.weight"])
    # The same file again is the same mapping; the sender's next write shows through it.
    changed = {**TENSORS, "a.weight": TENSORS["a.weight"] + 1}
    assert files.write(changed, plan) == names
    (again,) = shm.map_buckets(good)
    assert again.data_ptr() == bucket.data_ptr()
    assert torch.equal(tensors_in_buckets(good, [again])["a.weight"], changed["a.weight"])
    os.symlink(shm.directory / names[0], shm.directory / "link.bucket")
    (tmp_path / "outside.bucket").write_bytes(b"\0" * plan.bucket_bytes[0])
    for name in (
        "../outside.bucket",
        str(tmp_path / "outside.bucket"),
        ".hidden",
        "link.bucket",
        "none.bucket",
    ):
        with pytest.raises((InvalidArgument, PermissionDenied)) as info:
            shm.map_buckets(manifest(bucket_files=(name,)))
        assert info.value.field == "bucket_files[0]"
    with pytest.raises(InvalidArgument) as info:
        shm.map_buckets(manifest(bucket_files=names, bucket_bytes=(plan.bucket_bytes[0] + 8,)))
    assert info.value.field == "bucket_files[0]"
    with pytest.raises(InvalidArgument) as info:
        shm.map_buckets(manifest(bucket_files=()))
    assert info.value.field == "bucket_files"
    del bucket
    files.close()
    shm.close()
    assert list(shm.directory.iterdir()) == [shm.directory / "link.bucket"]


def test_a_bucket_file_with_a_second_hard_link_is_refused_naming_it(tmp_path):
    shm = SharedMemoryDir.open(tmp_path / "shm")
    files = BucketFiles(shm.directory)
    try:
        plan = plan_buckets(TENSORS)
        (name,) = files.write(TENSORS, plan)
        # The second name lives outside the directory: the same bytes, reachable from elsewhere.
        os.link(shm.directory / name, tmp_path / "elsewhere.bucket")
        with pytest.raises(InvalidArgument, match="2 hard links") as info:
            shm.map_buckets(manifest(bucket_files=(name,)))
        assert info.value.field == "bucket_files[0]"
        assert name in info.value.message
        os.unlink(tmp_path / "elsewhere.bucket")
        (bucket,) = shm.map_buckets(manifest(bucket_files=(name,)))
        assert torch.equal(tensors_in_buckets(manifest(), [bucket])["a.weight"], TENSORS["a.weight"])
        del bucket
    finally:
        files.close()
        shm.close()
